"""Reliability: faults, bad input and overload.

Each test injects one kind of trouble and checks the guarantees: no greenlet
waits longer than its timeout (or at all, once the connection is known dead),
no acknowledged write is lost, no reply reaches the wrong caller, memory stays
bounded, and the same Connection object serves requests again afterwards.

A real Tarantool is used everywhere except for replies no real server sends
(``fakepeer.FakePeer``); network faults go through ``gtarantool.testing.faults.FaultProxy``.
"""
import itertools
import os
import signal
import socket
import threading
import time

import gevent
import msgpack
import psutil
import pytest
from gevent.event import Event
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tarantool.error import DatabaseError, NetworkError, SchemaError
from tarantool.msgpack_ext.unpacker import ext_hook as unpacker_ext_hook

import gtarantool
from gtarantool import ConnectionClosed, ProtocolError, RequestTimeout, WrongOwner
from gtarantool.protocol import Response
from gtarantool.testing.faults import FaultProxy
from gtarantool.transport import Stats, Transport

from . import fakepeer
from .conftest import PASSWORD, USER
from .timing import slack

ER_READONLY = 7

MB = 1 << 20
_ids = itertools.count(1_000_000)


def rss():
    return psutil.Process().memory_info().rss


def connect(host, port, **kw):
    kw.setdefault("user", USER)
    kw.setdefault("password", PASSWORD)
    # A just-started server greets before box.cfg has finished (ER_LOADING).
    deadline = time.monotonic() + 10
    while True:
        try:
            return gtarantool.connect(host, port, **kw)
        except NetworkError:
            if time.monotonic() > deadline:
                raise
            gevent.sleep(0.05)


def timed(fn, *args, **kw):
    """(seconds, result or exception) of one call."""
    t0 = time.monotonic()
    try:
        value = fn(*args, **kw)
    except Exception as exc:  # noqa: BLE001 - the outcome is what we test
        value = exc
    return time.monotonic() - t0, value


def in_thread(fn, *args):
    """Run a blocking function in a real OS thread without blocking the hub."""
    return gevent.get_hub().threadpool.apply(fn, args)


def wait_until(pred, timeout, step=0.02):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        gevent.sleep(step)
    return True


@pytest.fixture
def proxy(server):
    p = FaultProxy(server.host, server.port)
    yield p
    p.close()


# -- the server dies under load -------------------------------------------------

@pytest.mark.timing
def test_server_killed_under_load_loses_no_acknowledged_write(fresh_server):
    """1,000 greenlets write while the server is SIGKILLed and restarted from its
    WAL: every call ends within request_timeout + 1 s, every insert and every
    replace that returned success is in the restarted server (a key's value no
    older than its last acknowledged replace), and the same connection object
    serves requests again on its own.  (3.x accepts connections while it
    recovers and answers writes "read-only", error 7, until it is done: an
    answer, not a lost write, and only ever after the kill.)"""
    timeout = 2.0
    conn = connect(fresh_server.host, fresh_server.port, request_timeout=timeout,
                   reconnect_max_attempts=3, reconnect_delay=0.1, connection_timeout=2.0)
    acked = []
    replaced = {}    # worker: (its last acknowledged replace, every replace it sent)
    durations = []
    errors = {}
    ok_after_restart = [0]
    restarted = Event()
    killed = Event()
    stop = Event()
    ids = itertools.count(1)

    def worker(n):
        while not stop.is_set():
            op = next(ids)
            t0 = time.monotonic()
            try:
                if op % 4:
                    conn.insert("tester", (op, "w%d" % n, "x" * 100))
                    acked.append(op)
                elif op % 8:
                    last, sent = replaced.setdefault(n, (None, set()))
                    sent.add(op)
                    conn.replace("kv", ("k%d" % n, op))
                    replaced[n] = (op, sent)
                else:
                    conn.select("tester", op - 1)
                if restarted.is_set():
                    ok_after_restart[0] += 1
            except NetworkError as exc:
                kind = type(exc).__name__
                errors[kind] = errors.get(kind, 0) + 1
                gevent.sleep(0.05)
            except DatabaseError as exc:
                if exc.code != ER_READONLY or not killed.is_set():
                    raise
                errors["read-only"] = errors.get("read-only", 0) + 1
                gevent.sleep(0.05)
            finally:
                durations.append(time.monotonic() - t0)

    workers = [gevent.spawn(worker, n) for n in range(1000)]
    # Kill it under load: once writes are being acknowledged (how soon depends on the host).
    assert wait_until(lambda: len(acked) > 1000, 15)
    acked_before_kill = len(acked)
    killed.set()
    fresh_server.kill()
    # An outage longer than request_timeout + 1 s: nobody may wait it out.
    gevent.sleep(timeout + 1.5)
    in_thread(fresh_server.start)
    restarted.set()
    assert wait_until(lambda: ok_after_restart[0] > 1000, 15), errors
    gevent.sleep(0.5)
    stop.set()
    gevent.joinall(workers, timeout=timeout + slack(2), raise_error=True)
    assert all(w.dead for w in workers)

    assert acked_before_kill > 1000
    assert errors, "the kill was not noticed"
    assert max(durations) < timeout + slack(1.0), (max(durations), errors)
    assert set(errors) <= {"NetworkError", "ConnectionClosed", "RequestTimeout",
                           "read-only"}, errors
    conn.ping()
    assert conn.stats.reconnects >= 1
    assert conn._transport.in_flight == 0
    stored = {t[0] for t in conn.select("tester", None, iterator="ALL")}
    lost = sorted(set(acked) - stored)
    # A key holds a replace of its worker's no older than the last acknowledged
    # one (one sent later but not acknowledged may have landed too).
    values = {t[0]: t[1] for t in conn.select("kv", None, iterator="ALL")}
    stale = {n: (values.get("k%d" % n), last) for n, (last, sent) in replaced.items()
             if last is not None and not (values.get("k%d" % n) in sent
                                          and values["k%d" % n] >= last)}
    acked_replaces = sum(last is not None for last, _ in replaced.values())
    print("\nkill -9 under load: %d acknowledged inserts, %d lost; %d keys replaced, %d stale;"
          " errors %s, max call %.2fs" % (len(acked), len(lost), acked_replaces, len(stale),
                                         errors, max(durations)))
    assert lost == []
    assert acked_replaces > 100 and stale == {}
    conn.close()


