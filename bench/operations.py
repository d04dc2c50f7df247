"""The operations beyond insert/select/update/delete, per client: ``call``, ``eval``, SQL
``execute``, a transaction of k updates (``tx``) and a paginated ``scan``.

``extra_calls(kind, conn, config, window, requests)`` returns ``{op: call(key) -> rows}``
for the operations the mix asks for; each returns rows whose first is the record at
``key``, so the worker checks every answer as it checks a select.  Operations that send
more than one request count them in ``requests`` (a ``collections.Counter`` of
``box.stat()`` names) as their answers come, so the run can compare with the server.

``kind`` is "tarantool" (tarantool-python and gtarantool: ``.data`` on a response),
"gtarantool" (also streams and pagination) or "asynctnt" (coroutines).
"""
from bench.dataset import NEEDS

CALL_FUNCTION = "bench_get"
EVAL_LUA = "local space, key = ... return box.space[space]:get(key)"
SELECT_SQL = 'SELECT * FROM "%s" WHERE "id" = ?'
UPDATE_OPS = [("+", 1, 1)]


class Unsupported(ValueError):
    """An operation this client cannot send; the message says which clients can."""


def check_supported(ops, driver, pool=False):
    """Raise :class:`Unsupported` when ``driver`` cannot send one of ``ops``."""
    name = "gtarantool" if pool else driver
    for op in ops:
        if op in NEEDS and name not in NEEDS[op][1]:
            raise Unsupported("operation %s needs the %s driver%s, not %s" % (
                op, " or ".join(NEEDS[op][1]), "s" if len(NEEDS[op][1]) > 1 else "",
                "--pool" if pool else driver))


def tx_keys(window, key):
    """The keys a transaction starting at ``key`` updates: ``key`` and the next live
    records of the window, at most ``window.tx_size``."""
    seq = (key - window.index) // window.procs
    top = min(window.acked, seq + window.tx_size)
    return [window.key(s) for s in range(seq, top)]


def extra_calls(kind, conn, config, window, requests, ops):
    """``{op: function(key) -> rows}`` for the operations of ``ops`` beyond the four."""
    space = config.space
    function = getattr(config, "call_function", CALL_FUNCTION)
    sql = SELECT_SQL % space
    scan, page = getattr(config, "scan", 100), getattr(config, "page", 20)
    calls = {}
    if kind == "asynctnt":
        return _asynctnt_calls(conn, space, function, sql, window, requests, ops)
    if "call" in ops:
        calls["call"] = lambda key: conn.call(function, key).data
    if "eval" in ops:
        calls["eval"] = lambda key: conn.eval(EVAL_LUA, space, key).data
    if "execute" in ops:
        calls["execute"] = lambda key: conn.execute(sql, [key]).data
    if "tx" in ops:
        def tx(key):
            stream = conn.stream()
            stream.begin()
            requests["BEGIN"] += 1
            rows = None
            try:
                for k in tx_keys(window, key):
                    data = stream.update(space, k, UPDATE_OPS).data
                    requests["UPDATE"] += 1
                    if rows is None:
                        rows = data
            except BaseException:
                if stream.in_transaction:
                    stream.rollback()
                    requests["ROLLBACK"] += 1
                raise
            stream.commit()
            requests["COMMIT"] += 1
            return rows
        calls["tx"] = tx
    if "scan" in ops:
        def scan_(key):
            resp = conn.select(space, key, iterator="GE", limit=page, fetch_pos=True)
            requests["SELECT"] += 1
            rows, got, position = resp.data, len(resp.data), resp.position
            while got < scan and position is not None:
                resp = conn.select(space, key, iterator="GE", limit=min(page, scan - got),
                                   after=position, fetch_pos=True)
                requests["SELECT"] += 1
                got += len(resp.data)
                position = resp.position
            return rows
        calls["scan"] = scan_
    return calls


def _asynctnt_calls(conn, space, function, sql, window, requests, ops):
    calls = {}
    if "call" in ops:
        calls["call"] = lambda key: conn.call(function, [key])
    if "eval" in ops:
        calls["eval"] = lambda key: conn.eval(EVAL_LUA, [space, key])
    if "execute" in ops:
        calls["execute"] = lambda key: conn.execute(sql, [key])
    if "tx" in ops:
        async def tx(key):
            stream = conn.stream()
            await stream.begin()
            requests["BEGIN"] += 1
            rows = None
            try:
                for k in tx_keys(window, key):
                    data = await stream.update(space, [k], UPDATE_OPS)
                    requests["UPDATE"] += 1
                    if rows is None:
                        rows = data
            except BaseException:
                await stream.rollback()
                requests["ROLLBACK"] += 1
                raise
            await stream.commit()
            requests["COMMIT"] += 1
            return rows
        calls["tx"] = tx
    return calls
