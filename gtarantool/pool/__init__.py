"""A gevent connection pool over a replica set: ``tarantool.ConnectionPool``'s API.

::

    pool = gtarantool.ConnectionPool([{"host": "10.0.0.1", "port": 3301},
                                      {"host": "10.0.0.2", "port": 3301}],
                                     user="app", password="secret", wait_timeout=2)
    pool.insert("accounts", (1, "x"))                      # the read-write instance
    pool.select("accounts", 1, mode=tarantool.Mode.RO)     # a read-only one

The pool (:mod:`.connection_pool`), how it picks an instance
(:mod:`.strategies`) and how it learns roles (:mod:`.roles`); every name
below is importable from ``gtarantool.pool``.
"""
from tarantool.connection_pool import Mode

from gtarantool.pool.connection_pool import ConnectionPool
from gtarantool.pool.connection_pool import Instance as Instance  # the class of pool.pool values
from gtarantool.pool.connection_pool import _pool as _pool  # None without the C extension
from gtarantool.pool.roles import RolePoll, RoleWatch
from gtarantool.pool.strategies import LeastInFlightStrategy, RoundRobinStrategy

__all__ = ["ConnectionPool", "Mode", "RoundRobinStrategy", "LeastInFlightStrategy",
           "RolePoll", "RoleWatch"]
