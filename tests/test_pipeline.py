"""Pipelines: many requests from one greenlet, replies matched in order."""
import os
import time

import gevent
import pytest
import tarantool
from tarantool.error import DatabaseError, NetworkError
from tarantool.response import Response

import gtarantool
from gtarantool.errors import ProtocolError, applied
from gtarantool.pipeline import BATCH
from gtarantool.testing.server import binary_version

from . import children, fakepeer
from .conftest import PASSWORD, USER
from .timing import slack

MANUAL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                      "pipelines.rst")

# Every test with the reader's C loop and with its Python loop.
pytestmark = pytest.mark.usefixtures("reader")


def test_replies_in_request_order_with_errors_in_place(conn):
    base = 20_000_000
    with conn.pipeline() as p:   # from an earlier run
        for i in range(1000):
            p.delete("tester", base + i)
    before = conn.stats.responses
    with conn.pipeline() as p:
        for i in range(1000):
            p.insert("tester", (base + i, "p"))
        p.insert("tester", (base, "duplicate"))
        p.select("tester", base + 5)
        p.call("raise_error", "in pipeline")
        p.update("tester", base + 7, [("=", 1, "u")])
        p.delete("tester", base + 8)
        p.eval("return ...", "e")
        p.ping()
    results = p.results()
    assert len(results) == 1007
    assert all(isinstance(r, Response) and r.conn is conn for r in results[:1000])
    assert [r[0][0] for r in results[:1000]] == [base + i for i in range(1000)]
    assert isinstance(results[1000], DatabaseError) and results[1000].code == 3
    assert results[1001].data == [[base + 5, "p"]]
    assert isinstance(results[1002], DatabaseError) and results[1002].code == 555
    assert results[1003].data == [[base + 7, "u"]]
    assert results[1004].data == [[base + 8, "p"]]
    assert results[1005].data == ["e"]
    assert conn.stats.responses - before == 1007
    assert conn.select("tester", base + 999)[0] == [base + 999, "p"]


def test_select_many_gives_each_key_what_select_gives_it(conn):
    base = 20_500_000
    conn.eval("for i = 0, 19 do box.space.tester:replace{%d + i, 'many-' .. (i %% 4)} end"
              % base)
    keys = [base + i for i in range(20)] + [base + 100, [base + 3], (base + 4,)]
    with conn.pipeline() as p:
        p.ping()
        places = p.select_many("tester", keys)
        by_name = p.select_many("tester", ["many-1", ("many-2",), "none"], index="by_name")
        p.select("tester", base + 7)
    results = p.results()
    assert places == range(1, 1 + len(keys)) and by_name == range(places.stop, places.stop + 3)
    assert [results[i].data for i in places] == [conn.select("tester", k).data for k in keys]
    assert [results[i].data for i in by_name] == [
        conn.select("tester", k, index="by_name").data for k in ("many-1", "many-2", "none")]
    assert len(results[by_name[0]].data) == 5 and results[by_name[2]].data == []
    assert results[-1].data == [[base + 7, "many-3"]]
    assert all(results[i].conn is conn for i in places)


def test_a_batch_sent_from_its_rows_keeps_its_place_among_other_requests(conn, reader):
    """``send_frames`` of a batch whose long values are written from the rows
    (a Gather, with the C encoder; bytes without it), 20 MB, more than the
    socket takes at once: the requests queued before it go first, those after
    it after, every byte as encoded."""
    from gtarantool.protocol.constants import REQUEST_TYPE_REPLACE

    base = 20_700_000
    keys = range(base, base + 200)
    longs = {k: "%d-" % k + "x" * 100_000 for k in keys}
    with conn.pipeline() as p:
        for k in keys:
            p.replace("tester", (k, "before"))
        encoder = p._encoder
        prefix, suffix = encoder.batch_parts(REQUEST_TYPE_REPLACE, conn.space("tester").space_no)
        first = p.take_syncs(len(keys))
        frames = encoder.encode_batch(REQUEST_TYPE_REPLACE, prefix,
                                      [(k, longs[k]) for k in keys], first, suffix, (),
                                      bytearray(), 1024)
        assert type(frames).__name__ == ("Gather" if reader == "c" else "bytearray")
        p.send_frames(frames, first, len(keys))
        for k in keys[100:]:
            p.replace("tester", (k, "after"))
    assert all(not isinstance(r, Exception) for r in p.results())
    got = {t[0]: t[1] for t in conn.select("tester", base, iterator="GE", limit=200).data}
    assert got == {k: longs[k] if k < base + 100 else "after" for k in keys}
    conn.eval("for k = %d, %d do box.space.tester:delete{k} end" % (base, base + 199))