# -- the server freezes ----------------------------------------------------------

@pytest.mark.timing
def test_server_frozen_requests_time_out_on_time_and_late_replies_are_discarded(
        fresh_server):
    timeout = 0.5
    conn = connect(fresh_server.host, fresh_server.port, request_timeout=timeout)
    conn.ping()
    transport = conn._transport
    fresh_server.signal(signal.SIGSTOP)
    try:
        calls = [gevent.spawn(timed, conn.insert, "tester", (next(_ids), "frozen"))
                 for _ in range(50)]
        calls.append(gevent.spawn(timed, conn.call, "sleep_and_return", 0, 1))
        gevent.joinall(calls, timeout=timeout + slack(2))
        outcomes = [c.value for c in calls]
    finally:
        fresh_server.signal(signal.SIGCONT)
    for elapsed, value in outcomes:
        assert isinstance(value, RequestTimeout), value
        assert timeout - 0.05 <= elapsed < timeout + slack(0.3), elapsed
    assert transport.in_flight == 0
    # The frozen server replies late: every reply is discarded, none leaks.
    assert wait_until(lambda: conn.stats.discarded >= 51, 5), conn.stats
    assert not transport._abandoned
    assert transport.in_flight == 0
    assert conn._transport is transport and transport.alive
    assert conn.call("echo", "after").data == ["after"]
    assert conn.stats.reconnects == 0
    conn.close()


# -- network faults through a proxy ----------------------------------------------

@pytest.mark.timing
def test_proxy_delayed_replies(proxy):
    conn = connect(proxy.host, proxy.port, request_timeout=1.0)
    proxy.delay = 0.3
    elapsed, value = timed(conn.call, "echo", 1)
    assert value.data == [1] and 0.3 <= elapsed < 0.3 + slack(0.7)
    proxy.delay = 1.5
    calls = [gevent.spawn(timed, conn.call, "echo", i) for i in range(20)]
    gevent.joinall(calls)
    for c in calls:
        elapsed, value = c.value
        assert isinstance(value, RequestTimeout) and elapsed < 1.0 + slack(0.3), c.value
    assert conn._transport.in_flight == 0
    proxy.delay = 0
    assert wait_until(lambda: conn.stats.discarded >= 20, 5)
    assert [conn.call("echo", i).data for i in range(3)] == [[0], [1], [2]]
    conn.close()


@pytest.mark.timing
def test_proxy_reset_in_the_middle_of_a_frame(proxy):
    conn = connect(proxy.host, proxy.port, request_timeout=10.0)
    big = "y" * 300_000
    conn.call("echo", "warm")
    proxy.reset_mid_frame()
    calls = [gevent.spawn(timed, conn.call, "echo", big) for _ in range(10)]
    gevent.joinall(calls, timeout=slack(5))
    for c in calls:
        elapsed, value = c.value
        # Failed at once with a network error, not by waiting for the timeout.
        assert isinstance(value, NetworkError) and not isinstance(value, RequestTimeout), value
        assert elapsed < slack(2.0)
    assert proxy.resets == 1
    # The same object reconnects and the stream is in sync again.
    assert conn.call("echo", big).data == [big]
    assert conn.stats.reconnects == 1
    conn.close()


