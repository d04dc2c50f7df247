"""Request encoding and response decoding for IPROTO.

tarantool-python builds a ``msgpack.Packer`` per request and an ``Unpacker``
per response; here one packer per connection encodes the body, the fixed
header is laid out with one ``struct`` call, and the reader's already decoded
header is reused, so a response costs one ``unpackb`` of its body.  The
results are tarantool-python's own ``Response`` classes, filled exactly as
``Response.__init__`` fills them.
"""
import struct

from tarantool.const import (
    IPROTO_DATA,
    IPROTO_ERROR,
    IPROTO_ERROR_24,
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


def make_response(cls, conn, sync, code, schema_version, body, unpack):
    """Build ``cls`` (a tarantool ``Response`` class) from a reply's header fields
    and raw body bytes, raising what ``Response.__init__`` raises."""
    body = unpack(body) if body else {}
    resp = cls.__new__(cls)
    if code < REQUEST_TYPE_ERROR:
        data = body.get(IPROTO_DATA, None)
        if data is not None and type(data) is not list and not isinstance(data, (list, tuple)):
            data = [data]
        resp.__dict__ = {"conn": conn, "_sync": sync, "_code": code, "_body": body,
                         "_schema_version": schema_version, "_return_code": 0, "_data": data}
        return resp
    return_code = code & (REQUEST_TYPE_ERROR - 1)
    message = body.get(IPROTO_ERROR_24, "")
    error_map = body.get(IPROTO_ERROR)
    error = decode_box_error(error_map) if error_map is not None else None
    resp.__dict__ = {"conn": conn, "_sync": sync, "_code": code, "_body": body,
                     "_schema_version": schema_version, "_return_code": return_code,
                     "_return_message": message, "_return_error": error, "_data": []}
    if return_code == 109:
        raise SchemaReloadException(message, schema_version)
    if conn.error:
        raise DatabaseError(return_code, message, extra_info=error)
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
