"""The data methods of tarantool-python's API, on gtarantool's fast path.

``RequestMethods`` turns each call's arguments into an IPROTO request code and
encoded body, reading them exactly as tarantool-python does, and hands both
to ``self._request``.  ``Connection`` sends and waits; ``Pipeline`` queues.
"""
import time

from tarantool.const import (
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
from tarantool.utils import wrap_key

from gtarantool.protocol import iterator_code


class RequestMethods:
    """insert, replace, select, update, upsert, delete, call, eval, ping.

    The class using it provides ``_request(code, body bytes, on_push, on_push_ctx)``,
    ``_encoder`` (a ``protocol.Encoder``), ``_names`` (a dict caching space and
    index ids by name, emptied when the schema is reloaded), ``schema``,
    ``call_16``, ``_ops_process`` and ``_schemaful_connection_check``.
    """

    def _space_no(self, space_name):
        """The space id; callers look in ``_names`` first, this fills it."""
        if self.schema is None:
            self._schemaful_connection_check()
        if isinstance(space_name, str):
            sid = self.schema.get_space(space_name).sid
        elif isinstance(space_name, int):
            sid = space_name   # cached too: one dict lookup serves ids and names alike
        else:
            return space_name
        self._names[space_name] = sid
        return sid

    def _index_no(self, space_no, index):
        if not isinstance(index, str):
            return index
        iid = self._names.get((space_no, index))
        if iid is None:
            iid = self._names[space_no, index] = self.schema.get_index(space_no, index).iid
        return iid

    def insert(self, space_name, values, *, on_push=None, on_push_ctx=None):
        # insert, replace, select, update and delete repeat their first lines on
        # purpose: a shared helper costs ~5% more instructions per request.
        space_no = self._names.get(space_name)
        if space_no is None:
            space_no = self._space_no(space_name)
        if type(values) is not tuple or on_push is not None:
            _check_args(values, on_push)
        return self._request(REQUEST_TYPE_INSERT, self._encoder.insert(space_no, values),
                             on_push, on_push_ctx)

    def replace(self, space_name, values, *, on_push=None, on_push_ctx=None):
        space_no = self._names.get(space_name)
        if space_no is None:
            space_no = self._space_no(space_name)
        if type(values) is not tuple or on_push is not None:
            _check_args(values, on_push)
        return self._request(REQUEST_TYPE_REPLACE, self._encoder.insert(space_no, values),
                             on_push, on_push_ctx)

    def select(self, space_name, key=None, *, offset=0, limit=0xffffffff, index=0,
               iterator=None, on_push=None, on_push_ctx=None):
        """As ``tarantool.Connection.select``; ``iterator`` may be a name ("GE")
        or a number, and names are sent as numbers."""
        space_no = self._names.get(space_name)
        if space_no is None:
            space_no = self._space_no(space_name)
        kind = type(key)
        key = [key] if kind is int or kind is str else wrap_key(key, select=True)
        if iterator is None:
            iterator = ITERATOR_EQ if key else ITERATOR_ALL
        else:
            iterator = iterator_code(iterator)
        if index:
            index = self._index_no(space_no, index)
        if on_push is not None:
            _check_args((), on_push)
        return self._request(REQUEST_TYPE_SELECT, self._encoder.select(
            space_no, index, offset, limit, iterator, key), on_push, on_push_ctx)

    def update(self, space_name, key, op_list, *, index=0, on_push=None, on_push_ctx=None):
        space_no = self._names.get(space_name)
        if space_no is None:
            space_no = self._space_no(space_name)
        kind = type(key)
        key = [key] if kind is int or kind is str else wrap_key(key)
        if index:
            index = self._index_no(space_no, index)
        if type(op_list) is not list or on_push is not None:
            _check_args(op_list, on_push)
        op_list = self._ops_process(space_no, op_list)
        return self._request(REQUEST_TYPE_UPDATE, self._encoder.update(
            space_no, index, key, op_list), on_push, on_push_ctx)

    def upsert(self, space_name, tuple_value, op_list, *, index=0, on_push=None,
               on_push_ctx=None):
        space_no = self._space_no(space_name)
        if index:
            index = self._index_no(space_no, index)
        _check_args(op_list, on_push)
        op_list = self._ops_process(space_no, op_list)
        return self._request(REQUEST_TYPE_UPSERT, self._encoder.upsert(
            space_no, index, tuple_value, op_list), on_push, on_push_ctx)

    def delete(self, space_name, key, *, index=0, on_push=None, on_push_ctx=None):
        space_no = self._names.get(space_name)
        if space_no is None:
            space_no = self._space_no(space_name)
        kind = type(key)
        key = [key] if kind is int or kind is str else wrap_key(key)
        if index:
            index = self._index_no(space_no, index)
        if on_push is not None:
            _check_args((), on_push)
        return self._request(REQUEST_TYPE_DELETE, self._encoder.delete(space_no, index, key),
                             on_push, on_push_ctx)

    def call(self, func_name, *args, on_push=None, on_push_ctx=None):
        code = REQUEST_TYPE_CALL16 if self.call_16 else REQUEST_TYPE_CALL
        return self._invoke(code, IPROTO_FUNCTION_NAME, "func_name", func_name, args,
                            on_push, on_push_ctx)

    def eval(self, expr, *args, on_push=None, on_push_ctx=None):
        return self._invoke(REQUEST_TYPE_EVAL, IPROTO_EXPR, "expr", expr, args,
                            on_push, on_push_ctx)

    def _invoke(self, code, field, what, text, args, on_push, on_push_ctx):
        """call and eval: a function name or Lua code, then its arguments."""
        if not isinstance(text, str):
            raise TypeError("%s must be a str, not %s" % (what, type(text).__name__))
        if len(args) == 1 and isinstance(args[0], (list, tuple)):
            args = args[0]
        _check_args(args, on_push)
        return self._request(code, self._encoder.pack({field: text, IPROTO_TUPLE: args}),
                             on_push, on_push_ctx)

    def ping(self, notime=False):
        start = time.time()
        self._request(REQUEST_TYPE_PING, b"")
        if notime:
            return "Success"
        return time.time() - start


def _check_args(values, on_push):
    kind = type(values)
    if kind is not tuple and kind is not list and not isinstance(values, (tuple, list)):
        raise TypeError("expected a tuple or list, not %s" % type(values).__name__)
    if on_push is not None and not callable(on_push):
        raise TypeError("The on_push callback must be callable")