@pytest.mark.timing
def test_proxy_stops_reading_writer_does_not_block_callers(proxy):
    conn = connect(proxy.host, proxy.port, request_timeout=1.0)
    conn.ping()
    proxy.stop_reading()
    ticks = []

    def tick():
        for _ in range(40):
            ticks.append(time.monotonic())
            gevent.sleep(0.05)
    ticker = gevent.spawn(tick)
    payload = "z" * (1 * MB)
    calls = [gevent.spawn(timed, conn.eval, "return 1", payload) for _ in range(20)]
    gevent.joinall(calls, timeout=slack(5))
    for c in calls:
        elapsed, value = c.value
        assert isinstance(value, RequestTimeout) and elapsed < 1.0 + slack(0.4), c.value
    ticker.join(timeout=slack(5))
    assert ticker.dead
    # The hub never stalled behind the blocked writer: every 50 ms tick came on time.
    gaps = [b - a for a, b in zip(ticks, ticks[1:])]
    assert len(ticks) == 40 and max(gaps) < 0.05 + slack(0.15), max(gaps)
    elapsed, value = timed(conn.close)
    assert elapsed < slack(1.0) and value is None
    proxy.resume_reading()
    assert conn.call("echo", 7).data == [7]
    conn.close()


@pytest.mark.timing
def test_proxy_half_closed_connection_fails_waiters_at_once(proxy):
    conn = connect(proxy.host, proxy.port, request_timeout=10.0)
    conn.ping()
    calls = [gevent.spawn(timed, conn.call, "sleep_and_return", 1, i) for i in range(10)]
    gevent.sleep(0.1)
    proxy.half_close()           # the client reads EOF; the proxy still reads
    gevent.joinall(calls, timeout=slack(5))
    for c in calls:
        elapsed, value = c.value
        assert isinstance(value, NetworkError) and not isinstance(value, RequestTimeout)
        assert elapsed < slack(1.0)
    assert conn.call("echo", 1).data == [1]      # reconnected
    conn.close()


@pytest.mark.timing
def test_proxy_silent_partition_times_out_and_recovers(proxy):
    conn = connect(proxy.host, proxy.port, request_timeout=0.5)
    conn.ping()
    proxy.blackhole()
    calls = [gevent.spawn(timed, conn.call, "echo", i) for i in range(10)]
    gevent.joinall(calls, timeout=slack(3))
    for c in calls:
        elapsed, value = c.value
        assert isinstance(value, RequestTimeout) and elapsed < 0.5 + slack(0.3), c.value
    assert conn._transport.in_flight == 0
    elapsed, value = timed(conn.close)
    assert elapsed < slack(1.0) and value is None
    proxy.resume()
    # (The call reconnects, authenticates and loads the schema within its
    # request_timeout: room for that on a loaded host.)
    conn.request_timeout = 0.5 + slack(2)
    assert conn.call("echo", 2).data == [2]
    conn.close()


@pytest.mark.timing
def test_callers_queued_behind_a_slow_reconnect_time_out_on_time(proxy):
    """One caller reconnects into a partition (no greeting for connection_timeout);
    the others queued behind it get RequestTimeout at request_timeout, not later."""
    conn = connect(proxy.host, proxy.port, request_timeout=0.5, connection_timeout=2.0,
                   reconnect_max_attempts=0)
    conn.ping()
    proxy.blackhole()
    proxy.reset_all()
    assert wait_until(conn.is_closed, 2)
    calls = [gevent.spawn(timed, conn.call, "echo", i) for i in range(20)]
    gevent.joinall(calls, timeout=slack(5))
    outcomes = [c.value for c in calls]
    reconnector = [o for o in outcomes if not isinstance(o[1], RequestTimeout)]
    queued = [o for o in outcomes if isinstance(o[1], RequestTimeout)]
    # (On 2.10+ the connection's own box.shutdown watcher reconnects it at
    # once, and every caller may be queued behind that instead.)
    assert len(reconnector) <= 1, outcomes
    assert all(isinstance(e, NetworkError) and took < 2.0 + slack(0.5)
               for took, e in reconnector)
    assert len(queued) == 20 - len(reconnector), outcomes
    assert max(e for e, _ in queued) < 0.5 + slack(0.3), queued
    proxy.resume()
    assert conn.call("echo", 3).data == [3]
    conn.close()


# -- a hostile or broken server (fake peer) ------------------------------------

def _valid(syncs):
    return fakepeer.reply(syncs[0], [1])


