"""``python -m gtarantool.copy from FILE`` / ``to FILE``: see :mod:`gtarantool.copy.cli`."""
import sys

from gtarantool.copy.cli import main

if __name__ == "__main__":
    sys.exit(main())
