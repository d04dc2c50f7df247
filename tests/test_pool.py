"""gtarantool.ConnectionPool on real replica sets (gtarantool.testing.replicaset): a master
and two replicas on localhost, started fresh for each test.

Servers are started, stopped and promoted from the test greenlet while the
pool keeps working: process starts go through gevent's thread pool and admin
requests through gtarantool connections, so the hub never blocks.
"""
import gc
import inspect
import itertools
import signal
import time
import types

import gevent
import pytest
import tarantool
import tarantool.connection_pool
from tarantool.error import DatabaseError, NetworkError, PoolTopologyError

import gtarantool
from gtarantool import ConnectionClosed, Mode, compiled
from gtarantool.pool import (
    ConnectionPool,
    LeastInFlightStrategy,
    RoundRobinStrategy,
    connection_pool,
)
from gtarantool.testing.replicaset import ReplicaSet
from gtarantool.testing.server import binary_version

from .conftest import PASSWORD, USER, _lua
from .timing import slack

REFRESH = 0.1     # refresh_delay in these tests


@pytest.fixture
def rs():
    replicaset = ReplicaSet(_lua(), user=USER, password=PASSWORD)
    replicaset.start()
    yield replicaset
    replicaset.cleanup()


def make_pool(rs, servers=None, **kw):
    kw.setdefault("refresh_delay", REFRESH)
    kw.setdefault("connection_timeout", 2)
    addrs = [{"host": s.host, "port": s.port} for s in (servers or rs.servers)]
    return gtarantool.ConnectionPool(addrs, user=USER, password=PASSWORD, **kw)


def name(srv):
    return "%s:%s" % (srv.host, srv.port)


def admin(srv):
    return gtarantool.connect(srv.host, srv.port, user=USER, password=PASSWORD,
                              fetch_schema=False)   # (a schema load counts as SELECTs)


def stat(srv, what):
    with admin(srv) as conn:
        return conn.eval("return box.stat()[...].total", what).data[0]


def in_thread(fn, *args):
    """Run a blocking call (a server start) without blocking the hub."""
    return gevent.get_hub().threadpool.spawn(fn, *args).get()


def wait_until(predicate, timeout=10.0, step=0.02):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met within %ss" % timeout
        gevent.sleep(step)


def live_greenlets():
    return sum(1 for obj in gc.get_objects()
               if isinstance(obj, gevent.Greenlet) and not obj.dead)


# -- the API ---------------------------------------------------------------------------

def test_same_methods_arguments_and_defaults_as_tarantool_python():
    theirs, ours = tarantool.ConnectionPool, gtarantool.ConnectionPool
    ctor = inspect.signature(ours.__init__).parameters
    for param in inspect.signature(theirs.__init__).parameters.values():
        assert param.name in ctor
        if param.name not in ("connection_timeout", "strategy_class"):
            assert ctor[param.name].default == param.default, param.name
    for method, func in vars(theirs).items():
        if method.startswith("_") or not callable(func):
            continue
        mine = inspect.signature(getattr(ours, method)).parameters
        for param in inspect.signature(func).parameters.values():
            if param.kind is param.VAR_POSITIONAL or method.startswith("crud_"):
                continue
            assert param.name in mine, (method, param.name)
            if param.default is not param.empty:     # (ours may add a default)
                assert mine[param.name].default == param.default, (method, param.name)
        if "mode" in inspect.signature(func).parameters:
            # crud_* take their arguments positionally here; the mode's default must agree.
            assert (mine["mode"].default
                    == inspect.signature(func).parameters["mode"].default), method


# crud's select and get, echoing what they were given (crud itself needs vshard)
FAKE_CRUD = """
crud = {}
local meta = {{name = 'conditions', type = 'any'}, {name = 'opts', type = 'any'}}
function crud.select(space, conditions, opts)
    return {metadata = meta, rows = {{conditions or box.NULL, opts or box.NULL}}}
end
function crud.get(space, key, opts) return {metadata = meta, rows = {{key, opts or box.NULL}}} end
"""


def test_crud_methods_take_keyword_arguments_as_tarantool_pythons():
    """pool.crud_select(space, conditions=..., opts=...) as tarantool-python's
    pool takes it (only ``mode`` was taken by keyword: TypeError)."""
    from gtarantool.testing.server import TarantoolServer
    srv = TarantoolServer(_lua() + FAKE_CRUD)
    srv.start()
    pool = gtarantool.ConnectionPool([{"host": srv.host, "port": srv.port}], user=USER,
                                     password=PASSWORD, wait_timeout=5)
    try:
        conditions = [["=", "id", 1]]
        got = pool.crud_select("t", conditions=conditions, opts={"first": 1}, mode=Mode.ANY)
        assert got.rows == [[conditions, {"first": 1}]]
        assert pool.crud_select("t", conditions, {"first": 2}).rows == [[conditions, {"first": 2}]]
        assert pool.crud_get("t", key=3).rows == [[3, {}]]   # (opts: {} by default)
    finally:
        pool.close()
        srv.cleanup()