@pytest.mark.parametrize("on", ["connection", pytest.param("stream", marks=pytest.mark.skipif(
    binary_version() < (2, 10), reason="streams need Tarantool 2.10+"))])
def test_select_many_refuses_a_bad_key_and_queues_nothing(conn, on):
    with (conn if on == "connection" else conn.stream()).pipeline() as p:
        p.ping()
        with pytest.raises(ValueError, match="empty key"):
            p.select_many("tester", [1, [], 2])
        with pytest.raises(TypeError):
            p.select_many("tester", [1, object()])
        with pytest.raises(tarantool.error.SchemaError):
            p.select_many("no_such_space", [1])
        assert p.select_many("tester", []) == range(1, 1)
        p.select_many("tester", iter([20_499_999]))
    results = p.results()
    assert len(results) == 2 and results[1].data == [] and results[1].conn is conn


def test_select_many_on_a_lost_connection_holds_the_error_in_each_place(fresh_server):
    c = gtarantool.connect(fresh_server.host, fresh_server.port, user=USER, password=PASSWORD,
                           reconnect_max_attempts=0)
    try:
        c.ping()
        fresh_server.kill()
        gevent.sleep(0.2)                # the reader sees the connection close
        p = c.pipeline()
        with pytest.raises(NetworkError):
            p.select_many("tester", [1, 2, 3])
        results = p.results()
        assert len(results) == 3 and all(isinstance(r, NetworkError) for r in results)
        assert all(r.applied is False for r in results)
    finally:
        c.close()


def test_pipeline_respects_max_in_flight(server):
    c = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD,
                           max_in_flight=50)
    p = c.pipeline()
    for i in range(3000):
        p.replace("tester", (21_000_000 + i, "w"))
    assert c.stats.max_in_flight <= 50
    results = p.results()
    assert len(results) == 3000 and all(r.rowcount == 1 for r in results)
    before = c.stats.send_calls
    p = c.pipeline()
    for i in range(3000):
        p.select("tester", 21_000_000 + i)
    assert [r[0][0] for r in p.results()] == [21_000_000 + i for i in range(3000)]
    assert c.stats.send_calls - before < 3000 / 20
    c.close()


def test_pipeline_and_other_greenlets_share_the_connection(conn):
    def single(i):
        return conn.call("echo", i)[0]

    others = [gevent.spawn(single, i) for i in range(200)]
    p = conn.pipeline()
    for i in range(2000):
        p.call("echo", i)
    assert [r[0] for r in p.results()] == list(range(2000))
    assert [g.get() for g in others] == list(range(200))


@pytest.mark.parametrize("max_in_flight", [10, 1000])
def test_pipeline_filled_by_two_greenlets_gives_each_request_its_place(server, max_in_flight):
    # While one greenlet hands a batch over (waiting for room), the other's
    # requests wait: each call returns the place its reply has in results().
    c = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD,
                           max_in_flight=max_in_flight)
    p = c.pipeline()
    places = {}

    def fill(tag):
        for i in range(600):
            places[tag, i] = p.call("echo", tag, i)
            if i % 7 == 0:
                gevent.sleep(0)

    gevent.joinall([gevent.spawn(fill, tag) for tag in "ab"], raise_error=True)
    results = p.results()
    assert len(results) == 1200 and sorted(places.values()) == list(range(1200))
    assert all(results[k].data == [tag, i] for (tag, i), k in places.items())
    c.close()


