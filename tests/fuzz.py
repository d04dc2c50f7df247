"""Seeded fuzzers of the C paths against reference parsers (``make fuzz``, ``make sanitize``).

    python -m tests.fuzz [--seconds 60] [--seed 1] [cutter encoder batch convert feed read]

runs each target for its share of ``--seconds`` (random cases from one
``random.Random(seed)`` per target: the same seed gives the same cases in the
same order) and exits 1 at the first mismatch, printing the target, the seed
and the case number.  Under ``make sanitize`` the extensions are built with
ASan and UBSan, so a memory error ends the run with a report instead.

- ``cutter``: ``_speedups.ReplyCutter.cut`` on streams of replies in every
  header layout (2.6's, 2.10+'s, any uint width, keys in any order, extra
  keys, pushes), cut short, corrupted, at random positions and limits; every
  reply it takes must be the reference's, and it must stop on a frame
  boundary.
- ``encoder``: ``_encoder.BodyEncoder.join`` against joining ``msgpack``'s
  ``Packer.pack`` of the same objects.
- ``batch``: ``_encoder.BodyEncoder.encode_batch`` (rows of random objects,
  inserts and upserts, syncs up to the last uint64) against its Python twin,
  ``protocol.bulk.encode_batch``.
- ``convert``: ``_encoder.convert_lines`` and ``convert_records`` (CSV-like
  text and lists of strings by a random plan of field kinds, with quotes,
  carriage returns, bytes that are not UTF-8, wrong widths and converters
  that raise) against their Python twins in ``protocol.bulk``.
- ``feed``: ``Transport.feed`` (the C and the Python reader) with such
  streams in random pieces, waited for by callers and pipelines' sinks (and
  checking sinks, whose successes keep only their code): what
  each gets, and whether the stream fails the connection, must be the
  reference parser's (an ``Unpacker`` per frame, as ``_frame`` does).
- ``read``: the same, written to the transport's socket: the read watcher's
  callback (``_speedups.LoneReader`` and ``Transport._readable``) and the
  reader receive it.
"""
import argparse
import array
import collections
import os
import random
import socket
import struct
import sys
import time

import gevent
import gevent.socket as gsocket
import msgpack

from gtarantool import compiled, protocol
from gtarantool.compiled import encoder as _encoder
from gtarantool.compiled import speedups as _speedups
from gtarantool.errors import ProtocolError
from gtarantool.protocol import BodyDecoder, Response
from gtarantool.transport import CHECKED, ReplySink, Stats, Transport, _Pushes

IPROTO_CHUNK = 0x80
LIMIT = 1 << 16   # the transports' max_response_size
SYNC = 0x1234     # a sync for tests of one reply


# -- msgpack, written with any encoding of each value ----------------------------

def uint(rng, n, shortest=False):
    """``n`` (0 <= n < 2**64) in any valid msgpack uint encoding."""
    forms = [(tag, size) for tag, size in ((0xcc, 1), (0xcd, 2), (0xce, 4), (0xcf, 8))
             if n < 1 << (8 * size)]
    if n < 0x80:
        forms.insert(0, (None, 0))
    tag, size = forms[0] if shortest else rng.choice(forms)
    return bytes([n]) if tag is None else bytes([tag]) + n.to_bytes(size, "big")


