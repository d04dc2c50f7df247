"""copy_from through a Router: each batch written under vshard's bucket references.

A batch (the rows of one replica set, by the router's bucket map) is one EVAL
of :data:`BUCKET_WRITE` on that replica set's master.  It takes a write
reference (``vshard.storage.bucket_refrw``) on each of the batch's buckets,
writes the rows of the buckets it holds in one transaction, and releases every
reference it took: a bucket cannot move while its rows are written, and a row
whose bucket is not (or no longer) on that replica set is refused unwritten,
then routed again.  The EVAL needs ``execute`` on ``universe`` for the user.
"""
from __future__ import annotations

import time

import gevent
from tarantool.error import DatabaseError, NetworkError

from gtarantool.copy import (
    BATCH_BYTES,
    TRANSIENT_CODES,
    UNENCODABLE,
    _Batch,
    _Copy,
    _reason,
    lossless,
)
from gtarantool.copy.report import CopyError
from gtarantool.errors import RequestTimeout
from gtarantool.protocol.constants import (
    ER_ACCESS_DENIED,
    IPROTO_EXPR,
    IPROTO_TUPLE,
    REQUEST_TYPE_EVAL,
)
from gtarantool.protocol.frames import request_header
from gtarantool.sharding.errors import MOVED, NOT_READY, ShardingError
from gtarantool.transport import CopiedCall, check_process

# Arguments: space id, mode, the field numbers an upsert assigns (0-based), the
# rows' bucket ids, the rows.  Returns the failures only, each {position
# (0-based), true, vshard's error} for a row whose bucket was refused, or
# {position, false, code, message} for a row the space refused; then, when the
# transaction failed as a whole, its {code, message}.
BUCKET_WRITE = """
local space_id, mode, assign, buckets, rows = ...
local storage = require('vshard').storage
local space = box.space[space_id]
if space == nil then box.error(box.error.NO_SUCH_SPACE, tostring(space_id)) end
local function described(err)
    if type(err) == 'table' or type(err) == 'cdata' then
        return tonumber(err.code) or 0, tostring(err.message or err)
    end
    return 0, tostring(err)
end
local held, failures = {}, {}
for _, bucket_id in ipairs(buckets) do
    if held[bucket_id] == nil then
        local ok, ref, err = pcall(storage.bucket_refrw, bucket_id)
        if ok and ref then
            held[bucket_id] = true
        else
            err = ok and err or ref
            if type(err) ~= 'table' then
                local code, message = described(err)
                err = {code = code, message = message}
            end
            held[bucket_id] = err
        end
    end
end
local function write(row)
    if mode == 'insert' then return space:insert(row) end
    if mode == 'replace' then return space:replace(row) end
    local ops = {}
    for _, f in ipairs(assign) do
        if f < #row then ops[#ops + 1] = {'=', f + 1, row[f + 1]} end
    end
    return space:upsert(row, ops)
end
local function write_all()
    box.begin()
    for i, row in ipairs(rows) do
        local h = held[buckets[i]]
        if h == true then
            local ok, err = pcall(write, row)
            if not ok then
                local code, message = described(err)
                failures[#failures + 1] = {i - 1, false, code, message}
            end
        else
            failures[#failures + 1] = {i - 1, true, h}
        end
    end
    box.commit()
end
local ok, err = pcall(write_all)
if not ok and box.is_in_txn() then box.rollback() end
for bucket_id, h in pairs(held) do
    if h == true then pcall(storage.bucket_unrefrw, bucket_id) end
end
if not ok then
    local code, message = described(err)
    return failures, {code, message}
end
return failures
"""

PAUSE = 0.05   # between attempts at rows refused for their bucket or their server
# The key in ``pending`` of rows whose bucket could not be routed when read
# (indices, rows, buckets, errors): routed again as refused rows are.
PARKED = object()


