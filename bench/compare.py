"""``python -m bench.compare``: the command of :mod:`bench.suites.compare`."""
import sys

from bench.suites.compare import main

if __name__ == "__main__":
    sys.exit(main())
