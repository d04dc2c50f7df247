"""gtarantool.Connection against a real Tarantool, compared with tarantool.Connection."""
import decimal
import inspect
import os
import subprocess
import sys
import textwrap
import time
import uuid

import gevent
import pytest
import tarantool
from tarantool.error import DatabaseError, NetworkError
from tarantool.response import Response

import gtarantool
from gtarantool import ConnectionClosed, RequestTimeout
from gtarantool.protocol import Encoder
from gtarantool.testing.server import binary_version

from .conftest import PASSWORD, USER
from .timing import slack

# Every test with the reader's C loop and with its Python loop.
pytestmark = pytest.mark.usefixtures("reader")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def ref(server):
    c = tarantool.connect(server.host, server.port, user=USER, password=PASSWORD)
    yield c
    c.close()


def outcome(fn):
    """What a call gives: (response type, data, rowcount) or (error type, code)."""
    try:
        r = fn()
    except DatabaseError as exc:
        return ("error", type(exc).__name__, exc.code)
    if isinstance(r, Response):
        return (type(r).__name__, r.data, r.rowcount if r.data is not None else None)
    return ("value", r)


def test_is_a_tarantool_connection(conn):
    assert isinstance(conn, tarantool.Connection)
    assert isinstance(conn.ping(notime=True), str)
    assert conn.ping() >= 0


def test_attributes_live_in_slots(server):
    """Nothing lands in the instance __dict__ (see connection._ATTRIBUTES): a
    tarantool-python that sets a new attribute makes this fail, not only slower."""
    conn = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD)
    try:
        conn.insert("tester", (900_001, "slots"))
        conn.delete("tester", 900_001)
        conn.close()
        conn.ping()   # reconnects
        assert vars(conn) == {}
    finally:
        conn.close()


