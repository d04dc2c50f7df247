"""The pool's role monitor: one greenlet per instance that (re)connects it and
learns its role, from the ``box.status`` watcher where the server pushes it
(:class:`RoleWatch`, Tarantool 2.10+), else by calling ``box.info`` on every
check (:class:`RolePoll`).

:func:`monitor` checks an instance every ``pool.refresh_delay``, or at once when
``instance.wakeup`` is set; a check is bounded by ``pool.connection_timeout``,
and any failure marks the instance unavailable until a later check succeeds.
Roles reach the pool through ``pool._set_state(instance, status, read_only,
box_status)``.
"""
import gevent
import gevent.event
from gevent import Timeout
from tarantool.connection_pool import Status
from tarantool.error import NetworkError

from gtarantool.errors import FeatureNotSupported

__all__ = ["RolePoll", "RoleWatch", "monitor"]

HEALTHY, UNHEALTHY = Status.HEALTHY, Status.UNHEALTHY


class RolePoll:
    """Learns an instance's role by calling ``box.info`` on every check (as
    tarantool-python; needs execute access to ``box.info``).  For servers
    without watchers (before 2.10)."""

    name = "poll"

    def __init__(self, pool, instance):
        self._pool = pool
        self._instance = instance

    def refresh(self, woken):
        """Learn the role now.

        :param woken: the check was woken by a request's error (a wrong role).
        :raises Exception: any error of the request (the instance is then unavailable)."""
        info = self._instance.conn.call("box.info").data[0]
        self._pool._set_state(self._instance, HEALTHY if info["status"] == "running"
                              else UNHEALTHY, info["ro"], info["status"])

    def close(self):
        """Stop learning (nothing to do for polls)."""


class RoleWatch(RolePoll):
    """Learns an instance's role from the ``box.status`` watcher (Tarantool
    2.10+): the server pushes ``is_ro`` and ``status`` as they change, so the
    pool knows of a promotion one round trip after it.  Periodic checks only
    ping (is the connection alive?); a check woken by a wrong-role error polls
    ``box.info``, since that error may be older or newer than the last push.
    An announced shutdown (``box.shutdown``) makes the instance unavailable.

    Raises ``gtarantool.FeatureNotSupported`` on an older server.
    """

    name = "watch"

    def __init__(self, pool, instance):
        super().__init__(pool, instance)
        self._first = gevent.event.Event()
        self._status = None
        self._shutting_down = False
        # The connection watches again after each reconnect (and calls us with
        # the current value): one registration lasts as long as the instance.
        self._watchers = [instance.conn.watch("box.status", self._on_status),
                          instance.conn.watch("box.shutdown", self._on_shutdown)]
        try:
            self._first.wait()   # the current value (bounded by the check's timeout)
        except BaseException:
            self.close()
            raise

    def _on_status(self, key, value):
        self._status = value if isinstance(value, dict) else {}
        self._apply()
        self._first.set()

    def _on_shutdown(self, key, value):
        # True: out of the rotation at once; the value of the restarted
        # server (false) brings it back with its box.status.
        self._shutting_down = value is True
        if self._shutting_down:
            self._status = {}   # (the restarted server's box.status comes after)
        if self._shutting_down or self._status:
            self._apply()

    def _apply(self):
        value = self._status
        status = value.get("status")
        if self._shutting_down or not value:
            self._pool._set_state(self._instance, UNHEALTHY, None,
                                  "shutdown" if self._shutting_down else None)
            return
        self._pool._set_state(self._instance, HEALTHY if status == "running" else UNHEALTHY,
                              value.get("is_ro") if status else None, status)

    def refresh(self, woken):
        """Ping (the role comes by push), or poll ``box.info`` when ``woken``."""
        if woken:
            super().refresh(woken)
        else:
            self._instance.conn.ping()

    def close(self):
        """Unregister the watchers."""
        for watcher in self._watchers:
            watcher.unregister()


def monitor(pool, instance):
    """Check ``instance`` every ``pool.refresh_delay``, or at once when woken;
    sets ``instance.checked`` after each check.  Never returns or dies of an
    error: the pool kills it (``close()``, ``remove()``)."""
    woken = False
    while True:
        instance.wakeup.clear()
        timer = Timeout(pool.connection_timeout)
        timer.start()
        try:
            _check(pool, instance, woken)
        except (Exception, Timeout) as exc:   # any failure: unavailable until the next check
            if exc is timer:
                exc = NetworkError("no answer within connection_timeout=%ss"
                                   % (pool.connection_timeout,))
            elif not isinstance(exc, Exception):
                raise
            instance.last_error = exc
            pool._set_state(instance, UNHEALTHY, None, None)
        finally:
            timer.close()
        instance.checked.set()
        woken = instance.wakeup.wait(pool.refresh_delay)


def _check(pool, instance, woken):
    conn = instance.conn
    if conn.is_closed():
        if instance.state.status is HEALTHY:
            pool._set_state(instance, UNHEALTHY, None, None)
        if isinstance(instance.source, RoleWatch):
            # Its watcher comes back with the connection and the current value.
            woken = True
        elif instance.source is not None:
            instance.source = None   # the server may have been upgraded: try watching
        # ping() reconnects as any request would (connect() would drop a
        # connection a request just re-established).
        conn.ping()
    if instance.source is None:
        try:
            instance.source = RoleWatch(pool, instance)
            return
        except FeatureNotSupported:
            instance.source = RolePoll(pool, instance)
    instance.source.refresh(woken)
