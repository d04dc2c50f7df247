"""Many whole requests in one piece: the bulk path's encoding.

``encode_batch(pack, code, prefix, rows, first_sync, suffix=None, assign=(), out=None,
gather=0)`` returns, as one bytes object (or in the bytearray ``out``), a
request per row with consecutive syncs, the same bytes a pipeline sends for
each (schema version 0).  It is the
specification of ``_encoder.BodyEncoder.encode_batch`` (the C version, which
``Encoder.encode_batch`` uses when it is built); both give byte-identical
results and raise the same exceptions for rows the packer refuses.
"""
from gtarantool.protocol.frames import request_header


def encode_batch(pack, code, prefix, rows, first_sync, suffix=None, assign=(), out=None,
                 gather=0):
    """A request per row, framed, in one bytes object (or in ``out``).

    Request ``k`` (from 0) is the frame with code ``code`` and sync
    ``first_sync + k`` whose body is ``prefix + pack(row)`` and, when
    ``suffix`` is given, ``+ suffix + pack(ops)`` with ``ops`` the upsert
    operations ``[("=", f, row[f]) for f in assign if f < len(row)]``.

    :param pack: the connection's packer's ``pack``.
    :param code: the request type (0..127: every IPROTO request is).
    :param prefix: the body up to the tuple (bytes, e.g. ``SpaceEncoder.insert_prefix``).
    :param rows: the tuples, one request each.
    :param first_sync: the first request's sync; the rest follow by one.
    :param suffix: the bytes between the tuple and the operations (an
        upsert's operations key), or None for no operations.
    :param assign: the field numbers an upsert assigns (ints >= 0).
    :param out: a bytearray to hold the requests instead of a new bytes
        object: resized in place, so that a buffer reused from batch to batch
        keeps its memory (a fresh one of megabytes costs a page fault for
        every 4 KiB written).
    :param gather: (the C encoder) leave out the contents of each str or bytes
        field of a row (not of an upsert) of at least this many bytes, to be
        written from the row by ``Gather.write`` (0: never).  Here the bytes
        are the same either way: this encoder copies them.
    :returns: bytes, or ``out``; from the C encoder also a ``Gather``, whose
        ``tobytes()`` is what this returns.
    :raises ValueError: a code or field number out of range, a negative gather.
    :raises OverflowError: a sync beyond 64 bits.
    :raises TypeError: a row the packer cannot encode (its own error), or a
        prefix or suffix that is not bytes.
    """
    if not 0 <= code <= 127:
        raise ValueError("encode_batch(): code must be in 0..127")
    if type(prefix) is not bytes or (suffix is not None and type(suffix) is not bytes):
        raise TypeError("encode_batch(): prefix and suffix must be bytes")
    if type(first_sync) is not int:
        raise TypeError("encode_batch(): first_sync must be an int")
    if out is not None and type(out) is not bytearray:
        raise TypeError("encode_batch(): out must be a bytearray or None")
    if first_sync < 0 or first_sync >= 1 << 64:
        raise OverflowError("encode_batch(): first_sync beyond 64 bits")
    if gather < 0:
        raise ValueError("encode_batch(): gather must be >= 0")
    assign = tuple(assign)
    if any(type(f) is not int or f < 0 for f in assign):
        raise ValueError("encode_batch(): assign must hold field numbers (int >= 0)")
    rows = tuple(rows)
    if rows and first_sync + len(rows) - 1 >= 1 << 64:
        raise OverflowError("encode_batch(): the syncs go beyond 64 bits")
    bodies = []
    for row in rows:
        body = prefix + pack(row)
        if suffix is not None:
            width = len(row)
            body += suffix + pack([("=", f, row[f]) for f in assign if f < width])
        bodies.append(body)
    pieces = []
    for sync, body in enumerate(bodies, first_sync):
        pieces.append(request_header(code, sync, 0, len(body)))
        pieces.append(body)
    if out is None:
        return b"".join(pieces)
    out[:] = b"".join(pieces)
    return out


# -- rows from text: the common field types converted by a plan --------------------
#
# ``convert_lines`` and ``convert_records`` are the specification of
# ``_encoder.convert_lines`` / ``_encoder.convert_records`` (both give equal
# results, types included).  They take only the strict, common spelling of each
# value; anything else (``+5``, `` 5``, ``1_000``, a value beyond 64 bits, a
# quoted or multi-line record) gives None for the record, for the caller's
# general converter to convert or to say why not.

KIND_STRING, KIND_UNSIGNED, KIND_INTEGER, KIND_NUMBER, KIND_DOUBLE, KIND_BOOLEAN, KIND_CALL = \
    range(7)
KINDS = {"string": KIND_STRING, "unsigned": KIND_UNSIGNED, "integer": KIND_INTEGER,
         "number": KIND_NUMBER, "double": KIND_DOUBLE, "boolean": KIND_BOOLEAN}

_UINT64, _INT64_MIN = (1 << 64) - 1, -(1 << 63)
_FLOAT_CHARS = frozenset("0123456789.eE+-")
_TRUE = ("true", "t", "1", "yes", "y", "on")
_FALSE = ("false", "f", "0", "no", "n", "off")
_NO = object()   # a value the strict spelling does not cover


def _digits(text, signed):
    body = text[1:] if signed and text[:1] == "-" else text
    if not body or not body.isascii() or not body.isdigit():
        return _NO
    try:
        v = int(text)
    except ValueError:   # (more digits than int() reads: 4,300 by default)
        return _NO
    return v if (_INT64_MIN if signed else 0) <= v <= _UINT64 else _NO


