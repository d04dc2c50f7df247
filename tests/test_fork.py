"""A connection and a pool made before a fork serve the child and the parent at once,
each process on its own socket: the child's first use opens its own, and the
parent's stream is never read nor written by the child.  The same whether the
fork runs Python's at-fork hooks (``os.fork``, multiprocessing) or not (a fork
made from C, as uWSGI's prefork: here ``fork()`` called through ctypes).
Other OS threads still get ``WrongOwner``.

Both processes run greenlets that write and read back keys of their own; a
reply carrying another request's data, a reply the other process took (its
caller times out), or a request sent twice (the server's REPLACE count) fails
the test.
"""
import ctypes
import json
import multiprocessing
import os
import threading
import traceback

import gevent
import gevent.os
import pytest
from gevent import Timeout
from tarantool.connection_pool import Mode

import gtarantool
from gtarantool import ConnectionClosed, WrongOwner, compiled
from gtarantool.testing.replicaset import ReplicaSet
from gtarantool.testing.server import binary_version
from tests import children
from tests.conftest import PASSWORD, USER, _lua

pytestmark = pytest.mark.usefixtures("reader")

GREENLETS = 10
ROUNDS = 30
# PyDLL keeps the GIL held across the call, as a C program forking has no other
# Python thread to race; libc's fork() runs pthread_atfork handlers only.
_c_fork = ctypes.PyDLL(None).fork
FORKS = {"os.fork": os.fork, "fork from C": _c_fork}


def _worker(client, tag, index, rounds, report, mode=None):
    """Write and read back key ``tag-index`` ``rounds`` times; count what went
    right, and record anything else.  A copy of this greenlet in a forked child
    (it was running in the parent at the fork) stops at once, recording how its
    request in flight ended there."""
    me = os.getpid()
    key = "%s-%d" % (tag, index)
    extra = {} if mode is None else {"mode": mode}
    for n in range(rounds):
        for op in ("replace", "select"):
            if os.getpid() != me:
                return
            try:
                if op == "replace":
                    got = client.replace("kv", (key, n), **extra)
                else:
                    got = client.select("kv", key, **extra)
            except ConnectionClosed as exc:
                if os.getpid() != me:
                    report["copies failed"] += 1
                    return
                report["errors"].append("%s %s: %r" % (op, key, exc))
                return
            except Exception as exc:  # noqa: BLE001 - recorded, the test fails on it
                report["errors"].append("%s %s: %r" % (op, key, exc))
                return
            if os.getpid() != me:
                return   # its reply was read before the fork: the parent's bytes, not the stream
            if got.data != [[key, n]]:
                report["wrong"].append("%s %s round %d got %r" % (op, key, n, got.data))
            elif op == "replace":
                report["replaces"] += 1
    if mode is not None and os.getpid() == me:   # the pool: a read from any instance
        got = client.select("kv", "static-%d" % index, mode=Mode.ANY)
        if got.data != [["static-%d" % index, index]]:
            report["wrong"].append("static-%d got %r" % (index, got.data))


def _new_report():
    return {"replaces": 0, "errors": [], "wrong": [], "copies failed": 0}


def _run(client, tag, mode=None):
    report = _new_report()
    workers = [gevent.spawn(_worker, client, tag, i, ROUNDS, report, mode)
               for i in range(GREENLETS)]
    return report, workers


