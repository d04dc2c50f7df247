"""Locust integration: ``TarantoolUser``, a Locust ``User`` whose ``self.client``
sends gtarantool requests and reports each one to Locust.

``pip install '.[locust]'`` in a checkout, then in a locustfile::

    from locust import task, constant
    from gtarantool.locust import TarantoolUser

    class Users(TarantoolUser):
        wait_time = constant(0)
        expected_errors = {3}          # a duplicate key counts as a success

        @task
        def get(self):
            self.client.select("bench", 42)

What callers rely on: every request fires Locust's ``request`` event (name
``"<method> <space or function>"``, an error named the same way every time); a
failed request raises :class:`RequestFailed`, which ends the task quietly unless
the task catches it; an error code in ``expected_errors`` is a success.
Importing this module changes nothing in Locust.  The guide: docs/locust.rst.
``gtarantool.locust`` is an alias of this module.
"""
import contextlib
import logging
import os
import time
import urllib.parse
from typing import Dict, FrozenSet, List

import gevent
import msgpack
from gevent.event import AsyncResult
from locust import User, events
from locust.exception import RescheduleTask, StopUser
from locust.runners import MasterRunner, WorkerRunner
from tarantool.error import ConfigurationError, DatabaseError, NetworkError

import gtarantool
from gtarantool.protocol import ErrorReply

__all__ = ["TarantoolUser", "TarantoolClient", "RequestFailed", "parse_host", "error_name",
           "hide_password", "open_connection", "process_report", "worker_reports",
           "REQUEST_TYPE"]

logger = logging.getLogger(__name__)

REQUEST_TYPE = "tarantool"
STEP_TYPE = "step"
UNREACHABLE = "gtarantool_unreachable"   # worker -> master: stop the run
REPLY_HEADER_SIZE = 28   # a 2.6 reply's length prefix and header (ping's size; estimates)
NAME_LIMIT = 60          # eval expressions and SQL in request names are cut here
NAMES_LIMIT = 1000       # request names kept per method
_clock = time.perf_counter


class RequestFailed(RescheduleTask):
    """A request failed; Locust has been told.  Uncaught, it ends the task
    quietly; ``error`` is the exception."""

    def __init__(self, name, error):
        super().__init__(name, error)
        self.name = name
        self.error = error

    def __str__(self):
        return "%s: %s" % (self.name, error_name(self.error))


class TarantoolError(Exception):
    """What Locust is told about a failure: its text is the stable name of the
    error (no sync ids, addresses or timings), the original in ``error``."""

    def __init__(self, name, error):
        super().__init__(name)
        self.error = error

    def __repr__(self):
        return self.args[0]


def error_name(exc):
    """``DatabaseError(<code>)`` for the server's errors; the class name for
    network failures (whose texts carry sync ids and timings) and undecodable
    replies (byte positions); otherwise ``Class: message`` (a schema error
    naming a missing space, a bad argument)."""
    if isinstance(exc, NetworkError) or isinstance(exc, UnicodeError):
        return type(exc).__name__
    if isinstance(exc, DatabaseError) and exc.code:
        return "DatabaseError(%s)" % (exc.code,)
    return "%s: %s" % (type(exc).__name__, exc)


VSHARD_SCHEME = "tarantool+vshard"   # a Lua router's address: gtarantool.Router
PASSWORD_ENV = "TARANTOOL_PASSWORD"
# a host URL as Locust shows it (password taken out) -> the password
_passwords: Dict[str, str] = {}


def parse_host(url):
    """``tarantool://[user[:password]@]host:port[,host:port...][?option=value&...]``
    -> ``(addresses, user, password, options)``; ``addresses`` is a list of
    ``(host, port)``; options named ``*_timeout`` or ``*_delay`` are numbers, the
    connection's counts (``max_in_flight``...) integers, its switches
    (``lazy_errors``...) true/false/1/0, others strings.  With a
    user and no password in the URL, the password is the one :func:`hide_password` took
    out of this URL in this process, else ``$TARANTOOL_PASSWORD``, else None."""
    if not url:
        raise ValueError("no host: run locust with --host tarantool://host:port")
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("tarantool", VSHARD_SCHEME):
        raise ValueError("--host must look like tarantool://[user:password@]host:port"
                         "[,host:port...] or %s://[user:password@]router:port, not %r"
                         % (VSHARD_SCHEME, url))
    credentials, _, hosts = parsed.netloc.rpartition("@")
    user, _, password = credentials.partition(":")
    addresses = []
    for part in hosts.split(","):
        host, sep, port = part.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError("expected host:port in --host %r, got %r" % (url, part))
        addresses.append((host.strip("[]"), int(port)))
    options = {key: _option(key, value) for key, value in urllib.parse.parse_qsl(parsed.query)}
    user, password = urllib.parse.unquote(user) or None, urllib.parse.unquote(password) or None
    if user and not password:
        password = _passwords.get(url) or os.environ.get(PASSWORD_ENV) or None
    return addresses, user, password, options