def value(rng, depth=0):
    """A random msgpack object as bytes (valid; ext types included)."""
    kind = rng.choice(("nil", "bool", "int", "int", "neg", "float", "str", "str", "bin")
                      + (("array", "map") if depth < 3 else ()))
    if rng.random() < 0.02:
        kind = "ext"   # unknown to tarantool's ext_hook, which raises: the whole body fails
    if kind == "nil":
        return b"\xc0"
    if kind == "bool":
        return rng.choice((b"\xc2", b"\xc3"))
    if kind == "int":
        return uint(rng, rng.choice((rng.randrange(128), rng.randrange(1 << 64))))
    if kind == "neg":
        return msgpack.packb(-rng.randrange(1, 1 << 63))
    if kind == "float":
        return msgpack.packb(rng.uniform(-1e9, 1e9), use_single_float=rng.random() < 0.3)
    if kind == "str":
        if rng.random() < 0.1:   # not UTF-8: an error reply escapes it (2.10+ messages)
            data = rng.randbytes(rng.randrange(1, 40))
            return bytes([0xa0 | len(data)]) + data
        data = "".join(chr(rng.choice((rng.randrange(32, 127), rng.randrange(0x80, 0x800))))
                       for _ in range(rng.randrange(40))).encode()
        return msgpack.packb(data.decode())
    if kind == "bin":
        return msgpack.packb(rng.randbytes(rng.randrange(40)), use_bin_type=True)
    if kind == "ext":
        return msgpack.packb(msgpack.ExtType(rng.randrange(100, 128),
                                             rng.randbytes(rng.randrange(1, 20))))
    items = [value(rng, depth + 1) for _ in range(rng.randrange(6))]
    if kind == "map":
        return bytes([0x80 | len(items)]) + b"".join(uint(rng, rng.randrange(0x60)) + item
                                                     for item in items)
    return bytes([0x90 | len(items)]) + b"".join(items)


def body(rng):
    """A reply body: mostly maps, as Tarantool's; sometimes empty, odd or broken."""
    roll = rng.random()
    if roll < 0.05:
        return b""
    if roll < 0.1:
        return value(rng)
    good = bytes([0x81, 0x30]) + bytes([0x90 | 2]) + value(rng) + value(rng)
    if roll < 0.13:   # data that is not a list of tuples (nil, a scalar, a map)
        return bytes([0x81, 0x30]) + rng.choice((b"\xc0", value(rng)))
    if roll < 0.15:
        return good[:rng.randrange(len(good))] or b"\xc1"
    if roll < 0.2:
        return good + b"\x01"
    return good


def header(rng, code, sync, schema):
    """A reply header map in any layout: 2.6's, 2.10+'s, or keys in any order, in
    any uint width, with extra keys (stream id, ...), or without a schema version."""
    roll = rng.random()
    if roll < 0.3:     # Tarantool 2.6
        return (b"\x83\x00\xce" + code.to_bytes(4, "big") + b"\x01\xcf" + sync.to_bytes(8, "big")
                + b"\x05\xce" + (schema & 0xffffffff).to_bytes(4, "big"))
    if roll < 0.6:     # 2.10 and later
        return (b"\x83\x00\xce" + code.to_bytes(4, "big") + b"\x01\xcf" + sync.to_bytes(8, "big")
                + b"\x05\xcf" + schema.to_bytes(8, "big"))
    pairs = [(0x00, code), (0x01, sync), (0x05, schema)]
    if rng.random() < 0.1:
        pairs.pop()                                     # no schema version (as an event)
    for _ in range(rng.choice((0, 0, 1, 2))):           # stream id, replica id, flags, ...
        pairs.append((rng.choice((0x0a, 0x02, 0x09, 0x03, 0x54)), rng.randrange(1 << 40)))
    rng.shuffle(pairs)
    items = b"".join(uint(rng, k, shortest=rng.random() < 0.9) + uint(rng, v) for k, v in pairs)
    if rng.random() < 0.05:                             # a value no fast path takes
        items += b"\x04\xcb" + struct.pack(">d", time.time())
        pairs.append(None)
    head = bytes([0x80 | len(pairs)]) if rng.random() < 0.9 else \
        b"\xde" + len(pairs).to_bytes(2, "big")
    return head + items


def frame(rng, code, sync, schema, payload):
    head = header(rng, code, sync, schema)
    n = len(head) + len(payload)
    prefix = b"\xce" + n.to_bytes(4, "big") if rng.random() < 0.8 else uint(rng, n)
    return prefix + head + payload


def corrupt(rng, data):
    """One byte changed, a piece cut out, or garbage put in."""
    if not data:
        return data
    at = rng.randrange(len(data))
    roll = rng.random()
    if roll < 0.5:
        return data[:at] + bytes([rng.randrange(256)]) + data[at + 1:]
    if roll < 0.75:
        return data[:at] + data[at + rng.randrange(1, 8):]
    return data[:at] + rng.randbytes(rng.randrange(1, 8)) + data[at:]