HOSTILE = {
    "garbage": (lambda s: b"\xc1" * 64, False, ProtocolError),
    "string_as_length": (lambda s: msgpack.packb("hello") * 4, False, ProtocolError),
    "negative_length": (lambda s: msgpack.packb(-5) + b"\x00" * 8, False, ProtocolError),
    "zero_length": (lambda s: msgpack.packb(0), False, ProtocolError),
    "header_not_a_map": (lambda s: fakepeer.frame([1, 2, 3]), False, ProtocolError),
    "header_without_sync": (lambda s: fakepeer.frame({0: 0}), False, ProtocolError),
    "length_4_gib": (lambda s: b"\xce\xff\xff\xff\xff" + b"\x00" * 1000, False, ProtocolError),
    "length_2_pow_40": (lambda s: b"\xcf" + (1 << 40).to_bytes(8, "big") + b"\x00" * 10,
                        False, ProtocolError),
    "unknown_sync": (lambda s: fakepeer.reply(max(s) + 1000, [1]), False, ProtocolError),
    "push_for_unknown_sync": (lambda s: fakepeer.reply(max(s) + 1000, [1], code=0x80),
                              False, ProtocolError),
    "header_claims_huge_array": (
        lambda s: msgpack.packb(12) + b"\x82\x00\x00\x01\xdd\x7f\xff\xff\xff" + b"\x00" * 3,
        False, ProtocolError),
    # 2.10+'s header layout, its length prefix shorter than the header
    "header_beyond_its_frame": (lambda s: b"\xce\x00\x00\x00\x10\x83\x00\xce" + bytes(4)
                                + b"\x01\xcf" + s[0].to_bytes(8, "big") + b"\x05\xcf" + bytes(8)
                                + b"\x80", False, ProtocolError),
    "sync_not_an_int": (lambda s: fakepeer.frame({0: 0, 1: "x", 5: 1}, {}), False, ProtocolError),
    "truncated_frame_then_close": (lambda s: fakepeer.reply(s[0], ["x" * 100])[:40], True,
                                   NetworkError),
    "valid_reply_then_close": (_valid, True, NetworkError),
}


@pytest.mark.timing
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_peer_fails_waiters_at_once(case):
    payload, then_close, expected = HOSTILE[case]
    n = 5
    with fakepeer.FakePeer(fakepeer.misbehave_after(n, payload, then_close)) as peer:
        conn = gtarantool.connect(peer.host, peer.port, fetch_schema=False,
                                  request_timeout=10.0, reconnect_max_attempts=0)
        before = rss()
        calls = [gevent.spawn(timed, conn.call, "f", i) for i in range(n)]
        gevent.joinall(calls, timeout=slack(5))
        outcomes = [c.value for c in calls]
        assert all(c.dead for c in calls), "a waiter hangs"
        # Every waiter failed promptly with a clear error, except, for a valid
        # reply, the first caller (its request went out first: the reply's sync).
        answered = {i: value.data for i, (_, value) in enumerate(outcomes)
                    if not isinstance(value, Exception)}
        assert answered == ({0: [1]} if payload is _valid else {}), outcomes
        for i, (elapsed, value) in enumerate(outcomes):
            assert elapsed < slack(2.0)
            if i not in answered:
                assert isinstance(value, expected), repr(value)
                assert not isinstance(value, RequestTimeout)
        assert conn.is_closed()
        assert conn._transport.in_flight == 0
        assert rss() - before < 50 * MB
        assert not peer.errors
        conn.close()


BAD_BODIES = [
    # (body bytes after the header, exception the caller gets)
    (msgpack.packb({0x30: [1]}) + msgpack.packb({0x30: [2]}), msgpack.ExtraData),
    (msgpack.packb(5), ProtocolError),                            # not a map
    (b"\x81\x30\x92\x01", ValueError),                           # cut short
    (msgpack.packb({0x30: [msgpack.ExtType(99, b"x")]}), NotImplementedError),
]


@pytest.mark.usefixtures("reader")
def test_bad_reply_body_fails_its_request_only():
    """A frame whose body does not decode to one map fails the request it
    answers, for single calls and in a pipeline, in Tarantool's own layout and
    in another; nothing of it leaks into the next reply and the connection
    stays up."""
    def handler(peer, sock):
        sock.sendall(fakepeer.greeting())
        while True:
            header, body = peer.read_request(sock)
            name = body[0x22]
            sync = header[fakepeer.IPROTO_SYNC]
            if name.startswith("bad"):
                bad = BAD_BODIES[int(name[3:])][0]
                sock.sendall(fakepeer.tarantool_frame(sync, bad))   # the fast paths' layout
            elif name.startswith("odd"):
                head = msgpack.packb({0: 0, 1: sync, 5: 1})
                bad = BAD_BODIES[int(name[3:])][0]
                sock.sendall(msgpack.packb(len(head) + len(bad)) + head + bad)
            else:
                sock.sendall(fakepeer.reply(sync, [name]))

    with fakepeer.FakePeer(handler) as peer:
        conn = gtarantool.connect(peer.host, peer.port, fetch_schema=False, request_timeout=2)
        for kind in ("bad", "odd"):
            for i, (_, expected) in enumerate(BAD_BODIES):
                with pytest.raises(expected):
                    conn.call("%s%d" % (kind, i))
                assert conn.call("good").data == ["good"]
            with conn.pipeline() as p:
                for i in range(len(BAD_BODIES)):
                    p.call("%s%d" % (kind, i))
                    p.call("good%d" % i)
            results = p.results()
            for i, (_, expected) in enumerate(BAD_BODIES):
                assert isinstance(results[2 * i], expected), results[2 * i]
                assert results[2 * i + 1].data == ["good%d" % i]
        assert not conn.is_closed() and conn.stats.reconnects == 0
        conn.close()
        assert not peer.errors