def test_a_kill_or_timeout_in_the_with_block_sends_nothing_more_and_waits_for_nothing(conn):
    conn.delete("tester", 22_000_000)
    pipelines = []

    def fill():
        with conn.pipeline() as p:
            pipelines.append(p)
            p.call("sleep_and_return", 2, 1)
            p.replace("tester", (22_000_000, "k"))
            gevent.sleep(10)

    def bounded():
        with gevent.Timeout(0.2):
            fill()

    for end in ("kill", "timeout"):
        g = gevent.spawn(fill if end == "kill" else bounded)
        gevent.sleep(0.1)
        if end == "kill":
            g.kill(block=False)
        assert g.join(timeout=slack(1.0)) is None and g.dead, end
        results = pipelines[-1].results()
        assert [(type(r), applied(r)) for r in results] == [(NetworkError, False)] * 2, end
        assert conn.select("tester", 22_000_000).data == []   # not sent


def test_a_request_timeout_in_the_with_block_reaches_the_caller_at_once(server):
    # A call of the block out of request_timeout: the caller hears of it then,
    # not a request_timeout later, and the pipeline's own wait does not take
    # its place; a block's other errors go on too, whatever the wait gives.
    c = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD,
                           request_timeout=0.5)
    c.delete("tester", 22_000_001)
    started = time.monotonic()
    with pytest.raises(gtarantool.RequestTimeout) as caught:
        with c.pipeline() as p:
            p.call("sleep_and_return", 3, 1)
            p.replace("tester", (22_000_001, "k"))
            c.call("sleep_and_return", 3, 2)
    assert time.monotonic() - started < slack(0.5) + 0.25
    assert "pipeline" not in str(caught.value)
    results = p.results()
    assert [(type(r), applied(r)) for r in results] == [(NetworkError, False)] * 2
    assert c.select("tester", 22_000_001).data == []   # not sent

    with pytest.raises(ZeroDivisionError):
        with c.pipeline() as p:
            p.call("sleep_and_return", 3, 1)
            1 / 0
    assert isinstance(p.results()[0], gtarantool.RequestTimeout)   # waited, not raised
    c.close()


def test_pipeline_timeout_and_connection_loss(fresh_server):
    c = gtarantool.connect(fresh_server.host, fresh_server.port, user=USER, password=PASSWORD,
                           request_timeout=0.3)
    p = c.pipeline()
    p.call("echo", 1)
    p.call("sleep_and_return", 2, "slow")
    with pytest.raises(gtarantool.RequestTimeout):
        p.wait()
    results = p.results()
    assert results[0][0] == 1
    assert isinstance(results[1], gtarantool.RequestTimeout)
    assert c._transport.in_flight == 0

    p = c.pipeline()
    p.call("sleep_and_return", 5, "x")
    gevent.sleep(0.1)
    fresh_server.kill()
    results = p.results()
    assert isinstance(results[0], NetworkError)


def test_bad_argument_raises_at_queue_time(conn):
    p = conn.pipeline()
    with pytest.raises(TypeError):
        p.insert("tester", "nope")
    with pytest.raises(tarantool.error.SchemaError):
        p.select("no_such_space", 1)
    p.ping()
    assert len(p.results()) == 1


def test_batch_lost_with_the_server_fails_in_place_and_the_next_reconnects(fresh_server):
    c = gtarantool.connect(fresh_server.host, fresh_server.port, user=USER, password=PASSWORD,
                           reconnect_delay=0.05)
    p = c.pipeline()
    for i in range(BATCH):           # handed over in one batch, answered in 5 s
        p.call("sleep_and_return", 5, i)
    gevent.sleep(0.2)
    fresh_server.kill()
    gevent.sleep(0.2)
    fresh_server.start()
    for i in range(BATCH, 2 * BATCH + 10):
        p.call("echo", i)
    results = p.results()
    assert len(results) == 2 * BATCH + 10
    assert all(isinstance(r, NetworkError) for r in results[:BATCH])
    assert [r[0] for r in results[BATCH:]] == list(range(BATCH, 2 * BATCH + 10))
    assert c.stats.reconnects == 1
    c.close()


def test_batch_that_cannot_be_sent_raises_at_queue_time(fresh_server):
    c = gtarantool.connect(fresh_server.host, fresh_server.port, user=USER, password=PASSWORD,
                           reconnect_max_attempts=0)
    fresh_server.kill()
    gevent.sleep(0.2)                # the reader sees the connection close
    p = c.pipeline()
    for i in range(BATCH - 1):
        p.call("echo", i)
    with pytest.raises(NetworkError):
        p.call("echo", BATCH - 1)    # the batch's last request hands the batch over
    p.call("echo", BATCH)            # queued; fails when the results are awaited
    results = p.results()
    assert len(results) == BATCH + 1
    assert all(isinstance(r, NetworkError) for r in results)
    c.close()


