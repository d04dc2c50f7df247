"""Streams and interactive transactions against a real server with MVCC."""
import gevent
import pytest
from gevent.event import Event
from tarantool.error import DatabaseError, InterfaceError, NetworkError

import gtarantool
from gtarantool import streams
from gtarantool.testing.server import TarantoolServer, binary_version
from tests.conftest import PASSWORD, USER, _lua

VERSION = binary_version()
SERVER = ".".join(map(str, VERSION))
needs_streams = pytest.mark.skipif(
    VERSION < (2, 10), reason="needs Tarantool 2.10+ (streams); server is %s" % SERVER)
MVCC = {"memtx_use_mvcc_engine": True}


@pytest.fixture(scope="module")
def mvcc_server():
    """A server with memtx MVCC (interactive transactions on memtx need it)."""
    srv = TarantoolServer(_lua(), cfg=MVCC if VERSION >= (2, 10) else None)
    srv.start()
    yield srv
    srv.cleanup()


def connect(srv, **options):
    return gtarantool.connect(srv.host, srv.port, user=USER, password=PASSWORD, **options)


@pytest.fixture
def mconn(mvcc_server):
    c = connect(mvcc_server)
    c.eval("box.space.tester:truncate()")
    yield c
    c.close()


@pytest.mark.skipif(VERSION >= (2, 10), reason="a server without streams (2.6) only")
def test_streams_and_transactions_name_the_version(mconn):
    with pytest.raises(gtarantool.FeatureNotSupported,
                       match=r"needs Tarantool 2\.10\+ \(streams\); server is 2\."):
        mconn.stream()
    with pytest.raises(gtarantool.FeatureNotSupported, match=r"2\.10\+ \(streams\)"):
        with mconn.transaction():
            pass
    assert mconn.ping(notime=True) == "Success"


def test_isolation_names_and_numbers():
    assert [streams.isolation_code(name) for name in
            ("default", "read-committed", "read-confirmed", "best-effort", "linearizable")] \
        == [0, 1, 2, 3, 4]
    assert streams.isolation_code(2) == 2
    for bad in ("serializable", 7, True, 1.0):
        with pytest.raises(ValueError):
            streams.isolation_code(bad)


@needs_streams
@pytest.mark.usefixtures("reader")
def test_stream_data_methods(mconn):
    s = mconn.stream()
    t = mconn.stream()
    assert s.stream_id != t.stream_id
    assert s.insert("tester", (1, "a")).data == [[1, "a"]]
    assert s.replace("tester", (1, "b")).data == [[1, "b"]]
    assert s.update("tester", 1, [("=", 2, 5)]).data == [[1, "b", 5]]
    s.upsert("tester", (2, "c"), [("=", 1, "d")])
    assert s.select("tester", 2).data == [[2, "c"]]
    assert s.select("tester", "c", index="by_name").data == [[2, "c"]]
    assert s.call("echo", 1, "x").data == [1, "x"]
    assert s.eval("return ...", 3).data == [3]
    assert s.delete("tester", 2).data == [[2, "c"]]
    assert s.execute("SELECT COUNT(*) FROM \"tester\"").data == [[1]]
    assert isinstance(s.ping(), float)
    with pytest.raises(DatabaseError, match="555"):
        s.call("raise_error", "in a stream")
    assert s.select("tester", 1).data == [[1, "b", 5]]   # the stream goes on


@needs_streams
def test_commit_and_rollback(mconn):
    s = mconn.stream()
    s.begin()
    assert s.in_transaction
    s.insert("tester", (1, "kept"))
    assert mconn.select("tester", 1).data == []   # not committed yet
    assert s.select("tester", 1).data == [[1, "kept"]]
    s.commit()
    assert not s.in_transaction
    assert mconn.select("tester", 1).data == [[1, "kept"]]
    s.begin("best-effort")
    s.insert("tester", (2, "dropped"))
    s.rollback()
    assert mconn.select("tester", 2).data == []
    with pytest.raises(InterfaceError, match="already has an open transaction") as err:
        s.begin()
        s.begin()
    assert err.value.applied is False
    s.rollback()


@needs_streams
def test_transaction_context_manager(mconn):
    with mconn.transaction() as tx:
        tx.insert("tester", (1, "a"))
        tx.insert("tester", (2, "b"))
    assert len(mconn.select("tester").data) == 2
    with pytest.raises(KeyError):
        with mconn.transaction(isolation="read-committed", timeout=5) as tx:
            tx.insert("tester", (3, "c"))
            raise KeyError("rolled back")
    assert mconn.select("tester", 3).data == []
    with pytest.raises(DatabaseError, match="Duplicate key"):
        with mconn.transaction() as tx:
            tx.insert("tester", (4, "d"))
            tx.insert("tester", (1, "duplicate"))
    assert mconn.select("tester", 4).data == []
    # A block that ends its transaction itself: not committed again (a second
    # commit would raise InterfaceError for a transaction that was committed).
    with mconn.transaction() as tx:
        tx.insert("tester", (5, "e"))
        tx.commit()
    with mconn.transaction() as tx:
        tx.insert("tester", (6, "f"))
        tx.rollback()
        tx.begin()
        tx.insert("tester", (7, "g"))
    assert [t[0] for t in mconn.select("tester").data] == [1, 2, 5, 7]


