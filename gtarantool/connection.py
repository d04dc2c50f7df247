"""The public connection: tarantool-python's API over the greenlet transport.

``Connection`` subclasses ``tarantool.Connection`` and keeps its schema,
auth, errors and response types.  It replaces the transport (one shared
socket, see ``transport.py``), the request/response hot path (``protocol.py``)
and the connection lifecycle: lazy reconnect under a lock with gevent sleeps,
schema reload on error 109, and ownership: another OS thread gets
``WrongOwner``; a forked child process (os.fork, multiprocessing, a fork made
from C) opens its own socket on first use, never touching the parent's.
"""
from __future__ import annotations

import _socket
import itertools
import os
import socket
import sys
import time
import weakref
from typing import Any, Callable, ContextManager, Optional, Tuple, Union

import gevent
import gevent.lock
import gevent.socket
import tarantool
from gevent import Timeout, getcurrent
from gevent.monkey import get_original
from tarantool.const import SSL_TRANSPORT
from tarantool.error import (
    ConfigurationError,
    DatabaseError,
    NetworkError,
    NotSupportedError,
    SchemaReloadException,
)
from tarantool.schema import Schema
from tarantool.utils import greeting_decode

from gtarantool import graceful, monitoring, streams, watchers
from gtarantool.api import RequestMethods
from gtarantool.errors import (
    ConnectionClosed,
    ProtocolError,
    RequestTimeout,
    WrongOwner,
    not_sent,
    refused,
)
from gtarantool.pipeline import Pipeline
from gtarantool.protocol.codec import BodyDecoder, Encoder
from gtarantool.protocol.constants import IPROTO_GREETING_SIZE, REQUEST_TYPE_PING
from gtarantool.protocol.frames import request_header
from gtarantool.protocol.responses import RESPONSE_CLASSES, Response, make_response
from gtarantool.resolved import Resolutions
from gtarantool.sql import PreparedStatement, check_query
from gtarantool.transport import (
    Draining,
    InheritedSocket,
    Stats,
    Transport,
    check_process,
    process_token,
)

_get_ident = get_original("_thread", "get_ident")

DEFAULT_MAX_IN_FLIGHT = 10000
DEFAULT_MAX_RESPONSE_SIZE = (1 << 31) - 1
DEFAULT_CONNECTION_TIMEOUT = 10.0
# A request that keeps meeting schema changes gives up after this many reloads.
SCHEMA_RETRIES = 3

_live: "weakref.WeakSet[Connection]" = weakref.WeakSet()
_hub_reinit = None   # the process_token() of the process whose hub _adopt reinitialised

# A connection's attributes, gtarantool's and then tarantool.Connection's (1.x).
# They live in slots: in a __dict__ with more than 30 keys, Python 3.11 cannot
# specialise a method call on the object, so every ``conn.insert(...)`` (and
# every ``self._request(...)``) would take the generic method lookup.  An
# attribute missing here still works, in the __dict__.
_ATTRIBUTES = (
    "request_timeout", "max_in_flight", "max_response_size", "lazy_errors", "stats",
    "_transport", "_syncs", "_lock", "_schema_lock", "_owner", "_pid", "_process", "_packer",
    "_encoder", "_resolutions", "_lookups",
    "_decoder", "_spaces",
    "_indexes", "_connected_once", "_finalizer", "_connect_failures", "_connect_error",
    "host", "port", "user", "password", "socket_fd", "socket_timeout", "reconnect_max_attempts",
    "reconnect_delay", "connected", "error", "encoding", "use_list", "call_16",
    "connection_timeout", "transport", "ssl_key_file", "ssl_cert_file", "ssl_ca_file",
    "ssl_ciphers", "ssl_password", "ssl_password_file", "fetch_schema", "schema",
    "schema_version", "uuid", "version_id", "required_protocol_version", "required_features",
    "_socket", "_salt", "_sys_recv", "_packer_factory_impl", "_unpacker_factory_impl",
    "_protocol_version", "_features", "_client_protocol_version", "_client_features",
    "_server_protocol_version", "_server_features", "_client_auth_type", "_server_auth_type",
    "_watchers", "_stream_ids", "_graceful", "_handshaking", "_closes",
)


