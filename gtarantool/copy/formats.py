"""Rows as text: CSV, TSV and JSON Lines, converted by the space's format.

``Converter(fields, columns, fmt, null)`` turns one parsed record (a list of
strings for CSV/TSV, a dict or list for JSONL) into the tuple the space takes,
or raises ``BadRow`` whose message is the reason a person can act on (the
column, the field, its type, the value); ``line_rows``/``record_rows`` convert
many records at once by a plan of the common types (in C where it is built),
leaving the rest to ``row``.  ``Exporter`` does the reverse, and export then
import gives the same rows.  ``records`` cuts a file into records as text (a
quoted CSV value may span lines) and ``blocks`` reads it as bytes cut at
record ends, so that a feeder can hand them to worker processes unparsed;
``parse`` parses a list of them.
"""
from __future__ import annotations

import base64
import bisect
import csv
import datetime as _dt
import decimal
import io
import json
import re
import uuid
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence

from tarantool.msgpack_ext.types.datetime import Datetime

from gtarantool import compiled
from gtarantool.protocol import bulk

__all__ = ["FORMATS", "BadRow", "Block", "Converter", "Exporter", "Field", "blocks", "lines_of",
           "parse", "records", "split_records"]

FORMATS = ("csv", "tsv", "jsonl")

# The csv module refuses a value past 128 KiB ("field larger than field limit"),
# which the line splitter and an export do not: a value as long as a tuple holds
if csv.field_size_limit() < (1 << 31) - 1:
    csv.field_size_limit((1 << 31) - 1)
UNWRITTEN = frozenset(("interval",))   # field types an export refuses


class BadRow(ValueError):
    """A record that cannot become a tuple of the space; the message says why."""


class Field:
    """One field of a space's format: ``name``, ``type`` (lower case, ``any``
    when the format gives none), ``nullable``, ``default`` (the format gives
    it a default, Tarantool 3.0+: the server puts it in place of a null or an
    absent value)."""

    __slots__ = ("name", "type", "nullable", "default")

    def __init__(self, name: str, type: str = "any", nullable: bool = False,
                 default: bool = False) -> None:
        self.name, self.type, self.nullable = name, (type or "any").lower(), nullable
        self.default = default

    @classmethod
    def from_format(cls, entry: Dict[str, Any]) -> Field:
        """A Field from one entry of ``space:format()`` as ``_vspace`` holds it."""
        return cls(entry.get("name", ""), entry.get("type", "any"),
                   bool(entry.get("is_nullable", False)),
                   "default" in entry or "default_func" in entry)

    @property
    def null_text(self) -> bool:
        """Whether the null text of CSV/TSV is null here: in a nullable field, or
        one with a default but of a type that has no text of its own for it (in a
        ``string``, ``any`` or ``scalar`` field that is not nullable it is text)."""
        return self.nullable or self.default and self.type not in ("string", "any", "scalar")

    def __repr__(self) -> str:
        return "Field(%r, %r%s%s)" % (self.name, self.type, ", nullable" if self.nullable else "",
                                      ", default" if self.default else "")


# -- text -> value ---------------------------------------------------------------------

_TRUE = frozenset(("true", "t", "1", "yes", "y", "on"))
_FALSE = frozenset(("false", "f", "0", "no", "n", "off"))
_OFFSET_MIN, _OFFSET_MAX = -12 * 60, 14 * 60   # minutes, as the server takes them
_DATETIME = re.compile(r"(\d{4})-(\d\d)-(\d\d)(?:[T ](\d\d):(\d\d)(?::(\d\d)(?:\.(\d{1,9}))?)?)?"
                       r"\s*(Z|[+-]\d\d:?\d\d)?$", re.ASCII)


# What Tarantool's integers hold (MessagePack's int64 and uint64)
_INT_MIN, _UINT_MAX = -(1 << 63), (1 << 64) - 1
DECIMAL_DIGITS = 38   # a Tarantool decimal's digits


def _plain(text):
    """Whether ``text`` spells a number as a file does: ASCII, no ``_`` (int(),
    float() and Decimal() take ``1_000`` and other scripts' digits, ``٣``)."""
    return text.isascii() and "_" not in text


def _int(text):
    try:
        if _plain(text):
            return int(text)
    except ValueError:
        if text.strip().lstrip("+-").isdigit():   # (more digits than int() reads)
            raise ValueError(_OUT_OF_RANGE) from None
    raise ValueError("not an integer")


_OUT_OF_RANGE = "out of range: Tarantool's integers go from -2^63 to 2^64-1"


