"""OpenTelemetry spans and metrics for gtarantool (extra ``otel``).

``GtarantoolInstrumentor().instrument(tracer_provider=..., meter_provider=...)``
wraps the data methods of :class:`gtarantool.Connection`, streams, pipelines,
prepared statements, :class:`gtarantool.ConnectionPool` and
:class:`gtarantool.Router` on their classes, so connections made before the
call are covered as well as later ones; ``uninstrument()`` puts the classes
back.  Nothing of this module runs while it is not instrumented.

Each request is one CLIENT span, started and ended in the caller's greenlet
under the caller's current span, named and described as the OpenTelemetry
database semantic conventions ask (``db.system.name`` = ``tarantool``); a
pool's or router's request is one span naming the instance that answered,
its re-sends being span events.  The requests the library makes for itself
(connecting, the schema, a pool's role checks, a router's discovery, bucket
searches and map stages) make none.  ``db.client.operation.duration``
records each request the caller made, with the span's attributes of low
cardinality only; the connection metrics are read from the live connections
when the meter collects.  See "Observability" in the manual.
"""
from __future__ import annotations

import contextvars
import functools
import os
import time
from typing import Any, Callable, Collection, Dict, List, Optional, Tuple

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]
from opentelemetry.metrics import CallbackOptions, NoOpMeter, Observation, get_meter
from opentelemetry.trace import INVALID_SPAN, SpanKind, Status, StatusCode
from tarantool.error import DatabaseError, NetworkError
from tarantool.schema import Schema

import gtarantool
from gtarantool import connection as _connection
from gtarantool import monitoring
from gtarantool.connection import Connection
from gtarantool.errors import RequestTimeout, applied
from gtarantool.pipeline import Pipeline
from gtarantool.pool import ConnectionPool, roles
from gtarantool.protocol.constants import (
    REQUEST_TYPE_DELETE,
    REQUEST_TYPE_INSERT,
    REQUEST_TYPE_REPLACE,
    REQUEST_TYPE_SELECT,
    REQUEST_TYPE_UPDATE,
    REQUEST_TYPE_UPSERT,
)
from gtarantool.protocol.responses import responses
from gtarantool.sharding import Router
from gtarantool.sql import PreparedStatement
from gtarantool.streams import Stream
from gtarantool.transport import CHECKED

__all__ = ["GtarantoolInstrumentor", "DURATION_BUCKETS", "SYSTEM"]

_instruments = ("gtarantool >= 2.0",)

SYSTEM = "tarantool"
# The conventions' advice for db.client.operation.duration, in seconds.
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0)
SCHEMA_URL = "https://opentelemetry.io/schemas/1.33.0"

SPACE_METHODS = ("insert", "replace", "select", "update", "upsert", "delete")
DATA_METHODS = SPACE_METHODS + ("call", "eval", "execute", "ping")
STREAM_METHODS = DATA_METHODS + ("begin", "commit", "rollback")
ROUTER_METHODS = ("callrw", "callro", "callbro", "callre", "callbre")
# The router's methods that make its own requests (quiet).
ROUTER_OWN = ("_discover_once", "_ask_count", "_resolve", "_each")
# The operations of requests a pipeline takes encoded (send_frames' ``code``).
REQUEST_NAMES = {REQUEST_TYPE_INSERT: "insert", REQUEST_TYPE_REPLACE: "replace",
                 REQUEST_TYPE_SELECT: "select", REQUEST_TYPE_UPDATE: "update",
                 REQUEST_TYPE_UPSERT: "upsert", REQUEST_TYPE_DELETE: "delete"}
# A cache of attributes by (address, operation, target) is emptied past this size.
CACHE_LIMIT = 4096
# Attributes of the span only: each value would open new series of the duration
# metric (the conventions want its attributes of low cardinality).
SPAN_ONLY = frozenset(("tarantool.stream.id", "tarantool.vshard.bucket_id",
                       "db.operation.batch.size"))

# The pool's or router's request (a _Call) this greenlet is in: its connection-level
# requests add to that span instead of making their own.
_outer: contextvars.ContextVar[Any] = contextvars.ContextVar("gtarantool_otel_outer",
                                                             default=None)
_QUIET = object()       # ... or a request the library makes for itself: no span
_EXECUTING = object()   # ... or a prepared statement's execute: its re-prepare is an event
_PARENT_BASED_OFF = "ParentBased{root:AlwaysOffSampler,remoteParentSampled:AlwaysOnSampler,"