_COUNTS = frozenset(("max_in_flight", "max_response_size", "reconnect_max_attempts"))
_SWITCHES = frozenset(("lazy_errors", "fetch_schema", "retry_reads", "connect_now"))
_WORDS = {"true": True, "1": True, "yes": True, "on": True,
          "false": False, "0": False, "no": False, "off": False}


def _option(key, value):
    """A URL option's value as the connection takes it; ValueError says which."""
    try:
        if key.endswith(("_timeout", "_delay")):
            return float(value)
        if key in _COUNTS:
            return int(value)
        if key in _SWITCHES:
            return _WORDS[value.lower()]
    except (ValueError, KeyError):
        raise ValueError("--host option %s=%r: expected %s" % (
            key, value, "true or false" if key in _SWITCHES else
            "an integer" if key in _COUNTS else "a number")) from None
    return value


def hide_password(url):
    """``url`` without its password, which :func:`parse_host` of the returned URL still
    finds in this process: what Locust may show, log and write to its reports.

    :param url: a ``tarantool://`` URL, or None.
    :returns: the URL without ``:password`` (unchanged when it has none).
    """
    parsed = urllib.parse.urlsplit(url or "")
    if parsed.scheme not in ("tarantool", VSHARD_SCHEME) or not parsed.password:
        return url
    credentials, _, hosts = parsed.netloc.rpartition("@")
    shown = urllib.parse.urlunsplit(parsed._replace(
        netloc="%s@%s" % (credentials.partition(":")[0], hosts)))
    _passwords[shown] = urllib.parse.unquote(parsed.password)
    return shown


def open_connection(url, **options):
    """A connection (one address) or a ``gtarantool.ConnectionPool`` (several)
    for a ``tarantool://`` URL, connected.  Options in the URL's query
    (``request_timeout``, ``wait_timeout``, ...) go to the constructor."""
    addresses, user, password, url_options = parse_host(url)
    options = dict(url_options, **options)
    if urllib.parse.urlsplit(url).scheme == VSHARD_SCHEME:
        if len(addresses) != 1:
            raise ValueError("%s:// names one Lua router, not %d addresses"
                             % (VSHARD_SCHEME, len(addresses)))
        host, port = addresses[0]
        return gtarantool.Router.from_router(host, port, user=user, password=password, **options)
    if len(addresses) == 1:
        host, port = addresses[0]
        return gtarantool.connect(host, port, user=user, password=password, **options)
    pool = gtarantool.ConnectionPool([{"host": host, "port": port} for host, port in addresses],
                                     user=user, password=password, **options)
    # A pool opens whatever answers (and retries the rest later): none at all
    # is an unreachable server.
    if not any(i.state.status.name == "HEALTHY" for i in pool.pool.values()):
        pool.close()
        raise NetworkError("none of the %d instances answered" % len(addresses))
    return pool


# -- the client -----------------------------------------------------------------

class _Counters:
    """This process's requests: ``started``, ``reported`` (request events
    fired), ``failed`` (of those, failures), ``server_errors`` (error replies,
    expected ones included); ``started - reported`` were in flight when their
    users were stopped.  ``cpu_start``, ``wall_start``, ``queued_start``: process
    CPU seconds, the monotonic clock and :func:`_queued_seconds` at test start."""
    COUNTS = ("started", "reported", "failed", "server_errors")
    __slots__ = COUNTS + ("cpu_start", "wall_start", "queued_start")

    def __init__(self):
        self.started = self.reported = self.failed = self.server_errors = 0
        self.cpu_start = self.wall_start = self.queued_start = None


