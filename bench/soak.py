"""``python -m bench.soak``: the command of :mod:`bench.suites.soak`."""
import sys

from bench.suites.soak import main

if __name__ == "__main__":
    sys.exit(main())