@pytest.mark.timing
def test_huge_but_allowed_length_prefix_allocates_nothing():
    """A length prefix of ~2 GiB under the limit, then a trickle: the reader waits
    for the bytes instead of allocating them; callers time out, memory stays flat."""
    def handler(peer, sock):
        sock.sendall(fakepeer.greeting())
        peer.read_request(sock)
        sock.sendall(b"\xce\x7f\x00\x00\x00" + b"\x81\x00" + b"a" * (4 * MB))
        while True:
            peer.read_request(sock)

    with fakepeer.FakePeer(handler) as peer:
        conn = gtarantool.connect(peer.host, peer.port, fetch_schema=False,
                                  request_timeout=0.5, reconnect_max_attempts=0)
        before = rss()
        elapsed, value = timed(conn.call, "f")
        assert isinstance(value, RequestTimeout) and elapsed < 0.5 + slack(0.5)
        assert rss() - before < 50 * MB
        elapsed, _ = timed(conn.close)
        assert elapsed < slack(1.0)


@pytest.mark.parametrize("greeting,expected", [
    (b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n".ljust(128), ProtocolError),
    (b"Tarantool 2.6.0 (Text) x".ljust(63) + b"\n" + b"y" * 63 + b"\n", ProtocolError),
    (b"Tarantool garbage".ljust(128, b"\xff"), ProtocolError),
    (b"SSH-2.0-OpenSSH_9.2\r\n", NetworkError),       # short, then silence
    (b"", NetworkError),                              # silence
])
@pytest.mark.timing
def test_not_a_tarantool_greeting(greeting, expected):
    def handler(peer, sock):
        sock.sendall(greeting)
        time.sleep(3)

    with fakepeer.FakePeer(handler) as peer:
        elapsed, value = timed(gtarantool.connect, peer.host, peer.port,
                               connection_timeout=0.5, fetch_schema=False)
        assert isinstance(value, expected), repr(value)
        assert elapsed < 0.5 + slack(1.0)


@pytest.mark.timing
def test_peer_closes_before_greeting():
    def handler(peer, sock):
        sock.sendall(b"Tarantool 2.6")
        sock.close()

    with fakepeer.FakePeer(handler) as peer:
        elapsed, value = timed(gtarantool.connect, peer.host, peer.port, fetch_schema=False)
        assert isinstance(value, NetworkError) and elapsed < slack(1.0), repr(value)


# -- fuzzing the frame reader -------------------------------------------------

class _FeedHarness:
    """A Transport over a socketpair whose peer never writes: the test feeds it."""

    def __init__(self, max_response_size=(1 << 31) - 1, loop="c"):
        import gevent.socket as gsocket
        self.a, self.b = socket.socketpair()
        self.transport = Transport(gsocket.socket(fileno=os.dup(self.a.fileno())), Stats(),
                                   max_in_flight=1 << 20, max_response_size=max_response_size,
                                   name="fuzz")
        if loop == "python":
            self.transport._cutter = None
        else:
            assert self.transport._cutter is not None, "gtarantool._speedups is not built"

    def register(self, sync):
        """A greenlet waiting for the reply to ``sync`` (no frame is written)."""
        return gevent.spawn(self.transport.request, sync, None, None, b"")

    def close(self):
        self.transport.close()
        self.a.close()
        self.b.close()


def _decoded(body):
    """A delivered body, or the exception decoding it raised, in comparable form."""
    if isinstance(body, bytearray):   # (an error's body, handed over as it came)
        body = bytes(body)
    return type(body).__name__ if isinstance(body, Exception) else repr(body)


def _norm(value):
    """A delivered value as (code, body, [(push code, push body)]), bodies _decoded."""
    if isinstance(value, Response):   # an OK reply, built by the reader
        return value._code, _decoded(value._body), []
    _sync, code, _schema, body, pushes = value
    return code, _decoded(body), [(c, _decoded(b)) for c, _s, b in pushes or []]


_UNPACK_OPTIONS = {"raw": False, "strict_map_key": False}
_UNPACK_OPTIONS["ext_hook"] = lambda code, data: unpacker_ext_hook(
    code, data, msgpack.Unpacker(**_UNPACK_OPTIONS))


def _decode_reference(body, code):
    """What a reply body must be delivered as: _decoded(msgpack.unpackb(body)),
    or an error reply's (code 0x8000 and above) as it came (decoded when read)."""
    if code >= 0x8000:
        return repr(bytes(body))
    if not body:
        return repr({})
    try:
        return repr(msgpack.unpackb(body, **_UNPACK_OPTIONS))
    except Exception as exc:  # noqa: BLE001
        return type(exc).__name__


def _reference(data, syncs, limit):
    """An independent, slow IPROTO reply parser: ({sync: normalized value}, failed)."""
    pending = set(syncs)
    pushes = {}
    out = {}
    pos = 0
    while pos < len(data):
        first = data[pos]
        size = 0 if first <= 0x7f else {0xcc: 1, 0xcd: 2, 0xce: 4, 0xcf: 8}.get(first)
        if size is None:
            return out, True
        if len(data) - pos < 1 + size:
            return out, False
        length = first if size == 0 else int.from_bytes(data[pos + 1:pos + 1 + size], "big")
        if not 0 < length <= limit:
            return out, True
        start = pos + 1 + size
        if len(data) - start < length:
            return out, False
        payload = data[start:start + length]
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        unpacker.feed(payload)
        try:
            header = unpacker.unpack()
        except Exception:  # noqa: BLE001
            return out, True
        sync, code = (header.get(1), header.get(0)) if type(header) is dict else (None, None)
        if type(sync) is not int or type(code) is not int:
            return out, True
        body = _decode_reference(payload[unpacker.tell():], code)
        if code == 0x80:
            if sync not in pending:
                return out, True
            pushes.setdefault(sync, []).append((code, body))
        else:
            if sync not in pending:
                return out, True
            pending.discard(sync)
            out[sync] = (code, body, pushes.pop(sync, []))
        pos = start + length
    return out, False


def _check_against_reference(data, cuts, syncs, limit, loop):
    h = _FeedHarness(limit, loop)
    try:
        waiters = {s: h.register(s) for s in syncs}
        gevent.sleep(0)   # each registers
        before = rss()
        failed = False
        try:
            for chunk in _chunks(data, cuts):
                h.transport.feed(chunk)
        except ProtocolError:
            failed = True              # the reader would now close the connection
        assert rss() - before < 64 * MB
        gevent.sleep(0)
        got = {s: _norm(w.get()) for s, w in waiters.items() if w.ready()}
        expected, bad = _reference(data, syncs, limit)
        assert failed == bad
        for sync, value in got.items():   # never a reply that is not this caller's
            assert expected.get(sync) == value, sync
        if not failed:
            assert got == expected
        assert len(got) + h.transport.in_flight == len(syncs)
        return got, failed
    finally:
        h.close()


_body = st.one_of(
    st.just(b""),
    st.builds(lambda v: msgpack.packb({0x30: v}),
              st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1)
                           | st.text(max_size=20) | st.binary(max_size=300),
                           lambda c: st.lists(c, max_size=4), max_leaves=10)),
)


