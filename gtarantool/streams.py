"""Streams and interactive transactions (Tarantool 2.10+).

A ``Stream`` has the connection's data methods; its requests carry its own
IPROTO_STREAM_ID, so the server runs them one after another, in order, and
may keep a transaction open between them (IPROTO_BEGIN, COMMIT, ROLLBACK)
while any number of other streams and plain requests share the socket.  The
requests go through the connection's one request path
(``Connection._request`` with the stream); replies carry no stream id, so
they stay on the reader's fast path.

A transaction belongs to the session it began in: once that connection is
lost the server has rolled it back, so its later requests fail with
``NetworkError`` instead of going, outside any transaction, to a new
connection (nothing is re-sent).
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Dict, Iterator, Mapping, Optional, Sequence, Union

from tarantool.error import InterfaceError, NetworkError

from gtarantool import features, sql
from gtarantool.api import ConnectionRequestMethods
from gtarantool.errors import RequestTimeout, applied, not_sent
from gtarantool.pipeline import Pipeline
from gtarantool.protocol.constants import (
    IPROTO_BEGIN,
    IPROTO_COMMIT,
    IPROTO_ROLLBACK,
    IPROTO_TIMEOUT,
    IPROTO_TXN_ISOLATION,
    REQUEST_TYPE_EXECUTE,
)
from gtarantool.protocol.responses import Response, ResponseExecute
from gtarantool.transport import CopiedCall, Draining, InheritedSocket

if TYPE_CHECKING:
    from gtarantool.transport import Transport

# ``conn`` is a Connection, annotated Any: connection.py imports this module, and
# this module imports nothing of it, not even for the type checker.

# box.begin{txn_isolation = ...}'s names, as numbers (enum txn_isolation_level)
ISOLATION_LEVELS = {
    "default": 0,
    "read-committed": 1,
    "read-confirmed": 2,
    "best-effort": 3,
    "linearizable": 4,
}

log = logging.getLogger(__name__)


def isolation_code(isolation: Union[str, int]) -> int:
    """An isolation level's name or number -> its number.

    :param isolation: a name of ``ISOLATION_LEVELS`` or a number 0-4.
    :returns: the number.
    :raises ValueError: neither.
    """
    if isinstance(isolation, str):
        try:
            return ISOLATION_LEVELS[isolation]
        except KeyError:
            raise ValueError("unknown isolation level %r; expected one of %s"
                             % (isolation, ", ".join(ISOLATION_LEVELS))) from None
    if isinstance(isolation, int) and not isinstance(isolation, bool) and 0 <= isolation <= 4:
        return isolation
    raise ValueError("isolation must be a name (%s) or a number 0-4, not %r"
                     % (", ".join(ISOLATION_LEVELS), isolation))


class Stream(ConnectionRequestMethods):
    """The connection's data methods (insert, replace, select, update, upsert,
    delete, call, eval, execute, ping) under one stream id, plus ``begin``,
    ``commit`` and ``rollback``.  Made by ``Connection.stream()``."""

    _tx: Optional[Transport]

    def __init__(self, conn: Any) -> None:
        features.require(conn, features.STREAMS)
        super().__init__(conn)
        self.stream_id = next(conn._stream_ids)
        self._tx = None   # the transport the open transaction began on

    @property
    def in_transaction(self) -> bool:
        """True between a successful ``begin()`` and ``commit()``/``rollback()``."""
        return self._tx is not None

    def _transport(self):
        tx = self._tx
        if tx is None:
            return self._conn._ensure_connected()
        self._conn._check_owner()
        if type(tx.error) is InheritedSocket:   # (the parent's socket: its transaction goes on)
            raise not_sent(NetworkError(
                "the transaction of stream %d was begun by the parent of this forked process "
                "and is the parent's: nothing of it is sent here" % self.stream_id))
        if tx.error is not None:
            raise not_sent(NetworkError(
                "the connection was lost during the transaction of stream %d (the server "
                "rolled it back): %s" % (self.stream_id, tx.error)))
        return tx

    def _request(self, code, body, on_push=None, on_push_ctx=None,
                 response_class=Response, deadline=None):
        return self._conn._request(code, body, on_push, on_push_ctx, stream=self,
                                   response_class=response_class, deadline=deadline)

    def pipeline(self) -> Pipeline:
        """A :class:`gtarantool.pipeline.Pipeline` whose requests go in this
        stream (in its transaction, when one is open): many writes of one
        transaction without a round trip each.

        :returns: the new, empty :class:`~gtarantool.pipeline.Pipeline`.
        """
        return Pipeline(self._conn, self)

    def execute(self, query: str,
                params: Union[Sequence[Any], Mapping[str, Any], None] = None) -> Any:
        """SQL in this stream (as ``Connection.execute``).

        :param query: the SQL text.
        :param params: a sequence (``?``) or a mapping (``:name``) of values.
        :returns: the response, with ``affected_row_count`` and ``autoincrement_ids``.
        :raises tarantool.error.DatabaseError: the server refused the statement.
        :raises TypeError: ``query`` is not a str, or ``params`` is neither a
            sequence nor a mapping.
        :raises tarantool.error.NetworkError: the connection was lost during
            the stream's transaction, or could not be (re)established.
        :raises gtarantool.RequestTimeout: no reply within ``request_timeout``.
        """
        deadline = self._conn._call_deadline()
        if self._conn._encoder is None:
            self._conn._reach(deadline)
        return self._request(REQUEST_TYPE_EXECUTE, sql.execute_body(self._conn, query, params),
                             response_class=ResponseExecute, deadline=deadline)

    # -- transactions ---------------------------------------------------------

    def begin(self, isolation: Union[str, int, None] = None,
              timeout: Optional[float] = None) -> None:
        """Begin a transaction (IPROTO_BEGIN).  ``isolation``: "default",
        "read-committed", "read-confirmed", "best-effort", "linearizable" or
        its number; ``timeout``: seconds after which the server rolls it back.

        :param isolation: the isolation level (``None``: the server's default).
        :param timeout: seconds (a positive number; ``None``: the server's default).
        :raises gtarantool.FeatureNotSupported: the server has no transactions (2.10+).
        :raises tarantool.error.InterfaceError: a transaction is open already.
        :raises ValueError: a bad isolation level or timeout.
        :raises tarantool.error.DatabaseError: the server refused to begin.
        :raises tarantool.error.NetworkError: the connection could not be (re)established.
        :raises gtarantool.RequestTimeout: no reply within ``request_timeout``.
        """
        conn = self._conn
        deadline = conn._call_deadline()   # (one request_timeout for all its steps)
        features.require(conn, features.TRANSACTIONS, deadline)
        if self._tx is not None:
            raise not_sent(InterfaceError("stream %d already has an open transaction"
                                          % self.stream_id))
        body: Dict[int, Any] = {}
        if isolation is not None:
            body[IPROTO_TXN_ISOLATION] = isolation_code(isolation)
        if timeout is not None:
            if type(timeout) is bool or not isinstance(timeout, (int, float)) \
                    or not timeout > 0:   # (NaN too)
                raise ValueError("timeout must be a positive number of seconds, not %r"
                                 % (timeout,))
            body[IPROTO_TIMEOUT] = float(timeout)
        while True:
            self._tx = conn._reach(deadline)   # its requests, BEGIN included, go there only
            try:
                self._request(IPROTO_BEGIN, conn._encoder.pack(body), deadline=deadline)
                return
            except Draining:   # in line on a socket being drained: nothing sent, the next one
                self._tx = None
            except BaseException as exc:
                if applied(exc) is False or isinstance(exc, CopiedCall):
                    self._tx = None   # refused or never sent, or the parent's: nothing here
                else:   # it may have begun unanswered: roll it back, not waiting
                    self._abandon()
                raise

    def commit(self) -> None:
        """Commit the transaction (IPROTO_COMMIT); it is over either way.

        :raises tarantool.error.InterfaceError: no transaction is open (none
            began, or a commit or rollback ended it, even one that raised):
            nothing is sent, ``applied`` False.
        :raises tarantool.error.DatabaseError: the server refused the commit
            (the transaction was rolled back).
        :raises tarantool.error.NetworkError: the connection was lost during
            the transaction (the server rolled it back).
        :raises gtarantool.RequestTimeout: no reply within ``request_timeout``
            (the transaction's outcome is unknown); ``applied`` False when
            the commit was never sent (waiting for a slot): the transaction
            is still open, to commit or roll back again.
        """
        if self._tx is None:   # (the server would answer OK: a commit of nothing)
            raise not_sent(InterfaceError(
                "stream %d has no open transaction to commit (begin() opens one; a "
                "commit or rollback ends it, even one that raised)" % self.stream_id))
        self._end(IPROTO_COMMIT)

    def _end(self, code):
        """Send COMMIT or ROLLBACK (``code``): the transaction is over either
        way, unless the request was never sent on a socket still up (the
        server holds it open: forgotten here, the stream's next requests
        would run in it, and never be committed)."""
        try:
            self._request(code, b"")
        except BaseException as exc:
            tx = self._tx
            if not (applied(exc) is False and tx is not None and tx.error is None):
                self._tx = None
            raise
        self._tx = None

    def rollback(self) -> None:
        """Roll the transaction back (IPROTO_ROLLBACK).  When its connection
        was lost the server has rolled it back already, and with no
        transaction open (a commit that raised ended it) there is nothing to
        roll back: nothing is sent.

        :raises tarantool.error.DatabaseError: the server refused the rollback.
        :raises gtarantool.RequestTimeout: no reply within ``request_timeout``;
            ``applied`` False when the rollback was never sent (waiting for
            a slot): the transaction is still open.
        """
        tx = self._tx
        if tx is not None and tx.error is None:
            self._end(IPROTO_ROLLBACK)
        self._tx = None

    def _abandon(self):
        """End the transaction without waiting: a ROLLBACK whose reply nobody
        awaits (its caller was killed or timed out, or its BEGIN went
        unanswered), the stream free for the next one.  With no room to send
        it now, or its session gone, the server rolls it back when the session
        ends or the transaction times out."""
        tx, self._tx = self._tx, None
        if tx is None or tx.error is not None:
            return
        try:
            sent = tx.send_detached(IPROTO_ROLLBACK, b"", next(self._conn._syncs),
                                    self.stream_id)
        except Exception:  # noqa: BLE001 - another process's socket: nothing to send there
            sent = False
        if not sent:
            log.warning("stream %d: its transaction was abandoned without a rollback "
                        "(the server ends it with the session or its timeout)", self.stream_id)

    def __repr__(self) -> str:
        return "<Stream %d%s>" % (self.stream_id, " in transaction" if self._tx else "")


@contextmanager
def transaction(conn: Any, isolation: Union[str, int, None] = None,
                timeout: Optional[float] = None) -> Iterator[Stream]:
    """``Connection.transaction``: a new stream, begun on entry, committed on
    normal exit, rolled back when the block raises (the exception goes on;
    killed or timed out by its caller, or by ``request_timeout``, the rollback
    is sent without waiting).
    A transaction the block ended itself (``commit()`` or ``rollback()``) is
    not committed again; one it began again is.

    :param conn: the connection.
    :param isolation: as :meth:`Stream.begin`.
    :param timeout: as :meth:`Stream.begin`.
    :returns: a context manager that yields the :class:`Stream`.
    :raises gtarantool.FeatureNotSupported: the server has no transactions (2.10+).
    """
    stream = Stream(conn)
    stream.begin(isolation, timeout)
    try:
        yield stream
    except RequestTimeout:
        # The server did not answer within the caller's time: the caller hears
        # of it now, not a request_timeout later (a frozen server would not
        # answer the rollback either); the rollback goes unawaited.
        stream._abandon()
        raise
    except Exception:
        try:
            stream.rollback()
        except Exception as exc:  # noqa: BLE001 - the block's exception matters more
            log.warning("rollback of stream %d failed: %s", stream.stream_id, exc)
            stream._abandon()   # (one never sent: a last try, not waited for)
        raise
    except BaseException:   # killed or timed out by its caller: it does not wait
        stream._abandon()
        raise
    if stream.in_transaction:
        try:
            stream.commit()
        except BaseException:
            stream._abandon()   # (a commit never sent left it open: rolled back unawaited)
            raise
