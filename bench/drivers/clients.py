"""The clients under test, each behind the same small interface used by the worker:

``open()`` connects (and loads the schema, so no schema request falls into a measured phase),
``run(phase, recorder, started=None)`` keeps exactly ``concurrency`` requests going until the
phase runs out (``started()``, when given, is called once every worker exists and before the
first request: where a measurement of the requests alone starts), ``counters()`` returns the
connection's socket counters (or None), ``close()``.

Client libraries are imported inside the driver that uses them: gevent only ever gets imported
in a gtarantool worker process, never in the parent.
"""
import collections
import itertools
import threading
import time

import msgpack
import tarantool
from tarantool.msgpack_ext.unpacker import ext_hook as unpacker_ext_hook

from bench.core.openloop import (
    LockedOpenRecorder,
    OpenPhase,
    OpenRecorder,
    serve_open,
    serve_open_async,
)
from bench.core.recorder import LockedRecorder, Recorder
from bench.core.workloads import DUPLICATE_KEY, ER_TUPLE_FOUND, SERVER_ERROR, Payloads, check
from bench.drivers import operations

UPDATE_OPS = [("+", 1, 1)]  # counter field (0-based field number, as iproto takes it)


def error_kind(exc, server_error):
    """The kind an exception is counted as: an error the server answered with (an exception
    of exactly the class ``server_error``) by its code, anything else by its class name."""
    if type(exc) is server_error:
        return DUPLICATE_KEY if exc.code == ER_TUPLE_FOUND else "%s_%d" % (SERVER_ERROR, exc.code)
    return type(exc).__name__


def serve(take, recorder, calls, payloads, server_error, go=None):
    """One request at a time until ``take()`` runs dry: the body of every greenlet and thread
    (after ``go()`` returns, when given).

    This loop's cost is part of every driver's figures, so the usual case (a correct answer
    within the recorder's current interval) is checked and counted here, without calls; the
    rest goes through ``check`` and ``recorder.record``."""
    clock = time.monotonic
    record, latency, interval = recorder.record, recorder.latency, recorder.interval
    shared = recorder.shared
    expected, spread = payloads.table, payloads.SPREAD
    if go is not None:
        go()
    while True:
        item = take()
        if item is None:
            return
        op, key = item
        t0 = clock()
        try:
            rows = calls[op](key)
        except Exception as exc:  # a failed request is a counted result, not a dead worker
            record(op, t0, clock(), error_kind(exc, server_error))
            continue
        t1 = clock()
        if (shared or t1 >= recorder.next_tick or not rows or rows[0][0] != key
                or rows[0][2] != expected[key % spread]):
            record(op, t0, t1, check(op, key, rows, payloads))
            continue
        us = int((t1 - t0) * 1e6)
        counts = latency[op]
        counts[us] = counts.get(us, 0) + 1
        interval[op] += 1


async def serve_async(take, recorder, calls, payloads, server_error, go=None):
    """``serve`` for asyncio tasks: the same loop, awaiting the call (a helper shared by
    the two would put a Python call back on every request, and a coroutine wrapping it
    would put a frame on every resumption: hence ``go`` here too)."""
    clock = time.monotonic
    record, latency, interval = recorder.record, recorder.latency, recorder.interval
    expected, spread = payloads.table, payloads.SPREAD
    if go is not None:
        await go()
    while True:
        item = take()
        if item is None:
            return
        op, key = item
        t0 = clock()
        try:
            rows = await calls[op](key)
        except Exception as exc:  # a failed request is a counted result, not a dead worker
            record(op, t0, clock(), error_kind(exc, server_error))
            continue
        t1 = clock()
        if (t1 >= recorder.next_tick or not rows or rows[0][0] != key
                or rows[0][2] != expected[key % spread]):
            record(op, t0, t1, check(op, key, rows, payloads))
            continue
        us = int((t1 - t0) * 1e6)
        counts = latency[op]
        counts[us] = counts.get(us, 0) + 1
        interval[op] += 1


def tarantool_calls(conn, space, payloads):
    """op -> function(key) -> list of tuples, for tarantool-python and its subclasses."""
    return {
        "insert": lambda key: conn.insert(space, (key, 0, payloads(key))).data,
        "select": lambda key: conn.select(space, key).data,
        "update": lambda key: conn.update(space, key, UPDATE_OPS).data,
        "delete": lambda key: conn.delete(space, key).data,
    }