def _in_range(v):
    # (the packer's own error, "Unknown type: 18446744073709551616", names no field)
    if not _INT_MIN <= v <= _UINT_MAX:
        raise ValueError(_OUT_OF_RANGE)
    return v


def _float(text):
    # (inf, -inf and nan too: a double holds them, and an export writes them so;
    # but not a finite number too large for a double, which float() makes inf)
    try:
        f = float(text) if _plain(text) else None
    except ValueError:
        f = None
    if f is None:
        raise ValueError("not a number")
    if f - f != 0.0 and f == f and "inf" not in text.lower():
        raise ValueError("out of range: a double holds at most about 1.8e308")
    return f


def _unsigned(v):
    if type(v) is not int:
        v = _int(v) if type(v) is str else _no(v, "an unsigned integer")
    if v < 0:
        raise ValueError("a negative number")
    return _in_range(v)


def _integer(v):
    if type(v) is not int:
        v = _int(v) if type(v) is str else _no(v, "an integer")
    return _in_range(v)


def _number(v):
    if type(v) is int:
        return _in_range(v)
    if type(v) is float:
        return v
    if type(v) is not str:
        return _no(v, "a number")
    try:
        n = int(v) if _plain(v) else None
    except ValueError:
        n = None
    return _float(v) if n is None else _in_range(n)


def _double(v):
    if type(v) is int or type(v) is float:
        return float(v)
    return _float(v) if type(v) is str else _no(v, "a double")


def _string(v):
    return v if type(v) is str else _no(v, "a string")


def _boolean(v):
    if type(v) is bool:
        return v
    if type(v) is str:
        low = v.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
    raise ValueError("not true/false")


def _decimal(v):
    if type(v) is int:
        return _exact_decimal(decimal.Decimal(v))
    if type(v) is float:
        v = repr(v)
    if type(v) is not str:
        return _no(v, "a decimal")
    try:
        d = decimal.Decimal(v.strip()) if _plain(v) else None
    except decimal.InvalidOperation:
        d = None
    if d is None:
        raise ValueError("not a decimal number")
    if not d.is_finite():
        raise ValueError("not a finite decimal")
    return _exact_decimal(d)


def _exact_decimal(d):
    """``d`` as a Tarantool decimal holds it, or ValueError: tarantool-python's
    packer refuses more than 38 digits before the point (failing the whole
    batch) and rounds more than 38 in all with a mere warning (1E-40 is
    written as 0), so such a value is refused here, by its field."""
    text = format(d, "f").lstrip("-")
    whole, _, frac = text.partition(".")
    if len(whole) > DECIMAL_DIGITS:
        raise ValueError("more than %d digits before the decimal point, more than a "
                         "Tarantool decimal holds" % DECIMAL_DIGITS)
    if _decimal_fits(whole, frac):
        return d
    frac = frac.rstrip("0")    # (zeros at the end say nothing of the value: dropped)
    if _decimal_fits(whole, frac):
        return decimal.Decimal(("-" if d.is_signed() else "") + whole + "." + frac)
    if whole == "0":
        raise ValueError("%d digits after the decimal point, more than the %d a Tarantool "
                         "decimal holds (it would be rounded)" % (len(frac), DECIMAL_DIGITS))
    raise ValueError("%d digits, more than the %d a Tarantool decimal holds (it would be "
                     "rounded)" % (len(whole) + len(frac), DECIMAL_DIGITS))


def _decimal_fits(whole, frac):
    # (the packer's rule: 38 digits, the zero before the point of 0.xxx not counted)
    return len(whole) + len(frac) <= DECIMAL_DIGITS or \
        whole == "0" and len(frac) <= DECIMAL_DIGITS


# (uuid.UUID() reads the hex by int(), which skips spaces and takes a sign, an
# underscore and other scripts' digits: 'abc…def ' is read shifted by a digit)
_UUID = re.compile(r"(?:urn:uuid:)?(\{)?[0-9a-fA-F]{8}(-?)[0-9a-fA-F]{4}\2[0-9a-fA-F]{4}\2"
                   r"[0-9a-fA-F]{4}\2[0-9a-fA-F]{12}(?(1)\})$")


def _uuid(v):
    if type(v) is not str:
        return _no(v, "a UUID")
    if _UUID.match(v) is None:
        raise ValueError("not a UUID")
    return uuid.UUID(v)


