"""Restarts, crashes and switchovers on real servers: what callers see.

A graceful restart (SIGTERM, the server started again at once) under load on
one connection; the read-only window of a server that has just restarted; a
crash (kill -9); a server dropping an idle connection; a rolling restart of a
replica set with a switchover through the pool.  Servers are stopped and
started from gevent's thread pool (or polled), so the hub keeps running.
"""
import json
import os
import signal
import time

import gevent
import gevent.os
import pytest
from tarantool.error import DatabaseError, NetworkError

import gtarantool
from gtarantool import ConnectionClosed, Mode, RequestTimeout, graceful
from gtarantool.connection import Connection
from gtarantool.pool import ConnectionPool
from gtarantool.testing.replicaset import ReplicaSet
from gtarantool.testing.server import TarantoolServer, binary_version

from . import children
from .timing import slack

USER, PASSWORD = "test", "secret"
SHUTDOWN = binary_version() >= (2, 10)   # box.shutdown, box.status and watchers
needs_shutdown = pytest.mark.skipif(not SHUTDOWN, reason="box.shutdown needs Tarantool 2.10+")
# Tarantool waits this long for clients watching box.shutdown to close.
SERVER_SHUTDOWN_TIMEOUT = 3.0

LUA = """
box.once('restarts', function()
    box.schema.user.create('test', {password = 'secret'})
    box.schema.user.grant('test', 'read,write,execute', 'universe')
    local s = box.schema.space.create('t')
    s:create_index('pk')
end)
local ffi = require('ffi')
pcall(ffi.cdef, 'int shutdown(int, int);')
-- The server closes session sid's socket, as an idle timeout does.
function drop_session(sid) return ffi.C.shutdown(box.session.fd(sid), 2) end
"""


def connect(srv, **kw):
    return gtarantool.connect(srv.host, srv.port, user=USER, password=PASSWORD, **kw)


def in_thread(fn, *args):
    return gevent.get_hub().threadpool.spawn(fn, *args).get()


def wait_until(predicate, timeout=10.0, step=0.01):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met within %ss" % timeout
        gevent.sleep(step)


def terminate(srv):
    """SIGTERM ``srv`` and wait for it to exit: the seconds it took."""
    started = time.monotonic()
    srv.signal(signal.SIGTERM)
    wait_until(lambda: srv.process.poll() is not None, timeout=30)
    return time.monotonic() - started


@pytest.fixture
def srv():
    server = TarantoolServer(LUA)
    server.start()
    yield server
    server.cleanup()


class Load:
    """``writers`` greenlets inserting keys of their own and ``readers``
    selecting, on ``target`` (a connection or a pool), until ``stop()``."""

    def __init__(self, target, writers=100, readers=100, read_mode=None):
        self.target = target
        self.acked, self.errors, self.waits = [], [], []
        self._stop = False
        self._read = {} if read_mode is None else {"mode": read_mode}
        self.greenlets = ([gevent.spawn(self._write, i) for i in range(writers)]
                          + [gevent.spawn(self._reads, i) for i in range(readers)])

    def _write(self, i):
        n = 0
        while not self._stop:
            key = i * 10_000_000 + n
            n += 1
            started = time.monotonic()
            try:
                self.target.insert("t", (key, i))
            except Exception as exc:  # noqa: BLE001 - what callers see, asserted by the test
                self.errors.append(exc)
                continue
            self.waits.append(time.monotonic() - started)
            self.acked.append(key)

    def _reads(self, i):
        while not self._stop:
            try:
                self.target.select("t", i, **self._read)
            except Exception as exc:  # noqa: BLE001 - as above
                self.errors.append(exc)

    def stop(self, timeout=30):
        self._stop = True
        done = gevent.joinall(self.greenlets, timeout=timeout)
        assert len(done) == len(self.greenlets), "callers hung"


def keys_on(srv):
    with connect(srv, fetch_schema=False) as conn:
        return conn.eval("local r = {} for _, t in box.space.t:pairs() do r[#r + 1] = t[1] end "
                         "return r").data[0]


# -- one server ----------------------------------------------------------------------