class CountingSocket:
    """Stands in for a tarantool-python connection's socket and counts the calls made on it,
    since tarantool-python keeps no counters of its own.  (Its per-request liveness probe is a
    raw libc ``recv`` through ctypes and is not seen here.)"""

    def __init__(self, sock):
        self._sock = sock
        self.send_calls = self.recv_calls = self.bytes_out = self.bytes_in = 0

    def send(self, data):
        self.send_calls += 1
        sent = self._sock.send(data)
        self.bytes_out += sent
        return sent

    def sendall(self, data):
        self.send_calls += 1
        self._sock.sendall(data)
        self.bytes_out += len(data)

    def recv(self, size, *flags):
        self.recv_calls += 1
        data = self._sock.recv(size, *flags)
        self.bytes_in += len(data)
        return data

    def __getattr__(self, name):
        return getattr(self._sock, name)

    def counters(self):
        return {"send_calls": self.send_calls, "recv_calls": self.recv_calls,
                "bytes_out": self.bytes_out, "bytes_in": self.bytes_in}


def _unpacker_factory(conn):
    """tarantool-python's own unpacker (``tarantool.response.unpacker_factory``, the
    same settings and cost per reply) except that a string that is not UTF-8 is
    decoded with escapes instead of raising: since 2.10, error messages quote
    tuples, bytes fields raw ("Duplicate key exists ... "), and the workload's
    payloads are bytes.  The bench must count that reply as the server's error,
    as box.stat does."""
    kwargs = {"use_list": conn.use_list, "raw": False, "strict_map_key": False,
              "unicode_errors": "backslashreplace"}

    def ext_hook(code, data):
        return unpacker_ext_hook(code, data, msgpack.Unpacker(**kwargs))
    kwargs["ext_hook"] = ext_hook
    return msgpack.Unpacker(**kwargs)


def phase_calls(calls, phase, extra):
    """``calls`` for ``phase``: a run phase over records (``phase.window``) acknowledges
    each insert to its window once answered, and adds the operations beyond the four
    (``extra(ops, window)`` -> ``{op: call}``)."""
    window = getattr(getattr(phase, "phase", phase), "window", None)
    if window is None:
        return calls
    insert, ack = calls["insert"], window.ack

    def acknowledged(key):
        rows = insert(key)
        ack(key)
        return rows
    return dict(calls, insert=acknowledged, **extra(window))


def async_phase_calls(calls, phase, extra):
    """``phase_calls`` for coroutines."""
    window = getattr(getattr(phase, "phase", phase), "window", None)
    if window is None:
        return calls
    insert, ack = calls["insert"], window.ack

    async def acknowledged(key):
        rows = await insert(key)
        ack(key)
        return rows
    return dict(calls, insert=acknowledged, **extra(window))


class Driver:
    recorder_class = Recorder
    open_recorder_class = OpenRecorder
    # tarantool-python raises exactly this class for an error response; its subclasses
    # (NetworkError, SchemaError, ...) are client-side failures.
    server_error = tarantool.error.DatabaseError
    kind = "tarantool"      # which calls bench.drivers.operations makes for it

    def __init__(self, config, host, port):
        self.config = config
        self.host, self.port = host, port
        self.concurrency = config.concurrency
        self.payloads = Payloads(config.size, config.seed)
        self.requests = collections.Counter()   # what tx and scan sent, by box.stat name

    def error_kind(self, exc):
        return error_kind(exc, self.server_error)

    def _calls(self, conn, calls, phase, recorder=None):
        ops = [op for op, n in self.config.mix.items() if n]
        return phase_calls(calls, phase, lambda window: operations.extra_calls(
            self.kind, conn, self.config, window, self.requests, ops, recorder))

    def _tarantool_connection(self):
        conn = tarantool.Connection(self.host, self.port, user=self.config.user,
                                    password=self.config.password,
                                    unpacker_factory=_unpacker_factory)
        conn._socket = CountingSocket(conn._socket)
        return conn


