"""Request bodies and reply bodies: ``Encoder`` (one packer per connection; the
fixed part of a body packed once, ``join`` in C when ``_encoder`` is built),
``BodyDecoder`` (a reply body decoded as the connection's unpacker factory
would) and the decoding of error replies (``error_body``, ``LazyBoxError``).
Callers rely on bodies byte-identical to tarantool-python's.
"""
import functools

import msgpack
from tarantool import request as tarantool_request
from tarantool import response as tarantool_response
from tarantool.msgpack_ext.unpacker import ext_hook as unpacker_ext_hook
from tarantool.types import BoxError, decode_box_error

from gtarantool import compiled
from gtarantool.errors import ProtocolError
from gtarantool.protocol import bulk
from gtarantool.protocol.constants import (
    IPROTO_ERROR,
    IPROTO_ERROR_24,
    IPROTO_INDEX_ID,
    IPROTO_ITERATOR,
    IPROTO_KEY,
    IPROTO_LIMIT,
    IPROTO_OFFSET,
    IPROTO_OPS,
    IPROTO_SPACE_ID,
    IPROTO_TUPLE,
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
    REQUEST_TYPE_UPSERT,
)

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


NO_LIMIT = 0xffffffff   # tarantool-python's default select limit


class Encoder:
    """Request bodies as bytes, with one packer per connection.

    ``space(space_no, index_no)`` gives the encoder of the requests most
    programs send (by key on one index, no offset or limit); ``select`` and
    ``upsert`` here take every argument.  Either way the fixed part of a body
    (map header, space, index, iterator...) is packed once and each call packs
    only the key, tuple or operations.  Field order is tarantool-python's.

    ``encode_batch(code, prefix, rows, first_sync, suffix=None, assign=(), out=None,
    gather=0)`` frames a whole request per row in one bytes object
    (``protocol.bulk``; in C under the same condition as ``join``, where
    ``gather`` may leave long values to be written from the rows: a
    ``Gather``).

    ``join(raw, obj, raw, obj, ...)`` is ``raw + pack(obj) + raw + ...``: in
    C (``_encoder.c``) it makes a body in one piece, with one copy of its
    strings, when the packer is a ``msgpack.Packer`` whose only non-default
    settings are ``use_bin_type`` (given here) and a ``default`` hook;
    tarantool-python's is one.  Without ``use_bin_type`` (another kind of
    packer) it joins ``pack``'s results.
    """

    CACHE_LIMIT = 4096

    def __init__(self, packer, use_bin_type=None):
        self.pack = pack = packer.pack
        if compiled.encoder is not None and use_bin_type is not None:
            body_encoder = compiled.encoder.BodyEncoder(pack, use_bin_type)
            self.join = body_encoder.join
            self.encode_batch = body_encoder.encode_batch
        else:
            self.encode_batch = functools.partial(bulk.encode_batch, pack)

            def join(*parts):
                if len(parts) == 2:   # most bodies: a prefix and a key or tuple
                    return parts[0] + pack(parts[1])
                if len(parts) == 4:   # update's and upsert's
                    return b"".join((parts[0], pack(parts[1]), parts[2], pack(parts[3])))
                pieces = list(parts)
                pieces[1::2] = map(pack, parts[1::2])
                return b"".join(pieces)
            self.join = join
        self._prefixes = {}

    @classmethod
    def for_connection(cls, conn):
        """The encoder for ``conn``'s packer (``conn._packer_factory()``)."""
        packer = conn._packer_factory()
        if conn._packer_factory_impl is tarantool_request.packer_factory:
            return cls(packer, use_bin_type=conn.encoding is not None)
        return cls(packer)

    def prefix(self, size, *fields):
        """The header of a ``size``-entry map and ``fields`` (k1, v1, ..., km),
        packed: everything up to km's value, which the caller appends."""
        return bytes([0x80 | size]) + b"".join(map(self.pack, fields))

    def _cached(self, cache_key, size, *fields):
        if len(self._prefixes) >= self.CACHE_LIMIT:
            self._prefixes.clear()
        prefix = self._prefixes[cache_key] = self.prefix(size, *fields)
        return prefix

    def batch_parts(self, code, space_no):
        """``(prefix, suffix)`` for ``encode_batch`` of inserts or replaces
        (suffix None) or upserts (on the primary index) into ``space_no``: the
        bodies tarantool-python's requests have."""
        if code == REQUEST_TYPE_UPSERT:
            return (self.prefix(4, IPROTO_SPACE_ID, space_no, IPROTO_INDEX_ID, 0, IPROTO_TUPLE),
                    _UPSERT_OPS_KEY)
        return self.prefix(2, IPROTO_SPACE_ID, space_no, IPROTO_TUPLE), None

    def space(self, space_no, index_no=0):
        return SpaceEncoder(self, space_no, index_no)

    def select(self, space, index, offset, limit, iterator, key):
        fields = (IPROTO_SPACE_ID, space, IPROTO_INDEX_ID, index, IPROTO_OFFSET, offset,
                  IPROTO_LIMIT, limit, IPROTO_ITERATOR, iterator, IPROTO_KEY)
        if not (type(space) is int and type(index) is int and type(offset) is int
                and type(limit) is int and type(iterator) is int):
            # (1.0 and True equal 1 as keys: a prefix of theirs is not kept for 1's)
            return self.join(self.prefix(6, *fields), key)
        cache_key = (space, index, offset, limit, iterator)
        prefix = self._prefixes.get(cache_key)
        if prefix is None:
            prefix = self._cached(cache_key, 6, *fields)
        return self.join(prefix, key)

    def upsert(self, space, index, values, ops):
        fields = (IPROTO_SPACE_ID, space, IPROTO_INDEX_ID, index, IPROTO_TUPLE)
        if not (type(space) is int and type(index) is int):   # (as select's)
            return self.join(self.prefix(4, *fields), values, _UPSERT_OPS_KEY, ops)
        cache_key = (REQUEST_TYPE_UPSERT, space, index)
        prefix = self._prefixes.get(cache_key)
        if prefix is None:
            prefix = self._cached(cache_key, 4, *fields)
        return self.join(prefix, values, _UPSERT_OPS_KEY, ops)


