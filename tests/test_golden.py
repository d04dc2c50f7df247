"""The request frames on the wire, pinned byte for byte.

Every kind of request the connector sends (data requests, call and eval, SQL,
prepared statements, streams and transactions, watchers, pagination,
pipelines, and the ID and AUTH of a connect) is made once against a scripted
peer with fixed syncs, stream ids and greeting salt, and each frame must equal
the one in ``tests/golden/<name>.hex`` (one frame a line, in hex), with the
request bodies packed in C and in Python (the ``reader`` fixture).  Each
golden file is also decoded and checked against the IPROTO layout: a length
prefix that covers the frame, a header of the request type (tarantool.const's
code), the sync and the schema version (and the stream id in a stream), a body
of that request type's keys.  A change of the wire format shows up here first;
``pytest tests/test_golden.py --update-golden`` writes the files anew after a
change that is meant (the ID frame lists tarantool-python's protocol version
and features, so a new tarantool-python can change it).
"""
import base64
import itertools
import os
import socket
import threading

import gevent
import msgpack
import pytest
from tarantool import const

import gtarantool

from .timing import slack

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")
SYNC = (1 << 32) + 7        # the first sync of every request below (a real one's range)
STREAM_ID = 3
SPACE = 512
# What the peer's _vspace and _vindex hold: space 512 ("golden") with three indexes.
VSPACE, VINDEX = 281, 289
SPACE_ROW = [SPACE, 1, "golden", "memtx", 0, {},
             [{"name": "id", "type": "unsigned"}, {"name": "name", "type": "string"}]]
INDEX_ROWS = [[SPACE, 0, "pk", "tree", {"unique": True}, [[0, "unsigned"]]],
              [SPACE, 1, "name", "tree", {"unique": False}, [[1, "string"]]],
              [SPACE, 2, "both", "tree", {"unique": True}, [[0, "unsigned"], [1, "string"]]]]
USER, PASSWORD = "golden", "secret"
SALT = bytes(range(32))

# IPROTO codes and keys tarantool.const lacks (Tarantool's iproto_constants.h)
PREPARE, BEGIN, COMMIT, ROLLBACK = 13, 14, 15, 16
WATCH, UNWATCH, EVENT, WATCH_ONCE = 74, 75, 76, 77
STREAM_ID_KEY = 0x0a
FETCH_POSITION, AFTER_POSITION, AFTER_TUPLE = 0x1f, 0x2e, 0x2f
STMT_ID, TIMEOUT, TXN_ISOLATION = 0x43, 0x56, 0x59
EVENT_KEY, EVENT_DATA = 0x57, 0x58

SELECT_KEYS = {const.IPROTO_SPACE_ID, const.IPROTO_INDEX_ID, const.IPROTO_LIMIT,
               const.IPROTO_OFFSET, const.IPROTO_ITERATOR, const.IPROTO_KEY}


# -- the scripted peer -----------------------------------------------------------------

def _greeting():
    line1 = "Tarantool 3.2.0 (Binary) 0d3c0a7e-6b1f-4c2a-9e55-1f2d3c4b5a69"
    return (line1.ljust(63).encode() + b"\n"
            + base64.b64encode(SALT).ljust(63) + b"\n")


def _frame(header, body):
    payload = msgpack.packb(header) + msgpack.packb(body)
    return msgpack.packb(len(payload)) + payload


class Peer:
    """A Tarantool 3.x as far as these requests go, in an OS thread: keeps every
    request frame whole (``frames``) and answers each as a server would."""

    def __init__(self):
        self.frames = []
        self.watched = set()   # keys whose current value was sent
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(1)
        self.port = self._listener.getsockname()[1]
        self._sock = None
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        try:
            self._sock, _ = self._listener.accept()
            self._sock.sendall(_greeting())
            buf = b""
            while True:
                data = self._sock.recv(65536)
                if not data:
                    return
                buf += data
                while True:
                    frame, buf = _cut(buf)
                    if frame is None:
                        break
                    self.frames.append(frame)
                    _, header, body = _decode(frame)
                    answer = _answer(header, body, self.watched)
                    if answer is not None:
                        self._sock.sendall(answer)
        except OSError:
            return

    def close(self):
        for sock in (self._sock, self._listener):
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()
        self._thread.join(5)