@pytest.mark.skipif(compiled.pool is None, reason="_pool.c is built for Python 3.10 and later")
def test_the_c_routes_and_their_python_twins_share_one_interface():
    """The pool's C types hold the fields their Python twins name, and the
    Routes' hooks are the pool's own functions, set once."""
    def members(cls):
        return {name for name, value in vars(cls).items()
                if type(value) is types.MemberDescriptorType}
    assert members(compiled.pool.InstanceCore) == set(connection_pool.InstanceFields.__slots__)
    assert members(compiled.pool.PoolCore) == set(connection_pool.PoolFields.__slots__)
    assert issubclass(ConnectionPool, compiled.pool.PoolCore)
    assert issubclass(connection_pool.Instance, compiled.pool.InstanceCore)
    assert compiled.pool.POOL_HOOKS == ("failed", "drained", "send")
    with pytest.raises(TypeError, match="callable"):
        compiled.pool.set_hooks(failed=None, drained=None, send=None)


def test_bad_arguments_fail_clearly():
    with pytest.raises(tarantool.error.ConfigurationError, match="non-empty list"):
        gtarantool.ConnectionPool([])
    with pytest.raises(tarantool.error.ConfigurationError, match="port"):
        gtarantool.ConnectionPool([{"host": "127.0.0.1", "port": 0}], connect_now=False)
    with pytest.raises(tarantool.error.ConfigurationError, match="wait_timeout"):
        gtarantool.ConnectionPool([{"host": "127.0.0.1", "port": 1}], wait_timeout=-1)
    for bad in ("localhost", "127.0.0.1:", "127.0.0.1:http"):   # (was a ValueError from int())
        with pytest.raises(tarantool.error.ConfigurationError, match="host:port"):
            gtarantool.ConnectionPool([bad], connect_now=False)
    pool = gtarantool.ConnectionPool(["127.0.0.1:1"])   # (down: retried, the pool open)
    with pytest.raises(tarantool.error.ConfigurationError, match="host:port"):
        pool.add("nocolon")
    pool.close()


def test_least_in_flight_picks_the_idlest_of_the_role():
    class Member:
        def __init__(self, read_only, in_flight):
            self.state = tarantool.connection_pool.InstanceState(
                tarantool.connection_pool.Status.HEALTHY, read_only)
            self.in_flight = in_flight
    pool = {"m": Member(False, 5), "a": Member(True, 3), "b": Member(True, 1)}
    strategy = LeastInFlightStrategy(pool)
    assert strategy.getnext(Mode.RO) == "b"
    assert strategy.getnext(Mode.ANY) == "b"
    assert strategy.getnext(Mode.RW) == "m"
    pool["b"].in_flight = 9
    strategy.update()
    assert strategy.getnext(Mode.PREFER_RO) == "a"
    assert {strategy.getnext(Mode.RO) for _ in range(4)} == {"a"}
    pool["a"].in_flight = 9
    assert {strategy.getnext(Mode.RO) for _ in range(4)} == {"a", "b"}   # ties rotate
    del pool["m"]
    strategy.update()
    with pytest.raises(PoolTopologyError, match="rw"):
        strategy.getnext(Mode.RW)
    assert strategy.getnext(Mode.PREFER_RW) in ("a", "b")


# -- routing ---------------------------------------------------------------------------

@pytest.mark.parametrize("strategy", [RoundRobinStrategy, LeastInFlightStrategy,
                                      tarantool.connection_pool.RoundRobinStrategy])