def _fork_and_run(fork, client, mode=None, before_fork=None):
    """Start the parent's workers, fork while their requests are in flight, run
    the child's workers there at the same time; returns both reports (the
    child's as it sent it back) and the child's exit status."""
    parent, workers = _run(client, "parent", mode)
    # Fork once their first replies are in and their next requests in flight (or
    # queued): each reply takes a worker a turn of the hub at least, so polling at
    # every turn forks long before its 30 rounds end (a fixed sleep may outlast
    # them all: they take about 15 ms).
    with Timeout(10):
        while parent["replaces"] < GREENLETS and not any(w.ready() for w in workers):
            gevent.sleep(0)
    assert not any(w.ready() for w in workers), parent
    r, w = os.pipe()
    pid = children.fork(fork)
    if pid == 0:
        status = 1
        try:
            os.close(r)
            # The copies of the parent's workers fail here: no tracebacks for them.
            gevent.get_hub().exception_stream = None
            with Timeout(30):
                child, own = _run(client, "child", mode)
                gevent.joinall(own)
                child["pid"] = os.getpid()
                child["transport"] = id(getattr(client, "_transport", None))
            os.write(w, json.dumps(child).encode())
            status = 0
        except BaseException:  # noqa: BLE001 - reported to the parent
            os.write(w, json.dumps({"crash": traceback.format_exc()}).encode())
        finally:
            os._exit(status)
    os.close(w)
    data = b""
    try:
        gevent.os.make_nonblocking(r)
        with Timeout(40):
            gevent.joinall(workers)
            while True:
                chunk = gevent.os.nb_read(r, 65536)
                if not chunk:
                    break
                data += chunk
        status = children.wait(pid)
    finally:
        os.close(r)
        if not data:
            try:
                os.kill(pid, 9)
                children.wait(pid)
            except OSError:
                pass
    child = json.loads(data.decode())
    assert "crash" not in child, child.get("crash")
    return parent, child, status


def _replaces(conn):
    """The server's REPLACE count (an EVAL, which is not one)."""
    return conn.eval("return box.stat().REPLACE.total").data[0]


@pytest.mark.parametrize("fork", list(FORKS), ids=list(FORKS))
def test_connection_serves_parent_and_forked_child_at_once(server, fork):
    conn = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD,
                              request_timeout=10)
    try:
        before = _replaces(conn)
        reconnects = conn.stats.reconnects
        parent, child, status = _fork_and_run(FORKS[fork], conn)
        assert status == 0
        for side, report in (("parent", parent), ("child", child)):
            assert not report["errors"], (side, report["errors"][:5])
            assert not report["wrong"], (side, report["wrong"][:5])
            assert report["replaces"] == GREENLETS * ROUNDS, (side, report)
        assert child["pid"] != os.getpid()
        # Every request reached the server once: none the child inherited was sent again.
        assert _replaces(conn) - before == 2 * GREENLETS * ROUNDS
        # The parent kept its socket throughout; the data is each process's last round.
        assert conn.stats.reconnects == reconnects
        for tag in ("parent", "child"):
            for i in range(GREENLETS):
                key = "%s-%d" % (tag, i)
                assert conn.select("kv", key).data == [[key, ROUNDS - 1]]
    finally:
        conn.close()


@pytest.fixture(scope="module")
def replicaset():
    rs = ReplicaSet(_lua(), replicas=1, user=USER, password=PASSWORD)
    rs.start()
    rs.eval(rs.master, "for i = 0, %d do box.space.kv:replace{'static-' .. i, i} end"
            % (GREENLETS - 1))
    rs.wait_synced()
    yield rs
    rs.cleanup()


@pytest.mark.parametrize("fork", list(FORKS), ids=list(FORKS))
def test_pool_serves_parent_and_forked_child_at_once(replicaset, fork):
    pool = gtarantool.ConnectionPool(replicaset.addrs, user=USER, password=PASSWORD,
                                     request_timeout=10, wait_timeout=5, refresh_delay=0.5)
    try:
        before = replicaset.stat(replicaset.master)["REPLACE"]
        parent, child, status = _fork_and_run(FORKS[fork], pool, mode=Mode.RW)
        assert status == 0
        for side, report in (("parent", parent), ("child", child)):
            assert not report["errors"], (side, report["errors"][:5])
            assert not report["wrong"], (side, report["wrong"][:5])
            assert report["replaces"] == GREENLETS * ROUNDS, (side, report)
        assert replicaset.stat(replicaset.master)["REPLACE"] - before == 2 * GREENLETS * ROUNDS
        assert all(i["healthy"] for i in pool.info().values()), pool.info()
        key = "child-%d" % (GREENLETS - 1)
        assert pool.select("kv", key, mode=Mode.RW).data == [[key, ROUNDS - 1]]
    finally:
        pool.close()


