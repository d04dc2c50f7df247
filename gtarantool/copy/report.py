"""What a copy did: :class:`CopyReport` (rows written, rows rejected with the
reason of each, elapsed and client CPU time, the rows settled from the start)
and :class:`CopyError`, the fatal error that carries the report so far.

A row is *settled* once it is written or rejected; ``settled`` counts the rows
from the first one given that are all settled, so a new run that skips that
many rows writes each of the others at least once.
"""
from __future__ import annotations

from typing import Any, List, NamedTuple, Optional

from tarantool.error import Error

__all__ = ["CopyError", "CopyReport", "Rejected"]


class Rejected(NamedTuple):
    """One row not written: ``position`` (0-based, counted as the rows were given),
    ``row`` (as given), ``reason`` (text), ``applied`` (False: proven not
    written; None: it may have been written, e.g. its connection broke after
    it was sent), ``error`` (the exception, or None for a row that could not
    be converted)."""

    position: int
    row: Any
    reason: str
    applied: Optional[bool]
    error: Optional[BaseException] = None


class CopyReport:
    """The outcome of :func:`gtarantool.copy.copy_from`.

    ``written`` (rows the server accepted), ``rejected`` (a list of
    :class:`Rejected`, in row order), ``rows`` (rows taken from the input),
    ``settled`` (rows from the start all written or rejected), ``elapsed``
    (seconds), ``cpu`` (this process's CPU seconds).
    """

    def __init__(self) -> None:
        self.written = 0
        self.rejected: List[Rejected] = []
        self.rows = 0
        self.settled = 0
        self.elapsed = 0.0
        self.cpu = 0.0

    def __repr__(self) -> str:
        return ("CopyReport(rows=%d, written=%d, rejected=%d, settled=%d, elapsed=%.3fs, "
                "cpu=%.3fs)" % (self.rows, self.written, len(self.rejected), self.settled,
                                self.elapsed, self.cpu))


class CopyError(Error):
    """A copy stopped: the server could not be reached (or kept refusing rows
    as read-only) for longer than ``retry_timeout``, or the space is unknown.
    ``report`` is what was done until then (``report.settled``: skip that many
    rows to resume); ``__cause__`` is the last error."""

    def __init__(self, message: str, report: CopyReport) -> None:
        super().__init__(message)
        self.report = report
