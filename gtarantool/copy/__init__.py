"""Bulk copy into and out of a space: :func:`copy_from` and :func:`copy_to`.

::

    report = copy_from(conn, "customers", rows, mode="replace")
    for row in copy_to(conn, "customers"):
        ...

The target is a :class:`gtarantool.Connection`, a :class:`gtarantool.ConnectionPool`
(rows go to its read-write instance) or a :class:`gtarantool.Router` (each row
to the master of the replica set that holds its bucket, written under vshard's
bucket references: ``gtarantool.copy.routed``).  What callers rely
on: every row given is written or rejected, each reply checked once; memory
stays bounded by ``max_in_flight`` rows (and about ``WINDOW_BYTES`` of them
encoded) whatever the input's size; a row is
sent again only when it was proven not applied (a read-only master during a
switchover, a request not written before its connection broke); a row that
may have been applied is rejected with ``applied=None`` and never re-sent;
a copy of the call in a forked child sends nothing (``CopiedCall``).
The command line (``python -m gtarantool.copy``) is in :mod:`gtarantool.copy.cli`.
"""
from __future__ import annotations

import collections
import functools
import itertools
import time
import warnings
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Union

import gevent
from tarantool.connection_pool import Mode
from tarantool.error import (
    DatabaseError,
    MsgpackError,
    MsgpackWarning,
    NetworkError,
    NotSupportedError,
)

from gtarantool.copy.formats import Field
from gtarantool.copy.report import CopyError, CopyReport, Rejected
from gtarantool.errors import ConnectionClosed, RequestTimeout
from gtarantool.protocol.constants import (
    ER_LOADING,
    ER_READONLY,
    REQUEST_TYPE_INSERT,
    REQUEST_TYPE_REPLACE,
    REQUEST_TYPE_UPSERT,
)
from gtarantool.transport import CopiedCall, check_process, process_token

__all__ = ["CopyError", "CopyReport", "Rejected", "SpaceInfo", "copy_from", "copy_to",
           "space_info"]

MODES = ("insert", "replace", "upsert")
CODES = {"insert": REQUEST_TYPE_INSERT, "replace": REQUEST_TYPE_REPLACE,
         "upsert": REQUEST_TYPE_UPSERT}
VSPACE, VINDEX = 281, 289           # the system views every user may read
VSPACE_BY_NAME, VINDEX_BY_NAME = 2, 2
# A refusal of a whole server, not of the row: the row is sent again.
TRANSIENT_CODES = frozenset((ER_READONLY, ER_LOADING))
_TUPLE_ONLY = {tuple}


class SpaceInfo:
    """A space as the copy needs it: ``id``, ``name``, ``fields`` (a list of
    :class:`~gtarantool.copy.formats.Field`), ``pk`` (the primary key's field
    numbers, 0-based)."""

    def __init__(self, space_id: int, name: str, fields: List[Field], pk: List[int]) -> None:
        self.id, self.name, self.fields, self.pk = space_id, name, fields, pk

    def field_no(self, name: Union[str, int]) -> int:
        """The number of the field named ``name`` (a number is returned as is).

        :raises ValueError: there is no such field.
        """
        if isinstance(name, int):
            return name
        for i, field in enumerate(self.fields):
            if field.name == name:
                return i
        raise ValueError("space %s has no field %r" % (self.name, name))


def _one_reply(open_pipeline: Callable[[], Any], method: str, *args: Any,
               _within: Optional[float] = None, **kwargs: Any) -> Any:
    """One request on a pipeline of its own, its reply; ``_within``: the
    seconds it may take (None: as the connection's ``request_timeout``)."""
    with gevent.Timeout(_within, RequestTimeout("no reply within %ss" % _within)):
        p = open_pipeline()
        getattr(p, method)(*args, **kwargs)
        reply = p.results()[0]
    if isinstance(reply, BaseException):
        raise reply
    return reply


def _parts(parts: Any) -> List[int]:
    # 1.7-style [[field, type]] or 2.x-style [{field =, type =}]
    return [p["field"] if isinstance(p, dict) else p[0] for p in parts]


