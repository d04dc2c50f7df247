"""The operations beyond insert/select/update/delete, per client: ``call``, ``eval``, SQL
``execute``, a transaction of k updates (``tx``), YCSB's ``scan`` (one select of a length
drawn uniformly from 1..``--scan``), a paginated scan (``scan-pages``) and YCSB's
read-modify-write (``rmw``: a select, then an update of the record it read).

Given the phase's recorder, an ``rmw`` also records its select's and its update's times
(``Recorder.sample`` under ``rmw/select`` and ``rmw/update``: the report's select and
update rows), as YCSB's DBWrapper measures the READ and the UPDATE of its
READ-MODIFY-WRITE; the worker records the whole under ``rmw``.

``extra_calls(kind, conn, config, window, requests)`` returns ``{op: call(key) -> rows}``
for the operations the mix asks for; each returns rows whose first is the record at
``key``, so the worker checks every answer as it checks a select.  Operations that send
more than one request count them in ``requests`` (a ``collections.Counter`` of
``box.stat()`` names) as their answers come, so the run can compare with the server.

``kind`` is "tarantool" (tarantool-python and gtarantool: ``.data`` on a response),
"gtarantool" (also streams and pagination) or "asynctnt" (coroutines).
"""
import random
import time

from bench.core.dataset import CALL_FUNCTION
from bench.core.recorder import part

EVAL_LUA = "local space, key = ... return box.space[space]:get(key)"
SELECT_SQL = 'SELECT * FROM "%s" WHERE "id" = ?'
UPDATE_OPS = [("+", 1, 1)]
ITERATOR_GE = 5     # the protocol's number: every client takes it (not all take "GE")
RMW_SELECT, RMW_UPDATE = part("rmw", "select"), part("rmw", "update")


def tx_keys(window, key):
    """The keys a transaction starting at ``key`` updates: ``key`` and the next live
    records of the window, at most ``window.tx_size``."""
    seq = (key - window.index) // window.procs
    top = min(window.acked, seq + window.tx_size)
    return [window.key(s) for s in range(seq, top)]


def extra_calls(kind, conn, config, window, requests, ops, recorder=None):
    """``{op: function(key) -> rows}`` for the operations of ``ops`` beyond the four;
    with ``recorder``, an rmw's parts are timed there too."""
    space = config.space
    function = getattr(config, "call_function", CALL_FUNCTION)
    sql = SELECT_SQL % space
    scan, page = getattr(config, "scan", 100), getattr(config, "page", 20)
    calls = {}
    # The scans' lengths: a stream of their own, so the keys drawn do not depend on them.
    lengths = random.Random("scan-%s-%s" % (getattr(config, "seed", 0), window.index))
    if kind == "asynctnt":
        return _asynctnt_calls(conn, space, function, sql, window, requests, ops, scan,
                               lengths, recorder)
    if "call" in ops:
        calls["call"] = lambda key: conn.call(function, key).data
    if "eval" in ops:
        calls["eval"] = lambda key: conn.eval(EVAL_LUA, space, key).data
    if "execute" in ops:
        calls["execute"] = lambda key: conn.execute(sql, [key]).data
    if "tx" in ops:
        def tx(key):
            stream = conn.stream()
            requests["BEGIN"] += 1      # counted as sent: the server counts one it refuses
            stream.begin()
            rows = None
            try:
                for k in tx_keys(window, key):
                    requests["UPDATE"] += 1
                    data = stream.update(space, k, UPDATE_OPS).data
                    if rows is None:
                        rows = data
            except BaseException:
                if stream.in_transaction:
                    requests["ROLLBACK"] += 1
                    stream.rollback()
                raise
            requests["COMMIT"] += 1
            stream.commit()
            return rows
        calls["tx"] = tx
    if "scan" in ops:
        def one_scan(key):
            requests["SELECT"] += 1
            return conn.select(space, key, iterator=ITERATOR_GE,
                               limit=lengths.randint(1, scan)).data
        calls["scan"] = one_scan
    if "rmw" in ops and recorder is None:
        def rmw(key):
            requests["SELECT"] += 1
            rows = conn.select(space, key).data
            requests["UPDATE"] += 1
            conn.update(space, key, UPDATE_OPS)
            return rows
        calls["rmw"] = rmw
    elif "rmw" in ops:
        sample, clock = recorder.sample, time.monotonic

        def timed_rmw(key):
            # each part's time, failed (raised, or no record read) under -failed
            requests["SELECT"] += 1
            t0 = clock()
            try:
                rows = conn.select(space, key).data
            except Exception:
                sample(RMW_SELECT, t0, clock(), True)
                raise
            sample(RMW_SELECT, t0, clock(), not rows)
            requests["UPDATE"] += 1
            t0 = clock()
            try:
                conn.update(space, key, UPDATE_OPS)
            except Exception:
                sample(RMW_UPDATE, t0, clock(), True)
                raise
            sample(RMW_UPDATE, t0, clock())
            return rows
        calls["rmw"] = timed_rmw
    if "scan-pages" in ops:
        def scan_(key):
            requests["SELECT"] += 1
            limit = min(page, scan)
            resp = conn.select(space, key, iterator="GE", limit=limit, fetch_pos=True)
            rows, got, position = resp.data, len(resp.data), resp.position
            # A page shorter than asked for is the end of the key range.
            while got < scan and position is not None and len(resp.data) == limit:
                requests["SELECT"] += 1
                limit = min(page, scan - got)
                resp = conn.select(space, key, iterator="GE", limit=limit,
                                   after=position, fetch_pos=True)
                got += len(resp.data)
                position = resp.position
            return rows
        calls["scan-pages"] = scan_
    return calls