def stream(rng):
    """(stream bytes, [(sync, kind)]): replies to callers ("glet") and pipelines
    ("sink"; "checked": a checking sink's, whose successes keep only their
    code), some with pushes first; syncs of any size."""
    frames, waiters = [], []
    used = set()
    for _ in range(rng.randrange(1, 12)):
        sync = rng.choice((rng.randrange(1 << 16), rng.randrange(1 << 64)))
        if sync in used:
            continue
        used.add(sync)
        waiters.append((sync, rng.choice(("glet", "glet", "sink", "checked"))))
        schema = rng.choice((rng.randrange(1 << 32), rng.randrange(1 << 64)))
        for _ in range(rng.choice((0, 0, 0, 1, 2))):
            frames.append(frame(rng, IPROTO_CHUNK, sync, schema, body(rng)))
        code = rng.choice((0, 0, 0, 0x8000 | rng.randrange(200), 7, rng.randrange(1 << 32)))
        frames.append(frame(rng, code, sync, schema, body(rng)))
    data = b"".join(frames)
    if rng.random() < 0.2:
        data = corrupt(rng, data)
    if rng.random() < 0.1:
        data = data[:rng.randrange(len(data) + 1)]
    return data, waiters


# -- the reference: every frame parsed by msgpack, as Transport._frame does -------

_OPTIONS = BodyDecoder().options
_unpackb_options = dict(use_list=_OPTIONS[0], raw=_OPTIONS[1], strict_map_key=False,
                        ext_hook=_OPTIONS[2])


def reference_frames(data, limit):
    """[(start, stop, sync, code, schema, body bytes)] of the whole frames of
    ``data``, then "error" (the stream is bad at that frame) or "more"."""
    out, pos = [], 0
    while pos < len(data):
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        unpacker.feed(data[pos:pos + 9])
        first = data[pos]
        if first > 0x7f and first not in (0xcc, 0xcd, 0xce, 0xcf):
            return out, "error"
        size = {0xcc: 2, 0xcd: 3, 0xce: 5, 0xcf: 9}.get(first, 1)
        if len(data) - pos < size:
            return out, "more"
        length = unpacker.unpack()
        if not 0 < length <= limit:
            return out, "error"
        start, stop = pos + size, pos + size + length
        if stop > len(data):
            return out, "more"
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        unpacker.feed(data[start:stop])
        try:
            head = unpacker.unpack()
        except Exception:  # noqa: BLE001 - a bad header is the reference's answer
            return out, "error"
        if type(head) is not dict or type(head.get(1)) is not int or type(head.get(0)) is not int:
            return out, "error"
        out.append((pos, stop, head[1], head[0], head.get(5), data[start + unpacker.tell():stop]))
        pos = stop
    return out, "more"


def decoded(payload, code=0):
    """The body of a reply ``code`` as the Python twin hands it to its caller:
    decoded, or an error's bytes as they came (decoded when read)."""
    if code >= 0x8000:
        return bytes(payload)
    if not payload:
        return {}
    try:
        return msgpack.unpackb(payload, **_unpackb_options)
    except Exception as exc:  # noqa: BLE001 - compared by type
        return exc


def error_decoded(payload, c=False):
    """An error reply's body decoded as it is when read: msgpack with escapes
    (the Python twin), or ``c``: ``_speedups.decode_error`` on a buffer of
    exactly its size."""
    if not payload:
        return {}
    try:
        if c:
            return _speedups.decode_error(_exact(payload), msgpack.unpackb, _OPTIONS)
        return msgpack.unpackb(payload, **_unpackb_options, unicode_errors="backslashreplace")
    except Exception as exc:  # noqa: BLE001 - compared by type
        return exc