@pytest.mark.timing
def test_graceful_restart_under_load(srv):
    """SIGTERM under 200 greenlets on one connection, the server started again
    at once.  2.10+: no caller sees an error; the requests written before the
    shutdown get their replies, the others wait for the restarted server; the
    server exits as soon as the replies are out, not after its shutdown timeout.
    2.6 has no box.shutdown: the server just closes the socket, and each request
    in flight then fails with NetworkError (applied or not: the caller cannot
    know); the requests after it reconnect and succeed."""
    conn = connect(srv, request_timeout=8)
    load = Load(conn)
    gevent.sleep(0.3)
    acked_before = len(load.acked)
    took = terminate(srv)
    in_thread(srv.start)
    gevent.sleep(0.5)
    load.stop()
    assert len(load.acked) > acked_before   # the load went on after the restart
    keys = keys_on(srv)
    assert len(keys) == len(set(keys))
    assert set(load.acked) <= set(keys)     # every acknowledged write is there
    assert conn.stats.reconnects == 1
    if SHUTDOWN:
        assert load.errors == []
        assert sorted(keys) == sorted(load.acked)   # nothing applied twice or unacknowledged
        assert took < SERVER_SHUTDOWN_TIMEOUT, "the server waited for the client to close"
    else:
        assert load.errors, "2.6 drops the socket under the requests in flight"
        assert all(isinstance(exc, NetworkError) for exc in load.errors), load.errors[:3]
        assert len(load.errors) <= 200       # at most one per caller: those in flight
        failed_writes = len(load.errors)
        assert len(load.acked) <= len(keys) <= len(load.acked) + failed_writes
    conn.close()


def _forked_load(conn, pool, stop_fd, report_fd):
    """In a forked child: greenlets writing and reading through the inherited
    ``conn`` and ``pool`` until ``stop_fd`` reaches EOF; then the errors they
    saw and the connect attempts the child made, as JSON on ``report_fd``."""
    status = 1
    try:
        gevent.get_hub().exception_stream = None   # (copies of the parent's greenlets)
        attempts = [0]
        connect_tcp = Connection.connect_tcp

        def counted(self):
            attempts[0] += 1
            return connect_tcp(self)

        Connection.connect_tcp = counted
        errors, done = [], [0]
        stop = gevent.spawn(gevent.os.nb_read, stop_fd, 1)

        def run(i):
            n = 0
            while not stop.ready():
                n += 1
                try:
                    conn.replace("t", (i, n))
                    pool.select("t", i, mode=Mode.ANY)
                    done[0] += 1
                except Exception as exc:  # noqa: BLE001 - reported to the parent
                    errors.append(repr(exc))
                    gevent.sleep(0.05)

        gevent.joinall([gevent.spawn(run, i) for i in range(10)], timeout=60)
        os.write(report_fd, json.dumps({"errors": errors[:10], "failed": len(errors),
                                        "done": done[0], "attempts": attempts[0]}).encode())
        status = 0
    finally:
        os._exit(status)


@needs_shutdown
def test_a_forked_childs_connections_come_back_after_graceful_restarts(srv):
    """A child forked after the parent used a connection and a pool (whose
    connections retry with ``reconnect_delay`` 0) uses both through three
    graceful restarts: no caller sees an error, and while the server is down
    the child retries every ``graceful.RETRY_DELAY``, not in a loop that takes
    the CPU the restarting server needs (which made workers of a preforking
    server miss their ``request_timeout``)."""
    conn = connect(srv, request_timeout=5)
    pool = ConnectionPool([{"host": srv.host, "port": srv.port}], user=USER, password=PASSWORD,
                          request_timeout=5, wait_timeout=5)
    conn.ping()
    pool.ping(mode=Mode.ANY)
    stop_r, stop_w = os.pipe()
    report_r, report_w = os.pipe()
    pid = children.fork()
    if pid == 0:
        os.close(stop_w)
        os.close(report_r)
        gevent.os.make_nonblocking(stop_r)
        _forked_load(conn, pool, stop_r, report_w)
    os.close(stop_r)
    os.close(report_w)
    down = 0.0
    try:
        gevent.sleep(0.3)   # the child adopted both and is under way
        for _ in range(3):
            started = time.monotonic()
            terminate(srv)
            in_thread(srv.start)
            down += time.monotonic() - started
            gevent.sleep(0.3)
    finally:
        os.close(stop_w)
        gevent.os.make_nonblocking(report_r)
        data = b""
        with gevent.Timeout(30):
            while True:
                chunk = gevent.os.nb_read(report_r, 65536)
                if not chunk:
                    break
                data += chunk
        os.close(report_r)
        status = children.wait(pid)
        pool.close()
        conn.close()
    assert status == 0
    child = json.loads(data.decode())
    assert child["failed"] == 0, child["errors"]
    assert child["done"] > 0
    # Two connections (the connection, the pool's), each retrying at most once
    # per RETRY_DELAY while the server is down, plus one connect per restart.
    bound = 2 * (down / graceful.RETRY_DELAY + 3) * 2
    assert child["attempts"] <= bound, (child["attempts"], down)