@needs_streams
def test_thousand_concurrent_transactions_half_rolled_back(mconn):
    def work(i):
        try:
            with mconn.transaction() as tx:
                for j in range(5):
                    tx.insert("tester", (i * 5 + j, "tx%d" % i))
                if i % 2:
                    raise ValueError(i)
        except ValueError:
            pass
    greenlets = [gevent.spawn(work, i) for i in range(1000)]
    gevent.joinall(greenlets, raise_error=True)
    rows = mconn.select("tester").data
    ids = sorted(row[0] for row in rows)
    assert ids == sorted(i * 5 + j for i in range(0, 1000, 2) for j in range(5))
    assert mconn.stats.max_in_flight > 100   # they did overlap on the one socket


@needs_streams
def test_a_commit_with_no_transaction_open_is_refused_not_reported_done(mvcc_server, mconn):
    """A commit whose transaction a commit that timed out ended (the server
    rolled it back: a conflict) is refused when asked again, not answered
    with the server's OK for a commit of nothing; a rollback then sends
    nothing."""
    import signal
    s = mconn.stream()
    with pytest.raises(InterfaceError, match="no open transaction") as err:
        s.commit()
    assert err.value.applied is False
    s.rollback()   # nothing open: nothing to roll back
    timed = connect(mvcc_server, request_timeout=0.5)
    mconn.replace("tester", (1, "before"))
    t = timed.stream()
    t.begin()
    t.select("tester", 1)
    t.replace("tester", (1, "from the transaction"))
    mconn.replace("tester", (1, "another writer's"))   # commits first: a conflict
    mvcc_server.signal(signal.SIGSTOP)
    try:
        with pytest.raises(gtarantool.RequestTimeout) as err:
            t.commit()
        assert err.value.applied is None
    finally:
        mvcc_server.signal(signal.SIGCONT)
    gevent.sleep(0.3)
    with pytest.raises(InterfaceError, match="no open transaction"):
        t.commit()
    t.rollback()
    assert mconn.select("tester", 1).data == [[1, "another writer's"]]
    timed.close()


@needs_streams
def test_read_committed_reader_does_not_see_an_uncommitted_write(mconn):
    writer = mconn.stream()
    writer.begin()
    writer.insert("tester", (1, "uncommitted"))
    with mconn.transaction("read-committed") as reader:
        assert reader.select("tester", 1).data == []
    writer.commit()
    with mconn.transaction(streams.ISOLATION_LEVELS["read-committed"]) as reader:
        assert reader.select("tester", 1).data == [[1, "uncommitted"]]


@needs_streams
def test_read_committed_sees_what_read_confirmed_does_not(mconn):
    """A write to a synchronous space waits for a quorum it never gets: it is
    committed but not confirmed, and only read-committed sees it."""
    mconn.eval("""
        local s = box.schema.space.create('sync', {is_sync = true, if_not_exists = true})
        s:create_index('pk', {if_not_exists = true})
        box.ctl.promote()
        box.cfg{replication_synchro_quorum = 2, replication_synchro_timeout = 1}""")
    try:
        pending = gevent.spawn(mconn.insert, "sync", (1,))
        gevent.sleep(0.2)
        seen = {}
        for level in ("read-committed", "read-confirmed", "best-effort"):
            with mconn.transaction(level) as tx:
                seen[level] = tx.select("sync", 1).data
        assert seen == {"read-committed": [[1]], "read-confirmed": [], "best-effort": []}
        pending.join()
        assert isinstance(pending.exception, DatabaseError)   # quorum timed out
    finally:
        mconn.eval("box.cfg{replication_synchro_quorum = 1} box.space.sync:drop()")


@needs_streams
def test_transaction_times_out_on_the_server(mconn):
    s = mconn.stream()
    s.begin(timeout=0.1)
    s.insert("tester", (1, "late"))
    gevent.sleep(0.4)
    with pytest.raises(DatabaseError, match="aborted by timeout"):
        s.insert("tester", (2, "late"))
    with pytest.raises(DatabaseError, match="aborted by timeout"):
        s.commit()
    assert mconn.select("tester").data == []
    s.begin()   # the stream is usable again
    s.rollback()
    for bad in (0, -1, float("nan"), True):
        with pytest.raises(ValueError):
            s.begin(timeout=bad)


