"""``python -m bench.perf``: the command of :mod:`bench.suites.perf`."""
import sys

from bench.suites.perf import main

if __name__ == "__main__":
    sys.exit(main())
