"""``python -m bench``: run one load against Tarantool and report it (see --help)."""
import argparse
import json
import sys

import tarantool.error

from bench import drivers
from bench.core import config as options
from bench.core import plot, report
from bench.profiling import workers as profiling
from bench.run import runner
from bench.targets import SetupError


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Multi-process load generator for Tarantool: P processes x G concurrent "
                    "requests, latency percentiles from HDR histograms, client CPU, socket "
                    "calls and the server's own box.stat() counters.")
    options.add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        config = options.from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        results = runner.run(config)
    except KeyboardInterrupt:
        print("\ninterrupted; the server and the workers are stopped", file=sys.stderr)
        return 130
    except (SetupError, runner.BenchError) as exc:
        print("bench: %s" % exc, file=sys.stderr)
        return 1
    except tarantool.error.NetworkError as exc:   # (the server went away between phases)
        print("bench: lost the server: %s" % exc, file=sys.stderr)
        return 1
    print(report.final(results))
    module = drivers.missing(config.driver)
    if module:
        parser.error("driver %s needs the %r module: pip install %s"
                     % (config.driver, module, module))
    if config.profile:
        print(profiling.summary(config))
    write_outputs(config, results)
    failed = [p["name"] for p in results["phases"]
              if p["ops"] and sum(p["errors"].values()) >= p["ops"]]
    if failed:   # (the figures above are of errors, not of work done)
        print("bench: every request of %s failed (see the errors column)"
              % ", ".join(failed), file=sys.stderr)
        return 1
    return 0


def write_outputs(config, results):
    """--json and --plot; says where --hlog went."""
    if config.json:
        with open(config.json, "w") as f:
            json.dump(results, f, indent=1)
        print("wrote %s" % config.json)
    if config.plot:
        plot.draw({config.driver: results}, config.plot)
        print("wrote %s" % config.plot)
    if config.hlog:   # (the runner wrote it)
        print("wrote %s" % config.hlog)


if __name__ == "__main__":
    sys.exit(main())
