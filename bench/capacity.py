"""``python -m bench.capacity``: the command of :mod:`bench.suites.capacity`."""
import sys

from bench.suites.capacity import main

if __name__ == "__main__":
    sys.exit(main())
