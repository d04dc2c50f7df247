"""One storage replica set of a :class:`gtarantool.Router`: its pool, the order its
replicas are tried in for reads, and calls on it that name no bucket
(``callrw``/``callro``/``callbro``, as vshard's ``replicaset`` objects).

Reads pick their instance here (the pool's roles, as its monitor last saw
them): ``ro`` the master, else the replicas in order; ``re`` the replicas in
order, then the master; ``bro``/``bre`` the same, balanced round-robin.  The
order is the configuration's, sorted by ``weights[zone][replica's zone]``
when the router has a zone.
"""
from __future__ import annotations

import itertools
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import gevent
from tarantool.connection_pool import Mode, Status
from tarantool.error import ConfigurationError, DatabaseError, NetworkError

from gtarantool.errors import ConnectionClosed, RequestTimeout
from gtarantool.pool import ConnectionPool

__all__ = ["Replicaset"]

HEALTHY = Status.HEALTHY
RW, PREFER_RW, ANY = Mode.RW, Mode.PREFER_RW, Mode.ANY


def seconds(value: Any, name: str = "timeout") -> float:
    """``value`` when it is a positive, finite number of seconds.

    :param value: the number to check.
    :param name: the parameter's name, for the message.
    :returns: ``value``.
    :raises ValueError: anything else (gevent takes NaN for no timeout at all,
        0 or less for an expired one, and True for 1).
    """
    if type(value) is bool or not isinstance(value, (int, float)) \
            or not 0 < value < float("inf"):
        raise ValueError("%s must be a positive, finite number of seconds, not %r"
                         % (name, value))
    return value


def check_func(func: Any) -> None:
    """Refuse a function name that is not a str, before anything is sent (as
    :class:`gtarantool.Connection` does).

    :param func: the function's name.
    :raises TypeError: ``func`` is not a str.
    """
    if not isinstance(func, str):
        raise TypeError("func_name must be a str, not %s" % type(func).__name__)


