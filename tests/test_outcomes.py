"""What a caller can trust: every error says whether its request was applied
(``exc.applied``), ``request_timeout`` bounds the whole call, a write is applied
at most once across a fork, and the defects each scenario left at its edges.
Real servers throughout; the C paths and their Python twins (``routes``,
``reader``) both run the pool and transport cases.
"""
import gc
import json
import os
import signal
import socket
import time

import gevent
import gevent.os
import pytest
from tarantool.error import DatabaseError, NetworkError, SchemaError

import gtarantool
from gtarantool import ConnectionClosed, RequestTimeout
from gtarantool.errors import applied
from gtarantool.testing.replicaset import ReplicaSet
from gtarantool.testing.server import TarantoolServer, binary_version
from gtarantool.transport import Draining, Stats, Transport
from tests.conftest import PASSWORD, USER, _lua

from . import children
from .timing import slack

WATCHERS = binary_version() >= (2, 10)   # box.shutdown, box.status
needs_watchers = pytest.mark.skipif(not WATCHERS, reason="needs Tarantool 2.10+")


def connect(srv, **kw):
    return gtarantool.connect(srv.host, srv.port, user=USER, password=PASSWORD, **kw)


def in_thread(fn, *args):
    return gevent.get_hub().threadpool.spawn(fn, *args).get()


def terminate(srv):
    srv.signal(signal.SIGTERM)
    deadline = time.monotonic() + 30
    while srv.process.poll() is None:
        assert time.monotonic() < deadline
        gevent.sleep(0.01)


@pytest.fixture
def srv():
    server = TarantoolServer(_lua())
    server.start()
    yield server
    server.cleanup()


# -- the classes -------------------------------------------------------------------


def test_every_error_says_whether_its_request_was_applied(server):
    conn = connect(server, request_timeout=0.5)
    try:
        conn.replace("kv", ("outcome-dup", 1))
        with pytest.raises(DatabaseError) as err:   # a duplicate key: refused whole
            conn.insert("kv", ("outcome-dup", 2))
        assert err.value.code == 3 and applied(err.value) is False
        with pytest.raises(DatabaseError) as err:   # a function's own error
            conn.call("raise_error", "boom")
        assert err.value.applied is None and applied(err.value) is None
        with pytest.raises(RequestTimeout) as err:   # sent, no reply in time
            conn.call("sleep_and_return", 2, 1)
        assert applied(err.value) is None
    finally:
        conn.close()
    dead = gtarantool.Connection("127.0.0.1", 1, connect_now=False, reconnect_max_attempts=0)
    with pytest.raises(NetworkError) as err:   # nothing could be written
        dead.replace("kv", ("x", 1))
    assert applied(err.value) is False
    assert applied(ValueError()) is None


def test_a_pipelines_errors_say_whether_their_requests_were_applied(server):
    """The exceptions a pipeline hands back carry ``applied`` as a call's do:
    a single-statement request's refusal False (in ``results()`` and
    ``failures()``, through the data methods, ``select_many`` and
    ``send_frames(..., code=)``), a function's own error None, and None for a
    batch whose type ``send_frames`` was not told."""
    conn = connect(server)
    try:
        conn.replace("kv", ("p-dup", 1))
        with conn.pipeline() as p:
            p.insert("kv", ("p-dup", 2))
            p.call("raise_error", "boom")
            encoder = conn._encoder
            prefix, suffix = encoder.batch_parts(2, conn.space("kv").space_no)
            for code in (2, None):
                first = p.take_syncs(1)
                p.send_frames(encoder.encode_batch(2, prefix, [("p-dup", 3)], first), first, 1,
                              code=code)
        outcomes = [applied(r) if isinstance(r, Exception) else "ok" for r in p.results()]
        assert outcomes == [False, None, False, None]
        assert [r.applied for r in p.results()] == [False, None, False, None]
        assert [(k, e.applied) for k, e in p.failures()] == [
            (0, False), (1, None), (2, False), (3, None)]
    finally:
        conn.close()