def test_timeout_while_waiting_for_room_fails_every_request_in_place(server):
    c = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD,
                           max_in_flight=5, request_timeout=0.3)
    p = c.pipeline()
    for i in range(20):              # 5 go out; the rest wait for room that never comes
        p.call("sleep_and_return", 2, i)
    results = p.results()
    assert len(results) == 20
    assert all(isinstance(r, gtarantool.RequestTimeout) for r in results)
    assert c._transport.in_flight == 0
    assert c.call("echo", "after")[0] == "after"
    c.close()


def test_pipeline_on_a_connection_that_never_connected():
    import socket
    with socket.socket() as s:       # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = gtarantool.Connection("127.0.0.1", port, connect_now=False, reconnect_max_attempts=0)
    assert c.pipeline().results() == []
    p = c.pipeline()
    with pytest.raises(NetworkError):   # encoding needs the server: it connects, and fails
        p.call("echo", 1)
    assert p.results() == []


# -- the bulk path: requests framed by the caller (send_frames, failures) ------------

def _frames(p, space, rows, code=2):
    """(frames, first sync) of inserts of ``rows`` into ``space``, encoded for ``p``."""
    encoder = p._encoder
    prefix, suffix = encoder.batch_parts(code, p._conn.space(space).space_no)
    first = p.take_syncs(len(rows))
    return encoder.encode_batch(code, prefix, rows, first, suffix), first


def test_send_frames_checks_each_reply_and_builds_only_failures(conn):
    base = 21_000_000
    conn.eval("for i = %d, %d do box.space.tester:delete(i) end" % (base, base + 999))
    p = conn.pipeline()
    p.ping()
    rows = [(base + i, "bulk") for i in range(1000)]
    rows[500] = (base + 1, "duplicate")           # refused: a taken key
    frames, first = _frames(p, "tester", rows)
    assert p.send_frames(frames, first, len(rows)) == 1
    p.insert("tester", (base, "duplicate too"))   # an ordinary request after them
    failures = p.failures()
    assert [place for place, _ in failures] == [501, 1001]
    assert all(isinstance(exc, DatabaseError) and exc.code == 3 for _, exc in failures)
    assert conn.select("tester", base + 999)[0] == [base + 999, "bulk"]
    results = p.results()   # the same replies, as Responses
    assert len(results) == 1002 and results[2][0] == [base + 1, "bulk"]


def test_send_frames_without_room_in_time_is_not_sent(server):
    c = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD,
                           max_in_flight=1, request_timeout=0.3)
    base = 21_100_000
    c.eval("for i = %d, %d do box.space.tester:delete(i) end" % (base, base + 9))
    slow = c.pipeline()
    slow.call("sleep_and_return", 1, "x")
    slow._flush()   # handed over, no one waiting yet: it holds the only slot for 1 s
    p = c.pipeline()
    frames, first = _frames(p, "tester", [(base + i, "x") for i in range(10)])
    with pytest.raises(gtarantool.RequestTimeout) as info:
        p.send_frames(frames, first, 10)
    assert info.value.applied is False
    failures = p.failures()
    assert [place for place, _ in failures] == list(range(10))
    assert all(exc is info.value for _, exc in failures)
    c.request_timeout = 3
    assert slow.results()[0][0] == "x"
    assert c.select("tester", base, iterator="GE", limit=1).data[:1] != [[base, "x"]]
    c.close()


def test_send_frames_unanswered_in_time_may_have_run(fresh_server):
    """Sent, then the server froze: each row's result is a RequestTimeout,
    which (copy_from's applied None) does not say it was not applied."""
    import signal

    c = gtarantool.connect(fresh_server.host, fresh_server.port, user=USER, password=PASSWORD,
                           request_timeout=0.5)
    p = c.pipeline()
    p.ping()
    p.wait()
    frames, first = _frames(p, "tester", [(21_200_000 + i, "x") for i in range(100)])
    fresh_server.signal(signal.SIGSTOP)
    try:
        p.send_frames(frames, first, 100)
        failures = p.failures()
    finally:
        fresh_server.signal(signal.SIGCONT)
    assert len(failures) == 100
    assert all(type(exc) is gtarantool.RequestTimeout for _, exc in failures)
    assert getattr(failures[0][1], "applied", None) is None
    c.close()