def _datetime(v):
    if type(v) is not str:
        return _no(v, "a datetime (ISO 8601)")
    m = _DATETIME.match(v.strip())
    if m is None:
        raise ValueError("not an ISO 8601 datetime (YYYY-MM-DDTHH:MM:SS[.fff][+HH:MM])")
    year, month, day, hour, minute, sec, frac, zone = m.groups()
    offset = 0
    if zone and zone != "Z":
        digits = zone[1:].replace(":", "")
        if int(digits[2:]) > 59:
            raise ValueError("offset %s has more than 59 minutes" % zone)
        offset = (int(digits[:2]) * 60 + int(digits[2:])) * (-1 if zone[0] == "-" else 1)
        if not _OFFSET_MIN <= offset <= _OFFSET_MAX:
            # (the server refuses the whole request; pytz says "absolute offset is too large")
            raise ValueError("offset %s is out of range: Tarantool takes -12:00 to +14:00"
                             % zone)
    _dt.date(int(year), int(month), int(day))   # ValueError for 2024-02-30
    return Datetime(year=int(year), month=int(month), day=int(day), hour=int(hour or 0),
                    minute=int(minute or 0), sec=int(sec or 0),
                    nsec=int((frac or "0").ljust(9, "0")), tzoffset=offset)


def _varbinary(v):
    if type(v) is not str:
        return _no(v, "base64 text")
    try:
        return base64.b64decode(v, validate=True)
    except ValueError:
        raise ValueError("not base64") from None


class _OutOfRange(ValueError):
    """A JSON number no double holds (json makes 1e400 inf without a word)."""


def _json_float(text):
    f = float(text)
    if f - f != 0.0:
        raise _OutOfRange("%s is out of range: a double holds at most about 1.8e308" % text)
    return f


def _json(text):
    """``json.loads(text)``, refusing a number too large for a double."""
    return json.loads(text, parse_float=_json_float)


def _json_of(kind, name):
    def convert(v):
        if type(v) is str:
            try:
                value = _json(v)
            except _OutOfRange:
                raise
            except ValueError:
                raise ValueError("not JSON") from None
            v = _json_ints(value, v)
        if type(v) is not kind:
            raise ValueError("not a JSON %s" % name)
        return v
    return convert


def _any(v):
    if type(v) is str:
        try:
            value = _json(v)
        except _OutOfRange:
            raise
        except ValueError:
            return v    # text that is no JSON is the string itself
        return _json_ints(value, v)
    if type(v) is int:
        return _in_range(v)
    return v


_LONG_NUMBER = re.compile(r"\d{19}")   # (the shortest integer beyond int64's range)


def _json_ints(value, text):
    """``value`` (``text`` read as JSON), or ValueError when an integer in it is
    beyond Tarantool's: looked for only where the text has so many digits."""
    if _LONG_NUMBER.search(text) is not None:
        _ints_in_range(value)
    return value


def _ints_in_range(value):
    if type(value) is int:
        _in_range(value)
    elif type(value) is list:
        for item in value:
            _ints_in_range(item)
    elif type(value) is dict:
        for key, item in value.items():
            _ints_in_range(key)
            _ints_in_range(item)


def _itself(v):
    return v


def _json_number(v):
    """A JSONL ``number``: a JSON number as it is, a string a decimal (an export
    writes a decimal so, an integer or a double being a JSON number)."""
    if type(v) is str:
        try:
            d = decimal.Decimal(v.strip()) if _plain(v) else None
        except decimal.InvalidOperation:
            d = None
        if d is None:
            raise ValueError("not a number")
        return _exact_decimal(d) if d.is_finite() else _float(v)
    return _number(v)


def _no(v, what):
    raise ValueError("%s is not %s" % (type(v).__name__, what))


CONVERTERS: Dict[str, Callable[[Any], Any]] = {
    "unsigned": _unsigned, "integer": _integer, "number": _number, "double": _double,
    "string": _string, "boolean": _boolean, "decimal": _decimal, "uuid": _uuid,
    "datetime": _datetime, "varbinary": _varbinary, "map": _json_of(dict, "object"),
    "array": _json_of(list, "array"), "any": _any, "scalar": _any,
}


def _text_unsigned(text):
    if not _plain(text):
        raise ValueError("not an integer")
    v = int(text)
    if not 0 <= v <= _UINT_MAX:
        raise ValueError("out of range")
    return v


def _text_integer(text):
    if not _plain(text):
        raise ValueError("not an integer")
    v = int(text)
    if not _INT_MIN <= v <= _UINT_MAX:
        raise ValueError("out of range")
    return v


# The converters of CSV/TSV text for the common types (the same results as
# CONVERTERS' for a str; their errors are told by CONVERTERS').
TEXT_CONVERTERS: Dict[str, Callable[[str], Any]] = {"unsigned": _text_unsigned,
                                                    "integer": _text_integer}