@needs_streams
def test_request_timeout_in_a_stream(mvcc_server):
    c = connect(mvcc_server, request_timeout=0.2)
    try:
        s = c.stream()
        with pytest.raises(gtarantool.RequestTimeout):
            s.call("sleep_and_return", 0.5, "late")
        assert c.stream().call("echo", 1).data == [1]   # other streams go on
        # The server runs a stream's requests in order: the next one waits for it.
        c.request_timeout = None
        assert s.call("echo", 2).data == [2]
    finally:
        c.close()


@needs_streams
def test_lost_connection_fails_the_transaction_and_resends_nothing():
    srv = TarantoolServer(_lua(), cfg=MVCC)
    srv.start()
    try:
        conn = connect(srv, reconnect_delay=0.05)
        tx = conn.stream()
        tx.begin()
        tx.insert("tester", (1, "lost"))
        blocked = Event()

        def waiting():
            blocked.set()
            return tx.call("sleep_and_return", 10, "never")
        in_flight = gevent.spawn(waiting)
        blocked.wait()
        gevent.sleep(0.05)
        srv.kill()
        srv.start()
        in_flight.join(10)
        assert isinstance(in_flight.exception, NetworkError)
        with pytest.raises(NetworkError, match="lost during the transaction"):
            tx.insert("tester", (2, "lost"))
        with tx.pipeline() as pipe:
            pipe.insert("tester", (5, "lost"))
        lost, = pipe.results()
        assert isinstance(lost, NetworkError) and "lost during the transaction" in str(lost)
        with pytest.raises(NetworkError, match="lost during the transaction"):
            tx.commit()
        assert not tx.in_transaction
        tx.rollback()   # nothing to roll back: the server did
        assert conn.select("tester").data == []   # reconnects; nothing was re-sent
        with conn.transaction() as again:
            again.insert("tester", (3, "new"))
        assert [row[0] for row in conn.select("tester").data] == [3]
        conn.close()
    finally:
        srv.cleanup()


@needs_streams
@pytest.mark.usefixtures("reader")
def test_stream_replies_take_the_plain_replies_path(mconn, monkeypatch):
    """The server's replies to stream requests carry no stream id: the reader
    takes them the way it takes plain replies (its fixed-layout loop, in C or
    Python, when it knows the server's layout; ``_frame`` otherwise)."""
    transport = mconn._transport
    general = type(transport)._frame
    slow = []
    monkeypatch.setattr(type(transport), "_frame",
                        lambda self, *args: slow.append(args[1]) or general(self, *args))
    for i in range(100):
        mconn.insert("tester", (i, "plain"))
    plain, slow[:] = len(slow), []
    with mconn.transaction() as tx:
        for i in range(100, 200):
            tx.insert("tester", (i, "stream"))
        slow[:] = []
        for i in range(200, 300):
            tx.insert("tester", (i, "stream"))
        in_stream = len(slow)
    assert in_stream == plain


@needs_streams
def test_a_pipeline_in_a_transaction(mconn):
    s = mconn.stream()
    s.begin()
    with s.pipeline() as pipe:
        for i in range(2000):
            pipe.insert("tester", (i, "piped"))
        pipe.insert("tester", (0, "duplicate"))
        pipe.select("tester", limit=5)
    results = pipe.results()
    assert all(r.data == [[i, "piped"]] for i, r in enumerate(results[:2000]))
    assert isinstance(results[2000], DatabaseError)
    assert len(results[2001].data) == 5
    assert mconn.select("tester", 1).data == []   # not committed yet
    s.commit()
    assert len(mconn.select("tester").data) == 2000
    s.begin()
    with s.pipeline() as pipe:
        pipe.delete("tester", 1)
    s.rollback()
    assert mconn.select("tester", 1).data == [[1, "piped"]]
    s.begin()
    s.replace("tester", (1, "in the transaction"))
    with s.pipeline() as pipe:
        places = pipe.select_many("tester", [1, 2, 5000])
    assert [pipe.results()[i].data for i in places] == [[[1, "in the transaction"]],
                                                         [[2, "piped"]], []]
    s.rollback()