def _queued_seconds():
    """Seconds this thread was ready to run but waited for a CPU (Linux's
    schedstat; None elsewhere)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


_counters = _Counters()
_shared: Dict[tuple, AsyncResult] = {}         # this process's connections by URL: AsyncResult
# every connection this process opened: (conn, requests, responses at open)
_opened: List[tuple] = []
_user_scoped: List[object] = []    # connections of connection_scope = "user", closed at test_stop
_unreachable: List[Exception] = []    # this process already reported that the server is unreachable


def _forget_after_fork():
    # The parent's connections (if any) are not this process's.
    global _counters
    _counters = _Counters()
    _shared.clear()
    del _opened[:], _user_scoped[:], _unreachable[:]


os.register_at_fork(after_in_child=_forget_after_fork)


def _stats(conn):
    """The ``Stats`` of a connection, or of each connection of a pool or router."""
    replicasets = getattr(conn, "replicasets", None)
    if isinstance(replicasets, dict):
        return [s for rs in replicasets.values() for s in _stats(rs.pool)]
    pool = getattr(conn, "pool", None)
    if isinstance(pool, dict):
        return [instance.conn.stats for instance in pool.values()]
    return [conn.stats]


def _open(url, options):
    conn = open_connection(url, **options)
    stats = _stats(conn)
    _opened.append((conn, sum(s.requests for s in stats), sum(s.responses for s in stats)))
    return conn


def _process_connection(url, options):
    """The connection this process shares for ``url``: the first caller opens
    it, callers arriving meanwhile wait for it (``connect`` yields).  A caller
    killed while it opens it (a user stopped, a ``gevent.Timeout``) leaves it
    to the next caller, and those waiting try again."""
    key = (url, tuple(sorted(options.items())))
    while True:
        result = _shared.get(key)
        if result is None:
            result = _shared[key] = AsyncResult()
            try:
                result.set(_open(url, options))
            except Exception as exc:
                result.set_exception(exc)
            except BaseException:
                del _shared[key]
                result.set(None)
                raise
        conn = result.get()
        if conn is not None:
            return conn


def process_report():
    """This process's figures: request counters; since the test started, CPU
    seconds, wall-clock seconds, seconds it waited for a CPU (None where the
    system does not say) and ``busy``, the share of the wall-clock seconds it ran
    or waited for a CPU (the rest it waited, mostly for replies); its
    connections' summed ``Stats`` (``requests``/``responses`` counted from when
    each opened, so the connect's own requests are left out) and
    ``connections`` opened."""
    report = {name: getattr(_counters, name) for name in _Counters.COUNTS}
    started = _counters.cpu_start is not None
    report["cpu_seconds"] = time.process_time() - _counters.cpu_start if started else None
    report["wall_seconds"] = time.monotonic() - _counters.wall_start if started else None
    queued = _queued_seconds()
    report["queued_seconds"] = (queued - _counters.queued_start
                                if started and queued is not None
                                and _counters.queued_start is not None else None)
    report["busy"] = (min(1.0, (report["cpu_seconds"] + (report["queued_seconds"] or 0))
                          / report["wall_seconds"]) if started and report["wall_seconds"]
                      else None)
    report["in_flight_at_stop"] = _counters.started - _counters.reported
    report["connections"] = len(_opened)
    summed = {}
    for conn, requests_at_open, responses_at_open in _opened:
        for stats in _stats(conn):
            for key, value in stats.as_dict().items():
                if key == "max_in_flight":
                    summed[key] = max(summed.get(key, 0), value)
                else:
                    summed[key] = summed.get(key, 0) + value
        summed["requests"] -= requests_at_open
        summed["responses"] -= responses_at_open
    report["connection"] = summed
    return report


class TarantoolClient:
    """``TarantoolUser.client``: the connection's data methods, each reported to
    Locust.  Arguments are the connection's (``mode=`` goes to a pool)."""

    def __init__(self, user):
        self._user = user
        self._environment = user.environment
        self._fire = user.environment.events.request.fire
        self._expected = frozenset(user.expected_errors)
        self._conn = None

    @property
    def connection(self):
        """The gtarantool connection (or pool) behind this client, opened on first use."""
        return self._conn or self._connect()

    def _connect(self):
        user = self._user
        url, options = user.host, dict(user.connection_options)
        options.setdefault("lazy_errors", True)   # most errors are only counted by code
        try:
            if user.connection_scope == "user":
                conn = _open(url, options)
                _user_scoped.append(conn)
            elif user.connection_scope == "process":
                conn = _process_connection(url, options)
            else:
                raise ValueError("connection_scope must be 'process' or 'user', not %r"
                                 % (user.connection_scope,))
        except (NetworkError, ValueError, TypeError, ConfigurationError) as exc:
            # (TypeError: an option the connection does not take)
            _stop_run(self._environment, url, exc)
            raise StopUser() from None
        self._conn = conn
        return conn

    def _failed(self, names, method, target, start, exc):
        """Report a request that raised ``exc``.  An expected error code: a
        success, and the error reply to return (a response, as tarantool-python
        returns it with ``error=False``); otherwise a failure, and the
        RequestFailed for the caller to raise (from its own frame: one frame
        less for the exception to leave)."""
        elapsed = (_clock() - start) * 1000
        name = names.get(target) or _name(names, method, target)
        counters = _counters
        counters.reported += 1
        if isinstance(exc, DatabaseError) and not isinstance(exc, NetworkError):
            counters.server_errors += 1
            self._user._replied = True
            if exc.code in self._expected:
                self._fire(request_type=REQUEST_TYPE, name=name, response_time=elapsed,
                           response_length=0, exception=None, context=self._user.context())
                return ErrorReply(self._conn, exc)   # (its message decoded if it is read)
        counters.failed += 1
        self._fire(request_type=REQUEST_TYPE, name=name, response_time=elapsed,
                   response_length=0, exception=TarantoolError(error_name(exc), exc),
                   context=self._user.context())
        return RequestFailed(name, exc)

    def ping(self, notime=False, **kwargs):
        """``Connection.ping`` (a pool's takes ``mode=``), reported to Locust as "ping"."""
        conn = self._conn or self._connect()
        _counters.started += 1
        start = _clock()
        try:
            result = conn.ping(notime, **kwargs)
        except Exception as exc:
            outcome = self._failed({None: "ping"}, "ping", None, start, exc)
            if type(outcome) is RequestFailed:
                raise outcome from exc
            return outcome
        elapsed = (_clock() - start) * 1000
        _counters.reported += 1
        self._user._replied = True
        self._fire(request_type=REQUEST_TYPE, name="ping", response_time=elapsed,
                   response_length=REPLY_HEADER_SIZE, exception=None,
                   context=self._user.context())
        return result

    def space(self, space_name):
        """A space object (as ``Connection.space``) whose requests are reported."""
        return _Space(self, space_name)

    @contextlib.contextmanager
    def measure(self, name, response_length=0):
        """Report the block as one Locust entry (type "step", ``name``), a
        failure if it raises; its requests are reported on their own too."""
        start = _clock()
        try:
            yield
        except Exception as exc:
            error = exc.error if isinstance(exc, RequestFailed) else exc
            self._fire(request_type=STEP_TYPE, name=name,
                       response_time=(_clock() - start) * 1000, response_length=0,
                       exception=TarantoolError(error_name(error), error),
                       context=self._user.context())
            raise
        self._fire(request_type=STEP_TYPE, name=name,
                   response_time=(_clock() - start) * 1000,
                   response_length=response_length, exception=None,
                   context=self._user.context())