@needs_shutdown
def test_a_write_waits_while_the_restarted_server_becomes_writable(srv):
    """Restarted read-only but not configured so (here: election_mode=manual, a
    follower until promoted, as a server in its last moments of recovery): a
    write refused with ER_READONLY waits for box.status to say writable and is
    sent again, once; reads go on meanwhile."""
    conn = connect(srv, request_timeout=8)
    conn.insert("t", (1, "before"))
    terminate(srv)
    srv.cfg["election_mode"] = "manual"
    in_thread(srv.start)
    write = gevent.spawn(conn.insert, "t", (2, "after"))
    gevent.sleep(0.5)
    assert not write.ready()                 # waiting, not failed
    assert conn.select("t", 1).data == [[1, "before"]]
    with connect(srv, fetch_schema=False) as admin:
        admin.eval("box.ctl.promote()")
    assert write.get(timeout=5).data == [[2, "after"]]
    assert sorted(keys_on(srv)) == [1, 2]
    conn.close()


@needs_shutdown
@pytest.mark.parametrize("request_timeout", [None, 20])
def test_requests_in_line_at_an_announced_shutdown_go_to_the_next_socket(request_timeout):
    """Two slow calls hold max_in_flight=2 when the server announces its
    shutdown; a plain insert, a stream's insert outside a transaction, an SQL
    INSERT, a stream's transaction, a pipeline's inserts and a select_many
    wait in line: none is sent on the draining socket, each goes to the
    restarted server's, once."""
    srv = TarantoolServer(LUA + "box.once('restarts-sql', function() "
                          "box.execute([[CREATE TABLE sql_t (id INTEGER PRIMARY KEY)]]) end)",
                          cfg={"memtx_use_mvcc_engine": True})
    srv.start()
    conn = connect(srv, max_in_flight=2, request_timeout=request_timeout)
    try:
        plain, tx = conn.stream(), conn.stream()
        plain.insert("t", (0, "stream"))   # (the stream is in use before)
        holders = [gevent.spawn(conn.eval, "require('fiber').sleep(1)") for _ in range(2)]
        gevent.sleep(0.1)

        def transaction():
            tx.begin()
            tx.insert("t", (4, "tx"))
            tx.commit()

        def pipelined(queue):
            p = conn.pipeline()
            queue(p)
            return p.results()
        calls = [gevent.spawn(conn.insert, "t", (1, "plain")),
                 gevent.spawn(plain.insert, "t", (2, "stream")),
                 gevent.spawn(conn.execute, "INSERT INTO sql_t VALUES (3)"),
                 gevent.spawn(transaction),
                 gevent.spawn(pipelined, lambda p: [p.insert("t", (k, "piped")) for k in (5, 6)]),
                 gevent.spawn(pipelined, lambda p: p.select_many("t", [0]))]
        gevent.sleep(0.1)
        assert not any(call.ready() for call in calls)   # in line
        srv.signal(signal.SIGTERM)
        wait_until(lambda: srv.process.poll() is not None, timeout=30)
        in_thread(srv.start)
        gevent.joinall(holders + calls, timeout=30)
        assert [call.exception for call in holders + calls] == [None] * 8
        assert [r.data for r in calls[4].value] == [[[5, "piped"]], [[6, "piped"]]]
        assert [r.data for r in calls[5].value] == [[[0, "stream"]]]
        assert sorted(keys_on(srv)) == [0, 1, 2, 4, 5, 6]
        assert conn.execute("SELECT id FROM sql_t WHERE id = 3").data == [[3]]
    finally:
        conn.close()
        srv.cleanup()


@needs_shutdown
@pytest.mark.timing
def test_a_server_configured_read_only_refuses_at_once(srv):
    conn = connect(srv, request_timeout=8)
    conn.ping()
    terminate(srv)
    srv.cfg["read_only"] = True
    in_thread(srv.start)
    started = time.monotonic()
    with pytest.raises(DatabaseError) as err:
        conn.insert("t", (3, "x"))
    assert err.value.code == 7
    assert time.monotonic() - started < slack(2)   # a reconnect and one refusal, no wait
    conn.close()


