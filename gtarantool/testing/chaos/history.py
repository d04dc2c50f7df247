"""The recorded operations of one run and the checker over them.

An ``Op`` is one call as its caller saw it: which operation id it carried,
through which client, when it started and ended, how it ended (``ok``, an
exception class and its ``applied`` attribute, or ``cancelled`` by the caller's
own ``gevent.Timeout``) and the bound its duration must keep; a bulk copy's
``Op`` also holds one ``Row`` per row it gave, with what the copy said of it.
``Facts`` is what the servers hold at the end: how many times each id was
applied, which copied rows exist, where each map ran.  ``check`` compares the
two and returns one ``Violation`` per broken promise; it never raises on a bad
history, so a test can feed it synthetic ones.
"""
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

from gtarantool.protocol.constants import ER_TUPLE_FOUND

# Writes counted by their op id; a copy's rows are counted by row id; a map's
# applications by op id and replica set (it runs once on each it reaches).
WRITE_KINDS = ("write_call", "write_upsert", "write_txn")
COPY_KINDS = ("write_copy", "write_pipeline", "write_sql")
MAP_KINDS = ("write_map",)

# The promises, by the name a violation carries.
DOUBLE = "applied twice"
LOST = "acknowledged write lost"
LYING = "error said not applied, but it was applied"
FOREIGN = "reply of another call"
OVERLONG = "call outlived its timeout"
HUNG = "greenlet left waiting"
CHILD = "a forked child ran the parent's call"
STRAY = "an error outside the library's classes"
GARBLED = "a protocol error, though every server sent valid frames"
UNSETTLED = "a copied row neither written nor rejected"

# A copied row's states: what the copy's report (or its exception) said of it.
WRITTEN, REJECTED, RAISED, PENDING, UNREPORTED = (
    "written", "rejected", "raised", "pending", "unreported")


@dataclass
class Row:
    """One row of a bulk copy: ``state`` is ``written`` (the report counts it
    written), ``rejected`` (in the report's rejected rows, with their
    ``applied``, the error's ``code`` and ``reason``), ``raised`` (the copy
    raised; ``applied`` is the exception's), ``pending`` (the call never
    returned, or the caller's own timer cancelled it) or ``unreported`` (the
    copy returned, but its report accounts for fewer rows than it was given)."""
    id: int
    state: str = PENDING
    applied: Optional[bool] = None
    code: Optional[int] = None
    reason: str = ""


@dataclass
class Op:
    """One call.  ``applied`` is the exception's ``applied`` attribute (``None``
    when it has none: "may have been applied"); ``reply`` the op id the reply
    carried (None when the reply carries none, e.g. an upsert's); ``end`` stays
    None while the call has not returned; ``copy`` marks the copy of a parent's
    call that finished in a forked child (``proc`` is then the child's);
    ``rows`` the rows of a bulk copy (empty for the other kinds);
    ``buckets`` the bucket ids a map over buckets named (None: a full map)."""
    id: int
    client: str
    kind: str
    start: float
    bound: float
    proc: str = "parent"
    end: Optional[float] = None
    outcome: str = "pending"     # ok | error | cancelled | pending
    error: Optional[str] = None
    applied: Optional[bool] = None
    reply: Optional[int] = None
    copy: bool = False
    detail: str = ""
    library_error: bool = True   # the error is one of the library's (tarantool.error.Error)
    rows: List[Row] = field(default_factory=list)
    buckets: Optional[List[int]] = None

    @property
    def write(self) -> bool:
        return self.kind in WRITE_KINDS

    @classmethod
    def from_dict(cls, fields: Dict[str, Any]) -> "Op":
        """The ``Op`` that ``asdict`` gave ``fields`` (a forked child's report)."""
        fields = dict(fields)
        fields["rows"] = [Row(**row) for row in fields.get("rows") or ()]
        return cls(**fields)


