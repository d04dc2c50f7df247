"""Pipelining: one greenlet sends many requests and collects the replies later.

::

    with conn.pipeline() as p:
        for i in range(10000):
            p.insert("tester", (i, "x"))
    for reply in p.results():
        ...   # a Response, or the exception that request raised, in request order

Every request handed over holds one of the connection's ``max_in_flight``
slots until its reply arrives, so a long pipeline waits for room instead of
growing memory (how it travels: "Pipelines" in docs/design.rst).

Differences from single calls: ``on_push`` messages are dropped, and requests
are sent without a schema version (as tarantool-python does), so a schema
change does not make them fail with error 109.
"""
from __future__ import annotations

import bisect
import gc
import itertools
import operator
import time
from contextlib import contextmanager
from typing import Any, List, Optional, Tuple

import gevent
from gevent import Timeout
from gevent.hub import Waiter
from gevent.lock import Semaphore
from tarantool.error import NetworkError

from gtarantool.api import ConnectionRequestMethods
from gtarantool.errors import RequestTimeout, not_sent
from gtarantool.protocol.constants import REQUEST_TYPE_SELECT
from gtarantool.protocol.responses import responses
from gtarantool.transport import (
    CHECKED,
    CopiedCall,
    Draining,
    ReplySink,
    check_process,
    process_token,
)

# ``conn`` (a Connection) and ``stream`` (a Stream) are annotated Any: both
# modules import this one, which imports nothing of them, not even for the
# type checker.

# Requests go to the transport in batches of this many (and when the replies
# are awaited), each batch followed by a yield, so the first replies come back
# while we keep queueing.
BATCH = 256


class RequestCodes:
    """A pipeline's request types by sync, for the errors its replies raise
    (``errors.refused``: a single-statement request's refusal was not applied).
    Kept per batch of consecutive syncs, nothing per request; a request sent
    by ``send_frames`` without its ``code`` has None."""

    __slots__ = ("_firsts", "_codes")

    def __init__(self) -> None:
        self._firsts: List[int] = []   # each batch's first sync, in order
        self._codes: List[Any] = []    # its requests' types: a list, or (type, count)

    def add(self, first: int, codes: Any) -> None:
        # (not always after the last: take_syncs() may run before a flush)
        k = bisect.bisect_right(self._firsts, first)
        self._firsts.insert(k, first)
        self._codes.insert(k, codes)

    def __call__(self, sync: int) -> Optional[int]:
        k = bisect.bisect_right(self._firsts, sync) - 1
        if k < 0:
            return None
        codes, offset = self._codes[k], sync - self._firsts[k]
        if type(codes) is tuple:
            return codes[0] if offset < codes[1] else None
        return codes[offset] if offset < len(codes) else None