@needs_streams
def test_a_transaction_left_by_a_kill_or_a_timeout_is_rolled_back_without_waiting():
    """Its caller timed out (gevent.Timeout) or killed inside transaction(), or
    begin() unanswered within request_timeout: the call ends at once, a
    ROLLBACK goes without waiting for its reply, and the stream starts afresh
    (no row of the abandoned transaction, no "active transaction" refusal)."""
    import signal
    import time

    srv = TarantoolServer(_lua(), cfg=MVCC)
    srv.start()
    try:
        conn = connect(srv)
        timed = connect(srv, request_timeout=0.3)
        conn.ping()
        timed.ping()
        srv.signal(signal.SIGSTOP)
        try:
            def in_transaction():
                with conn.transaction() as tx:
                    tx.insert("tester", (71, "abandoned"))

            started = time.monotonic()
            with pytest.raises(gevent.Timeout):
                with gevent.Timeout(0.3):
                    in_transaction()
            killed = gevent.spawn(in_transaction)
            gevent.sleep(0.1)
            killed.kill(timeout=2)
            assert killed.dead
            stream = timed.stream()
            with pytest.raises(gtarantool.RequestTimeout):
                stream.begin()
            assert time.monotonic() - started < 2
        finally:
            srv.signal(signal.SIGCONT)
        assert conn.select("tester", 71).data == []
        stream.insert("tester", (72, "autocommitted"))   # not in the unanswered BEGIN's txn
        assert conn.select("tester", 72).data == [[72, "autocommitted"]]
        stream.begin()
        stream.rollback()
    finally:
        srv.cleanup()


@needs_streams
@pytest.mark.timing
def test_a_transaction_block_whose_request_timed_out_ends_within_request_timeout():
    """A request inside ``transaction()`` times out (the server frozen after
    the first write): the block's RequestTimeout reaches the caller at the
    request's deadline, not a whole request_timeout later for a rollback the
    frozen server cannot answer; the rollback still goes, so nothing of the
    transaction is committed."""
    import signal
    import time

    from .timing import slack

    srv = TarantoolServer(_lua(), cfg=MVCC)
    srv.start()
    try:
        conn = connect(srv, request_timeout=0.5)
        started = None
        try:
            with pytest.raises(gtarantool.RequestTimeout):
                with conn.transaction() as tx:
                    tx.insert("tester", (81, "first"))
                    srv.signal(signal.SIGSTOP)
                    started = time.monotonic()
                    tx.insert("tester", (82, "unanswered"))
            took = time.monotonic() - started
        finally:
            srv.signal(signal.SIGCONT)
        assert took <= 0.5 + slack(0.3), took
        conn.request_timeout = None
        assert conn.select("tester", 81).data == []
        assert conn.select("tester", 82).data == []
        conn.close()
    finally:
        srv.cleanup()


@needs_streams
def test_a_commit_or_rollback_never_sent_leaves_the_transaction_open():
    """A commit (or rollback) that ran out of request_timeout in line for
    ``max_in_flight`` was never sent: the server still holds the transaction.
    The stream holds it too (forgotten, the stream's next write ran in it,
    answered OK and never committed; its next begin() was refused by the
    server), so committing again commits it, and rolling back again rolls
    it back."""
    srv = TarantoolServer(_lua(), cfg=MVCC)
    srv.start()
    try:
        conn = connect(srv, request_timeout=0.3, max_in_flight=1)
        reader = connect(srv)
        for end, rows in (("commit", [[91, "first"], [92, "after"]]), ("rollback", [])):
            reader.eval("box.space.tester:truncate()")
            stream = conn.stream()
            stream.begin()
            stream.insert("tester", (91, "first"))
            conn.request_timeout = None
            slot = gevent.spawn(conn.call, "sleep_and_return", 1.0, 1)   # the only slot
            gevent.sleep(0.1)
            conn.request_timeout = 0.3
            with pytest.raises(gtarantool.RequestTimeout) as err:
                getattr(stream, end)()
            assert gtarantool.errors.applied(err.value) is False
            assert stream.in_transaction, end
            slot.join(5)
            if end == "commit":
                stream.insert("tester", (92, "after"))   # in the open transaction
            getattr(stream, end)()
            assert not stream.in_transaction
            assert reader.select("tester").data == rows, end
            stream.begin()   # the server has none open either
            stream.rollback()
        conn.close()
        reader.close()
    finally:
        srv.cleanup()


@needs_streams
def test_a_forked_childs_copy_of_a_transaction_is_named_the_parents(mvcc_server, mconn):
    """A stream mid-transaction when the process forks: the child's request
    in it sends nothing (``applied`` False) and says the transaction is the
    parent's, not that the server rolled it back; the parent commits it."""
    import os

    from tests import children
    tx = mconn.stream()
    tx.begin()
    tx.insert("tester", (71, "parent"))
    pid = children.fork()
    if pid == 0:
        code = 1
        try:
            tx.insert("tester", (72, "child"))
        except NetworkError as exc:
            said = str(exc)
            code = 0 if (gtarantool.errors.applied(exc) is False and "parent" in said
                         and "rolled it back" not in said) else 2
        except BaseException:  # noqa: BLE001 - reported as the exit status
            code = 3
        os._exit(code)
    assert children.wait(pid) == 0
    tx.commit()
    assert mconn.select("tester").data == [[71, "parent"]]
