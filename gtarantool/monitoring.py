"""Events a service can watch: connections, restarts, roles, re-routes.

``register(listener)`` makes ``listener(event)`` run for every event from then
on, in the greenlet where the event happened (the caller's, for a re-routed
write), until ``unregister(listener)``.  Each event is a small frozen
dataclass with the instance's ``address`` (``"host:port"``, or a Unix socket's
path) and the wall-clock ``time`` it happened (``time.time()``).  The same
events go to the library's loggers (``gtarantool.connection``,
``gtarantool.pool``, ``gtarantool.sharding``) at the level each class names:
INFO or DEBUG, never higher, so an application that configures no logging
sees none of them.
With no listener and those loggers off, an event costs one check and is
never built.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Optional, Tuple, Type

__all__ = [
    "register", "unregister", "listeners", "Event",
    "ConnectionOpenedEvent", "ConnectionAuthenticatedEvent", "ConnectionClosedEvent",
    "ConnectionFailedEvent", "ReconnectAttemptEvent", "ShutdownAnnouncedEvent",
    "ServerWritableEvent", "WriteResentEvent", "RoleChangedEvent",
    "InstanceOutOfRotationEvent", "InstanceBackInRotationEvent", "WriteReroutedEvent",
    "BucketMapCorrectedEvent",
]

Listener = Callable[["Event"], Any]

_listeners: Tuple[Listener, ...] = ()
log = logging.getLogger(__name__)

CONNECTION = logging.getLogger("gtarantool.connection")
POOL = logging.getLogger("gtarantool.pool")
SHARDING = logging.getLogger("gtarantool.sharding")


def register(listener: Listener) -> None:
    """Call ``listener(event)`` for every event from now on.

    :param listener: a callable taking one :class:`Event`; an exception it
        raises is logged (``gtarantool.monitoring``) and goes no further.
    :raises TypeError: ``listener`` is not callable.
    """
    global _listeners
    if not callable(listener):
        raise TypeError("a listener must be callable, not %s" % type(listener).__name__)
    if listener not in _listeners:
        _listeners = _listeners + (listener,)


def unregister(listener: Listener) -> None:
    """Stop calling ``listener``; nothing happens when it is not registered.

    :param listener: a listener given to :func:`register`.
    """
    global _listeners
    # (==, not is: a bound method is a new object at each attribute access)
    _listeners = tuple(known for known in _listeners if known != listener)


def listeners() -> Tuple[Listener, ...]:
    """The registered listeners, in the order they are called.

    :returns: a tuple of them.
    """
    return _listeners


@dataclass(frozen=True)
class Event:
    """What every event has: the instance's ``address`` and the ``time`` (``time.time()``)."""

    address: str
    time: float
    logger: ClassVar[logging.Logger] = CONNECTION
    level: ClassVar[int] = logging.DEBUG

    def message(self) -> str:
        """The log line: the event's name, its address and its other fields."""
        extra = ", ".join("%s=%r" % (name, value) for name, value in vars(self).items()
                          if name not in ("address", "time"))
        name = type(self).__name__[:-len("Event")]
        return "%s %s%s" % (name, self.address, " (%s)" % extra if extra else "")


@dataclass(frozen=True)
class ConnectionOpenedEvent(Event):
    """A socket to the server is up and its greeting read (DEBUG)."""


@dataclass(frozen=True)
class ConnectionAuthenticatedEvent(Event):
    """The connection authenticated as ``user`` (DEBUG)."""

    user: str = ""


@dataclass(frozen=True)
class ConnectionClosedEvent(Event):
    """The connection's socket was closed: by ``close()``, or replaced after it
    failed (``reason``) (INFO)."""

    reason: str = ""
    level: ClassVar[int] = logging.INFO


@dataclass(frozen=True)
class ConnectionFailedEvent(Event):
    """Connecting failed (``error``: what failed) (INFO)."""

    error: str = ""
    level: ClassVar[int] = logging.INFO


@dataclass(frozen=True)
class ReconnectAttemptEvent(Event):
    """A connection that was up before tries to connect again (``attempt``: 1,
    2, ... within one wait for the server) (INFO)."""

    attempt: int = 1
    level: ClassVar[int] = logging.INFO


