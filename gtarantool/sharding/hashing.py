"""vshard's bucket ids in the client: ``strcrc32``/``mpcrc32`` and the bucket id
of a key, equal to ``vshard.router.bucket_id_strcrc32``/``bucket_id_mpcrc32``
for every key vshard can hash the same way every time (others raise ValueError).
"""
from __future__ import annotations

import decimal
import math
import struct
from typing import Any, Callable, Optional

_crc32c: Optional[Callable[[bytes], int]]
try:
    from crc32c import crc32c as _crc32c
except ImportError:   # an optional dependency: the sharding extra
    _crc32c = None

__all__ = ["bucket_id_strcrc32", "bucket_id_mpcrc32", "strcrc32", "mpcrc32"]

_NUMBER_MAX = 10 ** 14 - 1   # larger integers decode to int64/uint64 cdata on the server
_NULL = b"cdata<void *>: NULL"   # tostring(box.NULL): a nil inside a key
# LuaJIT keeps one NaN (its sign bit set): msgpackffi encodes every NaN as this double.
_LUA_NAN = b"\xcb\xff\xf8\x00\x00\x00\x00\x00\x00"
# Wide enough to hold a double's exact decimal expansion (767 significant digits).
_EXACT = decimal.Context(prec=800, Emax=999999, Emin=-999999)


def _lua_number(value):
    """LuaJIT's ``tostring`` of a float: ``%.14g``, but with a tie (a value exactly
    halfway between two 14-digit decimals) rounded away from zero, where C's and
    Python's printf round it to even."""
    if value != value:
        return b"nan"   # (the server's NaN, whatever the client's sign bit)
    if math.isinf(value):
        return b"inf" if value > 0 else b"-inf"
    if value == 0:
        return b"-0" if math.copysign(1.0, value) < 0 else b"0"
    exact = decimal.Decimal(value)   # a double's exact value
    exponent = exact.adjusted()
    digits = abs(exact).scaleb(13 - exponent, _EXACT).quantize(
        decimal.Decimal(1), decimal.ROUND_HALF_UP, _EXACT)
    text = str(int(digits))
    if len(text) > 14:   # rounded up to the next power of ten
        exponent += 1
        text = text[:14]
    text = text.rstrip("0")
    sign = "-" if value < 0 else ""
    if -4 <= exponent < 14:   # %g's fixed notation, trailing zeros dropped
        if exponent >= 0:
            whole, fraction = text[:exponent + 1].ljust(exponent + 1, "0"), text[exponent + 1:]
        else:
            whole, fraction = "0", "0" * (-exponent - 1) + text
        out = sign + whole + ("." + fraction if fraction else "")
    else:
        out = "%s%s%s%se%s%02d" % (sign, text[0], "." if len(text) > 1 else "", text[1:],
                                   "-" if exponent < 0 else "+", abs(exponent))
    return out.encode()


def _tostring(value):
    """Lua's tostring() of ``value`` as the server decodes it from MessagePack."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if value is True:
        return b"true"
    if value is False:
        return b"false"
    if isinstance(value, int):
        if -_NUMBER_MAX <= value <= _NUMBER_MAX:
            return b"%d" % value
        if value > 0:
            if value >= 1 << 64:
                raise ValueError("%d does not fit in uint64" % value)
            return b"%dULL" % value
        if value < -(1 << 63):
            raise ValueError("%d does not fit in int64" % value)
        return b"%dLL" % value
    if isinstance(value, float):
        return _lua_number(value)
    if value is None:
        return _NULL
    raise ValueError("a shard key part must be str, bytes, int, float, bool or None, not %s"
                     % type(value).__name__)


def _pack_uint(value):
    if value < 0x80:
        return bytes((value,))
    if value < 0x100:
        return b"\xcc" + value.to_bytes(1, "big")
    if value < 0x10000:
        return b"\xcd" + value.to_bytes(2, "big")
    if value < 0x100000000:
        return b"\xce" + value.to_bytes(4, "big")
    return b"\xcf" + value.to_bytes(8, "big")


def _pack_int(value):
    if value >= 0:
        return _pack_uint(value)
    if value >= -0x20:
        return (value & 0xff).to_bytes(1, "big")
    if value >= -0x80:
        return b"\xd0" + value.to_bytes(1, "big", signed=True)
    if value >= -0x8000:
        return b"\xd1" + value.to_bytes(2, "big", signed=True)
    if value >= -0x80000000:
        return b"\xd2" + value.to_bytes(4, "big", signed=True)
    return b"\xd3" + value.to_bytes(8, "big", signed=True)


def _pack_bin(value):
    n = len(value)
    head = (b"\xc4" + n.to_bytes(1, "big") if n < 0x100 else
            b"\xc5" + n.to_bytes(2, "big") if n < 0x10000 else b"\xc6" + n.to_bytes(4, "big"))
    return head + value


def _mp_one(value, varbinary):
    """vshard's mpcrc32 input for one key part: a string as is, anything else as
    the server's msgpackffi encodes the value it decoded."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray)) and not varbinary:
        return bytes(value)   # before 3.0 the server decodes MP_BIN to a Lua string
    return _mp_nested(value, varbinary)


