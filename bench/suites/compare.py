"""``python -m bench.compare``: the same load with every driver, one after another on one
server, then one table: a row per operation, a column group per driver."""
import argparse
import json
import os
import sys

from bench import drivers as clients
from bench.core import config as options
from bench.core import plot, report
from bench.run import runner
from bench.targets import SetupError, open_target


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m bench.compare",
        description="Run the same benchmark with each driver on one Tarantool and print "
                    "ops/s, seconds, ops per client CPU-second and p99 latency side by side.")
    parser.add_argument("--drivers", default=",".join(("sync", "threads", "gtarantool",
                                                       "asynctnt")),
                        help="comma-separated drivers, in run order (default %(default)s)")
    options.add_arguments(parser, driver=False)
    args = parser.parse_args(argv)
    drivers = [name.strip() for name in args.drivers.split(",") if name.strip()]
    unknown = set(drivers) - set(options.DRIVERS)
    if unknown or not drivers:
        parser.error("--drivers takes some of %s" % ", ".join(options.DRIVERS))
    try:
        config = options.from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    for name in list(drivers):
        module = clients.missing(name)
        if module:
            print("skipping %s: the %r module is not installed (pip install %s)"
                  % (name, module, module), file=sys.stderr)
            drivers.remove(name)
    if not drivers:
        return 1

    runs = {}
    try:
        with open_target(config) as target:
            for name in drivers:
                print("\n== %s" % name, flush=True)
                runs[name] = runner.run(config.replace(
                    driver=name, lazy_errors=config.lazy_errors and name == "gtarantool",
                    hlog=per_driver(config.hlog, name)), target)
                print(report.final(runs[name]), flush=True)
    except KeyboardInterrupt:
        print("\ninterrupted; the server and the workers are stopped", file=sys.stderr)
        return 130
    except (SetupError, runner.BenchError) as exc:
        print("bench.compare: %s" % exc, file=sys.stderr)
        return 1

    print("\n%s, %d procs x %d greenlets/threads/tasks (sync: 1), %s-byte payloads, %s\n"
          % (config.workload, config.procs, config.greenlets, config.size,
             "%gs per phase" % config.duration if config.duration else
             "{:,} ops per phase".format(config.ops)))
    if config.rate is not None:
        print("open loop at {:,g} ops/s ({} arrivals): p99 from the intended start, "
              "svc p99 from the send\n".format(config.rate, config.arrivals))
    print(report.compare_table(runs))
    if config.json:
        with open(config.json, "w") as f:
            json.dump({"config": config.as_dict(), "runs": runs}, f, indent=1)
        print("wrote %s" % config.json)
    if config.plot:
        plot.draw(runs, config.plot)
        print("wrote %s" % config.plot)
    for name in runs:
        if config.hlog:
            print("wrote %s" % per_driver(config.hlog, name))
    return 0


def per_driver(path, driver):
    """``--hlog run.hlog`` -> ``run-gtarantool.hlog``: one log per driver."""
    if path is None:
        return None
    stem, ext = os.path.splitext(path)
    return "%s-%s%s" % (stem, driver, ext)


if __name__ == "__main__":
    sys.exit(main())