class SyncDriver(Driver):
    """tarantool-python, one blocking call at a time."""

    def open(self):
        self.conn = self._tarantool_connection()
        self.calls = tarantool_calls(self.conn, self.config.space, self.payloads)

    def run(self, phase, recorder, started=None):
        calls = self._calls(self.conn, self.calls, phase, recorder)
        if started is not None:
            started()
        if isinstance(phase, OpenPhase):
            serve_open(phase.take, recorder, calls, self.payloads, self.error_kind,
                       time.sleep)
        else:
            serve(phase.take, recorder, calls, self.payloads, self.server_error)

    def counters(self):
        return self.conn._socket.counters()

    def close(self):
        self.conn.close()


class ThreadsDriver(Driver):
    """tarantool-python, ``greenlets`` threads with a connection each."""

    recorder_class = LockedRecorder
    open_recorder_class = LockedOpenRecorder

    def open(self):
        self.conns = [self._tarantool_connection() for _ in range(self.concurrency)]

    def run(self, phase, recorder, started=None):
        lock = threading.Lock()

        def take():
            with lock:  # a generator must not be resumed by two threads at once
                return phase.take()

        def calls(conn):
            return self._calls(conn, tarantool_calls(conn, self.config.space, self.payloads),
                               phase, recorder)
        if isinstance(phase, OpenPhase):
            threads = [threading.Thread(name="worker-%d" % i, target=serve_open, args=(
                take, recorder, calls(conn), self.payloads, self.error_kind, time.sleep))
                for i, conn in enumerate(self.conns)]
        else:
            threads = [threading.Thread(name="worker-%d" % i, target=serve, args=(
                take, recorder, calls(conn), self.payloads, self.server_error))
                for i, conn in enumerate(self.conns)]
        if started is not None:
            started()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def counters(self):
        total = {}
        for conn in self.conns:
            for name, value in conn._socket.counters().items():
                total[name] = total.get(name, 0) + value
        return total

    def close(self):
        for conn in self.conns:
            conn.close()


class GeventDriver(Driver):
    """gtarantool: ``greenlets`` greenlets sharing one connection.  A load phase
    (``--records``) goes through ``gtarantool.copy.copy_from`` (:func:`copy_load`)."""

    kind = "gtarantool"
    copy_load = True     # a load phase through copy_from (not over a router)
    copy_info = None     # the space as copy_from needs it, read before any phase

    def open(self):
        import gtarantool
        self.conn = gtarantool.connect(self.host, self.port, user=self.config.user,
                                       password=self.config.password,
                                       lazy_errors=self.config.lazy_errors)
        if self.config.lazy_errors:   # what it raises for a server error until read
            self.server_error = gtarantool.LazyDatabaseError
        self.calls = tarantool_calls(self.conn, self.config.space, self.payloads)
        self.copy_info = self._copy_info(self.conn)

    def _copy_info(self, target):
        """The space's ``SpaceInfo`` for a workload with a load phase (read now:
        its selects are not the load phase's), or None: the load goes request
        by request."""
        if not self.copy_load or self.config.workload == "phases":
            return None
        from gtarantool.copy import space_info
        return space_info(target, self.config.space)

    def run(self, phase, recorder, started=None):
        if phase.name == "load" and self.copy_info is not None \
                and not isinstance(phase, OpenPhase):
            copy_load(self.client(), self.copy_info, phase, recorder, self.payloads, started)
            return
        import gevent
        from gevent.event import Event
        go = Event()
        calls = self._calls(self.client(), self.calls, phase, recorder)
        if isinstance(phase, OpenPhase):
            greenlets = [gevent.spawn(serve_open, phase.take, recorder, calls,
                                      self.payloads, self.error_kind, gevent.sleep, go.wait)
                         for _ in range(self.concurrency)]
        else:
            greenlets = [gevent.spawn(serve, phase.take, recorder, calls, self.payloads,
                                      self.server_error, go.wait)
                         for _ in range(self.concurrency)]
        for i, glet in enumerate(greenlets):
            glet.name = "worker-%d" % i          # what profiles and tracebacks show
        gevent.sleep(0)   # every worker starts and waits for go
        if started is not None:
            started()
        go.set()
        gevent.joinall(greenlets, raise_error=True)

    def client(self):
        """What the operations beyond the four are sent on."""
        return self.conn

    def counters(self):
        return self.conn.stats.as_dict()

    def close(self):
        self.conn.close()