def _stability() -> Tuple[bool, bool]:
    """(stable names, pre-stable names) as ``OTEL_SEMCONV_STABILITY_OPT_IN`` asks:
    ``database/dup`` emits both; anything else the stable ones, which are all
    this instrumentation ever had."""
    options = {part.strip() for part in
               os.environ.get("OTEL_SEMCONV_STABILITY_OPT_IN", "").split(",")}
    return True, "database/dup" in options


def _sampled_parent() -> bool:
    return bool(trace.get_current_span().get_span_context().trace_flags.sampled)


def _sampler_of(provider: Any) -> Optional[str]:
    """The description of an SDK tracer provider's sampler (None for another provider)."""
    sampler = getattr(provider, "sampler", None)
    describe = getattr(sampler, "get_description", None)
    return describe() if callable(describe) else None


def _address(conn: Any) -> Tuple[str, Optional[int]]:
    if conn.host is None:
        return str(conn.port), None
    return str(conn.host), int(conn.port)


class _Call:
    """A pool's or router's request: its span and the connections it went to."""

    __slots__ = ("span", "conn", "attempts", "mode")

    def __init__(self, span: Any) -> None:
        self.span = span
        self.conn: Any = None
        self.attempts = 0
        self.mode: Tuple[Tuple[str, Any], ...] = ()   # a router's: its pool's mode

    def attempt(self, conn: Any) -> None:
        if self.attempts and self.span.is_recording():
            host, port = _address(conn)
            attributes: Dict[str, Any] = {"server.address": host, "tarantool.attempt":
                                          self.attempts + 1}
            if port is not None:
                attributes["server.port"] = port
            self.span.add_event("gtarantool.resend", attributes)
        self.attempts += 1
        self.conn = conn