def test_requests_go_where_their_mode_says(rs, strategy, routes):
    master, r1, r2 = rs.servers
    with make_pool(rs, strategy_class=strategy) as pool:
        assert {n: i["role"] for n, i in pool.info().items()} == {
            name(master): "master", name(r1): "replica", name(r2): "replica"}
        for _ in range(3):   # each connection looks the space up once (selects on _vspace)
            pool.select("tester", 0, mode=Mode.ANY)
        before = {srv: (stat(srv, "INSERT"), stat(srv, "SELECT")) for srv in rs.servers}
        for i in range(60):
            pool.insert("tester", (i, "x"))                       # RW by default
        rs.wait_synced()
        for mode in (Mode.RO, Mode.PREFER_RO):
            gevent.joinall([gevent.spawn(pool.select, "tester", i, mode=mode)
                            for i in range(30)], raise_error=True)
        for i in range(15):
            pool.select("tester", i, mode=Mode.PREFER_RW)
        assert pool.select("tester", 5, mode=Mode.RO).data == [[5, "x"]]
        inserts = {srv: stat(srv, "INSERT") - before[srv][0] for srv in rs.servers}
        selects = {srv: stat(srv, "SELECT") - before[srv][1] for srv in rs.servers}
        # Replicas count the replicated rows as inserts too, but no client inserts.
        assert inserts == {master: 60, r1: 60, r2: 60}
        assert selects[master] == 15
        assert selects[r1] + selects[r2] == 61
        if strategy is not LeastInFlightStrategy:
            assert abs(selects[r1] - selects[r2]) <= 1
        before = {srv: stat(srv, "SELECT") for srv in rs.servers}
        for i in range(30):
            pool.select("tester", i)                            # ANY by default
        assert all(stat(srv, "SELECT") - before[srv] > 0 for srv in rs.servers)
        with pytest.raises(ValueError, match="mode"):
            pool.call("echo", 1)
        assert pool.call("echo", 1, 2, mode=Mode.ANY).data == [1, 2]
        assert pool.eval("return box.info.ro", mode=Mode.RO).data == [True]
        assert pool.eval("return box.info.ro", mode=Mode.RW).data == [False]
        with pytest.raises(DatabaseError) as err:
            pool.insert("tester", (1, "dup"))
        assert err.value.code == 3        # ER_TUPLE_FOUND: the caller's error, unchanged
        info = pool.info()[name(master)]
        assert info["requests"] >= 61 and info["errors"] == 1 and info["in_flight"] == 0


def test_data_methods_take_every_form_of_call(rs, routes, monkeypatch):
    """The C Routes take positional arguments and mode=; any other call goes to
    the Python method: both must act alike, and count alike."""
    master = rs.servers[0]

    def count(what):
        return pool.info()[name(master)][what]
    with make_pool(rs) as pool:
        params = inspect.signature(pool.select).parameters
        assert list(params)[:2] == ["space_name", "key"] and params["mode"].default is Mode.ANY
        pool.insert("tester", (1, "a"))
        pool.replace("tester", (2, "b"), mode=Mode.RW)
        insert = pool.insert                   # a bound method, called later
        insert("tester", (3, "c"))
        before = count("requests")
        assert pool.select("tester", 2, mode=Mode.RW).data == [[2, "b"]]
        assert pool.select("tester", 1, mode=Mode.RW, iterator="GE", limit=2).data == [
            [1, "a"], [2, "b"]]
        assert pool.select("tester", mode=Mode.RW).data == [[1, "a"], [2, "b"], [3, "c"]]
        assert count("requests") == before + 3
        pool.update("tester", 1, [("=", 1, "A")])
        pool.update("tester", (1,), [("=", 1, "AA")], index="primary")
        pool.upsert("tester", (4, "d"), [("=", 1, "D")])
        pool.delete("tester", 3)
        pool.delete("tester", (2,), index=0, mode=Mode.PREFER_RW)
        assert pool.select("tester", mode=Mode.RW).data == [[1, "AA"], [4, "d"]]
        requests, errors = sum(i["requests"] for i in pool.info().values()), count("errors")
        with pytest.raises(ValueError, match="mode"):
            pool.select("tester", 1, mode="RO")
        with pytest.raises(TypeError):
            pool.insert("tester", (5, "e"), "one too many")
        with pytest.raises(TypeError):
            pool.delete("tester")
        with pytest.raises(TypeError):
            pool.select("tester", 1, no_such_option=1)
        assert sum(i["requests"] for i in pool.info().values()) == requests   # none sent
        with pytest.raises(DatabaseError) as err:
            pool.insert("tester", (1, "dup"))
        assert err.value.code == 3
        assert count("errors") == errors + 1 and count("in_flight") == 0
        # The connection's method is the class's as it is now (the C path caches it).
        seen, original = [], gtarantool.Connection.select
        with monkeypatch.context() as patch:
            patch.setattr(gtarantool.Connection, "select", lambda conn, *args, **kw:
                          seen.append(args) or original(conn, *args, **kw))
            assert pool.select("tester", 4, mode=Mode.RW).data == [[4, "d"]]
        assert pool.select("tester", 1, mode=Mode.RW).data == [[1, "AA"]]
        assert seen == [("tester", 4)]


def test_pipeline_runs_on_the_instance_of_its_mode(rs):
    with make_pool(rs) as pool:
        with pool.pipeline() as p:
            for i in range(100):
                p.insert("tester", (i, "p"))
        assert all(reply.data for reply in p.results())
        rs.wait_synced()
        with pool.pipeline(mode=Mode.RO) as p:
            p.eval("return box.info.ro")
        assert [reply.data for reply in p.results()] == [[True]]