# Each case runs on a reference connection and on gtarantool with keys that do
# not collide, then the outcomes are compared.  ``k`` is the key base.
CASES = {
    "insert": lambda c, k: c.insert("tester", (k, "a", {"x": [1, 2]})),
    "insert_dup": lambda c, k: (c.insert("tester", (k, "a")), c.insert("tester", (k, "b")))[1],
    "insert_by_id": lambda c, k: c.insert(c.schema.get_space("tester").sid, [k, "n"]),
    "replace": lambda c, k: c.replace("tester", (k, "r", None)),
    "select_pk": lambda c, k: (c.insert("tester", (k, "s")), c.select("tester", k))[1],
    "select_missing": lambda c, k: c.select("tester", k),
    "select_index_name": lambda c, k: (c.insert("tester", (k, "nm%d" % k)),
                                       c.select("tester", "nm%d" % k, index="by_name"))[1],
    "select_index_no": lambda c, k: (c.insert("tester", (k, "nn%d" % k)),
                                     c.select("tester", ["nn%d" % k], index=1))[1],
    "select_pk_by_name": lambda c, k: (c.insert("tester", (k, "pn")),
                                       c.select("tester", k, index="primary"))[1],
    "select_all_limit": lambda c, k: c.select("tester", limit=1),
    "select_offset_limit": lambda c, k: ([c.insert("tester", (k + i, "o")) for i in range(5)],
                                         c.select("tester", k, offset=1, limit=2,
                                                  iterator=tarantool.const.ITERATOR_GE))[1],
    "update": lambda c, k: (c.insert("tester", (k, "u", 1)),
                            c.update("tester", k, [("+", 2, 5), ("=", 1, "v")]))[1],
    "update_field_name": lambda c, k: (c.insert("tester", (k, "u", 1)),
                                       c.update("tester", (k,), [("=", "name", "w")]))[1],
    "update_index_name": lambda c, k: (c.insert("tester", (k, "u", 1)),
                                       c.update("tester", k, [("+", 2, 1)], index="primary"))[1],
    "update_missing": lambda c, k: c.update("tester", k, [("=", 1, "x")]),
    "upsert": lambda c, k: (c.upsert("tester", (k, "up", 1), [("+", 2, 1)]),
                            c.upsert("tester", (k, "up", 1), [("+", 2, 1)]),
                            c.select("tester", k))[2],
    "delete": lambda c, k: (c.insert("tester", (k, "d")), c.delete("tester", k))[1],
    "delete_index_name": lambda c, k: (c.insert("tester", (k, "d")),
                                       c.delete("tester", k, index="primary"))[1],
    "delete_missing": lambda c, k: c.delete("tester", k),
    "call": lambda c, k: c.call("echo", k, "two", [3]),
    "call_list": lambda c, k: c.call("echo", [k, "x"]),
    "call_nothing": lambda c, k: c.call("echo"),
    "call_raise": lambda c, k: c.call("raise_error", "boom"),
    "call_lua_error": lambda c, k: c.call("raise_lua", "oops"),
    "call_missing": lambda c, k: c.call("no_such_function"),
    "eval": lambda c, k: c.eval("return ...", k, {"a": 1}),
    "eval_error": lambda c, k: c.eval("error('bad')"),
    "space_obj": lambda c, k: (c.space("tester").insert((k, "so")),
                               c.space("tester").select(k))[1],
    "space_obj_update": lambda c, k: (c.space("tester").replace((k, "so")),
                                      c.space("tester").update(k, [("=", 1, "z")]))[1],
    "bad_space": lambda c, k: c.select("no_such_space", k),
    "sql_insert": lambda c, k: c.execute("INSERT INTO sqltest VALUES (?, ?)", [k, "q"]),
    "sql_select": lambda c, k: (c.execute("INSERT INTO sqltest VALUES (:id, :n)",
                                          {"id": k, "n": "p"}),
                                c.execute("SELECT name FROM sqltest WHERE id = ?", [k]))[1],
    "sql_error": lambda c, k: c.execute("SELEKT 1"),
    "binary": lambda c, k: c.insert("tester", (k, "b", b"\x00\xff")),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_results_as_tarantool_python(name, conn, ref, reader):
    # Keys of their own for each reader: a case must not meet the rows its run
    # with the other reader left (a duplicate key is another case).
    base = (1_000_000 if reader == "c" else 2_000_000) + sorted(CASES).index(name) * 1000
    case = CASES[name]
    expected = outcome(lambda: case(ref, base))
    got = outcome(lambda: case(conn, base + 500))

    def normalize(o, start):
        # Same shape with each side's key offset removed.
        if isinstance(o, (list, tuple)):
            return [normalize(x, start) for x in o]
        if isinstance(o, int) and not isinstance(o, bool) and start <= o < start + 500:
            return ("key", o - start)
        if isinstance(o, str):
            return o.replace(str(start), "K")
        return o

    assert normalize(got, base + 500) == normalize(expected, base)


@pytest.mark.parametrize("name", ["insert", "replace", "select", "update", "upsert", "delete",
                                  "call", "eval", "ping", "execute", "space"])
def test_same_signatures_as_tarantool_python(name):
    ours = inspect.signature(getattr(gtarantool.Connection, name))
    added = ADDED_KEYWORDS.get(name, ())   # keyword-only, after theirs
    assert [p.name for p in ours.parameters.values()][len(ours.parameters) - len(added):] \
        == list(added)
    ours = ours.replace(parameters=list(ours.parameters.values())[:len(ours.parameters)
                                                                  - len(added)])
    assert _unannotated(ours) == _unannotated(inspect.signature(getattr(tarantool.Connection,
                                                                        name)))


def _unannotated(signature):
    """Names, kinds and defaults: what a caller depends on (ours are annotated)."""
    empty = inspect.Parameter.empty
    return signature.replace(parameters=[p.replace(annotation=empty)
                                         for p in signature.parameters.values()],
                             return_annotation=empty)


# gtarantool's own keyword arguments (pagination, Tarantool 2.11+)
ADDED_KEYWORDS = {"select": ("after", "fetch_pos")}


def test_space_cache_is_bounded(conn):
    # Ids that name no space are cached too (the server answers each with an
    # error); the cache empties itself instead of growing.
    p = conn.pipeline()
    for space_no in range(100_000, 100_000 + Encoder.CACHE_LIMIT + 100):
        p.select(space_no, 1)
    assert all(isinstance(r, DatabaseError) for r in p.results())
    assert 0 < len(conn._spaces) <= Encoder.CACHE_LIMIT
    assert conn.select("tester", 1).data is not None


def test_sql_response_fields(conn, ref):
    ref.execute("DELETE FROM sqltest WHERE id IN (5001, 5002)")   # from an earlier run
    a = ref.execute("INSERT INTO sqltest VALUES (?, ?)", [5001, "z"])
    b = conn.execute("INSERT INTO sqltest VALUES (?, ?)", [5002, "z"])
    assert isinstance(b, type(a)) and type(b).__name__ == type(a).__name__
    assert b.affected_row_count == a.affected_row_count == 1
    c = conn.execute("SELECT id, name FROM sqltest WHERE id BETWEEN ? AND ? ORDER BY id",
                     [5001, 5002])
    assert c.rowcount == 2 and c.data == [[5001, "z"], [5002, "z"]]


def test_iterator_names_are_sent_as_numbers(conn):
    for i in range(3):
        conn.replace("tester", (2_000_000 + i, "it"))
    got = conn.select("tester", 2_000_000, iterator="GE", limit=3)
    assert [t[0] for t in got] == [2_000_000, 2_000_001, 2_000_002]
    got = conn.select("tester", 2_000_002, iterator="lt", limit=2)
    assert [t[0] for t in got] == [2_000_001, 2_000_000]
    with pytest.raises(ValueError, match="unknown iterator"):
        conn.select("tester", 1, iterator="SIDEWAYS")


def test_response_is_sequence(conn):
    conn.replace("tester", (3_000_000, "seq", 1))
    r = conn.select("tester", 3_000_000)
    assert r[0] == [3_000_000, "seq", 1]
    assert list(r) == r.data and len(r) == r.rowcount == 1
    assert r.return_code == 0 and r.sync > 0


def test_a_responses_body_is_the_map_tarantool_python_holds(conn, ref):
    """A reply whose body is only its data keeps the rows and makes the map
    when it is first read: the same map each time, holding the data list
    itself, equal to tarantool-python's; set or deleted like any field."""
    conn.replace("tester", (3_000_001, "body", 1))
    with conn.pipeline() as p:
        p.select("tester", 3_000_001)
    for r in (conn.select("tester", 3_000_001), p.results()[0]):
        theirs = ref.select("tester", 3_000_001)
        assert r.body is r._body and r._body == theirs.body == {0x30: [[3_000_001, "body", 1]]}
        assert r._body[0x30] is r.data
        r._body = {1: 2}
        assert r.body == {1: 2} and r.data == [[3_000_001, "body", 1]]
        del r._body
        with pytest.raises(AttributeError):
            r.body


def test_server_error_reaches_only_the_caller(conn):
    results = {}

    def good(i):
        results[i] = conn.call("echo", i)[0]

    def bad():
        with pytest.raises(DatabaseError) as info:
            conn.call("raise_error", "only me")
        results["bad"] = (info.value.code, info.value.message)

    gevent.joinall([gevent.spawn(good, i) for i in range(50)] + [gevent.spawn(bad)],
                   raise_error=True)
    assert results["bad"] == (555, "only me")
    assert all(results[i] == i for i in range(50))
    assert conn.ping(notime=True) == "Success"


def test_push_messages_reach_on_push(conn, ref):
    mine, theirs = [], []
    r = conn.call("push_three", "p", on_push=lambda data, ctx: ctx.append(data), on_push_ctx=mine)
    ref.call("push_three", "p", on_push=lambda data, ctx: ctx.append(data), on_push_ctx=theirs)
    assert r.data == ["done"]
    assert mine == theirs == [[[1, "p"]], [[2, "p"]], [[3, "p"]]]
    with pytest.raises(TypeError):
        conn.call("push_three", 1, on_push=42)


def test_own_unpacker_factory_is_honoured(server):
    """A connection given its own unpacker_factory decodes every reply with it:
    single calls, push messages and pipelines."""
    import msgpack
    calls = []

    def factory(conn):
        calls.append(conn)
        return msgpack.Unpacker(raw=False, strict_map_key=False, use_list=False)
    c = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD,
                           unpacker_factory=factory)
    try:
        c.replace("tester", (42, "own", [1, 2]))
        assert c.select("tester", 42).data == ((42, "own", (1, 2)),)
        pushed = []
        assert c.call("push_three", "p", on_push=lambda data, ctx: pushed.append(data)
                      ).data == ("done",)
        assert pushed == [((1, "p"),), ((2, "p"),), ((3, "p"),)]
        with c.pipeline() as p:
            p.select("tester", 42)
            p.call("echo", [1, [2]])
        assert [r.data for r in p.results()] == [((42, "own", (1, 2)),), (1, (2,))]
        assert calls and all(conn is c for conn in calls)
    finally:
        c.close()


