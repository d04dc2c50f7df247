"""Response objects: tarantool-python's ``Response`` classes (their fields in
slots), filled exactly as ``Response.__init__`` fills them, from a reply's
header fields and body (``make_response``, ``ok_response``, a pipeline's
``responses``); ``LazyDatabaseError`` and ``ErrorReply`` for error replies.
"""
import operator
from typing import TYPE_CHECKING

import msgpack
from tarantool import response as tarantool_response
from tarantool.error import DatabaseError, SchemaReloadException

from gtarantool import compiled
from gtarantool.errors import ProtocolError, refused
from gtarantool.protocol.codec import box_error, error_body
from gtarantool.protocol.constants import (
    ER_WRONG_SCHEMA_VERSION,
    IPROTO_DATA,
    IPROTO_ERROR_24,
    IPROTO_POSITION,
    REQUEST_TYPE_ERROR,
)


class ResponseFields:
    """A response's fields, the names tarantool-python's ``Response`` gives
    them: the Python twin of ``_speedups.ResponseCore``, whose C paths set
    them as struct fields.  The response classes derive from the C type when
    the package was built with a compiler, from this class otherwise (chosen
    once, here, at import); other attributes go to the instance dictionary.
    ``_size``: the reply's bytes on the wire, set by the reader on the OK
    replies it builds (nearly every reply; unset otherwise).  ``data``:
    ``_data``, read-only (tarantool-python's property)."""
    __slots__ = ("conn", "_sync", "_code", "_body", "_schema_version", "_return_code",
                 "_data", "_size")

    data = property(operator.attrgetter("_data"), doc=tarantool_response.Response.data.__doc__)


if TYPE_CHECKING:   # (the checker reads the twin: the C module's stub is untyped)
    _Fields = ResponseFields
else:
    _Fields = compiled.speedups.ResponseCore if compiled.speedups is not None else ResponseFields


class Response(_Fields, tarantool_response.Response):
    """tarantool-python's ``Response``, its fields in slots (cheaper to build than a dict)."""
    __slots__ = ()

    @property
    def position(self):
        """After ``select(..., fetch_pos=True)``: the position after the last
        tuple returned (bytes, for ``select(..., after=position)``), or None
        when it returned none."""
        position = self._body.get(IPROTO_POSITION)
        return position.encode() if type(position) is str else position


_new_response = Response.__new__


class ResponseExecute(_Fields, tarantool_response.ResponseExecute):
    """tarantool-python's ``ResponseExecute`` (SQL), its fields in slots."""
    __slots__ = ()


class ResponseProtocolVersion(_Fields, tarantool_response.ResponseProtocolVersion):
    """tarantool-python's ``ResponseProtocolVersion``, its fields in slots."""
    __slots__ = ()


# tarantool-python's response classes (a Request's response_class) -> ours.
RESPONSE_CLASSES = {cls.__bases__[-1]: cls
                    for cls in (Response, ResponseExecute, ResponseProtocolVersion)}


def ok_response(conn, sync, schema_version, body, cls=Response, code=0):
    """A reply that is not an error (``code`` below 0x8000: OK, or a push
    message): the reply to nearly every request, built with nothing to check."""
    resp = _new_response(cls)
    resp.conn = conn
    resp._sync = sync
    resp._code = code
    resp._body = body
    resp._schema_version = schema_version
    resp._return_code = 0
    data = resp._data = body.get(IPROTO_DATA)
    if data is not None and type(data) is not list and not isinstance(data, (list, tuple)):
        resp._data = [data]
    return resp


def responses(conn, decoder, syncs, replies, fast=True, code_of=None):
    """The replies to ``syncs``, in order, as response objects (a pipeline's).

    ``replies`` maps each sync to ``(code, schema version, body bytes)`` or to
    the exception that request failed with.  Each becomes a Response, or the
    exception it raises (an error reply, a body that does not decode).
    Bodies are decoded here, as ``decoder.decode`` would, without a call each
    (an error's when it is read: see ``make_response``).
    ``code_of(sync)``: the request's type (or None), which classes the
    ``DatabaseError`` of an error reply (``errors.refused``).
    (``decoder`` is None when nothing ever connected: then there is no reply.)"""
    options = decoder and decoder.options
    speedups = compiled.speedups
    if fast and speedups is not None and options is not None:   # OK replies in C, others here
        return speedups.responses(conn, syncs, replies, msgpack.unpackb, options, Response,
                                  lambda sync, value: responses(conn, decoder, [sync],
                                                                {sync: value}, False,
                                                                code_of)[0])
    use_list, raw, ext_hook = options or (None, None, None)
    unpackb = msgpack.unpackb
    out = []
    append = out.append
    for sync in syncs:
        value = replies[sync]
        if type(value) is tuple:
            code, schema, body = value
            if code < REQUEST_TYPE_ERROR:
                try:
                    if ext_hook is None or not body:   # another unpacker factory, or empty
                        body = decoder.decode(body)
                    else:
                        body = unpackb(body, use_list=use_list, raw=raw, strict_map_key=False,
                                       ext_hook=ext_hook)
                except Exception as exc:  # noqa: BLE001 - make_response judges it
                    body = exc.with_traceback(None)
            try:
                if code or type(body) is not dict:
                    value = make_response(Response, conn, sync, code, schema, body)
                else:
                    value = ok_response(conn, sync, schema, body)
            except Exception as exc:  # noqa: BLE001 - returned in its place
                value = exc.with_traceback(None)
                if code >= REQUEST_TYPE_ERROR and code_of is not None \
                        and isinstance(value, DatabaseError):
                    refused(value, code_of(sync))
        append(value)
    return out