@pytest.mark.skipif(binary_version() < (2, 10), reason="needs Tarantool 2.10+ (streams); "
                    "server is %s" % ".".join(map(str, binary_version())))
def test_transaction_runs_on_the_master():
    with ReplicaSet(_lua(), user=USER, password=PASSWORD,
                    cfg={"memtx_use_mvcc_engine": True}) as rs:
        with make_pool(rs) as pool:
            with pool.transaction() as tx:
                tx.insert("tester", (1, "t"))
                tx.insert("tester", (2, "t"))
            with pytest.raises(KeyError):
                with pool.transaction() as tx:
                    tx.insert("tester", (3, "t"))
                    raise KeyError("rolled back")
            rs.wait_synced()
            assert pool.select("tester", mode=Mode.RO).data == [[1, "t"], [2, "t"]]


def test_a_wrong_role_error_makes_the_pool_check_at_once(rs):
    """ER_READONLY from an instance makes its monitor check it at once (a box.info
    CALL on it), although the next periodic check is a minute away."""
    master, r1, r2 = rs.servers
    with make_pool(rs, refresh_delay=60) as pool:
        calls = stat(r1, "CALL") + stat(r2, "CALL")
        with pytest.raises(DatabaseError) as err:
            pool.eval("box.space.tester:insert{1, 'x'}", mode=Mode.RO)
        assert err.value.code == 7                   # ER_READONLY, to the caller
        wait_until(lambda: stat(r1, "CALL") + stat(r2, "CALL") > calls, timeout=5)
        with admin(master) as conn:
            conn.eval("box.cfg{read_only = true}")
        # Polling: the pool learns from the write's ER_READONLY; watching: from
        # the push, unless the write overtakes it.
        with pytest.raises(DatabaseError) as err:
            pool.insert("tester", (1, "x"))
        assert err.value.code == 7 or isinstance(err.value, PoolTopologyError)
        wait_until(lambda: pool.info()[name(master)]["role"] == "replica", timeout=5)
        with pytest.raises(PoolTopologyError):       # no instance is RW now
            pool.insert("tester", (2, "x"))


# -- failures ----------------------------------------------------------------------------

@pytest.mark.timing
def test_failover_under_load(rs):
    """500 greenlets write and read; kill -9 the master, promote a replica.

    Checks: every greenlet finishes (none hangs); writes are never re-sent
    (a client-session on_replace trigger counts each key's inserts on the
    survivors); every write acknowledged after the promotion is on the new
    master; every write the old master acknowledged is on the new master, or
    (lost by asynchronous replication) in the old master's WAL beyond the LSN
    the new master had received from it.
    """
    master, new, other = rs.servers
    for srv in (new, other):
        rs.eval(srv, "client_inserts = {} box.space.tester:on_replace(function(_, t) "
                     "if t ~= nil and box.session.type() == 'binary' then "
                     "client_inserts[t[1]] = (client_inserts[t[1]] or 0) + 1 end end)")
    old_id = rs.eval(master, "return box.info.id")[0]
    # With watchers the promotion is pushed: a long refresh_delay shows that no
    # poll is needed.  Without, the pool polls box.info every REFRESH.
    watching = binary_version() >= (2, 10)
    refresh = 5 if watching else REFRESH
    keys = itertools.count()
    acked, failed, read_errors = {}, [], []
    reads = [0]
    running = True
    with make_pool(rs, wait_timeout=10, retry_reads=True, refresh_delay=refresh) as pool:
        def writer():
            while running:
                key = next(keys)
                try:
                    pool.insert("tester", (key, "w"))
                    acked[key] = time.monotonic()
                except (NetworkError, DatabaseError) as exc:   # PoolTopologyError too
                    failed.append((key, exc))
                    gevent.sleep(0.01)

        def reader():
            while running:
                try:
                    pool.select("tester", 1, mode=Mode.PREFER_RO)
                    reads[0] += 1
                except (NetworkError, DatabaseError) as exc:
                    read_errors.append(exc)
                    gevent.sleep(0.01)

        workers = [gevent.spawn(writer) for _ in range(250)]
        workers += [gevent.spawn(reader) for _ in range(250)]
        gevent.sleep(0.5)
        assert len(acked) > 100 and reads[0] > 100
        master.kill()
        killed = time.monotonic()
        gevent.sleep(0.3)
        with admin(new) as conn:
            received = conn.eval("return box.info.vclock[...] or 0", old_id).data[0]
            conn.eval("box.cfg{read_only = false}")
        promoted = time.monotonic()
        wait_until(lambda: any(t > promoted for t in acked.values()), timeout=10)
        first_write = min(t for t in acked.values() if t > promoted) - promoted
        gevent.sleep(0.3)
        running = False
        done = gevent.joinall(workers, timeout=10)
        assert len(done) == len(workers), "greenlets hung after the failover"
        assert pool.info()[name(new)]["role"] == "master"
        source = pool.info()[name(new)]["role_source"]
        assert source == ("watch" if watching else "poll")

    print("\nfailover (%s, refresh_delay=%s): first write %.3f s after promotion; "
          "%d writes acked, %d failed, %d reads, %d read errors"
          % (source, refresh, first_write, len(acked), len(failed), reads[0], len(read_errors)))
    # A loose ceiling: the pool takes the promotion up by itself, in time.  (How
    # soon is a figure of python -m bench.poolcompare.)
    assert first_write < slack(3.0) + (0 if watching else 2 * REFRESH), first_write
    # Reads are re-sent once when the connection fails; none needed a second try.
    assert not read_errors
    # Never re-sent: no key reached the survivors twice, and no key whose
    # insert failed reached the new master from a client.
    counts = {}
    for srv in (new, other):
        for key, n in rs.eval(srv, "local r = {} for k, n in pairs(client_inserts) do "
                                   "r[#r + 1] = {k, n} end return r")[0]:
            assert n == 1, "key %s inserted %d times on %s" % (key, n, srv.port)
            counts[key] = counts.get(key, 0) + n
    assert set(counts).isdisjoint(key for key, _ in failed)
    on_new = {t[0] for t in rs.eval(new, "return box.space.tester:select()")[0]}
    after = {key for key, t in acked.items() if t > promoted}
    before = {key for key, t in acked.items() if t <= killed}
    assert after <= on_new and after <= set(counts)
    lost = before - on_new
    # The old master, back read-only and alone, shows where the lost ones went.
    master.cfg = {"read_only": True}
    in_thread(master.start)
    with admin(master) as conn:
        final = conn.eval("return box.info.vclock[...] or 0", old_id).data[0]
        in_wal = {t[0] for t in conn.eval("return box.space.tester:select()").data[0]}
    assert before <= in_wal
    assert len(lost) <= final - received
    print("acked by the old master: %d, of which %d not replicated before the kill "
          "(LSN %d..%d, in its WAL); acked after the promotion: %d, all on the new master"
          % (len(before), len(lost), received, final, len(after)))