def space_info(target: Any, space: Union[str, int]) -> SpaceInfo:
    """The format and primary key of ``space`` on ``target``, read from ``_vspace``
    and ``_vindex`` (so it needs no schema on the connection).

    :param target: a Connection, ConnectionPool or Router.
    :param space: the space's name or id.
    :returns: a :class:`SpaceInfo`.
    :raises ValueError: there is no such space, or it has no primary index.
    """
    open_pipeline = _Destination.of(target).any_pipeline
    try:
        return _space_info(open_pipeline, space)
    except NotSupportedError:
        raise ValueError("copying needs connections that read the schema (a Router: "
                         "Router(..., fetch_schema=True))") from None


def _space_info(open_pipeline, space):
    if isinstance(space, int):
        rows = _one_reply(open_pipeline, "select", VSPACE, [space]).data
    else:
        rows = _one_reply(open_pipeline, "select", VSPACE, [space], index=VSPACE_BY_NAME).data
    if not rows:
        raise ValueError("no space %r" % (space,))
    row = rows[0]
    fields = [Field.from_format(f) for f in (row[6] if len(row) > 6 else ()) or ()]
    index = _one_reply(open_pipeline, "select", VINDEX, [row[0], 0]).data
    if not index:
        raise ValueError("space %s has no primary index" % row[2])
    pk = _parts(index[0][5])
    width = max(pk) + 1
    if len(fields) < width:   # a space with no format: nameless fields of any type
        fields += [Field("field%d" % (i + 1)) for i in range(len(fields), width)]
    return SpaceInfo(row[0], row[2], fields, pk)


class _Destination:
    """Where rows go: ``group(row)`` names the pipeline's owner for a row,
    ``pipeline(key)`` opens a pipeline to it."""

    router = None

    def __init__(self, target: Any) -> None:
        self.target = target

    @staticmethod
    def of(target: Any) -> _Destination:
        from gtarantool.pool import ConnectionPool
        from gtarantool.sharding import Router

        if isinstance(target, Router):
            return _RouterDestination(target)
        if isinstance(target, ConnectionPool):
            return _PoolDestination(target)
        if not hasattr(target, "pipeline"):
            raise TypeError("copy target must be a Connection, ConnectionPool or Router, "
                            "not %s" % type(target).__name__)
        return _Destination(target)

    def pipeline(self, key: Any) -> Any:
        return self.target.pipeline()

    def ping(self, key: Any) -> None:
        self.target.ping()

    def any_pipeline(self) -> Any:
        return self.target.pipeline()

    def readers(self) -> List[Callable[[], Any]]:
        return [self.target.pipeline]


class _PoolDestination(_Destination):
    def ping(self, key: Any) -> None:
        self.target.ping(mode=Mode.RW)

    def readers(self) -> List[Callable[[], Any]]:
        return [lambda: self.target.pipeline(Mode.PREFER_RW)]


class _RouterDestination(_Destination):
    def __init__(self, target: Any) -> None:
        super().__init__(target)
        self.router = target

    def pipeline(self, key: Any) -> Any:
        return key.pool.pipeline()

    def ping(self, key: Any) -> None:
        key.pool.ping(mode=Mode.RW)

    def any_pipeline(self) -> Any:
        # (the schema is on every storage: any instance of a replica set, waited
        # for within the router's timeout, as a freshly made router learns roles)
        pool = next(iter(self.target.replicasets.values())).pool
        deadline = time.monotonic() + self.target.timeout
        return pool._wait_for(Mode.PREFER_RW, deadline).conn.pipeline()

    def readers(self) -> List[Callable[[], Any]]:
        return [functools.partial(rs.pool.pipeline, Mode.PREFER_RW)
                for rs in self.target.replicasets.values()]