class Converter:
    """Records -> tuples of a space.

    :param fields: the space's format, a list of :class:`Field`.
    :param columns: the field names of the record's columns in order (CSV/TSV
        and JSONL arrays), or None: the format's fields in order.  A JSONL
        object is matched by its keys.  A field past the format is named by
        its position, ``field9`` (as :class:`Exporter` names it), and is of
        type ``any``; when the columns name every field of the format, a
        record may have more columns than named: the fields after the
        format's (or after the last named), in order.
    :param null: the CSV/TSV text that means null (in a nullable field).
    :param json: the records are JSON values (JSONL), not text: only a JSON
        null is null, and a string is a string (in an ``any`` field too, where
        CSV/TSV text that is JSON is read as JSON).
    """

    def __init__(self, fields: Sequence[Field], columns: Optional[Sequence[str]] = None,
                 null: str = "", json: bool = False) -> None:
        names = [f.name for f in fields]
        self.fields = list(fields)
        self.null = null
        self.json = json
        if columns is None:
            columns = names
        past = [_position(c) for c in columns if c not in names]
        unknown = [c for c in columns if c not in names and not _position(c) > len(names)]
        if not unknown and past:   # (fields past the format: of any type, nullable)
            fields = self.fields + [Field("field%d" % k, "any", True)
                                    for k in range(len(names) + 1, max(past) + 1)]
            names = [f.name for f in fields]
        if unknown:
            raise ValueError("no field named %s in the space (it has %s)"
                             % (", ".join(unknown), ", ".join(names)))
        twice = sorted({c for c in columns if list(columns).count(c) > 1})
        if twice:
            raise ValueError("more than one column is named %s" % ", ".join(twice))
        self.columns = list(columns)
        self._slots = [names.index(c) for c in columns]
        missing = [f.name for f in fields
                   if f.name not in columns and not f.nullable and not f.default]
        if missing:
            raise ValueError("the columns leave out %s, which cannot be null (and have no "
                             "default)"
                             % ", ".join(missing))
        self._width = max(self._slots) + 1 if self._slots else 0
        # columns past the named ones are the tuple's fields past these (an
        # export writes every field of a tuple), when every field of the
        # format is named: else a column too many is a mistake, said so
        self._more = all(f.name in columns for f in self.fields)
        self._past = max(self._width, len(self.fields))
        self._plan = [(slot, fields[slot], CONVERTERS.get(fields[slot].type, _any))
                      for slot in self._slots]
        if json:
            self._plan = [(slot, field, _itself if convert is _any else
                           _json_number if convert is _number else convert)
                          for slot, field, convert in self._plan]
        self._text_row = self._compile()
        # The common types by a plan, in C where it is built (protocol.bulk: the twin).
        self.plan = tuple((slot, bulk.KINDS.get(field.type, bulk.KIND_CALL), field.null_text,
                           None if field.type in bulk.KINDS else convert)
                          for slot, field, convert in self._plan)
        encoder = compiled.encoder
        self._convert_lines = encoder.convert_lines if encoder else bulk.convert_lines
        self._convert_records = encoder.convert_records if encoder else bulk.convert_records

    def _compile(self) -> Callable[[List[str]], tuple]:
        """A function of a list of strings (a CSV/TSV record) building the tuple in
        one expression; any exception sends the record to :meth:`_row`, which
        says why.  It accepts exactly what _row accepts (the same converters, a
        null only where _row takes one)."""
        env: Dict[str, Any] = {"len": len}
        parts = ["None"] * self._width
        for k, (slot, field, convert) in enumerate(self._plan):
            env["c%d" % k] = TEXT_CONVERTERS.get(field.type, convert)
            value = "r[%d]" % k if field.type == "string" else "c%d(r[%d])" % (k, k)
            if field.null_text:
                value = "(None if r[%d] == null else %s)" % (k, value)
            parts[slot] = value
        env["null"] = self.null
        code = "def row(r):\n    return (%s,)\n" % ", ".join(parts) if parts else \
            "def row(r):\n    return ()\n"
        exec(code, env)   # noqa: S102 - built from field numbers only
        return env["row"]

    def line_rows(self, data: bytes, n: int, delimiter: str, quote: str
                  ) -> Optional[List[Optional[tuple]]]:
        """The tuples of the ``n`` CSV/TSV records in ``data`` when each is one
        line (no quoted value spans lines), or None.  An item is None where the
        line holds a quote or a carriage return, or a value in another spelling
        than the plain one (``+5``, `` 5``): :meth:`row` of the parsed record
        converts it or says why not."""
        return self._convert_lines(data, n, delimiter, quote, self.null, self._width,
                                   self.plan)

    def record_rows(self, records: List[Any]) -> List[Optional[tuple]]:
        """The tuples of parsed CSV/TSV records (lists of strings), None where
        :meth:`row` must convert the record or say why not."""
        return self._convert_records(records, self.null, self._width, self.plan)

    def row(self, record: Any) -> tuple:
        """The tuple for one record: a list of strings (CSV/TSV) or of JSON values,
        or a dict (JSONL object).

        :raises BadRow: the reason it cannot be converted.
        """
        if type(record) is list and len(record) == len(self._plan) and not self.json:
            try:
                return self._text_row(record)
            except Exception:   # noqa: BLE001 - the general path below says why
                pass
        return self._row(record)

    def _row(self, record: Any) -> tuple:
        more: Dict[int, Any] = {}    # fields past the format: slot -> value
        if type(record) is dict:
            record, more = self._from_object(record)
            null = None
        elif type(record) is list:
            null = None if self.json else self.null
            n = len(self._plan)
            if len(record) > n and self._more:
                more = dict(enumerate(record[n:], self._past))
                record = record[:n]
        else:   # (a JSON line that is a number, a string, true or null)
            raise BadRow("a JSON line must be an object (by field name) or an array "
                         "(by column), not %s" % _show(record))
        if len(record) != len(self._plan):
            raise BadRow("%d columns where %d were expected (%s)"
                         % (len(record), len(self._plan), ", ".join(self.columns)))
        out: List[Any] = [None] * max(self._width, max(more, default=-1) + 1)
        convert_more = _itself if self.json else _any
        for slot, value in more.items():
            if value is None or value == null and type(value) is str:
                continue
            try:
                out[slot] = convert_more(value)
            except ValueError as exc:
                raise BadRow("field field%d (any): %s: %s" % (slot + 1, _show(value), exc)
                             ) from None
        for (slot, field, convert), value in zip(self._plan, record):
            if value is None or value == null and type(value) is str:
                if not field.nullable:
                    if value is None and (field.type == "any" or field.default) or \
                            field.null_text:
                        continue   # (the server takes null in a field of type any, and
                        # puts a field's default in place of null)
                    if value is None or field.type not in ("string", "any", "scalar"):
                        raise BadRow("field %s (%s) cannot be null" % (field.name, field.type))
                    out[slot] = convert(value)   # (the text itself, as _text_row gives it)
                continue
            try:
                out[slot] = convert(value)
            except (ValueError, TypeError, OverflowError) as exc:
                raise BadRow("field %s (%s): %s: %s"
                             % (field.name, field.type, _show(value), exc)) from None
        return tuple(out)

    def _from_object(self, obj):
        extra = [k for k in obj if k not in self.columns]
        more = {}
        for k in extra:
            position = _position(k)
            if position > len(self.fields):   # a field past the format, by its position
                more[position - 1] = obj[k]
        if len(more) < len(extra):
            bad = [str(k) for k in extra if _position(k) <= len(self.fields)]
            named = {f.name for f in self.fields}
            left_out = [k for k in bad if k in named]
            if left_out:   # (a field of the space the columns leave out)
                raise BadRow("%s: a field of the space, but not among --columns (%s)"
                             % (", ".join(left_out), ", ".join(self.columns)))
            raise BadRow("no field named %s in the space" % ", ".join(bad))
        return [obj.get(c) for c in self.columns], more