@dataclass
class Facts:
    """What the servers hold at the end of a run: ``applications[id]``, the
    times each write id was applied on any instance (replicated copies counted
    once), ``rows``: the ids of copied rows present on any instance (on a
    vshard storage, in a bucket it holds), ``misplaced``: rows present only
    on storages that do not hold their bucket, ``by_child``: ids of parent
    operations applied (or whose rows were written) over a socket a forked
    child opened, ``stalls``: when a process's hub ran nothing (a busy
    host; time a call spent in its process's stalls does not count against
    its bound), ``maps[id]``: each application of a map's function, as
    (replica set, the buckets it held of those the map named), and
    ``replicasets``: every vshard replica set (the ones a full map reaches)."""
    applications: Dict[int, int] = field(default_factory=dict)
    rows: Set[int] = field(default_factory=set)
    misplaced: Set[int] = field(default_factory=set)
    by_child: Set[int] = field(default_factory=set)
    # {proc: [(start, end)]}: when each process's hub ran nothing for over 0.1 s
    stalls: Dict[str, List[Tuple[float, float]]] = field(default_factory=dict)
    maps: Dict[int, List[Tuple[str, List[int]]]] = field(default_factory=dict)
    replicasets: Set[str] = field(default_factory=set)

    def stalled(self, op: "Op") -> float:
        """Seconds ``op``'s process ran nothing while the call lasted."""
        end = op.end if op.end is not None else op.start
        return sum(max(0.0, min(b, end) - max(a, op.start))
                   for a, b in self.stalls.get(op.proc, ()))


@dataclass
class Violation:
    promise: str
    op: Optional[Op]
    detail: str

    def __str__(self):
        where = ""
        if self.op is not None:
            o = self.op
            where = " [op %d %s %s %s%s: %s%s, %.2fs of %.2fs]" % (
                o.id, o.client, o.kind, o.proc, " copy" if o.copy else "", o.outcome,
                " %s applied=%r" % (o.error, o.applied) if o.error else "",
                (o.end if o.end is not None else o.start) - o.start, o.bound)
        return "%s: %s%s" % (self.promise, self.detail, where)


class History:
    """The operations of one run, in the order they started."""

    def __init__(self, ops: Optional[List[Op]] = None):
        self.ops: List[Op] = list(ops or [])

    def begin(self, op: Op) -> Op:
        self.ops.append(op)
        return op

    def extend(self, ops):
        self.ops.extend(ops)

    def dumps(self) -> str:
        return json.dumps([asdict(op) for op in self.ops])

    @classmethod
    def loads(cls, text: str) -> "History":
        return cls([Op.from_dict(fields) for fields in json.loads(text)])


def check(history: History, facts: Facts, slack: float) -> List[Violation]:
    """Every promise the history breaks, given what the servers hold.

    :param history: the operations, the parent's and its children's.
    :param facts: the applications counted on every instance at the end.
    :param slack: seconds a call may run past its bound (a busy host).
    :returns: the violations, grouped by promise; empty when all hold.
    """
    found: List[Violation] = []
    seen: Set[int] = set()
    for op in history.ops:
        count = facts.applications.get(op.id, 0)
        if op.end is None:
            found.append(Violation(HUNG, op, "the call had not returned at the end"))
        elif op.end - op.start - facts.stalled(op) > op.bound + slack:
            stalled = facts.stalled(op)
            found.append(Violation(OVERLONG, op, "%.2fs > %.2fs + %.2fs slack%s"
                                   % (op.end - op.start, op.bound, slack,
                                      " (and %.2fs more while its process's hub stalled)"
                                      % stalled if stalled else "")))
        if op.outcome == "ok" and op.reply is not None and op.reply != op.id:
            found.append(Violation(FOREIGN, op, "got the reply of op %d" % op.reply))
        if op.outcome == "error" and not op.library_error:
            found.append(Violation(STRAY, op, op.detail))
        if op.outcome == "error" and op.error == "ProtocolError":
            found.append(Violation(GARBLED, op, op.detail))
        if op.copy and op.outcome == "ok":
            found.append(Violation(CHILD, op, "the child's copy of the call succeeded"))
        if op.rows:
            found.extend(_check_rows(op, facts))
        if op.kind in MAP_KINDS:
            found.extend(_check_map(op, facts, op.id not in seen))
            seen.add(op.id)
        if not op.write:
            continue
        if count > 1 and op.id not in seen:
            found.append(Violation(DOUBLE, op, "applied %d times" % count))
        seen.add(op.id)
        if op.outcome == "ok" and not op.copy and count == 0:
            found.append(Violation(LOST, op, "acknowledged, not on any instance"))
        # (a forked child's copy too: the parent's call may apply its write, so
        # its copy's error must not say it was not applied)
        if op.outcome == "error" and op.applied is False and count > 0:
            found.append(Violation(LYING, op, "applied %d time(s)" % count))
    for op_id in sorted(facts.by_child):
        found.append(Violation(CHILD, None, "op %d applied over a socket of a forked child"
                               % op_id))
    return found


