"""gtarantool._encoder's request bodies against tarantool-python's packer, the reference.

``Encoder.join(raw, obj, ...)`` must give exactly ``raw + pack(obj) + ...``
for every object, and the packer's own error where it raises: the C encoder
writes the built-in types itself, in the shortest form as msgpack does, and
passes everything else to the packer.  The Python ``join`` (no compiler) is
checked against the same reference.
"""
import collections
import datetime
import decimal
import enum
import types
import uuid

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tarantool.request import packer_factory

from gtarantool import compiled
from gtarantool.protocol import Encoder
from tests import fuzz


@pytest.fixture(autouse=True)
def _built():
    """These tests fail, not skip, where the extension was not built (as ``reader``'s)."""
    if compiled.encoder is None:
        pytest.fail("gtarantool._encoder is not built (pip install -e . compiles it)")


def _packer(use_bin_type):
    """tarantool-python's packer, as a connection with or without an encoding makes it."""
    conn = types.SimpleNamespace(encoding="utf-8" if use_bin_type else None,
                                 version_id=(2 << 16) | (10 << 8))
    return packer_factory(conn)


def _joins(use_bin_type):
    """(C join, Python join, the packer's pack) for one packer."""
    packer = _packer(use_bin_type)
    c_join = Encoder(packer, use_bin_type).join
    python_join = Encoder(packer).join
    assert type(c_join) is not types.FunctionType and type(python_join) is types.FunctionType
    return c_join, python_join, packer.pack


def _outcome(function, *args):
    try:
        return function(*args)
    except Exception as exc:  # noqa: BLE001 - the failure is the outcome compared
        return type(exc), str(exc)


def _check(use_bin_type, obj):
    c_join, python_join, pack = _joins(use_bin_type)
    # Two parts (most bodies), four (update's, upsert's) and any other count.
    for parts in ((b"", obj), (b"<", obj, b"|", obj), (b"<", obj, b"|", obj, b">")):
        expected = _outcome(lambda: b"".join(pack(p) if i % 2 else p
                                             for i, p in enumerate(parts)))
        assert _outcome(c_join, *parts) == expected
        assert _outcome(python_join, *parts) == expected


class Color(enum.IntEnum):
    RED = 1


class Text(str):
    pass


class Items(list):
    pass


Point = collections.namedtuple("Point", "x y")

# Each width's first and last value, and whatever the C encoder hands to the packer.
EDGES = [
    None, True, False, 0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32,
    2**63 - 1, 2**63, 2**64 - 1, 2**64, -1, -32, -33, -128, -129, -32768, -32769,
    -2**31, -2**31 - 1, -2**63, -2**63 - 1, 10**30,
    0.0, -0.0, 1.5, 1e300, float("inf"), float("nan"),
    "", "a" * 31, "a" * 32, "a" * 255, "a" * 256, "a" * 65535, "a" * 65536, "é" * 20,
    "\U0001f600" * 70, "\ud800", "x\udcff",
    b"", b"\x00" * 31, b"\x00" * 32, b"\xff" * 255, b"\xff" * 256, b"x" * 65535, b"x" * 65536,
    [], (), [1] * 15, [1] * 16, (None,) * 65535, [0] * 65536, {}, {i: i for i in range(15)},
    {str(i): [i] for i in range(16)}, {i: None for i in range(65536)},
    {(1, 2): "tuple key", None: 1, 1.5: b"", False: []},
    Color.RED, Text("sub"), Items([1]), Point(1, 2), bytearray(b"ba"), memoryview(b"mv"),
    decimal.Decimal("1.25"), uuid.UUID(int=5), datetime.datetime(2026, 11, 22, 10, 0),
    [1, "a", decimal.Decimal("2")], {"k": uuid.UUID(int=1)}, object(), [object()],
    {"set": {1, 2}}, 1j,
]


@pytest.mark.parametrize("use_bin_type", [True, False])
@pytest.mark.parametrize("obj", EDGES, ids=lambda obj: type(obj).__name__)
def test_every_width_and_every_type_handed_on(use_bin_type, obj):
    _check(use_bin_type, obj)


