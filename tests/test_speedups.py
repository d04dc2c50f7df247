"""gtarantool._speedups's body decoder against msgpack.unpackb, the reference.

The reader decodes reply bodies itself and hands anything it does not decode
exactly as ``msgpack.unpackb`` would back to unpackb; these tests feed it
msgpack written with every type byte and every width, then garbage, through
a ``ReplyCutter`` (the way replies reach it) and compare.
"""
import collections
import math
import random
import struct
import types

import msgpack
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gtarantool.compiled import speedups as _speedups
from gtarantool.protocol import ERROR_STRINGS, RESPONSE_CLASSES, Response
from gtarantool.protocol.responses import ResponseFields
from gtarantool.transport import ReplySink, Transport, TransportState, _Pushes
from tests import fuzz
from tests.fakepeer import tarantool_frame


@pytest.fixture(autouse=True)
def _built():
    """These tests fail, not skip, where the extension was not built (as ``reader``'s)."""
    if _speedups is None:
        pytest.fail("gtarantool._speedups is not built (pip install -e . compiles it)")


def _ext_hook(code, data):
    return ("ext", code, data)


def _decode(body, use_list=True, raw=False, error=False):
    """What the C reader makes of ``body``: the decoded body, or the exception.
    ``error``: in an error reply, which the reader hands over as its bytes,
    for ``decode_error`` to decode when it is read (strings with escapes)."""
    pending, ready = {7: object()}, collections.deque()
    cutter = _speedups.ReplyCutter(pending, ready, msgpack.unpackb, (use_list, raw, _ext_hook),
                                   Response, ReplySink, _Pushes)
    # Not an OK reply: the body comes back as decoded.
    frame = tarantool_frame(7, body, code=0x8003 if error else 1)
    assert cutter.cut(frame, 0, len(frame), 1 << 31, []) == (len(frame), 0)
    (_, (_, _, _, decoded, _)), = ready
    if not error:
        return decoded
    assert type(decoded) is bytes and decoded == body
    try:
        return _speedups.decode_error(body, msgpack.unpackb, (use_list, raw, _ext_hook))
    except Exception as exc:  # noqa: BLE001 - compared with the reference's
        return exc


def _reference(body, use_list=True, raw=False, error=False):
    """msgpack's decoding, as the Python twin asks for it (protocol.BodyDecoder)."""
    try:
        return msgpack.unpackb(body, use_list=use_list, raw=raw, strict_map_key=False,
                               ext_hook=_ext_hook,
                               unicode_errors=ERROR_STRINGS if error else None)
    except Exception as exc:  # noqa: BLE001 - the reference's failure is the expectation
        return exc


