"""``python -m bench.sweep`` (``make sweep``): the speed targets at every concurrency.

gtarantool (G greenlets on one connection) against asynctnt (G tasks on one
connection, uvloop) at G = 1, 10, 100, 1,000 and 10,000, and the synchronous
tarantool-python client at G = 1; inserts, then selects, of 1,536-byte
tuples.  Every run is a fresh client process (its peak RSS is its own) and the
runs are interleaved level by level, driver by driver, so that a busy host
slows all of them alike; each figure is the median over the runs.  The clock
and the CPU count start once all G greenlets (tasks) exist and wait to start,
for both clients alike: what is measured is requests, not ``gevent.spawn``
against ``asyncio.ensure_future`` (at G = 10,000, with 5 requests each, creating
the greenlets took about a sixth of gtarantool's CPU time).  Per level
and operation it prints ops/s, ops per client CPU-second, latency (p50, p99;
p99.9 and max at the highest level), send and recv calls per 1,000 requests
(the clients that count them) and the process's peak RSS and its growth over
the RSS it had once connected; then one PASS/FAIL line per target, and exits 1
when one is missed:

1. G=1: CPU per request at most asynctnt's and the sync client's (ops per
   client CPU-second ratio >= 1; the aim is 0.8x asynctnt's CPU, 1.25), and
   p50 latency at most both.
2. Every other level: ops per client CPU-second >= 1.5x asynctnt's, ops/s >= 1.2x.
3. The highest level: p99.9 latency within 4x gtarantool's own p50, and RSS
   growth under 1 GB.
"""
import argparse
import itertools
import json
import os
import resource
import sys
import time

from bench import drivers
from bench.core.config import Config, positive_int
from bench.core.workloads import Phase
from bench.suites import perf
from bench.targets import open_target

OPERATIONS = ("insert", "select")
LEVELS = (1, 10, 100, 1000, 10_000)
SYNC_LEVEL = 1
# gtarantool with another write policy, contenders that show what the
# shipped one does, in the same runs: its lead request off
# (``transport.LEAD_UP_TO`` 0), and "gtarantool-flushN", the lead off and a
# batch's requests written N at a time (``transport.FLUSH_EVERY`` N; 1 writes
# every request as its caller makes it, asyncio's way).
NOLEAD = "gtarantool-nolead"
FLUSH = "gtarantool-flush"
TARGETS = {"cpu_vs_peers_at_1": 1.0, "cpu_aim_at_1": 1.25, "cpu_vs_asynctnt": 1.5,
           "ops_vs_asynctnt": 1.2, "p999_over_p50": 4.0, "rss_growth_mb": 1024}


def write_policy(name):
    """``(LEAD_UP_TO, FLUSH_EVERY or None)`` of a gtarantool contender with
    another write policy, None for any other name."""
    if name == NOLEAD:
        return 0, None
    every = name[len(FLUSH):] if name.startswith(FLUSH) else ""
    if every.isdigit() and int(every) >= 1:
        return 0, int(every)
    return None


def _percentile(counts, total, fraction):
    """The latency (us) under which ``fraction`` of ``total`` requests finished."""
    rank = max(1, round(fraction * total))
    seen = 0
    for us in sorted(counts):
        seen += counts[us]
        if seen >= rank:
            return us
    return None


def _rss_kb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)