def test_a_lost_connections_and_an_unknown_names_errors_carry_applied(srv):
    conn = connect(srv)
    try:
        with pytest.raises(SchemaError) as err:   # nothing sent
            conn.insert("no-such-space", (1,))
        assert err.value.applied is False
        conn.eval("box.schema.space.create('named'):create_index('pk')")
        with pytest.raises(DatabaseError) as err:
            conn.select("named", 1, index="no-such-index")
        assert err.value.applied is False
        call = gevent.spawn(conn.eval, "require('fiber').sleep(10)")
        gevent.sleep(0.2)
        srv.kill()
        with pytest.raises(NetworkError) as err:   # written, then the server died
            call.get(timeout=5)
        assert err.value.applied is None and "applied" in vars(err.value)
    finally:
        conn.close()


def test_a_request_refused_for_a_schema_change_is_resent_only_to_what_it_named(srv):
    """Error 109 makes the connection reload the schema and send the same bytes
    again: only while the space (and index) names it was encoded from still
    stand for its ids.  A space dropped and another created in its place
    (taking its id) gets the refusal, applied False, not the row."""
    admin = connect(srv)
    conn = connect(srv)
    try:
        admin.eval("box.schema.space.create('named_x', {format = {{'id', 'unsigned'}}})"
                   ":create_index('pk')")
        conn.insert("named_x", (1,))                      # caches named_x -> its id
        admin.eval("box.schema.space.create('unrelated'):create_index('pk')")
        conn.insert("named_x", (2,))                      # 109, the same space: re-sent
        x_id = admin.eval("return box.space.named_x.id").data[0]
        admin.eval("box.space.named_x:drop() box.schema.space.create('named_y', {id = %d})"
                   ":create_index('pk')" % x_id)
        with pytest.raises(DatabaseError) as err:
            conn.insert("named_x", (3,))
        assert err.value.code == 109 and applied(err.value) is False
        assert admin.select("named_y").data == []
        # an index by name: another one took its id
        admin.eval("box.space.named_y:create_index('by_a', {parts = {1, 'unsigned'}})")
        assert conn.select("named_y", 1, index="by_a").data == []
        admin.eval("box.space.named_y.index.by_a:drop() "
                   "box.space.named_y:create_index('by_b', {parts = {1, 'unsigned'}})")
        with pytest.raises(DatabaseError) as err:
            conn.select("named_y", 1, index="by_a")
        assert err.value.code == 109 and applied(err.value) is False
    finally:
        admin.close()
        conn.close()


# -- request_timeout bounds the whole call -----------------------------------------


@pytest.mark.timing
@pytest.mark.parametrize("options", [
    pytest.param({"request_timeout": 2}, id="request_timeout"),
    # (The patience for a server that announced its shutdown: before 2.10 a
    # stop is a crash, bounded by connection_timeout per reconnect attempt.)
    pytest.param({"request_timeout": None, "connection_timeout": 2}, id="connection_timeout",
                 marks=needs_watchers)])
def test_no_call_outlives_its_bound_when_the_server_stops(srv, options):
    """50 greenlets writing; the server is SIGTERMed and stays down: every call
    ends within 2 s (``request_timeout``; without one, the patience for a
    restarting server, ``connection_timeout``, from each caller's arrival, so
    queued callers do not wait one after another) plus slack."""
    conn = connect(srv, **options)
    durations, errors = [], []
    stop = []

    def writer(i):
        n = 0
        while not stop:
            started = time.monotonic()
            try:
                conn.replace("kv", ("timed-%d" % i, n))
            except NetworkError as exc:
                errors.append(exc)
            finally:
                durations.append(time.monotonic() - started)
            n += 1

    workers = [gevent.spawn(writer, i) for i in range(50)]
    gevent.sleep(0.3)
    terminate(srv)
    gevent.sleep(3)
    stop.append(True)
    gevent.joinall(workers, timeout=10)
    assert all(w.ready() for w in workers)
    conn.close()
    assert errors
    assert max(durations) <= 2 + slack(0.5), max(durations)


