"""``python -m bench.perf`` (``make perf``): the speed targets, as ratios.

Runs gtarantool, asynctnt and the synchronous tarantool-python client on the
same embedded server, interleaved run by run (the machine is shared and
noisy: only ratios of medians taken side by side mean anything), then prints
one line per target and exits 1 when one is missed:

1. gtarantool (G greenlets, one connection) vs asynctnt (G tasks, uvloop):
   ops per client CPU-second >= 1.5x and ops/s >= 1.2x, on each phase.
2. gtarantool vs sync tarantool-python: ops/s >= 8x on each phase.
3. send and recv calls per 1,000 operations <= 15 and <= 30.
4. pipelined inserts of 16-byte tuples: ops per client CPU-second >= 2x
   asynctnt with G tasks doing the same inserts.
5. p99 latency at G greenlets no worse than asynctnt's at G tasks, on each phase.
"""
import argparse
import json
import multiprocessing
import os
import resource
import statistics
import sys
import time

from bench.core.config import OPERATIONS, Config
from bench.run import runner
from bench.targets import open_target
from gtarantool.testing.server import binary_version

DEFAULT_WINDOW = 10_000   # requests per pipeline in target 4
TARGETS = {"cpu_vs_asynctnt": 1.5, "ops_vs_asynctnt": 1.2, "ops_vs_sync": 8.0,
           "sends_per_1000": 15, "recvs_per_1000": 30, "pipeline_cpu_vs_asynctnt": 2.0}


def _phases(results):
    return {p["name"]: p for p in results["phases"]}


def _pipeline_gtarantool(host, port, space, n, size, window, out):
    import gtarantool
    conn = gtarantool.connect(host, port)
    payload = "x" * size
    cpu0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    done = 0
    while done < n:
        batch = min(window, n - done)
        p = conn.pipeline()
        for key in range(done, done + batch):
            p.insert(space, (key, 0, payload))
        errors = sum(isinstance(r, Exception) for r in p.results())
        if errors:
            raise RuntimeError("%d pipelined inserts failed" % errors)
        done += batch
    _report(out, n, cpu0, t0, conn.stats.send_calls, conn.stats.recv_calls)
    conn.close()


def _tasks_asynctnt(host, port, space, n, size, tasks, out):
    import asyncio

    import asynctnt
    try:
        import uvloop
        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    payload = "x" * size

    async def main():
        conn = asynctnt.Connection(host=host, port=port)
        await conn.connect()
        keys = iter(range(n))

        async def task():
            for key in keys:
                await conn.insert(space, [key, 0, payload])

        cpu0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        await asyncio.gather(*(task() for _ in range(tasks)))
        _report(out, n, cpu0, t0, None, None)
        await conn.disconnect()

    loop.run_until_complete(main())
    loop.close()


def _report(out, n, cpu0, t0, sends, recvs):
    cpu1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    if not n:   # an empty run: bench.instructions subtracts one
        out.send(None)
        return
    system = cpu1.ru_stime - cpu0.ru_stime
    cpu = cpu1.ru_utime - cpu0.ru_utime + system
    out.send({"ops_per_sec": n / (t1 - t0), "ops_per_client_cpu_second": n / cpu,
              "system_us_per_op": system / n * 1e6,
              "send_calls": sends, "recv_calls": recvs})


def _in_child(fn, *args):
    parent, child = multiprocessing.Pipe()
    proc = multiprocessing.get_context("forkserver").Process(target=fn, args=args + (child,))
    proc.start()
    result = parent.recv()
    proc.join()
    return result