def _reported(method):
    """The client's ``method``: the connection's, reported to Locust as
    "<method> <target>" (its first argument: a space, function, expression)."""
    names = {}   # target -> request name, shared by every client

    def request(self, target, *args, **kwargs):
        conn = self._conn or self._connect()
        counters = _counters
        counters.started += 1
        start = _clock()
        try:
            if kwargs:
                if "_bucket_id" in kwargs:   # a Router call: (bucket_id, func, ...)
                    resp = getattr(conn, method)(kwargs.pop("_bucket_id"), target, *args,
                                                 **kwargs)
                else:
                    resp = getattr(conn, method)(target, *args, **kwargs)
            else:
                resp = getattr(conn, method)(target, *args)
        except Exception as exc:
            outcome = self._failed(names, method, target, start, exc)
            if type(outcome) is RequestFailed:
                raise outcome from exc
            return outcome
        elapsed = (_clock() - start) * 1000
        counters.reported += 1
        self._user._replied = True
        self._fire(request_type=REQUEST_TYPE, response_time=elapsed,
                   name=names.get(target) or _name(names, method, target),
                   response_length=getattr(resp, "_size", None) or _reply_size(resp),
                   exception=None, context=self._user.context())
        return resp

    request.__name__ = request.__qualname__ = method
    request.__doc__ = "``Connection.%s``, reported to Locust." % method
    return request


