"""Framing through a fake peer: the one place a real server cannot be made to
split its greeting and replies at every byte boundary on demand."""
import base64
import os
import types

import gevent
import gevent.server
import msgpack
import pytest
from tarantool.const import (
    IPROTO_DATA,
    IPROTO_REQUEST_TYPE,
    IPROTO_SCHEMA_ID,
    IPROTO_SYNC,
    IPROTO_TUPLE,
)
from tarantool.msgpack_ext.unpacker import ext_hook as tarantool_ext_hook

import gtarantool
from gtarantool.errors import ConnectionClosed
from gtarantool.protocol import Response
from gtarantool.transport import FLUSH_EVERY, LEAD_UP_TO

from .fakepeer import tarantool_frame
from .timing import slack

# The tests that run a transport, with the reader's C loop and with its Python loop.
pytestmark = pytest.mark.usefixtures("reader")

GREETING = (b"Tarantool 2.6.0 (Binary) 7e4f4a14-3a2b-4b4e-9d0a-4b1e4f0c5a10").ljust(63) + b"\n" \
    + base64.b64encode(os.urandom(32)).ljust(63) + b"\n"
assert len(GREETING) == 128


def reply(sync, value):
    header = msgpack.packb({IPROTO_REQUEST_TYPE: 0, IPROTO_SYNC: sync, IPROTO_SCHEMA_ID: 1})
    body = msgpack.packb({IPROTO_DATA: [value]})
    return msgpack.packb(len(header) + len(body)) + header + body


class EchoPeer:
    """Answers each request (an eval or call) with its own arguments under its
    own sync, writing the byte stream in the pieces ``cut(stream)`` returns.
    ``batch`` requests are answered at once."""

    def __init__(self, greeting_cut=None, cut=None, batch=1, pause=0):
        self.greeting_cut = greeting_cut
        self.cut = cut or (lambda data: [data])
        self.batch = batch
        self.pause = pause
        self.server = gevent.server.StreamServer(("127.0.0.1", 0), self.handle)
        self.server.start()
        self.port = self.server.server_port

    def handle(self, sock, _address):
        g = self.greeting_cut
        pieces = [GREETING] if g is None else [GREETING[:g], GREETING[g:]]
        for piece in pieces:
            sock.sendall(piece)
            gevent.sleep(0.001)
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        requests = []   # [sync, arguments]: a length, a header, a body each
        while True:
            data = sock.recv(65536)
            if not data:
                return
            unpacker.feed(data)
            for obj in unpacker:
                if isinstance(obj, dict) and IPROTO_SYNC in obj:
                    requests.append([obj[IPROTO_SYNC], None])
                elif isinstance(obj, dict):
                    requests[-1][1] = obj.get(IPROTO_TUPLE)
            while len(requests) >= self.batch and requests[self.batch - 1][1] is not None:
                stream = b"".join(reply(s, args) for s, args in requests[:self.batch])
                del requests[:self.batch]
                for piece in self.cut(stream):
                    sock.sendall(piece)
                    gevent.sleep(self.pause)

    def close(self):
        self.server.stop()


def connect(peer):
    return gtarantool.connect("127.0.0.1", peer.port, fetch_schema=False,
                              request_timeout=slack(5))


@pytest.mark.parametrize("cut_at", range(1, 128, 3))
def test_greeting_split_anywhere(cut_at):
    peer = EchoPeer(greeting_cut=cut_at)
    try:
        c = connect(peer)
        assert c.version_id is not None
        assert c.eval("ping", cut_at).data == [[cut_at]]
        c.close()
    finally:
        peer.close()


def test_reply_split_at_every_byte_boundary():
    frame_len = len(reply(1, 10))
    for cut_at in range(1, frame_len + 8):
        peer = EchoPeer(cut=lambda data, n=cut_at: [data[:n], data[n:]] if n < len(data)
                        else [data])
        try:
            c = connect(peer)
            for i in range(3):
                assert c.eval("x", cut_at, i).data == [[cut_at, i]]
            c.close()
        finally:
            peer.close()


def test_reply_trickled_byte_by_byte():
    peer = EchoPeer(cut=lambda data: [data[i:i + 1] for i in range(len(data))], batch=4,
                    pause=0.001)
    try:
        c = connect(peer)
        results = [gevent.spawn(c.eval, "x", i) for i in range(8)]
        gevent.joinall(results, raise_error=True)
        assert [g.value.data for g in results] == [[[i]] for i in range(8)]
        assert c.stats.recv_calls > 8
        c.close()
    finally:
        peer.close()


def test_many_replies_in_one_chunk_wake_every_waiter():
    peer = EchoPeer(batch=200)
    try:
        c = connect(peer)
        results = [gevent.spawn(c.eval, "x", i) for i in range(1000)]
        gevent.joinall(results, raise_error=True)
        assert sorted(g.value.sync for g in results) == list(range(
            min(g.value.sync for g in results), max(g.value.sync for g in results) + 1))
        # each caller its own reply: the peer echoes every request's arguments
        assert [g.value.data for g in results] == [[[i]] for i in range(1000)]
        # 1,000 replies arrived in a handful of reads, requests left in few sends.
        assert c.stats.recv_calls <= 50
        assert c.stats.send_calls <= 50
        c.close()
    finally:
        peer.close()


