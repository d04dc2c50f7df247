"""The pool itself: :class:`ConnectionPool` (``tarantool.ConnectionPool``'s API)
and :class:`Instance`, one replica set member with its connection and counters.

Requests go to an instance the strategy picks for their mode; a request that
fails because the instance is gone or has the wrong role wakes its monitor; a
write refused before it changed anything (``NOT_APPLIED``) is routed again to
the instance now holding the role.  With the C extension ``gtarantool._pool``,
the six data methods run as ``_pool.Route`` objects; the Python methods here
are their specification and the path without the extension.
"""
from __future__ import annotations

import functools
import itertools
import time
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Dict, List, Optional, Union

import gevent
import gevent.event
from gevent import Timeout
from tarantool.connection_pool import InstanceState, Mode, Status
from tarantool.const import (
    POOL_INSTANCE_RECONNECT_DELAY,
    POOL_INSTANCE_RECONNECT_MAX_ATTEMPTS,
    POOL_REFRESH_DELAY,
    SOCKET_TIMEOUT,
)
from tarantool.error import (
    ConfigurationError,
    DatabaseError,
    NetworkError,
    PoolTopologyError,
)
from tarantool.mesh_connection import prepare_address
from tarantool.utils import ENCODING_DEFAULT

from gtarantool import compiled, monitoring
from gtarantool.connection import DEFAULT_CONNECTION_TIMEOUT, Connection
from gtarantool.errors import ConnectionClosed, RequestTimeout, not_sent
from gtarantool.pool.roles import monitor
from gtarantool.pool.strategies import ANY, MODES, RW, RoundRobinStrategy
from gtarantool.protocol import NO_LIMIT
from gtarantool.protocol.constants import (
    ER_LOADING,
    ER_READONLY,
    ER_SYNC_QUEUE_FOREIGN,
    ER_SYNC_QUEUE_UNCLAIMED,
    ER_UNCOMMITTED_FOREIGN_SYNC_TXNS,
)
from gtarantool.transport import CopiedCall, InheritedSocket, check_process, process_token

_pool = compiled.pool   # None: built without a C compiler, or Python < 3.10

__all__ = ["ConnectionPool", "Instance"]

HEALTHY, UNHEALTHY = Status.HEALTHY, Status.UNHEALTHY

# Errors Tarantool raises for a single-statement write before it changes
# anything (the statement is refused, or its transaction rolled back before
# the WAL): read-only, still loading, and (synchronous spaces) the queue of
# synchronous transactions owned by no instance or another one.
NOT_APPLIED = frozenset((ER_READONLY, ER_LOADING, ER_UNCOMMITTED_FOREIGN_SYNC_TXNS,
                         ER_SYNC_QUEUE_UNCLAIMED, ER_SYNC_QUEUE_FOREIGN))
WRITES = frozenset(("insert", "replace", "update", "upsert", "delete"))

# The crud methods and the mode each takes by default (tarantool-python's).
CRUD_METHODS = (
    "crud_insert", "crud_insert_object", "crud_insert_many", "crud_insert_object_many",
    "crud_get", "crud_update", "crud_delete", "crud_replace", "crud_replace_object",
    "crud_replace_many", "crud_replace_object_many", "crud_upsert", "crud_upsert_object",
    "crud_upsert_many", "crud_upsert_object_many", "crud_select", "crud_min", "crud_max",
    "crud_len", "crud_storage_info", "crud_count", "crud_stats", "crud_unflatten_rows",
    "crud_truncate",
)
# Requests that change nothing: with retry_reads, the only ones re-sent.
READS = frozenset(("select", "ping", "crud_get", "crud_select", "crud_min", "crud_max",
                   "crud_len", "crud_storage_info", "crud_count", "crud_stats"))


# -- the pool ----------------------------------------------------------------------

# The errors of any request through the pool: the end of each data method's docstring.
_REQUEST_ERRORS = """
        :raises tarantool.error.PoolTopologyError: no instance has that role
            (after waiting ``wait_timeout``).
        :raises ValueError: ``mode`` is no ``tarantool.Mode``{missing}.
        :raises gtarantool.ConnectionClosed: the pool is closed, or the
            connection closed while the request waited.
        :raises tarantool.error.DatabaseError: the instance refused the request
            (a write refused before it was applied goes to the new read-write
            instance first).
        :raises gtarantool.RequestTimeout: no reply within ``request_timeout``.
        :raises tarantool.error.NetworkError: the instance's connection failed
            (with ``retry_reads``, a read is re-sent once to another instance first).
"""