@pytest.mark.timing
def test_a_request_object_timed_out_after_it_was_sent_may_have_been_applied(srv):
    """SQL goes as a tarantool-python Request object, whose sync is set when it
    is framed: a timeout after that is not "before the request was sent"."""
    conn = connect(srv, request_timeout=0.5)
    srv.signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(RequestTimeout) as err:
            conn.execute("INSERT INTO \"kv\" VALUES ('sql-stalled', 1)")
        assert time.monotonic() - started <= 0.5 + slack(0.5)
        assert applied(err.value) is None
    finally:
        srv.signal(signal.SIGCONT)
    gevent.sleep(0.2)
    assert conn.select("kv", "sql-stalled").data == [["sql-stalled", 1]]   # it did run
    conn.close()


@pytest.mark.timing
def test_calls_that_connect_before_they_send_end_within_request_timeout(srv):
    """A call that needs the connection before it frames its request (the
    schema, the server's features, a stream's session, a prepared statement's
    session, a pipeline's batch) reconnects within the call's
    ``request_timeout``, like any request: a server that accepts and never
    greets ends it there, applied False, not after connection_timeout times
    the attempts."""
    conn = connect(srv, request_timeout=0.5, connection_timeout=5, reconnect_max_attempts=1)
    statement = conn.prepare("SELECT ? AS x")
    never = gtarantool.Connection(srv.host, srv.port, user=USER, password=PASSWORD,
                                  connect_now=False, request_timeout=0.5,
                                  connection_timeout=5, reconnect_max_attempts=1)

    def pipeline_batch():
        p = conn.pipeline()
        for i in range(300):   # (the 256th hands a batch over)
            p.insert("kv", ("pipelined-%d" % i, i))

    calls = {
        "prepare": lambda: conn.prepare("SELECT 2"),
        "prepared execute": lambda: statement.execute([1]),
        "stream begin": lambda: conn.stream().begin(),
        "stream execute": lambda: conn.stream().execute("SELECT 1"),
        "watch_once": lambda: conn.watch_once("box.status"),
        "watch": lambda: conn.watch("box.status", lambda key, value: None),
        "pipeline batch": pipeline_batch,
        "first select": lambda: never.select("kv", "x"),
        "first call": lambda: never.call("echo", 1),
        "first insert by id": lambda: never.insert(999, ("x", 1)),
    }
    try:
        for name, call in calls.items():
            conn.close()
            srv.signal(signal.SIGSTOP)
            try:
                started = time.monotonic()
                with pytest.raises(RequestTimeout) as err:
                    gevent.with_timeout(20, call)
                took = time.monotonic() - started
            finally:
                srv.signal(signal.SIGCONT)
            assert took <= 0.5 + slack(0.5), (name, took)
            assert applied(err.value) is False, (name, err.value)
    finally:
        never.close()
        conn.close()


@pytest.mark.timing
def test_a_call_that_looks_its_space_up_first_ends_within_request_timeout(srv):
    """A space another client created is looked up before the request is
    encoded: the lookup's requests and then the call's own share the one
    ``request_timeout`` (each round trip here takes most of it), and what
    the error says about the request is true."""
    admin = connect(srv)
    conn = connect(srv, request_timeout=1.0)
    conn.ping()
    for i in range(3):
        admin.eval("box.schema.space.create('late%d'):create_index('pk')" % i)
    admin.eval("""
        local clock, fiber = require('clock'), require('fiber')
        hogging = true
        fiber.create(function()
            while hogging do
                local t = clock.monotonic()
                while clock.monotonic() - t < 0.9 do end
                fiber.sleep(0.001)
            end
        end)""")
    gevent.sleep(0.5)
    outcomes = []
    try:
        for i in range(3):
            started = time.monotonic()
            try:
                conn.insert("late%d" % i, (i,))
                outcomes.append(True)
            except DatabaseError as exc:   # timed out, or refused without the time to resend
                outcomes.append(applied(exc))
            took = time.monotonic() - started
            assert took <= 1.0 + slack(0.3), (i, took)
    finally:
        admin.eval("hogging = false")
    for i, outcome in enumerate(outcomes):
        if outcome is False:
            assert admin.eval("return box.space.late%d:len()" % i).data == [0]
    conn.close()
    admin.close()