def _stream(frames):
    out = []
    for sync, code, body, extra, fixed in frames:
        if fixed and not extra:   # Tarantool's own layout: the reader's fast path
            out.append(fakepeer.tarantool_frame(sync, body, code, 42))
            continue
        header = {0: code, 1: sync, 5: 42}
        header.update(extra)
        payload = msgpack.packb(header) + body
        out.append(msgpack.packb(len(payload)) + payload)
    return b"".join(out)


@st.composite
def frames_and_splits(draw):
    n = draw(st.integers(1, 12))
    syncs = draw(st.lists(st.integers(0, 2**64 - 1), min_size=n, max_size=n, unique=True))
    frames = []
    for sync in syncs:
        for _ in range(draw(st.integers(0, 2))):       # push messages first
            frames.append((sync, 0x80, draw(_body), {}, draw(st.booleans())))
        code = draw(st.sampled_from([0, 0, 0x8000 | 3, 0x8000 | 109]))
        extra = draw(st.sampled_from([{}, {0x36: 7}]))
        frames.append((sync, code, draw(_body), extra, draw(st.booleans())))
    data = _stream(frames)
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=20)))
    return syncs, frames, data, cuts


def _chunks(data, cuts):
    bounds = [0] + cuts + [len(data)]
    return [data[i:j] for i, j in zip(bounds, bounds[1:])]


# Both with the reader's loop in C and with its Python loop.
LOOPS = pytest.mark.parametrize("loop", ["c", "python"])


@LOOPS
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames_and_splits())
def test_fuzz_frame_reader_any_split_delivers_every_frame_once(loop, case):
    syncs, frames, data, cuts = case
    got, failed = _check_against_reference(data, cuts, syncs, (1 << 31) - 1, loop)
    assert not failed
    for sync in syncs:
        mine = [f for f in frames if f[0] == sync]
        assert got[sync] == (mine[-1][1], _decode_reference(mine[-1][2], mine[-1][1]),
                             [(0x80, _decode_reference(f[2], 0x80)) for f in mine[:-1]])