def _cpu_ticks():
    """(all, stolen) CPU time of this machine so far, in ticks, or None off Linux.
    On a VM, stolen time is time the host ran something else instead."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(fields[:8]), fields[7] if len(fields) > 7 else 0


def _steal_percent(before, after):
    """The share of the CPU time between two ``_cpu_ticks()`` the host stole, or None."""
    if before and after and after[0] > before[0]:
        return 100 * (after[1] - before[1]) / (after[0] - before[0])
    return None


def _stolen(percent):
    return "" if percent is None else "  (%.1f%% stolen)" % percent


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def measure(args, out=None):
    """All runs, interleaved, each printed to ``out`` (default: sys.stdout when
    called); returns {"runs": ..., "medians": ...}."""
    out = out or sys.stdout
    base = Config(workload="phases", procs=1, greenlets=args.greenlets, ops=args.ops,
                  size=args.size, wal=args.wal, quiet=True)
    runs = {"gtarantool": [], "asynctnt": [], "sync": [], "pipeline": [], "pipeline_asynctnt": []}
    steal = {name: [] for name in runs}   # per run: % of the CPU time the host took
    sync_runs = args.runs if args.sync_runs is None else args.sync_runs
    with open_target(base) as target:
        for i in range(args.runs):
            for driver in ("gtarantool", "asynctnt") + (("sync",) if i < sync_runs else ()):
                config = base.replace(driver=driver, ops=args.ops if driver != "sync"
                                      else args.sync_ops)
                ticks = _cpu_ticks()
                runs[driver].append(_phases(runner.run(config, target)))
                steal[driver].append(_steal_percent(ticks, _cpu_ticks()))
                print("run %d %-10s %s%s" % (i + 1, driver, "  ".join(
                    "%s %.0f/s %.0f/cpu-s" % (op, p["ops_per_sec"], p["ops_per_client_cpu_second"])
                    for op, p in runs[driver][-1].items()), _stolen(steal[driver][-1])),
                    file=out, flush=True)
            for name, fn, extra in (("pipeline", _pipeline_gtarantool, args.window),
                                    ("pipeline_asynctnt", _tasks_asynctnt, args.greenlets)):
                target.prepare(base.space)  # empty space: inserts start from key 0
                ticks = _cpu_ticks()
                runs[name].append(_in_child(fn, target.host, target.port, base.space,
                                            args.pipeline_ops, 16, extra))
                steal[name].append(_steal_percent(ticks, _cpu_ticks()))
                print("run %d %-10s insert %.0f/s %.0f/cpu-s%s" % (
                    i + 1, name, runs[name][-1]["ops_per_sec"],
                    runs[name][-1]["ops_per_client_cpu_second"], _stolen(steal[name][-1])),
                    file=out, flush=True)

    medians = {}
    for driver in ("gtarantool", "asynctnt", "sync"):
        medians[driver] = {op: {key: _median([r[op][key] for r in runs[driver]])
                                for key in ("ops_per_sec", "ops_per_client_cpu_second")}
                           for op in OPERATIONS}
        for op in OPERATIONS:
            medians[driver][op]["p99_ms"] = _median([r[op]["latency_ms"]["p99"]
                                                     for r in runs[driver]])
            medians[driver][op]["system_us_per_op"] = _median(
                [r[op]["client_system_seconds"] / r[op]["ops"] * 1e6 for r in runs[driver]])
            conn = [r[op]["connection"] for r in runs[driver] if r[op]["connection"]]
            for key in ("send_calls_per_1000_ops", "recv_calls_per_1000_ops"):
                medians[driver][op][key] = _median([c.get(key) for c in conn])
    for name in ("pipeline", "pipeline_asynctnt"):
        medians[name] = {key: _median([r[key] for r in runs[name]])
                         for key in ("ops_per_sec", "ops_per_client_cpu_second",
                                     "system_us_per_op")}
    return {"runs": runs, "medians": medians, "run_steal_percent": steal}


def verdict(medians):
    """(lines, all targets met)."""
    g, a, s = medians["gtarantool"], medians["asynctnt"], medians["sync"]
    lines, ok = [], True

    def line(name, value, target, higher=True):
        nonlocal ok
        met = value is not None and (value >= target if higher else value <= target)
        ok = ok and met
        lines.append("%-4s %-58s %8s  target %s %g" % (
            "PASS" if met else "FAIL", name, "n/a" if value is None else "%.2f" % value,
            ">=" if higher else "<=", target))

    for op in OPERATIONS:
        line("1. %s: ops per client CPU-s, gtarantool / asynctnt" % op,
             g[op]["ops_per_client_cpu_second"] / a[op]["ops_per_client_cpu_second"],
             TARGETS["cpu_vs_asynctnt"])
        line("1. %s: ops/s, gtarantool / asynctnt" % op,
             g[op]["ops_per_sec"] / a[op]["ops_per_sec"], TARGETS["ops_vs_asynctnt"])
    for op in OPERATIONS:
        line("2. %s: ops/s, gtarantool / sync tarantool-python" % op,
             g[op]["ops_per_sec"] / s[op]["ops_per_sec"], TARGETS["ops_vs_sync"])
    for op in OPERATIONS:
        line("3. %s: send calls per 1,000 ops" % op, g[op]["send_calls_per_1000_ops"],
             TARGETS["sends_per_1000"], higher=False)
        line("3. %s: recv calls per 1,000 ops" % op, g[op]["recv_calls_per_1000_ops"],
             TARGETS["recvs_per_1000"], higher=False)
    line("4. pipelined 16-byte inserts: ops per client CPU-s, gtarantool / asynctnt",
         medians["pipeline"]["ops_per_client_cpu_second"]
         / medians["pipeline_asynctnt"]["ops_per_client_cpu_second"],
         TARGETS["pipeline_cpu_vs_asynctnt"])
    for op in OPERATIONS:
        line("5. %s: p99 latency ms, gtarantool (asynctnt %.2f)" % (op, a[op]["p99_ms"]),
             g[op]["p99_ms"], a[op]["p99_ms"], higher=False)
    return lines, ok


def table(medians):
    rows = ["%-8s %28s %28s %16s" % ("", "gtarantool ops/s | /cpu-s", "asynctnt ops/s | /cpu-s",
                                      "sync ops/s")]
    for op in OPERATIONS:
        g, a, s = (medians[d][op] for d in ("gtarantool", "asynctnt", "sync"))
        rows.append("%-8s %14.0f | %11.0f %14.0f | %11.0f %16.0f" % (
            op, g["ops_per_sec"], g["ops_per_client_cpu_second"], a["ops_per_sec"],
            a["ops_per_client_cpu_second"], s["ops_per_sec"]))
    p, pa = medians["pipeline"], medians["pipeline_asynctnt"]
    rows.append("%-8s %14.0f | %11.0f %14.0f | %11.0f" % (
        "pipeline", p["ops_per_sec"], p["ops_per_client_cpu_second"], pa["ops_per_sec"],
        pa["ops_per_client_cpu_second"]))
    # Where the client's CPU goes: a driver that makes a system call per request
    # spends much of it in the kernel, and that cost varies with the host.
    rows += ["", "client CPU per op, us (in the kernel)  gtarantool    asynctnt        sync"]
    for op in OPERATIONS:
        rows.append("%-38s %s" % (op, "  ".join(
            "%5.1f (%4.1f)" % (1e6 / m[op]["ops_per_client_cpu_second"],
                               m[op]["system_us_per_op"])
            for m in (medians[d] for d in ("gtarantool", "asynctnt", "sync")))))
    rows.append("%-38s %s" % ("pipeline", "  ".join(
        "%5.1f (%4.1f)" % (1e6 / m["ops_per_client_cpu_second"], m["system_us_per_op"])
        for m in (p, pa))))
    return "\n".join(rows)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.perf", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="interleaved runs (default 5)")
    parser.add_argument("--ops", type=int, default=100_000, help="ops per phase (default 100000)")
    parser.add_argument("--size", type=int, default=1536, help="payload bytes (default 1536)")
    parser.add_argument("--greenlets", type=int, default=100,
                        help="greenlets / asyncio tasks (default 100)")
    parser.add_argument("--sync-ops", type=int, default=20_000,
                        help="ops per phase for the slow sync client (default 20000)")
    parser.add_argument("--sync-runs", type=int, default=None,
                        help="runs of the sync client, each interleaved with the others "
                             "(default: every run)")
    parser.add_argument("--pipeline-ops", type=int, default=100_000,
                        help="pipelined 16-byte inserts (default 100000)")
    parser.add_argument("--window", type=int, default=DEFAULT_WINDOW,
                        help="requests per pipeline (default 10000)")
    parser.add_argument("--wal", default="none", choices=("write", "none"),
                        help="server WAL mode (default none: the targets are about client "
                             "CPU, and on two cores the WAL thread competes with the client)")
    parser.add_argument("--json", help="write every run and the medians to this file")
    args = parser.parse_args(argv)
    ticks0 = _cpu_ticks()
    result = measure(args)
    stolen = _steal_percent(ticks0, _cpu_ticks())
    if stolen is not None:
        result["steal_percent"] = stolen
    lines, ok = verdict(result["medians"])
    print("\nmedians of %d interleaved runs, %s ops per phase, %d-byte payloads, %d "
          "greenlets/tasks, one client process, Tarantool %s, server WAL %s, Linux %s, "
          "%d cores%s\n"
          % (args.runs, "{:,}".format(args.ops), args.size, args.greenlets,
             ".".join(map(str, binary_version())), args.wal,
             os.uname().release, os.cpu_count(),
             "; %.1f%% of the CPU time stolen by the host" % result["steal_percent"]
             if "steal_percent" in result else ""))
    print(table(result["medians"]))
    print()
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(result, verdict=lines, ok=ok, args=vars(args)), f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