def _asynctnt_calls(conn, space, function, sql, window, requests, ops, scan, lengths,
                    recorder=None):
    calls = {}
    if "scan" in ops:
        async def one_scan(key):
            requests["SELECT"] += 1
            return await conn.select(space, [key], iterator="GE",
                                     limit=lengths.randint(1, scan))
        calls["scan"] = one_scan
    if "rmw" in ops and recorder is None:
        async def rmw(key):
            requests["SELECT"] += 1
            rows = await conn.select(space, [key])
            requests["UPDATE"] += 1
            await conn.update(space, [key], UPDATE_OPS)
            return rows
        calls["rmw"] = rmw
    elif "rmw" in ops:
        sample, clock = recorder.sample, time.monotonic

        async def timed_rmw(key):
            requests["SELECT"] += 1
            t0 = clock()
            try:
                rows = await conn.select(space, [key])
            except Exception:
                sample(RMW_SELECT, t0, clock(), True)
                raise
            sample(RMW_SELECT, t0, clock(), not rows)
            requests["UPDATE"] += 1
            t0 = clock()
            try:
                await conn.update(space, [key], UPDATE_OPS)
            except Exception:
                sample(RMW_UPDATE, t0, clock(), True)
                raise
            sample(RMW_UPDATE, t0, clock())
            return rows
        calls["rmw"] = timed_rmw
    if "call" in ops:
        calls["call"] = lambda key: conn.call(function, [key])
    if "eval" in ops:
        calls["eval"] = lambda key: conn.eval(EVAL_LUA, [space, key])
    if "execute" in ops:
        calls["execute"] = lambda key: conn.execute(sql, [key])
    if "tx" in ops:
        async def tx(key):
            stream = conn.stream()
            requests["BEGIN"] += 1      # counted as sent: the server counts one it refuses
            await stream.begin()
            rows = None
            try:
                for k in tx_keys(window, key):
                    requests["UPDATE"] += 1
                    data = await stream.update(space, [k], UPDATE_OPS)
                    if rows is None:
                        rows = data
            except BaseException:
                requests["ROLLBACK"] += 1
                await stream.rollback()
                raise
            requests["COMMIT"] += 1
            await stream.commit()
            return rows
        calls["tx"] = tx
    return calls
