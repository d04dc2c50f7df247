"""Request encoding and response building, byte for byte against tarantool-python."""
import copy
import dataclasses
import pickle

import msgpack
import pytest
from tarantool import const
from tarantool import response as tarantool_response
from tarantool.error import DatabaseError, SchemaReloadException
from tarantool.request import (
    RequestDelete,
    RequestInsert,
    RequestSelect,
    RequestUpdate,
    RequestUpsert,
)
from tarantool.types import BoxError, decode_box_error

from gtarantool.protocol import (
    OPS_KEY,
    RESPONSE_CLASSES,
    BodyDecoder,
    Encoder,
    ErrorReply,
    LazyBoxError,
    LazyDatabaseError,
    Response,
    ResponseExecute,
    iterator_code,
    make_response,
)


class _Conn:
    """What tarantool-python's Request and Response read from a connection."""
    encoding = "utf-8"
    use_list = True
    schema = None
    schema_version = 0
    error = True
    lazy_errors = False
    version_id = None
    _decoder = BodyDecoder()

    def _packer_factory(self):
        return msgpack.Packer()

    def _unpacker_factory(self):
        return msgpack.Unpacker(raw=False, strict_map_key=False)

    def generate_sync(self):
        return 7


@pytest.fixture(params=["c", "python"])
def encoder(request):
    """An Encoder whose join is the C one (``_encoder``), or the Python one."""
    return Encoder(msgpack.Packer(), use_bin_type=True if request.param == "c" else None)


def _by_key(prefix, encoder, key):
    """A body as api.py joins it: a SpaceEncoder prefix, then the packed key or tuple."""
    return encoder.join(prefix, key)


def _update(space, key, ops):
    return space.join(space.update_prefix, key, OPS_KEY, ops)


CASES = [
    (lambda e: _by_key(e.space(512).insert_prefix, e, [1, "a", {"b": [1.5, None]}]),
     lambda c: RequestInsert(c, 512, [1, "a", {"b": [1.5, None]}])),
    (lambda e: e.select(512, 1, 10, 100, 5, ["k"]),
     lambda c: RequestSelect(c, 512, 1, ["k"], 10, 100, 5)),
    (lambda e: _by_key(e.space(512).select_prefix, e, ["k"]),
     lambda c: RequestSelect(c, 512, 0, ["k"], 0, 0xffffffff, 0)),
    (lambda e: _update(e.space(600, 1), [3], [("+", 1, 5), ("=", 2, "x")]),
     lambda c: RequestUpdate(c, 600, 1, [3], [("+", 1, 5), ("=", 2, "x")])),
    (lambda e: _update(e.space(600), [3], [("+", 1, 5), ("=", 2, "x")]),
     lambda c: RequestUpdate(c, 600, 0, [3], [("+", 1, 5), ("=", 2, "x")])),
    (lambda e: e.upsert(600, 0, [3, "v"], [("+", 1, 5)]),
     lambda c: RequestUpsert(c, 600, 0, [3, "v"], [("+", 1, 5)])),
    (lambda e: _by_key(e.space(700, 2).delete_prefix, e, [b"\x00bin"]),
     lambda c: RequestDelete(c, 700, 2, [b"\x00bin"])),
    # A scalar key, packed after a prefix that holds its one-element array header.
    (lambda e: _by_key(e.space(512, 3).select_scalar_prefix, e, 1 << 40),
     lambda c: RequestSelect(c, 512, 3, [1 << 40], 0, 0xffffffff, 0)),
    (lambda e: e.join(e.space(600).update_scalar_prefix, "k", OPS_KEY, [("+", 1, 5)]),
     lambda c: RequestUpdate(c, 600, 0, ["k"], [("+", 1, 5)])),
    (lambda e: _by_key(e.space(700, 2).delete_scalar_prefix, e, -7),
     lambda c: RequestDelete(c, 700, 2, [-7])),
]


@pytest.mark.parametrize("ours, theirs", CASES)
def test_bodies_equal_tarantool_python(encoder, ours, theirs):
    # Twice: the second call of a general method comes from the prefix cache.
    assert ours(encoder) == theirs(_Conn())._body
    assert ours(encoder) == theirs(_Conn())._body


def test_prefix_cache_is_bounded(encoder):
    for space in range(Encoder.CACHE_LIMIT * 3):
        encoder.select(space, 0, 0, 1, 0, [1])
        encoder.upsert(space, 0, [1], [])
    assert len(encoder._prefixes) <= Encoder.CACHE_LIMIT


def _reference(cls, header, body):
    raw = msgpack.packb(header) + (msgpack.packb(body) if body is not None else b"")
    return cls(_Conn(), raw)


