"""Request encoding and response decoding for IPROTO.

tarantool-python builds a ``msgpack.Packer`` per request and an ``Unpacker``
per response; here one packer per connection encodes the body, the fixed
header is laid out with one ``struct`` call, and the reader's already decoded
header is reused, so a response costs one ``unpackb`` of its body.  The
results are tarantool-python's own ``Response`` classes, filled exactly as
``Response.__init__`` fills them.
"""
import struct

import msgpack
from tarantool.const import (
    IPROTO_DATA,
    IPROTO_ERROR,
    IPROTO_ERROR_24,
    IPROTO_REQUEST_TYPE,
    IPROTO_SCHEMA_ID,
    IPROTO_SYNC,
    ITERATOR_ALL,
    ITERATOR_BITSET_ALL_NOT_SET,
    ITERATOR_BITSET_ALL_SET,
    ITERATOR_BITSET_ANY_SET,
    ITERATOR_EQ,
    ITERATOR_GE,
    ITERATOR_GT,
    ITERATOR_LE,
    ITERATOR_LT,
    ITERATOR_NEIGHBOR,
    ITERATOR_OVERLAPS,
    ITERATOR_REQ,
    REQUEST_TYPE_ERROR,
)
from tarantool.error import DatabaseError, SchemaReloadException
from tarantool.types import decode_box_error

# 0xce len32 | fixmap(3) {0: code, 1: 0xcf sync64, 5: 0xce schema32}
_HEADER = struct.Struct(">BIBBBBBQBBI")
_HEADER_LEN = _HEADER.size - 5

ITERATORS = {
    "EQ": ITERATOR_EQ, "REQ": ITERATOR_REQ, "ALL": ITERATOR_ALL,
    "LT": ITERATOR_LT, "LE": ITERATOR_LE, "GE": ITERATOR_GE, "GT": ITERATOR_GT,
    "BITS_ALL_SET": ITERATOR_BITSET_ALL_SET, "BITS_ANY_SET": ITERATOR_BITSET_ANY_SET,
    "BITS_ALL_NOT_SET": ITERATOR_BITSET_ALL_NOT_SET,
    "OVERLAPS": ITERATOR_OVERLAPS, "NEIGHBOR": ITERATOR_NEIGHBOR,
}


def iterator_code(iterator):
    """Iterator name (``"GE"``, case-insensitive) or number -> IPROTO number.

    tarantool-python 1.3 sends names as strings, which Tarantool 2.x rejects.
    """
    if isinstance(iterator, str):
        try:
            return ITERATORS[iterator.upper()]
        except KeyError:
            raise ValueError("unknown iterator %r; expected one of %s"
                             % (iterator, ", ".join(ITERATORS))) from None
    return iterator


def frame(code, sync, schema_id, body):
    """A complete request: length prefix, header and the packed ``body`` bytes."""
    return _HEADER.pack(0xce, _HEADER_LEN + len(body), 0x83, 0x00, code, 0x01, 0xcf, sync,
                        0x05, 0xce, schema_id) + body


def make_response(cls, conn, header, body, unpack):
    """Build ``cls`` (a tarantool ``Response`` class) from a decoded header and
    raw body bytes, raising what ``Response.__init__`` raises."""
    resp = cls.__new__(cls)
    resp.conn = conn
    resp._sync = header.get(IPROTO_SYNC, 0)
    code = resp._code = header[IPROTO_REQUEST_TYPE]
    resp._schema_version = header.get(IPROTO_SCHEMA_ID, None)
    body = resp._body = unpack(body) if body else {}
    if code < REQUEST_TYPE_ERROR:
        resp._return_code = 0
        data = body.get(IPROTO_DATA, None)
        if data is not None and not isinstance(data, (list, tuple)):
            data = [data]
        resp._data = data
        return resp
    resp._return_message = body.get(IPROTO_ERROR_24, "")
    resp._return_code = code & (REQUEST_TYPE_ERROR - 1)
    error_map = body.get(IPROTO_ERROR)
    resp._return_error = decode_box_error(error_map) if error_map is not None else None
    resp._data = []
    if resp._return_code == 109:
        raise SchemaReloadException(resp._return_message, resp._schema_version)
    if conn.error:
        raise DatabaseError(resp._return_code, resp._return_message,
                            extra_info=resp._return_error)
    return resp


def body_unpacker(conn):
    """A function bytes -> object honouring the connection's unpacker options.

    One ``Unpacker`` is reused: decoding never yields to another greenlet.
    """
    unpacker = conn._unpacker_factory()

    def unpack(data):
        nonlocal unpacker
        unpacker.feed(data)
        try:
            return unpacker.unpack()
        except BaseException:
            # Leftover bytes of a failed decode must not poison the next reply.
            unpacker = conn._unpacker_factory()
            raise

    return unpack