@dataclass(frozen=True)
class ShutdownAnnouncedEvent(Event):
    """The server announced its shutdown (``box.shutdown``): nothing more is
    written on that socket (INFO)."""

    level: ClassVar[int] = logging.INFO


@dataclass(frozen=True)
class ServerWritableEvent(Event):
    """A server that restarted is writable again (``box.status``) (INFO)."""

    level: ClassVar[int] = logging.INFO


@dataclass(frozen=True)
class WriteResentEvent(Event):
    """A write refused while the restarted server was read-only was sent again
    once it became writable (``code``: the box error of the refusal) (INFO)."""

    code: Optional[int] = None
    level: ClassVar[int] = logging.INFO


@dataclass(frozen=True)
class RoleChangedEvent(Event):
    """A pool's instance changed role: ``old`` and ``new`` are ``"master"``,
    ``"replica"`` or ``None`` (unavailable) (INFO)."""

    old: Optional[str] = None
    new: Optional[str] = None
    logger: ClassVar[logging.Logger] = POOL
    level: ClassVar[int] = logging.INFO


@dataclass(frozen=True)
class InstanceOutOfRotationEvent(Event):
    """A pool stopped sending requests to the instance (``error``: why, when
    known) (INFO)."""

    error: str = ""
    logger: ClassVar[logging.Logger] = POOL
    level: ClassVar[int] = logging.INFO


@dataclass(frozen=True)
class InstanceBackInRotationEvent(Event):
    """A pool sends requests to the instance again, as ``role`` (INFO)."""

    role: str = ""
    logger: ClassVar[logging.Logger] = POOL
    level: ClassVar[int] = logging.INFO


@dataclass(frozen=True)
class WriteReroutedEvent(Event):
    """A write the instance at ``address`` refused before applying it (``code``)
    went to the instance at ``to`` (INFO)."""

    to: str = ""
    code: Optional[int] = None
    logger: ClassVar[logging.Logger] = POOL
    level: ClassVar[int] = logging.INFO


@dataclass(frozen=True)
class BucketMapCorrectedEvent(Event):
    """A storage (``address``: its replica set's name) answered that
    ``bucket_id`` is not there; the router's map now sends it to ``to`` (the
    replica set's name, ``""`` when the storage did not say) (DEBUG:
    rebalancing makes many)."""

    bucket_id: int = 0
    to: str = ""
    code: Optional[int] = None
    logger: ClassVar[logging.Logger] = SHARDING


def emit(kind: Type[Event], address: Any, **fields: Any) -> None:
    """Build a ``kind`` event and hand it to the logger and the listeners,
    when either wants it (the library's rare points call this).

    :param kind: an :class:`Event` subclass.
    :param address: the instance's address (made a str).
    :param fields: the event's own fields.
    """
    listening = _listeners
    if not listening and not kind.logger.isEnabledFor(kind.level):
        return
    event = kind(str(address), time.time(), **fields)
    kind.logger.log(kind.level, "%s", event.message())
    for listener in listening:
        try:
            listener(event)
        except Exception:  # noqa: BLE001 - a listener's bug must not fail the request
            log.exception("monitoring listener %r failed on %r", listener, event)


def address_of(conn: Any) -> str:
    """A connection's address as events name it: ``host:port``, or the socket's path."""
    if conn.host is None:
        return str(conn.port)
    return "%s:%s" % (conn.host, conn.port)


def role_of(state: Any) -> Optional[str]:
    """A pool's ``InstanceState`` as a role name: ``"master"``, ``"replica"``, or
    ``None`` when the instance is unavailable."""
    if state is None or getattr(state.status, "name", state.status) != "HEALTHY":
        return None
    return "replica" if state.read_only else "master"


def instance_state(name: str, old: Any, new: Any, error: Any = None) -> None:
    """A pool's instance went from state ``old`` to ``new``: the role change, and
    its going out of or back into rotation."""
    if not _listeners and not POOL.isEnabledFor(logging.INFO):
        return
    before, after = role_of(old), role_of(new)
    if before == after:
        return
    emit(RoleChangedEvent, name, old=before, new=after)
    if after is None:
        emit(InstanceOutOfRotationEvent, name, error="" if error is None else str(error))
    elif before is None:
        emit(InstanceBackInRotationEvent, name, role=after)

