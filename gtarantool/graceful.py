"""Planned restarts (Tarantool 2.10+): a server's announced shutdown, and the
read-only window of a server that has just restarted.

Every connection to a server with watchers watches ``box.shutdown`` (one
subscription, shared with the user's watchers of that key).  When the server
announces ``true``, the connection stops sending on that socket: callers from
then on (and those in line for ``max_in_flight`` on it) wait in
``Connection._ensure_connected`` (within their ``request_timeout``) for a new
socket, which the server accepts once it is back; the requests written before
get their replies, then the old socket is closed, which lets the server exit
without waiting out its shutdown timeout.  Nothing is sent twice: only
requests never written wait.

After the reconnect that follows an announced shutdown (not any reconnect: a
server that was never restarting, such as a permanent election follower, has
its refusal given at once), a DML request (insert, replace, update, upsert,
delete) refused with ``ER_READONLY`` or ``ER_LOADING`` (raised before the
statement changes anything) is sent again once the ``box.status`` event says
the server is writable, when it says the server is on its way there:
read-only without ``read_only`` configured, loading or running.  A server
configured read-only, or a wait past the call's deadline, gives the caller the
error (``applied`` False).  Only the process that made the call sends it again.
"""
import time
import weakref

import gevent
from gevent.event import Event
from tarantool.error import NetworkError

from gtarantool import features, watchers
from gtarantool.errors import ConnectionClosed
from gtarantool.protocol.constants import (
    ER_LOADING,
    ER_READONLY,
    REQUEST_TYPE_DELETE,
    REQUEST_TYPE_INSERT,
    REQUEST_TYPE_REPLACE,
    REQUEST_TYPE_UPDATE,
    REQUEST_TYPE_UPSERT,
)
from gtarantool.transport import check_process, process_token

SHUTDOWN_KEY = "box.shutdown"
STATUS_KEY = "box.status"
# Refusals that Tarantool raises before a single-statement request changes anything.
NOT_APPLIED = frozenset((ER_READONLY, ER_LOADING))
DML = frozenset((REQUEST_TYPE_INSERT, REQUEST_TYPE_REPLACE, REQUEST_TYPE_UPDATE,
                 REQUEST_TYPE_DELETE, REQUEST_TYPE_UPSERT))
# How often a socket being drained is checked for its last reply: the C reader
# delivers replies with no hook to call, and this runs only during a shutdown.
DRAIN_CHECK = 0.005
DEFAULT_PATIENCE = 10.0
# Seconds between connect attempts to a server that announced its shutdown, at least.
RETRY_DELAY = 0.05


def patience(conn):
    """Seconds a caller waits for a restarting server when it has no
    ``request_timeout``: ``connection_timeout``, else ``DEFAULT_PATIENCE``."""
    return conn.request_timeout or conn.connection_timeout or DEFAULT_PATIENCE


class State:
    """A connection's view of its server's restarts (``conn._graceful``).

    ``restarting``: the server announced its shutdown and the connection has
    not connected since (callers wait for it instead of failing after
    ``reconnect_max_attempts``).  ``recovering``: the connection reconnected
    and has not yet seen the server writable or configured read-only.
    """

    __slots__ = ("_ref", "restarting", "recovering", "status", "resent", "_changed",
                 "_shutdown", "_status", "__weakref__")

    def __init__(self, conn):
        self._ref = weakref.ref(conn)
        self.restarting = False
        self.recovering = False
        self.status = None        # the last box.status value since the connect
        self.resent = 0           # writes sent again once the server became writable
        self._changed = Event()   # set (and replaced) by each box.status event
        self._shutdown = None     # the box.shutdown Watcher
        self._status = None       # the box.status Watcher, once a write needed it

    def connected(self, conn, reconnected):
        """From ``connect()``, the new transport up: watch ``box.shutdown``."""
        self.restarting = False
        # (recovering stays as _on_shutdown set it: only a restart it announced
        # makes a refusal worth waiting out.)
        self.status = None
        if features.WATCHERS not in (conn._server_features or ()):
            return
        registry = watchers.registry(conn)
        if self._shutdown is None or not self._shutdown.registered:
            self._shutdown = registry.watch(SHUTDOWN_KEY, self._on_shutdown, internal=True)
        # Out now, not with the caller's first request: counts and first
        # requests stay those of the caller.
        conn._transport.flush()

    def _on_shutdown(self, key, value):
        """In a watcher runner: on ``true``, take the socket out of use and drain it."""
        conn = self._ref()
        if value is not True or conn is None:
            return
        transport = conn._transport
        registry = conn._watchers
        if (transport is None or not transport.alive or registry is None
                or registry._transport is not transport):
            return   # (an event of a socket replaced since)
        self.restarting = True
        # (Set now: a caller may write on the next socket before connect() is through.)
        self.recovering = True
        conn._transport = None
        conn.connected = False
        if conn._finalizer is not None:
            # Its arguments hold the transport (and its buffer) until it runs.
            conn._finalizer.detach()
            conn._finalizer = None
        transport.drain()
        registry._spawn(_drain, transport)

    def _on_status(self, key, value):
        self.status = value if isinstance(value, dict) else None
        if self.status is not None and not self.status.get("is_ro"):
            self.recovering = False
        changed, self._changed = self._changed, Event()
        changed.set()

    def resend(self, conn, code, exc, deadline=None):
        """After request ``code`` was refused with ``exc``: True when it is a
        DML request refused before any change while the server recovers from
        an announced restart, and the server became writable by ``deadline``
        (``time.monotonic()``; None: ``patience`` from now), in the process
        that made the call (the caller sends it again); False to give the
        caller ``exc``.

        :raises gtarantool.ConnectionClosed: (``applied`` False) the process
            forked while the caller waited, and this is the child."""
        if not self.recovering or code not in DML or isinstance(exc, NetworkError) \
                or getattr(exc, "code", None) not in NOT_APPLIED:
            return False
        if features.WATCHERS not in (conn._server_features or ()) or conn._transport is None:
            return False
        if self._status is None or not self._status.registered:
            self._status = watchers.registry(conn).watch(STATUS_KEY, self._on_status,
                                                         internal=True)
        token = process_token()
        if deadline is None:
            deadline = time.monotonic() + patience(conn)
        while True:
            status = self.status
            if status is not None:
                if not status.get("is_ro"):
                    self.resent += 1
                    return True
                if status.get("is_ro_cfg") or status.get("status") not in ("loading", "running"):
                    self.recovering = False   # read-only by design: refused at once from now on
                    return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.recovering = False   # (one long wait per reconnect at most)
                return False
            self._changed.wait(remaining)
            check_process(token)


def _drain(transport):
    """Close ``transport`` once every request written on it got its reply (or
    it died: the server closes it after its shutdown timeout)."""
    try:
        while transport.alive and transport.in_flight:
            gevent.sleep(DRAIN_CHECK)
    finally:
        transport.close(ConnectionClosed("closed after the server announced its shutdown "
                                         "and answered every request sent before"))
