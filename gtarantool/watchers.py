"""Watchers (Tarantool 2.10+): the server pushes the value of a key
(``box.status``, ``box.id``, a key set with ``box.broadcast``) when it changes.

What callers rely on: callbacks never run in the reader greenlet; a callback
that takes long sees the newest value next, never an older one; after a
reconnect each callback gets the key's current value again.  How it works:
"Watchers" in docs/design.rst.
"""
from __future__ import annotations

import logging
import weakref
from typing import Any, Callable

import gevent
import msgpack
from gevent import getcurrent

from gtarantool import features
from gtarantool.protocol.constants import (
    IPROTO_EVENT_DATA,
    IPROTO_EVENT_KEY,
    IPROTO_UNWATCH,
    IPROTO_WATCH,
    IPROTO_WATCH_ONCE,
)
from gtarantool.protocol.frames import notice_frame

# ``conn`` is a Connection, annotated Any: connection.py imports this module, and
# this module imports nothing of it, not even for the type checker.

MAX_RECONNECT_DELAY = 5.0   # seconds between the watchers' reconnect cycles, at most

log = logging.getLogger(__name__)


class Watcher:
    """One callback watching one key; returned by ``Connection.watch``.
    ``key`` and ``callback`` are the watch's; ``registered`` is False once
    unregistered (or its connection closed)."""

    __slots__ = ("key", "callback", "registered", "internal", "_seen", "_registry")

    def __init__(self, registry: Watchers, key: str, callback: Callable[[str, Any], Any],
                 internal: bool = False) -> None:
        self.key = key
        self.callback = callback
        self.registered = True
        self.internal = internal  # the connection's own (see graceful.py)
        self._seen = 0            # the version of the key's value it was last called with
        self._registry = registry

    def unregister(self) -> None:
        """Stop this watcher (its callback is not called again; a call under
        way finishes).  The last watcher of a key unsubscribes (IPROTO_UNWATCH).
        A second call does nothing; it never waits for the server."""
        if self.registered:
            self._registry.remove(self)

    def __repr__(self) -> str:
        return "<Watcher %r%s>" % (self.key, "" if self.registered else " (unregistered)")


class _Key:
    """A key the session watches: its last value and the watchers to call."""

    __slots__ = ("key", "watchers", "value", "version", "acked", "runner")

    def __init__(self, key):
        self.key = key
        self.watchers = []
        self.value = None
        self.version = 0          # events received for it (0: none yet)
        self.acked = True         # no event waits for its IPROTO_WATCH
        self.runner = None        # the greenlet calling its watchers, while one runs