def _mp_nested(value, varbinary):
    if isinstance(value, str) or (isinstance(value, (bytes, bytearray)) and not varbinary):
        data = value.encode() if isinstance(value, str) else bytes(value)
        n = len(data)
        head = (bytes((0xa0 | n,)) if n < 32 else b"\xd9" + n.to_bytes(1, "big") if n < 0x100
                else b"\xda" + n.to_bytes(2, "big") if n < 0x10000
                else b"\xdb" + n.to_bytes(4, "big"))
        return head + data
    if isinstance(value, (bytes, bytearray)):
        return _pack_bin(bytes(value))   # 3.0+: varbinary, encoded back with its header
    if value is None:
        return b"\xc0"
    if value is True:
        return b"\xc3"
    if value is False:
        return b"\xc2"
    if isinstance(value, int):
        if not -(1 << 63) <= value < (1 << 64):
            raise ValueError("%d does not fit in int64 or uint64" % value)
        return _pack_int(value)
    if isinstance(value, float):
        # msgpackffi encodes an integral Lua number as an integer.
        if value == value and -(2.0 ** 63) <= value < 2.0 ** 64 and value.is_integer():
            return _pack_int(int(value))
        if value != value:
            return _LUA_NAN
        return b"\xcb" + struct.pack(">d", value)
    if isinstance(value, (list, tuple)):
        n = len(value)
        head = (bytes((0x90 | n,)) if n < 16 else b"\xdc" + n.to_bytes(2, "big") if n < 0x10000
                else b"\xdd" + n.to_bytes(4, "big"))
        return head + b"".join(_mp_nested(v, varbinary) for v in value)
    raise ValueError("a shard key part must be str, bytes, int, float, bool, None or a list "
                     "of them, not %s" % type(value).__name__)


def _crc(data):
    # Tarantool's digest.crc32 is CRC-32C without the final inversion.
    return _crc32c(data) ^ 0xFFFFFFFF


def _no_crc32c(data):
    raise ImportError("bucket ids need the crc32c package: pip install crc32c (or install "
                      "gtarantool with its sharding extra: pip install '.[sharding]')")


if _crc32c is None:
    _crc32c = _no_crc32c


def _parts(key):
    if key is None:
        raise ValueError("a shard key is needed (vshard: Usage: bucket_id(key))")
    if isinstance(key, dict):
        raise ValueError("a shard key is a scalar or a tuple/list of scalars, not a dict")
    return key if isinstance(key, (list, tuple)) else None


def strcrc32(key: Any) -> int:
    """vshard's ``strcrc32`` (Tarantool's ``digest.crc32`` of ``tostring`` of the
    key, or of each part of a tuple or list in turn).

    :param key: str, bytes, int, float, bool, or a tuple/list of them.
    :returns: the CRC, an unsigned 32-bit integer.
    :raises ValueError: a key vshard cannot hash the same way every time.
    """
    if type(key) is str:
        return _crc(key.encode())
    parts = _parts(key)
    if parts is None:
        return _crc(_tostring(key))
    for part in parts:
        if isinstance(part, (list, tuple, dict)):
            raise ValueError("strcrc32 takes scalar key parts (vshard would hash the "
                             "address of a nested table)")
    return _crc(b"".join(_tostring(part) for part in parts))


def mpcrc32(key: Any, varbinary: bool = True) -> int:
    """vshard's ``mpcrc32``: the CRC of each part's MessagePack (strings as they are).
    A NaN hashes as vshard's does: as LuaJIT's one NaN, whatever its sign or payload.

    :param key: str, bytes, int, float, bool, None inside a tuple, or a tuple/list.
    :param varbinary: the server decodes binary keys to varbinary (Tarantool 3.0+);
        False for 2.x, where a binary part is hashed as a string.
    :returns: the CRC, an unsigned 32-bit integer.
    :raises ValueError: a key vshard cannot hash.
    """
    kind = type(key)
    if kind is int and -(1 << 63) <= key < (1 << 64):   # the usual keys, directly
        return _crc(_pack_int(key))
    if kind is str:
        return _crc(key.encode())
    parts = _parts(key)
    if parts is None:
        return _crc(_mp_one(key, varbinary))
    return _crc(b"".join(_mp_one(part, varbinary) for part in parts))


def bucket_id_strcrc32(key: Any, bucket_count: int) -> int:
    """``strcrc32(key) % bucket_count + 1``, as ``vshard.router.bucket_id_strcrc32``.

    :param key: as for :func:`strcrc32`.
    :param bucket_count: vshard's ``bucket_count``.
    :returns: the bucket id, 1..bucket_count.
    :raises ValueError: a key vshard cannot hash the same way every time.
    """
    return strcrc32(key) % bucket_count + 1


def bucket_id_mpcrc32(key: Any, bucket_count: int, varbinary: bool = True) -> int:
    """``mpcrc32(key) % bucket_count + 1``, as ``vshard.router.bucket_id_mpcrc32``.

    :param key: as for :func:`mpcrc32`.
    :param bucket_count: vshard's ``bucket_count``.
    :param varbinary: as for :func:`mpcrc32`.
    :returns: the bucket id, 1..bucket_count.
    :raises ValueError: a key vshard cannot hash.
    """
    return mpcrc32(key, varbinary) % bucket_count + 1