def child(driver_name, greenlets, ops, size, host, port, space, out):
    """One run in a fresh process: ``ops`` inserts, then ``ops`` selects of the same
    keys, with ``greenlets`` concurrent requests; sends the figures to ``out``."""
    policy = write_policy(driver_name)
    if policy is not None:   # gtarantool with another write policy (see NOLEAD)
        from gtarantool import transport
        transport.LEAD_UP_TO = policy[0]
        if policy[1] is not None:
            transport.FLUSH_EVERY = policy[1]
    config = Config(driver="gtarantool" if policy is not None else driver_name,
                    greenlets=greenlets, size=size, space=space, quiet=True)
    driver = drivers.make(config, host, port)
    driver.open()
    baseline_kb = _rss_kb()
    result = {}
    for op in OPERATIONS:
        recorder = driver.recorder_class(op, lambda message: None)
        phase = Phase(op, zip(itertools.repeat(op), range(ops)))
        before = {}

        def started():
            before.update(counters=driver.counters(), t0=time.perf_counter(),
                          cpu0=resource.getrusage(resource.RUSAGE_SELF))
        driver.run(phase, recorder, started)
        t1, cpu1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        counters, t0, cpu0 = before["counters"], before["t0"], before["cpu0"]
        recorder.flush()
        if recorder.errors:
            raise SystemExit("%s G=%d %s: %s" % (driver_name, greenlets, op,
                                                 dict(recorder.errors)))
        cpu = cpu1.ru_utime - cpu0.ru_utime + cpu1.ru_stime - cpu0.ru_stime
        latency = recorder.merged()[op]
        total = sum(latency.values())
        figures = {"ops_per_sec": ops / (t1 - t0), "ops_per_client_cpu_second": ops / cpu,
                   "p50_ms": _percentile(latency, total, 0.5) / 1000,
                   "p99_ms": _percentile(latency, total, 0.99) / 1000,
                   "p999_ms": _percentile(latency, total, 0.999) / 1000,
                   "max_ms": max(latency) / 1000}
        after = driver.counters()
        for key in ("send_calls", "recv_calls"):
            figures[key + "_per_1000"] = (None if after is None
                                          else 1000 * (after[key] - counters[key]) / ops)
        result[op] = figures
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["rss_growth_mb"] = result["peak_rss_mb"] - baseline_kb / 1024
    driver.close()
    out.send(result)


def _contenders(level, args):
    names = ["gtarantool"] + [name for name in args.drivers if write_policy(name)] + ["asynctnt"]
    if level == SYNC_LEVEL and "sync" in args.drivers:
        names.append("sync")
    return [name for name in names if name in args.drivers]


def _ops(level, args):
    """Requests per phase: at least ``args.min_rounds`` per greenlet, so that the
    highest levels are more than one burst of first requests."""
    return max(args.ops if level > SYNC_LEVEL else args.ops_at_1, args.min_rounds * level)


def measure(args, out=None):
    """{(driver, level): [run results]}, interleaved; each run printed to
    ``out`` (default: sys.stdout when called)."""
    out = out or sys.stdout
    base = Config(workload="phases", procs=1, size=args.size, wal=args.wal, quiet=True)
    runs = {}
    with open_target(base) as target:
        for i in range(args.runs):
            for level in args.levels:
                for name in _contenders(level, args):
                    target.prepare(base.space)   # empty: the inserts start from key 0
                    ticks = perf._cpu_ticks()
                    result = perf._in_child(child, name, level, _ops(level, args), args.size,
                                            target.host, target.port, base.space)
                    runs.setdefault((name, level), []).append(result)
                    print("run %d G=%-6d %-10s %s  rss %.0f MB%s" % (
                        i + 1, level, name, "  ".join(
                            "%s %.0f/s %.0f/cpu-s p50 %.3f ms" % (
                                op, result[op]["ops_per_sec"],
                                result[op]["ops_per_client_cpu_second"], result[op]["p50_ms"])
                            for op in OPERATIONS), result["peak_rss_mb"],
                        perf._stolen(perf._steal_percent(ticks, perf._cpu_ticks()))),
                        file=out, flush=True)
    return runs


def medians(runs):
    """{(driver, level): {op: {figure: median}, "peak_rss_mb": ..., "rss_growth_mb": ...}}."""
    result = {}
    for key, results in runs.items():
        entry = {op: {figure: perf._median([r[op][figure] for r in results])
                      for figure in results[0][op]} for op in OPERATIONS}
        for figure in ("peak_rss_mb", "rss_growth_mb"):
            entry[figure] = perf._median([r[figure] for r in results])
        result[key] = entry
    return result