def test_many_greenlets_share_one_socket(conn):
    """5,000 greenlets, mixed operations on their own keys, every result checked."""
    base = 10_000_000
    before = conn.stats.as_dict()
    errors = []

    def worker(i):
        key = base + i
        try:
            assert conn.insert("tester", (key, "g%d" % i, i))[0] == [key, "g%d" % i, i]
            assert conn.select("tester", key)[0] == [key, "g%d" % i, i]
            assert conn.update("tester", key, [("+", 2, 1)])[0][2] == i + 1
            assert conn.select("tester", "g%d" % i, index="by_name")[0][0] == key
            assert conn.delete("tester", key)[0] == [key, "g%d" % i, i + 1]
            assert len(conn.select("tester", key)) == 0
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(repr(exc))

    gevent.joinall([gevent.spawn(worker, i) for i in range(5000)])
    assert errors == []
    after = conn.stats.as_dict()
    requests = after["requests"] - before["requests"]
    sends = after["send_calls"] - before["send_calls"]
    recvs = after["recv_calls"] - before["recv_calls"]
    assert requests == 30000
    assert after["responses"] - before["responses"] == requests
    assert sends < requests / 20, (sends, requests)
    assert recvs < requests / 10, (recvs, requests)
    assert after["max_in_flight"] > 1000


def test_context_manager_closes(server):
    with gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD) as c:
        assert c.ping(notime=True) == "Success"
        transport = c._transport
    assert c.is_closed()
    assert transport._reader.dead and transport._writer.dead


def test_wrong_and_right_password(server):
    with pytest.raises(NetworkError) as info:
        gtarantool.connect(server.host, server.port, user=USER, password="wrong")
    assert "credentials" in str(info.value) or "password" in str(info.value).lower()
    with pytest.raises(NetworkError):
        tarantool.connect(server.host, server.port, user=USER, password="wrong")
    c = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD)
    assert c.eval("return box.session.user()")[0] == USER
    c.authenticate("guest", None)
    assert c.eval("return box.session.user()")[0] == "guest"
    c.close()


def test_guest_without_user(server):
    c = gtarantool.connect(server.host, server.port)
    assert c.eval("return box.session.user()")[0] == "guest"
    c.close()


def test_unix_socket():
    from gtarantool.testing.server import TarantoolServer
    with TarantoolServer("box.schema.user.grant('guest', 'execute', 'universe')",
                         unix_socket=True) as srv:
        c = gtarantool.connect(None, srv.port)
        ref = tarantool.connect(None, srv.port)
        assert c.eval("return 1 + 1").data == ref.eval("return 1 + 1").data == [2]
        c.close()
        ref.close()


def test_connect_refused_is_network_error():
    from gtarantool.testing.server import free_port
    with pytest.raises(NetworkError):
        gtarantool.connect("127.0.0.1", free_port())


@pytest.mark.parametrize("option", [
    {"request_timeout": -1}, {"request_timeout": 0}, {"max_in_flight": 0},
    {"max_in_flight": 1.5},
    # (a socket timeout of 0 is a non-blocking connect: "Operation now in progress")
    {"connection_timeout": 0}, {"connection_timeout": float("nan")},
    # (a reply limit of 0 failed the first reply with ProtocolError)
    {"max_response_size": 0}, {"socket_timeout": 0}, {"socket_timeout": "1"},
    # (beyond what the C transport holds: every connect failed with OverflowError)
    {"max_in_flight": 2 ** 63}, {"max_response_size": 2 ** 64}])
def test_bad_options(option):
    name = next(iter(option))
    with pytest.raises(tarantool.error.ConfigurationError, match=name + " must be a positive"):
        gtarantool.connect("127.0.0.1", 1, **option)


@pytest.mark.timing
def test_request_timeout_discards_late_reply(server):
    c = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD,
                           request_timeout=0.2)
    started = time.monotonic()
    with pytest.raises(RequestTimeout) as info:
        c.call("sleep_and_return", 0.6, "late")
    assert 0.15 < time.monotonic() - started < 0.2 + slack(0.8)
    assert isinstance(info.value, NetworkError) and isinstance(info.value, TimeoutError)
    assert c.call("echo", "after")[0] == "after"
    gevent.sleep(0.6)
    assert c.call("echo", "still")[0] == "still"
    assert c.stats.discarded == 1
    assert c._transport.in_flight == 0 and not c._transport._abandoned
    c.close()


@pytest.mark.timing
def test_socket_timeout_bounds_each_requests_wait_without_request_timeout(server):
    """tarantool-python's socket_timeout is honoured (it was ignored: the call
    waited for its late reply); request_timeout wins when both are given."""
    c = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD,
                           socket_timeout=0.2)
    both = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD,
                              socket_timeout=0.2, request_timeout=5)
    try:
        assert c.request_timeout == 0.2 and both.request_timeout == 5
        started = time.monotonic()
        with pytest.raises(RequestTimeout):
            c.call("sleep_and_return", 0.6, "late")
        assert time.monotonic() - started < 0.2 + slack(0.8)
        assert both.call("sleep_and_return", 0.4, "waited").data == ["waited"]
    finally:
        c.close()
        both.close()