def test_request_frame_layout():
    """What request() writes: a uint32 length, the fixed header map, the body as given."""
    import socket

    import gevent.socket as gsocket
    from tarantool import const

    from gtarantool.transport import Stats, Transport
    a, b = socket.socketpair()
    transport = Transport(gsocket.socket(fileno=os.dup(a.fileno())), Stats(), 10, 1 << 20)
    try:
        body = msgpack.packb({const.IPROTO_KEY: [1]})
        caller = gevent.spawn(transport.request, 1 << 40, const.REQUEST_TYPE_SELECT, 77, body)
        data = _receive_bytes(b, 1)   # (a blocking recv would keep the caller from sending)
        assert data[0] == 0xce
        unpacker = msgpack.Unpacker(strict_map_key=False)
        unpacker.feed(data)
        assert unpacker.unpack() == len(data) - 5
        assert unpacker.unpack() == {const.IPROTO_REQUEST_TYPE: const.REQUEST_TYPE_SELECT,
                                     const.IPROTO_SYNC: 1 << 40, const.IPROTO_SCHEMA_ID: 77}
        assert unpacker.unpack() == {const.IPROTO_KEY: [1]}
        transport.close()
        assert isinstance(caller.get(timeout=1), ConnectionClosed)
    finally:
        transport.close()
        a.close()
        b.close()


def _socketpair_transport(max_in_flight=10):
    import socket

    import gevent.socket as gsocket

    from gtarantool.transport import Stats, Transport
    a, b = socket.socketpair()
    transport = Transport(gsocket.socket(fileno=os.dup(a.fileno())), Stats(), max_in_flight,
                          1 << 20)
    return transport, a, b


class Interrupted(Exception):
    pass


# A ping (framed by request(), in C when built) and a frame passed whole (always Python).
REQUEST_FORMS = pytest.mark.parametrize("code, schema", [(64, 0), (None, None)],
                                        ids=["ping", "whole-frame"])


@REQUEST_FORMS
def test_a_caller_interrupted_after_its_reply_came_is_not_woken_with_it_later(code, schema):
    """A reply queued to wake its caller, who is interrupted before that: the
    caller goes on to wait for something else and only that wakes it."""
    from gevent.event import AsyncResult
    transport, a, b = _socketpair_transport()
    elsewhere = AsyncResult()

    def caller():
        try:
            transport.request(7, code, schema, b"")
        except Interrupted:
            pass
        return elsewhere.get(timeout=2)

    try:
        glet = gevent.spawn(caller)
        gevent.sleep(0)                         # it waits for sync 7
        glet.kill(Interrupted, block=False)     # runs before the reply's wake-up
        transport.feed(reply(7, "late"))
        gevent.sleep(0)
        assert not glet.dead and transport.in_flight == 0 and not transport._ready
        elsewhere.set("right")
        assert glet.get(timeout=2) == "right"
        assert transport.alive
    finally:
        transport.close()
        a.close()
        b.close()


@REQUEST_FORMS
def test_a_stray_switch_into_a_waiting_caller_fails_it_and_takes_no_reply(code, schema):
    """Switched to by something else while it waits (a bug elsewhere), a caller
    raises InvalidSwitchError and gives up its request; the reply queued for
    another caller at that moment still reaches that caller."""
    from gevent.exceptions import InvalidSwitchError
    transport, a, b = _socketpair_transport()

    def stray():   # in the hub, before it wakes anyone
        transport.feed(reply(8, "eight"))
        victim.switch("stray")

    try:
        victim = gevent.spawn(transport.request, 7, code, schema, b"")
        other = gevent.spawn(transport.request, 8, code, schema, b"")
        gevent.sleep(0)                          # both wait
        gevent.get_hub().loop.run_callback(stray)
        with pytest.raises(InvalidSwitchError):
            victim.get(timeout=2)
        got = other.get(timeout=2)   # (a Response from a fast path, a tuple from _frame)
        if type(got) is Response:
            got = (got._sync, got._code, got._schema_version, got._body)
        assert got[:4] == (8, 0, 1, {IPROTO_DATA: ["eight"]})
        assert transport.alive and transport.in_flight == 0 and not transport._ready
    finally:
        transport.close()
        a.close()
        b.close()


@REQUEST_FORMS
def test_a_request_on_a_dead_transport_raises_why_it_died(code, schema):
    """Once the server is gone, a request raises that error at once: it is
    neither queued for a writer that no longer runs nor left waiting."""
    from tarantool.error import NetworkError
    transport, a, b = _socketpair_transport()
    try:
        b.close()                                  # EOF: the reader fails the transport
        gevent.sleep(0.01)
        assert not transport.alive
        with gevent.Timeout(2):
            with pytest.raises(NetworkError, match="closed the connection"):
                transport.request(7, code, schema, b"")
        assert transport.in_flight == 0 and not transport._wbuf
    finally:
        transport.close()
        a.close()


@REQUEST_FORMS
def test_an_error_while_forgetting_a_request_is_raised_in_the_interruptions_context(
        code, schema, monkeypatch):
    """(Cannot happen unless transport.py is broken:) when giving up an
    interrupted request fails, that failure is raised, chained to the
    interruption, and the caller's greenlet is not left waiting."""
    transport, a, b = _socketpair_transport()

    def broken_forget(self, sync, waiting):
        raise RuntimeError("forget failed for %d" % sync)

    monkeypatch.setattr(type(transport), "forget", broken_forget)
    try:
        glet = gevent.spawn(transport.request, 7, code, schema, b"")
        gevent.sleep(0)
        glet.kill(Interrupted, block=True, timeout=2)
        assert glet.dead
        assert isinstance(glet.exception, RuntimeError)
        assert str(glet.exception) == "forget failed for 7"
        assert isinstance(glet.exception.__context__, Interrupted)
    finally:
        transport.close()
        a.close()
        b.close()