class RoutedCopy(_Copy):
    """Batches per replica set as EVALs of BUCKET_WRITE; rows refused for their
    bucket routed again until ``retry_timeout``."""

    def __init__(self, dest, info, mode, *args):
        super().__init__(dest, info, mode, *args)
        self.mode = mode
        self.prefixes = {}   # encoder -> the EVAL body up to its arguments

    def add(self, key, index, row, bucket):
        self.next_index = index + 1
        pending = self.pending.get(key)
        if pending is None:
            pending = self.pending[key] = ([], [], [])
        pending[0].append(index)
        pending[1].append(row)
        pending[2].append(bucket)
        if len(pending[0]) >= self.batch:
            del self.pending[key]
            self.send_or_retry(key, *pending)
            while self.full():
                self.settle(self.inflight.popleft())

    def send(self, key, indices, rows, buckets):
        """One EVAL with the rows the packer encodes (the others rejected)."""
        p, encoder = self.open_pipeline(key)
        prefix = self.prefixes.get(encoder)
        if prefix is None:
            prefix = self.prefixes[encoder] = encoder.prefix(
                2, IPROTO_EXPR, BUCKET_WRITE, IPROTO_TUPLE)
        args = [self.space_id, self.mode, self.rest, buckets, rows]
        try:
            with lossless():
                body = encoder.join(prefix, args)
        except UNENCODABLE:
            bucket_of = dict(zip(indices, buckets))
            insert, suffix = encoder.batch_parts(self.code, self.space_id)
            indices, rows = self.encodable(encoder, insert, suffix, indices, rows)
            buckets = [bucket_of[i] for i in indices]
            body = encoder.join(prefix, [self.space_id, self.mode, self.rest, buckets, rows])
        unsent = []
        if rows:
            sync = p.take_syncs(1)
            try:
                p.send_frames(request_header(REQUEST_TYPE_EVAL, sync, 0, len(body)) + body,
                              sync, 1, code=REQUEST_TYPE_EVAL)
            except NetworkError as exc:   # not sent: its rows are sent again
                unsent.append(exc)
                self.suspect = True
            self.batch = max(1, min(self.max_batch, len(rows) * BATCH_BYTES // len(body)))
        batch = _Batch(key, p, indices, rows, unsent)
        batch.buckets, batch.size = buckets, len(body)
        self.inflight.append(batch)
        self.in_flight_rows += len(indices)
        self.in_flight_bytes += batch.size
        return batch

    def park(self, index, row, bucket, exc):
        """A row whose bucket could not be routed when read (in transit, its
        replica set away): routed again with the others parked, when they fill
        a batch or at the end, for up to ``retry_timeout``."""
        self.next_index = index + 1
        parked = self.pending.get(PARKED)
        if parked is None:
            parked = self.pending[PARKED] = ([], [], [], [])
        for items, item in zip(parked, (index, row, bucket, exc)):
            items.append(item)
        if len(parked[0]) >= self.batch:
            del self.pending[PARKED]
            self.resend(PARKED, *parked)

    def send_or_retry(self, key, indices, rows, buckets, errors=None):
        if key is PARKED:
            self.resend(key, indices, rows, buckets, errors)
            return
        try:
            self.send(key, indices, rows, buckets)
        except CopiedCall:
            raise
        except (NetworkError, DatabaseError) as exc:   # the ping failed: nothing sent
            self.suspect = True
            self.resend(key, indices, rows, buckets, [exc] * len(indices))

    def check(self, batch):
        """Count and reject by the batch's reply; returns (indices, rows, buckets,
        errors) of the rows proven not applied, to be sent again."""
        self.in_flight_rows -= len(batch.indices)
        self.in_flight_bytes -= batch.size
        if not batch.rows:
            return [], [], [], []
        reply = batch.pipeline.results()[0]
        check_process(self.token)
        if isinstance(reply, BaseException):
            return self.batch_failed(batch, reply)
        data = reply.data or [[]]
        failures = data[0] or []
        failed_tx = data[1] if len(data) > 1 else None
        again = [], [], [], []
        failed = set()
        for entry in failures:
            place = entry[0]
            failed.add(place)
            index, row, bucket = batch.indices[place], batch.rows[place], batch.buckets[place]
            if entry[1]:
                exc = self.refused(batch.key, bucket, entry[2])
                retry = exc.code in MOVED or exc.code in NOT_READY
            else:
                exc = DatabaseError(entry[2], entry[3])
                exc.applied = False
                retry = entry[2] in TRANSIENT_CODES
            if retry:
                for items, item in zip(again, (index, row, bucket, exc)):
                    items.append(item)
            else:
                self.reject(index, row, _reason(exc), False, exc)
        if failed_tx is not None:   # rolled back as a whole: as a lost reply, not sure
            exc = DatabaseError(failed_tx[0], "the batch's transaction failed: %s"
                                % failed_tx[1])
            exc.applied = None
            for place, (index, row) in enumerate(zip(batch.indices, batch.rows)):
                if place not in failed:
                    self.reject(index, row, _reason(exc), None, exc)
            return again
        self.report.written += len(batch.indices) - len(failed)
        return again

    def refused(self, rs, bucket, err):
        """The ShardingError of ``rs``'s refusal of ``bucket``; the router's map
        corrected when it says the bucket moved."""
        if not isinstance(err, dict):
            err = {"code": 0, "message": str(err)}
        exc = ShardingError.from_storage(err, rs.id)
        exc.details.setdefault("bucket_id", bucket)
        if exc.code in MOVED:
            self.dest.router._moved(bucket, rs, exc)
        return exc

    def batch_failed(self, batch, exc):
        """The EVAL itself failed: sent again when proven unsent, else every row
        rejected as maybe applied (a lost connection, a timeout, the code's error)."""
        applied = getattr(exc, "applied", None)
        if isinstance(exc, NetworkError):
            self.suspect = True
        code = getattr(exc, "code", None)
        if code == ER_ACCESS_DENIED and not isinstance(exc, NetworkError):
            for index, row in zip(batch.indices, batch.rows):
                self.reject(index, row, _reason(exc), False, exc)
            raise CopyError(
                "copy stopped: a copy through a Router writes with EVAL, which needs "
                "'execute' on 'universe' for the user (box.schema.user.grant(user, "
                "'execute', 'universe')): %s" % _reason(exc), self._stopped()) from exc
        if applied is False or (code in TRANSIENT_CODES
                                and not isinstance(exc, NetworkError)):
            n = len(batch.indices)
            return list(batch.indices), list(batch.rows), list(batch.buckets), [exc] * n
        for index, row in zip(batch.indices, batch.rows):
            self.reject(index, row, _reason(exc), None, exc)
        return [], [], [], []

    def resend(self, key, indices, rows, buckets, errors):
        """Route rows proven not applied again and send them, until
        ``retry_timeout``: then a row refused for its bucket is rejected
        (not applied), and rows a server would not take stop the copy."""
        deadline = time.monotonic() + self.retry_timeout
        router = self.dest.router
        while indices:
            # (forked meanwhile, routing or sleeping: the rows are the parent's)
            check_process(self.token)
            if time.monotonic() >= deadline:
                self.give_up(key, indices, rows, buckets, errors)
                return
            gevent.sleep(PAUSE)
            groups = {}
            again = [], [], [], []
            for item in zip(indices, rows, buckets, errors):
                try:
                    rs = router.route(item[2], timeout=max(PAUSE, deadline - time.monotonic()))
                except (DatabaseError, RequestTimeout) as exc:   # in transit: later
                    for items, value in zip(again, item[:3] + (exc,)):
                        items.append(value)
                    continue
                group = groups.get(rs)
                if group is None:
                    group = groups[rs] = [], [], []
                for items, value in zip(group, item[:3]):
                    items.append(value)
            for rs, group in groups.items():
                key = rs
                try:
                    batch = self.send(rs, *group)
                except CopiedCall:
                    raise
                except (NetworkError, DatabaseError) as exc:   # no pipeline, or no ping
                    self.suspect = True
                    for items, values in zip(again, group + ([exc] * len(group[0]),)):
                        items.extend(values)
                    continue
                self.inflight.pop()
                for items, values in zip(again, self.check(batch)):
                    items.extend(values)
            indices, rows, buckets, errors = again

    def give_up(self, key, indices, rows, buckets, errors):
        """``retry_timeout`` passed: rows refused for their bucket are rejected;
        any other stops the copy, as unsettled."""
        stuck_i, stuck_r = [], []
        last = None
        for index, row, exc in zip(indices, rows, errors):
            if isinstance(exc, ShardingError):
                self.reject(index, row, "refused for %ss: %s" % (
                    self.retry_timeout, _reason(exc)), False, exc)
            else:
                stuck_i.append(index)
                stuck_r.append(row)
                last = exc
        if stuck_i:
            self.in_flight_rows += len(stuck_i)    # still unsettled, for the report
            self.inflight.appendleft(_Batch(key, None, stuck_i, stuck_r, ()))
            raise CopyError("copy stopped: the server refused or could not take rows "
                            "for %ss: %s" % (self.retry_timeout, _reason(last)),
                            self._stopped()) from last

