"""Prepared SQL statements (conn.prepare) against a real server."""
import time

import gevent
import pytest
from tarantool.error import DatabaseError, InterfaceError

import gtarantool
from tests.conftest import PASSWORD, USER


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        gevent.sleep(0.005)


def stmt_count(conn):
    return conn.eval("return box.info.sql().cache.stmt_count").data[0]


@pytest.fixture
def sql_conn(conn):
    conn.execute("DELETE FROM sqltest")
    yield conn


@pytest.mark.usefixtures("reader")
def test_prepare_and_execute(sql_conn):
    before = stmt_count(sql_conn)
    insert = sql_conn.prepare("INSERT INTO sqltest VALUES (?, ?)")
    assert insert.params_count == 2
    assert stmt_count(sql_conn) == before + 1
    for i in range(5):
        assert insert.execute([i, "n%d" % i]).affected_row_count == 1
    select = sql_conn.prepare("SELECT id, name FROM sqltest WHERE id >= :low ORDER BY id")
    result = select.execute({"low": 3})
    plain = sql_conn.execute("SELECT id, name FROM sqltest WHERE id >= :low ORDER BY id",
                             {"low": 3})
    assert type(result) is type(plain)
    assert result.data == plain.data == [[3, "n3"], [4, "n4"]]
    assert [column[0].upper() for column in select.metadata] == ["ID", "NAME"]  # FIELD_NAME
    with pytest.raises(DatabaseError, match="Duplicate key"):
        insert.execute([1, "again"])
    assert insert.execute((9, "tuple params")).affected_row_count == 1
    insert.unprepare()
    select.unprepare()
    assert stmt_count(sql_conn) == before
    with pytest.raises(InterfaceError, match="unprepared") as err:
        insert.execute([10, "x"])
    assert err.value.applied is False   # (nothing was sent)
    insert.unprepare()   # twice is harmless


def test_context_manager_unprepares(sql_conn):
    before = stmt_count(sql_conn)
    with sql_conn.prepare("SELECT ? + 1") as stmt:
        assert stmt.execute([41]).data == [[42]]
        assert stmt_count(sql_conn) == before + 1
    assert stmt_count(sql_conn) == before


def test_the_same_sql_prepared_twice_survives_one_unprepare(sql_conn):
    """A session gives the same SQL one id: one statement's unprepare() (a web
    handler's ``with``) leaves it to the other; freed behind the statement's
    back, its execute() prepares again (the refusal, 211, ran nothing)."""
    before = stmt_count(sql_conn)
    first = sql_conn.prepare("SELECT ? || 'x'")
    second = sql_conn.prepare("SELECT ? || 'x'")
    assert first.stmt_id == second.stmt_id
    first.unprepare()
    assert stmt_count(sql_conn) == before + 1
    assert second.execute(["a"]).data == [["ax"]]
    sql_conn.eval("box.unprepare(...)", second.stmt_id)
    assert second.execute(["b"]).data == [["bx"]]
    second.unprepare()
    assert stmt_count(sql_conn) == before


def test_concurrent_handlers_preparing_the_same_sql(sql_conn):
    """The docs' ``with conn.prepare(sql) as stmt:`` in many greenlets at
    once: they share the session's one id for the text, and only the last of
    them to leave unprepares it (an unprepare() under another's execute()
    made that one fail, and the next unprepare() fail with error 211)."""
    before = stmt_count(sql_conn)
    failed = []

    def handler(i):
        try:
            with sql_conn.prepare("SELECT ? * 3") as stmt:
                assert stmt.execute([i]).data == [[3 * i]]
                gevent.sleep(0.001 * (i % 3))
                assert stmt.execute([i + 1]).data == [[3 * i + 3]]
        except Exception as exc:  # noqa: BLE001 - counted below
            failed.append(exc)
    gevent.joinall([gevent.spawn(handler, i) for i in range(200)])
    assert failed == []
    assert stmt_count(sql_conn) == before


def test_prepared_again_after_a_schema_change(sql_conn):
    """Any DDL expires the session's statements ("statement has expired",
    refused unrun): execute() prepares again, once, and runs it once; a table
    created again with other columns gives its new rows and metadata."""
    sql_conn.execute("DROP TABLE IF EXISTS reshaped")
    sql_conn.execute("CREATE TABLE reshaped (id INTEGER PRIMARY KEY, a TEXT)")
    select = sql_conn.prepare("SELECT * FROM reshaped WHERE id >= 0")
    insert = sql_conn.prepare("INSERT INTO reshaped (id) VALUES (?)")
    assert select.execute().data == []
    sql_conn.eval("box.schema.space.create(...):drop()", "unrelated")   # any DDL
    assert insert.execute([1]).affected_row_count == 1
    assert select.execute().data == [[1, None]]
    sql_conn.execute("DROP TABLE reshaped")
    sql_conn.execute("CREATE TABLE reshaped (id INTEGER PRIMARY KEY, b INTEGER, c TEXT)")
    assert insert.execute([2]).affected_row_count == 1
    assert select.execute().data == [[2, None, None]]
    assert [column[0].upper() for column in select.metadata] == ["ID", "B", "C"]
    count = sql_conn.execute("SELECT COUNT(*) FROM reshaped WHERE id >= 0").data
    assert count == [[1]]   # run once
    select.unprepare()
    insert.unprepare()
    sql_conn.execute("DROP TABLE reshaped")