_FIELD_NO = re.compile(r"field([1-9][0-9]{0,8})$")


def _position(name: Any) -> int:
    """The position (1-based) a field's name ``field9`` gives, or 0."""
    m = _FIELD_NO.match(name) if type(name) is str else None
    return int(m.group(1)) if m else 0


def _show(value, limit=40):
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


# -- value -> text ---------------------------------------------------------------------

def _json_default(v):
    if isinstance(v, bytes):
        return base64.b64encode(v).decode("ascii")
    if isinstance(v, (decimal.Decimal, uuid.UUID, Datetime)):
        return str(v)
    raise TypeError("%s is not JSON" % type(v).__name__)


def _dumps(v):
    try:
        return json.dumps(v, ensure_ascii=False, separators=(",", ":"), default=_json_default)
    except TypeError:   # (a map's key json takes no default for: bytes, a decimal)
        return json.dumps(_keyed(v), ensure_ascii=False, separators=(",", ":"),
                          default=_json_default)


_JSON_KEYS = (str, int, float, bool, type(None))


def _keyed(v):
    """``v`` with the keys of its maps that JSON has no key for as text: a
    binary key as its base64, a decimal, UUID or datetime as its text, an
    array as its JSON."""
    if isinstance(v, dict):
        return {k if isinstance(k, _JSON_KEYS) else _key(k): _keyed(item)
                for k, item in v.items()}
    if isinstance(v, (list, tuple)):
        return [_keyed(item) for item in v]
    return v


