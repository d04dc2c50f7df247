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
UNWRITTEN = frozenset(("interval",))   # field types an export refuses


class BadRow(ValueError):
    """A record that cannot become a tuple of the space; the message says why."""


class Field:
    """One field of a space's format: ``name``, ``type`` (lower case, ``any``
    when the format gives none), ``nullable``."""

    __slots__ = ("name", "type", "nullable")

    def __init__(self, name: str, type: str = "any", nullable: bool = False) -> None:
        self.name, self.type, self.nullable = name, (type or "any").lower(), nullable

    @classmethod
    def from_format(cls, entry: Dict[str, Any]) -> Field:
        """A Field from one entry of ``space:format()`` as ``_vspace`` holds it."""
        return cls(entry.get("name", ""), entry.get("type", "any"),
                   bool(entry.get("is_nullable", False)))

    def __repr__(self) -> str:
        return "Field(%r, %r%s)" % (self.name, self.type, ", nullable" if self.nullable else "")


# -- text -> value ---------------------------------------------------------------------

_TRUE = frozenset(("true", "t", "1", "yes", "y", "on"))
_FALSE = frozenset(("false", "f", "0", "no", "n", "off"))
_DATETIME = re.compile(r"(\d{4})-(\d\d)-(\d\d)(?:[T ](\d\d):(\d\d)(?::(\d\d)(?:\.(\d{1,9}))?)?)?"
                       r"\s*(Z|[+-]\d\d:?\d\d)?$")


def _int(text):
    try:
        return int(text)
    except ValueError:
        raise ValueError("not an integer") from None


def _float(text):
    # (inf, -inf and nan too: a double holds them, and an export writes them so)
    try:
        return float(text)
    except ValueError:
        raise ValueError("not a number") from None


def _unsigned(v):
    if type(v) is not int:
        v = _int(v) if type(v) is str else _no(v, "an unsigned integer")
    if v < 0:
        raise ValueError("a negative number")
    return v


def _integer(v):
    if type(v) is int:
        return v
    return _int(v) if type(v) is str else _no(v, "an integer")


def _number(v):
    if type(v) is int or type(v) is float:
        return v
    if type(v) is not str:
        return _no(v, "a number")
    try:
        return int(v)
    except ValueError:
        return _float(v)


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
        return decimal.Decimal(v)
    if type(v) is float:
        v = repr(v)
    if type(v) is not str:
        return _no(v, "a decimal")
    try:
        d = decimal.Decimal(v.strip())
    except decimal.InvalidOperation:
        raise ValueError("not a decimal number") from None
    if not d.is_finite():
        raise ValueError("not a finite decimal")
    return d


def _uuid(v):
    if type(v) is not str:
        return _no(v, "a UUID")
    try:
        return uuid.UUID(v)
    except ValueError:
        raise ValueError("not a UUID") from None


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
        offset = (int(digits[:2]) * 60 + int(digits[2:])) * (-1 if zone[0] == "-" else 1)
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


def _json_of(kind, name):
    def convert(v):
        if type(v) is str:
            try:
                v = json.loads(v)
            except ValueError:
                raise ValueError("not JSON") from None
        if type(v) is not kind:
            raise ValueError("not a JSON %s" % name)
        return v
    return convert


def _any(v):
    if type(v) is str:
        try:
            return json.loads(v)
        except ValueError:
            return v    # text that is no JSON is the string itself
    return v


def _itself(v):
    return v


def _no(v, what):
    raise ValueError("%s is not %s" % (type(v).__name__, what))


CONVERTERS: Dict[str, Callable[[Any], Any]] = {
    "unsigned": _unsigned, "integer": _integer, "number": _number, "double": _double,
    "string": _string, "boolean": _boolean, "decimal": _decimal, "uuid": _uuid,
    "datetime": _datetime, "varbinary": _varbinary, "map": _json_of(dict, "object"),
    "array": _json_of(list, "array"), "any": _any, "scalar": _any,
}


def _text_unsigned(text):
    v = int(text)
    if v < 0:
        raise ValueError("a negative number")
    return v


# The converters of CSV/TSV text for the common types (the same results as
# CONVERTERS' for a str; their errors are told by CONVERTERS').
TEXT_CONVERTERS: Dict[str, Callable[[str], Any]] = {"unsigned": _text_unsigned,
                                                    "integer": int}


