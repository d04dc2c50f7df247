"""An alias of :mod:`gtarantool.contrib.locust`, the Locust integration:
``from gtarantool.locust import TarantoolUser`` keeps working."""
from gtarantool.contrib.locust import *  # noqa: F401,F403
from gtarantool.contrib.locust import __all__  # noqa: F401
