"""``python -m bench.sweep``: the command of :mod:`bench.suites.sweep`."""
import sys

from bench.suites.sweep import main

if __name__ == "__main__":
    sys.exit(main())