def comparable(reply):
    """A reply as a caller gets it, in one form whichever path made it."""
    if type(reply) is Response:
        return (reply._sync, 0, reply._schema_version, comparable(reply._body), None,
                reply._data)
    if isinstance(reply, BaseException):
        return type(reply).__name__
    if isinstance(reply, bytearray):   # (an error's body: bytes from C, either from Python)
        return repr(bytes(reply))
    if type(reply) is tuple and len(reply) == 5:
        sync, code, schema, payload, pushes = reply
        data = None
        if code == 0 and type(payload) is dict:
            data = payload.get(0x30)
            data = data if data is None or isinstance(data, list) else [data]
        return (sync, code, schema, comparable(payload),
                pushes and [(c, s, comparable(b)) for c, s, b in pushes], data)
    return repr(reply)


# -- cutter ----------------------------------------------------------------------

def _exact(data):
    """``data`` in a buffer of exactly its size (ASan sees a read past its end).
    (An array made from a list is allocated to its size; from bytes, it is
    over-allocated as it grows.)"""
    return array.array("B", list(data))


class _Caller:
    """Stands for a caller's greenlet in a pending table."""


def fuzz_cutter(rng, case):
    data, waiters = stream(rng)
    frames, _ = reference_frames(data, LIMIT)
    if rng.random() < 0.3:   # cut short at every byte of the first header
        syncs = [sync for sync, _ in waiters]
        stops = {0} | {f[1] for f in frames}
        for cut in range(min(len(data), 48)):
            cutter = _speedups.ReplyCutter(dict.fromkeys(syncs, _Caller()), collections.deque(),
                                           msgpack.unpackb, _OPTIONS, Response, ReplySink,
                                           _Pushes)
            pos, _ = cutter.cut(_exact(data[:cut]), 0, cut, LIMIT, [])
            assert pos <= cut and pos in stops, (data[:cut], pos)
    pending, kinds = {}, {}
    for sync, kind in waiters:
        roll = rng.random()
        if roll < 0.1:
            continue                                    # not pending: the cutter stops
        if kind == "sink":
            waiter = ReplySink()
            waiter.outstanding = rng.choice((1, 2, 5))
        elif kind == "checked":
            waiter = ReplySink(ReplySink())
            waiter.owner.outstanding = rng.choice((1, 2, 5))
        elif roll < 0.15:
            waiter = _Pushes(_Caller(), None)           # the cutter leaves these alone
        else:
            waiter = _Caller()
        pending[sync] = kinds[sync] = waiter
    lead = rng.randrange(4)
    # (an array's buffer is allocated to its exact size, where bytes and
    # bytearray keep a byte more: a read one past the end is caught there)
    buf = rng.choice((bytes, bytearray, _exact, _exact))(
        rng.randbytes(lead) + data + rng.randbytes(rng.choice((0, 0, 1, 3))))
    end = lead + len(data) if rng.random() < 0.8 else rng.randrange(len(buf) + 2)
    limit = LIMIT if rng.random() < 0.9 else rng.randrange(64)
    ready, wake = collections.deque(), []
    defer_after = rng.choice((0, 1, 3, 64))   # OK replies past it queued undecoded
    cutter = _speedups.ReplyCutter(pending, ready, msgpack.unpackb, _OPTIONS, Response,
                                   ReplySink, _Pushes, defer_after)
    pos, stored = cutter.cut(buf, lead, end, limit, wake)
    taken = [f for f in frames if lead + f[1] <= pos]
    assert lead <= pos <= max(lead, min(end, len(buf))), (pos, lead, end)
    assert pos == lead or (taken and lead + taken[-1][1] == pos), "stopped off a frame boundary"
    got = list(ready)
    in_sinks = taken_by_callers = 0
    for start, stop, sync, code, schema, payload in taken:
        assert stop - start <= limit + 9 and code != IPROTO_CHUNK
        waiter = kinds[sync]
        assert sync not in pending
        if type(waiter) is ReplySink:
            if waiter.owner is None:
                assert waiter.replies[sync] == (code, schema, payload)
            else:
                assert waiter.owner.replies[sync] == (CHECKED if code == 0
                                                      else (code, schema, payload))
            in_sinks += 1
            continue
        assert type(waiter) is _Caller
        who, reply = got.pop(0)
        assert who is waiter
        taken_by_callers += 1
        raw = type(reply) is _speedups.RawReply
        assert raw == (code == 0 and taken_by_callers > defer_after), (code, reply)
        if raw:
            reply = cutter.finish(reply)
        expected = decoded(payload, code)
        if code or type(expected) is not dict:
            expected = (sync, code, schema, expected, None)
        else:
            expected = protocol.ok_response(None, sync, schema, expected)
        assert comparable(reply) == comparable(expected), (reply, expected)
        if code >= 0x8000:
            c, python = error_decoded(payload, c=True), error_decoded(payload)
            assert comparable(c) == comparable(python), (payload, c, python)
    assert not got
    assert stored + len(wake) == in_sinks