@contextmanager
def _gc_paused():
    """Building thousands of results in one go, with no greenlet switch in
    between, would make the cyclic collector rescan the heap again and again
    for nothing; pause it for that loop only."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class Pipeline(ConnectionRequestMethods):
    """Queue requests with the connection's methods; ``results()`` waits for all.

    Each data method (insert, select, ...) encodes its request and queues it,
    returning the request's place in :meth:`results`; it raises what the
    connection's does for bad arguments or an unknown space, and no request
    is queued then.  The request that fills a batch hands it over, and raises
    ``NetworkError`` when the connection cannot be (re)established (the
    batch's requests hold it as their results).  A pipeline's requests are
    its process's: a forked child's copy sends none of them (each holds
    ``CopiedCall``, ``applied`` None: the parent sends them).  Made by ``Connection.pipeline()`` or
    ``Stream.pipeline()``.
    """

    _queued: List[Tuple[int, bytes]]

    def __init__(self, conn: Any, stream: Any = None) -> None:
        super().__init__(conn)
        self._stream = stream       # a Stream whose requests these are, or None
        self._queued = []           # (code, body) of requests not handed over yet
        self._sink = ReplySink()    # syncs of those handed over, and their replies
        self._codes = RequestCodes()   # their request types, which class an error reply
        # the checking sink of send_frames(check_only=True), made when first used
        self._checking: Optional[ReplySink] = None
        # Its requests are this process's: a forked child's copy sends none of them.
        self._process = process_token()
        # Held while requests are handed over (_flush, send_frames), when they
        # are neither queued nor in the sink yet: a request queued meanwhile,
        # by another greenlet, waits, or its place would not be its own.
        self._handover = Semaphore()
        self._handing = False   # whether it is held

    def _request(self, code, body, on_push=None, on_push_ctx=None):
        if self._handing:   # another greenlet is handing requests over
            with self._handover:
                pass
        queued = self._queued
        queued.append((code, body))
        index = len(self._sink.syncs) + len(queued) - 1
        if len(queued) >= BATCH:
            self._flush()
            gevent.sleep(0)
        return index

    def _flush(self):
        """Hand the queued requests to the transport, reconnecting first if it
        died, within ``request_timeout`` (for a connection and for room in
        ``max_in_flight``).  Requests it could not hand over get the exception
        in their places (``RequestTimeout``, ``applied`` False, when the time
        ran out), and it is raised."""
        with self._handover:
            self._handing = True
            try:
                self._flush_now()
            finally:
                self._handing = False

    def _flush_now(self):
        requests, self._queued = self._queued, []
        conn = self._conn
        sink = self._sink
        syncs = list(itertools.islice(conn._syncs, len(requests)))
        if syncs:
            self._codes.add(syncs[0], list(map(operator.itemgetter(0), requests)))
        start = len(sink.syncs)
        deadline = conn._call_deadline()
        timer = Timeout._start_new_or_dummy(conn.request_timeout)
        try:
            self._send(requests, syncs, sink, deadline)
        except BaseException as exc:
            error = exc
            if isinstance(exc, Timeout):   # (this one's, or one around it: wait()'s)
                error = not_sent(RequestTimeout(
                    "pipeline: no connection or no room to send within request_timeout=%ss"
                    % conn.request_timeout))
            elif not isinstance(exc, Exception):   # a kill: its requests still get an outcome
                error = not_sent(NetworkError("pipeline: not sent: %s interrupted it"
                                              % type(exc).__name__))
            # The rest were not sent: they keep their places, failed with this.
            unsent = syncs[len(sink.syncs) - start:]
            sink.syncs += unsent
            for sync in unsent:
                sink.replies[sync] = error
            if exc is timer:
                raise error from None
            raise
        finally:
            timer.close()

    def _send(self, requests, syncs, sink, deadline):
        check_process(self._process)
        stream = self._stream
        start = len(sink.syncs)
        while True:
            try:
                if stream is None:
                    self._conn._ensure_connected(deadline).send_many(requests, syncs, sink)
                else:
                    stream._transport().send_many(requests, syncs, sink, stream.stream_id)
                return
            except Draining:
                if stream is not None and stream._tx is not None:
                    raise   # (its transaction is that session's)
                # The rest waited for room on a socket being drained: the next one.
                queued = len(sink.syncs) - start
                requests, syncs, start = requests[queued:], syncs[queued:], len(sink.syncs)

    def select_many(self, space_name: Any, keys: Any, *, index: Any = 0) -> range:
        """Queue a select by each of ``keys``, in order: the requests
        ``select(space_name, key, index=index)`` makes for each (EQ, every
        match), encoded in one piece: a batched read with no Python call per
        key.  Each has its place in :meth:`results` as any other request.

        :param space_name: the space's name or id.
        :param keys: an iterable of keys, each a scalar or a non-empty list or
            tuple of the index's parts.
        :param index: the index's name or id (default: the primary index).
        :returns: the keys' places in :meth:`results`, a ``range``.
        :raises ValueError: an empty key (``select`` reads every tuple).
        :raises TypeError: a key the packer cannot encode.
        :raises tarantool.error.SchemaError: no space or index has that name.
        :raises tarantool.error.NetworkError: as :meth:`send_frames`.

        Nothing is queued when it raises ValueError, TypeError or SchemaError.
        """
        keys = [key if type(key) is tuple or type(key) is list else (key,) for key in keys]
        if not all(keys):
            raise ValueError("select_many: an empty key (select() reads every tuple)")
        start = len(self._sink.syncs) + len(self._queued)
        space = self._spaces.get(space_name) or self._space(space_name)
        if index:
            space = self._index(space, index)
        if self._stream is not None:
            # A stream's requests carry its id: queued one by one, once every
            # key is encoded (a key the packer refuses queues none).
            bodies = [space.join(space.select_prefix, key) for key in keys]
            for body in bodies:
                self._request(REQUEST_TYPE_SELECT, body)
            return range(start, start + len(keys))
        if not keys:
            return range(start, start)
        first = self.take_syncs(len(keys))
        frames = self._encoder.encode_batch(REQUEST_TYPE_SELECT, space.select_prefix, keys, first)
        start = self.send_frames(frames, first, len(keys), code=REQUEST_TYPE_SELECT)
        return range(start, start + len(keys))

    def take_syncs(self, count: int) -> int:
        """Reserve ``count`` consecutive syncs for requests encoded by the
        caller (``Encoder.encode_batch``) and sent with :meth:`send_frames`.

        :returns: the first sync.
        """
        first: int = next(self._conn._syncs)
        if count > 1:   # (the counter moved on at once, not one sync at a time)
            self._conn._syncs = itertools.count(first + count)
        return first

    def send_frames(self, frames: Any, first_sync: int, count: int,
                    check_only: bool = False, code: Optional[int] = None) -> int:
        """Queue ``count`` whole requests encoded already, with the syncs
        ``first_sync`` .. ``first_sync + count - 1`` (from :meth:`take_syncs`),
        after what is queued: the bulk path, with no per-request work here.
        Their results are :meth:`failures`' (or :meth:`results`') like any
        other request's.

        :param frames: what ``Encoder.encode_batch`` returned: bytes, a
            bytearray (not to be changed until every reply is in) or a
            ``Gather``.

        :param check_only: keep only whether each succeeded: the reader keeps
            nothing of a success's reply (an insert's carries the whole tuple
            back), so that :meth:`results` holds a Response without a body
            (``data`` None) in its place; a failure is kept and reported as
            any other's.
        :param code: the requests' type, when they are all of one: an error
            reply to a single-statement request (select, insert, replace,
            update, delete, upsert) then says it was not applied (``applied``
            False); without it, ``applied`` None.

        :returns: the place of the first of them in the results.
        :raises tarantool.error.NetworkError: the connection could not be
            (re)established, or it is another process's (a fork), or
            (``RequestTimeout``) there was no room in ``max_in_flight`` within
            ``request_timeout``: none of them was sent, each holds this
            exception (``applied`` False) as its result.
        :raises ValueError: the pipeline is a stream's.
        """
        if self._stream is not None:
            raise ValueError("send_frames: a stream's pipeline frames its own requests")
        with self._handover:
            self._handing = True
            try:
                return self._send_frames(frames, first_sync, count, check_only, code)
            finally:
                self._handing = False

    def _send_frames(self, frames, first_sync, count, check_only, code):
        if self._queued:
            self._flush_now()
        sink = self._sink
        waiter = sink
        if check_only:
            if self._checking is None:
                self._checking = ReplySink(sink)
            waiter = self._checking
        index = len(sink.syncs)
        if code is not None:
            self._codes.add(first_sync, (code, count))
        timeout = self._conn.request_timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        timer = Timeout._start_new_or_dummy(timeout)
        try:
            check_process(self._process)
            while True:
                try:
                    self._conn._ensure_connected(deadline).send_frames(frames, first_sync,
                                                                       count, waiter)
                    break
                except Draining:   # in line on a socket being drained: nothing queued there
                    continue
        except BaseException as exc:
            error = exc
            if exc is timer:   # no room within request_timeout: not sent
                error = RequestTimeout("pipeline: no room to send within request_timeout=%ss"
                                       % timeout)
            # Not queued: each holds the error, unsent (a kill leaves them out).
            if len(sink.syncs) == index and isinstance(error, Exception):
                error = not_sent(error)
                syncs = range(first_sync, first_sync + count)
                sink.syncs += syncs
                sink.replies.update(dict.fromkeys(syncs, error))
            if error is exc:
                raise
            raise error from None
        finally:
            timer.close()
        return index

    def failures(self) -> List[Tuple[int, BaseException]]:
        """Waits as :meth:`results`, and returns only the failed requests, as
        ``(place, exception)`` in request order: a request that succeeded
        (an OK reply, its body not decoded) costs a check, no Response (the
        bulk path's reply check).

        :returns: a list, empty when every request succeeded.
        """
        try:
            self.wait()
        except RequestTimeout:
            pass  # each unanswered request holds its RequestTimeout
        replies = self._sink.replies
        if operator.countOf(replies.values(), CHECKED) == len(replies):
            return []   # every request checked only, and each succeeded: nothing to walk
        bad = [sync for sync, reply in replies.items()
               if type(reply) is not tuple or reply[0]]
        if not bad:
            return []
        places = {sync: k for k, sync in enumerate(self._sink.syncs)}
        bad.sort(key=places.__getitem__)
        errors = responses(self._conn, self._conn._decoder, bad, replies, code_of=self._codes)
        return [(places[sync], error) for sync, error in zip(bad, errors)
                if isinstance(error, BaseException)]

    def wait(self) -> None:
        """Send what is queued and block until every request has its reply (or error).

        Honours the connection's ``request_timeout`` for the whole wait: on
        expiry it raises ``RequestTimeout``, which also becomes the result of
        each request still unanswered.  A failed request (refused, or lost
        with the connection, or never sent because it could not connect) does
        not make it raise: its exception is its result.

        :raises gtarantool.RequestTimeout: the replies did not all come within
            ``request_timeout``.
        """
        sink = self._sink
        if not self._queued and sink.outstanding <= 0:
            return
        conn = self._conn
        timer = Timeout._start_new_or_dummy(conn.request_timeout)
        try:
            if self._queued:
                try:
                    self._flush()
                except Exception:  # noqa: BLE001 - each unsent request holds it
                    pass
            if sink.outstanding > 0:
                sink.waiter = Waiter()
                try:
                    sink.waiter.get()
                finally:
                    sink.waiter = None
            self._check_process()
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

    def _check_process(self):
        """After a wait: in a forked child (a copy of the parent's waiting
        greenlet, or the child sending a copy of the parent's queue), every
        result is ``CopiedCall``: the call is the parent's, even where a reply
        came before the fork."""
        try:
            check_process(self._process)
        except CopiedCall as exc:
            sink = self._sink
            sink.replies.update(dict.fromkeys(sink.syncs, exc))
            sink.outstanding = 0

    def _give_up(self, exc):
        transport = self._conn._transport
        sink = self._sink
        for sync in sink.syncs:
            if sync not in sink.replies:
                if transport is not None:
                    transport.abandon(sync)
                sink.replies[sync] = exc
        sink.outstanding = 0

    def results(self) -> List[Any]:
        """Every reply in request order: a Response, or the exception it raised.
        Waits as :meth:`wait`, without raising on a timeout.

        :returns: one item per request, in the order they were made: its
            :class:`~gtarantool.protocol.responses.Response` or its exception.
        """
        try:
            self.wait()
        except RequestTimeout:
            pass  # each unanswered request holds its RequestTimeout
        with _gc_paused():
            return responses(self._conn, self._conn._decoder, self._sink.syncs,
                             self._sink.replies, code_of=self._codes)

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc is not None and (not isinstance(exc, Exception)
                                or isinstance(exc, RequestTimeout)):
            # A kill, a timer's Timeout, an interrupt, or a call of the block
            # out of request_timeout: the block ends now, with nothing more
            # sent and no reply awaited (results() awaits them); the caller's
            # time is up, and a silent server would not answer these either.
            requests, self._queued = self._queued, []
            if requests:
                error = not_sent(NetworkError("pipeline: not sent: %s ended its block"
                                              % exc_type.__name__))
                syncs = list(itertools.islice(self._conn._syncs, len(requests)))
                self._sink.syncs += syncs
                self._sink.replies.update(dict.fromkeys(syncs, error))
            return
        if exc is None:
            self.wait()
            return
        try:
            self.wait()
        except Exception:  # noqa: BLE001 - the block's exception goes on; results() has each
            pass
