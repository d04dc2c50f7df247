"""The clients the load generator drives, by ``--driver`` name, and :func:`make`, which
builds a worker process's driver for a run (``--pool`` takes the pool driver)."""
import importlib.util

from bench.drivers.clients import AsynctntDriver, GeventDriver, SyncDriver, ThreadsDriver
from bench.drivers.minimal import MinimalDriver
from bench.drivers.pool import PoolDriver
from bench.drivers.sharded import RouterDriver, RouterThreadsDriver, VshardDriver

DRIVERS = {"gtarantool": GeventDriver, "sync": SyncDriver, "threads": ThreadsDriver,
           "asynctnt": AsynctntDriver, "asyncio-minimal": MinimalDriver,
           # --shards: a sharded cluster (bench.targets.sharded)
           "vshard": VshardDriver, "router": RouterDriver, "router-threads": RouterThreadsDriver}


# What each driver imports beyond tarantool-python (uvloop is used when present).
REQUIRES = {"gtarantool": ("gevent", "gtarantool"), "asynctnt": ("asynctnt",),
            "vshard": ("gevent", "gtarantool", "crc32c"), "router": ("gevent", "gtarantool",
                                                                    "crc32c"),
            "router-threads": ("crc32c",)}


def missing(name):
    """The first module driver ``name`` needs that is not installed, or None."""
    for module in REQUIRES.get(name, ()):
        if importlib.util.find_spec(module) is None:
            return module
    return None


def make(config, host, port):
    """The driver of one worker process for ``config``, connecting to ``host:port``."""
    if config.pool:
        return PoolDriver(config, host, port)
    return DRIVERS[config.driver](config, host, port)