def test_send_frames_in_a_forked_child_sends_nothing_on_the_parents_socket(conn):
    """A transport opened by the parent refuses a batch in a forked child:
    nothing registered, nothing written, InheritedSocket raised."""
    import os

    from gtarantool.transport import InheritedSocket, ReplySink

    base = 21_300_000
    conn.eval("for i = %d, %d do box.space.tester:delete(i) end" % (base, base + 9))
    p = conn.pipeline()
    p.ping()
    p.wait()
    frames, first = _frames(p, "tester", [(base + i, "child") for i in range(10)])
    transport = conn._transport
    pid = children.fork()
    if pid == 0:   # the child: report by exit status only
        code = 1
        try:
            sink = ReplySink()
            try:
                transport.send_frames(frames, first, 10, sink)
            except InheritedSocket:
                code = 0 if not sink.syncs and sink.outstanding == 0 else 2
        finally:
            os._exit(code)
    status = children.wait(pid)
    assert os.WEXITSTATUS(status) == 0
    assert conn.select("tester", base).data == []   # the parent's socket carried none
    assert conn.ping() is not None


def test_send_frames_check_only_keeps_the_failures_and_no_success_body(conn):
    """Checked only: a success keeps its outcome, not its reply (no tuple,
    no body bytes); a refusal in the middle of the batch is reported in its
    place with the server's reason; ordinary requests before and after it
    keep their whole replies."""
    from gtarantool.transport import CHECKED

    base = 21_400_000
    conn.eval("for i = %d, %d do box.space.tester:delete(i) end" % (base, base + 1000))
    p = conn.pipeline()
    p.ping()
    rows = [(base + i, "bulk") for i in range(1000)]
    rows[500] = (base + 1, "duplicate")
    frames, first = _frames(p, "tester", rows)
    assert p.send_frames(frames, first, len(rows), check_only=True) == 1
    p.insert("tester", (base + 1000, "after"))
    failures = p.failures()
    assert [place for place, _ in failures] == [501]
    error = failures[0][1]
    assert isinstance(error, DatabaseError) and error.code == 3
    assert "Duplicate key" in error.message
    replies = [p._sink.replies[sync] for sync in range(first, first + len(rows))]
    assert sum(reply == CHECKED for reply in replies) == 999
    results = p.results()
    assert len(results) == 1002
    assert results[2].data is None and results[2].return_code == 0   # no body kept
    assert isinstance(results[501], DatabaseError)
    assert results[1001][0] == [base + 1000, "after"]
    assert conn.select("tester", base + 999)[0] == [base + 999, "bulk"]
    assert conn.select("tester", base + 500).data == []


def test_send_frames_check_only_twice_in_one_pipeline_waits_for_both(conn):
    base = 21_500_000
    conn.eval("for i = %d, %d do box.space.tester:delete(i) end" % (base, base + 199))
    p = conn.pipeline()
    p.ping()
    for half in (0, 100):
        frames, first = _frames(p, "tester", [(base + half + i, "x") for i in range(100)])
        p.send_frames(frames, first, 100, check_only=True)
    assert p.failures() == []
    assert p._sink.outstanding <= 0 and len(p.results()) == 201
    written = conn.select("tester", base, iterator="GE", limit=200).data
    assert [row[0] for row in written] == list(range(base, base + 200))


def _answer_then(bad, then_close=False):
    """A fake peer's handler: OK replies to the first 4 of 10 requests, in
    Tarantool's layout (an empty body), then ``bad(sync of the 5th)``."""
    return fakepeer.misbehave_after(
        10, lambda syncs: b"".join(fakepeer.tarantool_frame(s, b"\x80") for s in syncs[:4])
        + bad(syncs[4]), then_close)


