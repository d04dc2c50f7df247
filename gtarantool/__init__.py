"""gtarantool: a gevent connector for Tarantool.

Many greenlets share one socket; a writer greenlet coalesces their requests
into few ``send`` calls and a reader greenlet routes replies by sync id.  The
API, errors and response objects are tarantool-python's.
"""
from typing import Any, Optional, Union

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
from gtarantool.pool import ConnectionPool, LeastInFlightStrategy, Mode, RoundRobinStrategy
from gtarantool.protocol.responses import LazyDatabaseError
from gtarantool.sharding import Router, ShardingError, StorageError
from gtarantool.transport import Stats

__version__ = "2.0.0"

__all__ = ["connect", "Connection", "Pipeline", "RequestTimeout", "ProtocolError",
           "ConnectionClosed", "WrongOwner", "Stats", "DatabaseError", "Error", "InterfaceError",
           "NetworkError", "SchemaError", "FeatureNotSupported", "ConnectionPool", "Mode",
           "RoundRobinStrategy", "LeastInFlightStrategy", "LazyDatabaseError", "Router",
           "ShardingError", "StorageError"]


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