@pytest.mark.parametrize("depth", [1, 63, 64, 65, 200, 600])
def test_nesting(depth):
    """Deeper than the C encoder goes, the packer decides (and past 511 raises)."""
    obj = 7
    for level in range(depth):
        obj = [obj] if level % 2 else {"k": obj}
    _check(True, obj)


# Any code points, lone surrogates included (which st.text leaves out).
codepoints = st.lists(st.integers(0, 0x10ffff) | st.integers(0xd800, 0xdfff), max_size=40)
scalars = (st.none() | st.booleans() | st.integers(-2**65, 2**65)
           | st.floats(allow_nan=True, allow_infinity=True)
           | st.text() | st.binary() | codepoints.map(lambda cs: "".join(map(chr, cs)))
           | st.sampled_from([decimal.Decimal("0.5"), uuid.UUID(int=9), Color.RED, Text("t")]))
keys = st.none() | st.booleans() | st.integers(-2**64, 2**64) | st.text() | st.binary()
objects = st.recursive(scalars, lambda inner: st.lists(inner, max_size=20)
                       | st.lists(inner, max_size=20).map(tuple)
                       | st.dictionaries(keys, inner, max_size=20), max_leaves=60)


@settings(max_examples=400, deadline=None)
@given(st.booleans(), objects)
def test_any_object_as_the_packer_packs_it(use_bin_type, obj):
    _check(use_bin_type, obj)


@pytest.mark.parametrize("parts", [(), (b"only",), (b"a", 1, b"b"), (b"a", [1], b"b", "x")])
def test_parts_alternate_raw_and_packed(parts):
    c_join, python_join, pack = _joins(True)
    expected = b"".join(pack(p) if i % 2 else p for i, p in enumerate(parts))
    assert c_join(*parts) == python_join(*parts) == expected


def test_bad_parts_are_refused():
    c_join, _, _ = _joins(True)
    with pytest.raises(TypeError, match="part 2 must be bytes, not str"):
        c_join(b"a", 1, "b", 2)
    with pytest.raises(TypeError, match="at most 8 parts"):
        c_join(*([b"", 1] * 5))


def test_a_packer_that_returns_no_bytes():
    join = compiled.encoder.BodyEncoder(lambda obj: "not bytes", True).join
    assert join(b"a", 1) == b"a\x01"   # packed by the C encoder: no call
    with pytest.raises(TypeError, match="pack"):
        join(b"a", object())


def test_the_connection_picks_the_c_join_for_its_own_packer(server):
    import gtarantool

    for encoding, use_bin_type in (("utf-8", True), (None, False)):
        with gtarantool.connect(server.host, server.port, user="test", password="secret",
                                encoding=encoding) as conn:
            assert type(conn._encoder.join) is not types.FunctionType
            assert conn._encoder.join(b"", b"x") == msgpack.packb(b"x", use_bin_type=use_bin_type)
            conn.replace("tester", (4242, "é", b"\xff"))
            assert conn.select("tester", 4242).data[0][:3] == (
                [4242, "é", b"\xff"] if encoding else [4242, "é".encode(), b"\xff"])
            conn.delete("tester", 4242)


def test_another_packer_factory_gets_the_python_join(server):
    import gtarantool

    packed = []

    def factory(conn):
        packer = msgpack.Packer(use_bin_type=False)

        class Counting:
            def pack(self, obj):
                packed.append(obj)
                return packer.pack(obj)
        return Counting()

    with gtarantool.connect(server.host, server.port, user="test", password="secret",
                            packer_factory=factory) as conn:
        assert type(conn._encoder.join) is types.FunctionType
        conn.replace("tester", (4243, "x"))
        assert (4243, "x") in packed
        assert conn.select("tester", 4243).data[0][:2] == [4243, "x"]
        conn.delete("tester", 4243)


def test_a_packer_hook_that_changes_an_earlier_part():
    """The packer runs Python code (its default hook) for a type the C encoder
    declines; parts already sized may change meanwhile.  The body is still
    what packing each part in turn gives, never a buffer overrun."""
    key = [1]

    def default(obj):
        key.extend(range(100000))   # the earlier part grows after it was sized
        return "hooked"

    pack = msgpack.Packer(default=default, use_bin_type=True).pack
    join = compiled.encoder.BodyEncoder(pack, True).join
    body = join(b"<", key, b"|", object(), b">")
    assert body == b"<" + msgpack.packb([1]) + b"|" + msgpack.packb("hooked") + b">"
    assert len(key) == 100001


