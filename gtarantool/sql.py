"""Prepared SQL statements (IPROTO_PREPARE) and SQL request bodies.

A prepared statement lives in the server's session: after a reconnect its id
names nothing, so ``PreparedStatement`` remembers the transport it was
prepared on and prepares again, on first use, when the connection's
transport is another one.  A session gives one SQL text one id, shared by
every statement prepared from it there: only the last of them to unprepare
frees it on the server.  The server expires a session's statements at any
schema change (DDL): a statement refused as expired is prepared again too.
"""
from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any, Optional, Union

from tarantool.error import DatabaseError, InterfaceError

from gtarantool.errors import not_sent
from gtarantool.protocol.constants import (
    ER_SQL_EXECUTE,
    ER_WRONG_QUERY_ID,
    IPROTO_BIND_COUNT,
    IPROTO_BIND_METADATA,
    IPROTO_METADATA,
    IPROTO_PREPARE,
    IPROTO_SQL_BIND,
    IPROTO_SQL_TEXT,
    IPROTO_STMT_ID,
    REQUEST_TYPE_EXECUTE,
)
from gtarantool.protocol.responses import ResponseExecute, make_response

# ``conn`` is a Connection, annotated Any: connection.py imports this module, and
# this module imports nothing of it, not even for the type checker.

# The statements that hold each SQL text prepared on a session (transport):
# transport -> {sql: WeakSet of PreparedStatement}.  A statement joins before
# its PREPARE is sent, so that another one's unprepare() meanwhile sends nothing.
_holders: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


def bind_params(params):
    """SQL parameters as IPROTO wants them (tarantool-python's rules): a
    sequence for "?" placeholders, a mapping (names without the colon) for
    ":name" ones."""
    if not params:
        return []
    if isinstance(params, Mapping):
        return [{":%s" % name: value} for name, value in params.items()]
    if isinstance(params, Sequence) and not isinstance(params, (str, bytes)):
        return params
    raise TypeError("SQL parameters must be a mapping or a sequence, not %s"
                    % type(params).__name__)


def check_query(query):
    """:raises TypeError: ``query`` is not a str (nothing is sent)."""
    if not isinstance(query, str):
        raise TypeError("query must be a str, not %s" % type(query).__name__)


def execute_body(conn, query, params):
    check_query(query)
    return conn._encoder.pack({IPROTO_SQL_TEXT: query, IPROTO_SQL_BIND: bind_params(params)})


def as_execute_response(conn, resp):
    """An OK ``protocol.Response`` as tarantool-python's SQL response type."""
    return make_response(ResponseExecute, conn, resp._sync, resp._code, resp._schema_version,
                         resp._body)


def _stale(exc):
    """Whether the server refused a prepared statement unrun for its id: no
    such statement in the session (211), or one prepared before a schema
    change ("statement has expired", 159)."""
    return exc.code == ER_WRONG_QUERY_ID or (
        exc.code == ER_SQL_EXECUTE and "statement has expired" in str(exc.message))