def test_caller_timeout_and_kill_leave_connection_healthy(conn):
    with pytest.raises(gevent.Timeout):
        with gevent.Timeout(0.1):
            conn.call("sleep_and_return", 0.4, 1)
    g = gevent.spawn(conn.call, "sleep_and_return", 0.4, 2)
    gevent.sleep(0.05)
    g.kill()
    assert g.dead
    results = gevent.joinall([gevent.spawn(conn.call, "echo", i) for i in range(100)])
    assert [r.value[0] for r in results] == list(range(100))
    gevent.sleep(0.5)
    assert conn._transport.in_flight == 0 and not conn._transport._abandoned
    assert conn.ping(notime=True) == "Success"


@pytest.mark.timing
def test_close_fails_requests_in_flight(conn):
    greenlets = [gevent.spawn(conn.call, "sleep_and_return", 1, i) for i in range(20)]
    gevent.sleep(0.1)
    transport = conn._transport
    started = time.monotonic()
    conn.close()
    gevent.joinall(greenlets, timeout=slack(2))
    assert time.monotonic() - started < slack(0.5)
    assert all(isinstance(g.exception, ConnectionClosed) for g in greenlets)
    assert transport._reader.dead and transport._writer.dead
    assert conn.is_closed()
    # As in tarantool-python, the next request reconnects.
    assert conn.call("echo", 1)[0] == 1


@pytest.mark.timing
def test_server_killed_then_restarted(fresh_server):
    c = gtarantool.connect(fresh_server.host, fresh_server.port, user=USER, password=PASSWORD,
                           reconnect_max_attempts=2, reconnect_delay=0.05)
    greenlets = [gevent.spawn(c.call, "sleep_and_return", 5, i) for i in range(50)]
    gevent.sleep(0.2)
    started = time.monotonic()
    fresh_server.kill()
    gevent.joinall(greenlets, timeout=slack(3))
    assert time.monotonic() - started < slack(1.0)
    assert all(isinstance(g.exception, NetworkError) for g in greenlets), \
        [g.exception for g in greenlets]
    with pytest.raises(NetworkError):
        c.ping()
    fresh_server.start()
    assert c.call("echo", "back")[0] == "back"
    assert c.stats.reconnects == 1
    c.close()


def test_schema_change_reloads_once_and_retries(server, conn):
    admin = tarantool.connect(server.host, server.port, user=USER, password=PASSWORD)
    before = conn.stats.schema_reloads
    admin.eval("box.schema.space.create('late_space'):create_index('pk')")
    try:
        for i in range(100):   # from an earlier run
            admin.delete("tester", 4_000_000 + i)
        results = gevent.joinall([gevent.spawn(conn.insert, "tester", (4_000_000 + i, "s"))
                                  for i in range(100)], raise_error=True)
        assert all(r.value.rowcount == 1 for r in results)
        assert conn.stats.schema_reloads == before + 1
        assert conn.insert("late_space", (1,)).data == [[1]]
    finally:
        admin.eval("box.space.late_space:drop()")
        admin.close()


def test_fetch_schema_false(server):
    c = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD,
                           fetch_schema=False)
    assert c.eval("return 7")[0] == 7
    with pytest.raises(tarantool.error.NotSupportedError):
        c.select("tester", 1)
    c.close()


def test_bad_arguments_raise_in_caller(conn):
    conn.delete("tester", 5_000_001)   # from an earlier run
    with pytest.raises(TypeError):
        conn.insert("tester", "not a tuple")
    with pytest.raises(TypeError):
        conn.insert("tester", (5_000_000, object()))
    with pytest.raises(tarantool.error.SchemaError):
        conn.select("tester", 1, index="no_such_index")
    assert conn.insert("tester", (5_000_001, "ok"))[0] == [5_000_001, "ok"]


def _run_script(body):
    script = textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("patched", [True, False])
def test_runs_with_and_without_monkey_patching(server, patched):
    out = _run_script("""
        %s
        import gevent, gevent.monkey, socket, threading
        import gtarantool
        c = gtarantool.connect(%r, %d, user=%r, password=%r)
        rs = gevent.joinall([gevent.spawn(c.call, "echo", i) for i in range(200)])
        assert [r.value[0] for r in rs] == list(range(200))
        assert c.stats.send_calls < 50
        print("patched" if gevent.monkey.is_module_patched("socket") else "plain", "ok")
    """ % ("import gevent.monkey; gevent.monkey.patch_all()" if patched else "",
           server.host, server.port, USER, PASSWORD))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("patched ok" if patched else "plain ok")


def test_duplicate_of_a_tuple_with_bytes_is_the_servers_error(conn):
    """Since 2.10 ER_TUPLE_FOUND quotes both tuples, a bytes field as raw bytes
    that are not UTF-8: the caller gets DatabaseError(3) with the message
    (tarantool-python raises UnicodeDecodeError), its bad bytes escaped in the
    message and in the error stack, alone and in a pipeline, and the connection
    serves the next request."""
    key = 3_100_001
    row = (key, "bin", b"\x00\xff\xfe")
    conn.insert("tester", row)
    with pytest.raises(DatabaseError) as info:
        conn.insert("tester", row)
    error = info.value
    assert error.code == 3
    assert "Duplicate key exists" in error.message
    if binary_version() >= (2, 10):
        assert '\\xff\\xfe"]' in error.message   # (the server writes \u0000)
        assert error.extra_info.message == error.message
    with conn.pipeline() as pipe:
        pipe.insert("tester", row)
        pipe.select("tester", key)
    duplicate, selected = pipe.results()
    assert isinstance(duplicate, DatabaseError) and duplicate.code == 3
    assert (duplicate.message, repr(duplicate.extra_info)) == (error.message,
                                                              repr(error.extra_info))
    assert selected.data == [list(row)]
    assert conn.delete("tester", key).data == [list(row)]