def _fmt(value, pattern):
    return "-" if value is None else pattern % value


def table(m, levels):
    top = max(levels)
    rows = ["%-7s %-7s %-17s %9s %9s %8s %8s %8s %8s %7s %7s %8s %8s" % (
        "G", "op", "driver", "ops/s", "ops/cpu-s", "p50 ms", "p99 ms", "p99.9", "max ms",
        "sends/k", "recvs/k", "rss MB", "growth")]
    for level in levels:
        for op in OPERATIONS:
            names = sorted({name for name, _ in m}, key=lambda name: (
                name != "gtarantool", name in ("asynctnt", "sync"), name == "sync", name))
            for name in names:
                entry = m.get((name, level))
                if entry is None:
                    continue
                f = entry[op]
                rows.append((
                    "%-7d %-7s %-17s %9.0f %9.0f %8.3f %8.3f %8s %8s %7s %7s %8.0f %8.0f") % (
                    level, op, name, f["ops_per_sec"], f["ops_per_client_cpu_second"],
                    f["p50_ms"], f["p99_ms"],
                    _fmt(f["p999_ms"] if level == top else None, "%.3f"),
                    _fmt(f["max_ms"] if level == top else None, "%.1f"),
                    _fmt(f["send_calls_per_1000"], "%.1f"), _fmt(f["recv_calls_per_1000"], "%.1f"),
                    entry["peak_rss_mb"], entry["rss_growth_mb"]))
    return "\n".join(rows)