def _same(a, b):
    """Equal, of the same types all the way down (1 == 1.0 == True is not enough)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, BaseException):
        return str(a) == str(b)
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, (list, tuple)):   # (dict items are pairs: NaN keys compare too)
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a.items(), b.items()))
    return a == b


def _check(body, use_list=True, raw=False, error=False):
    got, want = _decode(body, use_list, raw, error), _reference(body, use_list, raw, error)
    assert _same(got, want), (body, got, want)


# -- msgpack with every encoding of each value, not just the shortest ----------

def _uint(draw, n):
    fits = [(fmt, tag) for fmt, tag, top in (("B", 0xcc, 0xff), (">H", 0xcd, 0xffff),
                                              (">I", 0xce, 0xffffffff), (">Q", 0xcf, 1 << 64))
            if n <= top]
    if n < 0x80:
        fits.append(("fix", None))
    fmt, tag = draw(st.sampled_from(fits))
    return bytes([n]) if fmt == "fix" else bytes([tag]) + struct.pack(fmt, n)


def _int(draw, n):
    if n >= 0 and draw(st.booleans()):
        return _uint(draw, n)
    fits = [(fmt, tag) for fmt, tag, low, high in (
        ("b", 0xd0, -128, 127), (">h", 0xd1, -1 << 15, (1 << 15) - 1),
        (">i", 0xd2, -1 << 31, (1 << 31) - 1), (">q", 0xd3, -1 << 63, (1 << 63) - 1))
        if low <= n <= high]
    if -32 <= n < 0:
        fits.append(("fix", None))
    if not fits:
        return _uint(draw, n)
    fmt, tag = draw(st.sampled_from(fits))
    return struct.pack("b", n) if fmt == "fix" else bytes([tag]) + struct.pack(fmt, n)


def _length(draw, n, fix_tag, fix_max, tags):
    """A length prefix: fix_tag + n when it fits, or a tagged uint8/16/32."""
    options = [(tag, fmt) for tag, fmt, top in zip(tags, ("B", ">H", ">I"),
                                                     (0xff, 0xffff, 0xffffffff))
               if tag is not None and n <= top]
    if fix_tag is not None and n <= fix_max:
        options.append((None, None))
    tag, fmt = draw(st.sampled_from(options))
    return bytes([fix_tag | n]) if tag is None else bytes([tag]) + struct.pack(fmt, n)


@st.composite
def packed(draw, depth=0):
    """One msgpack object, as bytes, in any of its valid encodings."""
    kinds = ["nil", "bool", "int", "float32", "float64", "str", "bin", "ext"]
    if depth < 3:
        kinds += ["array", "map"]
    kind = draw(st.sampled_from(kinds))
    if kind == "nil":
        return b"\xc0"
    if kind == "bool":
        return draw(st.sampled_from([b"\xc2", b"\xc3"]))
    if kind == "int":
        return _int(draw, draw(st.integers(-1 << 63, (1 << 64) - 1)))
    if kind == "float32":
        return b"\xca" + struct.pack(">f", draw(st.floats(width=32)))
    if kind == "float64":
        return b"\xcb" + struct.pack(">d", draw(st.floats()))
    if kind == "str":
        data = draw(st.text(max_size=40)).encode("utf-8") if draw(st.booleans()) else \
            draw(st.binary(max_size=40))   # not always valid UTF-8
        return _length(draw, len(data), 0xa0, 31, (0xd9, 0xda, 0xdb)) + data
    if kind == "bin":
        data = draw(st.binary(max_size=40))
        return _length(draw, len(data), None, 0, (0xc4, 0xc5, 0xc6)) + data
    if kind == "ext":
        data = draw(st.binary(min_size=1, max_size=20))
        fixed = {1: 0xd4, 2: 0xd5, 4: 0xd6, 8: 0xd7, 16: 0xd8}
        prefix = (bytes([fixed[len(data)]]) if len(data) in fixed and draw(st.booleans())
                  else _length(draw, len(data), None, 0, (0xc7, 0xc8, 0xc9)))
        return prefix + struct.pack("b", draw(st.integers(-128, 127))) + data
    items = draw(st.lists(packed(depth + 1), max_size=6 if kind == "array" else 8))
    if kind == "map":
        items = items[:len(items) // 2 * 2]
        return _length(draw, len(items) // 2, 0x80, 15, (None, 0xde, 0xdf)) + b"".join(items)
    return _length(draw, len(items), 0x90, 15, (None, 0xdc, 0xdd)) + b"".join(items)


# (too_slow: under ASan drawing the nested encodings is slow; the examples are what count.)
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(packed(), st.booleans(), st.booleans(), st.booleans())
def test_every_encoding_decodes_as_msgpack_does(body, use_list, raw, error):
    _check(body, use_list, raw, error)


@settings(max_examples=400, deadline=None)
@given(packed(), st.data())
def test_cut_truncated_padded_and_corrupted_bodies_fail_as_msgpack_fails(body, data):
    """Whatever the decoder declines goes to unpackb: same value or same error."""
    cut = data.draw(st.integers(0, len(body)))
    _check(body[:cut] or b"\xc1")
    _check(body + data.draw(st.binary(min_size=1, max_size=4)))
    at = data.draw(st.integers(0, len(body) - 1))
    _check(body[:at] + bytes([data.draw(st.integers(0, 255))]) + body[at + 1:])


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=1, max_size=64))
def test_garbage_fails_as_msgpack_fails(body):
    _check(body)


@pytest.mark.parametrize("body", [
    msgpack.packb({0x30: [[1, "x" * 1536, b"\x00" * 300, -1.5, None, True]]}),  # a select's
    b"\x81\xa1k" + b"\x91" * 300 + b"\xc0",     # nested deeper than the decoder goes
    b"\x81\xa1k" + b"\x91" * 2000 + b"\xc0",    # deeper than unpackb allows
    b"\x82\xa1k\x01\xa1k\x02",                  # a repeated key: the last one wins
    b"\x81\x91\x01\x02",                        # an unhashable key
    b"\xdd\xff\xff\xff\xff\x01",                # a length far beyond the body
    b"\xa3\xff\xfe\xfd",                        # invalid UTF-8
    b"\x81\x00\xc7\x03\x05abc",                 # ext: the hook's value
], ids=["select", "deep", "too-deep", "repeated-key", "list-key", "long-length",
        "bad-utf8", "ext"])
def test_edge_cases(body):
    _check(body)
    _check(body, use_list=False, raw=True)
    _check(body, error=True)


# -- an error reply's strings: invalid UTF-8 decoded with escapes ---------------

# Invalid sequences of every kind the UTF-8 decoder tells apart, and valid
# text of every width (the escaped string is as wide as its widest character).
UTF8_PIECES = [b"\xff", b"\xfe", b"\x80", b"\xbf", b"\xc0\x80", b"\xc2", b"\xe2\x82",
               b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xf0\x9f\x98", b"\xf4\x90\x80\x80",
               b"\xf8\x88\x80\x80\x80", b"\x00", b"a", b"\\", "\u00e9".encode(),
               "\u20ac".encode(), "\U0001f600".encode(), "\udc80".encode("utf-8", "surrogatepass")]


def _str(data):
    """msgpack str holding ``data`` as it is (valid UTF-8 or not)."""
    return (bytes([0xa0 | len(data)]) if len(data) < 32 else
            b"\xd9" + bytes([len(data)]) if len(data) < 256 else
            b"\xda" + struct.pack(">H", len(data))) + data


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(UTF8_PIECES) | st.binary(max_size=6), max_size=40),
       st.booleans())
def test_an_error_replys_strings_decode_with_escapes_as_msgpack_does(pieces, raw):
    """As msgpack.unpackb(..., unicode_errors="backslashreplace"): the message,
    as a map key and in an error stack, ext types beside it (which unpackb
    decodes)."""
    text = _str(b"".join(pieces))
    _check(b"\x81\x31" + text, raw=raw, error=True)
    _check(b"\x82" + text + b"\x01\x52\x81\x00\x91\x82\x03" + text + b"\x05\x03", error=True)
    _check(b"\x82\x31" + text + b"\x32\xd4\x05x", error=True)


def test_a_duplicate_keys_message_from_tarantool_3():
    """ER_TUPLE_FOUND as 3.x writes it: both tuples quoted, a 1.5 KB bytes
    field of random bytes as it is, in the message and the error stack."""
    rng = random.Random(3)
    payload = bytes(rng.getrandbits(8) for _ in range(1536))
    quoted = b'[5, 0, "' + payload + b'"]'
    message = (b'Duplicate key exists in unique index "pk" in space "bench" with old tuple - '
               + quoted + b' and new tuple - ' + quoted)
    tuple_ = msgpack.packb([5, 0, payload], use_bin_type=True)
    stack = (b"\x81\x00\x91\x87\x00" + _str(b"ClientError") + b"\x02\xcd\x01\x4d\x01"
             + _str(b"./src/box/memtx_tree.cc") + b"\x03" + _str(message) + b"\x04\x00\x05\x03"
             + b"\x06\x82" + _str(b"old_tuple") + tuple_ + _str(b"new_tuple") + tuple_)
    body = b"\x82\x31" + _str(message) + b"\x52" + stack
    _check(body, error=True)
    decoded = _decode(body, error=True)
    assert decoded[0x31] == message.decode("utf-8", "backslashreplace")
    assert decoded[0x52][0][0][6]["old_tuple"] == [5, 0, payload]
    assert isinstance(_decode(body), UnicodeDecodeError)   # not an error reply: strict


# -- memory safety: each of these crashed (or failed) under make sanitize before its fix -----

def _frame_for(sync, body=b"\x80"):
    return tarantool_frame(sync, body)


def test_responses_holds_each_reply_while_an_ext_hook_drops_it():
    """protocol.responses in C: decoding a body can run Python (ext_hook) that
    removes that very reply from ``replies`` (its tuple, schema version and
    body bytes); the response is still built from what was there."""
    syncs = [int("1" * 31), int("1" * 31) + 1]   # fresh ints, held by the list only
    body = b"\x81\x30\x92\xd4\x01\x00\xa1x"       # {0x30: [ext(1, b"\0"), "x"]}
    schema = int("9" * 25)
    replies = {syncs[0]: (0, schema, bytes(bytearray(body))), syncs[1]: (0, 1, b"\x80")}
    del schema

    def ext_hook(code, data):
        replies.pop(syncs[0], None)
        return ("ext", code)

    out = _speedups.responses("conn", syncs, replies, msgpack.unpackb, (True, False, ext_hook),
                              Response, lambda sync, value: (sync, value))
    assert [r._data for r in out] == [[("ext", 1), "x"], None]
    assert out[0]._schema_version == int("9" * 25) and out[0].conn == "conn"
    assert [r._sync for r in out] == [int("1" * 31), int("1" * 31) + 1]


def test_responses_goes_through_the_syncs_it_was_given_while_an_ext_hook_clears_them():
    syncs = [int("1" * 31), int("1" * 31) + 1]
    body = b"\x81\x30\x91\xd4\x01\x00"
    replies = {syncs[0]: (0, 1, body), syncs[1]: (0, 2, b"\x81\x30\x91\x07")}

    def ext_hook(code, data):
        syncs.clear()
        return "ext"

    out = _speedups.responses(None, syncs, replies, msgpack.unpackb, (True, False, ext_hook),
                              Response, lambda sync, value: (sync, value))
    assert [(r._sync, r._schema_version, r._data) for r in out] == [
        (int("1" * 31), 1, ["ext"]), (int("1" * 31) + 1, 2, [7])]


@pytest.mark.parametrize("body", [
    {0x30: [[1, "a"]]}, {0x30: []}, {0x30: None}, {0x30: 5}, {0x30: "s"}, {0x30: {"k": 1}},
    {0x30: None, 0x31: 2}, {0x30: [1], 0x31: 2}, {0x31: 2}, {}, {0x30: [b"\xff"]}])
def test_an_ok_replys_data_and_body_are_the_python_specifications(body):
    """An OK reply's response from the C paths (a pipeline's ``responses``, the
    reader's ``cut`` for a caller) holds the data and body that
    ``protocol.responses`` (tarantool-python's rules) gives it: no data is
    None, a lone value is a list of it, the body map is the whole body."""
    from gtarantool.protocol.codec import BodyDecoder
    from gtarantool.protocol.responses import responses
    decoder = BodyDecoder()
    packed = msgpack.packb(body)
    spec = responses(None, decoder, [7], {7: (0, 1, packed)}, fast=False)[0]
    piped = _speedups.responses(None, [7], {7: (0, 1, packed)}, msgpack.unpackb, decoder.options,
                                Response, lambda sync, value: (sync, value))[0]
    ready = collections.deque()
    cutter = _speedups.ReplyCutter({7: "caller"}, ready, msgpack.unpackb, decoder.options,
                                   Response, ReplySink, _Pushes)
    frame = _frame_for(7, packed)
    cutter.cut(frame, 0, len(frame), 1 << 20, [])
    (caller, cut), = ready
    for got in (piped, cut):
        assert (got._data, got.data, got._body) == (spec._data, spec.data, spec._body)
        assert got._body is got.body and type(got._body) is dict
        if got._data is not None and type(body[0x30]) is list:
            assert got._body[0x30] is got._data


@pytest.mark.parametrize("make", [
    lambda: _speedups.Requester.__new__(_speedups.Requester).request(1, 64, 0, b""),
    lambda: _speedups.ReplyCutter.__new__(_speedups.ReplyCutter).cut(
        _frame_for(7), 0, len(_frame_for(7)), 1 << 20, []),
    lambda: _speedups.LoneReader.__new__(_speedups.LoneReader)(),
], ids=["requester", "cutter", "lone-reader"])
def test_objects_never_initialised_raise(make):
    with pytest.raises(TypeError, match="not initialised"):
        make()


def test_objects_are_initialised_once():
    """Their methods keep using their fields across calls into Python: a second
    __init__ (which would replace them meanwhile) is refused."""
    pending, ready = {}, collections.deque()
    args = (pending, ready, msgpack.unpackb, (True, False, None), Response, ReplySink, _Pushes)
    cutter = _speedups.ReplyCutter(*args)
    with pytest.raises(RuntimeError, match="initialised already"):
        cutter.__init__(*args)
    core = _core(_pending={}, _ready=ready, _wbuf=[], _hub=types.SimpleNamespace(switch=None))
    requester_args = (core, None, None, None, 1, 1, cutter)
    requester = _speedups.Requester(*requester_args)
    with pytest.raises(RuntimeError, match="initialised already"):
        requester.__init__(*requester_args)
    with pytest.raises(ValueError, match="flush_every"):
        _speedups.Requester(*requester_args[:-2], 0, None)
    with pytest.raises(TypeError, match="cutter"):
        _speedups.Requester(*requester_args[:-1], object())
    with pytest.raises(TypeError, match="TransportCore"):
        _speedups.Requester(types.SimpleNamespace(), *requester_args[1:])
    with pytest.raises(TypeError, match="must be a dict"):
        _speedups.Requester(_core(_pending=(), _ready=ready, _wbuf=[], _hub=core._hub),
                            *requester_args[1:])
    del core._hub
    with pytest.raises(AttributeError, match="_hub"):
        _speedups.Requester(*requester_args)
    transport = _core(_ready=ready, _queue=collections.deque(), _wbuf=[], stats=None,
                      _reader=None, _hub=None, _fd=0)
    reader = _speedups.LoneReader(transport, None, cutter)
    with pytest.raises(RuntimeError, match="initialised already"):
        reader.__init__(transport, None, cutter)
    with pytest.raises(TypeError, match="no arguments"):
        reader(1)
    with pytest.raises(TypeError, match="ReplyCutter"):
        _speedups.LoneReader(transport, None, object())
    with pytest.raises(TypeError, match="TransportCore"):
        _speedups.LoneReader(types.SimpleNamespace(), None, cutter)
    with pytest.raises(TypeError, match="list"):
        _speedups.LoneReader(_core(_ready=ready, _queue=collections.deque(), _wbuf=(),
                                   stats=None, _reader=None, _hub=None, _fd=0), None, cutter)
    with pytest.raises(AttributeError, match="_fd"):
        del transport._fd
        _speedups.LoneReader(transport, None, cutter)
    reader = _speedups.LoneReader.__new__(_speedups.LoneReader)
    with pytest.raises(AttributeError, match="_fd"):   # a failed __init__ may be retried
        reader.__init__(transport, None, cutter)
    transport._fd = 0
    reader.__init__(transport, None, cutter)


def _core(**fields):
    core = _speedups.TransportCore()
    for name, value in fields.items():
        setattr(core, name, value)
    return core


def test_the_transport_core_and_its_python_twin_hold_the_same_fields():
    """The C paths read a transport's shared state as the fields of
    ``TransportCore``; the Python twin declares the same names, so the
    transport's Python code runs on either base."""
    members = {name for name, value in vars(_speedups.TransportCore).items()
               if type(value) is types.MemberDescriptorType}
    assert members == set(TransportState.__slots__)
    assert issubclass(Transport, _speedups.TransportCore)


def test_the_hooks_the_c_paths_call_are_the_transports_declared_hooks():
    assert _speedups.TRANSPORT_HOOKS == TransportState.HOOKS
    for name in TransportState.HOOKS:
        assert callable(getattr(Transport, name)), name
        assert not name.startswith("_"), name


# The calls of the C API that name an attribute of a Python object.
def test_a_transport_cores_fields_start_unset_and_hold_any_object():
    core = _speedups.TransportCore()
    for name in TransportState.__slots__:
        with pytest.raises(AttributeError, match=name):
            getattr(core, name)
        value = object()
        setattr(core, name, value)
        assert getattr(core, name) is value
        delattr(core, name)
        with pytest.raises(AttributeError, match=name):
            getattr(core, name)


def test_the_response_core_and_its_python_twin_hold_the_same_fields():
    members = {name for name, value in vars(_speedups.ResponseCore).items()
               if type(value) in (types.MemberDescriptorType, types.GetSetDescriptorType)}
    assert members == set(ResponseFields.__slots__) | {"data"}
    # ``_body`` starts unset, holds any object and can be deleted, as a slot
    for cls in (_speedups.ResponseCore, ResponseFields):
        response = cls.__new__(cls)
        with pytest.raises(AttributeError, match="_body"):
            response._body
        value = object()
        response._body = value
        assert response._body is value
        del response._body
        with pytest.raises(AttributeError, match="_body"):
            response._body
        with pytest.raises(AttributeError, match="_body"):
            del response._body
    # ``data`` reads ``_data`` and cannot be set, in both
    for cls in (_speedups.ResponseCore, ResponseFields):
        response = cls.__new__(cls)
        with pytest.raises(AttributeError):
            response.data
        response._data = [[1]]
        assert response.data == [[1]]
        with pytest.raises(AttributeError):
            response.data = []
    for cls in RESPONSE_CLASSES.values():
        assert issubclass(cls, _speedups.ResponseCore)


class _Big:
    __slots__ = tuple("s%d" % i for i in range(64)) + ("_data",)


def test_responses_are_made_of_a_response_core_subclass_only():
    """The C paths write a response's fields into its ResponseCore struct: any
    other type is refused before a reply is taken (a class with the fields'
    names as another class's slots too)."""
    class Small:
        __slots__ = ()
    Small._data = _Big.__dict__["_data"]
    for response_type in (Small, _Big, tuple):
        with pytest.raises(TypeError, match="ResponseCore"):
            _speedups.ReplyCutter({}, collections.deque(), msgpack.unpackb, (True, False, None),
                                  response_type, ReplySink, _Pushes)
        with pytest.raises(TypeError, match="ResponseCore"):
            _speedups.responses(None, [], {}, msgpack.unpackb, (True, False, None),
                                response_type, None)


def test_replies_past_defer_after_are_queued_undecoded_and_finish_as_decoded():
    """The OK replies of one cut() past ``defer_after`` wait undecoded (a
    RawReply, which the GC does not track); ``finish`` makes each exactly what
    the cutter hands over decoded.  Errors and the first ones are as before."""
    import gc
    bodies = [b"\x81\x30\x91\x05", b"\x81\x30\x92\xa1x\xc3", b"\x80", b"\x91\x01",
              b"\xc1", b"\x81\x30\x91\x07"]   # (a list body; a byte msgpack never uses)
    frames = b"".join(_frame_for(sync, body) for sync, body in enumerate(bodies, 1))
    frames += tarantool_frame(7, b"\x81\x31\xa3bad", 0x8003)

    def cut(defer_after):
        pending, ready = {sync: object() for sync in range(1, 8)}, collections.deque()
        cutter = _speedups.ReplyCutter(pending, ready, msgpack.unpackb, (True, False, None),
                                       Response, ReplySink, _Pushes, defer_after)
        assert cutter.cut(frames, 0, len(frames), 1 << 20, []) == (len(frames), 0)
        return cutter, [value for _, value in ready]

    _, eager = cut(64)
    cutter, deferred = cut(2)
    assert [type(v) is _speedups.RawReply for v in deferred] == [False] * 2 + [True] * 4 + [False]
    assert not any(gc.is_tracked(v) for v in deferred[2:6])
    finished = [cutter.finish(v) if type(v) is _speedups.RawReply else v for v in deferred]
    assert [fuzz.comparable(v) for v in finished] == [fuzz.comparable(v) for v in eager]
    assert [v._size for v in finished if type(v) is Response] == \
        [v._size for v in eager if type(v) is Response]
    with pytest.raises(TypeError, match="RawReply"):
        cutter.finish(eager[0])
    with pytest.raises(TypeError):
        _speedups.RawReply()
    with pytest.raises(ValueError, match="defer_after"):
        _speedups.ReplyCutter({}, collections.deque(), msgpack.unpackb, (True, False, None),
                              Response, ReplySink, _Pushes, -1)


def test_a_response_type_whose_new_returns_something_else():
    """A response type whose __new__ makes something that is not a
    ResponseCore: the reply is refused with a TypeError (the Python code then
    fails the connection), never written into another layout."""
    class Other:
        pass

    class Odd(Response):
        __slots__ = ()

        def __new__(cls, *args):
            return Other()

    pending, ready = {7: object()}, collections.deque()
    cutter = _speedups.ReplyCutter(pending, ready, msgpack.unpackb, (True, False, None), Odd,
                                   ReplySink, _Pushes)
    frame = _frame_for(7, b"\x81\x30\x91\x05")
    with pytest.raises(TypeError, match="Other object, not a ResponseCore"):
        cutter.cut(frame, 0, len(frame), 1 << 20, [])
    assert not ready


@pytest.mark.parametrize("outstanding", [-2**63, 2**64, 1])
def test_a_sinks_outstanding_count_is_any_int(outstanding):
    """store() counts down ``outstanding`` as ``ReplySink`` code does, with no
    C arithmetic to overflow at the ends of a long (or past them)."""
    sink = ReplySink()
    sink.outstanding = outstanding
    cutter = _speedups.ReplyCutter({7: sink}, collections.deque(), msgpack.unpackb,
                                   (True, False, None), Response, ReplySink, _Pushes)
    frame, wake = _frame_for(7), []
    last = outstanding - 1 <= 0
    assert cutter.cut(frame, 0, len(frame), 1 << 20, wake) == (len(frame), 0 if last else 1)
    assert sink.outstanding == outstanding - 1
    assert wake == ([(sink, None)] if last else [])
    assert sink.replies == {7: (0, 1, b"\x80")}


def test_the_sink_core_and_its_python_twin_hold_the_same_fields():
    from gtarantool.transport import CHECKED, SinkFields

    members = {name for name, value in vars(_speedups.SinkCore).items()
               if type(value) is types.MemberDescriptorType}
    assert members == set(SinkFields.__slots__)
    assert issubclass(ReplySink, _speedups.SinkCore)
    assert _speedups.CHECKED == CHECKED


# Replies to syncs 7 (a tuple), 8 (an error) and 9 (an empty body).
THREE_REPLIES = (_frame_for(7, b"\x81\x30\x91\x92\x01\xa1x")
                 + tarantool_frame(8, b"\x81\x31\xa3dup", code=0x8003) + _frame_for(9))


def _cut_three_replies(pending, wake):
    cutter = _speedups.ReplyCutter(pending, collections.deque(), msgpack.unpackb,
                                   (True, False, None), Response, ReplySink, _Pushes)
    return cutter.cut(THREE_REPLIES, 0, len(THREE_REPLIES), 1 << 20, wake)


def test_a_checking_sinks_replies_go_to_its_owner_and_a_success_keeps_only_its_code():
    """A reply to a request registered under a checking sink: a success is
    stored as CHECKED in the owner's replies (no tuple, no body bytes), an
    error as any reply; the owner's count goes down and the owner is woken
    after its last."""
    from gtarantool.transport import CHECKED

    owner = ReplySink()
    checking = ReplySink(owner)
    owner.outstanding = 3
    pending = {7: checking, 8: checking, 9: owner}
    wake = []
    assert _cut_three_replies(pending, wake) == (len(THREE_REPLIES), 2)
    assert owner.replies == {7: CHECKED, 8: (0x8003, 1, b"\x81\x31\xa3dup"), 9: (0, 1, b"\x80")}
    assert owner.replies[7] is _speedups.CHECKED
    assert wake == [(owner, None)] and owner.outstanding == 0 and not pending
    assert checking.replies == {} and checking.outstanding == 0


def test_a_sinks_replies_are_stored_untracked_and_keep_its_dict_untracked():
    """A pipeline's replies (two ints and bytes each) are out of the cyclic
    collector's lists from the start, as its first pass would leave them, so
    that thousands of them waiting for ``results()`` keep the replies dict out
    of every young collection's scan."""
    import gc

    sink = ReplySink()
    sink.outstanding = 3
    assert _cut_three_replies({7: sink, 8: sink, 9: sink}, [])[0] == len(THREE_REPLIES)
    assert sink.replies == {7: (0, 1, b"\x81\x30\x91\x92\x01\xa1x"),
                            8: (0x8003, 1, b"\x81\x31\xa3dup"), 9: (0, 1, b"\x80")}
    assert not any(gc.is_tracked(v) for v in sink.replies.values())
    assert not gc.is_tracked(sink.replies)


def test_a_checking_sink_whose_owner_is_no_sink_fails_the_cut():
    checking = ReplySink()
    checking.owner = object()
    cutter = _speedups.ReplyCutter({7: checking}, collections.deque(), msgpack.unpackb,
                                   (True, False, None), Response, ReplySink, _Pushes)
    frame = _frame_for(7)
    with pytest.raises(TypeError, match="owner must be a sink"):
        cutter.cut(frame, 0, len(frame), 1 << 20, [])


def test_a_cutters_sink_type_must_be_a_sink_core():
    with pytest.raises(TypeError, match="SinkCore"):
        _speedups.ReplyCutter({}, collections.deque(), msgpack.unpackb, (True, False, None),
                              Response, dict, _Pushes)


# -- reply headers in every layout: the C cutter and frames.reply_header ----------

def _cut_one(frame, limit=1 << 20):
    """What the C cutter makes of one frame awaited by a caller: (where it
    stopped, the reply it queued or None)."""
    pending, ready = {}, collections.deque()
    cutter = _speedups.ReplyCutter(pending, ready, msgpack.unpackb, (True, False, None),
                                   Response, ReplySink, _Pushes)
    pending.update({9: object(), fuzz.SYNC: object()})
    pos, _ = cutter.cut(fuzz._exact(frame), 0, len(frame), limit, [])
    return pos, (ready[0][1] if ready else None)


@settings(max_examples=500, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1))
def test_reply_headers_in_any_layout_are_read_without_msgpack(rng, code, schema):
    """2.6's layout, 2.10+'s (schema version as uint64), and any map of uints:
    keys in any order and width, extra keys, a map16, the length in any width.
    The C cutter and the Python twin take exactly the headers the reference
    (msgpack) reads as such a map, with the same fields."""
    from gtarantool.protocol.frames import reply_header
    assume(code != 0x80)   # a push: never taken here
    body = b"\x81\x30\x91\x07"
    frame = fuzz.frame(rng, code, fuzz.SYNC, schema, body)
    unpacker = msgpack.Unpacker(strict_map_key=False)
    unpacker.feed(frame)
    length = unpacker.unpack()
    start = unpacker.tell()
    header = unpacker.unpack()
    head = unpacker.tell()
    takeable = all(type(v) is int and v >= 0 for v in header.values()) and {0, 1, 5} <= set(header)
    expected = (head, len(frame), header[0], header[1], header.get(5)) if takeable else None
    assert length == len(frame) - start
    assert reply_header(frame, 0, len(frame), 1 << 20) == expected
    pos, reply = _cut_one(frame)
    if takeable:
        assert pos == len(frame)
        # (an error's body is handed over as bytes, decoded when read)
        assert (reply._sync, reply._schema_version, reply._data) == (fuzz.SYNC, header[5], [7]) \
            if code == 0 else reply[:4] == (fuzz.SYNC, code, header[5],
                                            body if code >= 0x8000 else {0x30: [7]})
    else:
        assert (pos, reply) == (0, None)


