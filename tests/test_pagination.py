"""select(..., after=, fetch_pos=) and Response.position against a real server."""
import signal
import time

import gevent
import pytest

import gtarantool
from gtarantool.testing.server import TarantoolServer, binary_version
from tests.conftest import PASSWORD, USER, _lua
from tests.timing import slack

VERSION = binary_version()
needs_pagination = pytest.mark.skipif(
    VERSION < (2, 11), reason="needs Tarantool 2.11+ (pagination); server is %s"
    % ".".join(map(str, VERSION)))


@pytest.fixture
def rows(conn):
    """``tester`` holding ids 0..n-1 (names "n<i % 7>")."""
    def fill(n):
        # In batches that yield: 3.x stops a fiber that runs longer than its slice.
        conn.eval("local n = ... box.space.tester:truncate() "
                  "for s = 0, n - 1, 1000 do box.begin() "
                  "for i = s, math.min(s + 999, n - 1) do "
                  "box.space.tester:insert{i, 'n' .. (i % 7)} end "
                  "box.commit() require('fiber').yield() end", n)
        return conn
    yield fill
    conn.eval("box.space.tester:truncate()")


@pytest.mark.skipif(VERSION >= (2, 11), reason="a server without pagination only")
def test_without_pagination_names_the_version(conn):
    for kwargs in ({"fetch_pos": True}, {"after": (1,)}):
        with pytest.raises(gtarantool.FeatureNotSupported,
                           match=r"needs Tarantool 2\.11\+ \(pagination\); server is 2\."):
            conn.select("tester", **kwargs)
    assert conn.select("tester", 1).data == []   # plain selects are as before


@needs_pagination
def test_hundred_thousand_rows_by_thousand(rows):
    conn = rows(100000)
    seen = []
    position = None
    pages = 0
    while True:
        resp = conn.select("tester", limit=1000, after=position, fetch_pos=True)
        if not resp.data:
            assert resp.position is None
            break
        pages += 1
        seen.extend(row[0] for row in resp.data)
        assert isinstance(resp.position, bytes)
        position = resp.position
    assert pages == 100
    assert seen == list(range(100000))


@needs_pagination
@pytest.mark.usefixtures("reader")
def test_after_a_tuple_and_on_another_index(rows):
    conn = rows(20)
    assert conn.select("tester", [], iterator="GT", after=(15,)).data == [
        [i, "n%d" % (i % 7)] for i in range(16, 20)]
    # A non-unique index: the position tells tuples with equal keys apart.
    names = []
    position = None
    while True:
        resp = conn.select("tester", "n3", index="by_name", limit=1, after=position,
                           fetch_pos=True)
        if not resp.data:
            break
        names.append(resp.data[0][0])
        position = resp.position
    assert names == [3, 10, 17]
    assert conn.select("tester", 1).position is None   # not asked for


@needs_pagination
def test_space_objects_streams_and_pipelines(rows):
    conn = rows(10)
    space = conn.space("tester")
    first = space.select([], limit=4, fetch_pos=True)
    assert [row[0] for row in first.data] == [0, 1, 2, 3]
    assert [row[0] for row in space.select([], limit=2, after=first.position).data] == [4, 5]
    with conn.pipeline() as pipe:
        pipe.select("tester", limit=3, fetch_pos=True)
        pipe.select("tester", limit=3, after=first.position)
    paged, after = pipe.results()
    assert [row[0] for row in paged.data] == [0, 1, 2] and paged.position
    assert [row[0] for row in after.data] == [4, 5, 6]
    stream = conn.stream()
    resp = stream.select("tester", limit=5, after=(4,), fetch_pos=True)
    assert [row[0] for row in resp.data] == [5, 6, 7, 8, 9] and resp.position


@needs_pagination
def test_bad_after(conn):
    with pytest.raises(TypeError, match="after must be"):
        conn.select("tester", after=12)
    for paged in ({"fetch_pos": True}, {"after": (0,)}):
        with pytest.raises(TypeError, match="on_push callback must be callable"):
            conn.select("tester", on_push=5, **paged)
    with pytest.raises(ValueError, match="not a position"):
        conn.select("tester", after=b"\xff\xfe")
    with pytest.raises(gtarantool.DatabaseError):
        conn.select("tester", after=b"not base64 at all!")
    assert conn.ping(notime=True) == "Success"


# Selects of ``tester`` sleep ``slow_selects`` seconds before the server runs
# them (the schema's own selects, while connecting, do not).
SLOW_SELECTS = """
slow_selects = 0
box.iproto.override(box.iproto.type.SELECT, function(header, body)
    if slow_selects > 0 and body:decode()[0x10] == box.space.tester.id then
        require('fiber').sleep(slow_selects)
    end
    return false
end)
"""


@needs_pagination
@pytest.mark.timing
def test_a_select_that_connects_first_ends_within_request_timeout():
    """A paged select on a connection to be (re)connected waits for the
    connect (the server frozen 0.6 s) and then for its reply: one
    ``request_timeout`` bounds both, as for a plain select (it took the
    connect's time plus a whole ``request_timeout``)."""
    srv = TarantoolServer(_lua() + SLOW_SELECTS)
    srv.start()
    conn = gtarantool.connect(srv.host, srv.port, user=USER, password=PASSWORD,
                              request_timeout=1)
    admin = gtarantool.connect(srv.host, srv.port, user=USER, password=PASSWORD,
                               fetch_schema=False)
    try:
        for paged in ({}, {"fetch_pos": True}, {"after": (0,)}):
            for methods in (conn, conn.stream()):
                methods.select("tester", limit=1, **paged)
                conn.close()
                admin.eval("slow_selects = 3")
                srv.signal(signal.SIGSTOP)
                thaw = gevent.spawn_later(0.6, srv.signal, signal.SIGCONT)
                started = time.monotonic()
                with pytest.raises(gtarantool.RequestTimeout):
                    methods.select("tester", limit=1, **paged)
                took = time.monotonic() - started
                thaw.join()
                assert took <= 1 + slack(0.3), (paged, methods, took)
                admin.eval("slow_selects = 0")
    finally:
        srv.signal(signal.SIGCONT)
        admin.close()
        conn.close()
        srv.cleanup()
