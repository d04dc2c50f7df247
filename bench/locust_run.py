"""``python -m bench.locust_run``: the command of :mod:`bench.locust.run`."""
import sys

from bench.locust.run import main

if __name__ == "__main__":
    sys.exit(main())
