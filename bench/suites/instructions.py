"""``python -m bench.instructions`` (``make instructions``): user-space instructions
per request, counted by valgrind's callgrind, so exact and unmoved by a busy host.

Every count comes from two runs of a client process under callgrind, each running
the load generator's own loop (``drivers.serve``) with ``G`` greenlets or tasks: one
with N requests, one with none.  (instructions(N) - instructions(0)) / N is what one
request costs, the loop's own work included, start-up and connecting excluded.
System calls are not counted: the kernel's share of a client's CPU time is what
``make perf`` shows in its "in the kernel" column.

The ``pipeline`` row is ``make perf``'s target 4: inserts of 16-byte tuples,
gtarantool's pipeline (windows of 10,000) against asynctnt's ``G`` tasks, the same
two loops ``make perf`` times.  The ``duplicate`` row (not run unless asked for)
inserts keys that are there already: every reply is error 3, which since 2.10
quotes both tuples, bytes fields raw (``make bench``'s mix makes them by design);
``--drivers gtarantool,lazy`` puts it beside a connection with ``lazy_errors=True``.
``--otel always_on`` / ``--otel always_off`` count gtarantool instrumented with
OpenTelemetry (``bench/core/otel.py``): what a request costs with every span recorded,
and with every span dropped by the sampler.
"""
import argparse
import itertools
import re
import subprocess
import sys

from bench import drivers
from bench.core import otel
from bench.core.config import OPERATIONS, Config
from bench.core.workloads import DUPLICATE_KEY, Payloads, Phase
from bench.suites import perf
from bench.targets import open_target
from gtarantool.testing.server import binary_version, find_binary

PIPELINE = "pipeline"
DUPLICATE = "duplicate"   # inserts of keys already there: ER_TUPLE_FOUND replies
POOL = "pool"   # gtarantool.ConnectionPool over the one server (bench.drivers.pool.PoolDriver)
LAZY = "lazy"   # gtarantool with lazy_errors=True (the duplicate row is the one it changes)
# make perf's pipelined-insert loops, by driver: fn(host, port, space, n, size, extra, out)
PIPELINED = {"gtarantool": (perf._pipeline_gtarantool, perf.DEFAULT_WINDOW),
             "asynctnt": (perf._tasks_asynctnt, None)}
PIPELINE_SIZE = 16


class _Discard:
    """Takes the figures make perf's loops report (they are timings: not wanted here)."""

    def send(self, figures):
        pass


def child(driver_name, op, n, host, port, space, size, greenlets, sampler=None, metrics=True):
    """The counted process: connect, then run ``n`` requests of ``op`` (instrumented
    with OpenTelemetry, spans sampled by ``sampler``, when it is given; its metrics
    aggregated in memory unless ``metrics`` is False)."""
    if sampler is not None:
        providers = otel.instrument(sampler, span_exporter=otel.DiscardSpans(),
                                    metric_reader=otel.metric_reader() if metrics else False)
        try:
            return child(driver_name, op, n, host, port, space, size, greenlets)
        finally:
            for provider in providers:
                provider.shutdown()
    if op == PIPELINE:
        fn, window = PIPELINED[driver_name]
        fn(host, port, space, n, PIPELINE_SIZE, window or greenlets, _Discard())
        return
    if driver_name == POOL:
        # A pool of one instance: what routing adds to gtarantool's row.
        config = Config(greenlets=greenlets, size=size, space=space, quiet=True, pool=True)
        driver = drivers.make(config, "%s:%s" % (host, port), None)
        driver.select_mode = "ANY"
    else:
        config = Config(driver="gtarantool" if driver_name == LAZY else driver_name,
                        greenlets=greenlets, size=size, space=space, quiet=True,
                        lazy_errors=driver_name == LAZY)
        driver = drivers.make(config, host, port)
    driver.open()
    sent = "insert" if op == DUPLICATE else op
    # Intervals of a second, as a run's ticks: callgrind slows the requests some fifty
    # times, which would spread the work of each of a run's short intervals over a
    # fiftieth of the requests it has in a real run.
    recorder = driver.recorder_class(sent, lambda message: None, interval=1.0)
    driver.run(Phase(sent, zip(itertools.repeat(sent), range(n))), recorder)
    recorder.flush()
    driver.close()
    errors = dict(recorder.errors)
    if op == DUPLICATE and errors == ({("insert", DUPLICATE_KEY): n} if n else {}):
        return
    if errors:
        raise SystemExit("%s %s: %s" % (driver_name, op, errors))


def fill(target, space, op, n, size):
    """Empty ``space``; for anything but insert, put keys 0..n-1 in it first (with the
    payloads the loop checks, sent as binary as the drivers send them)."""
    target.prepare(space)
    if op not in ("insert", PIPELINE):   # (a duplicate's keys are there)
        payloads = Payloads(size, Config.seed)
        for key in range(n):
            target.admin.replace(space, (key, 0, payloads(key)))


