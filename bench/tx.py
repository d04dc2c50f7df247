"""``python -m bench.tx``: the command of :mod:`bench.suites.tx`."""
import sys

from bench.suites.tx import main

if __name__ == "__main__":
    sys.exit(main())