HEADERS = {   # (header bytes, taken by the fast paths)
    "2.6": (b"\x83\x00\xce\x00\x00\x00\x00\x01\xcf" + bytes(7) + b"\x09\x05\xce\x00\x00\x00\x01",
            True),
    "2.10+": (b"\x83\x00\xce\x00\x00\x00\x00\x01\xcf" + bytes(7) + b"\x09\x05\xcf" + bytes(7)
              + b"\x01", True),
    "compact": (b"\x83\x00\x00\x01\x09\x05\x01", True),
    "reordered": (b"\x83\x05\x01\x01\x09\x00\x00", True),
    "stream-id": (b"\x84\x00\x00\x0a\xcf" + bytes(7) + b"\x05\x01\x09\x05\x01", True),
    "map16": (b"\xde\x00\x03\x00\x00\x01\x09\x05\x01", True),
    "repeated-key": (b"\x84\x00\x00\x01\x09\x01\x09\x05\x01", False),
    "no-schema": (b"\x82\x00\x00\x01\x09", False),
    "negative-code": (b"\x83\x00\xff\x01\x09\x05\x01", False),
    "float-value": (b"\x84\x00\x00\x01\x09\x04\xcb" + bytes(8) + b"\x05\x01", False),
    "str-key": (b"\x84\x00\x00\x01\x09\xa1k\x01\x05\x01", False),
    "array": (b"\x93\x00\x09\x01", False),
}


