"""Select bodies with pagination (Tarantool 2.11+): IPROTO_AFTER_POSITION or
IPROTO_AFTER_TUPLE, and IPROTO_FETCH_POSITION (the reply's position is read by
``protocol.Response.position``).  Plain selects never come here."""
import sys

from tarantool.utils import wrap_key

from gtarantool import features
from gtarantool.protocol.codec import iterator_code
from gtarantool.protocol.constants import (
    IPROTO_AFTER_POSITION,
    IPROTO_AFTER_TUPLE,
    IPROTO_FETCH_POSITION,
    IPROTO_INDEX_ID,
    IPROTO_ITERATOR,
    IPROTO_KEY,
    IPROTO_LIMIT,
    IPROTO_OFFSET,
    IPROTO_SPACE_ID,
    ITERATOR_ALL,
    ITERATOR_EQ,
)


def select_body(methods, space, key, offset, limit, iterator, after, fetch_pos):
    """The body of a select with pagination; ``methods`` is the connection,
    stream or pipeline whose ``select`` was called."""
    conn = methods._conn
    # A select that connects first (to learn the server's features): one
    # request_timeout for the connect and its request, as a lookup's.
    features.require(conn, features.PAGINATION,
                     None if conn.connected and conn._transport is not None
                     else conn._lookup_started(sys._getframe(1)))
    key = [key] if type(key) in (int, str) else wrap_key(key, select=True)
    if iterator is None:
        iterator = ITERATOR_EQ if key else ITERATOR_ALL
    body = {IPROTO_SPACE_ID: space.space_no, IPROTO_INDEX_ID: space.index_no,
            IPROTO_OFFSET: offset, IPROTO_LIMIT: limit,
            IPROTO_ITERATOR: iterator_code(iterator), IPROTO_KEY: key}
    if fetch_pos:
        body[IPROTO_FETCH_POSITION] = True
    if isinstance(after, (bytes, bytearray, memoryview)):
        try:
            # A position is base64 text, sent as a msgpack str.
            body[IPROTO_AFTER_POSITION] = bytes(after).decode("ascii")
        except UnicodeDecodeError:
            raise ValueError("after=%r is not a position a select returned" % (after,)) from None
    elif isinstance(after, str):
        body[IPROTO_AFTER_POSITION] = after
    elif isinstance(after, (tuple, list)):
        body[IPROTO_AFTER_TUPLE] = list(after)
    elif after is not None:
        raise TypeError("after must be a position (bytes) or a tuple, not %s"
                        % type(after).__name__)
    return methods._encoder.pack(body)