@st.composite
def corrupted(draw):
    syncs, frames, data, cuts = draw(frames_and_splits())
    data = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "prefix"]))
        pos = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "flip" and data:
            data[pos] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=9))
        elif kind == "delete" and data:
            del data[pos:pos + draw(st.integers(1, 9))]
        elif kind == "truncate":
            del data[pos:]
        elif kind == "prefix":
            data[0:0] = draw(st.sampled_from([b"\xc1", b"\xce\xff\xff\xff\xff", b"\xa3abc",
                                              b"\xff", b"\x00", b"\xcf" + b"\x7f" * 8,
                                              b"\x05\x93\x01\x02\x03\xc0"]))
    cuts = sorted(set(min(c, len(data)) for c in cuts))
    return syncs, bytes(data), cuts


@LOOPS
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corrupted(), st.sampled_from([(1 << 31) - 1, 4096]))
def test_fuzz_frame_reader_corruption_is_a_protocol_error_never_a_misdelivery(loop, case,
                                                                              limit):
    """Whatever the damage, the reader agrees with an independent parser: it raises
    ProtocolError exactly when the stream is invalid, and every reply it delivers
    is the one that parser gives that caller."""
    syncs, data, cuts = case
    _check_against_reference(data, cuts, syncs, limit, loop)


# -- bad input from the caller ------------------------------------------------

def _self_ref():
    x = []
    x.append(x)
    return x


def _deep(n):
    x = []
    for _ in range(n):
        x = [x]
    return x


# Rejected before anything is written: (call, exception type).
CLIENT_REJECTS = [
    (lambda c: c.insert("tester", (next(_ids), object())), TypeError),
    (lambda c: c.insert("tester", (next(_ids), "a", 1 + 2j)), TypeError),
    (lambda c: c.insert("tester", (next(_ids), "a", 2 ** 70)), (TypeError, OverflowError)),
    (lambda c: c.insert("tester", (next(_ids), "\ud800")), UnicodeEncodeError),
    (lambda c: c.insert("tester", (next(_ids), "a", _self_ref())), ValueError),
    (lambda c: c.insert("tester", (next(_ids), "a", _deep(2000))), ValueError),
    (lambda c: c.insert("tester", "not a tuple"), TypeError),
    (lambda c: c.insert("tester", None), TypeError),
    (lambda c: c.replace("tester", 42), TypeError),
    (lambda c: c.call(42), TypeError),
    (lambda c: c.eval(None), TypeError),
    (lambda c: c.select("tester", object()), TypeError),
    (lambda c: c.select("tester", 1, iterator="SIDEWAYS"), ValueError),
    (lambda c: c.insert("no_such_space", (1, "a")), SchemaError),
    (lambda c: c.select("tester", 1, index="no_such_index"), SchemaError),
    (lambda c: c.call("echo", (1,), on_push=42), TypeError),
    (lambda c: c.execute("SELECT ?", [object()]), TypeError),
]

# Sent, and refused by the server: (call, exception type).
SERVER_REJECTS = [
    (lambda c: c.insert("tester", ("not an int", "a")), DatabaseError),
    (lambda c: c.insert("tester", (next(_ids), "a", "x" * (2 * MB))), DatabaseError),
    (lambda c: c.select("tester", "wrong key type"), DatabaseError),
    (lambda c: c.insert("tester", (next(_ids),)), DatabaseError),
    (lambda c: c.call("no_such_function"), DatabaseError),
    (lambda c: c.call("raise_error", "boom"), DatabaseError),
    (lambda c: c.eval("error('lua boom')"), DatabaseError),
    (lambda c: c.execute("SELEC 1"), DatabaseError),
    (lambda c: c.execute("SELECT * FROM no_such_table"), DatabaseError),
    (lambda c: c.execute("INSERT INTO sqltest VALUES (?, ?)", ["x", 1]), DatabaseError),
]


def test_bad_input_rejected_before_the_socket(conn):
    transport = conn._transport
    for i, (call, exc_type) in enumerate(CLIENT_REJECTS):
        requests, bytes_out = conn.stats.requests, conn.stats.bytes_out
        with pytest.raises(exc_type):
            call(conn)
        gevent.sleep(0)
        if exc_type is not SchemaError:   # an unknown name costs a schema lookup, no more
            assert (conn.stats.requests, conn.stats.bytes_out) == (requests, bytes_out), i
        assert not transport._wbuf, i
    # The stream is intact: the packer kept no half-packed leftovers.
    value = {"k": [1, "two", None, 3.5]}
    assert conn.call("echo", value).data == [value]
    assert conn._transport is transport and conn.stats.reconnects == 0