class _Telemetry:
    """The tracer, the instruments and the attributes cache of one instrumentation."""

    def __init__(self, tracer: Any, meter: Any, sampler: Optional[str] = None) -> None:
        self.tracer = tracer
        self.stable, self.legacy = _stability()
        self.active = True
        # The sampler drops every span (``never``), or every span without a sampled
        # parent (``parent``): then no span is started where none would be recorded.
        self.never = sampler == "AlwaysOffSampler"
        self.parented = sampler is not None and sampler.startswith(_PARENT_BASED_OFF)
        self.metered = not isinstance(meter, NoOpMeter)
        self.idle = self.never and not self.metered
        self.duration = meter.create_histogram(
            "db.client.operation.duration", unit="s",
            description="Duration of database client operations.",
            explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS))
        self.timeouts = meter.create_counter(
            "db.client.connection.timeouts", unit="{timeout}",
            description="Calls that got no connection or no free request slot in time.")
        meter.create_observable_up_down_counter(
            "db.client.connection.count", callbacks=[self._count], unit="{connection}",
            description="Open connections, by state: used (requests in flight) or idle.")
        meter.create_observable_up_down_counter(
            "db.client.connection.pending_requests", callbacks=[self._pending],
            unit="{request}", description="Requests written and awaiting their replies.")
        self._cache: Dict[Any, Tuple[str, Dict[str, Any], Dict[str, Any]]] = {}

    # -- attributes --------------------------------------------------------------------

    def describe(self, conn: Any, op: str, target: Any, query: Optional[str] = None,
                 extra: Tuple[Tuple[str, Any], ...] = ()) -> Tuple[str, Dict[str, Any],
                                                                     Dict[str, Any]]:
        """(span name, span attributes, metric attributes) of a request."""
        key = (None, None, op, target, query, extra) if conn is None else (
            conn.host, conn.port, op, target, query, extra)
        try:
            found = self._cache.get(key)
        except TypeError:   # an unhashable argument, which the method itself refuses
            return self._build(conn, op, target, query, extra)
        if found is None:
            if len(self._cache) >= CACHE_LIMIT:
                self._cache.clear()
            found = self._cache[key] = self._build(conn, op, target, query, extra)
        return found

    def _build(self, conn, op, target, query, extra):
        metric = {"db.system.name": SYSTEM}
        name = SYSTEM
        if op is not None:
            metric["db.operation.name"] = name = op
        if target is not None:
            name = "%s %s" % (op, target)
            if op == "call" or op.endswith(" call"):
                metric["db.stored_procedure.name"] = str(target)
            else:
                metric["db.collection.name"] = str(target)
        if conn is not None:
            host, port = _address(conn)
            metric["server.address"] = host
            if port is not None:
                metric["server.port"] = port
        span = dict(metric)
        span.update(extra)
        metric.update(item for item in extra if item[0] not in SPAN_ONLY)
        if query is not None:
            span["db.query.text"] = query
        if self.legacy:
            span["db.system"] = SYSTEM
            if op is not None:
                span["db.operation"] = op
            if query is not None:
                span["db.statement"] = query
            if "server.address" in span:
                span["net.peer.name"] = span["server.address"]
            if "server.port" in span:
                span["net.peer.port"] = span["server.port"]
        return name, span, metric

    @staticmethod
    def error_attributes(exc: BaseException) -> Dict[str, Any]:
        # (A NetworkError's code is the socket's errno, no box error code.)
        code = (getattr(exc, "code", None) if isinstance(exc, DatabaseError)
                and not isinstance(exc, NetworkError) else None)
        if isinstance(code, int) and code:
            return {"error.type": str(code), "db.response.status_code": str(code)}
        kind = type(exc)
        return {"error.type": "%s.%s" % (kind.__module__, kind.__qualname__)}

    # -- requests ----------------------------------------------------------------------

    def request(self, conn: Any, op: str, target: Any, call: Callable[..., Any],
                args: Tuple[Any, ...], kwargs: Dict[str, Any], query: Optional[str] = None,
                extra: Tuple[Tuple[str, Any], ...] = ()) -> Any:
        """One connection-level request: its own span, or an attempt of the
        pool's or router's request it is part of."""
        outer = _outer.get()
        if outer is not None:
            if type(outer) is _Call:
                outer.attempt(conn)
            return call(*args, **kwargs)
        name, attributes, metric = self.describe(conn, op, target, query, extra)
        if self.never or (self.parented and not _sampled_parent()):
            return self._timed(conn, metric, call, args, kwargs)
        span = self.tracer.start_span(name, kind=SpanKind.CLIENT, attributes=attributes)
        token = (otel_context.attach(trace.set_span_in_context(span))
                 if span.is_recording() else None)
        start = time.perf_counter()
        try:
            result = call(*args, **kwargs)
        except BaseException as exc:
            self._failed(span, metric, exc, time.perf_counter() - start, conn)
            raise
        else:
            self.duration.record(time.perf_counter() - start, metric)
            return result
        finally:
            if token is not None:
                otel_context.detach(token)
            span.end()

    def _timed(self, conn, metric, call, args, kwargs):
        """A request no span is recorded for: its duration alone."""
        start = time.perf_counter()
        try:
            result = call(*args, **kwargs)
        except BaseException as exc:
            self._failed(INVALID_SPAN, metric, exc, time.perf_counter() - start, conn)
            raise
        self.duration.record(time.perf_counter() - start, metric)
        return result

    def routed(self, op: str, target: Any, call: Callable[..., Any], args: Tuple[Any, ...],
               kwargs: Dict[str, Any], extra: Tuple[Tuple[str, Any], ...],
               after: Optional[Callable[[Any], Tuple[Tuple[str, Any], ...]]] = None,
               query: Optional[str] = None) -> Any:
        """A pool's or router's request: one span, naming the instance that
        answered (the last its requests went to)."""
        outer = _outer.get()
        if outer is not None:   # a router's pool (its span covers it), or quiet
            if type(outer) is _Call:
                outer.mode = extra
            return call(*args, **kwargs)
        push = kwargs.get("on_push")
        if push is not None:   # the caller's callback: its requests are its own
            kwargs = dict(kwargs, on_push=_outside(push))
        name, attributes, _ = self.describe(None, op, target, query, extra)
        span = self.tracer.start_span(name, kind=SpanKind.CLIENT, attributes=attributes)
        here = _Call(span)
        outer_token = _outer.set(here)
        token = (otel_context.attach(trace.set_span_in_context(span))
                 if span.is_recording() else None)
        start = time.perf_counter()
        error: Optional[BaseException] = None
        try:
            return call(*args, **kwargs)
        except BaseException as exc:
            error = exc
            raise
        finally:
            elapsed = time.perf_counter() - start
            if token is not None:
                otel_context.detach(token)
            _outer.reset(outer_token)
            more = here.mode + (after(error) if after is not None else ())
            _, attributes, metric = self.describe(here.conn, op, target, query, extra + more)
            if span.is_recording():
                span.set_attributes(attributes)
            if error is None:
                self.duration.record(elapsed, metric)
            else:
                self._failed(span, metric, error, elapsed, here.conn)
            span.end()

    def _failed(self, span, metric, exc, elapsed, conn):
        errors = self.error_attributes(exc)
        if span.is_recording():
            span.set_attributes(errors)
            # (The type only: a box error's message may quote the tuples.)
            span.set_status(Status(StatusCode.ERROR, errors["error.type"]))
        # (A call a gevent.Timeout or a kill cut is among the slowest: without it
        # the histogram's percentiles would look better than the calls were.)
        self.duration.record(elapsed, dict(metric, **errors))
        # (The conventions' count of timeouts getting a connection: a call whose
        # time ran out before it was written, connecting or in line for one of
        # max_in_flight's slots; one written and unanswered is the duration's.)
        if isinstance(exc, RequestTimeout) and applied(exc) is False and conn is not None:
            self.timeouts.add(1, {"db.client.connection.pool.name":
                                  monitoring.address_of(conn)})

    def batch(self, conn: Any, ops: List[Any], size: int, stream_id: Optional[int],
              start_ns: int, call: Callable[[], Any],
              failure: Callable[[], Optional[BaseException]]) -> Any:
        """A pipeline's wait: one span from its first queued request to its
        replies; ``ops``: the (operation, target) of its requests, None where
        not known.  A pipeline of one request is that request's own span (the
        conventions' batch has two or more).  ``failure()``, after a wait that
        returned: the first request's error when every request failed (the
        wait does not raise for them), else None."""
        names = {op for op, _ in ops}
        targets = {target for _, target in ops}
        op: Optional[str] = "BATCH"
        target = None
        if len(names) == 1 and None not in names:
            op = names.pop()
            target = targets.pop() if len(targets) == 1 else None
        extra: Tuple[Tuple[str, Any], ...] = ()
        if size != 1:
            op = op if op == "BATCH" else "BATCH %s" % op
            extra = (("db.operation.batch.size", size),)
        elif op == "BATCH":
            op = None   # one request of an unknown operation: named for the system
        if stream_id is not None:
            extra += (("tarantool.stream.id", stream_id),)
        name, attributes, metric = self._build(conn, op, target, None, extra)
        span = self.tracer.start_span(name, kind=SpanKind.CLIENT, attributes=attributes,
                                      start_time=start_ns)
        start = time.perf_counter()
        try:
            result = call()
        except BaseException as exc:
            self._failed(span, metric, exc, time.perf_counter() - start, conn)
            raise
        else:
            elapsed = time.perf_counter() - start
            failed = failure()
            if failed is None:
                self.duration.record(elapsed, metric)
            else:
                self._failed(span, metric, failed, elapsed, None)
            return result
        finally:
            span.end()

    # -- connection metrics ---------------------------------------------------------------

    def _count(self, options: CallbackOptions) -> List[Observation]:
        counts: Dict[Tuple[str, str], int] = {}
        for conn in self._live():
            transport = conn._transport
            if transport is None or transport.error is not None:
                continue
            state = "used" if transport.in_flight else "idle"
            key = (monitoring.address_of(conn), state)
            counts[key] = counts.get(key, 0) + 1
        return [Observation(count, {"db.client.connection.pool.name": name,
                                    "db.client.connection.state": state,
                                    "db.system.name": SYSTEM})
                for (name, state), count in counts.items()]

    def _pending(self, options: CallbackOptions) -> List[Observation]:
        pending: Dict[str, int] = {}
        for conn in self._live():
            transport = conn._transport
            if transport is not None and transport.error is None:
                name = monitoring.address_of(conn)
                pending[name] = pending.get(name, 0) + transport.in_flight
        return [Observation(count, {"db.client.connection.pool.name": name,
                                    "db.system.name": SYSTEM})
                for name, count in pending.items()]

    def _live(self) -> List[Any]:
        return list(_connection._live) if self.active else []

    # -- monitoring events as span events -----------------------------------------------

    def on_event(self, event: monitoring.Event) -> None:
        """A library event that happened in the caller's greenlet: an event on its span."""
        name = _SPAN_EVENTS.get(type(event))
        if name is None:
            return
        span = trace.get_current_span()
        if span.is_recording():
            attributes = {key: value for key, value in vars(event).items()
                          if key != "time" and value is not None}
            span.add_event(name, attributes, timestamp=int(event.time * 1e9))