@pytest.mark.timing
def test_instances_down_at_start_join_later(rs):
    """One replica refuses connections, the other is frozen: the pool starts in
    about one connection_timeout (connects run in parallel) and picks both up."""
    master, down, frozen = rs.servers
    down.kill()
    frozen.signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        pool = make_pool(rs, connection_timeout=0.5)
        took = time.monotonic() - started
    finally:
        frozen.signal(signal.SIGCONT)
    with pool:
        assert took < 0.5 + slack(0.5)
        info = pool.info()
        assert info[name(master)]["role"] == "master"
        assert info[name(down)]["role"] is None and info[name(down)]["last_error"]
        assert "connection_timeout" in info[name(frozen)]["last_error"]
        pool.insert("tester", (1, "x"))
        in_thread(down.start)
        # (A replica whose peer is down may stay 'orphan', unavailable, on 3.x.)
        wait_until(lambda: pool.info()[name(down)]["role"] == "replica")
        wait_until(lambda: pool.info()[name(frozen)]["role"] == "replica")
        before = stat(down, "SELECT")
        for i in range(20):
            pool.select("tester", 1, mode=Mode.RO)
        assert stat(down, "SELECT") - before == 10


def test_full_restart_recovers_without_intervention(rs):
    """Every instance is killed and restarted, replicas first: while they wait
    for the master they answer error 116 (bootstrap not finished), which once
    killed tarantool-python's refresh thread (#328)."""
    master = rs.master
    with make_pool(rs, wait_timeout=30) as pool:
        seen = set()

        def watch():
            while True:
                for info in pool.info().values():
                    if info["last_error"]:
                        seen.add(info["last_error"])
                gevent.sleep(0.005)
        watcher = gevent.spawn(watch)
        for srv in rs.servers:
            srv.kill()
        starts = [gevent.get_hub().threadpool.spawn(srv.start) for srv in rs.replicas]
        gevent.sleep(0.3)
        in_thread(master.start)
        for start in starts:
            start.get()
        assert pool.insert("tester", (1, "back")).data == [[1, "back"]]
        wait_until(lambda: all(i["status"] == "running" for i in pool.info().values()), 30)
        wait_until(lambda: pool.select("tester", 1, mode=Mode.RO).data == [[1, "back"]], 30)
        watcher.kill()
    assert any("code 116" in text for text in seen), seen
    print("\nerrors seen while restarting: %s" % sorted({t.split(":")[-1] for t in seen}))


