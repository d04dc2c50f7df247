"""Many whole requests in one piece: the bulk path's encoding.

``encode_batch(pack, code, prefix, rows, first_sync, suffix=None, assign=())``
returns, as one bytes object, a request per row with consecutive syncs, the
same bytes a pipeline sends for each (schema version 0).  It is the
specification of ``_encoder.BodyEncoder.encode_batch`` (the C version, which
``Encoder.encode_batch`` uses when it is built); both give byte-identical
results and raise the same exceptions for rows the packer refuses.
"""
from gtarantool.protocol.frames import request_header


def encode_batch(pack, code, prefix, rows, first_sync, suffix=None, assign=()):
    """A request per row, framed, in one bytes object.

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
    :returns: bytes.
    :raises ValueError: a code or field number out of range.
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
    if first_sync < 0 or first_sync >= 1 << 64:
        raise OverflowError("encode_batch(): first_sync beyond 64 bits")
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
    out = []
    for sync, body in enumerate(bodies, first_sync):
        out.append(request_header(code, sync, 0, len(body)))
        out.append(body)
    return b"".join(out)