def _name(names, method, target):
    text = "" if target is None else str(target)
    if len(text) > NAME_LIMIT:
        text = text[:NAME_LIMIT] + "..."
    if len(names) >= NAMES_LIMIT:   # many distinct eval expressions or SQL texts
        names.clear()
    name = names[target] = ("%s %s" % (method, text)).rstrip()
    return name


for _method in ("insert", "replace", "select", "update", "upsert", "delete", "call", "eval",
                "execute"):
    setattr(TarantoolClient, _method, _reported(_method))


def _routed(method):
    """A ``gtarantool.Router`` call (``tarantool+vshard://``), reported as
    "<method> <function>": the bucket id is left out of the name."""
    by_function = _reported(method)

    def request(self, bucket_id, func, *args, **kwargs):
        return by_function(self, func, *args, _bucket_id=bucket_id, **kwargs)

    request.__name__ = request.__qualname__ = method
    request.__doc__ = "``Router.%s(bucket_id, func, args, timeout=)``, reported to Locust." % method
    return request


for _method in ("callrw", "callro", "callbro", "callre", "callbre"):
    setattr(TarantoolClient, _method, _routed(_method))
setattr(TarantoolClient, "map_callrw", _reported("map_callrw"))


class _Space:
    """``client.space(name)``: the space's requests through the client."""

    def __init__(self, client, space_name):
        self.client, self.space_name = client, space_name

    def insert(self, *args, **kwargs):
        return self.client.insert(self.space_name, *args, **kwargs)

    def replace(self, *args, **kwargs):
        return self.client.replace(self.space_name, *args, **kwargs)

    def select(self, *args, **kwargs):
        return self.client.select(self.space_name, *args, **kwargs)

    def update(self, *args, **kwargs):
        return self.client.update(self.space_name, *args, **kwargs)

    def upsert(self, *args, **kwargs):
        return self.client.upsert(self.space_name, *args, **kwargs)

    def delete(self, *args, **kwargs):
        return self.client.delete(self.space_name, *args, **kwargs)

    def call(self, func_name, *args, **kwargs):
        return self.client.call(func_name, *args, **kwargs)


def _reply_size(resp):
    """A reply's bytes on the wire, as the reader counted them (nearly every
    reply); else an estimate: its body re-packed after a 2.6-style header."""
    size = getattr(resp, "_size", None)
    if size is not None:
        return size
    body = getattr(resp, "_body", None)
    if body is None:
        return REPLY_HEADER_SIZE if resp is not None else 0
    return REPLY_HEADER_SIZE + len(_packb(body))


_packb = msgpack.Packer(use_bin_type=True).pack


class TarantoolUser(User):
    """An abstract Locust user with a Tarantool client in ``self.client``.

    ``connection_scope``: "process" (one connection per worker process, shared
    by its users) or "user".  ``expected_errors``: server error codes counted
    as successes (the call returns the error reply, as tarantool-python does
    with ``error=False``; other errors raise :class:`RequestFailed`).
    ``connection_options``: more arguments for ``gtarantool.connect``
    (``request_timeout``, ...); ``lazy_errors`` is True unless given (a
    server error's message is decoded when read).
    """
    abstract = True
    connection_scope = "process"
    expected_errors: FrozenSet[int] = frozenset()
    connection_options: Dict[str, object] = {}

    def __init__(self, environment):
        super().__init__(environment)
        self.client = TarantoolClient(self)
        self._replied = False   # a reply came since the last pause between tasks

    # Locust's loop pauses between tasks in its root task set's _sleep (a
    # gevent.sleep(0) for a zero wait_time: a pass through the hub, so that
    # other users run).  A task whose request got a reply has been through the
    # hub already (replies come only from there); a second pass costs every
    # request a hub round trip and splits the batch of users woken by one read
    # from the socket (a tenth of the CPU per request in bench/locust/locustfile.py).
    # So a zero wait after a reply is no pause; any other wait is Locust's.
    @property
    def _taskset_instance(self):
        return self.__dict__.get("_tarantool_taskset")

    @_taskset_instance.setter
    def _taskset_instance(self, taskset):
        if taskset is not None:
            taskset._sleep = self._pause
        self.__dict__["_tarantool_taskset"] = taskset

    def _pause(self, seconds):
        if self._replied and seconds <= 0:
            self._replied = False
            return
        self._replied = False
        gevent.sleep(seconds)