def _request_errors(method):
    """``method`` with the errors of a request through the pool at the end of its docstring."""
    if method.__doc__:   # (None under python -OO)
        missing = "" if (method.__kwdefaults__ or {}).get("mode") is not None else ", or is missing"
        method.__doc__ = (method.__doc__.rstrip() + "\n"
                          + _REQUEST_ERRORS.lstrip("\n").format(missing=missing))
    return method


def _by(end, call, args, kwargs):
    """``call(*args, **kwargs)``, a re-routed write or a call that waited for
    an instance, ended at ``end`` (the call's): a RequestTimeout then,
    ``applied`` False when it was not written yet."""
    timer = Timeout(max(0.0, end - time.monotonic()))
    timer.start()
    try:
        return call(*args, **kwargs)
    except Timeout as exc:
        if exc is not timer:
            raise
        error = RequestTimeout("the call's time ran out (its request_timeout, or wait_timeout "
                               "when it waited for an instance); it may still execute")
        if getattr(exc, "unsent", False):
            error = not_sent(error)
        raise error from None
    finally:
        timer.close()


def _routed(method):
    """``method`` as a ``gtarantool._pool.Route`` (see ``_pool.c``): the usual call
    in C, any other through ``method``.  ``inspect.signature`` and ``help`` see
    ``method`` (the Route's ``__wrapped__``)."""
    if _pool is None:
        return method
    code = method.__code__
    return _pool.Route(method.__name__, method, method.__kwdefaults__["mode"], MODES,
                       code.co_argcount - len(method.__defaults__ or ()), code.co_argcount,
                       method.__name__ in READS)


class InstanceFields:
    """What a request reads and writes on its instance: the Python twin of
    ``gtarantool._pool.InstanceCore``, whose C fields the data methods' Routes use."""

    __slots__ = ("conn", "drained", "in_flight", "requests")


class PoolFields:
    """The pool's picks by mode (``_next``): the Python twin of
    ``gtarantool._pool.PoolCore``, whose C field the Routes read."""

    __slots__ = ("_next",)


if TYPE_CHECKING:
    from gtarantool.pipeline import Pipeline
    from gtarantool.streams import Stream

if TYPE_CHECKING or _pool is None:
    _InstanceBase = InstanceFields
    _PoolBase = PoolFields
else:
    _InstanceBase = _pool.InstanceCore
    _PoolBase = _pool.PoolCore


class Instance(_InstanceBase):
    """One replica set member: its connection, role and counters (see ``info()``)."""

    __slots__ = ("name", "addr", "state", "errors", "rerouted", "last_change", "box_status",
                 "last_error",
                 "source", "wakeup", "checked", "monitor")

    def __init__(self, name, addr, conn):
        self.name, self.addr, self.conn = name, addr, conn
        self.state = InstanceState(UNHEALTHY, None)
        self.in_flight = self.requests = self.errors = 0
        self.rerouted = 0            # writes it refused unapplied, sent to another instance
        self.last_change = None      # time.time() of the last change of state
        self.box_status = None       # box.info.status as last seen
        self.last_error = None       # why the instance is unavailable
        self.source = None           # RolePoll or RoleWatch, set by the first check that connects
        self.wakeup = gevent.event.Event()    # check now (a request saw a wrong role)
        self.checked = gevent.event.Event()   # the first check is done
        self.monitor = None
        self.drained = None          # an Event while remove() waits for in-flight requests