def test_an_encoder_never_initialised_raises():
    """(Its pack was NULL: a declined object crashed join.)"""
    encoder = compiled.encoder.BodyEncoder.__new__(compiled.encoder.BodyEncoder)
    for obj in (1, object()):
        with pytest.raises(TypeError, match="not initialised"):
            encoder.join(b"", obj)
    encoder = compiled.encoder.BodyEncoder(msgpack.Packer().pack, True)
    with pytest.raises(RuntimeError, match="initialised already"):
        encoder.__init__(len, False)
    assert encoder.join(b"", object.__name__) == msgpack.packb("object")


# -- encode_batch: a whole request per row, in one piece ----------------------------

def _batches(use_bin_type):
    """(C encode_batch, Python encode_batch) for one packer: the same signature."""
    packer = _packer(use_bin_type)
    c_batch = Encoder(packer, use_bin_type).encode_batch
    python_batch = Encoder(packer).encode_batch
    assert type(c_batch) is not type(python_batch)
    return c_batch, python_batch


BATCH_ROWS = [
    [],
    [(1, "a", 3)],
    [(k, "name-%d" % k, -k) for k in range(300)],
    [[1, None, 1.5], (2, b"\xff", [1, {"k": "v"}]), (3,)],
    [(1, "x" * 70000)],
    [(1, decimal.Decimal("1.5"), uuid.UUID(int=3)), (2, "plain")],   # the packer's types
    [(1, datetime.datetime(2026, 1, 2)), (2, object())],            # one the packer refuses
    [{"not": "a tuple"}, (1, 2)],
]


@pytest.mark.parametrize("use_bin_type", [True, False])
@pytest.mark.parametrize("rows", BATCH_ROWS, ids=range(len(BATCH_ROWS)))
@pytest.mark.parametrize("upsert", [False, True])
def test_encode_batch_is_its_python_twin_byte_for_byte(use_bin_type, rows, upsert):
    c_batch, python_batch = _batches(use_bin_type)
    prefix, suffix, assign = b"\x82\x10\xcd\x02\x00\x21", None, ()
    if upsert:
        prefix, suffix, assign = b"\x84\x10\xcd\x02\x00\x11\x00\x21", b"\x28", (1, 2, 9)
    args = (3 if not upsert else 9, prefix, rows, (1 << 32) + 5, suffix, assign)
    expected = _outcome(python_batch, *args)
    assert _outcome(c_batch, *args) == expected
    if type(expected) is bytes and rows and not isinstance(rows[0], dict):
        # each frame is what a single request's path frames for that row
        from gtarantool.protocol.frames import request_header
        pack = _packer(use_bin_type).pack
        one = []
        for sync, row in enumerate(rows, (1 << 32) + 5):
            body = prefix + pack(row)
            if upsert:
                body += suffix + pack([["=", f, row[f]] for f in assign if f < len(row)])
            one.append(request_header(args[0], sync, 0, len(body)) + body)
        assert expected == b"".join(one)


@settings(max_examples=50, deadline=None)
@given(st.booleans(), st.lists(st.lists(objects, max_size=6).map(tuple), max_size=8),
       st.lists(st.integers(0, 8), max_size=4), st.booleans())
def test_encode_batch_any_rows(use_bin_type, rows, assign, upsert):
    c_batch, python_batch = _batches(use_bin_type)
    args = (2, b"\x82\x10\x01\x21", rows, 7, b"\x28" if upsert else None, assign)
    assert _outcome(c_batch, *args) == _outcome(python_batch, *args)


@pytest.mark.parametrize("args", [
    (128, b"", [(1,)], 1), (-1, b"", [(1,)], 1), (2, "str", [(1,)], 1),
    (2, b"", [(1,)], 1, "suffix"), (2, b"", [(1,)], -1), (2, b"", [(1,)], 1.0),
    (2, b"", [(1,), (2,)], 2**64 - 1), (2, b"", [(1,)], 2**64 - 1),
    (2, b"", [(1,)], 1, b"(", (-1,)), (2, b"", [(1,)], 1, b"(", ("1",)),
    (2, b"", 5, 1), (2, b"", [5], 1, b"(", (0,)),
])
def test_encode_batch_refuses_what_its_twin_refuses(args):
    c_batch, python_batch = _batches(True)
    assert _outcome(c_batch, *args) == _outcome(python_batch, *args)