def _fork_running(fork, body):
    """Fork (``FORKS[fork]``); the child runs ``body()``, which returns its
    outcome flags (0: all as it should be), sends them and exits.  Returns a
    function that waits for the flags (one byte) and reaps the child."""
    r, w = os.pipe()
    pid = children.fork(FORKS[fork])
    if pid == 0:
        try:
            os.close(r)
            gevent.get_hub().exception_stream = None
            os.write(w, bytes([body()]))
        finally:
            os._exit(0)
    os.close(w)

    def flags():
        gevent.os.make_nonblocking(r)
        try:
            with Timeout(10):
                return gevent.os.nb_read(r, 1)
        finally:
            os.close(r)
            children.wait(pid)
    return flags


@pytest.mark.parametrize("fork", list(FORKS), ids=list(FORKS))
def test_forked_child_never_reads_the_parents_replies(server, fork):
    """The child's copy of the reader stays off the parent's stream even when the
    child never makes a request: replies to the parent's requests in flight at
    the fork all reach the parent."""
    conn = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD,
                              request_timeout=10)
    try:
        conn.ping()
        calls = [gevent.spawn(conn.call, "sleep_and_return", 0.3, i) for i in range(10)]
        gevent.sleep(0.05)   # the ten requests are in flight at the fork
        def child():
            code = 0
            gevent.sleep(0.6)   # the replies come meanwhile: the copied reader may run
            if any(c.ready() and c.successful() for c in calls):
                code |= 1       # a copy of the parent's caller got a reply here
            if conn.call("echo", "child").data != ["child"]:
                code |= 2
            conn.close()
            return code
        flags = _fork_running(fork, child)
        with Timeout(10):
            gevent.joinall(calls, raise_error=True)
        assert [c.value.data for c in calls] == [[i] for i in range(10)]
        got = flags()
        assert got == b"\x00", "child outcome flags %r" % (got,)
        assert conn.call("echo", "parent").data == ["parent"]
        assert conn.stats.reconnects == 0
    finally:
        conn.close()


@pytest.mark.parametrize("fork", list(FORKS), ids=list(FORKS))
def test_a_caller_resending_what_was_not_applied_applies_nothing_twice_across_a_fork(
        server, fork):
    """Callers re-send a write only when its error says it was not applied
    (``applied`` False: "sending it again cannot apply it twice"); the
    process forks with their writes in flight and the child's hub runs their
    copies.  A copy's error says the write may have been applied (the parent
    applies it): nothing is re-sent from the child, every counter ends at
    its number of rounds."""
    from gtarantool.errors import applied
    conn = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD,
                              request_timeout=10)
    tag, workers, rounds = "resend-%d" % os.getpid(), 10, 50
    me = os.getpid()
    copies = []

    def worker(i):
        for _ in range(rounds):
            while True:
                try:
                    conn.update("kv", "%s-%d" % (tag, i), [("+", 1, 1)])
                    break
                except gtarantool.Error as exc:
                    if os.getpid() != me:
                        copies.append(applied(exc))
                    if applied(exc) is not False:
                        break
            if os.getpid() != me:
                return

    try:
        for i in range(workers):
            conn.replace("kv", ("%s-%d" % (tag, i), 0))
        greenlets = [gevent.spawn(worker, i) for i in range(workers)]
        while not conn._transport._pending:   # their writes in flight
            gevent.sleep(0)

        def child():
            gevent.sleep(0.5)                     # the copies run here
            return 0 if copies and all(a is None for a in copies) else 1
        got = _fork_running(fork, child)()
        gevent.joinall(greenlets, timeout=30, raise_error=True)
        assert got == b"\x00", "child outcome flags %r" % (got,)
        counts = [conn.select("kv", "%s-%d" % (tag, i)).data[0][1] for i in range(workers)]
        assert counts == [rounds] * workers
    finally:
        conn.close()