def test_read_retry_on_another_instance_only_when_asked(rs, routes):
    _, r1, r2 = rs.servers
    for retry in (False, True):
        with make_pool(rs, retry_reads=retry) as pool:
            wait_until(lambda: all(i["role"] for i in pool.info().values()))
            errors, stop = [], False

            def reader():
                while not stop:
                    try:
                        pool.select("tester", 1, mode=Mode.RO)
                    except Exception as exc:   # noqa: BLE001 - each is checked below
                        errors.append(exc)
                        gevent.sleep(0.01)
            workers = [gevent.spawn(reader) for _ in range(100)]
            gevent.sleep(0.2)
            victim = r1 if not retry else r2
            # Frozen first, so that reads are surely in flight, unanswered, when it dies.
            victim.signal(signal.SIGSTOP)
            gevent.sleep(0.1)
            assert pool.info()[name(victim)]["in_flight"] > 0
            victim.kill()
            gevent.sleep(0.3)
            stop = True
            assert len(gevent.joinall(workers, timeout=10)) == len(workers)
            assert pool.info()[name(victim)]["role"] is None
            if retry:
                assert not errors, errors
            else:
                assert errors
                assert all(isinstance(e, NetworkError) for e in errors), errors
            in_thread(victim.start)


@pytest.mark.timing
def test_a_read_re_sent_to_another_instance_ends_by_the_calls_request_timeout(rs, routes):
    """A read whose instance dies late in its request_timeout goes once to
    another instance (retry_reads), which answers nothing either: the call
    ends by its one deadline (it took a whole request_timeout more)."""
    _, r1, r2 = rs.servers
    with make_pool(rs, retry_reads=True, request_timeout=1.0) as pool:
        wait_until(lambda: all(i["role"] for i in pool.info().values()))
        for srv in (r1, r2):
            srv.signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            read = gevent.spawn(pool.select, "tester", 1, mode=Mode.RO)
            gevent.sleep(0.7)
            victim = [srv for srv in (r1, r2) if pool.info()[name(srv)]["in_flight"]]
            assert len(victim) == 1
            victim[0].kill()
            read.join(10)
            took = time.monotonic() - started
            assert isinstance(read.exception, gtarantool.RequestTimeout), read.exception
            assert took <= 1.0 + slack(0.3), took
        finally:
            for srv in (r1, r2):
                if srv.process.poll() is None:
                    srv.signal(signal.SIGCONT)


def test_add_and_remove_under_load(rs):
    master, r1, r2 = rs.servers
    with make_pool(rs, servers=[master, r1]) as pool:
        errors, stop = [], False

        def worker(i):
            for n in itertools.count():
                if stop:
                    return
                try:
                    if n % 4 == 0:
                        pool.replace("tester", (i, "w"))
                    else:
                        pool.select("tester", i, mode=Mode.RO)
                except Exception as exc:   # noqa: BLE001 - none is expected
                    errors.append(exc)
        workers = [gevent.spawn(worker, i) for i in range(50)]
        gevent.sleep(0.2)
        assert pool.add({"host": r2.host, "port": r2.port}) == name(r2)
        with pytest.raises(tarantool.error.ConfigurationError):
            pool.add("%s:%s" % (r2.host, r2.port))
        before = stat(r2, "SELECT")
        gevent.sleep(0.2)
        assert stat(r2, "SELECT") > before
        pool.remove(name(r1))
        assert name(r1) not in pool.info()
        before = stat(r1, "SELECT")
        gevent.sleep(0.2)
        assert stat(r1, "SELECT") == before
        stop = True
        assert len(gevent.joinall(workers, timeout=10)) == len(workers)
        assert not errors


def test_ten_thousand_greenlets_on_a_pool_of_three(rs):
    with make_pool(rs) as pool:
        def work(i):
            pool.insert("tester", (i, "x"))
            return pool.select("tester", i, mode=Mode.PREFER_RW).data
        jobs = [gevent.spawn(work, i) for i in range(10000)]
        gevent.joinall(jobs, timeout=60)
        assert all(job.successful() for job in jobs)
        assert [job.value for job in jobs] == [[[i, "x"]] for i in range(10000)]
        assert sum(i["requests"] for i in pool.info().values()) >= 20000