# -- encoder ---------------------------------------------------------------------

class _Other:
    pass


def random_object(rng, depth=0):
    kind = rng.randrange(14 if depth < 4 else 9)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice((rng.randrange(-1 << 64, 1 << 65), rng.randrange(-40, 300),
                           rng.choice((2**63, 2**64 - 1, 2**64, -2**63, -2**63 - 1))))
    if kind == 3:
        return rng.choice((rng.uniform(-1e300, 1e300), float("nan"), float("inf"), -0.0))
    if kind == 4:
        return "".join(chr(rng.choice((rng.randrange(32, 127), rng.randrange(0x80, 0x10ffff))))
                       for _ in range(rng.choice((rng.randrange(40), rng.randrange(70000)
                                                  if rng.random() < 0.02 else 3))))
    if kind == 5:
        return rng.randbytes(rng.choice((rng.randrange(40), 255, 256, 65536)))
    if kind == 6:
        return rng.choice(("\ud800x", bytearray(b"ba"), _Other(), 1j, {1, 2}))
    if kind in (7, 8):
        return rng.randrange(1 << 20)
    items = [random_object(rng, depth + 1) for _ in range(rng.choice((rng.randrange(8), 16)))]
    if kind in (9, 10):
        return items
    if kind == 11:
        return tuple(items)
    keys = [random_object(rng, 4) for _ in items]
    try:
        return dict(zip(keys, items))
    except TypeError:   # an unhashable key
        return {}


def _outcome(function, *args):
    try:
        return function(*args)
    except Exception as exc:  # noqa: BLE001 - the failure is the outcome
        return type(exc), str(exc)


def fuzz_encoder(rng, case):
    use_bin_type = rng.random() < 0.5
    packer = msgpack.Packer(use_bin_type=use_bin_type,
                            default=(lambda obj: "hooked") if rng.random() < 0.5 else None)
    join = _encoder.BodyEncoder(packer.pack, use_bin_type).join
    parts = []
    for i in range(rng.choice((1, 2, 2, 4, 5, 8))):
        parts.append(rng.randbytes(rng.randrange(6)) if i % 2 == 0 else random_object(rng))
    expected = _outcome(lambda: b"".join(packer.pack(p) if i % 2 else p
                                         for i, p in enumerate(parts)))
    got = _outcome(join, *parts)
    assert got == expected, (parts, got, expected)


def fuzz_batch(rng, case):
    """``BodyEncoder.encode_batch`` against its Python twin (``protocol.bulk``)."""
    from gtarantool.protocol.bulk import encode_batch

    use_bin_type = rng.random() < 0.5
    packer = msgpack.Packer(use_bin_type=use_bin_type,
                            default=(lambda obj: "hooked") if rng.random() < 0.5 else None)
    c_batch = _encoder.BodyEncoder(packer.pack, use_bin_type).encode_batch
    rows = []
    for _ in range(rng.choice((0, 1, 3, 20))):
        row = [random_object(rng, 2) for _ in range(rng.randrange(6))]
        rows.append(tuple(row) if rng.random() < 0.7 else row if rng.random() < 0.9
                    else random_object(rng))
    upsert = rng.random() < 0.3
    assign = [rng.randrange(8) for _ in range(rng.randrange(4))] if upsert else ()
    args = (rng.choice((2, 3, 9, 127, 128)), rng.randbytes(rng.randrange(8)), rows,
            rng.choice((0, 1 << 32, 2**64 - len(rows), 2**64 - 1)),
            rng.randbytes(rng.randrange(3)) if upsert else None, assign)
    expected = _outcome(encode_batch, packer.pack, *args)
    got = _outcome(c_batch, *args)
    assert got == expected, (args, got, expected)
    # with gather: the long fields' contents written from the rows, the same bytes
    gather = rng.choice((1, 2, 8, 40, 1 << 20))
    got = _outcome(c_batch, *args, bytearray(), gather)
    if type(got) is _encoder.Gather:
        wire = got.tobytes() if rng.random() < 0.8 else written(got)[0]
        assert wire == expected, (args, gather)
    else:
        assert got == expected or bytes(got) == expected, (args, gather, got)