@pytest.mark.timing
@pytest.mark.parametrize("method", ["call", "eval"])
def test_a_first_call_that_connects_ends_within_request_timeout(srv, method):
    """A connection made with ``connect_now=False`` connects in its first
    call: through a proxy that delays every reply, the connect (greeting,
    authentication, schema) takes most of ``request_timeout`` and the
    function then sleeps; the connect and the call share the one deadline."""
    from gtarantool.testing.faults import FaultProxy
    with FaultProxy(srv.host, srv.port) as proxy:
        proxy.delay = 0.12
        conn = gtarantool.Connection(proxy.host, proxy.port, user=USER, password=PASSWORD,
                                     connect_now=False, request_timeout=1.0)
        started = time.monotonic()
        try:
            if method == "call":
                conn.call("sleep_and_return", 0.8, 1)
            else:
                conn.eval("require('fiber').sleep(0.8) return 1")
        except RequestTimeout as exc:
            assert applied(exc) is None   # written: it may still run
        took = time.monotonic() - started
        conn.close()
    assert took <= 1.0 + slack(0.3), took

@pytest.mark.timing
def test_a_pipeline_waiting_for_room_ends_within_request_timeout(srv):
    """A pipeline's batch waits for room in ``max_in_flight`` within
    ``request_timeout``; the requests it could not hand over hold a
    RequestTimeout, applied False."""
    conn = connect(srv, request_timeout=0.5, max_in_flight=10)
    conn.ping()
    srv.signal(signal.SIGSTOP)
    try:
        p = conn.pipeline()
        started = time.monotonic()
        with pytest.raises(RequestTimeout) as err:
            gevent.with_timeout(20, lambda: [p.insert("kv", ("room-%d" % i, i))
                                             for i in range(300)])
        assert time.monotonic() - started <= 0.5 + slack(0.5)
        assert applied(err.value) is False
    finally:
        srv.signal(signal.SIGCONT)
    outcomes = [applied(r) for r in p.results()]
    assert outcomes[:10] == [None] * 10 or all(o is not False for o in outcomes[:10])
    assert outcomes[10:256] == [False] * 246   # (never handed over)
    conn.close()


def test_a_pipeline_killed_while_waiting_for_room_says_its_requests_were_not_sent(srv):
    conn = connect(srv, max_in_flight=10)
    conn.ping()
    p = conn.pipeline()
    srv.signal(signal.SIGSTOP)
    try:
        filler = gevent.spawn(lambda: [p.insert("kv", ("killed-%d" % i, i))
                                       for i in range(300)])
        gevent.sleep(0.3)
        assert not filler.ready()   # (the 256th waits for room)
        filler.kill()
    finally:
        srv.signal(signal.SIGCONT)
    results = p.results()
    assert len(results) == 256
    unsent = [r for r in results[10:] if applied(r) is False]
    assert len(unsent) == 246 and all(isinstance(r, NetworkError) for r in unsent)
    assert len(p.failures()) == 246
    conn.close()


# -- graceful restarts -------------------------------------------------------------


def _transports(conn):
    """The transports ``conn`` made that are still alive (a test before this
    one in the process may have left its own)."""
    gc.collect()
    return sum(1 for obj in gc.get_objects()
               if isinstance(obj, Transport) and obj.stats is conn.stats)