class Converter:
    """Records -> tuples of a space.

    :param fields: the space's format, a list of :class:`Field`.
    :param columns: the field names of the record's columns in order (CSV/TSV
        and JSONL arrays), or None: the format's fields in order.  A JSONL
        object is matched by its keys.
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
        unknown = [c for c in columns if c not in names]
        if unknown:
            raise ValueError("no field named %s in the space (it has %s)"
                             % (", ".join(unknown), ", ".join(names)))
        twice = sorted({c for c in columns if list(columns).count(c) > 1})
        if twice:
            raise ValueError("more than one column is named %s" % ", ".join(twice))
        self.columns = list(columns)
        self._slots = [names.index(c) for c in columns]
        missing = [f.name for f in fields if f.name not in columns and not f.nullable]
        if missing:
            raise ValueError("the columns leave out %s, which cannot be null"
                             % ", ".join(missing))
        self._width = max(self._slots) + 1 if self._slots else 0
        self._plan = [(slot, fields[slot], CONVERTERS.get(fields[slot].type, _any))
                      for slot in self._slots]
        if json:
            self._plan = [(slot, field, _itself if convert is _any else convert)
                          for slot, field, convert in self._plan]
        self._text_row = self._compile()
        # The common types by a plan, in C where it is built (protocol.bulk: the twin).
        self.plan = tuple((slot, bulk.KINDS.get(field.type, bulk.KIND_CALL), field.nullable,
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
            if field.nullable:
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
        if type(record) is dict:
            record = self._from_object(record)
            null = None
        elif type(record) is list:
            null = None if self.json else self.null
        else:   # (a JSON line that is a number, a string, true or null)
            raise BadRow("a JSON line must be an object (by field name) or an array "
                         "(by column), not %s" % _show(record))
        if len(record) != len(self._plan):
            raise BadRow("%d columns where %d were expected (%s)"
                         % (len(record), len(self._plan), ", ".join(self.columns)))
        out: List[Any] = [None] * self._width
        for (slot, field, convert), value in zip(self._plan, record):
            if value is None or value == null and type(value) is str:
                if not field.nullable:
                    if value is None or field.type != "string":
                        raise BadRow("field %s (%s) cannot be null" % (field.name, field.type))
                    out[slot] = value
                continue
            try:
                out[slot] = convert(value)
            except (ValueError, TypeError, OverflowError) as exc:
                raise BadRow("field %s (%s): %s: %s"
                             % (field.name, field.type, _show(value), exc)) from None
        return tuple(out)

    def _from_object(self, obj):
        extra = [k for k in obj if k not in self.columns]
        if extra:
            raise BadRow("no field named %s in the space" % ", ".join(map(str, extra)))
        return [obj.get(c) for c in self.columns]


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
    return json.dumps(v, ensure_ascii=False, separators=(",", ":"), default=_json_default)


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
            return out
        return [self.null if (v := (tup[i] if i < len(tup) else None)) is None
                else self._text[i](v) for i in range(n)]

    def line(self, tup: Sequence[Any]) -> str:
        """One tuple as a JSON line (jsonl only), newline included."""
        return _dumps(self.record(tup)) + "\n"


# -- records ---------------------------------------------------------------------------

def dialect(fmt: str, delimiter: Optional[str] = None, quote: str = '"') -> Dict[str, Any]:
    """csv.reader/writer keyword arguments for ``fmt`` (csv or tsv)."""
    sep = delimiter or ("\t" if fmt == "tsv" else ",")
    return {"delimiter": sep, "quotechar": quote, "doublequote": True, "strict": True,
            "lineterminator": "\n"}


def records(lines: Iterable[bytes], fmt: str, quote: str = '"') -> Iterator[bytes]:
    """One bytes object per record, as it was in the file (its newline kept):
    for CSV/TSV a line whose quotes are not balanced goes on with the next one.
    Blank lines are records too (they fail to convert, with their number)."""
    if fmt == "jsonl":
        yield from lines
        return
    q = quote.encode()
    pending = None
    for line in lines:
        if pending is not None:
            pending += line
            if line.count(q) % 2:
                yield pending
                pending = None
        elif line.count(q) % 2:
            pending = line
        else:
            yield line
    if pending is not None:
        yield pending


def lines_of(data: Any) -> List[bytes]:
    """The lines of ``data``, each with its newline (the last one perhaps without)."""
    return io.BytesIO(data).readlines()


def split_records(data: Any, fmt: str, quote: str = '"') -> List[bytes]:
    """The records of ``data`` (whole records, as :class:`Block` holds them) as
    :func:`records` cuts them."""
    lines = lines_of(data)
    if fmt == "jsonl" or quote.encode() not in data:
        return lines
    return list(records(lines, fmt, quote))


class Block:
    """Whole records of a file as one bytes-like object: ``data``, ``count`` (records).

    Records are lines unless a quoted value spans lines (CSV/TSV): then the
    records' ends are found as :func:`records` finds them, line by line.
    """

    __slots__ = ("data", "count", "_ends", "_avg")

    def __init__(self, data: Any, fmt: str, quote: str = '"') -> None:
        self.data = data
        self._ends: Optional[List[int]] = None
        q = quote.encode()
        if fmt != "jsonl" and q in data:
            parts = data.split(q)
            # (text between an odd and an even quote is quoted)
            if len(parts) % 2 == 0 or b"\n" in b"".join(parts[1::2]):
                ends, at = [], 0
                for record in records(lines_of(data), fmt, quote):
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


def blocks(stream: Any, fmt: str, quote: str = '"', size: int = 1 << 20) -> Iterator[Block]:
    """``stream`` (binary: ``readinto``, ``readline``) as :class:`Block` objects
    of about ``size`` bytes each (``data`` a bytearray), every one ending where a
    record ends."""
    q = quote.encode()
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
        if fmt != "jsonl" and q in data and data.count(q) % 2:
            # a quoted value goes on: up to the line that closes it (records()'s rule)
            while True:
                line = stream.readline()
                data += line
                if not line or line.count(q) % 2:
                    break
        yield Block(data, fmt, quote)


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
                out.append(json.loads(text))
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