def test_lazy_errors_raise_the_same_error_decoded_when_read(server, conn):
    """``lazy_errors=True``: a server error raises ``LazyDatabaseError`` with its
    code, alone and in a pipeline, whose message and stack, once read, are those
    an eager connection gets; a pool passes the option to its connections."""
    key = 3_100_002
    row = (key, "bin", b"\x00\xff\xfe" * 100)
    conn.insert("tester", row)
    with pytest.raises(DatabaseError) as eager:
        conn.insert("tester", row)
    lazy_conn = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD,
                                   lazy_errors=True)
    pool = gtarantool.ConnectionPool([{"host": server.host, "port": server.port}], user=USER,
                                     password=PASSWORD, lazy_errors=True)
    try:
        with lazy_conn.pipeline() as pipe:
            pipe.insert("tester", row)
        errors = [pipe.results()[0]]
        for target in (lazy_conn, pool):
            with pytest.raises(DatabaseError) as info:
                target.insert("tester", row)
            errors.append(info.value)
        for error in errors:
            assert type(error) is gtarantool.LazyDatabaseError and error.code == 3
            assert (error.args, repr(error.extra_info)) == (eager.value.args,
                                                            repr(eager.value.extra_info))
            assert type(error) is DatabaseError
        assert lazy_conn.select("tester", key).data == [list(row)]
    finally:
        pool.close()
        lazy_conn.close()
        conn.delete("tester", key)


@pytest.mark.parametrize("same_id", [True, False], ids=["same-id", "new-id"])
def test_space_recreated_under_the_same_name(server, conn, same_id):
    """A space dropped and created again while the connection has its id cached.
    Which id the new space gets is the server's choice (2.6 takes a new one,
    2.11+ the lowest free one, the same): both cases, with ids set explicitly."""
    admin = tarantool.connect(server.host, server.port, user=USER, password=PASSWORD)
    create = "box.schema.space.create('recreated', {id = %d}):create_index('pk')"
    admin.eval(create % 7001)
    try:
        assert conn.insert("recreated", (1,)).data == [[1]]
        admin.eval("box.space.recreated:drop() " + create % (7001 if same_id else 7002))
        if same_id:
            # The retry after the schema reload (error 109) names the cached id,
            # which is the new space's.
            assert conn.insert("recreated", (2,)).data == [[2]]
        else:
            # The name stands for another id now: the request, encoded for the
            # old one, is not sent again; the refusal (109) is the answer ...
            with pytest.raises(DatabaseError) as info:
                conn.insert("recreated", (2,))
            assert info.value.code == 109 and info.value.applied is False
        # ... and the next call resolves the name again.
        assert conn.insert("recreated", (3,)).data == [[3]]
        rows = admin.eval("return box.space.recreated:select()").data[0]
        assert rows == ([[2], [3]] if same_id else [[3]])
    finally:
        admin.eval("box.space.recreated:drop()")
        admin.close()


def test_connection_dropped_without_close_stops_its_greenlets(server):
    import gc

    c = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD)
    transport = c._transport
    del c
    gc.collect()
    gevent.sleep(0.1)
    assert transport.error is not None
    assert transport._reader.dead and transport._writer.dead


def test_connect_now_false_connects_on_the_first_request(server):
    """No socket until a request needs one, whichever request comes first.  (For
    data methods naming a space, tarantool-python 1.x raises "not available ...
    fetch_schema=False" here instead of connecting; gtarantool connects.)"""
    key = 31_000_001
    as_tarantool_python = {
        "eval": lambda c: c.eval("return ...", "e").data,
        "call": lambda c: c.call("echo", "c").data,
        "ping": lambda c: c.ping(notime=True),
    }
    expected = {
        "replace": (lambda c: c.replace("tester", (key, "lazy")).data, [[key, "lazy"]]),
        "select": (lambda c: c.select("tester", key).data, [[key, "lazy"]]),
        "pipeline": (_pipelined, [[[key, "lazy"]], [1]]),
    }
    for name, first in as_tarantool_python.items():
        t = tarantool.Connection(server.host, server.port, user=USER, password=PASSWORD,
                                 connect_now=False)
        expected[name] = (first, first(t))
        t.close()
    for name, (first, want) in expected.items():
        c = gtarantool.Connection(server.host, server.port, user=USER, password=PASSWORD,
                                  connect_now=False)
        assert c._transport is None
        assert first(c) == want, name
        assert not c.is_closed(), name
        c.close()


def test_connect_now_false_callers_behind_the_first_wait_for_the_schema(server):
    """Greenlets that name a space while another greenlet's first connect is
    between its handshake and its schema (authenticating) wait for that connect
    instead of failing with "not available ... fetch_schema=False"."""
    c = gtarantool.Connection(server.host, server.port, user=USER, password=PASSWORD,
                              connect_now=False)
    try:
        first = gevent.spawn(c.replace, "tester", (31_000_010, "first"))
        deadline = time.monotonic() + 10   # (a busy host: the connect takes its time)
        while c._encoder is None and time.monotonic() < deadline:
            gevent.sleep(0)
        assert c._encoder is not None and c.schema is None   # the window is open
        later = [gevent.spawn(c.replace, "tester", (31_000_011 + i, "later")) for i in range(5)]
        gevent.joinall([first] + later, timeout=10, raise_error=True)
        assert [g.value.data[0][1] for g in [first] + later] == ["first"] + ["later"] * 5
    finally:
        c.close()