@needs_watchers
def test_graceful_restarts_keep_no_drained_transport(srv):
    conn = connect(srv, request_timeout=10)
    try:
        for n in range(5):
            conn.replace("kv", ("restarts", n))
            terminate(srv)
            in_thread(srv.start)
            conn.replace("kv", ("restarts", n))
        # (the last drain closes its socket soon: a loaded host takes longer)
        deadline = time.monotonic() + 5
        while _transports(conn) > 2 and time.monotonic() < deadline:
            gevent.sleep(0.05)
        assert _transports(conn) <= 2
    finally:
        conn.close()


@needs_watchers
@pytest.mark.timing
def test_a_permanent_follower_refuses_at_once_after_a_reconnect(srv):
    """An election voter (read-only, not configured so) that was never
    restarting: a write fails at once, not after a wait for it to become writable."""
    conn = connect(srv, request_timeout=5)
    try:
        conn.eval("box.cfg{election_mode = 'voter'}")
        conn.close()   # the next request reconnects
        started = time.monotonic()
        with pytest.raises(DatabaseError) as err:
            conn.replace("kv", ("follower", 1))
        assert err.value.code == 7 and applied(err.value) is False
        assert time.monotonic() - started < slack(1)
    finally:
        conn.close()


def test_callers_in_line_on_a_draining_socket_send_nothing_on_it(reader):
    a, b = socket.socketpair()
    a.setblocking(False)
    transport = Transport(a, Stats(), 1, 1 << 20)
    try:
        first = gevent.spawn(transport.request, 1, 64, 0, b"\x80")
        second = gevent.spawn(transport.request, 2, 64, 0, b"\x80")
        gevent.sleep(0.05)
        assert transport.in_flight == 1 and not second.ready()
        sent = b.recv(1000)
        transport.drain()
        with pytest.raises(Draining) as err:
            second.get(timeout=2)
        assert applied(err.value) is False
        b.setblocking(False)
        with pytest.raises(BlockingIOError):
            b.recv(1000)   # nothing more than the first request
        assert sent
        first.kill()
    finally:
        transport.close()
        b.close()


# -- the pool --------------------------------------------------------------------

REFUSE = """
box.space.kv:before_replace(function(old, new)
    if new ~= nil and new[1] == 'refused' then box.error({code = %d, reason = 'refused'}) end
end)
"""


class Picker(gtarantool.RoundRobinStrategy):
    """The default rotation, as a strategy of the caller's: picks go through it,
    so a re-route takes the instance after the one that refused."""


@pytest.mark.parametrize("code, strategy", [(214, gtarantool.RoundRobinStrategy),
                                            (227, Picker), (228, Picker)],
                         ids=["214-default", "227-custom", "228-custom"])
def test_two_writable_instances_refusing_end_within_wait_timeout(routes, code, strategy):
    servers = [TarantoolServer(_lua()) for _ in range(2)]
    for srv in servers:
        srv.start()
    try:
        for srv in servers:
            with connect(srv) as conn:
                conn.eval(REFUSE % code)
        pool = gtarantool.ConnectionPool(["%s:%s" % (s.host, s.port) for s in servers],
                                         user=USER, password=PASSWORD, wait_timeout=1,
                                         refresh_delay=0.2, strategy_class=strategy)
        try:
            started = time.monotonic()
            with pytest.raises(DatabaseError) as err:
                pool.replace("kv", ("refused", 1))
            assert err.value.code == code and applied(err.value) is False
            assert time.monotonic() - started < 1 + slack(1)
            assert pool.replace("kv", ("accepted", 1)).data == [["accepted", 1]]
        finally:
            pool.close()
    finally:
        for srv in servers:
            srv.cleanup()


# -- fork --------------------------------------------------------------------------


@pytest.fixture
def replicaset():
    rs = ReplicaSet(_lua(), replicas=1, user=USER, password=PASSWORD)
    rs.start()
    yield rs
    rs.cleanup()