class Connection(RequestMethods, tarantool.Connection):
    """A gevent-aware ``tarantool.Connection`` shared by many greenlets.

    Takes every argument of ``tarantool.Connection`` plus:

    :param host: the server's address; ``None`` for a Unix socket.
    :param port: its port, or the Unix socket's path.
    :param request_timeout: seconds a call may take, end to end: waiting for
        an in-flight slot or a reconnect, the request and any re-send; ``None``
        waits for the reply forever.  On expiry the caller gets
        :class:`gtarantool.RequestTimeout` and the late reply is discarded
        (docs/guarantees.rst).  Without it, tarantool-python's ``socket_timeout``
        (a bound on each receive there) is taken for it.
    :param max_in_flight: most requests awaiting replies at once; further
        callers wait for a slot.
    :param max_response_size: largest reply frame accepted, in bytes.
    :param lazy_errors: error replies raise :class:`gtarantool.LazyDatabaseError`,
        a ``DatabaseError`` whose message and ``extra_info`` are decoded when
        first read: for callers that tell errors apart by ``code`` (since 2.10
        a duplicate key's message quotes both tuples, escaped byte by byte).
    :param connection_timeout: seconds for a connect attempt: connecting, the
        greeting, authentication and the schema; 10 s by default rather than
        forever, so connecting to a frozen server fails instead of hanging.
    :raises tarantool.error.ConfigurationError: a bad ``request_timeout``,
        ``socket_timeout``, ``connection_timeout``, ``max_in_flight`` or
        ``max_response_size``.
    :raises tarantool.error.NotSupportedError: ``transport='ssl'``.
    :raises tarantool.error.NetworkError: connecting failed (unless
        ``connect_now=False``).
    """

    # (A name tarantool.Connection's class defines must stay its own.)
    __slots__ = tuple(name for name in _ATTRIBUTES
                      if not any(name in vars(base) for base in tarantool.Connection.__mro__))

    # For the type checker (declarations only: the values live in the slots).
    _transport: Optional[Transport]
    _finalizer: Optional[weakref.finalize]
    _handshaking: Optional[Tuple[Any, Transport]]
    _watchers: Optional[watchers.Watchers]

    def __init__(self, host: Optional[str] = tarantool.connection.DEFAULT_HOST,
                 port: Union[int, str] = tarantool.connection.DEFAULT_PORT, *args: Any,
                 request_timeout: Optional[float] = None,
                 max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
                 max_response_size: int = DEFAULT_MAX_RESPONSE_SIZE,
                 connection_timeout: Optional[float] = DEFAULT_CONNECTION_TIMEOUT,
                 lazy_errors: bool = False, **kwargs: Any) -> None:
        socket_timeout = kwargs.get("socket_timeout")
        if socket_timeout is not None and not (
                isinstance(socket_timeout, (int, float)) and socket_timeout > 0):
            raise ConfigurationError("socket_timeout must be a positive number of "
                                     "seconds or None, not %r" % (socket_timeout,))
        if request_timeout is None:
            # tarantool-python's bound on each receive: one socket serves many
            # callers here, so it bounds each request's wait for its reply.
            request_timeout = socket_timeout
        if request_timeout is not None and not (
                isinstance(request_timeout, (int, float)) and request_timeout > 0):
            raise ConfigurationError("request_timeout must be a positive number of "
                                     "seconds or None, not %r" % (request_timeout,))
        if connection_timeout is not None and not (
                isinstance(connection_timeout, (int, float)) and connection_timeout > 0):
            raise ConfigurationError("connection_timeout must be a positive number of "
                                     "seconds or None, not %r" % (connection_timeout,))
        for name, value in (("max_in_flight", max_in_flight),
                            ("max_response_size", max_response_size)):
            if not isinstance(value, int) or not 1 <= value <= sys.maxsize:
                raise ConfigurationError("%s must be a positive integer up to %d, not %r"
                                         % (name, sys.maxsize, value))
        if kwargs.get("transport") == SSL_TRANSPORT:
            raise NotSupportedError("gtarantool does not support transport='ssl'")
        # Our fields first: tarantool.Connection.__init__ may connect.
        self.request_timeout = request_timeout
        self._resolutions = Resolutions()   # names the requests were encoded from
        # greenlet -> (frame, deadline): see _lookup_deadline
        self._lookups: "dict[Any, Tuple[Any, Optional[float]]]" = {}
        self.max_in_flight = max_in_flight
        self.max_response_size = max_response_size
        self.lazy_errors = bool(lazy_errors)
        self.stats = Stats()
        self._transport = None
        # Syncs >= 2**32 make the server's reply headers one fixed layout.
        self._syncs = itertools.count(1 << 32)
        self._lock = gevent.lock.RLock()         # connect/reconnect
        self._schema_lock = gevent.lock.RLock()  # reload on error 109
        self._owner = _get_ident()
        self._pid = os.getpid()
        self._process = process_token()          # see _check_owner
        self._packer = None
        self._encoder = None
        self._decoder = None                     # reply bodies, set on connect
        self._spaces = {}                       # see api.RequestMethods
        self._indexes = {}
        self._connected_once = False
        self._finalizer = None                   # stops the transport if we are dropped
        self._connect_failures = 0               # reconnect cycles that gave up
        self._connect_error = None
        self._watchers = None                    # watchers.Watchers, made by the first watch()
        self._stream_ids = itertools.count(1)
        self._graceful = graceful.State(self)   # announced shutdowns, see graceful.py
        # (greenlet, transport) while connect() authenticates
        self._handshaking = None
        self._closes = 0   # close() calls: a connect they overtook gives its socket up
        _live.add(self)
        super().__init__(host, port, *args, connection_timeout=connection_timeout, **kwargs)

    # -- sockets: gevent's, whether or not the process is monkey-patched ----

    def connect_tcp(self):
        try:
            sock = _connect_tcp(self.host, self.port, self.connection_timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:
            raise NetworkError(exc) from exc
        self._socket = sock

    def connect_unix(self):
        sock = gevent.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.connection_timeout)
            sock.connect(self.port)
        except OSError as exc:
            sock.close()
            raise NetworkError(exc) from exc
        self._socket = sock

    def connect_socket_fd(self):
        self._socket = gevent.socket.socket(fileno=self.socket_fd)
        self._socket.settimeout(self.connection_timeout)

    # -- lifecycle -----------------------------------------------------------

    def connect(self) -> None:
        """(Re)connect: greeting, authentication, schema.  Fails every request
        still waiting on the previous socket (``ConnectionClosed``).  Requests
        call it themselves when the connection is down.

        :raises tarantool.error.NetworkError: the server cannot be reached, or
            the greeting, authentication, a required feature or the schema's
            loading failed (the cause chained).
        :raises gtarantool.WrongOwner: called from another OS thread.
        """
        self._check_owner()
        token = process_token()
        with self._lock:
            check_process(token)
            self._drop_transport(ConnectionClosed("connection re-established; "
                                                  "requests on the old socket failed"))
            closes = self._closes
            timer = None
            try:
                started = time.monotonic()
                self._decoder = BodyDecoder.for_connection(self)
                self.connect_basic()
                check_process(token)
                greeting = self._read_greeting(token)
                # The rest of the attempt (authentication, the schema) within
                # what connection_timeout leaves of it, as a pool's check: a
                # server that greets and never answers held it for good.
                timer = Timeout._start_new_or_dummy(
                    None if self.connection_timeout is None
                    else max(0.0, started + self.connection_timeout - time.monotonic()))
                monitoring.emit(monitoring.ConnectionOpenedEvent, monitoring.address_of(self))
                self._socket.settimeout(None)
                transport = Transport(self._socket, self.stats, self.max_in_flight,
                                      self.max_response_size, name="tarantool-%s" % (self.port,),
                                      decoder=self._decoder)
                # A connection dropped without close() must not leave its reader
                # and writer greenlets (and socket) behind.
                self._finalizer = weakref.finalize(self, _abandoned, transport, self._owner)
                self.connected = True
                # Only this greenlet's requests (IPROTO_ID, AUTH) use the socket
                # before it is authenticated: another caller's would run as guest.
                self._handshaking = (getcurrent(), transport)
                try:
                    self._handshake(greeting)
                finally:
                    self._handshaking = None
                    self._transport = transport
                if self.user:
                    monitoring.emit(monitoring.ConnectionAuthenticatedEvent,
                                    monitoring.address_of(self), user=self.user)
                # (Before the schema's round trips: the first event and its
                # acknowledgement are through when connect() returns.)
                self._graceful.connected(self, self._connected_once)
                self._spaces.clear()
                self._indexes.clear()
                if self.fetch_schema:
                    self.schema = Schema(self)
                    self._load_schema_versioned()
                else:
                    self.schema = None
                if self._closes != closes:
                    # close() came meanwhile: it must leave no socket up.
                    raise ConnectionClosed("connection closed by close() while connecting")
            except BaseException as exc:
                # As tarantool-python: whatever fails while connecting (auth, a
                # required_protocol_version the server lacks...) is a NetworkError
                # with the cause chained.  A timeout or kill leaves no half-made
                # socket (one not authenticated yet) behind either.
                timed_out = timer is not None and exc is timer
                if timer is not None:
                    # (the caller's own timer may have ended the attempt: this
                    # one must not fire into the clean-up below and escape raw)
                    timer.close()
                if timed_out:
                    exc = NetworkError("no answer from %s:%s to its authentication or schema "
                                       "within connection_timeout=%ss"
                                       % (self.host, self.port, self.connection_timeout))
                self._drop_transport(ConnectionClosed("connect failed: %r" % (exc,)))
                monitoring.emit(monitoring.ConnectionFailedEvent, monitoring.address_of(self),
                                error=_describe(exc))
                if timed_out:
                    raise exc from None
                if isinstance(exc, NetworkError) or not isinstance(exc, Exception):
                    raise
                raise NetworkError("cannot connect to %s:%s: %s"
                                   % (self.host, self.port, _describe(exc))) from exc
            finally:
                if timer is not None:
                    timer.close()
            if self._connected_once:
                self.stats.reconnects += 1
            self._connected_once = True
            if self._watchers is not None:
                self._watchers.attach(self._transport)

    def _read_greeting(self, token):
        data = b""
        sock = self._socket
        try:
            while len(data) < IPROTO_GREETING_SIZE:
                # Waited for, then the process checked, then read: a copy of
                # this greenlet in a forked child must not take the parent's greeting.
                gevent.socket.wait_read(sock.fileno(), sock.gettimeout(), socket.timeout())
                check_process(token)
                chunk = sock.recv(IPROTO_GREETING_SIZE - len(data))
                if not chunk:
                    raise NetworkError("the server closed the connection before its greeting")
                data += chunk
        except socket.timeout as exc:
            raise NetworkError("no greeting from %s:%s within connection_timeout=%ss"
                               % (self.host, self.port, self.connection_timeout)) from exc
        except OSError as exc:
            raise NetworkError(exc) from exc
        if not data.startswith(b"Tarantool "):
            raise ProtocolError("not a Tarantool server: greeting starts with %r" % data[:32])
        try:
            greeting = greeting_decode(data)
        except Exception as exc:
            raise ProtocolError("undecodable Tarantool greeting %r" % data[:64]) from exc
        if greeting.protocol != "Binary":
            raise ProtocolError("unsupported protocol %r" % (greeting.protocol,))
        return greeting

    def _handshake(self, greeting):
        self.version_id = greeting.version_id
        self.uuid = greeting.uuid
        self._salt = greeting.salt
        self._check_features()
        if self.user:
            self.authenticate(self.user, self.password)

    def _load_schema_versioned(self):
        # Load with version checks off, then send the version seen before the
        # load: a change during the load makes the next request reload again.
        self.schema_version = 0
        version = self._request(REQUEST_TYPE_PING, b"").schema_version or 0
        self.load_schema()
        self.schema_version = version

    def _drop_transport(self, exc):
        transport, self._transport = self._transport, None
        self._socket = None
        self.connected = False
        if transport is not None:
            if self._finalizer is not None:
                self._finalizer.detach()
            transport.close(exc)
            monitoring.emit(monitoring.ConnectionClosedEvent, monitoring.address_of(self),
                            reason=str(transport.error or exc))

    def close(self) -> None:
        """Close the socket: waiting requests fail with ConnectionClosed; the reader
        and writer greenlets are killed and joined; watchers are unregistered.
        A later request reconnects.  In a forked child: forgets the parent's
        socket, never touching the parent's stream.

        :raises gtarantool.WrongOwner: called from another OS thread.
        """
        self._check_owner()
        self._closes += 1
        watchers, self._watchers = self._watchers, None
        if watchers is not None:
            watchers.close()
        self._drop_transport(ConnectionClosed("connection closed by close()"))

    def is_closed(self) -> bool:
        """Whether the connection has no live socket: never connected, closed,
        or its socket failed (the next request reconnects).

        :returns: True when no socket is up.
        """
        return self._transport is None or self._transport.error is not None

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _check_owner(self):
        """WrongOwner in another OS thread; in a process forked since, ``_adopt``."""
        if self._process != process_token():
            self._adopt()
        elif self._owner != _get_ident():
            raise WrongOwner("this connection belongs to another OS thread (its gevent hub); "
                             "open one connection per thread")

    def _adopt(self):
        """In a forked child: this process's connection from now on.  The parent's
        socket is given up unread and unwritten (requests the parent had in
        flight fail here, they go on there); the next request connects."""
        global _hub_reinit
        self._owner = _get_ident()
        self._pid = os.getpid()
        self._process = process_token()
        if _hub_reinit != self._process:
            # Neither os.fork (unpatched), multiprocessing nor a fork from C
            # reinitialises gevent's hub: the resolver's threads are gone, and
            # a connect would wait for them forever.  (Idempotent: gevent.fork's
            # own call, if any, is not undone.)
            gevent.reinit()
            _hub_reinit = self._process
        # A greenlet copied from the parent may hold them and wait here for
        # good (for the parent's resolver thread, say): this process's callers
        # take new ones.  (The copy, if it wakes, releases the one it took:
        # each holder keeps a reference to its own lock.)
        self._lock = gevent.lock.RLock()
        self._schema_lock = gevent.lock.RLock()
        transport, self._transport = self._transport, None
        self._socket = None
        self.connected = False
        if transport is not None:
            if self._finalizer is not None:
                self._finalizer.detach()
            transport._inherited()

    def _ensure_connected(self, deadline=None):
        """The live transport, reconnecting first when the last one died.

        ``deadline``: the call's end (``time.monotonic()``), None without a
        ``request_timeout``.  Everything here is bounded by it: the wait for
        the lock (callers queued behind a reconnect), each attempt and the
        pauses between them; without one, a caller waits for the reconnect in
        progress, and after an announced shutdown for ``graceful.patience``
        from its own arrival, so queued callers never wait one after another.
        Each error raised here is one of a request never written."""
        self._check_owner()
        transport = self._transport
        if transport is not None and transport.error is None:
            return transport
        handshaking = self._handshaking
        if handshaking is not None and handshaking[0] is getcurrent():
            return handshaking[1]   # connect()'s own requests
        token = process_token()
        # After an announced shutdown each caller waits for the server's
        # return within its own time, whatever the attempts before it.
        patient = self._graceful.restarting
        if deadline is None and patient:
            deadline = time.monotonic() + graceful.patience(self)
        # Callers queued behind a reconnect fail at once if it fails instead
        # of each retrying in turn.
        failures = self._connect_failures
        closes = self._closes
        lock = self._lock
        if not lock.acquire(timeout=None if deadline is None
                            else max(0.0, deadline - time.monotonic())):
            raise not_sent(RequestTimeout("no connection within request_timeout=%ss: "
                                          "still reconnecting" % (self.request_timeout,)))
        try:
            check_process(token)
            patient = patient or self._graceful.restarting
            dead = self._transport is None or self._transport.error is not None
            if dead and self._connect_failures != failures and not patient:
                raise not_sent(NetworkError("reconnect failed: %s" % (self._connect_error,)))
            # (A pool's connections have reconnect_delay 0: a restarting server
            # refuses at once, and retrying at once spins the CPU it needs to start.)
            delay = (max(self.reconnect_delay, graceful.RETRY_DELAY) if patient
                     else self.reconnect_delay)
            attempt = 0
            while self._transport is None or self._transport.error is not None:
                if self._connected_once:
                    monitoring.emit(monitoring.ReconnectAttemptEvent,
                                    monitoring.address_of(self), attempt=attempt + 1)
                try:
                    self.connect()
                except NetworkError as exc:
                    check_process(token)
                    if self._closes != closes:   # close() came meanwhile: no new socket
                        raise not_sent(exc) from exc.__cause__
                    if (attempt >= self.reconnect_max_attempts and not patient) or (
                            deadline is not None
                            and time.monotonic() + delay > deadline):
                        self._connect_failures += 1
                        self._connect_error = exc
                        raise not_sent(exc) from exc.__cause__
                    attempt += 1
                    gevent.sleep(delay)
                    check_process(token)
                check_process(token)
            return self._transport
        finally:
            lock.release()

    def _call_deadline(self) -> Optional[float]:
        """The end (``time.monotonic()``) of a call starting now, by
        ``request_timeout``; None without one.  A call of several steps
        (connecting, then its requests) takes it once and hands it to each
        step, so that one ``request_timeout`` bounds them all."""
        timeout = self.request_timeout
        return None if timeout is None else time.monotonic() + timeout

    def _lookup_started(self, frame) -> Optional[float]:
        """A data method (``frame``, running) must look its space, index or
        field names up before it can encode its request: the deadline of
        the whole call by ``request_timeout`` (None without one), which the
        lookups' requests and then its own honour (``_lookup_deadline``).
        Taken once per call: a second lookup of the same call, or a lookup
        of a call made inside it (the schema's, while it connects), keeps it."""
        if self.request_timeout is None:
            return None
        current = getcurrent()
        lookups = self._lookups
        entry = lookups.get(current)
        if entry is not None:
            outer = frame
            while outer is not None:
                if outer is entry[0]:
                    return entry[1]
                outer = outer.f_back
        for glet in [g for g in lookups if g.dead]:   # (killed in a call: not to be kept)
            del lookups[glet]
        deadline = self._call_deadline()
        lookups[current] = (frame, deadline)
        return deadline

    def _lookup_deadline(self) -> Optional[float]:
        """The deadline of the call this greenlet is in, when that call looked
        names up first (``_lookup_started``) and has not returned: its frame is
        on this greenlet's stack.  A call that raised before its request
        leaves its entry behind, dropped here."""
        current = getcurrent()
        entry = self._lookups.get(current)
        if entry is None:
            return None
        frame: Any = sys._getframe(1)
        while frame is not None:
            if frame is entry[0]:
                return entry[1]
            frame = frame.f_back
        del self._lookups[current]
        return None

    def _reach(self, deadline=None):
        """The live transport, (re)connecting first: ``_ensure_connected``
        for a call that needs the connection before it frames a request (a
        space's schema, the server's features, a stream's session), bounded
        by ``deadline`` (``_call_deadline()`` when None) as its requests are.

        :raises gtarantool.RequestTimeout: the time ran out connecting
            (``applied`` False: nothing was sent).
        :raises tarantool.error.NetworkError: as ``_ensure_connected``.
        """
        transport = self._transport
        if transport is not None and transport.error is None and self._owner == _get_ident():
            return transport
        if deadline is None:
            deadline = self._call_deadline()
            if deadline is None:
                return self._ensure_connected()
        return self._timed(max(0.0, deadline - time.monotonic()), None,
                           self._ensure_connected, deadline)

    def _wait_for_connect(self, deadline=None):
        """Wait until no other greenlet is connecting (its ``connect()``
        holds the lock from the handshake to the schema), by ``deadline``.

        :raises gtarantool.RequestTimeout: it took longer (``applied`` False).
        """
        if deadline is None:
            deadline = self._call_deadline()
        lock = self._lock
        if not lock.acquire(timeout=None if deadline is None
                            else max(0.0, deadline - time.monotonic())):
            raise not_sent(RequestTimeout("no connection within request_timeout=%ss: "
                                          "still connecting" % (self.request_timeout,)))
        lock.release()

    def _opt_reconnect(self):
        self._ensure_connected()

    @property
    def _conn(self):
        """The connection whose schema and options ``RequestMethods`` reads: this one."""
        return self

    # -- the request path ----------------------------------------------------

    def generate_sync(self) -> int:
        """A new request id (sync), unique on this connection.

        :returns: the id.
        """
        return next(self._syncs)

    def _packer_factory(self):
        # Requests are packed without yielding, so one packer serves all greenlets.
        if self._packer is None:
            self._packer = self._packer_factory_impl(self)
        return self._packer

    def _send_request(self, request, on_push=None, on_push_ctx=None):
        timeout = self.request_timeout
        if timeout is None:
            self._ensure_connected()
            return self._send_request_wo_reconnect(request, on_push, on_push_ctx)
        timer = Timeout._start_new_or_dummy(timeout)
        try:
            self._ensure_connected(time.monotonic() + timeout)
            return self._send_request_wo_reconnect(request, on_push, on_push_ctx)
        except Timeout as exc:
            if exc is not timer:
                raise
            # (a request's sync is set when it is framed, just before it goes
            # to the transport: None, it was never handed over)
            raise self._timed_out(exc, request.sync) from None
        finally:
            timer.close()

    def _send_request_wo_reconnect(self, request, on_push=None, on_push_ctx=None,
                                   retries=SCHEMA_RETRIES):
        """Send a tarantool-python ``Request`` object (auth, SQL, id, ...)."""
        response_class = RESPONSE_CLASSES.get(request.response_class, request.response_class)
        data = bytes(request)   # a fresh sync and the current schema version
        transport = self._transport
        handshake = False
        if transport is None and self._handshaking is not None \
                and self._handshaking[0] is getcurrent():
            transport = self._handshaking[1]   # connect()'s authentication
            handshake = True
        if transport is None:
            raise not_sent(ConnectionClosed("connection is closed"))
        try:
            value = self._wait(transport, request.sync, None, data)
        except (InheritedSocket, Draining):
            if handshake:
                raise   # (connect() decides)
            # Not sent: on this process's own socket, or the next one, as _request's.
            self._ensure_connected()
            return self._send_request_wo_reconnect(request, on_push, on_push_ctx, retries)
        try:
            return self._response(value, response_class, on_push, on_push_ctx)
        except DatabaseError as exc:
            if not self._resend(exc, None, retries, None):
                refused(exc, None)
                raise
            return self._send_request_wo_reconnect(request, on_push, on_push_ctx, retries - 1)

    def _request(self, code, body, on_push=None, on_push_ctx=None, retries=SCHEMA_RETRIES,
                 stream=None, response_class=Response, deadline=None):
        """Send request ``code`` with its encoded ``body``; return the server's reply.

        The one request path: every data method, a stream's requests
        (``stream``: its ``stream_id`` goes in the header, and its
        ``_transport()`` says where it is sent) and the connection's own
        requests end here.  The common case (no stream, no timeout, an OK
        reply without push messages) is written out in this one frame; a
        call with a ``request_timeout`` or in a stream goes on in ``_bounded``
        (``deadline``: the end of a call of several steps, ``_call_deadline()``'s;
        None: ``request_timeout`` from now)."""
        if stream is not None or self.request_timeout is not None:
            return self._bounded(code, body, on_push, on_push_ctx, retries, stream,
                                 response_class, deadline)
        transport = self._transport
        if transport is None or transport.error is not None or self._owner != _get_ident():
            transport = self._ensure_connected()
        sync = next(self._syncs)
        version = self.schema_version
        try:
            value = transport.request(sync, code, version, body)
        except (InheritedSocket, Draining):
            # Not sent: forked (from C: no at-fork hook ran) since the last
            # request, now on this process's own socket; or in line on a
            # socket being drained, now on the next one.
            return self._request(code, body, on_push, on_push_ctx, retries, stream,
                                 response_class)
        if type(value) is Response and response_class is Response:
            value.conn = self
            return value
        try:
            return self._response(value, response_class, on_push, on_push_ctx)
        except DatabaseError as exc:
            if not self._resend(exc, code, retries, stream, None, body, version):
                refused(exc, code)
                raise
            return self._request(code, body, on_push, on_push_ctx, retries - 1, stream,
                                 response_class)

    def _bounded(self, code, body, on_push, on_push_ctx, retries, stream, response_class,
                 deadline=None):
        """``_request`` for a call in a stream or with a ``request_timeout``,
        which bounds the whole call: one timer and one deadline for the wait
        for a connection, the request, and any re-send (docs/guarantees.rst)."""
        if deadline is None and self._lookups:   # in a call that looked names up first
            deadline = self._lookup_deadline()
        if deadline is None:   # (the usual call: one clock read)
            timeout = self.request_timeout
            deadline = None if timeout is None else time.monotonic() + timeout
        else:
            timeout = max(0.0, deadline - time.monotonic())
        timer = Timeout._start_new_or_dummy(timeout)
        sync = None
        refusal = None   # a refusal proven not applied, while its re-send waits
        try:
            while True:
                if stream is None:
                    transport = self._transport
                    if (transport is None or transport.error is not None
                            or self._owner != _get_ident()):
                        transport = self._ensure_connected(deadline)
                    sync = next(self._syncs)
                    version = self.schema_version
                    frame_code, frame = code, body
                else:
                    transport = stream._transport()
                    sync = next(self._syncs)
                    version = self.schema_version
                    frame_code, frame = None, request_header(code, sync, version,
                                                             len(body), stream.stream_id) + body
                try:
                    value = transport.request(sync, frame_code, version, frame)
                except (InheritedSocket, Draining):
                    if stream is not None and stream._tx is not None:
                        raise   # (its transaction is that session's)
                    continue   # not sent: on this process's own socket, or the next one
                if type(value) is Response and response_class is Response:
                    value.conn = self
                    return value
                try:
                    return self._response(value, response_class, on_push, on_push_ctx)
                except DatabaseError as exc:
                    refusal = exc
                    if not self._resend(exc, code, retries, stream, deadline, body, version):
                        refused(exc, code)
                        # (a pool re-sending it elsewhere ends there by the same time)
                        exc.call_deadline = deadline
                        raise
                    refusal = None
                    retries -= 1
        except NetworkError as exc:
            # (a pool re-sending a read elsewhere ends there by the same time;
            # set here, as it leaves: the error may be the transport's, shared)
            exc.call_deadline = deadline
            raise
        except Timeout as exc:
            if exc is not timer:
                raise
            if refusal is not None:   # the time ran out waiting to re-send it
                refused(refusal, code)
                raise refusal from None
            raise self._timed_out(exc, sync) from None
        finally:
            timer.close()

    def _timed_out(self, timer, sync):
        """The ``RequestTimeout`` of a call whose ``timer`` fired; ``applied``
        False when it fired before the request was written."""
        if sync is None or getattr(timer, "unsent", False):
            return not_sent(RequestTimeout(
                "request_timeout=%ss ran out before the request was sent"
                % (self.request_timeout,)))
        return RequestTimeout("no reply within request_timeout=%ss (sync %d); the request "
                              "may still execute on the server" % (self.request_timeout, sync))

    def _resend(self, exc, code, retries, stream, deadline=None, body=None, version=None):
        """Whether a request refused with ``exc`` before it ran is sent again
        (at most ``retries`` more times): after a schema change (error 109,
        the schema reloaded first; its ``body``, encoded at schema
        ``version``, only while the names it was encoded from still stand
        for its ids), or a write refused by a server still becoming writable
        (``code``: the request type; not in a stream), at most until
        ``deadline``."""
        if not retries:
            return False
        if isinstance(exc, SchemaReloadException):
            self._reload_schema(exc.schema_version, process_token())
            return body is None or self._resolutions.still_named(self.schema, version, body)
        return stream is None and code is not None and self._graceful.resend(
            self, code, exc, deadline)

    def _wait(self, transport, sync, code, body):
        """Send one request and wait for its reply, at most ``request_timeout``."""
        return self._timed(self.request_timeout, sync, transport.request, sync, code,
                           self.schema_version, body)

    def _timed(self, seconds, sync, call, *args):
        """``call(*args)`` within ``seconds`` (None: no limit); when they run
        out, the ``RequestTimeout`` of the request ``sync`` (None: not sent)."""
        timer = Timeout._start_new_or_dummy(seconds)
        try:
            return call(*args)
        except Timeout as exc:
            if exc is not timer:
                raise
            raise self._timed_out(exc, sync) from None
        finally:
            timer.close()

    def _response(self, value, response_class, on_push, on_push_ctx):
        """The reply ``value`` the transport delivered as a response object
        (or raised when it is an error)."""
        if type(value) is Response:   # an OK reply, built by the reader
            if response_class is Response:
                value.conn = self
                return value
            value = (value._sync, value._code, value._schema_version, value._body, None)
        elif type(value) is not tuple:
            raise value.with_traceback(None)
        sync, code, schema, body, pushes = value
        if pushes is not None:
            self._run_pushes(sync, pushes, on_push, on_push_ctx)
        return make_response(response_class, self, sync, code, schema, body)

    def _run_pushes(self, sync, pushes, on_push, on_push_ctx):
        for code, schema, body in pushes:
            push = make_response(Response, self, sync, code, schema, body)
            if on_push is not None:
                on_push(push.data, on_push_ctx)

    def _reload_schema(self, version, token):
        """Error 109: reload once for everyone, under a lock.  ``token``: the
        process of the call that waits (a forked child's copy of it, woken
        there, reloads and re-sends nothing: CopiedCall)."""
        with self._schema_lock:
            check_process(token)
            if self.schema is None or self.schema_version == version:
                self.schema_version = version
                return
            self.update_schema(version)

    def _ops_process(self, space, ops):
        # tarantool-python copies the list to swap field names for numbers;
        # most operation lists name no field.
        for operation in ops:
            if isinstance(operation[1], str):
                return super()._ops_process(space, ops)
        return ops

    def flush_schema(self) -> None:
        """Forget the cached schema (spaces, indexes and their encoders); it is
        fetched again as requests need it."""
        self._spaces.clear()
        self._indexes.clear()
        super().flush_schema()

    def update_schema(self, schema_version: int) -> None:
        """Reload the schema, as the server's ``schema_version`` says it changed.

        :param schema_version: the server's new schema version.
        :raises tarantool.error.NetworkError: the schema could not be fetched.
        """
        super().update_schema(schema_version)
        self.stats.schema_reloads += 1

    def pipeline(self) -> Pipeline:
        """A :class:`gtarantool.pipeline.Pipeline` on this connection: queue many
        requests from one greenlet, then collect every reply in order.

        :returns: the new, empty :class:`~gtarantool.pipeline.Pipeline`.
        """
        return Pipeline(self)

    # -- Tarantool 2.10+ features, each in its own module ----------------------

    def watch(self, key: str, callback: Callable[[str, Any], Any]) -> watchers.Watcher:
        """Call ``callback(key, value)`` with the current value of ``key``
        (``box.status``, ``box.id``, a ``box.broadcast`` key...), then once per
        change, in a greenlet of the connection's; returns a
        :class:`gtarantool.watchers.Watcher` (``unregister()``).  Watchers are
        registered again after a reconnect (the callback gets the current value
        again); ``close()`` unregisters them.  Tarantool 2.10+, else
        :class:`gtarantool.FeatureNotSupported`.

        :param key: the key's name (str).
        :param callback: ``callback(key, value)``; an exception it raises is logged.
        :returns: the :class:`gtarantool.watchers.Watcher`.
        :raises TypeError: ``key`` is not a str, or ``callback`` is not callable.
        :raises gtarantool.FeatureNotSupported: the server has no watchers.
        :raises tarantool.error.NetworkError: the connection could not be (re)established."""
        return watchers.watch(self, key, callback)

    def watch_once(self, key: str) -> Any:
        """The current value of ``key``, without watching it (Tarantool 3.0+).

        :param key: the key's name (str).
        :returns: its value (``None`` when it has none).
        :raises TypeError: ``key`` is not a str.
        :raises gtarantool.FeatureNotSupported: the server is older than 3.0.
        :raises gtarantool.RequestTimeout: no reply within ``request_timeout``.
        :raises tarantool.error.NetworkError: the connection could not be (re)established."""
        return watchers.watch_once(self, key)

    def stream(self) -> streams.Stream:
        """A new :class:`gtarantool.streams.Stream` (Tarantool 2.10+): this
        connection's data methods under a stream id of its own, plus
        ``begin()``, ``commit()`` and ``rollback()``.

        :returns: the :class:`~gtarantool.streams.Stream`; the server is asked
            nothing until its first request.
        """
        return streams.Stream(self)

    def transaction(self, isolation: Union[str, int, None] = None,
                    timeout: Optional[float] = None) -> ContextManager[streams.Stream]:
        """``with conn.transaction() as tx:`` begins a transaction on a new
        stream, commits it when the block ends, rolls it back when the block
        raises.  See :meth:`gtarantool.streams.Stream.begin`.

        :param isolation: the isolation level's name or number (``None``: the server's default).
        :param timeout: seconds after which the server rolls the transaction back.
        :returns: a context manager that yields the transaction's
            :class:`gtarantool.streams.Stream`.
        :raises gtarantool.FeatureNotSupported: the server has no transactions (2.10+)."""
        return streams.transaction(self, isolation, timeout)

    def execute(self, query: str, params: Any = None) -> Any:
        """Execute an SQL query (tarantool-python's ``execute``), ``query``
        checked before anything is sent.

        :param query: the SQL text, with ``?`` or ``:name`` placeholders.
        :param params: the values bound to them: a list, or a dict by name.
        :returns: tarantool-python's SQL response (``.data``, ``.affected_row_count``).
        :raises TypeError: ``query`` is not a str (nothing is sent).
        :raises tarantool.error.DatabaseError: the server refused the query.
        """
        check_query(query)
        return super().execute(query, params)

    def prepare(self, sql: str) -> PreparedStatement:
        """Prepare an SQL statement: a :class:`gtarantool.sql.PreparedStatement`
        (``execute(params)``, ``unprepare()``; a context manager).

        :param sql: the statement's text, with ``?`` or ``:name`` placeholders.
        :returns: the :class:`gtarantool.sql.PreparedStatement`.
        :raises tarantool.error.DatabaseError: the server rejected the statement."""
        return PreparedStatement(self, sql)

    def _check_features(self):
        super()._check_features()
        # Set up the per-connection codec once the server version is known.
        self._packer = None
        self._encoder = Encoder.for_connection(self)