def _key(k):
    try:
        return _json_default(k)
    except TypeError:
        return _dumps(k)


def _text(kind):
    """value -> CSV text for a field of type ``kind``."""
    if kind == "boolean":
        return lambda v: "true" if v else "false"
    if kind == "varbinary":
        return lambda v: base64.b64encode(v).decode("ascii")
    if kind in ("map", "array", "any", "scalar"):
        return lambda v: v if kind != "any" and kind != "scalar" and type(v) is str else _dumps(v)
    if kind == "double":
        return repr
    return str


def _native(kind):
    """value -> JSON value for a field of type ``kind``."""
    if kind == "varbinary":
        return lambda v: base64.b64encode(v).decode("ascii")
    if kind in ("decimal", "uuid", "datetime"):
        return str
    return None


class Exporter:
    """Tuples -> records of one format, the inverse of :class:`Converter`.

    Every field of a tuple is written: those past the format (a space with
    no format has only its key's) as ``any`` fields, after the format's
    columns (CSV/TSV) or under their position's name, ``field9`` (JSONL).

    :param fields: the space's format.
    :param fmt: ``csv``, ``tsv`` or ``jsonl``.
    :param null: the text written for null in CSV/TSV.
    :raises ValueError: a field of a type no format writes (``interval``).
    """

    def __init__(self, fields: Sequence[Field], fmt: str = "csv", null: str = "") -> None:
        unwritten = ["%s (%s)" % (f.name, f.type) for f in fields if f.type in UNWRITTEN]
        if unwritten:
            raise ValueError("no format writes %s: no text form of it is read back"
                             % ", ".join(unwritten))
        self.fields, self.fmt, self.null = list(fields), fmt, null
        self._text = [_text(f.type) for f in fields]
        # (null in an any field that is not nullable, which the server takes,
        # as its JSON: the null text there is read as text)
        self._nulls = ["null" if f.type == "any" and not f.nullable else null for f in fields]
        self._native = [_native(f.type) for f in fields]

    def header(self) -> List[str]:
        """The field names, for a CSV/TSV header line."""
        return [f.name for f in self.fields]

    def record(self, tup: Sequence[Any]) -> Any:
        """One tuple as a list of strings (CSV/TSV) or a dict (JSONL)."""
        n = len(self.fields)
        if self.fmt == "jsonl":
            out = {}
            for i, field in enumerate(self.fields):
                v = tup[i] if i < len(tup) else None
                conv = self._native[i]
                out[field.name] = v if v is None or conv is None else conv(v)
            for i in range(n, len(tup)):
                out["field%d" % (i + 1)] = tup[i]
            return out
        nulls = self._nulls
        row = [nulls[i] if (v := (tup[i] if i < len(tup) else None)) is None
               else self._text[i](v) for i in range(n)]
        if len(tup) > n:
            row += [self.null if v is None else _dumps(v) for v in tup[n:]]
        return row

    def writer(self, out: Any, delimiter: Optional[str] = None, quote: str = '"') -> Any:
        """A writer of :meth:`record`'s lists into the text stream ``out``
        (``writerow``), for CSV/TSV: a value holding a carriage return is
        quoted (the csv module's writer quotes only the delimiter, the quote
        and the line terminator's newline, and its reader refuses a bare
        carriage return in an unquoted value)."""
        return _Writer(out, dialect(self.fmt, delimiter, quote))

    def line(self, tup: Sequence[Any]) -> str:
        """One tuple as a JSON line (jsonl only), newline included."""
        return _dumps(self.record(tup)) + "\n"


class _Writer:
    """csv.writer, with the rows that hold a carriage return quoted whole."""

    def __init__(self, out: Any, options: Dict[str, Any]) -> None:
        self._plain = csv.writer(out, **options)
        self._quoted = csv.writer(out, quoting=csv.QUOTE_ALL, **options)

    def writerow(self, row: Sequence[str]) -> Any:
        for v in row:
            if "\r" in v:
                return self._quoted.writerow(row)
        return self._plain.writerow(row)


# -- records ---------------------------------------------------------------------------

def dialect(fmt: str, delimiter: Optional[str] = None, quote: str = '"') -> Dict[str, Any]:
    """csv.reader/writer keyword arguments for ``fmt`` (csv or tsv)."""
    sep = delimiter or ("\t" if fmt == "tsv" else ",")
    return {"delimiter": sep, "quotechar": quote, "doublequote": True, "strict": True,
            "lineterminator": "\n"}


def _separator(fmt: str, delimiter: Optional[str]) -> bytes:
    return (delimiter or ("\t" if fmt == "tsv" else ",")).encode()