def _applied(exc: BaseException, unsent: Sequence[BaseException]) -> Optional[bool]:
    """False when ``exc`` proves the row was not applied, None when it may have been."""
    for e in unsent:
        if exc is e:
            return False
    if hasattr(exc, "applied"):
        applied: Optional[bool] = getattr(exc, "applied")
        return applied
    if isinstance(exc, DatabaseError) and not isinstance(exc, NetworkError):
        return False   # a box error in a DML's reply: the server refused it
    return None


def _reason(exc: BaseException) -> str:
    code = getattr(exc, "code", None)
    message = getattr(exc, "message", None) or str(exc)
    text = "%s: %s" % (type(exc).__name__, message)
    return "%s (code %s)" % (text, code) if isinstance(code, int) and code else text


def _transient(exc: BaseException, applied: Optional[bool]) -> bool:
    if applied is not False:
        return False
    if isinstance(exc, NetworkError):
        return True
    return getattr(exc, "code", None) in TRANSIENT_CODES


# A batch is cut at about BATCH_BYTES of encoded rows, and no more than about
# WINDOW_BYTES wait for replies: enough to keep the server busy, and memory
# that is reused batch after batch (fresh megabytes cost a page fault every 4 KiB).
BATCH_BYTES = 2 << 20
WINDOW_BYTES = 8 << 20
FIRST_BATCH = 64   # rows, before their size is known
# A str or bytes field this long is written from the row itself (writev, in C:
# encode_batch's gather), not copied into the batch first.
GATHER_FROM = 1024


# What the packer raises for a row it cannot encode, and what it only warns of
# (a decimal with more digits of scale than Tarantool keeps, written rounded,
# or 0): each rejects its row, with the reason.
UNENCODABLE = (TypeError, ValueError, OverflowError, MsgpackError, MsgpackWarning)