class ConnectionPool(_PoolBase):
    """``tarantool.ConnectionPool`` for gevent: the same arguments, methods,
    ``mode=`` defaults (writes RW, ``select`` and ``crud_*`` ANY; ``call``,
    ``eval``, ``execute`` and ``ping`` need a mode) and errors
    (``tarantool.error.PoolTopologyError`` when no instance fits), plus:

    :param wait_timeout: seconds a call waits for an instance of the right role
        to appear (e.g. during a failover) before PoolTopologyError; 0 fails at once.
    :param retry_reads: re-send a read (``select``, ``ping``, ``crud`` reads)
        once to another instance when the connection failed before its reply.
        Writes, ``call``, ``eval`` and ``execute`` are never re-sent.
    :param request_timeout: per connection, as in :class:`gtarantool.Connection`.
    :param max_in_flight: per connection, as in :class:`gtarantool.Connection`
        (``None``: its default).
    :param lazy_errors: per connection, as in :class:`gtarantool.Connection`.
    :raises tarantool.error.ConfigurationError: ``addrs`` is empty or not a
        list, an address is bad or given twice, or a bad ``wait_timeout``.

    What a call gets on a timeout, a crash, a restart, a failover or a fork,
    and what is re-sent: docs/guarantees.rst.

    ``connection_timeout`` (default 10 s) bounds each monitor check: connecting,
    authenticating and learning the role.  Instances that are down at start are
    connected later, every ``refresh_delay`` until they answer.
    """

    pool: Dict[str, Instance]   # the members by name

    def __init__(self, addrs: List[Union[Dict[str, Any], str]], user: Optional[str] = None,
                 password: Optional[str] = None, socket_timeout: float = SOCKET_TIMEOUT,
                 reconnect_max_attempts: int = POOL_INSTANCE_RECONNECT_MAX_ATTEMPTS,
                 reconnect_delay: float = POOL_INSTANCE_RECONNECT_DELAY,
                 connect_now: bool = True, encoding: Optional[str] = ENCODING_DEFAULT,
                 call_16: bool = False,
                 connection_timeout: Optional[float] = DEFAULT_CONNECTION_TIMEOUT,
                 strategy_class: Any = RoundRobinStrategy,
                 refresh_delay: float = POOL_REFRESH_DELAY, fetch_schema: bool = True, *,
                 wait_timeout: float = 0, retry_reads: bool = False,
                 request_timeout: Optional[float] = None, max_in_flight: Optional[int] = None,
                 lazy_errors: bool = False) -> None:
        if not isinstance(addrs, list) or not addrs:
            raise ConfigurationError("addrs must be non-empty list")
        if not (isinstance(wait_timeout, (int, float)) and wait_timeout >= 0):
            raise ConfigurationError("wait_timeout must be a number of seconds >= 0, not %r"
                                     % (wait_timeout,))
        self._options = dict(user=user, password=password, socket_timeout=socket_timeout,
                             reconnect_max_attempts=reconnect_max_attempts,
                             reconnect_delay=reconnect_delay, encoding=encoding,
                             call_16=call_16, connection_timeout=connection_timeout,
                             fetch_schema=fetch_schema, request_timeout=request_timeout,
                             lazy_errors=lazy_errors)
        if max_in_flight is not None:
            self._options["max_in_flight"] = max_in_flight
        self.refresh_delay = refresh_delay
        self.connection_timeout = connection_timeout
        self.wait_timeout = wait_timeout
        self.retry_reads = retry_reads
        self.pool = {}
        self.rerouted_writes = 0   # writes refused unapplied and sent to another instance
        self.strategy = strategy_class(self.pool)
        self._next = ()
        self._closed = True
        self._topology_changed = gevent.event.Event()
        for addr in addrs:
            self._new_instance(addr)
        if connect_now:
            self.connect()

    # -- membership ---------------------------------------------------------------

    def _new_instance(self, addr):
        if isinstance(addr, str):
            host, colon, port = addr.rpartition(":")
            if not colon or not port.isdigit():
                raise ConfigurationError("an address must be \"host:port\" (a port number), "
                                         "not %r" % (addr,))
            addr = {"host": host or "127.0.0.1", "port": int(port)}
        addr, error = prepare_address(addr)
        if addr is None:
            raise ConfigurationError(error)
        name = (addr["socket_fd"] if addr["socket_fd"] is not None
                else "%s:%s" % (addr["host"], addr["port"]))
        if name in self.pool:
            raise ConfigurationError("%s is already in the pool" % (name,))
        extra = {key: addr[key] for key in ("transport", "auth_type") if addr.get(key)}
        conn = Connection(addr["host"], addr["port"], socket_fd=addr["socket_fd"],
                          connect_now=False, **extra, **self._options)
        instance = self.pool[name] = Instance(name, addr, conn)
        self._reroute()
        return instance

    def connect(self) -> None:
        """Start every instance's monitor and wait for each one's first check
        (at most ``connection_timeout`` each, in parallel).  Never raises for an
        instance that is down: it is connected later."""
        self._closed = False
        for instance in self.pool.values():
            self._start(instance)
        gevent.wait([instance.checked for instance in self.pool.values()])

    def _start(self, instance):
        if instance.monitor is None:
            instance.monitor = gevent.spawn(monitor, self, instance)
            instance.monitor.name = "pool-monitor-%s" % (instance.name,)

    def add(self, addr: Union[Dict[str, Any], str]) -> str:
        """Add an instance (a dict as in ``addrs``, or ``"host:port"``); returns its
        name once its first check is done (it may be unavailable: it is retried).

        :param addr: the instance's address.
        :returns: its name in the pool (``"host:port"``, as ``info()`` keys it).
        :raises tarantool.error.ConfigurationError: a bad address, or one in the pool already.
        :raises gtarantool.ConnectionClosed: the pool is closed."""
        if self._closed:
            raise ConnectionClosed("the pool is closed")
        instance = self._new_instance(addr)
        self._start(instance)
        instance.checked.wait()
        return instance.name

    def remove(self, name: str, timeout: Optional[float] = 10) -> None:
        """Stop routing requests to instance ``name``, wait up to ``timeout`` seconds
        for its requests in flight, then close its connection.

        :param name: the instance's name (as ``add()`` returns it).
        :param timeout: seconds to wait for its requests in flight (``None``: no limit).
        :raises KeyError: no instance has that name."""
        instance = self.pool.pop(name)
        self._reroute()
        self._changed()
        if instance.in_flight:
            instance.drained = gevent.event.Event()
            instance.drained.wait(timeout)
        self._stop(instance)

    def _stop(self, instance):
        if instance.monitor is not None:
            instance.monitor.kill()
            instance.monitor = None
        if instance.source is not None:
            instance.source.close()
        instance.conn.close()

    def close(self) -> None:
        """Close every connection and kill (and join) every monitor greenlet;
        callers waiting for an instance get ConnectionClosed."""
        self._closed = True
        instances = list(self.pool.values())
        # Out of the rotation first: stopping one yields, and a caller routed to
        # another meanwhile would find its connection closed and reopen it.
        for instance in instances:
            self._set_state(instance, UNHEALTHY, None, None)
        for instance in instances:
            self._stop(instance)
        self._changed()

    def is_closed(self) -> bool:
        """Whether the pool is closed (or not connected yet, with ``connect_now=False``).

        :returns: True until ``connect()``, and after ``close()``.
        """
        return self._closed

    def __enter__(self) -> ConnectionPool:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def info(self) -> Dict[str, Dict[str, Any]]:
        """Per instance name: address, role ('master', 'replica' or None when
        unavailable), status (box.info.status as last seen, or 'shutdown' once
        announced), connected, requests in flight, requests, errors, rerouted
        (writes it refused unapplied, sent elsewhere), last_change (time.time()),
        role_source, last_error.

        :returns: a dict of such dicts, by instance name."""
        result = {}
        for name, instance in self.pool.items():
            state = instance.state
            role = None
            if state.status is HEALTHY:
                role = "replica" if state.read_only else "master"
            result[name] = {
                "address": name, "role": role, "status": instance.box_status,
                "healthy": state.status is HEALTHY, "connected": not instance.conn.is_closed(),
                "in_flight": instance.in_flight, "requests": instance.requests,
                "errors": instance.errors, "rerouted": instance.rerouted,
                "last_change": instance.last_change,
                "role_source": instance.source.name if instance.source else None,
                "last_error": None if instance.last_error is None else str(instance.last_error),
            }
        return result

    # -- roles ----------------------------------------------------------------------------

    def _set_state(self, instance, status, read_only, box_status):
        instance.box_status = box_status
        if status is HEALTHY:
            instance.last_error = None
        if instance.state.status is status and instance.state.read_only == read_only:
            return
        old, instance.state = instance.state, InstanceState(status, read_only)
        monitoring.instance_state(instance.name, old, instance.state, instance.last_error)
        instance.last_change = time.time()
        if self.pool.get(instance.name) is instance:
            self._reroute()
            self._changed()

    def _changed(self):
        # Wake every caller waiting for an instance of some role (wait_timeout).
        changed, self._topology_changed = self._topology_changed, gevent.event.Event()
        changed.set()

    # -- routing ----------------------------------------------------------------------

    def _reroute(self):
        """Membership or a role changed: tell the strategy, and rebuild ``_next``,
        the iterator of picks of each mode by ``mode._value_``: with the default
        strategy, a rotation over the instances themselves (the cheapest pick
        there is), else the strategy's picks through ``_pick``.  (Iterators, so
        that the C Routes take the next pick with no Python call.)"""
        self.strategy.update()
        if type(self.strategy) is RoundRobinStrategy:
            self.strategy.build()
            any_, rw, ro = (itertools.cycle([self.pool[key] for key in keys]) if keys else None
                            for keys in (self.strategy.any, self.strategy.rw, self.strategy.ro))
            # A mode no instance fits is None: a call then waits for one in
            # _request (a Route passes it there), which bounds its send too.
            self._next = (None, any_, rw, ro, rw or ro, ro or rw)
            return
        # (_pick never returns the sentinel None: iter() makes it an endless iterator.)
        # A mode the strategy has no instance for now is None, as above: a
        # call waits in _request, which bounds its send by the call's end.
        self._next = tuple(iter(functools.partial(self._pick, mode), None)
                           if self._fits(mode) else None for mode in (ANY,) + MODES)

    def _fits(self, mode):
        """Whether the strategy has an instance for ``mode`` now."""
        try:
            self.strategy.getnext(mode)
        except PoolTopologyError:
            return False
        return True

    def _route(self, mode):
        try:
            picks = self._next[mode._value_]
        except AttributeError:
            raise ValueError("Unexpected mode %r" % (mode,)) from None
        if picks is None:   # none fits now
            return self._wait_for(mode)
        return next(picks)

    def _pick(self, mode):
        """The strategy's pick (or, when no instance fits, a wait of ``wait_timeout``)."""
        try:
            return self.pool[self.strategy.getnext(mode)]
        except PoolTopologyError:
            return self._wait_for(mode)

    def _wait_for(self, mode, deadline=None):
        """An instance for ``mode``, waited for until ``deadline``
        (``time.monotonic()``; None: ``wait_timeout`` from now).

        :raises tarantool.error.PoolTopologyError: none by then.
        :raises gtarantool.ConnectionClosed: the pool is closed, or the process
            forked while the caller waited and this is the child (a copy of the
            parent's caller, whose call goes on there).  Nothing was sent."""
        if deadline is None:
            deadline = time.monotonic() + self.wait_timeout
        token = process_token()
        while True:
            if self._closed:
                raise not_sent(ConnectionClosed("the pool is closed"))
            changed = self._topology_changed
            try:
                return self.pool[self.strategy.getnext(mode)]
            except PoolTopologyError as exc:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    exc.applied = False
                    raise
                changed.wait(remaining)
                check_process(token)

    def _failed(self, instance, exc, mode, may_resend, method=None, deadline=None, end=None):
        """A request on ``instance`` raised ``exc`` (being handled): learn from it,
        then re-raise it, or return another instance to re-send a read to, or
        ``(instance, deadline, end)`` for a write refused unapplied (re-routes
        end at ``deadline``: ``wait_timeout`` after the first; the call at
        ``end``, its ``request_timeout``'s, or None).  ``method``: the
        request's, when it is no data method's Route (which passes None)."""
        instance.errors += 1
        if not isinstance(exc, NetworkError):   # (a DatabaseError subclass)
            code = getattr(exc, "code", None) if isinstance(exc, DatabaseError) else None
            if code in NOT_APPLIED:
                if instance.state.read_only is False:
                    # No more writes here until the monitor says otherwise.
                    self._set_state(instance, HEALTHY, True, instance.box_status)
                instance.wakeup.set()
            if code in NOT_APPLIED and not may_resend and (method is None or method in WRITES):
                return self._reroute_write(instance, exc, deadline, end)
            raise exc
        if isinstance(exc, (RequestTimeout, CopiedCall, InheritedSocket)):
            raise exc   # (the last two: a copy of the parent's caller, in a forked child)
        if instance.conn.is_closed() and self.pool.get(instance.name) is instance:
            instance.last_error = exc
            self._set_state(instance, UNHEALTHY, None, None)
            instance.wakeup.set()
        if not (may_resend and self.retry_reads and mode is not RW):
            raise exc
        try:
            other = self.pool[self.strategy.getnext(mode)]
        except PoolTopologyError:
            raise exc from None
        if other is instance:
            raise exc
        if end is None:
            end = getattr(exc, "call_deadline", None)
        if end is not None:   # the re-sent read ends by the call's deadline
            return other, deadline, end
        return other

    def _reroute_write(self, instance, exc, deadline, end=None):
        """``(instance, deadline, end)`` for a write ``instance`` refused with
        ``exc`` before applying it: the read-write one now, whatever the
        call's ``mode`` (another replica would refuse it too, and the write
        would go from one to the next for as long as the call lasts), waited
        for until ``deadline`` (None: ``wait_timeout`` from now, the first
        re-route), no later than the call's ``end`` (its ``request_timeout``,
        which the connection's refusal carries as ``call_deadline``); else
        ``exc`` is raised."""
        if deadline is None:
            deadline = time.monotonic() + self.wait_timeout
        ends = [t for t in (end, getattr(exc, "call_deadline", None)) if t is not None]
        end = min(ends) if ends else None
        if end is not None:
            deadline = min(deadline, end)
        try:
            other = self._wait_for(RW, deadline)
        except PoolTopologyError:
            raise exc from None
        if other is instance:
            raise exc
        instance.rerouted += 1
        self.rerouted_writes += 1
        monitoring.emit(monitoring.WriteReroutedEvent, instance.name, to=other.name,
                        code=getattr(exc, "code", None))
        return other, deadline, end

    @staticmethod
    def _drained(instance):
        if not instance.in_flight:
            instance.drained.set()

    def _send(self, target, mode, method, args, kwargs, may_resend):
        """Send on ``target`` (an instance, or ``(instance, deadline)`` from
        ``_failed``), and again where ``_failed`` says, in a loop: re-routes
        of a write end at their deadline, the re-sent write by its call's end."""
        deadline = end = None
        while True:
            if type(target) is tuple:
                target, deadline, end = target
            instance = target
            instance.in_flight += 1
            instance.requests += 1
            try:
                if end is None:
                    return getattr(instance.conn, method)(*args, **kwargs)
                return _by(end, getattr(instance.conn, method), args, kwargs)
            except Exception as exc:
                target = self._failed(instance, exc, mode, may_resend, method, deadline, end)
            finally:
                instance.in_flight -= 1
                if instance.drained is not None:
                    self._drained(instance)
            may_resend = False

    def _request(self, mode, method, *args, **kwargs):
        try:
            picks = self._next[mode._value_]
        except AttributeError:
            raise ValueError("Unexpected mode %r" % (mode,)) from None
        if picks is not None:
            return self._send(next(picks), mode, method, args, kwargs, method in READS)
        # No instance fits now: wait up to wait_timeout for one; the call then
        # ends by the larger of wait_timeout and request_timeout from its start.
        start = time.monotonic()
        instance = self._wait_for(mode, start + self.wait_timeout)
        timeout = instance.conn.request_timeout
        end = None if timeout is None else start + max(self.wait_timeout, timeout)
        return self._send((instance, None, end), mode, method, args, kwargs, method in READS)

    # The data methods.  With the C extension, gtarantool._pool.Route does what
    # each does for the usual call (positional arguments, at most mode=) and
    # passes any other call to it: these are its specification, and the path
    # without the extension.  A ``mode`` that is no tarantool.Mode fails in
    # _route with ValueError.

    @_routed
    @_request_errors
    def select(self, space_name: Union[str, int], key: Any = None, *, offset: int = 0,
               limit: int = NO_LIMIT, index: Union[str, int] = 0,
               iterator: Union[str, int, None] = None, mode: Mode = ANY,
               on_push: Optional[Callable[[Any, Any], Any]] = None, on_push_ctx: Any = None) -> Any:
        """``Connection.select`` on an instance picked by ``mode`` (default ANY).

        :param space_name: the space's name or id.
        :param key: a scalar, or a list or tuple of the index's parts; ``None``: all.
        :param offset: how many matching tuples to skip.
        :param limit: the most tuples to return (default: no limit).
        :param index: the index's name or id (default: the primary index).
        :param iterator: a name (``"GE"``) or number; default ``EQ`` (``ALL`` with no key).
        :param mode: the role of the instance to send it to (default ``Mode.ANY``).
        :param on_push: ``on_push(message, on_push_ctx)`` for each out-of-band message.
        :param on_push_ctx: the second argument of ``on_push``.
        :returns: the instance's reply, as the connection's method returns it.
        """
        return self._request(mode, "select", space_name, key, offset=offset, limit=limit,
                             index=index, iterator=iterator, on_push=on_push,
                             on_push_ctx=on_push_ctx)

    @_routed
    @_request_errors
    def insert(self, space_name: Union[str, int], values: Union[tuple, list], *, mode: Mode = RW,
               on_push: Optional[Callable[[Any, Any], Any]] = None, on_push_ctx: Any = None) -> Any:
        """``Connection.insert`` (default mode RW).

        :param space_name: the space's name or id.
        :param values: the tuple, a tuple or list.
        :param mode: the role of the instance to send it to (default ``Mode.RW``).
        :param on_push: ``on_push(message, on_push_ctx)`` for each out-of-band message.
        :param on_push_ctx: the second argument of ``on_push``.
        :returns: the instance's reply, as the connection's method returns it.
        """
        return self._request(mode, "insert", space_name, values, on_push=on_push,
                             on_push_ctx=on_push_ctx)

    @_routed
    @_request_errors
    def replace(self, space_name: Union[str, int], values: Union[tuple, list], *, mode: Mode = RW,
                on_push: Optional[Callable[[Any, Any], Any]] = None,
                on_push_ctx: Any = None) -> Any:
        """``Connection.replace`` (default mode RW).

        :param space_name: the space's name or id.
        :param values: the tuple, a tuple or list.
        :param mode: the role of the instance to send it to (default ``Mode.RW``).
        :param on_push: ``on_push(message, on_push_ctx)`` for each out-of-band message.
        :param on_push_ctx: the second argument of ``on_push``.
        :returns: the instance's reply, as the connection's method returns it.
        """
        return self._request(mode, "replace", space_name, values, on_push=on_push,
                             on_push_ctx=on_push_ctx)

    @_routed
    @_request_errors
    def update(self, space_name: Union[str, int], key: Any, op_list: Union[tuple, list], *,
               index: Union[str, int] = 0, mode: Mode = RW,
               on_push: Optional[Callable[[Any, Any], Any]] = None,
               on_push_ctx: Any = None) -> Any:
        """``Connection.update`` (default mode RW).

        :param space_name: the space's name or id.
        :param key: a scalar, or a list or tuple of the index's parts.
        :param op_list: the update operations, as ``Connection.update`` takes them.
        :param index: the index's name or id (default: the primary index).
        :param mode: the role of the instance to send it to (default ``Mode.RW``).
        :param on_push: ``on_push(message, on_push_ctx)`` for each out-of-band message.
        :param on_push_ctx: the second argument of ``on_push``.
        :returns: the instance's reply, as the connection's method returns it.
        """
        return self._request(mode, "update", space_name, key, op_list, index=index,
                             on_push=on_push, on_push_ctx=on_push_ctx)

    @_routed
    @_request_errors
    def upsert(self, space_name: Union[str, int], tuple_value: Union[tuple, list],
               op_list: Union[tuple, list], *,
               index: Union[str, int] = 0, mode: Mode = RW,
               on_push: Optional[Callable[[Any, Any], Any]] = None,
               on_push_ctx: Any = None) -> Any:
        """``Connection.upsert`` (default mode RW).

        :param space_name: the space's name or id.
        :param tuple_value: the tuple to insert, a tuple or list.
        :param op_list: the update operations, as ``Connection.upsert`` takes them.
        :param index: the index's name or id (default: the primary index).
        :param mode: the role of the instance to send it to (default ``Mode.RW``).
        :param on_push: ``on_push(message, on_push_ctx)`` for each out-of-band message.
        :param on_push_ctx: the second argument of ``on_push``.
        :returns: the instance's reply, as the connection's method returns it.
        """
        return self._request(mode, "upsert", space_name, tuple_value, op_list, index=index,
                             on_push=on_push, on_push_ctx=on_push_ctx)

    @_routed
    @_request_errors
    def delete(self, space_name: Union[str, int], key: Any, *, index: Union[str, int] = 0,
               mode: Mode = RW, on_push: Optional[Callable[[Any, Any], Any]] = None,
               on_push_ctx: Any = None) -> Any:
        """``Connection.delete`` (default mode RW).

        :param space_name: the space's name or id.
        :param key: a scalar, or a list or tuple of the index's parts.
        :param index: the index's name or id (default: the primary index).
        :param mode: the role of the instance to send it to (default ``Mode.RW``).
        :param on_push: ``on_push(message, on_push_ctx)`` for each out-of-band message.
        :param on_push_ctx: the second argument of ``on_push``.
        :returns: the instance's reply, as the connection's method returns it.
        """
        return self._request(mode, "delete", space_name, key, index=index, on_push=on_push,
                             on_push_ctx=on_push_ctx)

    @_request_errors
    def call(self, func_name: str, *args: Any, mode: Optional[Mode] = None,
             on_push: Optional[Callable[[Any, Any], Any]] = None, on_push_ctx: Any = None) -> Any:
        """``Connection.call``; ``mode`` is required.

        :param func_name: the function's name.
        :param args: its arguments (a single list or tuple is the argument list).
        :param mode: the role of the instance to send it to (required).
        :param on_push: ``on_push(message, on_push_ctx)`` for each out-of-band message.
        :param on_push_ctx: the second argument of ``on_push``.
        :returns: the instance's reply, as the connection's method returns it.
        """
        if mode is None:
            raise ValueError("Please, specify 'mode' keyword argument")
        return self._request(mode, "call", func_name, *args, on_push=on_push,
                             on_push_ctx=on_push_ctx)

    @_request_errors
    def eval(self, expr: str, *args: Any, mode: Optional[Mode] = None,
             on_push: Optional[Callable[[Any, Any], Any]] = None, on_push_ctx: Any = None) -> Any:
        """``Connection.eval``; ``mode`` is required.

        :param expr: the Lua code.
        :param args: its arguments (a single list or tuple is the argument list).
        :param mode: the role of the instance to send it to (required).
        :param on_push: ``on_push(message, on_push_ctx)`` for each out-of-band message.
        :param on_push_ctx: the second argument of ``on_push``.
        :returns: the instance's reply, as the connection's method returns it.
        """
        if mode is None:
            raise ValueError("Please, specify 'mode' keyword argument")
        return self._request(mode, "eval", expr, *args, on_push=on_push,
                             on_push_ctx=on_push_ctx)

    @_request_errors
    def ping(self, notime: bool = False, *, mode: Optional[Mode] = None) -> Union[float, str]:
        """``Connection.ping``; ``mode`` is required.

        :param notime: return ``"Success"`` rather than the round trip's time.
        :param mode: the role of the instance to send it to (required).
        :returns: the seconds the round trip took, or ``"Success"``.
        """
        if mode is None:
            raise ValueError("Please, specify 'mode' keyword argument")
        return self._request(mode, "ping", notime)

    @_request_errors
    def execute(self, query: str, params: Any = None, *,
                mode: Optional[Mode] = None) -> Any:
        """``Connection.execute`` (SQL); ``mode`` is required.

        :param query: the SQL text.
        :param params: a sequence (``?``) or a mapping (``:name``) of values.
        :param mode: the role of the instance to send it to (required).
        :returns: the instance's reply (``tarantool.response.ResponseExecute``).
        """
        if mode is None:
            raise ValueError("Please, specify 'mode' keyword argument")
        return self._request(mode, "execute", query, params)

    def pipeline(self, mode: Mode = RW) -> Pipeline:
        """A :class:`gtarantool.Pipeline` on one instance picked by ``mode`` (default
        RW).  Its requests bypass the pool: no retry, no per-instance counts.

        :param mode: the role of the instance.
        :returns: the new, empty :class:`~gtarantool.pipeline.Pipeline`.
        :raises tarantool.error.PoolTopologyError: no instance has that role
            (after waiting ``wait_timeout``).
        :raises ValueError: ``mode`` is no ``tarantool.Mode``.
        :raises gtarantool.ConnectionClosed: the pool is closed.
        """
        return self._route(mode).conn.pipeline()

    def transaction(self, isolation: Union[str, int, None] = None,
                    timeout: Optional[float] = None) -> ContextManager[Stream]:
        """``with pool.transaction() as tx:`` an interactive transaction on the
        read-write instance (see ``Connection.transaction``; Tarantool 2.10+ with
        ``memtx_use_mvcc_engine`` or vinyl).  A failover during it fails it.

        :param isolation: the isolation level's name or number (``None``: the server's default).
        :param timeout: seconds after which the server rolls the transaction back.
        :returns: a context manager that yields the transaction's
            :class:`gtarantool.streams.Stream`.
        :raises tarantool.error.PoolTopologyError: no read-write instance
            (after waiting ``wait_timeout``).
        :raises gtarantool.FeatureNotSupported: the server has no transactions (2.10+).
        :raises gtarantool.RequestTimeout: the transaction did not begin in time:
            within ``request_timeout``, or, when it waited for a read-write
            instance, by the larger of ``wait_timeout`` and ``request_timeout``
            from the call, as any call that waited.
        """
        picks: Any = self._next[RW._value_]
        if picks is not None:
            return next(picks).conn.transaction(isolation, timeout)
        start = time.monotonic()
        conn = self._wait_for(RW, start + self.wait_timeout).conn
        block = conn.transaction(isolation, timeout)
        if conn.request_timeout is None:
            return block
        return _BegunBy(start + max(self.wait_timeout, conn.request_timeout), block)


class _BegunBy:
    """A transaction block (``Connection.transaction``'s) whose begin ends at
    ``end`` (see ``_by``); the rest of the block is its own."""

    def __init__(self, end, block):
        self._end = end
        self._block = block

    def __enter__(self):
        return _by(self._end, self._block.__enter__, (), {})

    def __exit__(self, *exc):
        return self._block.__exit__(*exc)


def _crud_method(name):
    def method(self: ConnectionPool, *args: Any, mode: Mode = ANY, **kwargs: Any) -> Any:
        return self._request(mode, name, *args, **kwargs)
    method.__name__ = name
    method.__doc__ = "``Connection.%s`` (default mode ANY, as tarantool-python)." % name
    return method


for _name in CRUD_METHODS:
    setattr(ConnectionPool, _name, _crud_method(_name))
del _name

if _pool is not None:
    # The rare paths of the data methods' Routes (see _pool.c's POOL_HOOKS).
    _pool.set_hooks(failed=ConnectionPool._failed, drained=ConnectionPool._drained,
                    send=ConnectionPool._send)
