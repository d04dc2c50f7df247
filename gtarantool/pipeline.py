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
import gc
from contextlib import contextmanager

import gevent
from gevent import Timeout
from gevent.hub import Waiter
from gevent.monkey import get_original

from gtarantool.api import RequestMethods
from gtarantool.errors import RequestTimeout
from gtarantool.protocol import Response, make_response, ok_response

_get_ident = get_original("_thread", "get_ident")
# Let the writer send after this many queued requests even if no slot wait
# has yielded yet, so the first replies come back while we keep queueing.
YIELD_EVERY = 256


@contextmanager
def _gc_paused():
    """Building thousands of results in one go, with no greenlet switch in
    between, would make the cyclic collector rescan the heap again and again
    (a third of the CPU time, measured); pause it for that loop only."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class Pipeline(RequestMethods):
    """Queue requests with the connection's methods; ``results()`` waits for all."""

    def __init__(self, conn):
        self._conn = conn
        self._encoder = conn._encoder
        self._spaces = conn._spaces
        self._indexes = conn._indexes
        self._sync_ids = conn._syncs
        self._syncs = []            # in request order
        self._replies = {}          # sync -> reply tuple (body undecoded) or exception
        self._outstanding = 0
        self._waiter = None
        self._next_yield = YIELD_EVERY

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

    def _request(self, code, body, on_push=None, on_push_ctx=None):
        conn = self._conn
        transport = conn._transport   # as in Connection._request: a call less per request
        if transport is None or transport.error is not None or conn._owner != _get_ident():
            transport = conn._ensure_connected()
        sync = next(self._sync_ids)
        transport.send(sync, code, 0, body, self)
        syncs = self._syncs
        syncs.append(sync)
        self._outstanding += 1
        if len(syncs) >= self._next_yield:
            self._next_yield += YIELD_EVERY
            gevent.sleep(0)
        return len(syncs) - 1

    def switch(self, value):
        """Called in the hub by the transport with each reply, or with the
        error that failed the connection (once per request still waiting)."""
        if not self._outstanding:
            return   # given up (timeout): late replies change nothing
        if type(value) is tuple:
            self._replies[value[0]] = value
            self._outstanding -= 1
            if self._outstanding:
                return
        else:
            for sync in self._syncs:
                self._replies.setdefault(sync, value)
            self._outstanding = 0
        if self._waiter is not None:
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
        for sync in self._syncs:
            if sync not in self._replies:
                if transport is not None:
                    transport.abandon(sync)
                self._replies[sync] = exc
        self._outstanding = 0

    def results(self):
        """Every reply in request order: a Response, or the exception it raised."""
        try:
            self.wait()
        except RequestTimeout:
            pass  # each unanswered request holds its RequestTimeout
        with _gc_paused():
            conn = self._conn
            values = [self._replies[sync] for sync in self._syncs]
            bodies = [v[3] for v in values if type(v) is tuple]
            bodies = iter(conn._decoder.decode_all(bodies))
            out = []
            for sync, value in zip(self._syncs, values):
                if type(value) is tuple:
                    body = next(bodies)
                    code = value[1]
                    try:
                        if not code and type(body) is dict:
                            value = ok_response(conn, sync, value[2], body)
                        else:
                            value = make_response(Response, conn, sync, code, value[2], body)
                    except Exception as exc:  # noqa: BLE001 - returned in its place
                        value = exc
                out.append(value)
            return out

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.wait()
