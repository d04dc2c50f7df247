"""The data methods of tarantool-python's API, on gtarantool's fast path.

``RequestMethods`` turns each call's arguments into an IPROTO request code and
encoded body, reading them exactly as tarantool-python does, and hands both
to ``self._request``.  ``Connection`` sends and waits; ``Pipeline`` queues.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from tarantool.error import SchemaError
from tarantool.utils import wrap_key

from gtarantool import pagination
from gtarantool.errors import RequestTimeout
from gtarantool.protocol.codec import NO_LIMIT, OPS_KEY, Encoder, iterator_code
from gtarantool.protocol.constants import (
    IPROTO_EXPR,
    IPROTO_FUNCTION_NAME,
    IPROTO_TUPLE,
    ITERATOR_ALL,
    ITERATOR_EQ,
    REQUEST_TYPE_CALL,
    REQUEST_TYPE_CALL16,
    REQUEST_TYPE_DELETE,
    REQUEST_TYPE_EVAL,
    REQUEST_TYPE_INSERT,
    REQUEST_TYPE_PING,
    REQUEST_TYPE_REPLACE,
    REQUEST_TYPE_SELECT,
    REQUEST_TYPE_UPDATE,
    REQUEST_TYPE_UPSERT,
)

#: A space or index: its name or its id.
NameOrId = Union[str, int]
#: A tuple, a key or a list of operations: a tuple or a list.
TupleLike = Union[Tuple[Any, ...], List[Any]]
#: ``on_push(message, on_push_ctx)``, called for each out-of-band message.
OnPush = Optional[Callable[[Any, Any], Any]]


# The errors of any request: the end of each data method's docstring.
_REQUEST_ERRORS = """
        :raises tarantool.error.DatabaseError: the server refused the request
            (:class:`gtarantool.LazyDatabaseError` with ``lazy_errors=True``).
        :raises gtarantool.RequestTimeout: no reply within ``request_timeout``.
        :raises gtarantool.ConnectionClosed: the connection closed while the request waited.
        :raises tarantool.error.NetworkError: the connection could not be (re)established.