@pytest.mark.parametrize("use_bin_type", [True, False])
def test_encode_batch_into_a_reused_buffer_gives_the_same_bytes(use_bin_type):
    """``out``: the requests in that bytearray, resized in place, byte for
    byte what a new bytes object holds; C and its twin alike."""
    for encode in _batches(use_bin_type):
        out = bytearray(b"old contents" * 1000)
        for rows, first in ((BATCH_ROWS[2], 10), (BATCH_ROWS[1], 99), (BATCH_ROWS[4], 5)):
            expected = encode(3, b"\x82\x10\x01\x21", rows, first)
            assert encode(3, b"\x82\x10\x01\x21", rows, first, None, (), out) is out
            assert bytes(out) == expected
        with pytest.raises(TypeError, match="out must be a bytearray"):
            encode(3, b"", [(1,)], 1, None, (), b"bytes")
        view = memoryview(out)   # (a buffer someone still reads is not resized)
        with pytest.raises(BufferError):
            encode(3, b"", [(1,)], 1, None, (), out)
        view.release()


GATHER_ROWS = [
    (1, "x" * 1500, b"y" * 700, "\u00e9" * 400, "short", [2, "z" * 2000], {"k": "v" * 900}),
    [3, "a" * 40000],
    (4, "b" * 100, b""),
    (5, "c" * 65536, b"d" * 256),
]


@pytest.mark.parametrize("use_bin_type", [True, False])
def test_encode_batch_gather_writes_the_same_bytes_from_the_rows(use_bin_type):
    """``gather``: the contents of the long str and bytes fields of each row
    (not nested ones) are written from the rows by writev; the bytes on the
    wire are those of the batch without it, whatever the socket takes at a
    time.  With no field that long, the encoded bytes as before."""
    c_batch, python_batch = _batches(use_bin_type)
    args = (2, b"\x82\x10\xcd\x02\x00\x21", GATHER_ROWS, 1 << 32, None, ())
    expected = c_batch(*args)
    assert python_batch(*args, bytearray(), 1024) == expected   # (the twin copies)
    for gather in (1, 256, 1024, 65536):
        out = bytearray()
        batch = c_batch(*args, out, gather)
        assert type(batch) is compiled.encoder.Gather and len(batch) == len(expected)
        assert batch.tobytes() == expected
        assert len(out) <= len(expected) - 65536   # (the long contents are not in it)
        wire, writes = fuzz.written(batch)
        assert wire == expected and writes > 1 and len(batch) == 0
    plain = c_batch(2, b"\x82", [(1, "short")], 1, None, (), bytearray(), 1024)
    assert type(plain) is bytearray
    upsert = c_batch(9, b"\x82", GATHER_ROWS, 1, b"\x28", (1,), bytearray(), 1024)
    assert type(upsert) is bytearray   # (an upsert's fields are copied: they appear twice)
    for encode in (c_batch, python_batch):
        with pytest.raises(ValueError, match="gather must be >= 0"):
            encode(*args, None, -1)


def test_a_gathers_buffer_is_not_encoded_into_while_it_may_write():
    """A Gather holds its bytearray: encoding into it again, even to the same
    size, raises BufferError until the Gather is gone."""
    c_batch, _ = _batches(True)
    args = (2, b"\x82", GATHER_ROWS, 1, None, ())
    out = bytearray()
    batch = c_batch(*args, out, 1024)
    before = batch.tobytes()
    for gather in (1024, 0):
        with pytest.raises(BufferError, match="export"):
            c_batch(*args, out, gather)
    assert batch.tobytes() == before
    del batch
    assert type(c_batch(*args, out, 1024)) is compiled.encoder.Gather
    with pytest.raises(TypeError):
        compiled.encoder.Gather()