@pytest.mark.parametrize("name", HEADERS)
def test_reply_header_layouts(name):
    from gtarantool.protocol.frames import reply_header
    header, taken = HEADERS[name]
    body = b"\x81\x30\x91\x07"
    frame = b"\xce" + (len(header) + len(body)).to_bytes(4, "big") + header + body
    parsed = reply_header(frame, 0, len(frame), 1 << 20)
    pos, reply = _cut_one(frame)
    if taken:
        assert parsed == (5 + len(header), len(frame), 0, 9, 1)
        assert pos == len(frame) and (reply._sync, reply._schema_version, reply._data) == (
            9, 1, [7])
    else:
        assert parsed is None and (pos, reply) == (0, None)
    # Cut short anywhere, no path takes it (nor reads past what is there); the
    # header is read once it is all here.
    for cut in range(len(frame)):
        assert reply_header(frame[:cut], 0, cut, 1 << 20) == (
            parsed if cut >= 5 + len(header) else None)
        assert _cut_one(frame[:cut]) == (0, None)
    # Over the length limit: neither does.
    assert reply_header(frame, 0, len(frame), len(frame) - 6) is None
    assert _cut_one(frame, limit=len(frame) - 6) == (0, None)


def _lone_case(name):
    """A transport over a socketpair whose peer has written case ``name``'s bytes
    (the reader not yet run), and the waiter registered under sync 7."""
    import os
    import socket

    import gevent.socket as gsocket

    from gtarantool.transport import Stats, Transport
    a, b = socket.socketpair()
    transport = Transport(gsocket.socket(fileno=os.dup(a.fileno())), Stats(), 10, 1 << 20)
    a.close()
    waiter = ReplySink() if name == "sink" else object()
    transport._pending[7] = waiter
    ok = tarantool_frame(7, msgpack.packb({0x30: [[7, "seven"]]}), schema_width=8)
    written = {
        "ok": ok,
        "error": tarantool_frame(7, msgpack.packb({0x31: "no"}), code=0x8003),
        "two": ok + tarantool_frame(8, b"\x80"),
        "part": ok[:-3],
        "unknown sync": tarantool_frame(9, b"\x80"),
        "sink": ok,
        "push": tarantool_frame(7, b"\x80", code=0x80),
        "event": msgpack.packb(9) + msgpack.packb({0: 76, 1: 7}) + b"\x80",
        "nothing": b"",
        "eof": b"",
    }[name]
    b.sendall(written)
    if name == "eof":
        b.close()
    return transport, b, waiter