# -- stopping the run when the server cannot be reached -------------------------

def _stop_run(environment, url, exc):
    """The first user of this process that cannot connect tells the master (or,
    running alone, this process) to stop the run; the others just stop."""
    if _unreachable:
        return
    _unreachable.append(exc)
    environment.process_exit_code = 1
    runner = environment.runner
    if runner is not None:
        runner.send_message(UNREACHABLE, {"host": _without_password(url),
                                          "error": "%s: %s" % (type(exc).__name__, exc)})


def _without_password(url):
    parsed = urllib.parse.urlsplit(url or "")
    if parsed.password:
        netloc = parsed.netloc.replace(":" + parsed.password + "@", ":***@")
        return urllib.parse.urlunsplit(parsed._replace(netloc=netloc))
    return url


def _on_unreachable(environment, msg, **_kwargs):
    if getattr(environment, "gtarantool_unreachable", None):
        return   # another worker said so already
    environment.gtarantool_unreachable = msg.data
    environment.process_exit_code = 1
    logger.error("cannot connect to %s (%s); stopping the run", msg.data["host"],
                 msg.data["error"])
    environment.events.request.fire(request_type=REQUEST_TYPE, name="connect",
                                    response_time=0.0, response_length=0,
                                    exception=msg.data["error"], context={})
    # Not from this greenlet: quit() kills the runner's greenlets (and users).
    gevent.spawn(environment.runner.quit)


@events.init.add_listener
def _on_init(environment, **_kwargs):
    # The host Locust shows (web UI, HTML report, what a master sends its workers) keeps
    # no password; this process keeps it to connect.
    environment.host = hide_password(environment.host)
    if getattr(environment.parsed_options, "host", None):
        environment.parsed_options.host = hide_password(environment.parsed_options.host)
    runner = environment.runner
    if runner is None:
        return
    if not isinstance(runner, WorkerRunner):
        runner.register_message(UNREACHABLE, _on_unreachable)
        environment.gtarantool_workers = {}
        if hasattr(environment.events, "worker_report"):
            environment.events.worker_report.add_listener(
                lambda client_id, data, **kw: _keep_report(environment, client_id, data))


def _keep_report(environment, client_id, data):
    report = data.get("gtarantool")
    if report is not None:
        environment.gtarantool_workers[client_id] = report


@events.report_to_master.add_listener
def _on_report_to_master(client_id, data, **_kwargs):
    if _counters.cpu_start is not None:
        data["gtarantool"] = process_report()


def worker_reports(environment):
    """The latest :func:`process_report` of every worker (the master's view),
    or of this process when it runs alone; keyed by worker id.

    :param environment: Locust's ``Environment`` (``self.environment`` in a user).
    :returns: a dict of worker id -> report (empty on a worker)."""
    if isinstance(environment.runner, WorkerRunner):
        return {}
    reports = dict(getattr(environment, "gtarantool_workers", {}))
    if not isinstance(environment.runner, MasterRunner) and _counters.cpu_start is not None:
        reports["local"] = process_report()
    return reports


@events.test_start.add_listener
def _mark_cpu(**_kwargs):
    if _counters.cpu_start is None:
        _counters.cpu_start = time.process_time()
        _counters.wall_start = time.monotonic()
        _counters.queued_start = _queued_seconds()


@events.test_stop.add_listener
def _close_user_connections(**_kwargs):
    while _user_scoped:
        _user_scoped.pop().close()


@events.quitting.add_listener
def _on_quitting(environment, **_kwargs):
    for conn, _, _ in _opened:
        conn.close()