class SpaceEncoder:
    """The bodies of insert and replace on one space, and of select (by key:
    EQ, no offset or limit), update and delete on one of its indexes, as
    their fixed parts, packed when it is made.  A body is its ``*_prefix``
    followed by the packed key or tuple: ``join(prefix, key)`` (the
    ``Encoder``'s); an update's continues with ``OPS_KEY`` and the packed
    operations.  A ``*_scalar_prefix`` ends with the header of a one-element
    array, so that a scalar key (an int or a str) is packed after it as it
    is, without a list made to hold it.  (Callers call ``join`` themselves: a
    method per body would cost every request a Python call.)"""

    __slots__ = ("space_no", "index_no", "join", "insert_prefix", "select_prefix",
                 "update_prefix", "delete_prefix", "select_scalar_prefix",
                 "update_scalar_prefix", "delete_scalar_prefix")

    def __init__(self, encoder, space_no, index_no):
        self.space_no = space_no
        self.index_no = index_no
        self.join = encoder.join
        prefix = encoder.prefix
        self.insert_prefix = prefix(2, IPROTO_SPACE_ID, space_no, IPROTO_TUPLE)
        self.select_prefix = prefix(6, IPROTO_SPACE_ID, space_no, IPROTO_INDEX_ID, index_no,
                                    IPROTO_OFFSET, 0, IPROTO_LIMIT, NO_LIMIT, IPROTO_ITERATOR,
                                    ITERATOR_EQ, IPROTO_KEY)
        self.update_prefix = prefix(4, IPROTO_SPACE_ID, space_no, IPROTO_INDEX_ID, index_no,
                                    IPROTO_KEY)
        self.delete_prefix = prefix(3, IPROTO_SPACE_ID, space_no, IPROTO_INDEX_ID, index_no,
                                    IPROTO_KEY)
        self.select_scalar_prefix = self.select_prefix + _ONE_ELEMENT_ARRAY
        self.update_scalar_prefix = self.update_prefix + _ONE_ELEMENT_ARRAY
        self.delete_scalar_prefix = self.delete_prefix + _ONE_ELEMENT_ARRAY


_ONE_ELEMENT_ARRAY = b"\x91"
OPS_KEY = bytes([IPROTO_TUPLE])   # an update's operations go under IPROTO_TUPLE
_UPSERT_OPS_KEY = bytes([IPROTO_OPS])


ERROR_STRINGS = "backslashreplace"   # how an error reply's strings are decoded