@contextmanager
def lossless():
    """Encoding within: the packer's warning of a value it would change raises."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", MsgpackWarning)
        yield


class _Batch:
    __slots__ = ("key", "pipeline", "indices", "rows", "unsent", "frames", "size", "buckets")

    def __init__(self, key, pipeline, indices, rows, unsent, frames=None, size=0):
        self.key, self.pipeline, self.indices, self.rows = key, pipeline, indices, rows
        self.buckets = None    # (a Router's copy) the rows' bucket ids
        self.unsent = unsent   # the error of a batch not queued (its rows are sent again)
        self.frames = frames   # the bytearray its requests were encoded in
        self.size = size       # their bytes on the wire


class _Copy:
    """One copy_from: the batches in flight (oldest first) and the report."""

    def __init__(self, dest, info, mode, batch, max_in_flight, retry_timeout, first):
        self.dest, self.info, self.max_batch = dest, info, batch
        # rows in the next batch: a few at first, then as many as fit in
        # BATCH_BYTES by the size of the last batch's rows, up to ``batch``
        self.batch = min(batch, FIRST_BATCH)
        self.max_in_flight, self.retry_timeout = max_in_flight, retry_timeout
        self.space_id = info.id
        self.inflight = collections.deque()
        self.in_flight_rows = 0
        self.in_flight_bytes = 0
        self.pending = {}          # key -> ([indices], [rows]) not sent yet
        self.report = CopyReport()
        self.first = self.next_index = first
        self.rejected = {}         # index -> Rejected, in row order at the end
        # Buffers of batches whose every reply came (so the socket took all
        # their bytes), encoded into again: megabytes of fresh memory per
        # batch cost a page fault every 4 KiB.
        self.buffers = []
        # At the start and after a connection failed: before the next batch, a
        # ping proves the destination takes requests, so that rows are not
        # sent into a dead socket (where they could not be told apart from
        # rows the server may have applied).
        self.suspect = True
        self.code = CODES[mode]
        # (the parent's rows stay the parent's: a forked child's copy sends none)
        self.token = process_token()
        pk = set(info.pk)
        # an upsert assigns the fields outside the primary key
        self.rest = tuple(i for i in range(len(info.fields)) if i not in pk) \
            if mode == "upsert" else ()

    def reject(self, index, row, reason, applied, error=None):
        if index >= self.next_index:
            self.next_index = index + 1
        self.rejected[index] = Rejected(index, row, reason, applied, error)

    def full(self):
        """Too much in flight: settle the oldest batch before reading on."""
        return self.in_flight_rows > self.max_in_flight or self.in_flight_bytes > WINDOW_BYTES

    def open_pipeline(self, key):
        """(a new pipeline to ``key``'s destination, its encoder), in the
        process the copy started in."""
        check_process(self.token)
        self.check_destination(key)
        p = self.dest.pipeline(key)
        if p._encoder is None:   # (never connected: a pipeline's first send connects it)
            p._conn._ensure_connected()
        return p, p._encoder

    def send(self, key, indices, rows):
        """Encode ``rows`` in one piece and queue them on a new pipeline: a
        row the packer cannot encode is rejected on its own, a batch the
        connection could not take holds its error in each row's place."""
        p, encoder = self.open_pipeline(key)
        code, rest = self.code, self.rest
        prefix, suffix = encoder.batch_parts(code, self.space_id)
        first = p.take_syncs(len(rows))
        out = self.buffers.pop() if self.buffers else bytearray()
        with lossless():
            try:
                frames = encoder.encode_batch(code, prefix, rows, first, suffix, rest, out,
                                              GATHER_FROM)
            except BufferError:   # (still viewed by a writer: not resized, a new one)
                out = bytearray()
                frames = encoder.encode_batch(code, prefix, rows, first, suffix, rest, out,
                                              GATHER_FROM)
            except UNENCODABLE:
                indices, rows = self.encodable(encoder, prefix, suffix, indices, rows)
                frames = encoder.encode_batch(code, prefix, rows, first, suffix, rest, out,
                                              GATHER_FROM)
        # (``frames`` is ``out``, or a Gather that writes from it and the rows)
        size = len(frames)
        unsent = []
        if rows:
            try:
                p.send_frames(frames, first, len(rows), check_only=True, code=code)
            except NetworkError as exc:   # none sent: each row holds it, to be sent again
                unsent.append(exc)
                self.suspect = True
        if rows:
            self.batch = max(1, min(self.max_batch, len(rows) * BATCH_BYTES // size))
        batch = _Batch(key, p, indices, rows, unsent, out, size)
        self.inflight.append(batch)
        self.in_flight_rows += len(indices)
        self.in_flight_bytes += batch.size
        return batch

    def check_destination(self, key):
        """After a failure (or at the start), a ping before the next batch."""
        if self.suspect:
            # (bounded: a connection waiting for an announced restart waits long)
            with gevent.Timeout(self.retry_timeout, RequestTimeout(
                    "no answer to a ping within %ss" % self.retry_timeout)):
                self.dest.ping(key)
            self.suspect = False

    def encodable(self, encoder, prefix, suffix, indices, rows):
        """(indices, rows) of the rows the packer encodes; the others rejected."""
        good_i, good_r = [], []
        for index, row in zip(indices, rows):
            try:
                with lossless():
                    encoder.encode_batch(self.code, prefix, (row,), 0, suffix, self.rest)
            except UNENCODABLE as exc:
                self.reject(index, row, _reason(exc), False, exc)
                continue
            good_i.append(index)
            good_r.append(row)
        return good_i, good_r

    def send_or_retry(self, key, indices, rows):
        try:
            self.send(key, indices, rows)
        except CopiedCall:
            raise
        except (NetworkError, DatabaseError) as exc:   # the ping failed: nothing sent
            self.suspect = True
            self.resend(key, indices, rows, exc)

    def settle(self, batch):
        """Check each reply of ``batch``; send what was proven not applied again."""
        again = self.check(batch)
        if again[0]:
            self.resend(batch.key, *again)

    def check(self, batch):
        """Count and reject by the replies; returns (indices, rows, last error) of
        the rows to send again."""
        self.in_flight_rows -= len(batch.indices)
        self.in_flight_bytes -= batch.size
        failures = batch.pipeline.failures() if batch.rows else ()
        # (replies a forked child's copy finds are the parent's outcome, not its own)
        check_process(self.token)
        if not failures and not batch.unsent and batch.frames is not None:
            self.buffers.append(batch.frames)
        batch.frames = None
        again_i, again_r, last = [], [], None
        written = len(batch.indices) - len(failures)
        for place, reply in failures:
            index, row = batch.indices[place], batch.rows[place]
            applied = _applied(reply, batch.unsent)
            if isinstance(reply, NetworkError):
                self.suspect = True
            if _transient(reply, applied):
                again_i.append(index)
                again_r.append(row)
                last = reply
            else:
                self.reject(index, row, _reason(reply), applied, reply)
        self.report.written += written
        return again_i, again_r, last

    def resend(self, key, indices, rows, last):
        """Send rows proven not applied again until ``retry_timeout`` has passed."""
        check_process(self.token)   # (a copied call's replies say not applied: not ours)
        deadline = time.monotonic() + self.retry_timeout
        while indices:
            if time.monotonic() >= deadline:
                self.in_flight_rows += len(indices)    # still unsettled, for the report
                self.inflight.appendleft(_Batch(key, None, indices, rows, ()))
                raise CopyError("copy stopped: the server refused or could not take rows "
                                "for %ss: %s" % (self.retry_timeout, _reason(last)),
                                self._stopped()) from last
            gevent.sleep(0.05)
            check_process(self.token)   # (forked meanwhile: the rows are the parent's)
            try:
                batch = self.send(key, indices, rows)
            except CopiedCall:
                raise
            except (NetworkError, DatabaseError) as exc:   # no pipeline, or the ping failed
                self.suspect = True
                last = exc
                continue
            self.inflight.pop()
            indices, rows, last2 = self.check(batch)
            last = last2 or last

    def drain(self):
        for key, pending in list(self.pending.items()):
            del self.pending[key]
            self.send_or_retry(key, *pending)
        while self.inflight:
            self.settle(self.inflight[0])
            self.inflight.popleft()

    def _stopped(self):
        report = self.finish()
        report.rows = self.next_index - self.first
        return report

    def finish(self):
        report = self.report
        report.rejected = [self.rejected[i] for i in sorted(self.rejected)]
        unsettled = [b.indices[0] for b in self.inflight if b.indices]
        # a row that may have been written is not known written: a resume sends it again
        unsettled += [r.position for r in report.rejected if r.applied is None][:1]
        unsettled += [pending[0][0] for pending in self.pending.values() if pending[0]]
        end = self.next_index
        report.settled = (min(unsettled) if unsettled else end) - self.first
        return report


def _bucket_plan(dest, info, bucket_id, bucket_field):
    """(field number or None, function or None) for routing rows by bucket."""
    if dest.router is None:
        if bucket_id is not None or bucket_field is not None:
            raise ValueError("bucket_id and bucket_field need a Router target")
        return None
    if bucket_field is None:
        names = [f.name for f in info.fields]
        bucket_field = "bucket_id" if "bucket_id" in names else None
    field_no = info.field_no(bucket_field) if bucket_field is not None else None
    if field_no is None and bucket_id is None:
        raise ValueError("a Router target needs bucket_field (the space has no field "
                         "named bucket_id) or a bucket_id function")
    return field_no, bucket_id


def copy_from(target: Any, space: Union[str, int], rows: Iterable[Any], *,
              mode: str = "insert", batch: int = 5000, max_in_flight: int = 20000,
              bucket_id: Optional[Callable[[tuple], int]] = None,
              bucket_field: Union[str, int, None] = None,
              retry_timeout: float = 30.0, first: int = 0,
              info: Optional[SpaceInfo] = None,
              assign: Optional[Iterable[Union[str, int]]] = None) -> CopyReport:
    """Write ``rows`` into ``space`` in pipelined batches.

    :param target: a :class:`gtarantool.Connection`, a
        :class:`gtarantool.ConnectionPool` (its read-write instance) or a
        :class:`gtarantool.Router` made with ``fetch_schema=True`` (rows
        grouped per replica set by bucket, each batch one EVAL on its master
        that writes under vshard's bucket references: the user needs
        ``execute`` on ``universe``; a row refused for its bucket is routed
        again).
    :param space: the space's name or id.
    :param rows: tuples or lists of the space's fields, or dicts by field name.
    :param mode: ``insert`` (a taken key rejects the row), ``replace``, or
        ``upsert`` (the fields outside the primary key assigned).
    :param batch: rows per pipeline, at most (fewer when that many would
        encode to more than ``BATCH_BYTES``).
    :param max_in_flight: the most rows sent and not yet answered (and no
        more than about ``WINDOW_BYTES`` of them): the input is read no faster
        than replies come.
    :param bucket_id: (Router) a function of the row's tuple giving its bucket
        id; with ``bucket_field`` too, the id is stored in that field.  A row
        it raises for (or gives no bucket id of the cluster) is rejected.
    :param bucket_field: (Router) the field holding the bucket id (default:
        the field named ``bucket_id``).
    :param retry_timeout: seconds to keep sending rows proven not applied (a
        read-only or loading master, a connection being re-established, a
        bucket that moved or is moving: such a row is then rejected with
        ``applied`` False).
    :param first: the index the first row is counted as (in ``Rejected.position``).
    :param info: the space's :class:`SpaceInfo`, when the caller read it already.
    :param assign: (upsert) the fields an upsert assigns, by name or number
        (those of the primary key left out); default: every field outside the
        primary key.  Rows read from a file naming only some fields assign
        those: a field the file does not hold keeps its value.
    :returns: a :class:`CopyReport`.
    :raises ValueError: an unknown mode, space or field, or bucket options
        that do not fit the target.
    :raises CopyError: rows could not be written for ``retry_timeout`` (its
        ``report.settled`` says how many rows to skip to resume), a
        Router's storage refused the EVAL for lack of privilege, or ``rows``
        raised while it was read (its ``__cause__``; the rows sent before are
        settled first).
    :raises gtarantool.ConnectionClosed: ``CopiedCall`` (``applied`` None):
        this is a forked child's copy of a copy the parent began; the
        parent's goes on, nothing more is sent here.
    """
    if mode not in MODES:
        raise ValueError("mode must be one of %s, not %r" % (", ".join(MODES), mode))
    if batch < 1 or max_in_flight < 1:
        raise ValueError("batch and max_in_flight must be positive")
    started, cpu = time.perf_counter(), time.process_time()
    dest = _Destination.of(target)
    info = info or space_info(target, space)
    plan = _bucket_plan(dest, info, bucket_id, bucket_field)
    if plan is None:
        kind = _Copy
    else:
        from gtarantool.copy.routed import RoutedCopy as kind
    run = kind(dest, info, mode, batch, max(max_in_flight, batch), retry_timeout, first)
    if assign is not None:
        named = {info.field_no(f) for f in assign}
        run.rest = tuple(f for f in run.rest if f in named)
    names = [f.name for f in info.fields]
    try:
        try:
            if plan is None:
                _copy_batches(run, rows, names, first)
            else:
                _copy_routed(run, rows, names, first, plan)
        except _RowsRaised as exc:   # what was sent is settled first: the report says where
            run.drain()
            cause = exc.__cause__ or exc
            raise CopyError("copy stopped: reading the rows raised %s" % _reason(cause),
                            run._stopped()) from cause
        run.drain()
        # (a copy that forked while it ran ends as the parent's, whatever it read)
        check_process(run.token)
    except CopyError as exc:
        check_process(run.token)
        exc.report.elapsed = time.perf_counter() - started
        exc.report.cpu = time.process_time() - cpu
        raise
    except CopiedCall:
        raise
    except NetworkError as exc:
        raise CopyError("copy stopped: %s" % _reason(exc), run._stopped()) from exc
    report = run.finish()
    report.rows = run.next_index - first
    report.elapsed = time.perf_counter() - started
    report.cpu = time.process_time() - cpu
    return report


class _RowsRaised(Exception):
    """The caller's rows raised (the ``__cause__``) while they were read."""


def _copy_batches(run, rows, names, first):
    """Rows to one destination, a batch at a time, no per-row bookkeeping."""
    try:
        it = iter(rows)
    except Exception as exc:
        raise _RowsRaised() from exc
    index = first
    while True:
        try:
            chunk = list(itertools.islice(it, run.batch))
        except Exception as exc:   # (the rows of this batch read so far are not settled)
            raise _RowsRaised() from exc
        if not chunk:
            return
        n = len(chunk)
        indices = range(index, index + n)
        if {*map(type, chunk)} != _TUPLE_ONLY:   # (a set: no Python code per row)
            pairs = [(i, _normalise(run, i, row, names)) for i, row in zip(indices, chunk)]
            indices = [i for i, row in pairs if row is not None]
            chunk = [row for _, row in pairs if row is not None]
        index += n
        run.next_index = index
        if chunk:
            run.send_or_retry(None, indices, chunk)
        while run.full():
            run.settle(run.inflight.popleft())


def _copy_routed(run, rows, names, first, plan):
    """Rows grouped per replica set by bucket, each group sent as it fills a batch."""
    router = run.dest.router
    try:
        it = iter(rows)
    except Exception as exc:
        raise _RowsRaised() from exc
    index = first - 1
    while True:
        try:
            row = next(it)
        except StopIteration:
            return
        except Exception as exc:
            raise _RowsRaised() from exc
        index += 1
        row = _normalise(run, index, row, names)
        if row is None:
            continue
        try:
            row, bucket = _bucket(plan, row)
            router._check(bucket)
        except Exception as exc:   # (the caller's bucket_id function's too: KeyError...)
            run.reject(index, row, "no route: %s" % _reason(exc), False, exc)
            continue
        try:
            key = router.route(bucket)
        except ConnectionClosed:   # the router is closed: the copy stops
            raise
        except DatabaseError as exc:
            # (a bucket in transit, its replica set away: routed again, as a
            # row refused for its bucket is, for up to retry_timeout)
            run.park(index, row, bucket, exc)
            continue
        run.add(key, index, row, bucket)


def _normalise(run, index, row, names):
    """``row`` as a tuple, or None when it was rejected."""
    kind = type(row)
    if kind is tuple:
        return row
    if kind is dict:
        tup = _from_dict(row, names)
        if tup is None:
            unknown = ", ".join(repr(k) for k in row if k not in names)
            run.reject(index, row, "no field of the space is named %s (it has %s)"
                       % (unknown, ", ".join(names) or "no format"), False)
        return tup
    if kind is list:
        return tuple(row)
    run.reject(index, row, "a row must be a tuple, list or dict, not %s" % kind.__name__,
               False)
    return None


def _from_dict(row: Dict[str, Any], names: List[str]) -> Optional[tuple]:
    if any(k not in names for k in row):
        return None
    out = [row.get(n) for n in names]
    while out and out[-1] is None and names[len(out) - 1] not in row:
        out.pop()
    return tuple(out)


def _bucket(plan, row):
    """(``row``, with the bucket id in its field when a function gives it; the id)."""
    field_no, func = plan
    if func is not None:
        bid = func(row)
        if field_no is not None:
            row = row[:field_no] + (bid,) + row[field_no + 1:]
    else:
        bid = row[field_no]
    return row, bid


def copy_to(target: Any, space: Union[str, int], *, index: Union[str, int] = 0,
            key: Any = None, iterator: Union[str, int, None] = None,
            page: int = 1000, timeout: Optional[float] = None) -> Iterator[tuple]:
    """Every tuple of ``space`` (or of an index range), read in pages.

    Pages continue after the last tuple read: by position (``after``) on
    Tarantool 2.11+, by the index's key on older servers (GE/LE from the
    last key read, skipping the tuples of that key read already).  A Router
    target is read replica set after replica set.  A ConnectionPool and each
    replica set of a Router are read on the master, so that every write
    acknowledged before the export began is in it (a replica may not have
    applied the latest yet); on a replica only while no master is up.

    :param target: a Connection, ConnectionPool or Router.
    :param space: the space's name or id.
    :param index: the index's name or id.
    :param key: the start key (None: the whole index).
    :param iterator: ``ALL``/``GE``/``GT``/``LE``/``LT``/``EQ``/``REQ`` (default:
        ``EQ`` with a key, ``ALL`` without).
    :param page: tuples per select (at least 1).
    :param timeout: seconds a page may take (None: as long as the
        connection's ``request_timeout`` lets it).
    :returns: an iterator of tuples (lists, as the connection decodes them).
    :raises ValueError: (when iterated) a page below 1, an unknown space or
        index, or (before 2.11) a BITS or spatial iterator.
    :raises gtarantool.RequestTimeout: (when iterated) a page took longer
        than ``timeout``.
    """
    from gtarantool.errors import FeatureNotSupported
    from gtarantool.protocol.codec import iterator_code

    if type(page) is not int or page < 1:   # (a page of 0 would read nothing, forever)
        raise ValueError("page must be a positive int, not %r" % (page,))
    info = space_info(target, space)
    it = iterator_code(iterator if iterator is not None else ("EQ" if key else "ALL"))
    for open_reader in _Destination.of(target).readers():
        read = functools.partial(_one_reply, open_reader, _within=timeout)
        iid, parts, hashed = _index(read, info, index)
        if hashed:   # (no position and no order to continue by: after the last key read)
            yield from _pages_by_key(read, info.id, iid, parts, key, it, page, True)
            continue
        try:
            yield from _pages_after(read, info.id, iid, key, it, page)
        except FeatureNotSupported:
            yield from _pages_by_key(read, info.id, iid, parts, key, it, page)


def _index(read, info, index):
    if isinstance(index, int):
        rows = read("select", VINDEX, [info.id, index]).data
    else:
        rows = read("select", VINDEX, [info.id, index], index=VINDEX_BY_NAME).data
    if not rows:
        raise ValueError("space %s has no index %r" % (info.name, index))
    return rows[0][1], _parts(rows[0][5]), str(rows[0][3]).upper() == "HASH"


def _pages_after(read, space_id, iid, key, it, page):
    after = None
    while True:
        reply = read("select", space_id, key, index=iid, iterator=it, limit=page,
                     fetch_pos=True, after=after)
        data = reply.data
        yield from data
        if len(data) < page or reply.position is None:
            return
        after = reply.position


# iterator -> the inclusive one that continues from the last key read, and
# whether the key must stay a prefix (EQ, REQ): EQ=0 REQ=1 ALL=2 LT=3 LE=4 GE=5 GT=6
_NEXT = {0: (5, True), 1: (4, True), 2: (5, False), 3: (4, False), 4: (4, False),
         5: (5, False), 6: (5, False)}


def _pages_by_key(read, space_id, iid, parts, key, it, page, hashed=False):
    """Pages from the last key read on, skipping the tuples of that key read
    already (a non-unique index has several; the server orders them alike).
    ``hashed``: a HASH index (unique, in the hash's order), continued with GT
    from the last key read."""
    if hashed:
        if it not in (0, 2, 6):   # EQ, ALL, GT: what a HASH index iterates
            raise ValueError("a HASH index is read with ALL, EQ or GT, not iterator %r" % it)
        nxt, prefix = 6, it == 0
    elif it not in _NEXT:
        raise ValueError("iterator %r cannot be read page by page before Tarantool 2.11" % it)
    else:
        nxt, prefix = _NEXT[it]
    if key is not None and not isinstance(key, (list, tuple)):
        key = [key]
    reply = read("select", space_id, key, index=iid, iterator=it, limit=page)
    last, same = None, 0
    while True:
        data = reply.data
        for tup in data:
            if prefix and key and [tup[f] for f in parts[:len(key)]] != list(key):
                return
            tkey = [tup[f] for f in parts]
            same = same + 1 if tkey == last else 1
            last = tkey
            yield tup
        if len(data) < page:
            return
        reply = read("select", space_id, last, index=iid, iterator=nxt,
                     offset=0 if hashed else same, limit=page)