def written(batch):
    """(what a Gather writes through a socket that takes a few KiB at a time,
    how many of its writes wrote something)."""
    import socket

    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        ours.setblocking(False)
        theirs.setblocking(False)
        got, writes = [], 0
        while len(batch):
            try:
                writes += batch.write(ours.fileno()) > 0
            except BlockingIOError:
                pass
            try:
                while True:
                    got.append(theirs.recv(1 << 16))
            except BlockingIOError:
                pass
        assert batch.write(ours.fileno()) == 0   # (nothing left)
    return b"".join(got), writes


# -- convert_lines / convert_records: rows from text by a plan ---------------------

TEXTS = ["0", "7", "-3", "+5", " 5", "5 ", "1_0", "0007", "-0", "-", "18446744073709551615",
         "18446744073709551616", "-9223372036854775808", "-9223372036854775809",
         "99999999999999999999999", "1.5", "-.5e3", "5.", "1.0", "1e400", "1e-400", "e5", "1e",
         ".", "+", "nan", "inf", "Infinity", "", "true", "FALSE", "Yes", "oFf", "y", "t\x00",
         "truee", "é", "\u0663", "abc", "NULL", "\\N", "x" * 80, "1" * 70, "1." + "5" * 70]
CALLS = [str.upper, int, float, lambda t: 1 / len(t), lambda t: [t]]


def convert_case(rng):
    """Random arguments of ``convert_lines`` (text) and ``convert_records`` (lists)."""
    ncols = rng.choice((0, 1, 1, 2, 3, 5))
    width = ncols + rng.choice((0, 0, 1, 3))
    slots = rng.sample(range(width), ncols)
    plan = []
    for slot in slots:
        kind = rng.randrange(7)
        plan.append((slot, kind, rng.random() < 0.3,
                     rng.choice(CALLS) if kind == 6 or rng.random() < 0.1 else None))
    null = rng.choice(("", "", "NULL", "\\N", "é"))
    delimiter = rng.choice((",", ",", "\t", ";", "§"))
    quote = rng.choice(('"', '"', "'", "«"))
    records, lines = [], []
    for _ in range(rng.choice((0, 1, 3, 10, 40))):
        width_k = ncols + rng.choice((0, 0, 0, 0, 1, -1))
        fields = [rng.choice(TEXTS + [null]) for _ in range(width_k)]
        for i in range(len(fields)):
            shape = rng.random()
            if shape < 0.1:      # quoted whole, perhaps around a delimiter
                fields[i] = quote + fields[i] + rng.choice(("", delimiter)) + quote
            elif shape < 0.13:   # a quote inside, doubled, or after the closing one
                fields[i] = rng.choice((fields[i] + quote, quote + quote * 2 + quote,
                                        quote + fields[i] + quote + "x"))
        records.append(fields if rng.random() < 0.95 else rng.choice((None, "x", [1], ())))
        line = delimiter.join(fields).encode()
        noise = rng.random()
        if noise < 0.03:
            line += b"\r"   # a CRLF line end
        elif noise < 0.045:
            line = b"\r" + line + b"\r"   # and one that is not
        elif noise < 0.06:
            line = b"\xff" + line
        elif noise < 0.08:
            line = b""
        elif noise < 0.1:
            line = rng.randbytes(rng.randrange(6)).replace(b"\n", b"")
        lines.append(line)
    data = b"\n".join(lines) + (b"\n" if lines and rng.random() < 0.8 else b"")
    n = len(lines) + rng.choice((0, 0, 0, 0, 0, 1, -1))
    return ((data, n, delimiter, quote, null, width, tuple(plan)),
            (records, null, width, tuple(plan)))