def test_a_write_waiting_for_a_master_is_applied_once_across_a_fork(replicaset, routes):
    """A pool write waits for a master; the process forks; the child runs its
    hub (a preforked worker); a replica is promoted.  Only the parent's call
    sends the write: the counter reads 1."""
    rs = replicaset
    pool = gtarantool.ConnectionPool(rs.addrs, user=USER, password=PASSWORD, wait_timeout=15,
                                     refresh_delay=0.2, request_timeout=10)
    try:
        rs.eval(rs.master, "box.cfg{read_only = true}")
        deadline = time.monotonic() + 10
        while any(i["role"] == "master" for i in pool.info().values()):
            assert time.monotonic() < deadline, pool.info()
            gevent.sleep(0.05)
        write = gevent.spawn(pool.upsert, "kv", ("fork-counter", 1), [("+", 1, 1)])
        gevent.sleep(0.2)
        assert not write.ready()
        pid = children.fork()
        if pid == 0:
            gevent.get_hub().exception_stream = None
            try:
                gevent.sleep(5)   # the child's hub runs: its copies of everything too
            finally:
                os._exit(0)
        try:
            gevent.sleep(0.5)
            new_master = rs.replicas[0]
            rs.promote(new_master)
            write.get(timeout=10)
        finally:
            children.wait(pid)
        with connect(new_master) as conn:
            assert conn.select("kv", "fork-counter").data == [["fork-counter", 1]]
    finally:
        pool.close()


def _in_child(body):
    """Fork; run ``body()`` in the child (its hub running) and return what it
    returns (a JSON value), as the parent reads it."""
    r, w = os.pipe()
    pid = children.fork()
    if pid == 0:
        status = 1
        try:
            os.close(r)
            gevent.get_hub().exception_stream = None
            with gevent.Timeout(20):
                os.write(w, json.dumps(body()).encode())
            status = 0
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            os.write(w, json.dumps({"crash": repr(exc)}).encode())
        finally:
            os._exit(status)
    os.close(w)
    gevent.os.make_nonblocking(r)
    data = b""
    try:
        with gevent.Timeout(30):
            while True:
                chunk = gevent.os.nb_read(r, 65536)
                if not chunk:
                    break
                data += chunk
    finally:
        os.close(r)
        children.wait(pid)
    return json.loads(data.decode())


def _outcome(glet):
    exc = glet.exception
    if exc is None:
        return None
    return ["ConnectionClosed" if isinstance(exc, ConnectionClosed) else type(exc).__name__,
            applied(exc)]


def test_a_reconnect_copied_into_a_child_stops_there(reader, tmp_path):
    """A caller reconnecting (the lock held, between attempts) when the process
    forks: its copy in the child gets CopiedCall (a ConnectionClosed, "may have
    been applied": the parent's call goes on) and makes no attempt there (and
    releases the lock it took); the child's own call gets its own outcome."""
    path = str(tmp_path / "nobody.sock")   # nothing listens: every attempt is refused
    conn = gtarantool.Connection(None, path, connect_now=False, reconnect_max_attempts=3,
                                 reconnect_delay=0.3)
    parent = gevent.spawn(conn.ping)
    gevent.sleep(0.1)
    assert not parent.ready()

    def child():
        own = gevent.spawn(conn.ping)
        gevent.joinall([own, parent])
        return {"copy": _outcome(parent), "own": _outcome(own)}

    got = _in_child(child)
    assert got == {"copy": ["ConnectionClosed", None], "own": ["NetworkError", False]}, got
    parent.join(timeout=5)
    assert isinstance(parent.exception, NetworkError)
    assert not isinstance(parent.exception, ConnectionClosed)


@pytest.mark.parametrize("method", ["update", "upsert"])
def test_an_unknown_field_name_says_the_request_was_not_sent(srv, method):
    """An operation naming a field the space lacks raises SchemaError before
    anything is sent: ``applied`` False, as for an unknown space or index."""
    conn = connect(srv)
    with pytest.raises(SchemaError) as err:
        if method == "update":
            conn.update("tester", 1, [("=", "no_such_field", 1)])
        else:
            conn.upsert("tester", (1, "a"), [("=", "no_such_field", 1)])
    assert applied(err.value) is False
    conn.close()