def test_a_name_after_a_first_connect_that_failed_before_the_schema_connects(fresh_server):
    """A first connect that ran out authenticating (the server's on_auth slow
    once) leaves no schema: a later call naming a space connects again, as one
    by id does, instead of failing with "not available ... fetch_schema=False"."""
    admin = gtarantool.connect(fresh_server.host, fresh_server.port, user=USER, password=PASSWORD)
    admin.eval("slow_once = true; box.session.on_auth(function(user) "
               "if user == 'test' and slow_once then slow_once = false "
               "require('fiber').sleep(1) end end)")
    c = gtarantool.Connection(fresh_server.host, fresh_server.port, user=USER,
                              password=PASSWORD, connect_now=False, request_timeout=0.3)
    try:
        with pytest.raises(RequestTimeout):
            c.ping()
        assert c.schema is None
        gevent.sleep(1)   # (the slow authentication over)
        assert c.replace("tester", (31_000_020, "named")).data == [[31_000_020, "named"]]
        assert c.space("tester").select(31_000_020).data == [[31_000_020, "named"]]
    finally:
        c.close()
        admin.close()


@pytest.mark.timing
def test_connection_timeout_bounds_an_authentication_that_never_answers(fresh_server):
    """A server that greets and then holds the authentication (its on_auth
    slow) ends a connect within ``connection_timeout``, as a pool's check
    does, with no ``request_timeout`` to bound it: NetworkError, no socket left."""
    admin = gtarantool.connect(fresh_server.host, fresh_server.port, user=USER, password=PASSWORD)
    admin.eval("box.session.on_auth(function(user) "
               "if user == 'test' then require('fiber').sleep(5) end end)")
    lazy = gtarantool.Connection(fresh_server.host, fresh_server.port, user=USER,
                                 password=PASSWORD, connect_now=False, connection_timeout=0.5,
                                 reconnect_max_attempts=0)
    try:
        for name, attempt in (("connect", lambda: gtarantool.Connection(
                                  fresh_server.host, fresh_server.port, user=USER,
                                  password=PASSWORD, connection_timeout=0.5)),
                              ("first call", lambda: lazy.call("echo", 1))):
            started = time.monotonic()
            with pytest.raises(NetworkError, match="connection_timeout=0.5s"):
                gevent.with_timeout(10, attempt)
            took = time.monotonic() - started
            assert took <= 0.5 + slack(0.5), (name, took)
        assert lazy.is_closed()
    finally:
        lazy.close()
        admin.close()


def test_close_while_a_call_connects_leaves_no_socket_up(fresh_server):
    """close() while another greenlet's call is connecting (its server's
    on_auth slow): the connect gives its socket up and the call fails with
    ConnectionClosed, not sent (it went on, and left a socket and its
    greenlets up after close() had returned)."""
    admin = gtarantool.connect(fresh_server.host, fresh_server.port, user=USER, password=PASSWORD)
    admin.eval("box.session.on_auth(function(user) "
               "if user == 'test' then require('fiber').sleep(0.5) end end)")
    c = gtarantool.Connection(fresh_server.host, fresh_server.port, user=USER,
                              password=PASSWORD, connect_now=False)
    try:
        call = gevent.spawn(c.replace, "tester", (31_000_030, "after close"))
        gevent.sleep(0.1)
        c.close()
        call.join(10)
        assert isinstance(call.exception, ConnectionClosed), call.exception
        assert gtarantool.errors.applied(call.exception) is False
        assert c.is_closed()
        assert admin.select("tester", 31_000_030).data == []
    finally:
        c.close()
        admin.close()


def test_a_first_calls_timeout_and_connection_timeout_running_out_together_raise_requesttimeout(
        fresh_server):
    """A first call whose request_timeout and connection_timeout both run out
    while it authenticates (its hub busy meanwhile, as in a forked child or on
    a loaded host) ends with RequestTimeout, not sent: the connect's own timer
    fired into the clean-up of the attempt its caller's timer had ended, and
    the caller got a raw gevent.Timeout, no error of the library's."""
    admin = gtarantool.connect(fresh_server.host, fresh_server.port, user=USER, password=PASSWORD)
    admin.eval("box.session.on_auth(function(user) "
               "if user == 'test' then require('fiber').sleep(2) end end)")
    try:
        # (streams: 2.10+)
        for name in ["ping", "call", "select"] + ["begin"] * (binary_version() >= (2, 10)):
            lazy = gtarantool.Connection(fresh_server.host, fresh_server.port, user=USER,
                                         password=PASSWORD, connect_now=False,
                                         request_timeout=0.5, connection_timeout=0.5,
                                         reconnect_max_attempts=0)
            # (waiting for the authentication's reply, the hub busy past both timers)
            busy = gevent.spawn_later(0.2, time.sleep, 0.8)
            try:
                with pytest.raises(RequestTimeout) as caught:
                    if name == "ping":
                        lazy.ping()
                    elif name == "call":
                        lazy.call("echo", 1)
                    elif name == "select":
                        lazy.select("_space", 280)
                    else:
                        lazy.stream().begin()
                assert caught.value.applied is False, name
            finally:
                busy.join()
                lazy.close()
    finally:
        admin.close()


def _pipelined(c):
    p = c.pipeline()
    p.select("tester", 31_000_001)
    p.call("echo", 1)
    return [r.data for r in p.results()]


# -- 2.10+ data, errors and features, call by call with tarantool-python --------

def server_version(conn):
    return tuple(conn.version_id.to_bytes(3, "big"))   # tarantool's version_id(major, minor, patch)


def needs(conn, version, what):
    if server_version(conn) < version:
        pytest.skip("needs Tarantool %s+ (%s); server is %s"
                    % (".".join(map(str, version)), what, ".".join(map(str, server_version(conn)))))


def detailed(fn):
    """``outcome`` with the error's message and extension (the box.error stack),
    the exception type of a client-side failure, and each value's repr (a
    Datetime compares equal across time zones)."""
    try:
        r = fn()
    except DatabaseError as exc:
        return ("error", type(exc).__name__, exc.code, exc.message, repr(exc.extra_info))
    except Exception as exc:  # noqa: BLE001 - compared with the reference's
        return ("raised", type(exc).__name__)
    if isinstance(r, Response):
        return (type(r).__name__, r.data, repr(r.data))
    return ("value", r, repr(r))