@pytest.mark.parametrize("fork", list(FORKS), ids=list(FORKS))
def test_a_write_waiting_for_a_schema_reload_is_not_sent_from_a_forked_child(server, fork):
    """A write refused for a schema change (error 109) waits for the reload
    another greenlet is making; the process forks meanwhile.  The child's copy
    of that write sends nothing when the reload ends there (CopiedCall); the
    parent's is applied, once."""
    import tarantool

    from gtarantool.transport import CopiedCall
    admin = tarantool.connect(server.host, server.port, user=USER, password=PASSWORD)
    conn = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD,
                              request_timeout=10)
    key = "fork-109-%d" % os.getpid()
    try:
        conn.ping()
        conn.select("kv", key)                     # the schema is loaded
        admin.delete("kv", key)
        admin.eval("box.schema.space.create('fork_109', {if_not_exists = true})")
        conn._schema_lock.acquire()                # a reload in progress
        call = gevent.spawn(conn.upsert, "kv", (key, 1), [("+", 1, 1)])
        gevent.sleep(0.2)                          # refused with 109, it waits for the lock
        assert not call.ready()
        def child():
            conn._schema_lock.release()            # the reload ends here too
            call.join(5)
            # 1: the copy went on with the parent's write
            return 0 if isinstance(call.exception, CopiedCall) else 1
        got = _fork_running(fork, child)()         # the child is done before the parent goes on
        conn._schema_lock.release()
        with Timeout(10):
            call.get()
        assert got == b"\x00", "child outcome flags %r" % (got,)
        assert admin.select("kv", key).data == [[key, 1]]
    finally:
        admin.eval("if box.space.fork_109 then box.space.fork_109:drop() end")
        admin.close()
        conn.close()


def _in_process(conn, results):
    key = "mp-%d" % os.getpid()
    try:
        results.put((key, conn.replace("kv", (key, 1)).data, conn.select("kv", key).data))
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        results.put((key, repr(exc), None))


def test_multiprocessing_child_uses_the_inherited_connection(server):
    conn = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD,
                              request_timeout=10)
    try:
        conn.ping()
        ctx = multiprocessing.get_context("fork")
        results = ctx.SimpleQueue()
        process = ctx.Process(target=_in_process, args=(conn, results))
        process.start()
        process.join(30)
        assert process.exitcode == 0
        key, replaced, selected = results.get()
        assert replaced == [[key, 1]] and selected == [[key, 1]], (replaced, selected)
        assert conn.select("kv", key).data == [[key, 1]]
        assert conn.stats.reconnects == 0
    finally:
        conn.close()


def test_other_threads_still_get_wrong_owner(server, replicaset):
    conn = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD)
    pool = gtarantool.ConnectionPool(replicaset.addrs, user=USER, password=PASSWORD)
    results = []

    def other():
        for fn in (conn.ping, lambda: conn.select("kv", "x"), conn.close,
                   lambda: pool.select("kv", "x", mode=Mode.RW)):
            try:
                fn()
                results.append(None)
            except Exception as exc:  # noqa: BLE001
                results.append(exc)

    try:
        thread = threading.Thread(target=other)
        thread.start()
        thread.join(10)
        assert not thread.is_alive()
        assert [type(r) for r in results] == [WrongOwner] * 4, results
        assert conn.select("kv", "x").data == []
        assert pool.select("kv", "x", mode=Mode.RW).data == []
    finally:
        conn.close()
        pool.close()


@pytest.mark.parametrize("fork", list(FORKS), ids=list(FORKS))
@pytest.mark.parametrize("on", ["connection", pytest.param("stream", marks=pytest.mark.skipif(
    binary_version() < (2, 10), reason="streams need Tarantool 2.10+"))])