@pytest.mark.parametrize("name", ["ok", "error", "two", "part", "unknown sync", "sink", "push",
                                  "event", "nothing", "eof"])
def test_receive_lone_takes_one_whole_reply_as_its_python_twin_does(name):
    """The cutter's receive_lone against Transport._receive_lone, its twin: the
    same bytes received, the same verdict, the same waiter popped and its reply
    the same (a response with its size, or the tuple, in both)."""
    outcomes = []
    for c_path in (True, False):
        transport, peer, waiter = _lone_case(name)
        cutter = transport._cutter
        try:
            if not c_path:
                transport._cutter = None   # _cut's loop in Python too
            got = (cutter.receive_lone(transport._fd, transport._rbuf, 1 << 20)
                   if c_path else transport._receive_lone())
            ready = [(w is waiter, value if type(value) is tuple else
                      (value._sync, value._code, value._schema_version, value._body, None,
                       value._size))
                     for w, value in transport._ready]
            outcomes.append((got, sorted(transport._pending), ready))
        finally:
            transport._pending.clear()
            transport._ready.clear()
            transport.close()
            peer.close()
    assert outcomes[0] == outcomes[1]
    got, pending, ready = outcomes[0]
    taken = name in ("ok", "error")
    if name == "nothing":
        assert got is None
    else:
        assert got[1] is taken and (got[0] == 0) is (name == "eof")
    assert (pending == []) is taken and len(ready) == taken
    if name == "ok":   # with the frame's size: all the bytes received
        assert ready == [(True, (7, 0, 1, {0x30: [[7, "seven"]]}, None, got[0]))]


def test_receive_lone_arguments():
    transport, peer, _ = _lone_case("nothing")
    cutter = transport._cutter
    try:
        with pytest.raises(TypeError):
            cutter.receive_lone(transport._fd, transport._rbuf)
        with pytest.raises(ValueError):
            cutter.receive_lone(-1, transport._rbuf, 100)
        with pytest.raises(BufferError):
            cutter.receive_lone(transport._fd, b"read-only", 100)
        with pytest.raises(OSError):
            cutter.receive_lone(peer.fileno() + 1000, transport._rbuf, 100)
    finally:
        transport._pending.clear()
        transport.close()
        peer.close()