def test_callers_that_also_wait_for_other_things_get_their_own_replies(conn):
    """Woken callers wake the next one themselves; some wait on timers, events
    and timeouts in between, and each still gets exactly its own replies."""
    from gevent.event import Event
    go = Event()

    def caller(i):
        got = []
        for n in range(30):
            if n % 3 == 0:
                gevent.sleep(0)
            elif n % 3 == 1 and i % 2:
                go.wait()
            if i % 10 == 0 and n == 5:
                # (the reply comes long after the timer: were the process stalled
                # past both, the loop would run the reader first, and the reply win)
                with pytest.raises(gevent.Timeout):
                    with gevent.Timeout(0.001):
                        conn.call("sleep_and_return", 1, "late")
            got.append(conn.call("echo", i, n).data)
        return got

    glets = [gevent.spawn(caller, i) for i in range(100)]
    gevent.sleep(0.01)
    go.set()
    gevent.joinall(glets, timeout=30, raise_error=True)
    assert [g.value for g in glets] == [[[i, n] for n in range(30)] for i in range(100)]
    assert conn._transport.in_flight <= 10 and not conn._transport._ready


def test_replies_larger_than_the_read_buffer(conn):
    """The reader's buffer grows for a frame longer than it and shrinks back after."""
    from gtarantool.transport import RECV_SIZE
    size = 3 * RECV_SIZE + 12345
    assert conn.call("big_tuple", size).data == ["x" * size]
    calls = [gevent.spawn(conn.call, "big_tuple", RECV_SIZE // 3 + i) for i in range(12)]
    calls += [gevent.spawn(conn.call, "echo", i) for i in range(200)]
    gevent.joinall(calls, raise_error=True)
    assert [c.value.data for c in calls[:12]] == [["x" * (RECV_SIZE // 3 + i)]
                                                  for i in range(12)]
    assert [c.value.data for c in calls[12:]] == [[i] for i in range(200)]
    assert len(conn._transport._rbuf) == RECV_SIZE


def test_large_batches_both_ways(conn):
    """16 MB of requests and replies in one batch (frames straddle every read)
    and a batch of 3,000 small ones: every reply, in order."""
    payloads = ["%d" % i + "y" * (400 * 1024) for i in range(40)]
    with conn.pipeline() as p:
        for payload in payloads:
            p.call("echo", payload)
    assert [r.data for r in p.results()] == [[payload] for payload in payloads]
    with conn.pipeline() as p:
        for i in range(3000):
            p.call("echo", i)
    assert [r.data for r in p.results()] == [[i] for i in range(3000)]
    assert conn.ping() >= 0


def test_the_c_paths_in_use(conn, reader):
    """The C loop and request run unless a test (or a missing compiler) takes them away."""
    assert (conn._transport._cutter is not None) == (reader == "c")
    assert (conn._transport._requester is not None) == (reader == "c")
    assert (type(conn._transport._read_watcher.callback) is not types.MethodType) == (reader == "c")
    assert (type(conn._encoder.join) is not types.FunctionType) == (reader == "c")
    assert conn.select("tester", 1).data is not None


# (code, body bytes): what the reader's fast path sees and what it must make of it.
FAST_PATH_REPLIES = [
    (0, msgpack.packb({IPROTO_DATA: [[1, "a", b"\x00\xff"]]})),
    (0, msgpack.packb({IPROTO_DATA: 5})),            # a scalar: wrapped in a list
    (0, msgpack.packb({IPROTO_DATA: []})),
    (0, msgpack.packb({0x42: "no data"})),
    (0, b""),                                        # empty body: {}
    (0, msgpack.packb({IPROTO_DATA: [1]}) + b"\x01"),  # a byte too many: ExtraData
    (0, msgpack.packb([1, 2])),                      # not a map
    (0, b"\x81\x30\x92\x01"),                        # cut short
    (0, msgpack.packb({IPROTO_DATA: [msgpack.ExtType(99, b"x")]})),  # unknown extension
    (0x8000 | 3, msgpack.packb({0x31: "Duplicate key exists"})),
    (0x8000 | 109, msgpack.packb({0x31: "Wrong schema version"})),
    # Since 2.10 a message quotes tuples, bytes fields as they are: escaped.
    (0x8000 | 3, b"\x82\x31\xb4Duplicate [1, \"\xff\xe2\x82\"]\x52\x81\x00\x91\x81\x03"
                 b"\xa4\xed\xa0\x80!"),
    (7, msgpack.packb({IPROTO_DATA: [2]})),          # another non-error code
]


def _delivered(value):
    """A delivered reply in comparable form (exceptions by class name)."""
    if type(value) is Response:
        return ("Response", value._sync, value._code, value._body, value._schema_version,
                value._return_code, value._data)
    sync, code, schema, body, pushes = value
    return (sync, code, schema, type(body).__name__ if isinstance(body, Exception) else body,
            pushes)


def _expected(sync, code, schema, body):
    """What the caller must get, worked out with msgpack directly (an error's
    body as it came: decoded when it is read, see test_protocol)."""
    if code >= 0x8000:
        return (sync, code, schema, body, None)
    try:
        body = msgpack.unpackb(body, raw=False, strict_map_key=False, ext_hook=lambda code, data:
                               tarantool_ext_hook(code, data, None),
                               ) if body else {}
    except Exception as exc:  # noqa: BLE001
        return (sync, code, schema, type(exc).__name__, None)
    if code or type(body) is not dict:
        return (sync, code, schema, body, None)
    data = body.get(IPROTO_DATA)
    return ("Response", sync, 0, body, schema, 0,
            data if data is None or isinstance(data, list) else [data])


@pytest.mark.parametrize("schema_width", [4, 8], ids=["2.6-layout", "2.10-layout"])
def test_every_kind_of_reply_in_tarantools_layout_reaches_its_caller(reader, schema_width):
    """The reader's fast path (in C or in Python) on every kind of reply in the
    layouts Tarantool writes (the schema version as uint32 up to 2.9, uint64
    since), with replies in other layouts in between, one of which only the
    general way reads (a float in its header; one of them an error): each
    caller gets exactly the value the general decoding gives."""
    frames = [((1 << 63) + i, code, 2 ** 32 - 1 - i, body)
              for i, (code, body) in enumerate(FAST_PATH_REPLIES)]
    half = len(frames) // 2
    odd_header = msgpack.packb({IPROTO_SYNC: 6, 0x04: 1.5, IPROTO_SCHEMA_ID: 1,
                                IPROTO_REQUEST_TYPE: 0})
    odd_body = msgpack.packb({IPROTO_DATA: ["odd"]})
    odd_error_header = msgpack.packb({IPROTO_SYNC: 4, 0x04: 1.5, IPROTO_SCHEMA_ID: 1,
                                      IPROTO_REQUEST_TYPE: 0x8003})
    odd_error_body = FAST_PATH_REPLIES[-2][1]   # invalid UTF-8 in the message
    stream = b"".join(tarantool_frame(sync, body, code, schema, schema_width)
                      for sync, code, schema, body in frames[:half]) + reply(5, "other") \
        + msgpack.packb(len(odd_header) + len(odd_body)) + odd_header + odd_body \
        + msgpack.packb(len(odd_error_header) + len(odd_error_body)) + odd_error_header \
        + odd_error_body \
        + b"".join(tarantool_frame(sync, body, code, schema, schema_width)
                   for sync, code, schema, body in frames[half:])
    transport, a, b = _socketpair_transport(max_in_flight=100)
    try:
        callers = [gevent.spawn(transport.request, sync, None, None, b"")
                   for sync in [f[0] for f in frames] + [5, 6, 4]]
        gevent.sleep(0)
        transport.feed(stream)
        gevent.joinall(callers, timeout=2)
        assert [_delivered(c.value) for c in callers[:-3]] == [_expected(*f) for f in frames]
        assert _delivered(callers[-3].value) == _expected(
            5, 0, 1, msgpack.packb({IPROTO_DATA: ["other"]}))
        assert _delivered(callers[-2].value) == _expected(6, 0, 1, odd_body)   # the general way
        assert _delivered(callers[-1].value) == _expected(4, 0x8003, 1, odd_error_body)
        assert transport.alive and transport.in_flight == 0 and not transport._ready
        assert transport.stats.responses == len(callers)
    finally:
        transport.close()
        a.close()
        b.close()


def _fields(value):
    """(sync, code, schema version, body) of a reply as ``request`` returns it: a
    Response from a fast path, a tuple from ``_frame``."""
    if type(value) is Response:
        return (value._sync, value._code, value._schema_version, value._body)
    return tuple(value[:4])


def _frames(data):
    """The (header, body) maps of every whole request frame in ``data``."""
    unpacker = msgpack.Unpacker(strict_map_key=False, max_buffer_size=1 << 30)
    unpacker.feed(data)
    frames = []
    try:
        for length in unpacker:
            start = unpacker.tell()
            if len(data) - start < length:
                break
            frames.append((unpacker.unpack(), unpacker.unpack()))
            assert unpacker.tell() == start + length
    except msgpack.OutOfData:
        pass
    return frames


def _receive_bytes(b, count):
    """What the peer's end ``b`` (a plain socket) receives until ``count`` whole
    request frames are in: read without blocking, so that the transport's
    greenlets run."""
    b.setblocking(False)
    data = b""
    with gevent.Timeout(slack(5)):
        while len(_frames(data)) < count:
            try:
                data += b.recv(1 << 20)
            except BlockingIOError:
                gevent.sleep(0.001)
    b.setblocking(True)
    return data


def _receive(b, count):
    """The first ``count`` request frames from the peer's end ``b``, as _frames."""
    return _frames(_receive_bytes(b, count))


def _answer(b, frames):
    b.sendall(b"".join(reply(header[IPROTO_SYNC], header[IPROTO_SYNC]) for header, _ in frames))


@REQUEST_FORMS
def test_a_lone_request_is_sent_by_its_caller(code, schema):
    """With nothing else in flight the caller sends its frame itself, in one call,
    before it waits; the reply wakes it; the writer is left alone."""
    transport, a, b = _socketpair_transport()
    writer_ran = []
    transport._wakeup.rawlink(lambda event: writer_ran.append(True))
    body = msgpack.packb({0x20: [1]})
    frame = tarantool_frame(9, body, 64, 0) if code is None else body
    try:
        caller = gevent.spawn(transport.request, 9, code, schema, frame)
        gevent.sleep(0)
        b.settimeout(1)
        assert [h[IPROTO_SYNC] for h, _ in _frames(b.recv(65536))] == [9]
        assert transport.stats.send_calls == 1 and transport.stats.requests == 1
        b.sendall(reply(9, "nine"))
        assert _fields(caller.get(timeout=2)) == (9, 0, 1, {IPROTO_DATA: ["nine"]})
        assert not writer_ran and transport.in_flight == 0 and not transport._ready
    finally:
        transport.close()
        a.close()
        b.close()


def test_a_lone_reply_goes_from_the_hub_to_its_caller_and_more_wake_the_reader():
    """One reply for one waiting caller: the read watcher's callback switches
    from the hub straight to the caller, and the reader greenlet never runs.
    Two replies in one receive with nothing else in flight are handed on from
    the hub too, with no second receive; with a third request still due they
    resume the reader, which reads on."""
    import greenlet
    transport, a, b = _socketpair_transport()
    reader_ran = []

    def trace(event, args):
        if event in ("switch", "throw") and args[1] is transport._reader:
            reader_ran.append(event)
    gevent.sleep(0)   # the reader starts and parks
    old = greenlet.settrace(trace)
    try:
        for sync in (1, 2, 3):
            caller = gevent.spawn(transport.request, sync, 64, 0, b"\x80")
            gevent.sleep(0)
            b.recv(65536)
            b.sendall(reply(sync, sync))
            assert _fields(caller.get(timeout=2))[3] == {IPROTO_DATA: [sync]}
        assert reader_ran == []
        callers = [gevent.spawn(transport.request, sync, 64, 0, b"\x80") for sync in (4, 5)]
        _receive(b, 2)
        b.sendall(reply(4, 4) + reply(5, 5))
        gevent.joinall(callers, timeout=2)
        assert [_fields(c.value)[3] for c in callers] == [{IPROTO_DATA: [4]}, {IPROTO_DATA: [5]}]
        assert reader_ran == []
        assert transport.stats.recv_calls == 4
        callers = [gevent.spawn(transport.request, sync, 64, 0, b"\x80") for sync in (6, 7, 8)]
        _receive(b, 3)
        b.sendall(reply(6, 6) + reply(7, 7))
        gevent.joinall(callers[:2], timeout=2)
        assert [_fields(c.value)[3] for c in callers[:2]] == [{IPROTO_DATA: [6]},
                                                               {IPROTO_DATA: [7]}]
        assert reader_ran
        b.sendall(reply(8, 8))
        assert _fields(callers[2].get(timeout=2))[3] == {IPROTO_DATA: [8]}
    finally:
        greenlet.settrace(old)
        transport.close()
        a.close()
        b.close()


def test_requests_of_callers_woken_together_go_out_in_one_write_without_the_writer():
    """Replies that wake several callers at once while another request is still
    at the server: what they send next goes out in one write when they all wait
    again, and the writer greenlet stays asleep."""
    import greenlet
    transport, a, b = _socketpair_transport()
    writer_ran = []

    def trace(event, args):
        if event in ("switch", "throw") and args[1] is transport._writer:
            writer_ran.append(event)

    def caller(first):
        transport.request(first, 64, 0, b"\x80")
        return transport.request(first + 10, 64, 0, b"\x80")
    try:
        callers = [gevent.spawn(caller, sync) for sync in (1, 2, 3, 4)]
        assert sorted(h[IPROTO_SYNC] for h, _ in _receive(b, 4)) == [1, 2, 3, 4]
        sends = transport.stats.send_calls
        old = greenlet.settrace(trace)
        try:
            b.sendall(reply(1, 1) + reply(2, 2) + reply(3, 3))   # 4 still at the server
            assert sorted(h[IPROTO_SYNC] for h, _ in _receive(b, 3)) == [11, 12, 13]
        finally:
            greenlet.settrace(old)
        assert writer_ran == [] and transport.stats.send_calls == sends + 1
        b.sendall(reply(4, 4))
        _receive(b, 1)
        b.sendall(b"".join(reply(sync, sync) for sync in (11, 12, 13, 14)))
        gevent.joinall(callers, timeout=2)
        assert [_fields(c.value)[3] for c in callers] == [{IPROTO_DATA: [s]}
                                                           for s in (11, 12, 13, 14)]
    finally:
        transport.close()
        a.close()
        b.close()


def _batch_sends(transport, b, count, monkeypatch):
    """``count`` callers on ``transport`` send a request each, get their replies
    in one piece from the peer's end ``b`` and send another: what the peer
    has received each time the transport flushed early (the syncs of its
    frames), and ``send_calls`` for the second requests."""
    from gtarantool.transport import Transport
    seen = []
    flush_early = Transport.flush_early

    def watched(self):
        flush_early(self)
        seen.append(([h[IPROTO_SYNC] for h, _ in _frames(_peek(b))], len(self._ready)))
    monkeypatch.setattr(Transport, "flush_early", watched)

    def caller(first):
        transport.request(first, 64, 0, b"\x80")
        return transport.request(first + count, 64, 0, b"\x80")
    callers = [gevent.spawn(caller, sync) for sync in range(1, count + 1)]
    assert sorted(h[IPROTO_SYNC] for h, _ in _receive(b, count)) == list(range(1, count + 1))
    sends = transport.stats.send_calls
    b.sendall(b"".join(reply(sync, sync) for sync in range(1, count + 1)))
    second = list(range(count + 1, 2 * count + 1))
    assert sorted(h[IPROTO_SYNC] for h, _ in _receive(b, count)) == second
    sends = transport.stats.send_calls - sends
    b.sendall(b"".join(reply(sync, sync) for sync in second))
    gevent.joinall(callers, timeout=slack(5))
    assert [_fields(c.value)[3] for c in callers] == [{IPROTO_DATA: [s]} for s in second]
    return seen, sends


def _peek(b):
    """What the peer's end ``b`` has received so far, left there."""
    import socket
    try:
        return b.recv(1 << 20, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return b""


@pytest.mark.parametrize("count", [LEAD_UP_TO + 1, FLUSH_EVERY - 1])
def test_a_batch_with_nothing_at_the_server_goes_out_in_one_write(monkeypatch, count):
    """Woken callers (more than LEAD_UP_TO, at most FLUSH_EVERY) with none of
    their requests at the server: it gets their requests in one write, with
    no early flush."""
    transport, a, b = _socketpair_transport(max_in_flight=2 * count)
    try:
        seen, sends = _batch_sends(transport, b, count, monkeypatch)
        assert seen == [] and sends == 1
    finally:
        transport.close()
        a.close()
        b.close()


@pytest.mark.parametrize("count", [2, 10, LEAD_UP_TO])
def test_the_first_of_a_small_batch_with_nothing_at_the_server_goes_out_at_once(
        monkeypatch, count):
    """At most LEAD_UP_TO woken callers with none of their requests at the
    server: the first one's request is written before the second caller runs
    (the server starts on it), the rest in one write when they all wait."""
    from gtarantool.transport import Transport
    transport, a, b = _socketpair_transport(max_in_flight=2 * count)
    request = Transport.request
    at_server = []

    def watched(self, sync, *args):
        if sync == count + 2:   # the second woken caller's second request
            at_server.append([h[IPROTO_SYNC] for h, _ in _frames(_peek(b))])
        return request(self, sync, *args)
    monkeypatch.setattr(Transport, "request", watched)
    try:
        seen, sends = _batch_sends(transport, b, count, monkeypatch)
        assert seen == [] and sends == 2
        assert at_server == [[count + 1]]
    finally:
        transport.close()
        a.close()
        b.close()


def test_a_large_batch_of_woken_callers_sends_flush_every_requests_at_a_time():
    """More woken callers than FLUSH_EVERY: their requests go out that many at a
    time as they queue (the server need not wait for the whole batch), the rest
    when they all wait; in order, each reply to its caller."""
    count = 2 * FLUSH_EVERY + 10
    transport, a, b = _socketpair_transport(max_in_flight=2 * count)

    def caller(first):
        transport.request(first, 64, 0, b"\x80")
        return transport.request(first + count, 64, 0, b"\x80")
    try:
        callers = [gevent.spawn(caller, sync) for sync in range(1, count + 1)]
        assert [h[IPROTO_SYNC] for h, _ in _receive(b, count)] == list(range(1, count + 1))
        sends = transport.stats.send_calls
        b.sendall(b"".join(reply(sync, sync) for sync in range(1, count + 1)))
        second = list(range(count + 1, 2 * count + 1))
        assert [h[IPROTO_SYNC] for h, _ in _receive(b, count)] == second
        assert transport.stats.send_calls == sends + 3
        b.sendall(b"".join(reply(sync, sync) for sync in second))
        gevent.joinall(callers, timeout=5)
        assert [_fields(c.value)[3] for c in callers] == [{IPROTO_DATA: [s]} for s in second]
    finally:
        transport.close()
        a.close()
        b.close()


@REQUEST_FORMS
def test_callers_that_start_together_share_the_writers_sends(code, schema):
    """Only the first of many callers that start at once sends itself; the rest
    go out in the writer's batches, and every reply reaches its caller."""
    transport, a, b = _socketpair_transport(max_in_flight=1000)

    def frame(sync):
        return tarantool_frame(sync, b"\x80", 64, 0) if code is None else b"\x80"
    try:
        callers = [gevent.spawn(transport.request, sync, code, schema, frame(sync))
                   for sync in range(1, 301)]
        assert [h[IPROTO_SYNC] for h, _ in _receive(b, 300)] == list(range(1, 301))
        assert transport.stats.send_calls <= 5
        b.sendall(b"".join(reply(sync, sync) for sync in range(1, 301)))
        gevent.joinall(callers, timeout=5)
        assert [_fields(c.value)[3] for c in callers] == [{IPROTO_DATA: [s]}
                                                           for s in range(1, 301)]
    finally:
        transport.close()
        a.close()
        b.close()


def _small_send_buffer(a):
    import socket
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)


@REQUEST_FORMS
def test_a_lone_send_the_socket_cannot_take_is_finished_by_the_writer_in_order(code, schema):
    """A caller's own send that the socket takes only part of: the writer sends
    the rest before anything queued later, so frames never interleave, even
    when the caller gives up meanwhile (its late reply is discarded)."""
    transport, a, b = _socketpair_transport()
    _small_send_buffer(a)
    big = msgpack.packb({0x21: b"x" * (2 << 20)})

    def frame(sync, body):
        return tarantool_frame(sync, body, 64, 0) if code is None else body
    try:
        def give_up_mid_send():
            with pytest.raises(Interrupted):
                transport.request(1, code, schema, frame(1, big))

        first = gevent.spawn(give_up_mid_send)
        gevent.sleep(0)
        assert transport._wbuf   # the rest waits for the writer
        first.kill(Interrupted, block=True, timeout=2)   # gives up mid-send
        assert first.successful()
        later = [gevent.spawn(transport.request, sync, code, schema,
                              frame(sync, msgpack.packb({0x20: [sync]})))
                 for sync in (2, 3)]
        frames = _receive(b, 3)
        assert [h[IPROTO_SYNC] for h, _ in frames] == [1, 2, 3]
        assert frames[0][1] == {0x21: b"x" * (2 << 20)}
        _answer(b, frames)
        assert [_fields(g.get(timeout=2))[3] for g in later] == [{IPROTO_DATA: [2]},
                                                                  {IPROTO_DATA: [3]}]
        assert transport.alive and transport.in_flight == 0
        assert transport.stats.discarded == 1
    finally:
        transport.close()
        a.close()
        b.close()


@REQUEST_FORMS
def test_a_failing_lone_send_fails_the_transport_and_its_caller(code, schema):
    """The socket refuses writes while the reader sees nothing (no EOF, no
    error: only the send path can notice): the caller's own send fails, the
    caller gets the network error, the transport is dead and holds nothing."""
    import socket

    from tarantool.error import NetworkError
    transport, a, b = _socketpair_transport()
    try:
        a.shutdown(socket.SHUT_WR)   # writes fail with EPIPE; b stays open and silent
        with gevent.Timeout(2):
            value = transport.request(7, code, schema,
                                      tarantool_frame(7, b"\x80", 64, 0) if code is None
                                      else b"\x80")
        assert isinstance(value, NetworkError)
        assert not transport.alive and transport.in_flight == 0 and not transport._ready
        assert not transport._wbuf
    finally:
        transport.close()
        a.close()
        b.close()


def test_a_lone_caller_that_ends_raising_goes_to_the_hubs_error_handler(monkeypatch):
    """A caller whose greenlet ends by raising once its lone reply reached it (a
    bare greenlet whose parent is the hub): the read watcher's callback hands
    that to the hub's handle_error, as gevent's Waiter does, and serves on."""
    import greenlet
    from gevent.event import AsyncResult
    transport, a, b = _socketpair_transport()
    hub = gevent.get_hub()
    handled = AsyncResult()
    monkeypatch.setattr(hub, "handle_error",
                        lambda context, kind, value, tb: handled.set((context, kind)))

    def run():
        assert _fields(transport.request(1, 64, 0, b"\x80"))[3] == {IPROTO_DATA: [1]}
        raise Interrupted("after its reply")
    try:
        gevent.sleep(0)   # the reader starts and parks
        caller = greenlet.greenlet(run, parent=hub)
        hub.loop.run_callback(caller.switch)
        gevent.sleep(0)   # the hub starts it: it sends its request and waits
        b.settimeout(2)
        assert [h[IPROTO_SYNC] for h, _ in _frames(b.recv(65536))] == [1]
        b.sendall(reply(1, 1))
        assert handled.get(timeout=2) == (caller, Interrupted)
        assert caller.dead and not transport._flush_due and not transport._ready
        assert transport.alive and transport.in_flight == 0
        again = gevent.spawn(transport.request, 2, 64, 0, b"\x80")
        gevent.sleep(0)
        assert [h[IPROTO_SYNC] for h, _ in _frames(b.recv(65536))] == [2]
        b.sendall(reply(2, 2))
        assert _fields(again.get(timeout=2))[3] == {IPROTO_DATA: [2]}
    finally:
        transport.close()
        a.close()
        b.close()


def test_a_closed_transport_can_be_collected():
    """Nothing the transport made (its greenlets, its read watcher's callback,
    C or Python) keeps it alive once closed."""
    import gc
    import weakref
    transport, a, b = _socketpair_transport()
    try:
        caller = gevent.spawn(transport.request, 1, 64, 0, b"\x80")
        gevent.sleep(0)
        b.recv(65536)
        b.sendall(reply(1, 1))
        assert _fields(caller.get(timeout=2))[3] == {IPROTO_DATA: [1]}
        transport.close()
        ref = weakref.ref(transport)
        del transport, caller
        gevent.sleep(0.01)
        gc.collect()
        assert ref() is None
    finally:
        a.close()
        b.close()


def test_lone_requests_count_alike_in_any_stats_object():
    """The C paths add to a Stats object's slots in place; a stats object of
    another kind (no slots) gets the same counts through its attributes."""
    import socket

    import gevent.socket as gsocket

    from gtarantool.transport import Stats, Transport
    counts = []
    for stats in (Stats(), types.SimpleNamespace(**Stats().as_dict())):
        a, b = socket.socketpair()
        transport = Transport(gsocket.socket(fileno=os.dup(a.fileno())), stats, 10, 1 << 20)
        try:
            for sync in (1, 2, 3):
                caller = gevent.spawn(transport.request, sync, 64, 0, b"\x80")
                gevent.sleep(0)
                b.recv(65536)
                b.sendall(reply(sync, "x" * sync))
                assert _fields(caller.get(timeout=2))[3] == {IPROTO_DATA: ["x" * sync]}
        finally:
            transport.close()
            a.close()
            b.close()
        counts.append({name: getattr(stats, name) for name in Stats.__slots__})
    assert counts[0] == counts[1]
    assert counts[0]["requests"] == counts[0]["responses"] == 3
    assert counts[0]["send_calls"] == counts[0]["recv_calls"] == 3
    assert counts[0]["bytes_in"] == sum(len(reply(sync, "x" * sync)) for sync in (1, 2, 3))
    assert counts[0]["max_in_flight"] == 1


def test_a_lone_caller_is_switched_to_by_the_reader(conn, monkeypatch):
    """One greenlet's requests in sequence: each reply reaches it straight from
    the reader (no hub callback), and replies keep coming after it waits for
    other things in between."""
    transport = conn._transport
    scheduled = []
    run_ready = type(transport)._run_ready

    def counting(self):
        if self is transport:
            scheduled.append(True)
        run_ready(self)

    monkeypatch.setattr(type(transport), "_run_ready", counting)
    for i in range(50):
        assert conn.call("echo", i).data == [i]
        if i % 10 == 0:
            gevent.sleep(0.001)
    assert not scheduled
    assert conn.stats.send_calls >= 50


def test_callers_in_line_for_max_in_flight_are_served_in_order(server):
    """With max_in_flight=1, callers that queue for a slot get it first come,
    first served, though a woken caller asks again at once each time."""
    from tests.conftest import PASSWORD, USER
    c = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD,
                           max_in_flight=1)
    order = []

    def caller(i):
        for n in range(3):
            c.call("echo", i)
            order.append(i)

    try:
        callers = [gevent.spawn(caller, i) for i in range(20)]
        gevent.joinall(callers, timeout=30, raise_error=True)
        # Round robin: each caller's n-th request is answered before anyone's (n+1)-th
        # but its own next one.
        firsts = {}
        for position, i in enumerate(order):
            firsts.setdefault(i, []).append(position)
        assert all(len(p) == 3 for p in firsts.values())
        assert max(p[0] for p in firsts.values()) < min(p[2] for p in firsts.values())
    finally:
        c.close()


@REQUEST_FORMS
def test_a_caller_let_in_whose_slot_is_taken_first_waits_at_the_front(code, schema):
    """max_in_flight=1: a caller let in from the line, whose slot a newcomer took
    before it ran, waits again ahead of those behind it."""
    transport, a, b = _socketpair_transport(max_in_flight=1)
    order = []

    def caller(sync):
        transport.request(sync, code, schema, tarantool_frame(sync, b"\x80", 64, 0)
                          if code is None else b"\x80")
        order.append(sync)

    try:
        callers = [gevent.spawn(caller, 1)]
        gevent.sleep(0)                                  # 1 in flight
        callers += [gevent.spawn(caller, 2), gevent.spawn(caller, 3)]
        gevent.sleep(0)                                  # 2, then 3 in line
        callers.append(gevent.spawn(caller, 4))          # starts before 2 is let in
        with gevent.Timeout(5):
            while len(order) < 4:
                (sync,) = transport._pending
                transport.feed(reply(sync, sync))
                while sync not in order:
                    gevent.sleep(0)
        assert order == [1, 4, 2, 3]
    finally:
        transport.close()
        a.close()
        b.close()


def _event_frame(sync, key, value):
    header = msgpack.packb({IPROTO_REQUEST_TYPE: 76, IPROTO_SYNC: sync})   # as Tarantool: no schema
    body = msgpack.packb({0x57: key, 0x58: value})
    return b"\xce" + len(header + body).to_bytes(4, "big") + header + body


def test_watcher_events_go_to_on_event_split_anywhere():
    transport, a, b = _socketpair_transport()
    try:
        events = []
        transport.on_event = lambda sync, body: events.append(
            (sync, msgpack.unpackb(body, strict_map_key=False)))
        data = _event_frame(7, "k", 1) + _event_frame(1 << 40, "k", [2, "x"])
        for cut in range(1, len(data)):
            transport.feed(data[:cut])
            transport.feed(data[cut:])
        assert events == [(7, {0x57: "k", 0x58: 1}), (1 << 40, {0x57: "k", 0x58: [2, "x"]})] \
            * (len(data) - 1)
        assert transport.alive
    finally:
        transport.close()
        a.close()
        b.close()


def test_an_event_nobody_watches_for_is_dropped():
    # (A socket being drained after an announced shutdown: its watchers moved
    # to the next socket, and the requests still on it must get their replies.)
    transport, a, b = _socketpair_transport()
    try:
        transport.feed(_event_frame(7, "k", 1))
        assert transport.alive
        assert transport.stats.responses == 1
    finally:
        transport.close()
        a.close()
        b.close()


def test_post_sends_a_frame_and_on_fail_hears_of_the_death():
    transport, a, b = _socketpair_transport()
    try:
        failures = []
        transport.on_fail = failures.append
        transport.post(b"frame-1")
        transport.post(b"frame-2")
        gevent.sleep(0.01)
        assert b.recv(100) == b"frame-1frame-2"
        b.close()   # the peer goes away
        gevent.sleep(0.05)
        assert len(failures) == 1 and isinstance(failures[0], gtarantool.NetworkError)
        with pytest.raises(gtarantool.NetworkError):
            transport.post(b"frame-3")
    finally:
        transport.close()
        a.close()
        b.close()


def test_a_reply_knows_its_size_on_the_wire(conn):
    """A response the reader builds carries its frame's bytes in ``_size`` (what
    gtarantool.locust reports as Locust's response length): alone, and in a
    batch of replies read together."""
    for value in (1, "x" * 3000, {"a": [1.5, None, True]}):
        before = conn.stats.bytes_in
        resp = conn.call("echo", value)
        assert resp.data == [value]
        assert resp._size == conn.stats.bytes_in - before
    before = conn.stats.bytes_in
    calls = [gevent.spawn(conn.call, "echo", "y" * i) for i in range(0, 2000, 100)]
    gevent.joinall(calls, raise_error=True)
    assert sum(c.value._size for c in calls) == conn.stats.bytes_in - before