@pytest.mark.parametrize("body", [
    {const.IPROTO_DATA: [[1, "a"], [2, "b"]]},
    {const.IPROTO_DATA: "scalar"},
    {},
    None,
])
def test_response_equals_tarantool_python(body):
    header = {const.IPROTO_REQUEST_TYPE: 0, const.IPROTO_SYNC: 9, const.IPROTO_SCHEMA_ID: 80}
    theirs = _reference(tarantool_response.Response, header, body)
    ours = make_response(Response, _Conn(), 9, 0, 80, body or {})
    assert isinstance(ours, tarantool_response.Response)
    for name in set(vars(theirs)) - {"conn"}:
        assert getattr(ours, name) == getattr(theirs, name), name
    for name in ("data", "sync", "code", "return_code", "schema_version", "body", "rowcount"):
        assert _attempt(getattr, ours, name) == _attempt(getattr, theirs, name), name
    assert _attempt(str, ours) == _attempt(str, theirs)
    assert _attempt(list, ours) == _attempt(list, theirs)


def _attempt(fn, *args):
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - compared, not hidden
        return type(exc)


def _tarantool_python_response_classes():
    """tarantool-python's Response and every subclass of it that tarantool-python
    defines (ours subclass them too: left out by their module)."""
    found, todo = set(), [tarantool_response.Response]
    while todo:
        cls = todo.pop()
        if cls.__module__.split(".")[0] == "tarantool" and cls not in found:
            found.add(cls)
            todo += cls.__subclasses__()
    return found


def test_every_tarantool_response_class_has_a_counterpart():
    theirs = _tarantool_python_response_classes()
    assert len(theirs) >= 3   # Response, ResponseExecute, ResponseProtocolVersion at least
    assert set(RESPONSE_CLASSES) == theirs
    for cls in theirs:
        ours = RESPONSE_CLASSES[cls]
        assert issubclass(ours, cls) and ours.__name__ == cls.__name__
        assert ours.__module__.split(".")[0] == "gtarantool"


def test_sql_response_class():
    body = {const.IPROTO_SQL_INFO: {const.IPROTO_SQL_INFO_ROW_COUNT: 3}}
    ours = make_response(ResponseExecute, _Conn(), 1, 0, 80, body)
    assert isinstance(ours, ResponseExecute) and ours.affected_row_count == 3


def test_error_response_raises_like_tarantool_python():
    body = {const.IPROTO_ERROR_24: "Duplicate key exists"}
    with pytest.raises(DatabaseError) as theirs:
        _reference(tarantool_response.Response,
                   {const.IPROTO_REQUEST_TYPE: 0x8003, const.IPROTO_SYNC: 1}, body)
    with pytest.raises(DatabaseError) as ours:
        make_response(Response, _Conn(), 1, 0x8003, None, body)
    assert (ours.value.code, ours.value.message) == (theirs.value.code, theirs.value.message)
    with pytest.raises(SchemaReloadException) as reload:
        make_response(Response, _Conn(), 1, 0x8000 | 109, 81, {const.IPROTO_ERROR_24: "x"})
    assert reload.value.schema_version == 81


_STACK = {0: [{0: "ClientError", 1: "index.cc", 2: 333, 3: "Duplicate key exists", 4: 0,
               5: 3, 6: {"space": "bench"}},
              {0: "CustomError", 1: "init.lua", 2: 7, 3: "cause", 4: 0, 5: 32}]}


def test_an_error_stack_is_decoded_when_first_used():
    """``extra_info`` equals tarantool-python's ``BoxError`` and becomes one once
    read; a stack nobody reads is never decoded, so a malformed one fails only
    its reader."""
    body = {const.IPROTO_ERROR_24: "Duplicate key exists", const.IPROTO_ERROR: _STACK}
    with pytest.raises(DatabaseError) as theirs:
        _reference(tarantool_response.Response, {const.IPROTO_REQUEST_TYPE: 0x8003,
                                                 const.IPROTO_SYNC: 1}, body)
    with pytest.raises(DatabaseError) as ours:
        make_response(Response, _Conn(), 1, 0x8003, None, body)
    lazy = ours.value.extra_info
    assert isinstance(lazy, BoxError) and type(lazy) is LazyBoxError
    assert lazy == theirs.value.extra_info and repr(lazy) == repr(theirs.value.extra_info)
    assert type(lazy) is BoxError and lazy.prev.type == "CustomError"
    for use in (lambda e: e.fields, lambda e: pickle.loads(pickle.dumps(e)), copy.copy,
                dataclasses.asdict, repr):
        assert use(LazyBoxError(_STACK)) == use(decode_box_error(_STACK))
    changed = LazyBoxError(_STACK)
    changed.line = 1
    assert changed == dataclasses.replace(decode_box_error(_STACK), line=1)
    with pytest.raises(DatabaseError) as malformed:
        make_response(Response, _Conn(), 1, 0x8003, None, {const.IPROTO_ERROR: {0: [{}]}})
    with pytest.raises(KeyError):
        malformed.value.extra_info.type
    # An empty stack is no BoxError, as tarantool-python's is None (not one
    # that fails whoever reads it).
    empty = {const.IPROTO_ERROR_24: "m", const.IPROTO_ERROR: {0: []}}
    with pytest.raises(DatabaseError) as theirs:
        _reference(tarantool_response.Response, {const.IPROTO_REQUEST_TYPE: 0x8003,
                                                 const.IPROTO_SYNC: 1}, empty)
    assert theirs.value.extra_info is None
    assert _raised(_Conn(), 0x8003, empty).extra_info is None
    assert _raised(_LazyConn(), 0x8003, msgpack.packb(empty)).extra_info is None