def rekey(o, old, new):
    """``o`` with the key ``old`` written as ``new`` (in lists, tuples and strings)."""
    if isinstance(o, (list, tuple)):
        return type(o)(rekey(x, old, new) for x in o)
    if isinstance(o, str):
        return o.replace(str(old), str(new))
    return new if type(o) is int and o == old else o


def _dt(**kw):
    return tarantool.Datetime(year=2022, month=8, day=31, hour=18, minute=7, sec=54,
                              nsec=308543321, **kw)


# name -> (first server version, what needs it, case(conn, key))
NEWER_CASES = {
    "decimal_38_digits": ((2, 3, 0), "decimal", lambda c, k: c.replace(
        "tester", (k, "d", decimal.Decimal("1234567890123456789012345678901234567.8")))),
    "decimal_tiny": ((2, 3, 0), "decimal", lambda c, k: c.replace(
        "tester", (k, "d", decimal.Decimal("-0.00000000000000000000000000000000000001")))),
    "decimal_from_lua": ((2, 3, 0), "decimal", lambda c, k: c.eval(
        "return require('decimal').new('-9999999999999999999999999999999999999.9')")),
    "decimal_76_digits": ((2, 3, 0), "decimal", lambda c, k: c.replace(
        "tester", (k, "d", decimal.Decimal("1" * 76)))),
    "uuid": ((2, 4, 1), "uuid", lambda c, k: c.replace(
        "tester", (k, "u", uuid.UUID("ae28d4f6-076c-49dd-8227-7f9fae9592d0")))),
    "uuid_from_lua": ((2, 4, 1), "uuid", lambda c, k: c.eval(
        "return require('uuid').fromstr('64d22e4d-ac92-4a23-899a-e59f34af5479')")),
    "datetime_utc": ((2, 10, 0), "datetime", lambda c, k: c.replace(
        "tester", (k, "t", _dt()))),
    "datetime_offset": ((2, 10, 0), "datetime", lambda c, k: c.replace(
        "tester", (k, "t", _dt(tzoffset=180)))),
    "datetime_tz_name": ((2, 10, 0), "datetime", lambda c, k: c.replace(
        "tester", (k, "t", _dt(tz="Europe/Moscow")))),
    "datetime_from_lua": ((2, 10, 0), "datetime", lambda c, k: c.eval(
        "return require('datetime').new{year = 2000, month = 1, day = 1, nsec = 5, "
        "tz = 'Asia/Tokyo'}")),
    "interval": ((2, 10, 0), "interval", lambda c, k: c.replace("tester", (
        k, "i", tarantool.Interval(year=1, month=-2, week=3, day=4, hour=5, minute=6, sec=7,
                                   nsec=8, adjust=tarantool.IntervalAdjust.LAST)))),
    "interval_from_lua": ((2, 10, 0), "interval", lambda c, k: c.eval(
        "return require('datetime').interval.new{year = 3, min = -4, adjust = 'excess'}")),
    "datetime_arithmetic": ((2, 10, 0), "interval", lambda c, k: c.eval(
        "local a, b = ... return a + b, a - a", _dt(tz="Europe/Moscow"),
        tarantool.Interval(month=1, adjust=tarantool.IntervalAdjust.LAST))),
    "box_error_object": ((2, 10, 0), "error extension", lambda c, k: c.eval(
        "return box.error.new{type = 'MyError', reason = 'custom', code = 1234}")),
    "box_error_stack": ((2, 10, 0), "error extension", lambda c, k: c.eval(
        "local inner = box.error.new{reason = 'inner', code = 1} "
        "local outer = box.error.new{reason = 'outer', code = 2} "
        "outer:set_prev(inner) error(outer)")),
    "box_error_fields": ((2, 10, 0), "error extension", lambda c, k: c.eval(
        "box.error(box.error.NO_SUCH_USER, 'nobody')")),
    "sql_types": ((2, 10, 0), "SQL", lambda c, k: c.execute(
        "SELECT CAST(? AS DECIMAL), CAST(? AS UUID), ?, NULL",
        [decimal.Decimal("1.5"), "ae28d4f6-076c-49dd-8227-7f9fae9592d0", b"\x00\x01"])),
}


@pytest.mark.parametrize("name", sorted(NEWER_CASES))
def test_newer_types_and_errors_as_tarantool_python(name, conn, ref, reader):
    version, what, case = NEWER_CASES[name]
    needs(conn, version, what)
    base = (6_000_000 if reader == "c" else 7_000_000) + sorted(NEWER_CASES).index(name) * 1000
    expected = detailed(lambda: case(ref, base))
    got = detailed(lambda: case(conn, base + 500))
    assert rekey(got, base + 500, base) == expected
    if expected[0] != "Response" or not name.startswith(("decimal", "uuid", "datetime",
                                                           "interval")):
        return
    # What each stored reads back the same through both connections.
    stored = [conn.select("tester", key).data for key in (base, base + 500)]
    assert [ref.select("tester", key).data for key in (base, base + 500)] == stored
    assert [row[1:] for row in stored[0]] == [row[1:] for row in stored[1]]


def test_protocol_version_and_features_as_tarantool_python(conn, ref):
    """IPROTO_ID: what gtarantool negotiated is what tarantool-python did."""
    needs(conn, (2, 10, 0), "IPROTO_ID")
    assert conn._protocol_version is not None and conn._features is not None
    assert (conn._protocol_version, conn._features) == (ref._protocol_version, ref._features)
    assert (conn._server_protocol_version, conn._server_features, conn._server_auth_type) == \
        (ref._server_protocol_version, ref._server_features, ref._server_auth_type)


@pytest.mark.parametrize("option", [{"required_protocol_version": 99},
                                    {"required_features": [99]},
                                    {"password": "wrong"}],
                         ids=["protocol_version", "features", "auth"])