def count(driver_name, op, n, target, args):
    """Instructions callgrind counted in one client process doing ``n`` requests."""
    fill(target, args.space, op, n, args.size)
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
               sys.executable, "-m", "bench.instructions", "--child", driver_name, op,
               str(n), target.host, str(target.port), "--space", args.space,
               "--size", str(args.size), "--greenlets", str(args.greenlets)]
    if args.otel:
        command += ["--otel", args.otel] + (["--otel-no-metrics"] if args.otel_no_metrics else [])
    run = subprocess.run(command, capture_output=True, text=True)
    found = re.search(r"Collected : (\d+)", run.stderr)
    if run.returncode or not found:
        raise SystemExit("callgrind run failed: %s\n%s" % (" ".join(command), run.stderr[-2000:]))
    return int(found.group(1))


def measure(args):
    """{driver: {op: instructions per request}}."""
    base = Config(workload="phases", procs=1, greenlets=args.greenlets, size=args.size,
                  space=args.space, wal="none", quiet=True)
    result = {}
    with open_target(base) as target:
        for driver_name in args.drivers:
            result[driver_name] = {}
            for op in args.ops:
                if op == PIPELINE and driver_name not in PIPELINED:   # (pool included)
                    result[driver_name][op] = None   # no pipelined loop for it
                    continue
                full = count(driver_name, op, args.n, target, args)
                empty = count(driver_name, op, 0, target, args)
                result[driver_name][op] = (full - empty) / args.n
    return result


def table(result, args):
    names = list(result)
    rows = ["instructions per request (callgrind, user space; %s requests per run, %d "
            "greenlets/tasks, %d-byte tuples)" % ("{:,}".format(args.n), args.greenlets,
                                                  args.size),
            "%-8s" % "" + "".join("%14s" % name for name in names)
            + ("%24s" % ("%s / %s" % tuple(names[:2])) if len(names) > 1 else "")]
    for op in args.ops:
        counts = [result[name][op] for name in names]
        rows.append("%-8s" % op + "".join("%14s" % ("n/a" if c is None else "{:,.0f}".format(c))
                                          for c in counts)
                    + ("%24s" % "{:.3f} ({:+.1%})".format(counts[0] / counts[1],
                                                          counts[0] / counts[1] - 1)
                       if len(counts) > 1 and None not in counts[:2] else ""))
    if PIPELINE in args.ops:
        rows.append("(pipeline: inserts of %d-byte tuples, gtarantool pipelined, asynctnt %d "
                    "tasks; the other rows: %d-byte tuples)" % (PIPELINE_SIZE, args.greenlets,
                                                               args.size))
    return "\n".join(rows)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drivers", default="gtarantool,asynctnt",
                        help="comma-separated drivers, 'pool' for gtarantool.ConnectionPool, "
                             "'lazy' for gtarantool with lazy_errors=True "
                             "(default %(default)s)")
    parser.add_argument("--ops", default=",".join(OPERATIONS + (PIPELINE,)),
                        help="comma-separated operations (default %(default)s; or "
                             "duplicate)")
    parser.add_argument("-n", type=int, default=10_000,
                        help="requests in the counted run (default %(default)s)")
    parser.add_argument("--greenlets", type=int, default=100,
                        help="greenlets / asyncio tasks (default %(default)s)")
    parser.add_argument("--size", type=int, default=1536, help="payload bytes (default 1536)")
    parser.add_argument("--space", default="bench", help="space to use (default bench)")
    parser.add_argument("--otel", choices=otel.SAMPLERS[1:], default=None,
                        help="instrument gtarantool with OpenTelemetry, spans sampled "
                             "always_on or always_off (exported to nowhere, metrics "
                             "aggregated in memory)")
    parser.add_argument("--otel-no-metrics", action="store_true",
                        help="with --otel: spans only, the metrics' meter a no-op")
    parser.add_argument("--child", nargs=5, metavar=("DRIVER", "OP", "N", "HOST", "PORT"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        driver_name, op, n, host, port = args.child
        child(driver_name, op, int(n), host, int(port), args.space, args.size, args.greenlets,
              args.otel, not args.otel_no_metrics)
        return 0
    args.drivers = args.drivers.split(",")
    args.ops = args.ops.split(",")
    for name in args.drivers:
        if name not in (POOL, LAZY) and (name not in drivers.DRIVERS or drivers.missing(name)):
            parser.error("driver %r is unknown or not installed" % name)
    for op in args.ops:
        if op not in OPERATIONS + (PIPELINE, DUPLICATE):
            parser.error("unknown operation %r; expected some of %s"
                         % (op, ", ".join(OPERATIONS + (PIPELINE, DUPLICATE))))
    print("server: Tarantool %s (%s)%s" % (".".join(map(str, binary_version())), find_binary(),
                                           "; OpenTelemetry, spans %s, metrics %s"
                                           % (args.otel, "off" if args.otel_no_metrics
                                              else "in memory") if args.otel else ""))
    print(table(measure(args), args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
