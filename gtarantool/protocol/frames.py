"""IPROTO framing: the length prefix and header of the requests the connector
sends, and the reading of a reply's length prefix and header.

A request is ``0xce len32 | {0: code, 1: 0xcf sync64, 5: 0xce schema32}`` and
its body (plus ``0x0a: 0xcf stream id`` in a stream); ``REQUEST_HEADER`` packs
the plain layout in one call (the C request path writes the same bytes).
``reply_header`` reads a reply's header in any layout without msgpack;
``parse_header`` is the general (slow) path, which raises ``ProtocolError``.
"""
import struct

import msgpack

from gtarantool.errors import ProtocolError
from gtarantool.protocol.constants import (
    IPROTO_REQUEST_TYPE,
    IPROTO_SCHEMA_ID,
    IPROTO_SYNC,
)

# 0xce len32 | {0: code, 1: 0xcf sync64, 5: 0xce schema32}; the marker bytes
# are packed in pairs (0x83 0x00, ...) and every request code is a positive fixint.
REQUEST_HEADER = struct.Struct(">BIHBHQHI")
REQUEST_HEADER_LEN = REQUEST_HEADER.size - 5   # the header's bytes after the length prefix
# The same with 0x0a: 0xcf stream id
_STREAM_HEADER = struct.Struct(">BIBBBBBQBBIBBQ")
_STREAM_HEADER_LEN = _STREAM_HEADER.size - 5

# uint32 length, then {0: uint32 code, 1: uint64 sync, 5: uint64 schema
# version}: how Tarantool 2.10+ writes every reply; reply_header reads any
# other layout (up to 2.9 the schema version is a uint32) field by field.
REPLY_FRAME_64 = struct.Struct(">BIBHIHQHQ")

_UINT_SIZES = {0xcc: 1, 0xcd: 2, 0xce: 4, 0xcf: 8}
_HEADER_KEYS = (IPROTO_REQUEST_TYPE, IPROTO_SYNC, IPROTO_SCHEMA_ID)


def request_header(code, sync, schema_version, length, stream_id=0):
    """The length prefix and header of a request whose body is ``length`` bytes.

    :param code: the request type.
    :param sync: the request's sync (uint64).
    :param schema_version: the schema version the request was built for (uint32).
    :param length: the body's size in bytes.
    :param stream_id: the stream (uint64); 0 sends no stream id.
    :returns: bytes, to be followed by the body."""
    if stream_id:
        return _STREAM_HEADER.pack(0xce, _STREAM_HEADER_LEN + length, 0x84, 0, code, 0x01, 0xcf,
                                   sync, 0x05, 0xce, schema_version, 0x0a, 0xcf, stream_id)
    return REQUEST_HEADER.pack(0xce, REQUEST_HEADER_LEN + length, 0x8300, code, 0x01cf, sync,
                               0x05ce, schema_version)


def notice_frame(code, sync, body):
    """A whole frame with a header of only the code and the sync (IPROTO_WATCH,
    IPROTO_UNWATCH: requests that get no reply).

    :param body: the packed body.
    :returns: bytes."""
    header = msgpack.packb({IPROTO_REQUEST_TYPE: code, IPROTO_SYNC: sync})
    return b"\xce" + struct.pack(">I", len(header) + len(body)) + header + body


def slow_prefix(data, pos, end):
    """A length prefix in any msgpack uint encoding: (length, body start), or
    (None, None) when more bytes are needed.

    :raises gtarantool.ProtocolError: the byte at ``pos`` starts no uint."""
    first = data[pos]
    if first <= 0x7f:
        return first, pos + 1
    size = _UINT_SIZES.get(first)
    if size is None:
        raise ProtocolError("garbage where a frame length was expected: byte 0x%02x" % first)
    if end - pos < 1 + size:
        return None, None
    return int.from_bytes(data[pos + 1:pos + 1 + size], "big"), pos + 1 + size


def read_uint(data, pos, end):
    """(value, where it ends) of the msgpack uint at ``pos``, any width, or
    (None, pos) when it is something else or not all before ``end``."""
    if pos >= end:
        return None, pos
    first = data[pos]
    if first <= 0x7f:
        return first, pos + 1
    size = _UINT_SIZES.get(first)
    if size is None or end - pos <= size:
        return None, pos
    return int.from_bytes(data[pos + 1:pos + 1 + size], "big"), pos + 1 + size


def reply_header(data, pos, end, limit):
    """The length prefix and header of the reply at ``data[pos:end]``, without
    an Unpacker: ``(body start, frame end, code, sync, schema version)`` when
    its length is within ``limit`` and its header, whole and within the frame,
    is a map of uints to uints holding the code, the sync and the schema version
    once each, in any order and width, other keys skipped (IPROTO_STREAM_ID,
    ... whatever a later server adds); None for anything else, which
    ``parse_header`` parses (and fails on when it is malformed): an
    IPROTO_EVENT's header, which has no schema version, too.  The frame
    itself need not be all here.  (The C cutter's read_header does the same.)"""
    if end - pos >= 32:   # 2.10+'s layout: 2.6's, with the schema version as uint64
        ce, length, m1, m2, code, m3, sync, m4, schema = REPLY_FRAME_64.unpack_from(data, pos)
        if (ce == 0xce and m1 == 0x83 and m2 == 0x00ce and m3 == 0x01cf and m4 == 0x05cf
                and 27 <= length <= limit):
            return pos + 32, pos + 5 + length, code, sync, schema
    length, at = read_uint(data, pos, end)
    if length is None or length > limit:
        return None
    stop = at + length
    end = min(end, stop)   # the header ends within the frame
    if at >= end:
        return None
    first = data[at]
    if 0x80 <= first <= 0x8f:
        count, at = first & 0x0f, at + 1
    elif first == 0xde and end - at >= 3:
        count, at = int.from_bytes(data[at + 1:at + 3], "big"), at + 3
    else:
        return None
    fields = {}
    for _ in range(count):
        key, at = read_uint(data, at, end)
        if key is None:
            return None
        value, at = read_uint(data, at, end)
        if value is None or key in fields:   # (a repeated key: parse_header says which counts)
            return None
        if key in _HEADER_KEYS:
            fields[key] = value
    if len(fields) != 3:
        return None
    return (at, stop, fields[IPROTO_REQUEST_TYPE], fields[IPROTO_SYNC],
            fields[IPROTO_SCHEMA_ID])


def parse_header(data, start, stop):
    """(sync, code, schema version, body bytes) of the frame ``data[start:stop]``.

    :raises gtarantool.ProtocolError: the header does not decode or lacks the
        sync or the code."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(data[start:stop])
    try:
        header = unpacker.unpack()
    except Exception as exc:
        raise ProtocolError("undecodable reply header: %r" % (exc,)) from exc
    if (type(header) is not dict or type(header.get(IPROTO_SYNC)) is not int
            or type(header.get(IPROTO_REQUEST_TYPE)) is not int):
        raise ProtocolError("malformed reply header %r" % (header,))
    return (header[IPROTO_SYNC], header[IPROTO_REQUEST_TYPE], header.get(IPROTO_SCHEMA_ID),
            data[start + unpacker.tell():stop])