@needs_shutdown
@pytest.mark.timing
def test_callers_wait_at_most_request_timeout_for_a_server_that_stays_down(srv):
    conn = connect(srv, request_timeout=1)
    conn.ping()
    terminate(srv)
    started = time.monotonic()
    with pytest.raises((NetworkError, RequestTimeout)):
        conn.ping()
    assert 0.5 < time.monotonic() - started < 1 + slack(2)
    conn.close()


def test_kill_9_under_load(srv):
    """A crash: the requests in flight fail with NetworkError (no hang), every
    acknowledged write survives, the connection works again once the server
    is back."""
    conn = connect(srv, request_timeout=8)
    load = Load(conn)
    gevent.sleep(0.3)
    srv.kill()
    gevent.sleep(0.2)
    in_thread(srv.start)
    gevent.sleep(0.5)
    load.stop()
    assert load.errors
    assert all(isinstance(exc, (NetworkError, ConnectionClosed)) for exc in load.errors), \
        load.errors[:3]
    keys = keys_on(srv)
    assert set(load.acked) <= set(keys) and len(keys) == len(set(keys))
    assert conn.ping() is not None
    conn.close()


# -- a connection the server drops ---------------------------------------------------------

@needs_shutdown
def test_watchers_come_back_by_themselves_after_the_server_drops_the_socket(srv):
    """The server closes an idle connection holding only a watcher: it
    reconnects with no request, and the callback sees the value set after."""
    conn = connect(srv)
    seen = []
    conn.watch("k", lambda key, value: seen.append(value))
    wait_until(lambda: seen == [None])
    sid = conn.eval("return box.session.id()").data[0]
    with connect(srv, fetch_schema=False) as admin:
        admin.call("drop_session", sid)
        wait_until(lambda: conn.stats.reconnects == 1)
        admin.eval("box.broadcast('k', 'after')")
    wait_until(lambda: seen[-1] == "after")
    assert conn._transport is not None and not conn.is_closed()
    conn.close()


@needs_shutdown
def test_a_connection_closed_by_the_servers_idle_timeout_comes_back_by_itself(srv):
    """3.x closes connections of a user idle longer than its idle timeout
    (``session.users.<name>.idle_timeout`` in its config): a connection holding
    a watcher reconnects, and the callback sees the values set after."""
    with connect(srv, fetch_schema=False) as admin:
        if not admin.eval("return box.internal.session ~= nil "
                          "and box.internal.session.idle_timeout_set ~= nil").data[0]:
            pytest.skip("no session idle timeout in this server (Tarantool 3.x config)")
        admin.eval("box.internal.session.idle_timeout_set('test', 0.3)")
    try:
        conn = connect(srv)
        seen = []
        conn.watch("idle", lambda key, value: seen.append(value))
        wait_until(lambda: seen == [None])
        wait_until(lambda: conn.stats.reconnects >= 1, timeout=5)
        with connect(srv, fetch_schema=False) as admin:
            admin.eval("box.broadcast('idle', 'later')")
        wait_until(lambda: seen[-1] == "later")
        conn.close()
    finally:
        with connect(srv, fetch_schema=False) as admin:
            admin.eval("box.internal.session.idle_timeout_reset()")


def test_callers_arriving_while_a_reconnect_authenticates_wait_for_it(srv):
    """The server drops the socket ten times under callers that keep arriving:
    those in flight fail (the socket is gone), but none is sent on the next
    socket before its authentication, where it would run as guest (who may
    not write to ``t``)."""
    conn = connect(srv, request_timeout=5)
    errors, stop = [], []

    def caller(i):
        n = 0
        while not stop:
            n += 1
            try:
                conn.replace("t", (i, n))
            except Exception as exc:  # noqa: BLE001 - asserted below
                errors.append(exc)
            gevent.sleep(0.0005 * (i % 7))   # (so that callers arrive at any moment)

    callers = [gevent.spawn(caller, i) for i in range(50)]
    try:
        with connect(srv, fetch_schema=False) as admin:
            for drop in range(10):
                sid = conn.eval("return box.session.id()").data[0]
                admin.call("drop_session", sid)
                wait_until(lambda: conn.stats.reconnects > drop)
                gevent.sleep(0.02)
    finally:
        stop.append(True)
        gevent.joinall(callers, timeout=10)
        conn.close()
    refused = [exc for exc in errors if not isinstance(exc, (NetworkError, ConnectionClosed))]
    assert not refused, refused[:3]