def _connect_tcp(host, port, timeout):
    """``gevent.socket.create_connection((host, port), timeout)``, without
    gevent's resolver for a numeric address: that resolver runs getaddrinfo
    in the hub's thread pool, whose thread, still starting in a server's
    master when the master forks its workers from C without the GIL (uWSGI),
    leaves every worker forked then waiting for the GIL forever.
    ``AI_NUMERICHOST`` resolves in this thread, with no DNS (``_socket``'s:
    never monkey-patched)."""
    try:
        infos = _socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM, 0,
                                    socket.AI_NUMERICHOST)
    except (OSError, UnicodeError, TypeError):   # a host name: gevent's resolver
        return gevent.socket.create_connection((host, port), timeout=timeout)
    error: Optional[OSError] = None
    for family, kind, proto, _, address in infos:
        sock = gevent.socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
    raise error or OSError("getaddrinfo returned no address for %s:%s" % (host, port))


def _describe(exc):
    if isinstance(exc, DatabaseError) and getattr(exc, "message", None):
        return "%s (code %s)" % (exc.message, exc.code)
    return str(exc) or type(exc).__name__


def _abandoned(transport, owner):
    """A connection was garbage-collected without close(): stop its transport,
    without blocking, when that happens in the thread whose hub runs it."""
    if owner == _get_ident():
        transport.abort(ConnectionClosed("the connection was garbage-collected"))


def _after_fork_in_child():
    # The child must never read or write the parent's stream: its copy of the
    # socket is made dead at once, and the first use adopts the connection.
    for conn in list(_live):
        if conn._transport is not None:
            conn._transport.detach_after_fork()
        conn._owner = None


os.register_at_fork(after_in_child=_after_fork_in_child)
