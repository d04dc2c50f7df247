"""The exceptions gtarantool adds to tarantool-python's, and what every error a
caller gets says about its request: applied or not (docs/guarantees.rst).

Each class derives from the tarantool-python error a caller of tarantool-python
already catches for the same failure: ``RequestTimeout``, ``ProtocolError`` and
``ConnectionClosed`` (and ``CopiedCall``, a forked child's copy of a call)
from ``NetworkError``, ``WrongOwner`` from
``InterfaceError``, ``FeatureNotSupported`` from ``NotSupportedError``.

Every exception the library raises carries ``applied``: ``False`` when the
request is proven not applied (nothing was written, or the server refused it
before any change), ``None`` when it may have been.  :func:`applied` reads it
from any exception (``None`` for one that does not say).
"""
import copy
from typing import Optional

from tarantool.const import (
    REQUEST_TYPE_DELETE,
    REQUEST_TYPE_INSERT,
    REQUEST_TYPE_PING,
    REQUEST_TYPE_REPLACE,
    REQUEST_TYPE_SELECT,
    REQUEST_TYPE_UPDATE,
    REQUEST_TYPE_UPSERT,
)
from tarantool.error import InterfaceError, NetworkError, NotSupportedError

# Requests a refusal of which changed nothing: one statement each, which
# Tarantool rolls back whole when it fails (and reads, which change nothing).
SINGLE_STATEMENT = frozenset((REQUEST_TYPE_SELECT, REQUEST_TYPE_INSERT, REQUEST_TYPE_REPLACE,
                              REQUEST_TYPE_UPDATE, REQUEST_TYPE_DELETE, REQUEST_TYPE_UPSERT,
                              REQUEST_TYPE_PING))


def applied(exc: BaseException) -> Optional[bool]:
    """What ``exc`` says about the request that raised it.

    :param exc: any exception a gtarantool call raised.
    :returns: ``False`` when the request was proven not applied (sending it
        again cannot apply it twice), ``None`` when it may have been applied.
    """
    return False if getattr(exc, "applied", None) is False else None


def not_sent(exc: BaseException) -> BaseException:
    """``exc`` (an error that may be shared by many callers) as this caller's
    error for a request that was never written: a copy whose ``applied`` is False.
    A ``CopiedCall`` is returned as it is: the parent, not this process, sends
    its request (``applied`` None).

    :param exc: the error.
    :returns: the copy (``exc`` itself when it cannot be copied)."""
    if isinstance(exc, CopiedCall):
        return exc
    try:
        mine = copy.copy(exc)
    except Exception:  # noqa: BLE001 - an exotic exception: a fresh one below
        mine = ConnectionClosed(str(exc))
    mine.applied = False  # type: ignore[attr-defined]
    return mine


def refused(exc: BaseException, code: Optional[int]) -> None:
    """Class a server's error reply ``exc`` to a request of type ``code``: a
    single-statement request's refusal is not applied (``applied = False``);
    a stored function's, an eval's or an SQL statement's own error may follow
    changes it made (``None``).  A ``NetworkError`` (a lost connection, a
    bad reply: a ``DatabaseError`` too) is left as it is."""
    if isinstance(exc, NetworkError):
        return
    exc.applied = False if code in SINGLE_STATEMENT else None  # type: ignore[attr-defined]


class RequestTimeout(NetworkError, TimeoutError):
    """No reply within ``request_timeout``, which bounds the whole call
    (docs/guarantees.rst); the late reply will be discarded.

    ``applied`` is ``None``: the request may still have been executed by the
    server; ``False`` on an instance when the time ran out before the request
    was written (waiting for a slot, the connection or a writable server).
    """

    applied: Optional[bool] = None


class ProtocolError(NetworkError):
    """The server sent bytes that are not a valid IPROTO reply.

    A bad frame closes the connection (every waiting request gets this error);
    a reply body that is not a map fails only the request it answers.
    ``applied`` is ``None``.
    """

    applied: Optional[bool] = None


class ConnectionClosed(NetworkError):
    """The connection was closed (by ``close()`` or by a network failure) while a
    request waited.  ``applied`` is ``None`` (the request may have been written
    before), ``False`` on an instance raised before it was written."""

    applied: Optional[bool] = None


class CopiedCall(ConnectionClosed):
    """This greenlet is a copy, in a forked child, of a caller of the parent's,
    whose call goes on there: nothing of it is sent here (and no one re-sends
    it).  ``applied`` is None: the parent may apply it, so that sending it
    again from here could apply it twice."""

    applied = None


class WrongOwner(InterfaceError):
    """The connection was used from an OS thread other than the one that made it
    (a forked child process is not refused: it opens its own socket).
    Nothing was sent: ``applied`` is ``False``."""

    applied: Optional[bool] = False


class FeatureNotSupported(NotSupportedError):
    """The server lacks a protocol feature the call needs (watchers, streams,
    pagination...); the message names the Tarantool version that has it.
    Nothing was sent: ``applied`` is ``False``."""

    applied: Optional[bool] = False