def test_an_idle_connection_the_server_dropped_serves_the_next_request(srv):
    conn = connect(srv)
    sid = conn.eval("return box.session.id()").data[0]
    with connect(srv, fetch_schema=False) as admin:
        admin.call("drop_session", sid)
    wait_until(conn.is_closed if not SHUTDOWN else lambda: conn.stats.reconnects == 1)
    assert conn.eval("return box.session.id()").data[0] != sid
    conn.close()


# -- a replica set through the pool ---------------------------------------------------------

@pytest.fixture
def rs():
    replicaset = ReplicaSet(LUA, user=USER, password=PASSWORD)
    replicaset.start()
    yield replicaset
    replicaset.cleanup()


def _role(pool, srv):
    return pool.info()["%s:%s" % (srv.host, srv.port)]["role"]


def test_rolling_restart_with_switchover_through_the_pool(rs, routes):
    """Replicas restarted one by one, the master switched over (read_only on
    it, a replica caught up with it, read_only off there) and restarted
    read-only, under 60 writers in RW and 60 readers in PREFER_RO: no caller
    sees an error; every acknowledged write is on the new master.  Writes the
    old master refused with ER_READONLY went to the new one (counted).  2.6
    announces no shutdown: the requests in flight on a restarting instance fail
    with NetworkError."""
    master, r1, r2 = rs.servers
    pool = gtarantool.ConnectionPool(rs.addrs, user=USER, password=PASSWORD, wait_timeout=8,
                                     request_timeout=8, refresh_delay=0.1,
                                     connection_timeout=2)
    load = Load(pool, writers=60, readers=60, read_mode=Mode.PREFER_RO)
    try:
        gevent.sleep(0.2)
        for replica in (r1, r2):
            terminate(replica)
            in_thread(replica.start)
            wait_until(lambda: _role(pool, replica) == "replica")
        with connect(master, fetch_schema=False) as admin:
            admin.eval("box.cfg{read_only = true}")
        rs.wait_caught_up(r1, master)
        rs.promote(r1)
        wait_until(lambda: _role(pool, r1) == "master")
        terminate(master)
        master.cfg["read_only"] = True
        in_thread(master.start)
        wait_until(lambda: _role(pool, master) == "replica")
        gevent.sleep(0.2)
        load.stop()
        if SHUTDOWN:
            assert load.errors == []
        else:
            assert all(isinstance(exc, NetworkError) for exc in load.errors), load.errors[:3]
            assert len(load.errors) <= 3 * 120   # at most one per caller and restart
        # (writes the old master committed after the first wait come from its WAL)
        rs.wait_caught_up(r1, master)
        keys = keys_on(r1)
        assert set(load.acked) <= set(keys)
        assert len(keys) == len(set(keys))
        rerouted = sum(info["rerouted"] for info in pool.info().values())
        assert pool.rerouted_writes == rerouted
        print("writes re-routed after ER_READONLY: %d of %d; errors seen by callers: %d"
              % (rerouted, len(load.acked), len(load.errors)))
    finally:
        load.stop()
        pool.close()


@needs_shutdown
@pytest.mark.timing
def test_an_instance_announcing_shutdown_leaves_the_rotation_at_once(rs):
    """A replica told to stop (its on_shutdown trigger keeps it up two seconds
    after the announcement): the pool stops routing reads to it at once, while
    the process still runs, and takes it back once restarted."""
    master, r1, r2 = rs.servers
    with connect(r2, fetch_schema=False) as admin:
        admin.eval("box.ctl.on_shutdown(function() require('fiber').sleep(2) end)")
    pool = gtarantool.ConnectionPool(rs.addrs, user=USER, password=PASSWORD, wait_timeout=8,
                                     request_timeout=8, refresh_delay=60,
                                     connection_timeout=2)   # (the event, not a check)
    try:
        wait_until(lambda: _role(pool, r2) == "replica")
        r2.signal(signal.SIGTERM)
        wait_until(lambda: not pool.info()["%s:%s" % (r2.host, r2.port)]["healthy"],
                   timeout=slack(0.5))
        assert r2.process.poll() is None     # still running: the pool did not wait for it
        routed = pool.info()["%s:%s" % (r2.host, r2.port)]["requests"]
        for i in range(50):
            pool.select("t", i, mode=Mode.PREFER_RO)
            pool.select("t", i, mode=Mode.RO)
            pool.select("t", i, mode=Mode.ANY)
        assert pool.info()["%s:%s" % (r2.host, r2.port)]["requests"] == routed
        wait_until(lambda: r2.process.poll() is not None)
        in_thread(r2.start)
        wait_until(lambda: _role(pool, r2) == "replica")
    finally:
        pool.close()