def _float(text):
    if not text or not _FLOAT_CHARS.issuperset(text):
        return _NO
    try:
        f = float(text)
    except ValueError:
        return _NO
    return f if f - f == 0.0 else _NO   # (inf - inf and nan are nan)


def _value(kind, call, text):
    if kind == KIND_STRING:
        return text
    if kind == KIND_UNSIGNED:
        return _digits(text, False)
    if kind == KIND_INTEGER:
        return _digits(text, True)
    if kind == KIND_NUMBER:
        if "." in text or "e" in text or "E" in text:
            return _float(text)
        return _digits(text, True)
    if kind == KIND_DOUBLE:
        return _float(text)
    if kind == KIND_BOOLEAN:
        if text.isascii():
            low = text.lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
        return _NO
    try:
        return call(text)
    except Exception:   # noqa: BLE001 - the caller's converter says why
        return _NO


def _plan_row(fields, null, width, plan):
    if len(fields) != len(plan):
        return None
    out = [None] * width
    for (slot, kind, nullable, call), text in zip(plan, fields):
        if type(text) is not str:
            return None
        if nullable and text == null:
            continue
        v = _value(kind, call, text)
        if v is _NO:
            return None
        out[slot] = v
    return tuple(out)


def _check_plan(null, width, plan):
    if type(null) is not str:
        raise TypeError("null must be a str")
    null.encode("utf-8")   # (UnicodeEncodeError for a lone surrogate, as in C)
    if type(width) is not int or width < 0:
        raise ValueError("width must be an int >= 0")
    if type(plan) is not tuple:
        raise TypeError("plan must be a tuple")
    for entry in plan:
        if type(entry) is not tuple or len(entry) != 4:
            raise TypeError("a plan entry is (slot, kind, nullable, call)")
        slot, kind, _nullable, call = entry
        if type(slot) is not int or not 0 <= slot < width:
            raise ValueError("a plan's slot must be in 0..width-1")
        if type(kind) is not int or not KIND_STRING <= kind <= KIND_CALL:
            raise ValueError("a plan's kind must be in 0..6")
        if kind == KIND_CALL and not callable(call):
            raise TypeError("a plan's call must be callable")


def convert_records(records, null, width, plan):
    """The tuple of each record (a list of str, as ``csv.reader`` gives) by ``plan``.

    :param records: a list; an item that is not a list of exactly
        ``len(plan)`` str gives None.
    :param null: the text of null in a nullable field.
    :param width: the tuple's length (slots no column fills are None).
    :param plan: a tuple of ``(slot, kind, nullable, call)`` per column: the
        value goes to ``slot``; ``kind`` is a ``KIND_*`` number; ``call`` (for
        ``KIND_CALL``) converts the text, any Exception giving None.
    :returns: a list as long as ``records``: a tuple, or None where a value is
        not in its strict spelling.
    :raises TypeError, ValueError: a malformed plan.
    """
    _check_plan(null, width, plan)
    if type(records) is not list:
        raise TypeError("records must be a list")
    return [_plan_row(r, null, width, plan) if type(r) is list else None for r in records]


def convert_lines(data, n, delimiter, quote, null, width, plan):
    """:func:`convert_records` of the ``n`` lines of ``data`` (UTF-8 bytes, or a
    bytearray or another buffer of them, each line ending with a newline but
    perhaps the last), each split at ``delimiter``.

    A line may end in a carriage return before its newline (CRLF: the record
    ends before it, as in the csv module).  A field is either quoted whole
    (``"a, b"``: no quote inside, the delimiter or the line's end right after)
    or holds no quote; a line with any other quoting, another carriage return,
    no text, or bytes that are not UTF-8 gives None (the csv module parses
    those).

    :returns: a list of ``n`` items (a tuple or None), or None when ``data``
        does not hold exactly ``n`` lines.
    :raises TypeError, ValueError: a malformed argument.
    """
    _check_plan(null, width, plan)
    try:
        data = bytes(memoryview(data))
    except TypeError:
        data = None
    if data is None or type(n) is not int:
        raise TypeError("data must be bytes-like and n an int")
    if type(delimiter) is not str or len(delimiter) != 1 or type(quote) is not str \
            or len(quote) != 1:
        raise TypeError("delimiter and quote must be one-character str")
    quote.encode("utf-8")
    delimiter.encode("utf-8")
    lines = data.split(b"\n")
    if not lines[-1]:
        lines.pop()   # (after the last newline, or data is empty)
    if len(lines) != n:
        return None
    out = []
    for line in lines:
        fields = None
        if line.endswith(b"\r"):
            line = line[:-1]
        if line and b"\r" not in line:
            try:
                fields = _split(line.decode("utf-8"), delimiter, quote)
            except UnicodeDecodeError:
                pass
        out.append(None if fields is None else _plan_row(fields, null, width, plan))
    return out


def _split(text, delimiter, quote):
    """The fields of a line in the plain form, or None: a field is quoted whole
    (no quote inside, the delimiter or the line's end right after: the csv
    module gives what is between the quotes) or holds no quote at all."""
    fields = []
    i, n = 0, len(text)
    while True:
        if text.startswith(quote, i):
            stop = text.find(quote, i + 1)
            if stop < 0:
                return None
            fields.append(text[i + 1:stop])
            i = stop + 1
            if i == n:
                return fields
            if not text.startswith(delimiter, i):
                return None
        else:
            stop = text.find(delimiter, i)
            field = text[i:] if stop < 0 else text[i:stop]
            if quote in field:
                return None
            fields.append(field)
            if stop < 0:
                return fields
            i = stop
        i += len(delimiter)
