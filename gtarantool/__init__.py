"""gtarantool: a gevent connector for Tarantool.

Many greenlets share one socket; a writer greenlet coalesces their requests
into few ``send`` calls and a reader greenlet routes replies by sync id.  The
API, errors and response objects are tarantool-python's.
"""
import importlib
from typing import TYPE_CHECKING, Any, Optional, Union

from tarantool.error import (  # noqa: F401 - re-exported for drop-in use
    DatabaseError,
    Error,
    InterfaceError,
    NetworkError,
    SchemaError,
)

from gtarantool.connection import Connection
from gtarantool.errors import (
    ConnectionClosed,
    FeatureNotSupported,
    ProtocolError,
    RequestTimeout,
    WrongOwner,
)
from gtarantool.pipeline import Pipeline
from gtarantool.protocol.responses import LazyDatabaseError
from gtarantool.transport import Stats

if TYPE_CHECKING:
    from gtarantool.pool import ConnectionPool, LeastInFlightStrategy, Mode, RoundRobinStrategy
    from gtarantool.sharding import Router, ShardingError, StorageError

__version__ = "2.0.0"

__all__ = ["connect", "Connection", "Pipeline", "RequestTimeout", "ProtocolError",
           "ConnectionClosed", "WrongOwner", "Stats", "DatabaseError", "Error", "InterfaceError",
           "NetworkError", "SchemaError", "FeatureNotSupported", "ConnectionPool", "Mode",
           "RoundRobinStrategy", "LeastInFlightStrategy", "LazyDatabaseError", "Router",
           "ShardingError", "StorageError"]

# The pool and the router are imported when first named: a program (or a
# worker process of ``python -m gtarantool.copy``) that uses one connection
# does not pay for their imports (hashing, vshard's errors) at start-up.
_LAZY = {"ConnectionPool": "gtarantool.pool", "LeastInFlightStrategy": "gtarantool.pool",
         "Mode": "gtarantool.pool", "RoundRobinStrategy": "gtarantool.pool",
         "Router": "gtarantool.sharding", "ShardingError": "gtarantool.sharding",
         "StorageError": "gtarantool.sharding"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError("module 'gtarantool' has no attribute %r" % name)
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(_LAZY))


def connect(host: Optional[str] = "127.0.0.1", port: Union[int, str] = 3301,
            user: Optional[str] = None, password: Optional[str] = None,
            **options: Any) -> Connection:
    """Open a :class:`Connection`; ``options`` are those of ``tarantool.Connection``
    plus ``request_timeout``, ``max_in_flight`` and ``max_response_size``
    (``connection_timeout`` defaults to 10 s here).

    A Unix socket: ``connect(None, "/path/to/socket")``, as in tarantool-python.

    What bounds a call, what each error says about its request (``applied``)
    and what is ever re-sent: docs/guarantees.rst.

    :param host: the server's address; ``None`` for a Unix socket.
    :param port: its port, or the Unix socket's path.
    :param user: the user to authenticate as (``None``: guest).
    :param password: that user's password.
    :param options: :class:`Connection`'s and ``tarantool.Connection``'s options.
    :returns: the :class:`Connection`, connected unless ``connect_now=False``.
    :raises tarantool.error.NetworkError: the server cannot be reached, or
        authentication or a required feature failed (the cause chained).
    :raises tarantool.error.ConfigurationError: a bad option.
    """
    return Connection(host, port, user=user, password=password, **options)