def verdict(m, levels):
    """(lines, all targets met)."""
    lines, ok = [], True

    def line(name, value, target, higher=True, counts=True, fmt="%.2f"):
        nonlocal ok
        met = value is not None and (value >= target if higher else value <= target)
        if counts:
            ok = ok and met
        lines.append("%-4s %-66s %8s  target %s %s" % (
            ("PASS" if met else "FAIL") if counts else ("met " if met else "not "),
            name, "n/a" if value is None else fmt % value, ">=" if higher else "<=",
            fmt % target if fmt != "%.2f" else "%g" % target))

    def ratio(a, b):
        return None if a is None or not b else a / b

    top = max(levels)
    for level in levels:
        g, a = m.get(("gtarantool", level)), m.get(("asynctnt", level))
        if g is None or a is None:
            continue
        for op in OPERATIONS:
            cpu = ratio(g[op]["ops_per_client_cpu_second"], a[op]["ops_per_client_cpu_second"])
            if level == SYNC_LEVEL:
                s = m.get(("sync", level))
                line("G=1 %s: ops per client CPU-s, gtarantool / asynctnt" % op, cpu,
                     TARGETS["cpu_vs_peers_at_1"])
                line("G=1 %s: (aim) ops per client CPU-s, gtarantool / asynctnt" % op, cpu,
                     TARGETS["cpu_aim_at_1"], counts=False)
                line("G=1 %s: p50 ms, gtarantool (asynctnt %.3f)" % (op, a[op]["p50_ms"]),
                     g[op]["p50_ms"], a[op]["p50_ms"], higher=False, fmt="%.3f")
                if s is not None:
                    line("G=1 %s: ops per client CPU-s, gtarantool / sync" % op,
                         ratio(g[op]["ops_per_client_cpu_second"],
                               s[op]["ops_per_client_cpu_second"]),
                         TARGETS["cpu_vs_peers_at_1"])
                    line("G=1 %s: p50 ms, gtarantool (sync %.3f)" % (op, s[op]["p50_ms"]),
                         g[op]["p50_ms"], s[op]["p50_ms"], higher=False, fmt="%.3f")
                continue
            line("G=%d %s: ops per client CPU-s, gtarantool / asynctnt" % (level, op), cpu,
                 TARGETS["cpu_vs_asynctnt"])
            line("G=%d %s: ops/s, gtarantool / asynctnt" % (level, op),
                 ratio(g[op]["ops_per_sec"], a[op]["ops_per_sec"]), TARGETS["ops_vs_asynctnt"])
        if level == top and level > SYNC_LEVEL:
            for op in OPERATIONS:
                line("G=%d %s: p99.9 / p50 latency, gtarantool (asynctnt %.1f)"
                     % (level, op, ratio(a[op]["p999_ms"], a[op]["p50_ms"]) or 0),
                     ratio(g[op]["p999_ms"], g[op]["p50_ms"]), TARGETS["p999_over_p50"],
                     higher=False)
            line("G=%d: RSS growth MB, gtarantool (asynctnt %.0f; %.1f KB per greenlet)"
                 % (level, a["rss_growth_mb"], g["rss_growth_mb"] * 1024 / level),
                 g["rss_growth_mb"], TARGETS["rss_growth_mb"], higher=False)
    return lines, ok


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=positive_int, default=5, help="interleaved runs (default 5)")
    parser.add_argument("--ops", type=positive_int, default=20_000,
                        help="requests per phase and run at G > 1 (default %(default)s)")
    parser.add_argument("--ops-at-1", type=positive_int, default=10_000,
                        help="requests per phase and run at G = 1 (default %(default)s)")
    parser.add_argument("--min-rounds", type=positive_int, default=5,
                        help="at least this many requests per greenlet (default %(default)s)")
    parser.add_argument("--levels", default=",".join(map(str, LEVELS)),
                        help="concurrency levels (default %(default)s)")
    parser.add_argument("--drivers", default="gtarantool,asynctnt,sync",
                        help="comma-separated (default %%(default)s; also %s: gtarantool "
                             "without the lead request of a small batch, and %sN: without "
                             "it, a batch written N requests at a time)" % (NOLEAD, FLUSH))
    parser.add_argument("--size", type=positive_int, default=1536,
                        help="payload bytes (default 1536)")
    parser.add_argument("--wal", default="write", choices=("write", "none"),
                        help="server WAL mode (default %(default)s)")
    parser.add_argument("--json", help="write every run and the medians to this file")
    args = parser.parse_args(argv)
    try:
        args.levels = sorted({positive_int(level) for level in args.levels.split(",")})
    except argparse.ArgumentTypeError as exc:
        parser.error("--levels: %s" % exc)
    args.drivers = args.drivers.split(",")
    for name in args.drivers:
        if (name not in ("gtarantool", "asynctnt", "sync") and write_policy(name) is None) \
                or drivers.missing("gtarantool" if write_policy(name) else name):
            parser.error("driver %r is unknown or not installed" % name)
    ticks0 = perf._cpu_ticks()
    runs = measure(args)
    stolen = perf._steal_percent(ticks0, perf._cpu_ticks())
    m = medians(runs)
    lines, ok = verdict(m, args.levels)
    print("\nmedians of %d interleaved runs; %s requests per phase (%s at G=1, at least %d "
          "per greenlet); %d-byte tuples; one client process per run; server WAL %s, "
          "Tarantool %s; Linux %s, %d cores%s\n"
          % (args.runs, "{:,}".format(args.ops), "{:,}".format(args.ops_at_1),
             args.min_rounds, args.size, args.wal, _server_version(), os.uname().release,
             os.cpu_count(), "" if stolen is None else "; %.1f%% of the CPU time stolen by "
             "the host" % stolen))
    print(table(m, args.levels))
    print()
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "verdict": lines, "ok": ok,
                       "runs": {"%s@%d" % key: value for key, value in runs.items()},
                       "medians": {"%s@%d" % key: value for key, value in m.items()}},
                      f, indent=1)
    return 0 if ok else 1


def _server_version():
    from gtarantool.testing.server import binary_version
    return ".".join(map(str, binary_version()))


if __name__ == "__main__":
    sys.exit(main())