def _shown(outcome):
    """An outcome compared by its repr: 1, 1.0 and True differ."""
    return repr(outcome)


def fuzz_convert(rng, case):
    """``_encoder.convert_lines`` and ``convert_records`` against their Python
    twins (``protocol.bulk``)."""
    from gtarantool.protocol import bulk

    lines_args, records_args = convert_case(rng)
    assert _shown(_outcome(_encoder.convert_lines, *lines_args)) == \
        _shown(_outcome(bulk.convert_lines, *lines_args)), lines_args
    assert _shown(_outcome(_encoder.convert_records, *records_args)) == \
        _shown(_outcome(bulk.convert_records, *records_args)), records_args


# -- Transport.feed ------------------------------------------------------------

class _Waiting:
    """A caller's greenlet, as the transport sees one: woken (from the hub), it
    takes its reply from the ready queue."""

    def __init__(self, ready):
        self.ready = ready
        self.got = []

    def switch(self, *value):
        if value:   # the error that failed the connection, handed from the hub
            self.got.append(value[0])
        elif self.ready and self.ready[0][0] is self:
            self.got.append(self.ready.popleft()[1])


class _Conn:
    error = True   # error replies raise, as on a connection


def _run_feed(data, waiters, pieces, c_paths, abandoned, through_socket=False):
    """Feed ``data`` in ``pieces`` to a transport whose callers and sink wait for
    ``waiters``: ({sync: what it got}, {sync: sink's reply}, whether it failed).
    ``through_socket``: written to its socket instead, for the read watcher's
    callback (the lone reply's path) and the reader to receive."""
    saved = compiled.speedups
    if not c_paths:   # for the whole run: a transport reads them as it goes (process_token)
        compiled.speedups = None
    try:
        return _feed(data, waiters, pieces, c_paths, abandoned, through_socket)
    finally:
        compiled.speedups = saved


def _feed(data, waiters, pieces, c_paths, abandoned, through_socket):
    a, b = socket.socketpair()
    t = Transport(gsocket.socket(fileno=os.dup(a.fileno())), Stats(), 1000, LIMIT)
    sender = gsocket.socket(fileno=os.dup(b.fileno()))
    try:
        callers = {}
        sink = ReplySink()
        checking = ReplySink(sink)
        for sync, kind in waiters:
            if kind in ("sink", "checked"):
                t._pending[sync] = sink if kind == "sink" else checking
                sink.outstanding += 1
                sink.syncs.append(sync)
            else:
                t._pending[sync] = callers[sync] = _Waiting(t._ready)
        for sync in abandoned:
            t._pending[sync] = _Waiting(t._ready)
            t.abandon(sync)
        failed = False
        at = 0
        for size in pieces:
            if through_socket:   # (a gevent socket: the reader runs while it waits for room)
                sender.sendall(data[at:at + size])
                at += size
                gevent.idle()   # the reader receives what is there
                continue
            try:
                t.feed(data[at:at + size])
            except ProtocolError as exc:
                failed = True
                t._fail(exc)
                break
            at += size
            gevent.sleep(0)
        if through_socket:
            with gevent.Timeout(5):   # until the reader took it all, or failed
                while t.alive and t.stats.bytes_in < len(data):
                    gevent.sleep(0.001)
            failed = not t.alive
        gevent.sleep(0)
        got = {sync: [comparable(r) for r in w.got] for sync, w in callers.items()}
        # (bytes from the C reader, a bytearray's slices from the Python one)
        stored = {sync: comparable(r) if isinstance(r, BaseException) else r[:2] + (bytes(r[2]),)
                  for sync, r in sink.replies.items()}
        answered = [sync for sync in sink.syncs if sync in sink.replies]
        if answered and not failed:
            for sync, reply in zip(answered, protocol.responses(
                    _Conn(), BodyDecoder(), answered, sink.replies, fast=c_paths)):
                got[sync] = [comparable(reply)]
        return got, stored, failed
    finally:
        t.close()
        sender.close()
        a.close()
        b.close()