"""


def _request_errors(method):
    """``method`` with the errors of any request at the end of its docstring."""
    if method.__doc__:   # (None under python -OO)
        method.__doc__ = method.__doc__.rstrip() + "\n" + _REQUEST_ERRORS.lstrip("\n")
    return method


def _named(lookup, *names):
    """``lookup(*names)`` in the schema; its SchemaError (no such space,
    index or field), or the RequestTimeout of a lookup's own request, says the
    request was not sent: ``applied`` False."""
    try:
        return lookup(*names)
    except (SchemaError, RequestTimeout) as exc:
        exc.applied = False
        raise


class RequestMethods:
    """insert, replace, select, update, upsert, delete, call, eval, ping.

    The class using it (its host) provides what each request needs:
    ``_request(code, body bytes, on_push, on_push_ctx)`` (sends, or queues),
    ``_encoder`` (the connection's ``protocol.Encoder``, None until its first
    connect), ``_spaces`` and ``_indexes`` (dicts caching
    ``protocol.SpaceEncoder`` objects by space and by (space id, index),
    emptied when the schema is reloaded), and ``_conn``: the ``Connection``
    whose schema and options apply (a connection is its own), for the rest.
    """

    # The host's, declared for the type checker only (no class attributes).
    _request: Any
    _encoder: Any
    _spaces: Dict[Any, Any]
    _indexes: Dict[Any, Any]
    _conn: Any

    def _space(self, space_name):
        """The encoder for the primary index of a space given by name or id;
        callers look in ``_spaces`` first, this fills it.  One
        ``request_timeout`` bounds the caller's whole call from here: the
        connect, the lookups and its request."""
        conn = self._conn
        deadline = conn._lookup_started(sys._getframe(1))
        if self._encoder is None or (conn.schema is None and conn.fetch_schema):
            # Never connected (connect_now=False), or the last connect failed
            # before the schema (authenticating, loading it): connect first.
            conn._reach(deadline)
        if conn.schema is None and conn.fetch_schema:
            # Another greenlet's connect() is between its handshake and the schema
            # (authenticating): wait for it, since it holds the connection's lock.
            conn._wait_for_connect(deadline)
        if conn.schema is None:
            conn._schemaful_connection_check()
        if isinstance(space_name, str):
            space_no = _named(conn.schema.get_space, space_name).sid
            conn._resolutions.note(conn.schema_version, space_no, space_name)
        elif type(space_name) is int:
            space_no = space_name
        else:   # (True == 1 as a key: a bool cached would stand for space 1)
            return self._encoder.space(space_name)   # the server judges it, uncached
        return _cache(self._spaces, space_name, self._encoder.space(space_no))

    def _index(self, space, index):
        """``space``'s encoder for another index, given by name or id."""
        found = self._indexes.get((space.space_no, index))
        if found is None:
            index_no = index
            if isinstance(index, str):
                conn = self._conn
                conn._lookup_started(sys._getframe(1))   # (its deadline bounds the lookup)
                index_no = _named(conn.schema.get_index, space.space_no, index).iid
                conn._resolutions.note(conn.schema_version, (space.space_no, index_no), index)
            elif type(index) is not int:   # (1.0 and True equal 1 as keys: not cached)
                return self._encoder.space(space.space_no, index)   # the server judges it
            found = _cache(self._indexes, (space.space_no, index),
                           self._encoder.space(space.space_no, index_no))
        return found

    @_request_errors
    def insert(self, space_name: NameOrId, values: TupleLike,
               *, on_push: OnPush = None, on_push_ctx: Any = None) -> Any:
        """Insert a tuple into a space; the server refuses it when its primary
        key is taken.

        :param space_name: the space's name or id.
        :param values: the tuple, a tuple or list.
        :param on_push: called as ``on_push(message, on_push_ctx)`` for each
            out-of-band message (``box.session.push``) the request produces.
        :param on_push_ctx: the second argument of ``on_push``.
        :returns: the server's reply, a :class:`~gtarantool.protocol.responses.Response`
            (tuples in ``.data``); on a pipeline, the request's place in
            :meth:`~gtarantool.pipeline.Pipeline.results`.
        :raises TypeError: ``values`` is not a tuple or list, or ``on_push`` is not callable.
        :raises tarantool.error.SchemaError: no space or index has that name.
        """
        space = self._spaces.get(space_name) or self._space(space_name)
        if type(values) is not tuple or on_push is not None:
            _check_args(values, on_push)
        return self._request(REQUEST_TYPE_INSERT, space.join(space.insert_prefix, values),
                             on_push, on_push_ctx)

    @_request_errors
    def replace(self, space_name: NameOrId, values: TupleLike,
                *, on_push: OnPush = None, on_push_ctx: Any = None) -> Any:
        """Insert a tuple into a space, replacing the one with the same primary key.

        :param space_name: the space's name or id.
        :param values: the tuple, a tuple or list.
        :param on_push: called as ``on_push(message, on_push_ctx)`` for each
            out-of-band message (``box.session.push``) the request produces.
        :param on_push_ctx: the second argument of ``on_push``.
        :returns: the server's reply, a :class:`~gtarantool.protocol.responses.Response`
            (tuples in ``.data``); on a pipeline, the request's place in
            :meth:`~gtarantool.pipeline.Pipeline.results`.
        :raises TypeError: ``values`` is not a tuple or list, or ``on_push`` is not callable.
        :raises tarantool.error.SchemaError: no space or index has that name.
        """
        space = self._spaces.get(space_name) or self._space(space_name)
        if type(values) is not tuple or on_push is not None:
            _check_args(values, on_push)
        return self._request(REQUEST_TYPE_REPLACE, space.join(space.insert_prefix, values),
                             on_push, on_push_ctx)

    def select(self, space_name: NameOrId, key: Any = None, *, offset: int = 0,
               limit: int = NO_LIMIT, index: NameOrId = 0,
               iterator: Union[str, int, None] = None, on_push: OnPush = None,
               on_push_ctx: Any = None, after: Union[bytes, TupleLike, None] = None,
               fetch_pos: bool = False) -> Any:
        """As ``tarantool.Connection.select``; ``iterator`` may be a name ("GE")
        or a number, and names are sent as numbers.

        Pagination (Tarantool 2.11+): ``after`` starts after a tuple (a tuple or
        list) or after a position (bytes) a previous select returned; with
        ``fetch_pos=True`` the response's ``.position`` is the position after
        its last tuple (None when it has none).

        :param space_name: the space's name or id.
        :param key: the key: a scalar, or a list or tuple of the index's parts
            (fewer for a partial key); ``None`` or ``[]`` selects every tuple.
        :param offset: how many matching tuples to skip.
        :param limit: the most tuples to return (default: no limit).
        :param index: the index's name or id (default: the primary index).
        :param iterator: how the key matches: a name (``"EQ"``, ``"GE"``, ``"ALL"``...)
            or a number (``tarantool.const.ITERATOR_*``); default ``EQ``, or
            ``ALL`` with no key.
        :param on_push: called as ``on_push(message, on_push_ctx)`` for each
            out-of-band message (``box.session.push``) the request produces.
        :param on_push_ctx: the second argument of ``on_push``.
        :param after: start after this tuple (a tuple or list) or position (bytes).
        :param fetch_pos: have the reply carry ``.position``.
        :returns: the server's reply, a :class:`~gtarantool.protocol.responses.Response`
            (tuples in ``.data``); on a pipeline, the request's place in
            :meth:`~gtarantool.pipeline.Pipeline.results`.
        :raises TypeError: ``on_push`` is not callable, or ``after`` is of another type.
        :raises tarantool.error.SchemaError: no space or index has that name.
        :raises tarantool.error.DatabaseError: the server refused the request
            (:class:`gtarantool.LazyDatabaseError` with ``lazy_errors=True``).
        :raises gtarantool.RequestTimeout: no reply within ``request_timeout``.
        :raises gtarantool.ConnectionClosed: the connection closed while the request waited.
        :raises tarantool.error.NetworkError: the connection could not be (re)established.
        :raises ValueError: ``after`` is not a position a select returned.
        :raises gtarantool.FeatureNotSupported: ``after`` or ``fetch_pos`` on a
            server without pagination (before 2.11).
        """
        space = self._spaces.get(space_name) or self._space(space_name)
        if index:
            space = self._index(space, index)
        if on_push is not None:
            _check_args((), on_push)
        if fetch_pos or after is not None:
            return self._request(REQUEST_TYPE_SELECT, pagination.select_body(
                self, space, key, offset, limit, iterator, after, fetch_pos),
                on_push, on_push_ctx)
        kind = type(key)
        if (kind is int or kind is str) and not offset and iterator is None and limit == NO_LIMIT:
            body = space.join(space.select_scalar_prefix, key)
        else:
            key = [key] if kind is int or kind is str else wrap_key(key, select=True)
            if offset or iterator is not None or limit != NO_LIMIT or not key:
                if iterator is None:
                    iterator = ITERATOR_EQ if key else ITERATOR_ALL
                body = self._encoder.select(space.space_no, space.index_no, offset, limit,
                                            iterator_code(iterator), key)
            else:
                body = space.join(space.select_prefix, key)
        return self._request(REQUEST_TYPE_SELECT, body, on_push, on_push_ctx)

    @_request_errors
    def update(self, space_name: NameOrId, key: Any,
               op_list: TupleLike, *, index: NameOrId = 0,
               on_push: OnPush = None, on_push_ctx: Any = None) -> Any:
        """Update the tuple with this key by a list of operations.

        :param space_name: the space's name or id.
        :param key: the key: a scalar, or a list or tuple of the index's parts.
        :param op_list: the update operations, each a list or tuple such as
            ``("=", field, value)``; a field is a number (from 0 for the first)
            or, when the space has a format, a name.
        :param index: the (unique) index's name or id (default: the primary index).
        :param on_push: called as ``on_push(message, on_push_ctx)`` for each
            out-of-band message (``box.session.push``) the request produces.
        :param on_push_ctx: the second argument of ``on_push``.
        :returns: the server's reply, a :class:`~gtarantool.protocol.responses.Response`
            (tuples in ``.data``); on a pipeline, the request's place in
            :meth:`~gtarantool.pipeline.Pipeline.results`.
        :raises TypeError: ``op_list`` is not a list or tuple, or ``on_push`` is not callable.
        :raises tarantool.error.SchemaError: no space or index has that name.
        """
        space = self._spaces.get(space_name) or self._space(space_name)
        if index:
            space = self._index(space, index)
        kind = type(key)
        if kind is int or kind is str:
            prefix = space.update_scalar_prefix
        else:
            prefix, key = space.update_prefix, wrap_key(key)
        if type(op_list) is not list or on_push is not None:
            _check_args(op_list, on_push)
        for operation in op_list:
            if type(operation[1]) is not int:   # maybe a field name, to swap for its number
                op_list = _named(self._conn._ops_process, space.space_no, op_list)
                break
        return self._request(REQUEST_TYPE_UPDATE, space.join(prefix, key, OPS_KEY, op_list),
                             on_push, on_push_ctx)

    @_request_errors
    def upsert(self, space_name: NameOrId,
               tuple_value: TupleLike,
               op_list: TupleLike, *, index: NameOrId = 0,
               on_push: OnPush = None, on_push_ctx: Any = None) -> Any:
        """Insert ``tuple_value`` if no tuple has its primary key, else update
        that tuple by ``op_list``.

        :param space_name: the space's name or id.
        :param tuple_value: the tuple to insert, a tuple or list.
        :param op_list: the update operations, each a list or tuple such as
            ``("=", field, value)``; a field is a number (from 0 for the first)
            or, when the space has a format, a name.
        :param index: the index's name or id (default: the primary index).
        :param on_push: called as ``on_push(message, on_push_ctx)`` for each
            out-of-band message (``box.session.push``) the request produces.
        :param on_push_ctx: the second argument of ``on_push``.
        :returns: the server's reply, a :class:`~gtarantool.protocol.responses.Response`
            (tuples in ``.data``); on a pipeline, the request's place in
            :meth:`~gtarantool.pipeline.Pipeline.results`.
        :raises TypeError: ``op_list`` is not a list or tuple, or ``on_push`` is not callable.
        :raises tarantool.error.SchemaError: no space or index has that name.
        """
        space = self._spaces.get(space_name) or self._space(space_name)
        if index:
            space = self._index(space, index)
        _check_args(op_list, on_push)
        op_list = _named(self._conn._ops_process, space.space_no, op_list)
        return self._request(REQUEST_TYPE_UPSERT, self._encoder.upsert(
            space.space_no, space.index_no, tuple_value, op_list), on_push, on_push_ctx)

    @_request_errors
    def delete(self, space_name: NameOrId, key: Any, *, index: NameOrId = 0,
               on_push: OnPush = None, on_push_ctx: Any = None) -> Any:
        """Delete the tuple with this key.

        :param space_name: the space's name or id.
        :param key: the key: a scalar, or a list or tuple of the index's parts.
        :param index: the (unique) index's name or id (default: the primary index).
        :param on_push: called as ``on_push(message, on_push_ctx)`` for each
            out-of-band message (``box.session.push``) the request produces.
        :param on_push_ctx: the second argument of ``on_push``.
        :returns: the server's reply (the deleted tuple in ``.data``, if any);
            on a pipeline, the request's place in
            :meth:`~gtarantool.pipeline.Pipeline.results`.
        :raises TypeError: ``on_push`` is not callable, or ``on_push`` is not callable.
        :raises tarantool.error.SchemaError: no space or index has that name.
        """
        space = self._spaces.get(space_name) or self._space(space_name)
        if index:
            space = self._index(space, index)
        kind = type(key)
        if kind is int or kind is str:
            body = space.join(space.delete_scalar_prefix, key)
        else:
            body = space.join(space.delete_prefix, wrap_key(key))
        if on_push is not None:
            _check_args((), on_push)
        return self._request(REQUEST_TYPE_DELETE, body, on_push, on_push_ctx)

    @_request_errors
    def call(self, func_name: str, *args: Any, on_push: OnPush = None,
             on_push_ctx: Any = None) -> Any:
        """Call a stored function (``call_16=True``: with the 1.6 request, each
        result wrapped in a tuple).

        :param func_name: the function's name.
        :param args: its arguments; a single list or tuple is taken as the
            argument list, as in tarantool-python.
        :param on_push: called as ``on_push(message, on_push_ctx)`` for each
            out-of-band message (``box.session.push``) the request produces.
        :param on_push_ctx: the second argument of ``on_push``.
        :returns: the server's reply (the function's results in ``.data``);
            on a pipeline, the request's place in
            :meth:`~gtarantool.pipeline.Pipeline.results`.
        :raises TypeError: ``func_name`` is not a str, or ``on_push`` is not callable.
        """
        code = REQUEST_TYPE_CALL16 if self._conn.call_16 else REQUEST_TYPE_CALL
        return self._invoke(code, IPROTO_FUNCTION_NAME, "func_name", func_name, args,
                            on_push, on_push_ctx)

    @_request_errors
    def eval(self, expr: str, *args: Any, on_push: OnPush = None,
             on_push_ctx: Any = None) -> Any:
        """Run Lua code on the server.

        :param expr: the Lua code (its arguments are ``...``).
        :param args: its arguments; a single list or tuple is taken as the
            argument list, as in tarantool-python.
        :param on_push: called as ``on_push(message, on_push_ctx)`` for each
            out-of-band message (``box.session.push``) the request produces.
        :param on_push_ctx: the second argument of ``on_push``.
        :returns: the server's reply (what the code returns in ``.data``);
            on a pipeline, the request's place in
            :meth:`~gtarantool.pipeline.Pipeline.results`.
        :raises TypeError: ``expr`` is not a str, or ``on_push`` is not callable.
        """
        return self._invoke(REQUEST_TYPE_EVAL, IPROTO_EXPR, "expr", expr, args,
                            on_push, on_push_ctx)

    def _invoke(self, code, field, what, text, args, on_push, on_push_ctx):
        """call and eval: a function name or Lua code, then its arguments."""
        if not isinstance(text, str):
            raise TypeError("%s must be a str, not %s" % (what, type(text).__name__))
        if self._encoder is None:   # never connected: the connect is part of the call
            conn = self._conn
            conn._reach(conn._lookup_started(sys._getframe(1)))
        if len(args) == 1 and isinstance(args[0], (list, tuple)):
            args = args[0]
        _check_args(args, on_push)
        return self._request(code, self._encoder.pack({field: text, IPROTO_TUPLE: args}),
                             on_push, on_push_ctx)

    def ping(self, notime: bool = False) -> Union[float, str]:
        """Send a ping and wait for its reply.

        :param notime: return ``"Success"`` rather than the round trip's time.
        :returns: the seconds the round trip took, or ``"Success"``.
        :raises gtarantool.RequestTimeout: no reply within ``request_timeout``.
        :raises gtarantool.ConnectionClosed: the connection closed while the ping waited.
        :raises tarantool.error.NetworkError: the connection could not be (re)established.
        """
        start = time.time()
        self._request(REQUEST_TYPE_PING, b"")
        if notime:
            return "Success"
        return time.time() - start


class ConnectionRequestMethods(RequestMethods):
    """``RequestMethods`` over a connection's schema, codec and caches: what a
    pipeline and a stream share (each provides its own ``_request``)."""

    def __init__(self, conn):
        self._conn = conn
        self._spaces = conn._spaces
        self._indexes = conn._indexes

    @property
    def _encoder(self):
        return self._conn._encoder   # set when the connection first connects


def _cache(cache, key, value):
    """``cache[key] = value``, emptying ``cache`` first when it is full (ids
    that name no space would otherwise make it grow without bound)."""
    if len(cache) >= Encoder.CACHE_LIMIT:
        cache.clear()
    cache[key] = value
    return value


def _check_args(values, on_push):
    kind = type(values)
    if kind is not tuple and kind is not list and not isinstance(values, (tuple, list)):
        raise TypeError("expected a tuple or list, not %s" % type(values).__name__)
    if on_push is not None and not callable(on_push):
        raise TypeError("The on_push callback must be callable")
