"""``python -m bench.poolcompare``: the command of :mod:`bench.suites.poolcompare`."""
import sys

from bench.suites.poolcompare import main

if __name__ == "__main__":
    sys.exit(main())
