"""The exceptions gtarantool adds to tarantool-python's.

Each derives from the tarantool-python error a caller of tarantool-python
already catches for the same failure: ``RequestTimeout``, ``ProtocolError`` and
``ConnectionClosed`` from ``NetworkError``, ``WrongOwner`` from
``InterfaceError``, ``FeatureNotSupported`` from ``NotSupportedError``.
"""
from tarantool.error import InterfaceError, NetworkError, NotSupportedError


class RequestTimeout(NetworkError, TimeoutError):
    """No reply within ``request_timeout``; the late reply will be discarded.

    The request may still have been executed by the server.
    """


class ProtocolError(NetworkError):
    """The server sent bytes that are not a valid IPROTO reply.

    A bad frame closes the connection (every waiting request gets this error);
    a reply body that is not a map fails only the request it answers.
    """


class ConnectionClosed(NetworkError):
    """The connection was closed (by ``close()`` or by a network failure) while a
    request waited."""


class WrongOwner(InterfaceError):
    """The connection was used from an OS thread other than the one that made it
    (a forked child process is not refused: it opens its own socket)."""


class FeatureNotSupported(NotSupportedError):
    """The server lacks a protocol feature the call needs (watchers, streams,
    pagination...); the message names the Tarantool version that has it."""