def test_bad_input_fails_only_its_caller(conn):
    good = {"ok": 0, "bad": 0}
    stop = Event()

    def background(n):
        i = 0
        while not stop.is_set():
            i += 1
            try:
                assert conn.call("echo", n, i).data == [n, i]
                good["ok"] += 1
            except Exception:  # noqa: BLE001
                good["bad"] += 1
                raise

    bg = [gevent.spawn(background, n) for n in range(20)]
    transport = conn._transport
    for round_ in range(3):
        for i, (call, exc_type) in enumerate(CLIENT_REJECTS + SERVER_REJECTS):
            # A good request issued together with the bad one gets its own reply.
            neighbour = gevent.spawn(conn.call, "echo", round_, i)
            with pytest.raises(exc_type):
                call(conn)
            assert neighbour.get(timeout=5).data == [round_, i]
    stop.set()
    gevent.joinall(bg, raise_error=True)
    assert good["bad"] == 0 and good["ok"] > 100
    assert conn._transport is transport and conn.stats.reconnects == 0
    assert conn.execute("SELECT 1").data == [[1]]


# -- overload ---------------------------------------------------------------------

def test_100k_greenlets_at_once_bounded_in_flight_and_memory(server):
    conn = connect(server.host, server.port)
    conn.ping()
    start_rss = peak = rss()
    done = Event()

    def sample():
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss())
            gevent.sleep(0.05)

    sampler = gevent.spawn(sample)
    errors = []

    def one(i):
        try:
            r = conn.call("echo", i)
            if r.data != [i]:
                errors.append(("wrong reply", i, r.data))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    t0 = time.monotonic()
    greenlets = [gevent.spawn(one, i) for i in range(100_000)]
    gevent.joinall(greenlets)
    elapsed = time.monotonic() - t0
    done.set()
    sampler.join()
    peak = max(peak, rss())
    del greenlets
    print("\n100,000 greenlets: %.1fs, RSS start %.0f MB, peak %.0f MB (+%.0f MB), "
          "max in flight %d" % (elapsed, start_rss / MB, peak / MB, (peak - start_rss) / MB,
                                conn.stats.max_in_flight))
    assert errors == []
    assert conn.stats.max_in_flight <= conn.max_in_flight == 10000
    assert conn._transport.in_flight == 0
    assert peak - start_rss < 1024 * MB
    conn.close()


def test_max_in_flight_bound_queues_callers(server):
    conn = connect(server.host, server.port, max_in_flight=8, request_timeout=5)
    calls = [gevent.spawn(conn.call, "sleep_and_return", 0.05, i) for i in range(64)]
    gevent.joinall(calls, raise_error=True)
    assert [c.value.data for c in calls] == [[i] for i in range(64)]
    assert conn.stats.max_in_flight == 8
    conn.close()


def test_callers_in_line_served_in_order_even_when_some_give_up(server):
    """Beyond max_in_flight callers wait in line; one killed and one timed out in
    line neither hold a slot nor stop the callers behind them."""
    conn = connect(server.host, server.port, max_in_flight=1, request_timeout=0.5)
    first = gevent.spawn(conn.call, "sleep_and_return", 0.3, "first")
    gevent.sleep(0.05)
    done = []
    killed = gevent.spawn(conn.call, "echo", "killed")

    def gives_up():
        with gevent.Timeout(0.1, False):
            conn.call("echo", "late")
            return "served"
        return "gave up"

    late = gevent.spawn(gives_up)
    rest = [gevent.spawn(lambda i=i: done.append(conn.call("echo", i)[0])) for i in range(5)]
    gevent.sleep(0.05)
    killed.kill()
    gevent.joinall([first, late] + rest, timeout=5)
    assert first.value[0] == "first"
    assert late.value == "gave up"
    assert done == [0, 1, 2, 3, 4]
    assert conn._transport.in_flight == 0 and not conn._transport._queue
    conn.close()


# -- threads and forks -----------------------------------------------------------

def test_use_from_another_thread_is_refused(conn):
    results = []

    def other():
        for fn in (conn.ping, lambda: conn.call("echo", 1), lambda: conn.select("tester", 1),
                   conn.close):
            try:
                fn()
                results.append(None)
            except Exception as exc:  # noqa: BLE001
                results.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join(10)
    assert not t.is_alive()
    assert all(isinstance(r, WrongOwner) for r in results), results
    assert conn.call("echo", "still mine").data == ["still mine"]
    assert conn.stats.reconnects == 0


@pytest.mark.timing
def test_close_fails_in_flight_requests_with_connection_closed(conn):
    calls = [gevent.spawn(timed, conn.call, "sleep_and_return", 1, i) for i in range(10)]
    gevent.sleep(0.1)
    conn.close()
    gevent.joinall(calls, timeout=slack(2))
    for c in calls:
        elapsed, value = c.value
        assert isinstance(value, ConnectionClosed) and elapsed < 0.1 + slack(0.4)
    assert conn.call("echo", 1).data == [1]