def _check_map(op: Op, facts: Facts, first: bool) -> List[Violation]:
    """The promises of a map: its function runs at most once on each replica
    set (``first``: the id's first op, a forked child's copy shares it), on
    every one it had to reach when acknowledged (a full map: every replica
    set; a map over buckets: the ones holding them, so the buckets its runs
    held cover those it named), and nowhere when its error says not applied."""
    found = []
    runs = facts.maps.get(op.id, [])
    where = [rs for rs, _ in runs]
    twice = sorted(rs for rs in set(where) if where.count(rs) > 1)
    if twice and first:
        found.append(Violation(DOUBLE, op, "ran %s" % ", ".join(
            "%d times on %s" % (where.count(rs), rs) for rs in twice)))
    if op.outcome == "ok" and not op.copy:
        if op.buckets is None:
            missing = sorted(facts.replicasets - set(where))
            if missing:
                found.append(Violation(LOST, op, "acknowledged, not run on %s"
                                       % ", ".join(missing)))
        else:
            held = {b for _, buckets in runs for b in buckets}
            missing_buckets = sorted(set(op.buckets) - held)
            if missing_buckets:
                found.append(Violation(LOST, op, "acknowledged, not run where bucket(s) %s "
                                       "are held (ran on %s)" % (
                                           ", ".join(map(str, missing_buckets)),
                                           ", ".join(sorted(where)) or "none")))
    if op.outcome == "error" and op.applied is False and runs:
        found.append(Violation(LYING, op, "ran on %s" % ", ".join(sorted(where))))
    return found


def _check_rows(op: Op, facts: Facts) -> List[Violation]:
    """The promises of a bulk copy's rows: each row id is unique, so a
    duplicate-key refusal means the copy sent the row again after it was
    applied (in replace or upsert mode, a silent second write)."""
    found = []
    for row in op.rows:
        present = row.id in facts.rows
        if row.code == ER_TUPLE_FOUND:
            found.append(Violation(DOUBLE, op, "row %d refused as a duplicate: sent again "
                                   "after it was applied" % row.id))
        elif row.state == WRITTEN and op.copy:
            found.append(Violation(CHILD, op, "the child's copy wrote row %d" % row.id))
        elif row.state == WRITTEN and not present:
            found.append(Violation(LOST, op, "row %d reported written, on no instance%s"
                                   % (row.id, " that holds its bucket"
                                      if row.id in facts.misplaced else "")))
        elif row.applied is False and row.state in (REJECTED, RAISED) and present:
            found.append(Violation(LYING, op, "row %d %s with applied=False, but present%s"
                                   % (row.id, row.state, ": " + row.reason if row.reason
                                      else "")))
        elif row.state == UNREPORTED:
            found.append(Violation(UNSETTLED, op, "row %d is in neither the written count "
                                   "nor the rejected rows" % row.id))
    return found