class BodyDecoder:
    """Decodes reply bodies as the connection's ``unpacker_factory`` would.

    With tarantool-python's own factory, ``options`` holds its settings
    ``(use_list, raw, ext_hook)`` for ``msgpack.unpackb``, which the reader
    calls itself; a connection given another factory gets ``options`` None and
    each body goes through a fresh unpacker from it.  Either way a body must be
    exactly one msgpack object: bytes after it are an error, never left over
    for the next reply.
    """

    __slots__ = ("options", "_factory")

    def __init__(self, use_list=True, raw=False, factory=None):
        self._factory = factory
        self.options = None
        if factory is None:
            kwargs = {"use_list": use_list, "raw": raw, "strict_map_key": False}

            def ext_hook(code, data):   # as tarantool.response.unpacker_factory's
                return unpacker_ext_hook(code, data, msgpack.Unpacker(**kwargs))
            kwargs["ext_hook"] = ext_hook
            self.options = (use_list, raw, ext_hook)

    @classmethod
    def for_connection(cls, conn):
        if getattr(conn, "_unpacker_factory_impl", None) is tarantool_response.unpacker_factory:
            return cls(conn.use_list, conn.encoding is None)
        return cls(factory=conn._unpacker_factory)

    def decode(self, data, error=False):
        """The body in ``data`` (any buffer); an empty body is ``{}``.

        ``error``: the body of an error reply, whose strings are decoded with
        ``\\xNN`` for the bytes that are not UTF-8 (``backslashreplace``)
        instead of failing: since 2.10 messages quote tuples, bytes fields as
        they are (ER_TUPLE_FOUND quotes both).  Another unpacker factory
        decodes as it does (``make_response`` copes)."""
        if not len(data):
            return {}
        if self._factory is None:
            speedups = compiled.speedups
            if error and speedups is not None:   # the C reader's escaping: no call per byte
                return speedups.decode_error(data, msgpack.unpackb, self.options)
            use_list, raw, ext_hook = self.options
            return msgpack.unpackb(data, use_list=use_list, raw=raw, strict_map_key=False,
                                   ext_hook=ext_hook,
                                   unicode_errors=ERROR_STRINGS if error else None)
        unpacker = self._factory()
        unpacker.feed(data)
        body = unpacker.unpack()
        if unpacker.tell() != len(data):
            raise msgpack.ExtraData(body, bytes(data[unpacker.tell():]))
        return body


class _StackField:
    """A ``BoxError`` field of ``LazyBoxError``: reading or setting it decodes the stack."""

    def __init__(self, name):
        self.name = name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        return getattr(obj._load(), self.name)

    def __set__(self, obj, value):
        setattr(obj._load(), self.name, value)


class LazyBoxError(BoxError):
    """An error reply's ``extra_info``: tarantool-python's ``BoxError``, built
    from the reply's error stack when first used.

    Most errors are told apart by their code and never looked into, and
    building the stack was a sixth of a duplicate-key error's client cost.  On
    first use the object becomes a plain ``BoxError`` (its class is switched),
    equal to and printed as the one tarantool-python builds."""

    def __init__(self, error_map):   # (not the dataclass's: nothing decoded yet)
        self._error_map = error_map

    def _load(self):
        if type(self) is LazyBoxError:
            decoded = decode_box_error(self.__dict__.pop("_error_map"))
            self.__dict__.update(decoded.__dict__)
            self.__class__ = BoxError
        return self

    def __eq__(self, other):
        return self._load() == other

    def __repr__(self):
        return repr(self._load())

    def __reduce_ex__(self, protocol):
        return self._load().__reduce_ex__(protocol)


for _field in BoxError.__dataclass_fields__:
    setattr(LazyBoxError, _field, _StackField(_field))
del _field

def error_body(decoder, sync, body):
    """An error reply's body as a map: ``body`` decoded already, its bytes, or
    the exception decoding it raised.  Raises as ``make_response`` does for a
    body that is no map."""
    if isinstance(body, (bytes, bytearray, memoryview)):
        try:
            body = decoder.decode(body, True)
        except Exception as exc:  # noqa: BLE001 - judged below
            body = exc
    if type(body) is dict:
        return body
    if isinstance(body, UnicodeDecodeError):
        # Since 2.10 some messages quote tuples, bytes fields as they are
        # ("Duplicate key exists ... [1, "\xff"]"): the server's error, not an
        # undecodable reply.  BodyDecoder.decode(..., error=True) makes them
        # "\\xff"; another unpacker factory may fail on them, and the string
        # that failed is the message.
        return {IPROTO_ERROR_24: body.object.decode("utf-8", "backslashreplace")}
    if isinstance(body, Exception):
        raise body
    raise ProtocolError("the body of reply %d is a %s, not a map" % (sync, type(body).__name__))


_EMPTY_STACK: dict = {0: []}   # (tarantool-python's decode_box_error gives None for it)


def box_error(body):
    error_map = body.get(IPROTO_ERROR)
    if error_map is None or error_map == _EMPTY_STACK:
        return None
    return LazyBoxError(error_map)



def decode_or_error(decoder, data):
    """The body in ``data`` of a reply that is no error, or the exception decoding it raised."""
    try:
        return decoder.decode(data)
    except Exception as exc:  # noqa: BLE001 - that caller's error
        return exc.with_traceback(None)