def test_bad_input(sql_conn):
    with pytest.raises(DatabaseError, match="Syntax error|syntax error"):
        sql_conn.prepare("SELEKT 1")
    with pytest.raises(TypeError):
        sql_conn.prepare(b"SELECT 1")
    sent = sql_conn.stats.requests
    for query in (["SELECT 1"], None, b"SELECT 1"):
        with pytest.raises(TypeError, match="query must be a str"):
            sql_conn.execute(query)
    assert sql_conn.stats.requests == sent   # refused before anything was written
    stmt = sql_conn.prepare("SELECT ?")
    with pytest.raises(TypeError):
        stmt.execute("not a sequence")
    assert stmt.execute([1]).data == [[1]]


def test_prepared_again_after_a_reconnect(sql_conn):
    stmt = sql_conn.prepare("SELECT COUNT(*) FROM sqltest WHERE id > ?")
    assert stmt.execute([0]).data == [[0]]
    sql_conn.close()   # the server forgets the session's statements
    assert stmt.execute([0]).data == [[0]]   # reconnects and prepares again
    assert sql_conn.stats.reconnects == 1


def test_prepared_again_after_a_server_restart(fresh_server):
    conn = gtarantool.connect(fresh_server.host, fresh_server.port, user=USER,
                              password=PASSWORD, reconnect_delay=0.05)
    try:
        stmt = conn.prepare("SELECT ? * 2")
        assert stmt.execute([2]).data == [[4]]
        fresh_server.kill()
        wait_for(conn.is_closed)   # the reader saw the server go
        fresh_server.start()
        assert stmt.execute([3]).data == [[6]]
        assert stmt_count(conn) == 1
    finally:
        conn.close()


def test_an_execute_whose_prepare_failed_says_not_applied(server):
    """On a new session execute() prepares the statement again first: when
    that PREPARE times out (every reply held past request_timeout by a proxy)
    the statement never ran, and its RequestTimeout says so (``applied``
    False), as a call that ran out before its request was written."""
    from gtarantool.errors import applied
    from gtarantool.testing.faults import FaultProxy

    with FaultProxy(server.host, server.port) as proxy:
        conn = gtarantool.connect(proxy.host, proxy.port, user=USER, password=PASSWORD)
        try:
            stmt = conn.prepare("INSERT INTO sqltest VALUES (?, 'prepared')")
            conn.close()
            conn.ping()   # a new session, which has not the statement
            proxy.delay = 0.2
            conn.request_timeout = 0.1
            with pytest.raises(gtarantool.RequestTimeout) as err:
                stmt.execute([41])
            assert applied(err.value) is False
            proxy.delay = 0
            conn.request_timeout = None
            gevent.sleep(0.3)   # (the held PREPARE's reply is through)
            assert conn.execute("SELECT * FROM sqltest WHERE id = 41").data == []
        finally:
            conn.close()


def test_a_prepare_answered_as_another_greenlet_closes_the_connection(server):
    """Another caller's reply in the same read, whose caller closes the
    connection before this one runs again: prepare() raised TypeError
    ("cannot create weak reference to 'NoneType' object"); it returns the
    statement, and its next execute prepares it again on a new session."""
    from gtarantool.testing.faults import FaultProxy

    with FaultProxy(server.host, server.port) as proxy:
        conn = gtarantool.connect(proxy.host, proxy.port, user=USER, password=PASSWORD)
        try:
            conn.ping()

            def first():
                conn.eval("return 1")
                conn.close()   # (the statement's reply is in, its caller not yet run)

            proxy.blackhole()   # (both requests go, and their replies come, together)
            closer = gevent.spawn(first)
            gevent.sleep(0)
            preparer = gevent.spawn(conn.prepare, "SELECT ? * 2")
            gevent.sleep(0.1)
            proxy.resume()
            # (the hub held: both replies are in the socket before the reader
            # receives, however the proxy and the server chunk them)
            time.sleep(0.3)
            gevent.joinall([closer, preparer])
            assert closer.successful()
            stmt = preparer.get()
            assert conn.is_closed()
            assert stmt.execute([21]).data == [[42]]
        finally:
            conn.close()