_SPAN_EVENTS = {
    monitoring.ReconnectAttemptEvent: "gtarantool.reconnect_attempt",
    monitoring.WriteResentEvent: "gtarantool.writable_wait",
    monitoring.WriteReroutedEvent: "gtarantool.write_rerouted",
    monitoring.BucketMapCorrectedEvent: "gtarantool.bucket_moved",
}


# -- the wrappers, installed on the classes -------------------------------------------------

def _target(op: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    if op in SPACE_METHODS:
        return args[0] if args else kwargs.get("space_name")
    if op == "call":
        return args[0] if args else kwargs.get("func_name")
    return None


def _query(op: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[str]:
    if op == "execute":
        query = args[0] if args else kwargs.get("query")
        return query if isinstance(query, str) else None
    return None


def _connection_method(telemetry: _Telemetry, op: str, original: Callable[..., Any]) -> Any:
    def method(self, *args, **kwargs):
        if telemetry.idle:
            return original(self, *args, **kwargs)
        return telemetry.request(self, op, _target(op, args, kwargs), original,
                                 (self,) + args, kwargs, _query(op, args, kwargs))
    return _named(method, original)


def _stream_method(telemetry: _Telemetry, op: str, original: Callable[..., Any]) -> Any:
    def method(self, *args, **kwargs):
        return telemetry.request(self._conn, op, _target(op, args, kwargs), original,
                                 (self,) + args, kwargs, _query(op, args, kwargs),
                                 (("tarantool.stream.id", self.stream_id),))
    return _named(method, original)


def _statement_prepare(telemetry: _Telemetry, original: Callable[..., Any]) -> Any:
    def _prepare(self, *args, **kwargs):
        if _outer.get() is _EXECUTING:   # execute's own re-prepare, on a new session
            span = trace.get_current_span()
            if span.is_recording():
                span.add_event("gtarantool.reprepare")
            return original(self, *args, **kwargs)
        return telemetry.request(self._conn, "prepare", None, original, (self,) + args,
                                 kwargs, self.sql)
    return _named(_prepare, original)


def _statement_execute(telemetry: _Telemetry, original: Callable[..., Any]) -> Any:
    run = _with_outer(_EXECUTING, original)

    def execute(self, *args, **kwargs):
        return telemetry.request(self._conn, "execute", None, run, (self,) + args, kwargs,
                                 self.sql)
    return _named(execute, original)


def _pool_method(telemetry: _Telemetry, op: str, original: Any, default_mode: Any) -> Any:
    quiet = _quiet(original)

    def method(self, *args, **kwargs):
        if (op == "call" and "_otel_router" in self.__dict__ and _outer.get() is None
                and str(_target(op, args, kwargs)).startswith("vshard.storage.")):
            return quiet(self, *args, **kwargs)   # a router's own, in a greenlet it spawned
        mode = kwargs.get("mode", default_mode)
        return telemetry.routed(op, _target(op, args, kwargs), original, (self,) + args,
                                kwargs, (("tarantool.pool.mode", getattr(mode, "name",
                                                                         str(mode))),),
                                query=_query(op, args, kwargs))
    return _named(method, getattr(original, "__wrapped__", original))


def _router_method(telemetry: _Telemetry, original: Callable[..., Any]) -> Any:
    def method(self, *args, **kwargs):
        # (Read as the method's own signature does, leaving a wrong call to it.)
        bucket_id = args[0] if args else kwargs.get("bucket_id")
        func = args[1] if len(args) > 1 else kwargs.get("func")

        def after(error):
            rs = None
            if type(bucket_id) is int and 0 < bucket_id <= self.bucket_count:
                rs = self._routes[bucket_id]
            rs_id = getattr(error, "replicaset", None)
            if rs_id is not None:
                rs = self.replicasets.get(rs_id)
            name = rs.name if rs is not None else rs_id
            return (() if name is None else (("tarantool.vshard.replicaset", str(name)),))
        return telemetry.routed("call", func, original, (self,) + args, kwargs,
                                (("tarantool.vshard.bucket_id", bucket_id),
                                 ("tarantool.vshard.method", original.__name__)), after)
    return _named(method, original)


def _router_map(telemetry: _Telemetry, original: Callable[..., Any]) -> Any:
    def map_callrw(self, *args, **kwargs):
        func = args[0] if args else kwargs.get("func")
        return telemetry.routed("call", func, original, (self,) + args, kwargs,
                                (("tarantool.vshard.method", original.__name__),))
    return _named(map_callrw, original)


def _router_own(original: Callable[..., Any]) -> Any:
    """A router's method making its own requests (discovery, a bucket search, a
    map's stages), quiet; its replica sets' pools are marked as the router's,
    as the greenlets it spawns for them carry no context: such a pool's
    ``vshard.storage`` calls outside a router's call are then the router's own."""
    quiet = _quiet(original)

    def own(self, *args, **kwargs):
        for rs in self.replicasets.values():
            rs.pool._otel_router = True
        return quiet(self, *args, **kwargs)
    return _named(own, original)


def _queued(pipeline: Any, op: Optional[str], target: Any, count: int) -> None:
    """Count ``count`` requests of ``op`` (None: unknown) on ``target`` in
    ``pipeline``'s batch, which its next wait reports."""
    batch = pipeline.__dict__.get("_otel_batch")
    if batch is None:
        batch = pipeline._otel_batch = [time.time_ns(), {}]
    key = (op, target)
    batch[1][key] = batch[1].get(key, 0) + count


def _pipeline_method(op: str, original: Callable[..., Any]) -> Any:
    def method(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        _queued(self, op, _target(op, args, kwargs), 1)
        return result
    return _named(method, original)


def _pipeline_select_many(original: Callable[..., Any]) -> Any:
    def select_many(self, space_name, keys, **kwargs):
        self._otel_counting = False   # (the send_frames it makes is counted here)
        try:
            places = original(self, space_name, keys, **kwargs)
        finally:
            self._otel_counting = True
        _queued(self, "select", space_name, len(places))
        return places
    return _named(select_many, original)


def _pipeline_send_frames(original: Callable[..., Any]) -> Any:
    def send_frames(self, frames, first_sync, count, check_only=False, code=None):
        index = original(self, frames, first_sync, count, check_only, code)
        if self.__dict__.get("_otel_counting", True):
            _queued(self, REQUEST_NAMES.get(code), None, count)
        return index
    return _named(send_frames, original)


def _pipeline_wait(telemetry: _Telemetry, original: Callable[..., Any]) -> Any:
    def wait(self):
        batch = self.__dict__.pop("_otel_batch", None)
        if batch is None:
            return original(self)
        stream = self._stream
        size = sum(batch[1].values())
        return telemetry.batch(self._conn, list(batch[1]), size,
                               None if stream is None else stream.stream_id, batch[0],
                               lambda: original(self), lambda: _all_failed(self, size))
    return _named(wait, original)


def _all_failed(pipeline: Any, size: int) -> Optional[BaseException]:
    """The first error of ``pipeline``'s last ``size`` requests when each of
    them failed (an error reply, or the exception it holds), else None."""
    sink = pipeline._sink
    syncs = sink.syncs[-size:] if size > 0 else []
    replies = sink.replies
    for sync in syncs:
        reply = replies.get(sync)
        if reply is None or reply is CHECKED or (type(reply) is tuple and not reply[0]):
            return None
    if not syncs:
        return None
    conn = pipeline._conn
    first = responses(conn, conn._decoder, syncs[:1], replies, code_of=pipeline._codes)[0]
    return first if isinstance(first, BaseException) else None


def _with_outer(value: Any, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run with the ``_outer`` context variable set to ``value``."""
    def run(*args, **kwargs):
        token = _outer.set(value)
        try:
            return fn(*args, **kwargs)
        finally:
            _outer.reset(token)
    return run


def _outside(push: Callable[..., Any]) -> Callable[..., Any]:
    """``push`` (a caller's on_push) run outside the request that calls it."""
    return _with_outer(None, push)


def _quiet(original: Callable[..., Any]) -> Any:
    """``original`` with the requests it makes itself left out: a connect's
    authentication and schema, a schema's fetches, a pool's role checks."""
    return _named(_with_outer(_QUIET, original), original)


def _named(wrapper: Any, original: Any) -> Any:
    wrapper.__name__ = getattr(original, "__name__", wrapper.__name__)
    wrapper.__qualname__ = getattr(original, "__qualname__", wrapper.__qualname__)
    wrapper.__doc__ = getattr(original, "__doc__", None)
    wrapper.__wrapped__ = original
    return wrapper


class GtarantoolInstrumentor(BaseInstrumentor):
    """Spans and metrics for every gtarantool connection, pool and router.

    ``instrument(tracer_provider=None, meter_provider=None)`` (the global
    providers by default) starts them, for objects made before and after the
    call; ``uninstrument()`` stops them everywhere.  Registered under the
    ``opentelemetry_instrumentor`` entry point, so ``opentelemetry-instrument``
    finds it.
    """

    _telemetry: Optional[_Telemetry] = None
    _patched: List[Tuple[Any, str, Any]] = []

    def instrumentation_dependencies(self) -> Collection[str]:
        """The packages and versions this instruments: gtarantool's."""
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        tracer_provider = kwargs.get("tracer_provider") or trace.get_tracer_provider()
        tracer = trace.get_tracer(__name__, gtarantool.__version__, tracer_provider,
                                  schema_url=SCHEMA_URL)
        meter = get_meter(__name__, gtarantool.__version__, kwargs.get("meter_provider"),
                          schema_url=SCHEMA_URL)
        telemetry = _Telemetry(tracer, meter, _sampler_of(tracer_provider))
        self._telemetry = telemetry
        self._patched = []
        for op in DATA_METHODS:
            self._patch(Connection, op, _connection_method(telemetry, op, getattr(Connection, op)))
        for op in filter(functools.partial(hasattr, Stream), STREAM_METHODS):
            self._patch(Stream, op, _stream_method(telemetry, op, getattr(Stream, op)))
        self._patch(PreparedStatement, "_prepare", _statement_prepare(
            telemetry, PreparedStatement._prepare))
        self._patch(PreparedStatement, "execute", _statement_execute(
            telemetry, PreparedStatement.execute))
        for op in filter(functools.partial(hasattr, Pipeline), DATA_METHODS):
            self._patch(Pipeline, op, _pipeline_method(op, getattr(Pipeline, op)))
        self._patch(Pipeline, "select_many", _pipeline_select_many(Pipeline.select_many))
        self._patch(Pipeline, "send_frames", _pipeline_send_frames(Pipeline.send_frames))
        self._patch(Pipeline, "wait", _pipeline_wait(telemetry, Pipeline.wait))
        for op in DATA_METHODS:
            original = ConnectionPool.__dict__[op]
            spec = getattr(original, "__wrapped__", original)
            mode = (spec.__kwdefaults__ or {}).get("mode")
            self._patch(ConnectionPool, op, _pool_method(telemetry, op, original, mode))
        self._patch(Connection, "connect", _quiet(Connection.connect))
        # (tarantool-python's Schema, which gtarantool's connections use: its
        # fetches are a connection's select of _vspace and _vindex.)
        for name in ("fetch_space_from", "fetch_index_from"):
            self._patch(Schema, name, _quiet(getattr(Schema, name)))
        self._patch(roles, "_check", _quiet(roles._check))
        for name in ROUTER_METHODS:
            self._patch(Router, name, _router_method(telemetry, getattr(Router, name)))
        self._patch(Router, "map_callrw", _router_map(telemetry, Router.map_callrw))
        for name in ROUTER_OWN:
            self._patch(Router, name, _router_own(getattr(Router, name)))
        monitoring.register(telemetry.on_event)

    def _patch(self, cls: Any, name: str, wrapper: Any) -> None:
        self._patched.append((cls, name, cls.__dict__.get(name, _INHERITED)))
        setattr(cls, name, wrapper)

    def _uninstrument(self, **kwargs: Any) -> None:
        for cls, name, original in reversed(self._patched):
            if original is _INHERITED:
                delattr(cls, name)
            else:
                setattr(cls, name, original)
        self._patched = []
        telemetry, self._telemetry = self._telemetry, None
        if telemetry is not None:
            telemetry.active = False
            monitoring.unregister(telemetry.on_event)


_INHERITED = object()