BAD_BULK_REPLIES = {
    "garbage": (lambda sync: b"\xc1" * 64, False, ProtocolError),
    # Tarantool's layout, its length prefix shorter than the header
    "header_beyond_its_frame": (lambda sync: fakepeer.tarantool_frame(sync, b"")[:1]
                                + (10).to_bytes(4, "big")
                                + fakepeer.tarantool_frame(sync, b"")[5:], False, ProtocolError),
    "header_not_a_map": (lambda sync: fakepeer.frame([1, sync, 3]), False, ProtocolError),
    "sync_not_an_int": (lambda sync: fakepeer.frame({0: 0, 1: "x", 5: 1}, {}), False,
                        ProtocolError),
    "torn_then_close": (lambda sync: fakepeer.tarantool_frame(sync, b"\x81\x30\x90")[:20], True,
                        NetworkError),
}


@pytest.mark.timing
@pytest.mark.parametrize("case", sorted(BAD_BULK_REPLIES))
def test_a_bad_reply_to_checked_requests_fails_the_unanswered_ones_at_once(case):
    """Garbage or a torn frame where a checked request's reply should be:
    the caller gets the connection's error for each request still
    unanswered (may have been applied), promptly, and nothing hangs."""
    from gtarantool.errors import applied

    bad, then_close, expected = BAD_BULK_REPLIES[case]
    with fakepeer.FakePeer(_answer_then(bad, then_close)) as peer:
        c = gtarantool.connect(peer.host, peer.port, fetch_schema=False, request_timeout=10,
                               reconnect_max_attempts=0)
        p = c.pipeline()
        c._ensure_connected()
        encoder = p._encoder
        prefix, suffix = encoder.batch_parts(2, 512)
        first = p.take_syncs(10)
        frames = encoder.encode_batch(2, prefix, [(k, "x") for k in range(10)], first, suffix)
        p.send_frames(frames, first, 10, check_only=True)
        with gevent.Timeout(slack(5)):
            failures = p.failures()
        assert [place for place, _ in failures] == list(range(4, 10))
        assert all(isinstance(exc, expected) and applied(exc) is None for _, exc in failures)
        assert c._transport is None or c._transport.in_flight == 0
        assert not peer.errors
        c.close()


def _manual_samples():
    """The Python samples of docs/pipelines.rst, in order, as a reader copies them."""
    with open(MANUAL, encoding="utf-8") as f:
        blocks = f.read().split(".. code-block:: python\n\n")[1:]
    samples = []
    for block in blocks:
        lines = []
        for line in block.splitlines():
            if line and not line.startswith("    "):
                break
            lines.append(line[4:])
        samples.append("\n".join(lines))
    return samples


def test_the_manuals_samples_run_as_it_says(fresh_server):
    tnt = gtarantool.connect(fresh_server.host, fresh_server.port, user=USER,
                             password=PASSWORD, request_timeout=10)
    tnt.eval("""
        local c = box.schema.space.create('customers', {format = {{'id', 'unsigned'},
                                                                  {'city', 'string'}}})
        c:create_index('primary')
        c:create_index('city', {parts = {'city'}, unique = false})
        c:insert{1, 'Oslo'} c:insert{2, 'Rome'} c:insert{3, 'Oslo'}
        function refresh() return true end""")
    queued, many, bulk = _manual_samples()
    scope = {"tnt": tnt}
    exec(queued, scope)
    results = scope["p"].results()
    assert len(results) == 10001 and not any(isinstance(r, Exception) for r in results)
    assert tnt.select("tester", 9999).data == [[9999, "x"]]

    scope.update(ids=[1, 2, 3, 4], cities=["Oslo", "Rome"])
    exec(many, scope)
    assert scope["rows"] == [[[1, "Oslo"]], [[2, "Rome"]], [[3, "Oslo"]], []]
    assert [scope["results"][i].data for i in scope["by_city"]] == [
        [[1, "Oslo"], [3, "Oslo"]], [[2, "Rome"]]]

    # "only the rows that failed, in order": the taken key, refused unapplied
    # as the text says of a batch given its type
    failed = []
    scope.update(rows=[(20000, "new"), (1, "taken"), (20001, "new")], failed=failed)
    exec(bulk.replace("\n    ...", "\n    failed.append((place, exc))"), scope)
    ((place, exc),) = failed
    assert place == 2 and isinstance(exc, DatabaseError) and exc.code == 3
    assert exc.applied is False
    assert tnt.select("tester", 20001).data == [[20001, "new"]]
    assert tnt.select("tester", 1).data == [[1, "x"]]
    tnt.close()