def reference_feed(data, waiters, abandoned):
    """What _run_feed must give for ``data``, from reference_frames."""
    frames, tail = reference_frames(data, LIMIT)
    kinds = dict(waiters)
    pending, abandoned = dict(kinds), set(abandoned)
    pushes = collections.defaultdict(list)
    finals = {}
    failed = tail == "error"
    for start, stop, sync, code, schema, payload in frames:
        if sync in pending:
            if code == IPROTO_CHUNK:
                pushes[sync].append((code, schema, payload))
                continue
            finals[sync] = (code, schema, payload)
            del pending[sync]
        elif sync in abandoned:
            if code != IPROTO_CHUNK:
                abandoned.discard(sync)
        else:
            failed = True   # a reply or push for no request
            break
    got, stored = {}, {}
    for sync, (code, schema, payload) in finals.items():
        if kinds[sync] == "checked" and code == 0:
            stored[sync] = CHECKED
        elif kinds[sync] in ("sink", "checked"):
            stored[sync] = (code, schema, payload)
        else:
            body = decoded(payload, code)
            extra = pushes[sync] and [(c, s, decoded(b)) for c, s, b in pushes[sync]]
            got[sync] = [comparable((sync, code, schema, body, extra or None))]
    return got, stored, failed


def fuzz_feed(rng, case, through_socket=False):
    data, waiters = stream(rng)
    abandoned = []
    if waiters and rng.random() < 0.2:   # a caller gave up: its reply is discarded
        abandoned.append(waiters.pop(rng.randrange(len(waiters)))[0])
    pieces, left = [], len(data)
    if through_socket and rng.random() < 0.5:   # a frame at a time: lone replies
        ends = [stop for _, stop, *_ in reference_frames(data, LIMIT)[0]]
        pieces = [stop - start for start, stop in zip([0] + ends, ends)]
        left -= sum(pieces)
    while left > 0:
        pieces.append(min(left, rng.choice((1, 3, 17, 64, 500, 1 << 20))))
        left -= pieces[-1]
    c = _run_feed(data, waiters, pieces, True, abandoned, through_socket)
    python = _run_feed(data, waiters, pieces, False, abandoned, through_socket)
    assert c == python, (data, waiters, c, python)
    got, stored, failed = reference_feed(data, waiters, abandoned)
    assert c[2] == failed, ("failed" if failed else "did not fail", data)
    assert {s: r for s, r in c[1].items()} == stored or failed, (c[1], stored)
    for sync, replies in got.items():
        assert c[0][sync] == replies, (sync, c[0][sync], replies)


def fuzz_read(rng, case):
    fuzz_feed(rng, case, through_socket=True)


TARGETS = {"cutter": fuzz_cutter, "encoder": fuzz_encoder, "batch": fuzz_batch,
           "convert": fuzz_convert, "feed": fuzz_feed, "read": fuzz_read}


def run(target, seconds, seed):
    rng = random.Random("%s-%d" % (target, seed))
    fn = TARGETS[target]
    deadline = time.monotonic() + seconds
    case = 0
    while time.monotonic() < deadline:
        try:
            fn(rng, case)
        except AssertionError:
            print("fuzz %s: mismatch at case %d (--seed %d)" % (target, case, seed),
                  file=sys.stderr)
            raise
        case += 1
    return case


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("targets", nargs="*", metavar="TARGET",
                        help="some of %s (default: all)" % ", ".join(TARGETS))
    parser.add_argument("--seconds", type=float, default=60,
                        help="in all, shared by the targets (default %(default)s)")
    parser.add_argument("--seed", type=int, default=1, help="(default %(default)s)")
    args = parser.parse_args(argv)
    args.targets = args.targets or list(TARGETS)
    for target in args.targets:
        if target not in TARGETS:
            parser.error("unknown target %r" % target)
    if _speedups is None or _encoder is None:
        parser.error("gtarantool._speedups and _encoder are not built")
    for target in args.targets:
        cases = run(target, args.seconds / len(args.targets), args.seed)
        print("fuzz %s: %d cases, seed %d, no mismatch" % (target, cases, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
