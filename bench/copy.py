"""``python -m bench.copy``: the command of :mod:`bench.suites.copy`."""
import sys

from bench.suites.copy import main

if __name__ == "__main__":
    sys.exit(main())