def _inside(data: Any, q: bytes, d: bytes, inside: bool = False) -> bool:
    """Whether ``data`` (whole lines, the first starting in a quoted value when
    ``inside``) ends in a quoted value, its quotes read as the csv module reads
    them: a quote opens a value only at a field's start (``5" screen`` is
    text), and in a quoted value a doubled quote is a quote, a single one ends it."""
    n, at = len(q), 0
    while True:
        i = data.find(q, at)
        if i < 0:
            return inside
        if inside:
            if data.startswith(q, i + n):
                at = i + 2 * n
                continue
            inside = False
        elif i == 0 or data[i - 1] == 10 or data.endswith(d, 0, i):   # (10: a newline)
            inside = True
        at = i + n


def _paired(parts: List[Any], d: bytes) -> bool:
    """Whether the quotes of ``data.split(quote)`` pair in order as the csv
    module pairs them: each that opens a pair is at a field's start (or right
    after the quote before it: a doubled quote)."""
    return all(not part or part.endswith(d) or part.endswith(b"\n")
               for part in parts[0:-1:2])


def records(lines: Iterable[bytes], fmt: str, quote: str = '"',
            delimiter: Optional[str] = None) -> Iterator[bytes]:
    """One bytes object per record, as it was in the file (its newline kept):
    for CSV/TSV a line that ends in a quoted value goes on with the next one
    (quotes read as the csv module reads them: :func:`_inside`).  Blank lines
    are records too (they fail to convert, with their number)."""
    if fmt == "jsonl":
        yield from lines
        return
    q, d = quote.encode(), _separator(fmt, delimiter)
    pending: Optional[List[bytes]] = None     # (joined once: no copy per line)
    for line in lines:
        if pending is not None:
            pending.append(line)
            if q in line and not _inside(line, q, d, True):
                yield b"".join(pending)
                pending = None
        elif q in line and _inside(line, q, d):
            pending = [line]
        else:
            yield line
    if pending is not None:
        yield b"".join(pending)


def lines_of(data: Any) -> List[bytes]:
    """The lines of ``data``, each with its newline (the last one perhaps without)."""
    return io.BytesIO(data).readlines()


def split_records(data: Any, fmt: str, quote: str = '"',
                  delimiter: Optional[str] = None) -> List[bytes]:
    """The records of ``data`` (whole records, as :class:`Block` holds them) as
    :func:`records` cuts them."""
    lines = lines_of(data)
    if fmt == "jsonl" or quote.encode() not in data:
        return lines
    return list(records(lines, fmt, quote, delimiter))


class Block:
    """Whole records of a file as one bytes-like object: ``data``, ``count`` (records).

    Records are lines unless a quoted value spans lines (CSV/TSV): then the
    records' ends are found as :func:`records` finds them, line by line.
    """

    __slots__ = ("data", "count", "_ends", "_avg")

    def __init__(self, data: Any, fmt: str, quote: str = '"',
                 delimiter: Optional[str] = None) -> None:
        self.data = data
        self._ends: Optional[List[int]] = None
        q = quote.encode()
        if fmt != "jsonl" and q in data:
            parts = data.split(q)
            # (text between an odd and an even quote is quoted, when they pair so)
            if len(parts) % 2 == 0 or b"\n" in b"".join(parts[1::2]) or \
                    not _paired(parts, _separator(fmt, delimiter)):
                ends, at = [], 0
                for record in records(lines_of(data), fmt, quote, delimiter):
                    at += len(record)
                    ends.append(at)
                self._ends = ends
        if self._ends is not None:
            self.count = len(self._ends)
        else:
            self.count = _count_lines(data)
        self._avg = len(data) / self.count if self.count else 1.0

    def after(self, pos: int, k: int) -> int:
        """The offset after the ``k`` records from offset ``pos`` (a record's start;
        ``k`` at most the records left)."""
        if k <= 0:
            return pos
        if self._ends is not None:
            return self._ends[bisect.bisect_right(self._ends, pos) + k - 1]
        data = self.data
        at = min(len(data), pos + int(k * self._avg))   # a guess, then line by line
        n = data.count(b"\n", pos, at)
        if n < k:
            for _ in range(k - n):
                nl = data.find(b"\n", at)
                if nl < 0:
                    return len(data)   # the last line, with no newline
                at = nl + 1
            return at
        for _ in range(n - k + 1):
            at = data.rfind(b"\n", pos, at)
        return at + 1