def test_wait_timeout_waits_for_a_master_and_close_leaves_nothing(rs):
    master, r1, _ = rs.servers
    with admin(master) as conn:
        conn.eval("box.cfg{read_only = true}")
    base = live_greenlets()
    pool = make_pool(rs, wait_timeout=5)
    pool.wait_timeout = 0
    with pytest.raises(PoolTopologyError, match="rw"):
        pool.insert("tester", (1, "x"))
    pool.wait_timeout = 5
    waiter = gevent.spawn(pool.insert, "tester", (1, "x"))
    gevent.sleep(0.3)
    assert not waiter.ready()
    with admin(r1) as conn:
        conn.eval("box.cfg{read_only = false}")
    assert waiter.get(timeout=5).data == [[1, "x"]]
    with admin(r1) as conn:
        conn.eval("box.cfg{read_only = true}")
    wait_until(lambda: all(i["role"] == "replica" for i in pool.info().values()))

    def insert_waiting():
        try:
            return pool.insert("tester", (2, "x"))
        except ConnectionClosed as exc:
            return exc
    waiter = gevent.spawn(insert_waiting)
    gevent.sleep(0.1)
    assert not waiter.ready()
    pool.close()
    assert pool.is_closed()
    assert isinstance(waiter.get(timeout=1), ConnectionClosed)
    with pytest.raises(ConnectionClosed):
        pool.insert("tester", (3, "x"))
    del waiter
    gc.collect()
    assert live_greenlets() <= base
    assert all(i["connected"] is False for i in pool.info().values())


def test_close_under_load_leaves_no_connection_reopened(rs):
    """Writers keep calling while close() stops the instances one by one (each
    stop yields): none of them may reopen a connection close() closed."""
    pool = make_pool(rs, wait_timeout=5, request_timeout=2)
    keys = iter(range(1_000_000, 2_000_000))
    running = [True]

    def writer():
        while running[0]:
            try:
                pool.insert("tester", (next(keys), "load"))
            except Exception:  # noqa: BLE001 - ConnectionClosed once closing
                gevent.sleep(0.01)

    writers = [gevent.spawn(writer) for _ in range(200)]
    gevent.sleep(0.3)
    pool.close()
    gevent.sleep(0.2)
    running[0] = False
    gevent.joinall(writers, timeout=10)
    gevent.sleep(0.5)
    assert all(i["connected"] is False for i in pool.info().values()), pool.info()
    assert all(i.conn.is_closed() for i in pool.pool.values())


@pytest.mark.timing
def test_a_rerouted_write_ends_within_its_request_timeout(rs):
    """The old master refuses late (its thread busy 0.8 s) and the new one is
    busy when the write comes to it: the re-sent write ends at the first
    send's request_timeout, not a whole second one after the refusal."""
    master, r1, _ = rs.servers
    pool = make_pool(rs, wait_timeout=0, request_timeout=1.0)
    busy = "local c = require('clock') local t = c.monotonic() " \
           "while c.monotonic() - t < ... do end"
    try:
        pool.insert("tester", (1, "warm"))
        with admin(r1) as conn:
            conn.eval("box.cfg{read_only = false}")   # two writable for a moment
        wait_until(lambda: sum(i["role"] == "master" for i in pool.info().values()) == 2)
        old, new = admin(master), admin(r1)
        refusing = gevent.spawn(old.eval, "box.cfg{read_only = true} " + busy, 0.8)
        gevent.sleep(0.01)
        took = []

        def write(key):
            started = time.monotonic()
            try:
                pool.insert("tester", (key, "x"))
            except Exception as exc:  # noqa: BLE001 - its outcome is checked below
                took.append((time.monotonic() - started, exc))
            else:
                took.append((time.monotonic() - started, None))

        writes = [gevent.spawn(write, key) for key in range(100, 140)]
        gevent.sleep(0.3)
        stalled = gevent.spawn(new.eval, busy, 1.2)
        gevent.joinall(writes + [refusing, stalled], timeout=20)
        old.close()
        new.close()
        assert pool.rerouted_writes > 0
        assert max(t for t, _ in took) <= 1.0 + slack(0.3), sorted(took, key=lambda t: -t[0])[:3]
    finally:
        pool.close()


def test_a_replica_set_that_fails_to_start_stops_the_members_it_started():
    """The last member cannot bind its port: start() raises, and the master and
    the first replica, running by then, are stopped, not left behind."""
    import socket
    replicaset = ReplicaSet(_lua(), user=USER, password=PASSWORD)
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", replicaset.servers[-1].port))
        blocker.listen()
        with pytest.raises(RuntimeError, match="during start-up"):
            replicaset.start()
    started = [srv for srv in replicaset.servers[:-1] if srv.process is not None]
    assert len(started) == 2
    assert all(srv.process.poll() is not None for srv in started)


@pytest.mark.timing
@pytest.mark.skipif(binary_version() < (2, 10), reason="needs Tarantool 2.10+ (streams); "
                    "server is %s" % ".".join(map(str, binary_version())))