def _prefix(buf):
    """(length, size of the prefix) of a frame's msgpack uint length, or None."""
    width = 0 if buf[0] <= 0x7f else {0xcc: 1, 0xcd: 2, 0xce: 4, 0xcf: 8}[buf[0]]
    if len(buf) < 1 + width:
        return None
    return (buf[0] if width == 0 else int.from_bytes(buf[1:1 + width], "big")), 1 + width


def _cut(buf):
    """(one whole frame, the rest) of ``buf``, or (None, buf)."""
    prefix = _prefix(buf) if buf else None
    if prefix is None or len(buf) < sum(prefix):
        return None, buf
    end = sum(prefix)
    return buf[:end], buf[end:]


def _decode(frame):
    """A request frame's (length, header, body): its three msgpack objects,
    the body None where the frame ends after the header (a ping's)."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(frame)
    length, header = unpacker.unpack(), unpacker.unpack()
    body = unpacker.unpack() if unpacker.tell() < len(frame) else None
    assert unpacker.tell() == len(frame), "more than a header and a body"
    return length, header, body


def _answer(header, body, watched):
    code, sync = header[const.IPROTO_REQUEST_TYPE], header[const.IPROTO_SYNC]
    reply = {const.IPROTO_REQUEST_TYPE: 0, const.IPROTO_SYNC: sync,
             const.IPROTO_SCHEMA_ID: 1}
    if code == const.REQUEST_TYPE_ID:
        return _frame(reply, {const.IPROTO_VERSION: 6, const.IPROTO_FEATURES: [0, 1, 2, 3, 4, 6],
                              const.IPROTO_AUTH_TYPE: "chap-sha1"})
    if code == UNWATCH:
        watched.discard(body[EVENT_KEY])
        return None
    if code == WATCH:
        # The current value for a new watch; a WATCH on a watched key acknowledges
        # the last event (the next comes when the value changes: never here).
        # box.shutdown, which every connection watches, gets no event: its
        # acknowledgement would go out among the connect's requests at a moment
        # that depends on scheduling (test_watchers and test_restarts cover it).
        if body[EVENT_KEY] in watched or body[EVENT_KEY] == "box.shutdown":
            return None
        watched.add(body[EVENT_KEY])
        return _frame({const.IPROTO_REQUEST_TYPE: EVENT, const.IPROTO_SYNC: sync},
                      {EVENT_KEY: body[EVENT_KEY]})
    if code == PREPARE and const.IPROTO_SQL_TEXT in body:
        return _frame(reply, {STMT_ID: 77, 0x34: 1})
    if code in (const.REQUEST_TYPE_EXECUTE, PREPARE):
        return _frame(reply, {const.IPROTO_SQL_INFO: {const.IPROTO_SQL_INFO_ROW_COUNT: 0}})
    data = []
    if code == const.REQUEST_TYPE_SELECT and body[const.IPROTO_SPACE_ID] == VSPACE:
        data = [SPACE_ROW]
    elif code == const.REQUEST_TYPE_SELECT and body[const.IPROTO_SPACE_ID] == VINDEX:
        data = INDEX_ROWS
    return _frame(reply, {const.IPROTO_DATA: data})


# -- the requests ----------------------------------------------------------------------

def _wait_for(peer, count):
    with gevent.Timeout(slack(5)):
        while len(peer.frames) < count:
            gevent.sleep(0.001)


class _Run:
    """The connection and the frames each named request put on the wire."""

    def __init__(self, peer, conn):
        self.peer, self.conn = peer, conn
        self.frames = {}

    def do(self, name, action, frames=1):
        """Run ``action(conn)`` with the syncs restarted at SYNC; record the
        ``frames`` request frames it sent as ``name``."""
        assert name not in self.frames
        start = len(self.peer.frames)
        self.conn._syncs = itertools.count(SYNC)
        result = action(self.conn)
        _wait_for(self.peer, start + frames)
        gevent.sleep(0.01)   # (anything more would show as an extra frame)
        assert len(self.peer.frames) == start + frames, name
        self.frames[name] = self.peer.frames[start:]
        return result


def _pipeline(conn):
    with conn.pipeline() as p:
        p.insert(SPACE, (1, "a"))
        p.select(SPACE, 1)
        p.call("f", 1)
    return p.results()


def _stream_pipeline(stream):
    with stream.pipeline() as p:
        p.replace(SPACE, (2, "b"))
        p.delete(SPACE, 2)
    return p.results()


def _call_16(conn):
    conn.call_16 = True
    try:
        return conn.call("f", 1, "two")
    finally:
        conn.call_16 = False


def _requests(peer):
    conn = gtarantool.connect("127.0.0.1", peer.port, user=USER, password=PASSWORD,
                              request_timeout=slack(5))
    run = _Run(peer, conn)
    # The connect (ID, AUTH, the WATCH of box.shutdown, a ping for the schema
    # version, _vspace, _vindex), with the syncs a new connection starts from.
    run.frames["connect"] = list(peer.frames)
    conn._stream_ids = itertools.count(STREAM_ID)

    run.do("ping", lambda c: c.ping())
    run.do("select", lambda c: c.select("golden", [1, "a"], index="both", offset=2, limit=10,
                                        iterator="GE"))
    run.do("select_scalar_key", lambda c: c.select(SPACE, 1))
    run.do("select_all", lambda c: c.select(SPACE))
    run.do("select_after_tuple", lambda c: c.select(SPACE, [1], limit=5, after=(1, "a"),
                                                    fetch_pos=True))
    run.do("select_after_position", lambda c: c.select(SPACE, [], iterator="ALL", limit=5,
                                                       after=b"kgGhYQ=="))
    run.do("insert", lambda c: c.insert(SPACE, (1, "a", {"b": [1.5, None]}, b"\x00bin", -7,
                                                1 << 40, True)))
    run.do("replace", lambda c: c.replace(SPACE, [1, "b"]))
    run.do("update", lambda c: c.update(SPACE, 1, [("+", 1, 5), ("=", 2, "x")]))
    run.do("update_by_index", lambda c: c.update(SPACE, ["a"], [("#", 1, 1)], index="name"))
    run.do("upsert", lambda c: c.upsert(SPACE, (1, "a"), [("+", 1, 5)]))
    run.do("delete", lambda c: c.delete(SPACE, 1))
    run.do("delete_by_index", lambda c: c.delete(SPACE, [1, "a"], index=2))
    run.do("call", lambda c: c.call("f", 1, "two", [3.25, None]))
    run.do("call_16", _call_16)
    run.do("eval", lambda c: c.eval("return ...", {"k": "v"}, 2))
    run.do("execute", lambda c: c.execute("SELECT ?, ?", [1, "a"]))
    run.do("execute_named", lambda c: c.execute("SELECT :x", {"x": 1}))
    stmt = run.do("prepare", lambda c: c.prepare("SELECT ?"))
    run.do("execute_prepared", lambda c: stmt.execute([5]))
    run.do("unprepare", lambda c: stmt.unprepare())
    run.do("pipeline", _pipeline, frames=3)
    run.do("watch_once", lambda c: c.watch_once("box.id"))
    # the WATCH, then the one that acknowledges the event with the current value
    watcher = run.do("watch", lambda c: c.watch("box.status", lambda key, value: None), 2)
    run.do("unwatch", lambda c: watcher.unregister())

    stream = conn.stream()
    assert stream.stream_id == STREAM_ID
    run.do("begin", lambda c: stream.begin(isolation="read-committed", timeout=2.5))
    run.do("stream_insert", lambda c: stream.insert(SPACE, (1, "a")))
    run.do("stream_select", lambda c: stream.select(SPACE, 1))
    run.do("stream_call", lambda c: stream.call("f", 1))
    run.do("stream_execute", lambda c: stream.execute("SELECT 1"))
    run.do("stream_pipeline", lambda c: _stream_pipeline(stream), frames=2)
    run.do("commit", lambda c: stream.commit())
    run.do("begin_plain", lambda c: stream.begin())
    run.do("rollback", lambda c: stream.rollback())
    conn.close()
    return run.frames


# -- what each golden frame must decode to ------------------------------------------------

def _select(*extra):
    return const.REQUEST_TYPE_SELECT, SELECT_KEYS | set(extra)


INVOKE = {const.IPROTO_FUNCTION_NAME, const.IPROTO_TUPLE}
# Headers: the request type and sync, the schema version (IPROTO_SCHEMA_ID),
# and in a stream its IPROTO_STREAM_ID; a frame's third field names them where
# there is no schema version.
NO_SCHEMA = {const.IPROTO_REQUEST_TYPE, const.IPROTO_SYNC}
# name -> [(request type, body keys[, header keys])], a frame each
EXPECTED = {
    "connect": [(const.REQUEST_TYPE_ID, {const.IPROTO_VERSION, const.IPROTO_FEATURES},
                 NO_SCHEMA),
                (const.REQUEST_TYPE_AUTHENTICATE, {const.IPROTO_USER_NAME, const.IPROTO_TUPLE}),
                (WATCH, {EVENT_KEY}, NO_SCHEMA),
                (const.REQUEST_TYPE_PING, set()), _select(), _select()],
    "ping": [(const.REQUEST_TYPE_PING, set())],
    "select": [_select()],
    "select_scalar_key": [_select()],
    "select_all": [_select()],
    "select_after_tuple": [_select(FETCH_POSITION, AFTER_TUPLE)],
    "select_after_position": [_select(AFTER_POSITION)],
    "insert": [(const.REQUEST_TYPE_INSERT, {const.IPROTO_SPACE_ID, const.IPROTO_TUPLE})],
    "replace": [(const.REQUEST_TYPE_REPLACE, {const.IPROTO_SPACE_ID, const.IPROTO_TUPLE})],
    "update": [(const.REQUEST_TYPE_UPDATE, {const.IPROTO_SPACE_ID, const.IPROTO_INDEX_ID,
                                            const.IPROTO_KEY, const.IPROTO_TUPLE})],
    "update_by_index": [(const.REQUEST_TYPE_UPDATE, {const.IPROTO_SPACE_ID,
                                                     const.IPROTO_INDEX_ID, const.IPROTO_KEY,
                                                     const.IPROTO_TUPLE})],
    # (an index id as tarantool-python sends it; the server reads none for an upsert)
    "upsert": [(const.REQUEST_TYPE_UPSERT, {const.IPROTO_SPACE_ID, const.IPROTO_INDEX_ID,
                                            const.IPROTO_OPS, const.IPROTO_TUPLE})],
    "delete": [(const.REQUEST_TYPE_DELETE, {const.IPROTO_SPACE_ID, const.IPROTO_INDEX_ID,
                                            const.IPROTO_KEY})],
    "delete_by_index": [(const.REQUEST_TYPE_DELETE, {const.IPROTO_SPACE_ID,
                                                     const.IPROTO_INDEX_ID, const.IPROTO_KEY})],
    "call": [(const.REQUEST_TYPE_CALL, INVOKE)],
    "call_16": [(const.REQUEST_TYPE_CALL16, INVOKE)],
    "eval": [(const.REQUEST_TYPE_EVAL, {const.IPROTO_EXPR, const.IPROTO_TUPLE})],
    "execute": [(const.REQUEST_TYPE_EXECUTE, {const.IPROTO_SQL_TEXT, const.IPROTO_SQL_BIND})],
    "execute_named": [(const.REQUEST_TYPE_EXECUTE, {const.IPROTO_SQL_TEXT,
                                                    const.IPROTO_SQL_BIND})],
    "prepare": [(PREPARE, {const.IPROTO_SQL_TEXT})],
    "execute_prepared": [(const.REQUEST_TYPE_EXECUTE, {STMT_ID, const.IPROTO_SQL_BIND})],
    "unprepare": [(PREPARE, {STMT_ID})],
    "pipeline": [(const.REQUEST_TYPE_INSERT, {const.IPROTO_SPACE_ID, const.IPROTO_TUPLE}),
                 _select(), (const.REQUEST_TYPE_CALL, INVOKE)],
    "watch_once": [(WATCH_ONCE, {EVENT_KEY})],
    "watch": [(WATCH, {EVENT_KEY}, NO_SCHEMA), (WATCH, {EVENT_KEY}, NO_SCHEMA)],
    "unwatch": [(UNWATCH, {EVENT_KEY}, NO_SCHEMA)],
    "begin": [(BEGIN, {TXN_ISOLATION, TIMEOUT})],
    "stream_insert": [(const.REQUEST_TYPE_INSERT, {const.IPROTO_SPACE_ID,
                                                   const.IPROTO_TUPLE})],
    "stream_select": [_select()],
    "stream_call": [(const.REQUEST_TYPE_CALL, INVOKE)],
    "stream_execute": [(const.REQUEST_TYPE_EXECUTE, {const.IPROTO_SQL_TEXT,
                                                     const.IPROTO_SQL_BIND})],
    "stream_pipeline": [(const.REQUEST_TYPE_REPLACE, {const.IPROTO_SPACE_ID,
                                                      const.IPROTO_TUPLE}),
                        (const.REQUEST_TYPE_DELETE, {const.IPROTO_SPACE_ID,
                                                     const.IPROTO_INDEX_ID, const.IPROTO_KEY})],
    "commit": [(COMMIT, set())],
    "begin_plain": [(BEGIN, set())],
    "rollback": [(ROLLBACK, set())],
}
IN_STREAM = {"begin", "stream_insert", "stream_select", "stream_call", "stream_execute",
             "stream_pipeline", "commit", "begin_plain", "rollback"}


def _path(name):
    return os.path.join(GOLDEN, name + ".hex")


def _read(name):
    with open(_path(name)) as f:
        return [bytes.fromhex(line) for line in f.read().split()]


def test_every_request_frame_equals_its_golden_file(reader, request):
    peer = Peer()
    try:
        frames = _requests(peer)
    finally:
        peer.close()
    assert set(frames) == set(EXPECTED)
    # (written from the C run; the Python run then compares with them)
    if request.config.getoption("--update-golden") and reader == "c":
        os.makedirs(GOLDEN, exist_ok=True)
        for name, sent in frames.items():
            with open(_path(name), "w") as f:
                f.write("".join(frame.hex() + "\n" for frame in sent))
    for name, sent in sorted(frames.items()):
        assert [f.hex() for f in sent] == [f.hex() for f in _read(name)], name


def test_no_golden_file_is_left_over():
    assert sorted(os.listdir(GOLDEN)) == sorted(name + ".hex" for name in EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_golden_frames_decode_as_iproto_says(name):
    frames = _read(name)
    assert len(frames) == len(EXPECTED[name])
    for i, (frame, expected) in enumerate(zip(frames, EXPECTED[name])):
        code, keys = expected[:2]
        length, header, body = _decode(frame)
        assert length == len(frame) - _prefix(frame)[1]
        header_keys = set(expected[2]) if len(expected) > 2 else (
            {const.IPROTO_REQUEST_TYPE, const.IPROTO_SYNC, const.IPROTO_SCHEMA_ID})
        if name in IN_STREAM:
            header_keys.add(STREAM_ID_KEY)
            assert header[STREAM_ID_KEY] == STREAM_ID
        assert set(header) == header_keys, header
        assert header[const.IPROTO_REQUEST_TYPE] == code
        first = (1 << 32) if name == "connect" else SYNC
        assert header[const.IPROTO_SYNC] == first + i
        if body is None:   # (no body: as an empty one)
            body = {}
        assert isinstance(body, dict) and set(body) == keys, body
