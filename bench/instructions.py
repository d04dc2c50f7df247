"""``python -m bench.instructions``: the command of :mod:`bench.suites.instructions`."""
import sys

from bench.suites.instructions import main

if __name__ == "__main__":
    sys.exit(main())