def make_response(cls, conn, sync, code, schema_version, body):
    """Build ``cls`` (one of the response classes above) from a reply's header
    fields and body, raising what ``Response.__init__`` raises.  ``body``: the
    decoded body, where an exception (decoding failed) is raised and anything
    but a map raises ProtocolError; an error reply's may be its bytes (decoded
    here, or when first read for a connection with ``lazy_errors``)."""
    if code >= REQUEST_TYPE_ERROR:
        return_code = code & (REQUEST_TYPE_ERROR - 1)
        if conn.error and return_code != ER_WRONG_SCHEMA_VERSION and conn.lazy_errors:
            raise LazyDatabaseError(return_code, sync, body, conn._decoder)
        body = error_body(conn._decoder, sync, body)
        message = body.get(IPROTO_ERROR_24, "")
        if return_code == ER_WRONG_SCHEMA_VERSION:
            raise SchemaReloadException(message, schema_version)
        if conn.error:   # (the usual case: no response object to build)
            raise DatabaseError(return_code, message, extra_info=box_error(body))
        return error_response(cls, conn, sync, code, schema_version, body, message,
                              box_error(body))
    if type(body) is not dict:
        if isinstance(body, Exception):
            raise body
        raise ProtocolError("the body of reply %d is a %s, not a map"
                            % (sync, type(body).__name__))
    return ok_response(conn, sync, schema_version, body, cls, code)



class LazyDatabaseError(DatabaseError):
    """The ``DatabaseError`` an error reply raises, its body decoded when first
    needed (``message``, ``extra_info``, ``args``, ``str()``, pickling).

    Most callers tell errors apart by ``code`` and never read the message,
    which since 2.10 quotes tuples (a duplicate key's reply is ~10 KB with
    its error stack, escaped byte by byte: most of that request's cost on
    3.x).  Raised by connections opened with ``lazy_errors=True``.  Once
    decoded the object becomes a plain ``DatabaseError`` (its class is
    switched).  A body that does not decode makes a message that says so,
    never an error when the message is read."""

    __slots__ = ()

    def __init__(self, code, sync, body, decoder):   # (not DatabaseError's: nothing decoded yet)
        self.code = code
        self._reply = (sync, body, decoder)

    def _load(self):
        if type(self) is LazyDatabaseError:
            sync, body, decoder = self.__dict__.pop("_reply")
            try:
                body = error_body(decoder, sync, body)
            except Exception as exc:  # noqa: BLE001 - a hostile reply: said, not raised
                body = {IPROTO_ERROR_24: "the error reply's body does not decode: %r" % (exc,)}
            self.__class__ = DatabaseError
            DatabaseError.__init__(self, self.code, body.get(IPROTO_ERROR_24, ""),
                                   extra_info=box_error(body))
        return self

    def __str__(self):
        return str(self._load())

    def __repr__(self):
        return repr(self._load())

    def __reduce_ex__(self, protocol):
        return self._load().__reduce_ex__(protocol)


def _decoded_attribute(name):
    def get(self):
        return getattr(self._load(), name)

    def set_(self, value):
        setattr(self._load(), name, value)
    return property(get, set_)


for _name in ("message", "extra_info", "args"):
    setattr(LazyDatabaseError, _name, _decoded_attribute(_name))
del _name


def error_response(cls, conn, sync, code, schema_version, body, message, error):
    """An error reply as a response object, as tarantool-python builds one for a
    connection with ``error=False``: ``return_code`` the error's code (``code``
    without the error flag), ``return_message``, no data."""
    resp = cls.__new__(cls)
    resp.conn = conn
    resp._sync = sync
    resp._code = code
    resp._body = body
    resp._schema_version = schema_version
    resp._return_code = code & (REQUEST_TYPE_ERROR - 1)
    resp._return_message = message
    resp._return_error = error
    resp._data = []
    return resp


class ErrorReply(Response):
    """A ``DatabaseError`` as the response tarantool-python returns for its reply
    with ``error=False`` (``return_code``, ``return_message``, no data; the
    sync, schema version and body are not kept).  Its message is read from the
    error when asked for: a ``LazyDatabaseError`` stays undecoded until then."""

    __slots__ = ("_error",)

    _return_message = property(lambda self: self._error.message)
    _return_error = property(lambda self: self._error.extra_info)

    def __init__(self, conn, error):
        self.conn = conn
        self._sync = self._schema_version = None
        self._code = REQUEST_TYPE_ERROR | error.code
        self._return_code = error.code
        self._body = {}
        self._data = []
        self._error = error.with_traceback(None)   # (its frames would hold this reply: a cycle)