class _LazyConn(_Conn):
    lazy_errors = True


def _raised(conn, code, body):
    with pytest.raises(DatabaseError) as info:
        make_response(Response, conn, 1, code, None, body)
    return info.value


def test_a_lazy_error_is_decoded_when_first_read():
    """With ``lazy_errors`` an error reply's body stays bytes until the error is
    read; then the error is the plain ``DatabaseError`` an eager connection
    raises (args, message, extra_info, str, repr, pickle), whichever is read
    first.  A body that does not decode says so in the message."""
    raw = b'Duplicate key exists ... [1, "\xff\xfe"]'
    body = msgpack.packb({const.IPROTO_ERROR_24: raw, const.IPROTO_ERROR: _STACK},
                         use_bin_type=False)
    eager = _raised(_Conn(), 0x8003, body)
    assert type(eager) is DatabaseError and "\\xff\\xfe" in eager.message
    reads = {"args": lambda e: e.args, "message": lambda e: e.message,
             "extra_info": lambda e: e.extra_info, "str": str, "repr": repr,
             "pickle": lambda e: pickle.loads(pickle.dumps(e)).args,
             "copy": lambda e: copy.copy(e).message}
    for name, read in reads.items():
        lazy = _raised(_LazyConn(), 0x8003, body)
        assert type(lazy) is LazyDatabaseError and lazy.code == 3, name
        assert "_reply" in lazy.__dict__, name        # nothing decoded yet
        assert read(lazy) == read(eager), name
        assert type(lazy) is DatabaseError, name
        assert (lazy.args, lazy.message, lazy.extra_info) == (
            eager.args, eager.message, eager.extra_info), name
        assert lazy.__dict__.keys() == eager.__dict__.keys(), name
    # Schema reloads are never lazy: the connection retries at once.
    with pytest.raises(SchemaReloadException):
        make_response(Response, _LazyConn(), 1, 0x8000 | 109, 5,
                      msgpack.packb({const.IPROTO_ERROR_24: "Wrong schema version"}))
    for garbage in (b"\x81\x31", b"\x93\x01\x02\x03", msgpack.packb({0x31: "x"}) + b"\x00"):
        broken = _raised(_LazyConn(), 0x8003, garbage)
        assert "does not decode" in broken.message and broken.code == 3
        assert broken.extra_info is None and str(broken) == str((3, broken.message))
    reply = ErrorReply(None, _raised(_LazyConn(), 0x8003, body))
    assert (reply.return_code, reply.data, reply.body) == (3, [], {})
    assert reply.return_message == eager.message and reply._return_error == eager.extra_info


def test_iterator_names():
    assert iterator_code("GE") == const.ITERATOR_GE
    assert iterator_code("le") == const.ITERATOR_LE
    assert iterator_code(const.ITERATOR_GT) == const.ITERATOR_GT
    with pytest.raises(ValueError):
        iterator_code("SIDEWAYS")


def test_an_error_message_that_is_not_utf8():
    """Since 2.10 a message quotes tuples, bytes fields as they are: our
    decoder escapes them (BodyDecoder.decode(..., error=True)); a body
    another unpacker factory failed on (UnicodeDecodeError) still gives
    the server's error, the failed string as the message, escaped alike."""
    raw = b'Duplicate key exists ... [1, "\xff\xfe"]'
    body = b"\x81\x31\xda" + len(raw).to_bytes(2, "big") + raw
    escaped = raw.decode("utf-8", "backslashreplace")
    assert BodyDecoder().decode(body, error=True) == {0x31: escaped}
    with pytest.raises(UnicodeDecodeError) as failed:
        BodyDecoder().decode(body)
    with pytest.raises(DatabaseError) as info:
        make_response(Response, _Conn(), 7, 0x8003, 1, failed.value)
    assert (info.value.code, info.value.message) == (3, escaped)