def test_encode_batch_with_a_hook_that_changes_a_row():
    """A declined row makes every row go through the packer, in order: a hook
    changing an earlier row changes what is packed of it later, never the
    buffer's size under the C encoder."""
    grow = [1]

    def default(obj):
        grow.extend(range(1000))
        return "hooked"

    packer = msgpack.Packer(use_bin_type=True, default=default)
    c_batch = compiled.encoder.BodyEncoder(packer.pack, True).encode_batch
    rows = [(grow,), (object(),), (grow,)]
    got = c_batch(2, b"", rows, 1)
    assert len(got) > 2 * 1000   # the third row holds what the hook added


# -- convert_lines / convert_records: rows from text by a plan ---------------------

def test_convert_lines_and_records_are_their_python_twins():
    """Random text, lists and plans (tests/fuzz.py's ``convert`` cases): C and
    protocol.bulk give the same rows (types included) and the same errors."""
    import random

    from tests.fuzz import fuzz_convert
    rng = random.Random(5)
    for case in range(3000):
        fuzz_convert(rng, case)


def test_convert_lines_takes_the_strict_spelling_only():
    from gtarantool.protocol import bulk

    plan = ((0, bulk.KIND_UNSIGNED, False, None), (1, bulk.KIND_STRING, False, None),
            (2, bulk.KIND_NUMBER, True, None), (3, bulk.KIND_BOOLEAN, False, None))
    data = ("1,a,2,true\n18446744073709551615,é,1.5e3,Off\n+1,a,2,t\n1,a,,no\n"
            "1,a, 2,y\n1,\"a\",2,y\n1,a,2\n\n1,a,1e400,f\n1,a,2,yes\r\n"
            "\"1\",\"a,\nb\",\"\",n\n1,\"a\"\"b\",2,y\n1,a\"b,2,y\n1,\"a\"x,2,y\n"
            "1,\"a,2,y\n1,a\r,2,y\r").encode()   # (a CRLF line end is taken, another CR not)
    got = compiled.encoder.convert_lines(data, 17, ",", '"', "", 5, plan)
    assert got == bulk.convert_lines(data, 17, ",", '"', "", 5, plan)
    assert got == [(1, "a", 2, True, None), (2**64 - 1, "é", 1500.0, False, None), None,
                   (1, "a", None, False, None), None, (1, "a", 2, True, None), None, None,
                   None, (1, "a", 2, True, None), None, None, None, None, None, None, None]
    assert type(got[0][2]) is int and type(got[1][2]) is float
    data = data.replace(b"a,\nb", b"a,b")   # (a quoted value on one line)
    got = compiled.encoder.convert_lines(data, 16, ",", '"', "", 5, plan)
    assert got[10] == (1, "a,b", None, False, None) == bulk.convert_lines(
        data, 16, ",", '"', "", 5, plan)[10]
    assert compiled.encoder.convert_lines(data, 15, ",", '"', "", 5, plan) is None


@pytest.mark.parametrize("args", [
    ([], 1, 1, ()), ([], "", -1, ()), ([], "", 1, [(0, 0, False, None)]),
    ([], "", 1, ((1, 0, False, None),)), ([], "", 1, ((0, 7, False, None),)),
    ([], "", 1, ((0, 6, False, None),)), ([], "", 1, ((0, 0, False),)), ((), "", 0, ()),
    ([], "\ud800", 0, ()),
])
def test_convert_records_refuses_what_its_twin_refuses(args):
    from gtarantool.protocol import bulk
    expected = _outcome(bulk.convert_records, *args)
    assert isinstance(expected, tuple) and issubclass(expected[0], Exception)
    assert _outcome(compiled.encoder.convert_records, *args) == expected


@pytest.mark.parametrize("args", [
    ("x", 0, ",", '"'), (b"", 0.0, ",", '"'), (b"", 0, ",,", '"'), (b"", 0, ",", ""),
    (b"", 0, "\ud800", '"'), (b"", 0, ",", "\ud800"),
])
def test_convert_lines_refuses_what_its_twin_refuses(args):
    from gtarantool.protocol import bulk
    full = args + ("", 1, ((0, 0, False, None),))
    expected = _outcome(bulk.convert_lines, *full)
    assert isinstance(expected, tuple) and issubclass(expected[0], Exception)
    assert _outcome(compiled.encoder.convert_lines, *full) == expected