def _count_lines(data: Any) -> int:
    """The lines of ``data`` (the last one perhaps without a newline)."""
    first = data.find(b"\n")
    if first < 0:
        return 1 if data else 0
    if first < 256:
        n = data.count(b"\n")   # (a byte at a time: the faster for short lines)
    else:
        n, find = 0, data.find   # (the search skips a long line at memory speed)
        while first >= 0:
            n += 1
            first = find(b"\n", first + 1)
    return n + (0 if data.endswith(b"\n") else 1)


def blocks(stream: Any, fmt: str, quote: str = '"', size: int = 1 << 20,
           delimiter: Optional[str] = None) -> Iterator[Block]:
    """``stream`` (binary: ``readinto``, ``readline``) as :class:`Block` objects
    of about ``size`` bytes each (``data`` a bytearray), every one ending where a
    record ends."""
    q, d = quote.encode(), _separator(fmt, delimiter)
    while True:
        # (read into a bytearray, which the line's end is added to in place:
        # the block is copied once, when a chunk is cut out of it)
        data = bytearray(size)
        got = stream.readinto(data)
        if not got:
            return
        del data[got:]
        if not data.endswith(b"\n"):
            data += stream.readline()
        if fmt != "jsonl" and q in data and _ends_inside(data, q, d):
            # a quoted value goes on: up to the line that closes it (records()'s rule)
            while True:
                line = stream.readline()
                data += line
                if not line or q in line and not _inside(line, q, d, True):
                    break
        yield Block(data, fmt, quote, delimiter)


def _ends_inside(data: Any, q: bytes, d: bytes) -> bool:
    """Whether whole lines ``data`` end in a quoted value (:func:`_inside`)."""
    parts = data.split(q)
    if len(parts) % 2 and _paired(parts, d):
        return False   # (the quotes pair in order: none is left open)
    return _inside(data, q, d)


def _decode(raw):
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return BadRow("not UTF-8: byte 0x%02x at offset %d" % (raw[exc.start], exc.start))


def _unquoted(raws: Sequence[bytes], options: Dict[str, Any]) -> Optional[List[Any]]:
    """The records split at the delimiter when none of them holds the quote
    character or a carriage return (what ``csv.reader`` then gives, without its
    state machine walking every character), or None: they go through
    ``csv.reader``.  Each record is one line, then (``records`` joins lines
    only for a quote), and a blank one is left for the general path to report."""
    blob = b"".join(raws)
    if options["quotechar"].encode() in blob or b"\r" in blob:
        return None
    try:
        lines = blob.decode("utf-8").split("\n")
    except UnicodeDecodeError:
        return None
    n = len(raws)
    # n lines, and an empty string after the last newline when it ends with one
    if len(lines) != n + (1 if blob.endswith(b"\n") else 0):
        return None
    sep = options["delimiter"]
    rows = [line.split(sep) for line in lines[:n]]
    for row in rows:
        if row == [""]:   # a blank line: an error of its own, said by the general path
            return None
    return rows


def parse(raws: Sequence[bytes], fmt: str, options: Dict[str, Any]) -> List[Any]:
    """The records in ``raws`` (as :func:`records` cut them) parsed: a list of
    strings per CSV/TSV record, a JSON value per JSONL line, or a
    :class:`BadRow` in its place."""
    out: List[Any] = []
    if fmt == "jsonl":
        for raw in raws:
            text = _decode(raw)
            if type(text) is BadRow:
                out.append(text)
                continue
            try:
                out.append(_json(text))
            except _OutOfRange as exc:
                out.append(BadRow(str(exc)))
            except json.JSONDecodeError as exc:
                # (by column: its "line 2" is the end of the record, after its newline)
                where = "at the end of the line" if exc.pos >= len(text.rstrip("\r\n")) \
                    else "at column %d" % (exc.pos + 1)
                out.append(BadRow("not JSON: %s %s" % (exc.msg, where)))
            except ValueError as exc:
                out.append(BadRow("not JSON: %s" % exc))
        return out
    rows = _unquoted(raws, options)
    if rows is not None:
        return rows
    try:
        texts = [raw.decode("utf-8") for raw in raws]
        rows = list(csv.reader(texts, **options))
        if len(rows) == len(raws) and all(rows):
            return rows
    except (UnicodeDecodeError, csv.Error):
        pass    # one record at a time below, each with its own reason
    for raw in raws:
        text = _decode(raw)
        if type(text) is BadRow:
            out.append(text)
            continue
        try:
            rows = list(csv.reader([text], **options))
        except csv.Error as exc:
            out.append(BadRow("malformed CSV: %s" % exc))
            continue
        if len(rows) != 1:
            out.append(BadRow("an empty line" if not rows else "more than one record"))
        else:
            out.append(rows[0])
    return out