def parse_uri(uri: Any) -> Tuple[Any, Union[int, str], Optional[str], Optional[str]]:
    """(host, port, user, password) of a vshard replica's ``uri``: ``[user[:password]@]
    host:port``, ``[ipv6]:port``, ``unix/:/path`` or ``/path`` (a unix socket: host None,
    port the path), a bare port number, or a table ``{"uri": ..., "login": ...,
    "password": ...}`` (as Tarantool 3's configuration gives it to vshard: its
    ``login``/``password`` over the uri's own).

    :param uri: the replica's ``uri``.
    :returns: (host, port, user, password); user and password None when not given.
    :raises tarantool.error.ConfigurationError: a uri that names no address.
    """
    if isinstance(uri, dict):
        if "uri" not in uri:
            raise ConfigurationError("a replica's uri table needs a uri: %r" % (uri,))
        host, port, user, password = parse_uri(uri["uri"])
        if uri.get("login") is not None:
            # vshard: the table's login replaces the uri's, password included.
            user, password = uri["login"], uri.get("password")
        elif uri.get("password") is not None:
            password = uri["password"]
        return host, port, user, password
    if isinstance(uri, int):
        return "127.0.0.1", uri, None, None
    if not isinstance(uri, str):
        raise ConfigurationError("a replica's uri must be a string, not %r" % (uri,))
    user = password = None
    creds, at, address = uri.rpartition("@")
    if at:
        user, _, password = creds.partition(":")
        password = password or None
    if address.startswith("unix/:"):
        return None, address[len("unix/:"):], user, password
    if address.startswith(("/", "./")):
        return None, address, user, password
    if address.startswith("["):
        host, bracket, rest = address[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
        if not bracket or not port.isdigit():
            raise ConfigurationError("a replica's uri must name a TCP port: %r" % (uri,))
        return host, int(port), user, password
    host, colon, port = address.rpartition(":")
    if not colon or not port.isdigit() or ":" in host:
        raise ConfigurationError("a replica's uri must name a TCP port (an IPv6 address "
                                 "in brackets): %r" % (uri,))
    return host or "127.0.0.1", int(port), user, password


class Replicaset:
    """One storage replica set: ``id`` (vshard's uuid or name), ``name`` (for
    messages), ``pool`` (its :class:`gtarantool.ConnectionPool`), ``bucket_count``
    (the buckets the router maps to it), ``order`` (instance names, the order
    reads try them in)."""

    discovery_error: Optional[Exception]
    discovery: Any   # its discovery greenlet, or None

    def __init__(self, rs_id: Any, name: str, pool: ConnectionPool,
                 order: Optional[List[str]] = None) -> None:
        self.id, self.name, self.pool = rs_id, name, pool
        self.order = list(order or pool.pool)
        self._unordered = self.order == list(pool.pool)   # the pool's own order will do
        self.bucket_count = 0
        self.discovery_error = None
        self.discovery_rounds = 0
        self.discovery = None
        self.count_checked = False   # its storages' bucket count compared with the router's
        self._turn = itertools.count()

    def __repr__(self) -> str:
        return "replicaset %s" % (self.name if self.name == self.id
                                  else "%s (%s)" % (self.name, self.id))

    # -- picks ------------------------------------------------------------------------

    def pick(self, kind: str, tried: Optional[Sequence[Any]] = None) -> Any:
        """The pool instance a read of ``kind`` (``'ro'``, ``'bro'``, ``'re'``,
        ``'bre'``) goes to, skipping ``tried``; None when no healthy one is left."""
        if kind == "ro" or kind == "re":
            want_master = kind == "ro"
            fallback = None
            for instance in self.pool.pool.values() if self._unordered else self._ordered():
                state = instance.state
                if state.status is not HEALTHY or (tried and instance in tried):
                    continue
                if (state.read_only is False) is want_master:
                    return instance
                if fallback is None:
                    fallback = instance
            return fallback
        master, replicas = None, []
        for instance in self._ordered():
            state = instance.state
            if state.status is not HEALTHY or (tried and instance in tried):
                continue
            if state.read_only:
                replicas.append(instance)
            else:
                master = instance
        if kind == "bre" and replicas:
            return replicas[next(self._turn) % len(replicas)]
        everyone = replicas + [master] if master is not None else replicas
        return everyone[next(self._turn) % len(everyone)] if everyone else None

    def _ordered(self):
        members = self.pool.pool
        return [members[name] for name in self.order if name in members]

    @staticmethod
    def is_master(instance: Any) -> bool:
        return instance.state.read_only is False

    @staticmethod
    def send(instance: Any, func: str, args: Sequence[Any]) -> Any:
        """``instance.conn.call(func, *args)``, counted in the pool's ``info()``;
        a failed connection wakes the instance's monitor."""
        instance.in_flight += 1
        instance.requests += 1
        try:
            return instance.conn.call(func, *args)
        except NetworkError:
            instance.errors += 1
            instance.wakeup.set()
            raise
        finally:
            instance.in_flight -= 1
            if instance.drained is not None and not instance.in_flight:
                instance.drained.set()

    # -- calls that name no bucket ----------------------------------------------------

    def callrw(self, func: str, args: Sequence[Any] = (), timeout: Optional[float] = None) -> Any:
        """``func(*args)`` on the master, as vshard's ``replicaset:callrw``.

        :param func: the function's name.
        :param args: its arguments (a list or tuple).
        :param timeout: seconds, a positive finite number (default: none but the pool's).
        :returns: the function's first return value.
        :raises TypeError: ``func`` is not a str, or ``args`` not a list or tuple.
        :raises ValueError: ``timeout`` is not a positive, finite number.
        :raises tarantool.error.DatabaseError: the function failed.
        :raises tarantool.error.PoolTopologyError: no master is up.
        :raises gtarantool.RequestTimeout: no reply within ``timeout``.
        :raises tarantool.error.NetworkError: the connection failed.

        Each of these errors names the replica set's id in ``replicaset``.
        """
        return self._call(RW, func, args, timeout)

    def callro(self, func: str, args: Sequence[Any] = (), timeout: Optional[float] = None) -> Any:
        """As :meth:`callrw` on the master while it is up, else a replica."""
        return self._call(PREFER_RW, func, args, timeout)

    def callbro(self, func: str, args: Sequence[Any] = (),
                timeout: Optional[float] = None) -> Any:
        """As :meth:`callrw`, balanced over every healthy member."""
        return self._call(ANY, func, args, timeout)

    def _call(self, mode, func, args, timeout):
        check_func(func)
        if not isinstance(args, (list, tuple)):
            raise TypeError("args must be a list or tuple, not %s" % type(args).__name__)
        if timeout is not None:
            seconds(timeout)
        if self.pool.is_closed():
            exc = ConnectionClosed("the router is closed")
            exc.applied = False   # nothing was sent
            exc.replicaset = self.id
            raise exc
        try:
            with gevent.Timeout(timeout, _timeout_error(self, func, timeout)):
                # One list, always the argument list (``call(func, *args)`` would
                # take a lone list or tuple inside ``args`` for the arguments).
                data = self.pool.call(func, list(args), mode=mode).data
        except DatabaseError as exc:   # (the function's, the pool's, the connection's)
            if getattr(exc, "replicaset", None) is None:
                exc.replicaset = self.id
            raise
        return data[0] if data else None

    def info(self) -> Dict[str, Any]:
        """The pool's ``info()``."""
        return self.pool.info()


def _timeout_error(rs, func, timeout):
    exc = RequestTimeout("no reply from replicaset %s to %s within %ss; it may still run"
                         % (rs.name, func, timeout))
    exc.replicaset = rs.id
    exc.applied = None
    return exc