def test_failures_during_connect_are_network_errors(server, option):
    """As tarantool-python's connect(): whatever fails while connecting raises
    NetworkError, the cause chained; nothing is left open."""
    kwargs = dict({"user": USER, "password": PASSWORD}, **option)
    with pytest.raises(NetworkError) as theirs:
        tarantool.Connection(server.host, server.port, **kwargs)
    with pytest.raises(NetworkError) as ours:
        gtarantool.connect(server.host, server.port, **kwargs)
    cause = theirs.value.__cause__
    assert type(ours.value.__cause__) is type(cause)
    assert (getattr(cause, "message", None) or str(cause)) in str(ours.value)


def test_required_protocol_version_the_server_has(server):
    needs(tarantool.connect(server.host, server.port), (2, 10, 0), "IPROTO_ID")
    c = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD,
                           required_protocol_version=1, required_features=[0, 2])
    assert c.ping(notime=True) == "Success"
    c.close()


def test_socket_fd_with_box_session_new(server, conn):
    """A socket the server adopted with box.session.new (3.0+), passed as socket_fd."""
    if conn.eval("return box.session.new == nil").data[0]:
        pytest.skip("needs Tarantool 3.0+ (box.session.new); server is %s"
                    % ".".join(map(str, server_version(conn))))
    port = conn.eval("""
        fd_server = fd_server or require('socket').tcp_server('127.0.0.1', 0, function(s)
            box.session.new({type = 'binary', fd = s:fd(), user = 'test'})
            s:detach()
        end)
        return fd_server:name().port""").data[0]
    import socket
    # The connection owns the descriptor (and closes it), as tarantool-python's.
    fd = socket.create_connection(("127.0.0.1", port)).detach()
    c = gtarantool.connect(None, None, socket_fd=fd)
    assert c.eval("return box.session.user()").data == ["test"]
    c.insert("tester", (5_100_001, "fd"))
    assert c.select("tester", 5_100_001).data == [[5_100_001, "fd"]]
    assert c.delete("tester", 5_100_001).rowcount == 1
    c.close()


def test_fetch_schema_false_and_sql(server):
    """Without a schema: spaces by number, SQL with its metadata."""
    c = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD,
                           fetch_schema=False)
    r = tarantool.Connection(server.host, server.port, user=USER, password=PASSWORD,
                             fetch_schema=False)
    try:
        assert c.schema is None
        space = c.eval("return box.space.tester.id").data[0]
        assert outcome(lambda: c.replace(space, (5_200_001, "ns"))) == \
            outcome(lambda: r.replace(space, (5_200_001, "ns")))
        query = "SELECT * FROM sqltest WHERE id > ? ORDER BY id LIMIT 3"
        ours, theirs = c.execute(query, [0]), r.execute(query, [0])
        assert (ours.data, ours.rowcount, ours.body) == (theirs.data, theirs.rowcount, theirs.body)
        with pytest.raises(tarantool.error.NotSupportedError):
            c.select("tester", 1)
    finally:
        c.close()
        r.close()


def test_error_false_returns_the_error_reply(conn):
    """As tarantool-python's Response: with ``conn.error`` False an error reply
    is returned (code, message, no data) instead of raised."""
    conn.replace("tester", (3_000_100, "dup"))
    conn.error = False
    r = conn.insert("tester", (3_000_100, "dup"))
    assert (r.return_code, r.data) == (3, [])
    assert "Duplicate key" in r.return_message and r.sync > 0
    conn.error = True
    with pytest.raises(DatabaseError) as info:
        conn.insert("tester", (3_000_100, "dup"))
    assert info.value.code == 3 and info.value.message == r.return_message


@pytest.mark.usefixtures("reader")
@pytest.mark.parametrize("bad, good", [
    ({"limit": 1.0}, {"limit": 1}), ({"offset": 1.0}, {"offset": 1}),
    ({"iterator": 2.0}, {"iterator": 2}), ({"limit": True}, {"limit": 1}),
    ({"offset": False}, {}), ({"index": 1.0}, {"index": 1}), ({"index": True}, {"index": 1})])
def test_a_value_equal_to_an_int_refused_by_the_server_leaves_the_ints_calls_alone(
        server, bad, good):
    """1.0 and True equal 1 as dict keys: a select the server refuses for a
    float or bool argument (error 20, as tarantool-python's) must not leave its
    encoding behind for the same call with the int."""
    conn = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD)
    try:
        conn.replace("tester", (30_000_001, "float-key"))
        with pytest.raises(DatabaseError) as err:
            conn.select("tester", [], **bad)
        assert err.value.code == 20
        for _ in range(2):
            assert isinstance(conn.select("tester", [], **good).data, list)
        if "index" in bad:   # (index 1: by name)
            assert [30_000_001, "float-key"] in conn.select("tester", "float-key", **good).data
    finally:
        conn.delete("tester", 30_000_001)
        conn.close()


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_a_numeric_address_is_connected_to_without_a_resolver_thread(server):
    """A connection (and a pool's) to a numeric address starts no thread:
    gevent's resolver would run getaddrinfo in the hub's thread pool, and a
    thread still starting when a server's master forks its workers from C
    without the GIL (uWSGI) leaves them waiting for the GIL forever.  A host
    name still goes to gevent's resolver."""
    script = textwrap.dedent("""
        import os, gtarantool
        conn = gtarantool.connect("127.0.0.1", %d, user=%r, password=%r)
        pool = gtarantool.ConnectionPool([{"host": "127.0.0.1", "port": %d}],
                                         user=%r, password=%r)
        assert conn.ping(notime=True) == "Success"
        assert pool.ping(notime=True, mode=gtarantool.Mode.ANY) == "Success"
        print(len(os.listdir("/proc/self/task")))   # the process's threads
        by_name = gtarantool.connect("localhost", %d, user=%r, password=%r)
        assert by_name.ping(notime=True) == "Success"
        for c in (conn, pool, by_name):
            c.close()
    """) % (server.port, USER, PASSWORD, server.port, USER, PASSWORD,
            server.port, USER, PASSWORD)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1"], done.stdout
