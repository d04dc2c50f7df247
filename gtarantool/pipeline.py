"""Pipelining: one greenlet sends many requests and collects the replies later.

::

    with conn.pipeline() as p:
        for i in range(10000):
            p.insert("tester", (i, "x"))
    for reply in p.results():
        ...   # a Response, or the exception that request raised, in request order

Each request is encoded and queued at once (the writer greenlet sends them in
large batches); replies are stored by the reader's callbacks without waking
the pipeline's greenlet, which wakes once, when the last reply is in.  Every
queued request holds one of the connection's ``max_in_flight`` slots until its
reply arrives, so a long pipeline waits for room instead of growing memory.

Differences from single calls: ``on_push`` messages are dropped, and requests
are sent without a schema version (as tarantool-python does), so a schema
change does not make them fail with error 109.
"""
import gevent
from gevent import Timeout
from gevent.hub import Waiter
from tarantool.response import Response

from gtarantool.api import RequestMethods
from gtarantool.errors import RequestTimeout
from gtarantool.protocol import frame, make_response

# Let the writer send after this many queued requests even if no slot wait
# has yielded yet, so the first replies come back while we keep queueing.
YIELD_EVERY = 256


class _Reply:
    """A pending-table entry: stores the raw reply when the hub delivers it."""

    __slots__ = ("pipeline", "value")

    def __init__(self, pipeline):
        self.pipeline = pipeline
        self.value = None

    def switch(self, value):
        self.value = value
        self.pipeline._arrived()


class Pipeline(RequestMethods):
    """Queue requests with the connection's methods; ``results()`` waits for all."""

    def __init__(self, conn):
        self._conn = conn
        self._entries = []          # (sync, _Reply, response class)
        self._outstanding = 0
        self._waiter = None
        self._queued_since_yield = 0

    # What RequestMethods needs, borrowed from the connection.
    @property
    def schema(self):
        return self._conn.schema

    @property
    def call_16(self):
        return self._conn.call_16

    def _schemaful_connection_check(self):
        self._conn._schemaful_connection_check()

    def _ops_process(self, space, ops):
        return self._conn._ops_process(space, ops)

    def _request(self, code, body, on_push=None, on_push_ctx=None, response_class=Response):
        conn = self._conn
        transport = conn._ensure_connected()
        payload = conn._packer.pack(body) if body is not None else b""
        conn._slots.acquire()
        sync = next(conn._syncs)
        reply = _Reply(self)
        try:
            transport.send(sync, frame(code, sync, 0, payload), reply)
        except BaseException:
            conn._slots.release()
            raise
        self._entries.append((sync, reply, response_class))
        self._outstanding += 1
        self._queued_since_yield += 1
        if self._queued_since_yield >= YIELD_EVERY:
            self._queued_since_yield = 0
            gevent.sleep(0)
        return len(self._entries) - 1

    def _arrived(self):
        self._conn._slots.release()
        self._outstanding -= 1
        if self._outstanding == 0 and self._waiter is not None:
            self._waiter.switch(None)

    def wait(self):
        """Block until every queued request has its reply (or error).

        Honours the connection's ``request_timeout`` for the whole wait: on
        expiry it raises ``RequestTimeout``, which also becomes the result of
        each request still unanswered."""
        if self._outstanding == 0:
            return
        conn = self._conn
        self._waiter = Waiter()
        timer = Timeout._start_new_or_dummy(conn.request_timeout)
        try:
            self._waiter.get()
        except BaseException as exc:
            if exc is not timer:
                self._give_up(exc)
                raise
            error = RequestTimeout("pipeline: no reply within request_timeout=%ss"
                                   % conn.request_timeout)
            self._give_up(error)
            raise error from None
        finally:
            timer.close()
            self._waiter = None

    def _give_up(self, exc):
        transport = self._conn._transport
        for sync, reply, _ in self._entries:
            if reply.value is None:
                if transport is not None:
                    transport.abandon(sync)
                reply.value = exc
                self._conn._slots.release()
        self._outstanding = 0

    def results(self):
        """Every reply in request order: a Response, or the exception it raised."""
        try:
            self.wait()
        except RequestTimeout:
            pass  # each unanswered request holds its RequestTimeout
        conn = self._conn
        out = []
        for sync, reply, response_class in self._entries:
            value = reply.value
            if type(value) is tuple:
                code, schema, body, _pushes = value
                try:
                    value = make_response(response_class, conn, sync, code, schema, body,
                                          conn._unpack)
                except Exception as exc:  # noqa: BLE001 - returned in its place
                    value = exc
            out.append(value)
        return out

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.wait()