def test_a_transaction_that_waited_for_a_master_begins_by_the_larger_timeout():
    """No instance is writable; the master comes back just before
    ``wait_timeout`` runs out with its one slot taken: the transaction's
    begin ends by the larger of ``wait_timeout`` and ``request_timeout`` from
    the call, as any call that waited, not a whole ``request_timeout`` after
    its wait; it was never sent."""
    with ReplicaSet(_lua(), user=USER, password=PASSWORD,
                    cfg={"memtx_use_mvcc_engine": True}) as rs:
        master = rs.servers[0]
        pool = make_pool(rs, wait_timeout=2, request_timeout=1, max_in_flight=1)
        boss = admin(master)
        try:
            boss.eval("box.cfg{read_only = true}")
            wait_until(lambda: all(i["role"] != "master" for i in pool.info().values()))
            conn = next(i.conn for i in pool.pool.values() if i.conn.port == master.port)
            # A call that holds its one slot for 3 s (its own deadline taken
            # as it starts, past the pool's request_timeout).
            conn.request_timeout = 5
            busy = gevent.spawn(conn.call, "sleep_and_return", 3, 1)
            gevent.sleep(0.1)
            conn.request_timeout = 1
            assert conn._transport.in_flight == 1
            gevent.spawn_later(1.7, boss.eval, "box.cfg{read_only = false}")
            started = time.monotonic()
            with pytest.raises(gtarantool.RequestTimeout) as caught:
                with pool.transaction():
                    pass
            took = time.monotonic() - started
            assert 1.7 <= took <= 2.0 + slack(0.3), took
            assert gtarantool.errors.applied(caught.value) is False
            busy.kill()
        finally:
            boss.close()
            pool.close()


@pytest.mark.timing
@pytest.mark.parametrize("strategy", [RoundRobinStrategy, LeastInFlightStrategy,
                                      tarantool.connection_pool.RoundRobinStrategy])
def test_a_call_that_waited_for_a_master_ends_by_the_larger_timeout(rs, strategy, routes):
    """No instance is writable; the master comes back just before
    ``wait_timeout`` runs out and the call then takes long: it ends by the
    larger of ``wait_timeout`` and ``request_timeout`` from its start, not a
    whole ``request_timeout`` after its wait, whatever the strategy.  A
    routed write waits too."""
    master = rs.servers[0]
    pool = make_pool(rs, wait_timeout=2, request_timeout=1, strategy_class=strategy)
    boss = admin(master)
    try:
        boss.eval("box.cfg{read_only = true}")
        wait_until(lambda: all(i["role"] != "master" for i in pool.info().values()))
        gevent.spawn_later(1.7, boss.eval, "box.cfg{read_only = false}")
        started = time.monotonic()
        try:
            pool.call("sleep_and_return", 0.9, 1, mode=Mode.RW)
        except gtarantool.RequestTimeout as exc:
            assert gtarantool.errors.applied(exc) is None
        took = time.monotonic() - started
        assert took <= 2.0 + slack(0.3), took
        wait_until(lambda: any(i["role"] == "master" for i in pool.info().values()))
        boss.eval("box.cfg{read_only = true}")
        wait_until(lambda: all(i["role"] != "master" for i in pool.info().values()))
        gevent.spawn_later(0.5, boss.eval, "box.cfg{read_only = false}")
        pool.insert("tester", (77, "waited"))
        assert boss.eval("return box.space.tester:get(77) ~= nil").data == [True]
    finally:
        boss.close()
        pool.close()


@pytest.mark.parametrize("strategy", [RoundRobinStrategy, LeastInFlightStrategy])
def test_a_write_no_instance_can_take_is_refused_not_passed_between_replicas(rs, strategy,
                                                                              routes):
    """Every instance is read-only; a write sent in a mode replicas fit (ANY,
    PREFER_RW, PREFER_RO) is refused by the first, and a re-route goes to a
    master only: it is refused once (applied False), not passed from replica
    to replica until the caller's time runs out."""
    with admin(rs.master) as conn:
        conn.eval("box.cfg{read_only = true}")
    pool = make_pool(rs, strategy_class=strategy)
    try:
        wait_until(lambda: all(i["role"] == "replica" for i in pool.info().values()))
        for mode in (Mode.ANY, Mode.PREFER_RW, Mode.PREFER_RO):
            with gevent.Timeout(5):
                with pytest.raises(DatabaseError) as refused:
                    pool.insert("tester", (1, "x"), mode=mode)
            assert refused.value.code == 7
            assert gtarantool.errors.applied(refused.value) is False
        assert pool.rerouted_writes == 0
        assert sum(i["requests"] for i in pool.info().values()) == 3
    finally:
        pool.close()