class PreparedStatement:
    """An SQL statement prepared once on the server; ``Connection.prepare(sql)``.

    ``execute(params=None)`` returns what ``Connection.execute`` does;
    ``unprepare()`` frees it on the server; as a context manager it
    unprepares on exit.  ``stmt_id``, ``params_count`` (placeholders),
    ``params`` and ``metadata`` (column descriptions, for a SELECT) are the
    server's.

    :param conn: the connection.
    :param sql: the statement's text.
    :raises TypeError: ``sql`` is not a str.
    :raises tarantool.error.DatabaseError: the server rejected the statement.
    """

    stmt_id: Optional[int]
    params_count: Optional[int]
    params: Any
    metadata: Any
    _prepared_on: Any   # None until prepared, then a weakref.ref to the transport

    def __init__(self, conn: Any, sql: str) -> None:
        if not isinstance(sql, str):
            raise TypeError("sql must be a str, not %s" % type(sql).__name__)
        self._conn = conn
        self.sql = sql
        self.stmt_id = None
        self.params_count = self.params = self.metadata = None
        self._prepared_on = None   # weakref to the transport whose session has it
        self._prepare()

    def _prepare(self, deadline=None):
        """Prepare on the connection's session, by ``deadline`` (the call's end)."""
        conn = self._conn
        if deadline is None:
            deadline = conn._call_deadline()
        transport = conn._reach(deadline)
        self._release()   # (the session it was prepared on before is gone)
        holders = _holders.setdefault(transport, {}).setdefault(self.sql, weakref.WeakSet())
        holders.add(self)
        try:
            resp = conn._request(IPROTO_PREPARE, conn._encoder.pack({IPROTO_SQL_TEXT: self.sql}),
                                 deadline=deadline)
        except BaseException:
            holders.discard(self)
            raise
        # (None: another greenlet closed the connection, or dropped the socket
        # its reply came on, before this one ran again: that session is gone,
        # the next execute prepares on the next one)
        current = conn._transport or transport
        if current is not transport:   # (sent on the next socket)
            holders.discard(self)
            _holders.setdefault(current, {}).setdefault(self.sql, weakref.WeakSet()).add(self)
        body = resp._body
        self.stmt_id = body[IPROTO_STMT_ID]
        self.params_count = body.get(IPROTO_BIND_COUNT)
        self.params = body.get(IPROTO_BIND_METADATA)
        self.metadata = body.get(IPROTO_METADATA)
        self._prepared_on = weakref.ref(current)

    def _prepare_unsent(self, deadline):
        """``_prepare`` before an EXECUTE: whatever it raises (its PREPARE
        timed out, refused, or lost with the connection), the statement was
        not run: ``applied`` False."""
        try:
            self._prepare(deadline)
        except Exception as exc:
            raise not_sent(exc) from exc.__cause__

    def execute(self, params: Union[Sequence[Any], Mapping[str, Any], None] = None) -> Any:
        """Run the statement with ``params`` (a sequence or a mapping).

        :param params: a sequence for ``?`` placeholders or a mapping for ``:name``
            ones (the names without their colons); ``None`` for none.
        :returns: the response, as ``Connection.execute``'s
            (``tarantool.response.ResponseExecute``: rows in ``.data``,
            ``affected_row_count``, ``autoincrement_ids``).
        :raises tarantool.error.InterfaceError: the statement was unprepared.
        :raises TypeError: ``params`` is neither a sequence nor a mapping.
        :raises tarantool.error.DatabaseError: the server refused it.
        :raises gtarantool.RequestTimeout: no reply within ``request_timeout``.
        :raises tarantool.error.NetworkError: the connection could not be (re)established.
        """
        if self.stmt_id is None:
            raise not_sent(InterfaceError("the statement %r was unprepared" % (self.sql,)))
        conn = self._conn
        deadline = conn._call_deadline()   # (one request_timeout for all its steps)
        if self._prepared_on() is not conn._reach(deadline):
            self._prepare_unsent(deadline)   # a new session: the old id names nothing there
        body = {IPROTO_STMT_ID: self.stmt_id, IPROTO_SQL_BIND: bind_params(params)}
        try:
            resp = conn._request(REQUEST_TYPE_EXECUTE, conn._encoder.pack(body),
                                 deadline=deadline)
        except DatabaseError as exc:
            # Gone (unprepared behind its back) or expired (a schema change
            # since it was prepared): refused unrun, prepare again.
            if not _stale(exc):
                raise
            self._prepare_unsent(deadline)
            body[IPROTO_STMT_ID] = self.stmt_id
            resp = conn._request(REQUEST_TYPE_EXECUTE, conn._encoder.pack(body),
                                 deadline=deadline)
        return as_execute_response(conn, resp)

    def unprepare(self) -> None:
        """Free the statement on the server (when its session still exists,
        and no other statement prepared from the same SQL on it still
        holds it: they share one id); a second call does nothing.

        :raises tarantool.error.DatabaseError: the server refused it.
        :raises gtarantool.RequestTimeout: no reply within ``request_timeout``.
        """
        stmt_id, self.stmt_id = self.stmt_id, None
        conn = self._conn
        conn._check_owner()   # (a forked child's copy: the parent's session is not its own)
        if stmt_id is None:
            return
        transport = conn._transport
        last = self._release()
        if (last and transport is not None and transport.alive
                and self._prepared_on() is transport):
            try:
                conn._request(IPROTO_PREPARE, conn._encoder.pack({IPROTO_STMT_ID: stmt_id}))
            except DatabaseError as exc:
                if exc.code != ER_WRONG_QUERY_ID:   # (gone already: what was asked)
                    raise

    def _release(self):
        """Leave the holders of this SQL on the session it was prepared on.

        :returns: whether no other statement holds it there."""
        transport = self._prepared_on() if self._prepared_on is not None else None
        texts = _holders.get(transport) if transport is not None else None
        holders = texts.get(self.sql) if texts else None
        if holders is None:
            return True
        holders.discard(self)
        if holders:
            return False
        del texts[self.sql]
        return True

    def __enter__(self) -> PreparedStatement:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.unprepare()

    def __repr__(self) -> str:
        return "<PreparedStatement %s %r>" % (self.stmt_id, self.sql)