class Watchers:
    """A connection's watchers (``conn._watchers``, made by the first ``watch``).
    While a user's watcher is registered, the transport's hooks refer to it
    and so keep the connection alive (its callbacks may still run) until
    ``close()`` or the last ``unregister()``; the connection's own watchers
    (``internal``) refer to it weakly.

    It owns the runner greenlets and, while the connection is lost and some
    key is watched, a greenlet that reconnects it (nobody else might send a
    request to make the lazy reconnect happen); ``close()`` kills and joins
    them all.
    """

    def __init__(self, conn):
        self._ref = weakref.ref(conn)
        self._keep = None         # the connection, while a user's watcher needs it
        self._keys = {}
        self._greenlets = set()
        self._transport = None
        self._reconnector = None
        self._closed = False

    @property
    def _conn(self):
        return self._ref()

    # -- the API -------------------------------------------------------------

    def watch(self, key, callback, internal=False):
        if not isinstance(key, str):
            raise TypeError("a watcher's key must be a str, not %s" % type(key).__name__)
        if not callable(callback):
            raise TypeError("callback must be callable")
        state = self._keys.get(key)
        if state is None:
            state = self._keys[key] = _Key(key)
            if self._transport is self._conn._transport:
                self._send(IPROTO_WATCH, key)
            else:
                self.attach(self._conn._transport)   # watches every key, this one too
        watcher = Watcher(self, key, callback, internal)
        state.watchers.append(watcher)
        if not internal:
            self._keep = self._conn
        if state.version:   # the value is known: this one gets it now
            self._schedule(state)
        return watcher

    def remove(self, watcher):
        watcher.registered = False
        state = self._keys.get(watcher.key)
        if state is None:
            return
        state.watchers.remove(watcher)
        if not any(not w.internal for s in self._keys.values() for w in s.watchers):
            self._keep = None
        if not state.watchers:
            del self._keys[watcher.key]
            self._send(IPROTO_UNWATCH, watcher.key)
            if not self._keys:
                # Hooked to the transport (whose greenlets the hub holds), we
                # would keep the connection from being garbage-collected.
                self._detach()

    def close(self):
        """Unregister every watcher; kill and join the greenlets."""
        self._closed = True
        for state in self._keys.values():
            for watcher in state.watchers:
                watcher.registered = False
        self._keys.clear()
        self._keep = None
        self._detach()
        current = getcurrent()
        greenlets = [glet for glet in self._greenlets if glet is not current]
        gevent.killall(greenlets, block=True)

    # -- the connection's side -------------------------------------------------

    def attach(self, transport):
        """Route ``transport``'s events here and watch every key on it (called
        on every connect: the server forgets a session's watchers)."""
        if self._closed or not self._keys or transport is None or self._transport is transport:
            return   # (None: the socket went while connect() loaded the schema)
        self._detach()
        self._transport = transport
        transport.on_event = self._on_event
        transport.on_fail = self._on_fail
        for key, state in self._keys.items():
            state.acked = True   # the WATCH below replaces any ack owed
            self._send(IPROTO_WATCH, key)

    def _detach(self):
        if self._transport is not None:
            self._transport.on_event = self._transport.on_fail = None
            self._transport = None

    def _send(self, code, key):
        """Queue IPROTO_WATCH/UNWATCH for ``key`` (no reply comes); on a dead
        transport, nothing: the reconnect watches every key again."""
        transport = self._transport
        conn = self._conn
        if transport is None or not transport.alive or conn is None:
            return
        body = msgpack.packb({IPROTO_EVENT_KEY: key}, use_bin_type=True)
        transport.post(notice_frame(code, next(conn._syncs), body))

    def _on_event(self, sync, body):
        """In the reader: record the key's new value, start its runner."""
        conn = self._conn
        if conn is None:
            return
        try:
            body = conn._decoder.decode(body)
            key = body[IPROTO_EVENT_KEY]
        except Exception:  # noqa: BLE001 - one bad event must not kill the connection
            log.exception("undecodable watcher event (sync %d)", sync)
            return
        state = self._keys.get(key)
        if state is None:   # unwatched since
            return
        state.value = body.get(IPROTO_EVENT_DATA)
        state.version += 1
        state.acked = False
        self._schedule(state)

    def _schedule(self, state):
        if state.runner is None and not self._closed:
            state.runner = self._spawn(self._run, state)

    def _spawn(self, func, *args):
        glet = gevent.Greenlet(func, *args)
        self._greenlets.add(glet)
        glet.link(self._greenlets.discard)
        glet.start()
        return glet

    def _run(self, state):
        """Call each watcher of ``state`` with each value it has not seen, in
        order, one call at a time; then acknowledge the last event."""
        try:
            while True:
                version, value = state.version, state.value
                behind = [w for w in state.watchers if w._seen < version]
                if not behind:
                    break
                for watcher in behind:
                    if not watcher.registered or watcher._seen >= version:
                        continue
                    watcher._seen = version
                    try:
                        watcher.callback(state.key, value)
                    except Exception:  # noqa: BLE001 - logged; the watcher goes on
                        log.exception("watcher callback for key %r failed", state.key)
            # (No yield from the check above to here: no event can come between.)
            if not state.acked and self._keys.get(state.key) is state:
                state.acked = True
                self._send(IPROTO_WATCH, state.key)
        finally:
            state.runner = None

    def _on_fail(self, exc):
        """The transport died: reconnect in a greenlet of ours while keys are watched."""
        self._detach()
        if self._keys and not self._closed and self._reconnector is None:
            self._reconnector = self._spawn(self._reconnect)

    def _reconnect(self):
        conn = self._conn
        delay = max(conn.reconnect_delay, 0.1) if conn is not None else 0
        try:
            while self._keys and not self._closed and conn is not None:
                try:
                    conn._ensure_connected()   # connect() calls attach()
                    return
                except Exception as exc:  # noqa: BLE001 - retried until close()
                    # A connection event, logged as the others are (INFO): an
                    # application that configures no logging hears of it from
                    # its own calls, not from a background greenlet.
                    log.info("watchers: reconnect to %s:%s failed (next try in %.1fs): %s",
                             conn.host, conn.port, delay, exc)
                # Not held while sleeping, as the exception's frames would hold
                # it inside the except clause: it may be dropped meanwhile.
                conn = None
                gevent.sleep(delay)
                conn = self._conn
                delay = min(delay * 2, MAX_RECONNECT_DELAY)
        finally:
            self._reconnector = None


def watch(conn: Any, key: str, callback: Callable[[str, Any], Any]) -> Watcher:
    """``Connection.watch``: see its docstring.

    :param conn: the connection.
    :param key: the key's name.
    :param callback: ``callback(key, value)``.
    :returns: the :class:`Watcher`.
    :raises TypeError: ``key`` is not a str, or ``callback`` is not callable.
    :raises gtarantool.FeatureNotSupported: the server has no watchers (2.10+).
    :raises tarantool.error.NetworkError: the connection could not be (re)established.
    """
    deadline = conn._call_deadline()
    conn._reach(deadline)
    features.require(conn, features.WATCHERS, deadline)
    return registry(conn).watch(key, callback)


def registry(conn: Any) -> Watchers:
    """``conn``'s ``Watchers``, made on first use.

    :param conn: the connection.
    :returns: its :class:`Watchers`.
    """
    watchers = conn._watchers
    if watchers is None:
        watchers = conn._watchers = Watchers(conn)
    return watchers


def watch_once(conn: Any, key: str) -> Any:
    """``Connection.watch_once``: see its docstring.

    :param conn: the connection.
    :param key: the key's name.
    :returns: the key's value (``None`` when it has none).
    :raises TypeError: ``key`` is not a str.
    :raises gtarantool.FeatureNotSupported: the server is older than 3.0.
    :raises gtarantool.RequestTimeout: no reply within ``request_timeout``.
    :raises tarantool.error.NetworkError: the connection could not be (re)established.
    """
    if not isinstance(key, str):
        raise TypeError("a watcher's key must be a str, not %s" % type(key).__name__)
    deadline = conn._call_deadline()   # (one request_timeout for all its steps)
    conn._reach(deadline)
    features.require(conn, features.WATCH_ONCE, deadline)
    data = conn._request(IPROTO_WATCH_ONCE, conn._encoder.pack({IPROTO_EVENT_KEY: key}),
                         deadline=deadline).data
    return data[0] if data else None
