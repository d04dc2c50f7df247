"""``python -m bench.profile``: the command of :mod:`bench.profiling.callgrind`."""
import sys

from bench.profiling.callgrind import main

if __name__ == "__main__":
    sys.exit(main())
