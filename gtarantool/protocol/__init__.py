"""The IPROTO protocol, apart from any I/O: no gevent, no sockets.

``constants`` (every IPROTO code, key and error code used), ``frames`` (request
headers, reply-header parsing), ``codec`` (request and reply bodies, error
decoding), ``bulk`` (many whole requests in one piece) and ``responses``
(response objects).  The public names are
re-exported here.
"""
from gtarantool.protocol.codec import (
    ERROR_STRINGS,
    ITERATORS,
    NO_LIMIT,
    OPS_KEY,
    BodyDecoder,
    Encoder,
    LazyBoxError,
    SpaceEncoder,
    iterator_code,
)
from gtarantool.protocol.responses import (
    RESPONSE_CLASSES,
    ErrorReply,
    LazyDatabaseError,
    Response,
    ResponseExecute,
    ResponseProtocolVersion,
    make_response,
    ok_response,
    responses,
)

__all__ = [
    "ERROR_STRINGS", "ITERATORS", "NO_LIMIT", "OPS_KEY", "RESPONSE_CLASSES", "BodyDecoder",
    "Encoder", "ErrorReply", "LazyBoxError", "LazyDatabaseError", "Response",
    "ResponseExecute", "ResponseProtocolVersion", "SpaceEncoder", "iterator_code",
    "make_response", "ok_response", "responses",
]