def test_a_pipelines_queued_requests_are_sent_by_the_parent_only(server, fork, on):
    """Requests queued in a pipeline, not yet handed to the connection, when the
    process forks: the child's copy of the pipeline gets CopiedCall (``applied``
    None: the parent sends them) as their results and sends nothing; the
    parent's are applied once."""
    from gtarantool.transport import CopiedCall
    conn = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD,
                              request_timeout=10)
    key = "fork-pipeline-%s-%s-%d" % (on, fork, os.getpid())
    try:
        conn.delete("kv", key)
        p = (conn if on == "connection" else conn.stream()).pipeline()
        for _ in range(10):
            p.upsert("kv", (key, 1), [("+", 1, 1)])
        def child():
            results = p.results()
            return 0 if all(isinstance(r, CopiedCall) and r.applied is None
                            for r in results) else 1
        got = _fork_running(fork, child)()
        assert got == b"\x00", "child outcome flags %r" % (got,)
        assert [type(r).__name__ for r in p.results()] == ["Response"] * 10
        assert conn.select("kv", key).data == [[key, 10]]
    finally:
        conn.close()


@pytest.mark.parametrize("fork", list(FORKS), ids=list(FORKS))
def test_a_statement_unprepared_in_a_forked_child_sends_nothing(server, fork):
    """The child's copy of a statement prepared on the parent's session is
    not the child's to free: unprepare() there sends nothing (it raised the
    server's "does not exist" from a session of its own); the parent's still runs."""
    conn = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD,
                              request_timeout=10)
    try:
        stmt = conn.prepare("SELECT 1 + ?")
        assert stmt.execute([1]).data == [[2]]
        def child():
            sent = conn.stats.requests
            try:
                stmt.unprepare()
            except Exception:  # noqa: BLE001 - reported to the parent as a flag
                return 1
            return 0 if conn.stats.requests == sent else 2   # nothing sent from the child
        got = _fork_running(fork, child)()
        assert got == b"\x00", "child outcome flags %r" % (got,)
        assert stmt.execute([2]).data == [[3]]
    finally:
        conn.close()


@pytest.mark.parametrize("fork", list(FORKS), ids=list(FORKS))
def test_a_pipeline_waited_on_across_a_fork_is_the_parents(server, fork):
    """A greenlet waits for a pipeline's replies when the process forks: its
    copy in the child, woken there, gets CopiedCall (``applied`` None) for
    every request, as any call copied mid-flight; the parent gets the replies,
    each request applied once."""
    from gtarantool.transport import CopiedCall
    conn = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD,
                              request_timeout=10)
    key = "fork-pipeline-wait-%s-%d" % (fork, os.getpid())
    try:
        conn.delete("kv", key)
        p = conn.pipeline()
        p.eval("require('fiber').sleep(0.3)")
        for _ in range(5):
            p.upsert("kv", (key, 1), [("+", 1, 1)])
        waiting = gevent.spawn(p.results)
        gevent.sleep(0.05)
        assert not waiting.ready()
        def child():
            conn.ping()   # the child's own socket; the parent's requests fail here
            results = waiting.get(timeout=5)
            return 0 if all(isinstance(r, CopiedCall) and r.applied is None
                            for r in results) else 1
        got = _fork_running(fork, child)()
        assert got == b"\x00", "child outcome flags %r" % (got,)
        assert [type(r).__name__ for r in waiting.get(timeout=5)] == ["Response"] * 6
        assert conn.select("kv", key).data == [[key, 5]]
    finally:
        conn.close()


@pytest.mark.skipif(compiled.speedups is None, reason="the compiled paths are off")
def test_turning_the_compiled_paths_off_makes_no_connection_a_forked_childs(server, monkeypatch):
    """Process tokens come from one source, chosen at import: a connection made
    with the compiled paths on, used after a test turned them off (the reader
    fixture's python runs), keeps its socket; it took itself for a forked
    child's and reinitialised gevent's hub (under another caller's connect)."""
    conn = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD)
    try:
        transport = conn._transport
        monkeypatch.setattr(compiled, "speedups", None)
        assert conn.execute("SELECT 1").data == [[1]]   # (a path that checks the process)
        assert conn._transport is transport
    finally:
        conn.close()