LOAD_SLICE = 50000   # rows per copy_from call of a load phase


def copy_load(target, info, phase, recorder, payloads, started=None):
    """A load phase's inserts through ``gtarantool.copy.copy_from``: pipelined
    batches, ``LOAD_SLICE`` rows per call.  Each row counts as one insert whose
    latency is the time of the call that wrote it; a row the server refused
    counts as that error (a duplicate key ...), as a single insert's would."""
    from tarantool.error import DatabaseError, NetworkError

    from gtarantool.copy import CopyError, copy_from

    clock = time.monotonic
    items = iter(phase.take, None)
    if started is not None:
        started()
    while True:
        rows = [(key, 0, payloads(key)) for _, key in itertools.islice(items, LOAD_SLICE)]
        if not rows:
            return
        t0 = clock()
        try:
            report = copy_from(target, info.id, rows, mode="insert", info=info)
            unsettled, cause = 0, None
        except CopyError as exc:   # the server stayed away: the rest count as its error
            report = exc.report
            unsettled = len(rows) - report.written - len(report.rejected)
            cause = type(exc.__cause__ or exc).__name__
        t1 = clock()
        for r in report.rejected:
            code = getattr(r.error, "code", None)
            if isinstance(r.error, DatabaseError) and not isinstance(r.error, NetworkError) \
                    and isinstance(code, int) and code:
                kind = DUPLICATE_KEY if code == ER_TUPLE_FOUND else "%s_%d" % (SERVER_ERROR,
                                                                               code)
            else:
                kind = type(r.error).__name__ if r.error is not None else "encode"
            recorder.record("insert", t0, t1, kind)
        for _ in range(unsettled):
            recorder.record("insert", t0, t1, cause)
        if report.written:
            # the first through record() (it starts a new interval when one is due),
            # the rest as serve() counts a correct answer
            recorder.record("insert", t0, t1, None)
            us = int((t1 - t0) * 1e6)
            latency = recorder.latency["insert"]
            latency[us] = latency.get(us, 0) + report.written - 1
            recorder.interval["insert"] += report.written - 1


class AsynctntDriver(Driver):
    """asynctnt: ``greenlets`` asyncio tasks on one connection, on uvloop when installed."""

    kind = "asynctnt"

    def open(self):
        import asyncio

        import asynctnt
        self.server_error = asynctnt.exceptions.TarantoolDatabaseError
        try:
            import uvloop
            self.loop = uvloop.new_event_loop()
        except ImportError:
            self.loop = asyncio.new_event_loop()
        self.conn = asynctnt.Connection(host=self.host, port=self.port,
                                        username=self.config.user,
                                        password=self.config.password)
        self.loop.run_until_complete(self.conn.connect())
        conn, space, payloads = self.conn, self.config.space, self.payloads
        # asynctnt responses are sequences of tuples already: check() reads them as they are.
        self.calls = {
            "insert": lambda key: conn.insert(space, [key, 0, payloads(key)]),
            "select": lambda key: conn.select(space, [key]),
            "update": lambda key: conn.update(space, [key], UPDATE_OPS),
            "delete": lambda key: conn.delete(space, [key]),
        }

    def run(self, phase, recorder, started=None):
        import asyncio

        ops = [op for op, n in self.config.mix.items() if n]
        calls = async_phase_calls(self.calls, phase, lambda window: operations.extra_calls(
            self.kind, self.conn, self.config, window, self.requests, ops, recorder))

        async def main():
            go = asyncio.Event()
            if isinstance(phase, OpenPhase):
                tasks = [asyncio.ensure_future(serve_open_async(
                    phase.take, recorder, calls, self.payloads, self.error_kind, go.wait))
                    for _ in range(self.concurrency)]
            else:
                tasks = [asyncio.ensure_future(serve_async(phase.take, recorder, calls,
                                                           self.payloads, self.server_error,
                                                           go.wait))
                         for _ in range(self.concurrency)]
            await asyncio.sleep(0)   # every task starts and waits for go
            if started is not None:
                started()
            go.set()
            await asyncio.gather(*tasks)
        self.loop.run_until_complete(main())

    def counters(self):
        return None

    def close(self):
        self.loop.run_until_complete(self.conn.disconnect())
        self.loop.close()
