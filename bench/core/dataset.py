"""Workloads over loaded records (``--records N``): a load phase, then a run phase whose
reads, updates and deletes address records that exist and whose inserts create new ones.

Worker ``w`` of ``P`` owns the keys ``w, w+P, w+2P, ...``: the load phase inserts its share
of keys ``0..N-1``, and in the run phase it keeps a window of live records, its sequence
numbers ``[lo, hi)`` (key = ``w + P * seq``): inserts append at ``hi``, deletes drop the
oldest record at ``lo`` (so a delete never hits a missing key while a later read still
aims at it), every other operation picks a record in the window with the key distribution
(``bench.core.keys``).  No two workers touch one record, so an error that remains is a real
one, counted as it is.  With P processes each one's distribution covers its own share,
so a zipfian run has P hottest keys, one per process.

A record's number is its key (records are inserted in key order), or with ``hashed``
(YCSB's ``insertorder=hashed``) its key is the record number's 64-bit FNV hash, so
consecutive inserts land all over the index and a scan reads records inserted at
different times.

``PRESETS`` maps YCSB's core workloads A-F to Tarantool operations (``--workload ycsb-a``).
"""
import itertools
import random

from bench.core import keys as distributions

# What each operation of a run phase sends; "requests" per operation for box.stat.
# What a shared key space serves from any process's records (YCSB's reads and updates);
# the rest address the process's own.
SHARED_OPERATIONS = ("select", "update", "rmw")
REDRAWS = distributions.REDRAWS
RUN_OPERATIONS = ("insert", "select", "update", "delete", "call", "eval", "execute", "tx",
                  "scan", "scan-pages", "rmw")
CALL_FUNCTION = "bench_get"   # what the call operation calls by default (prepare.lua)
# Tarantool features by operation: (server version, driver support).
NEEDS = {"tx": ((2, 10), ("gtarantool", "asynctnt")),
         "scan-pages": ((2, 11), ("gtarantool",))}

# YCSB core workloads as mixes of this bench's operations, with their key distribution.
# F's read-modify-write is YCSB's: a select, then an update of that record from the
# client (one operation, two requests); E's scan is one select of 1..--scan records.
PRESETS = {
    "ycsb-a": ({"select": 50, "update": 50}, "zipfian"),       # update heavy
    "ycsb-b": ({"select": 95, "update": 5}, "zipfian"),        # read mostly
    "ycsb-c": ({"select": 100}, "zipfian"),                    # read only
    "ycsb-d": ({"select": 95, "insert": 5}, "latest"),         # read latest
    "ycsb-e": ({"scan": 95, "insert": 5}, "zipfian"),          # short ranges
    "ycsb-f": ({"select": 50, "rmw": 50}, "zipfian"),          # read-modify-write
}
# A preset's payload: YCSB's record, fieldcount (10) fields of fieldlength (100) bytes.
YCSB_RECORD_BYTES = 10 * 100
PRESET_TEXT = {
    "ycsb-a": "update heavy: 50% select, 50% update, zipfian",
    "ycsb-b": "read mostly: 95% select, 5% update, zipfian",
    "ycsb-c": "read only: 100% select, zipfian",
    "ycsb-d": "read latest: 95% select, 5% insert, latest",
    "ycsb-e": "short ranges: 95% scan (one select of 1..--scan records), 5% insert, "
              "zipfian",
    "ycsb-f": "read-modify-write: 50% select, 50% rmw (a select, then an update of the "
              "record), zipfian",
}


class Unsupported(ValueError):
    """An operation this client cannot send; the message says which clients can."""


class Exhausted(ValueError):
    """The run phase's mix cannot go on: no live record left for the operation drawn."""


def check_supported(ops, driver, pool=False):
    """Raise :class:`Unsupported` when ``driver`` cannot send one of ``ops``."""
    name = "pool" if pool else driver
    for op in ops:
        if op in NEEDS and name not in NEEDS[op][1]:
            raise Unsupported("operation %s needs the %s driver%s, not %s" % (
                op, " or ".join(NEEDS[op][1]), "s" if len(NEEDS[op][1]) > 1 else "",
                "--pool" if pool else driver))



def share(total, index, procs):
    """Worker ``index``'s part of ``total`` split as evenly as possible over ``procs``."""
    return total // procs + (1 if index < total % procs else 0)


INSERT_ORDERS = ("ordered", "hashed")


def record_key(record, hashed=False):
    """The key of record number ``record``: the number itself, or its FNV hash (YCSB's
    ``insertorder=hashed``)."""
    return distributions.fnv64(record) if hashed else record


def load_keys(records, index, procs, hashed=False):
    """The keys worker ``index`` inserts in the load phase: its share of records
    0..records-1 (their FNV hashes with ``hashed``)."""
    numbers = range(index, records, procs)
    return map(distributions.fnv64, numbers) if hashed else numbers


class Window:
    """One worker's live records in the run phase, and what each operation addresses.

    Reads, updates and deletes address only acknowledged records: an insert handed out
    becomes readable once :meth:`ack` says its answer came (YCSB's acknowledged counter),
    since a read that overtook it would find nothing.

    :param records: records loaded over all workers
    :param index: this worker
    :param procs: all workers
    :param pick: ``pick(lo, hi)`` from :func:`bench.core.keys.chooser`
    :param tx_size: records a ``tx`` writes (consecutive in the window)
    :param guard: records kept out of reach of reads at either end of the window while it
        is larger than twice that: for clients whose requests may overtake each other
        (the threads driver's connections; a pool's reads on replicas, which apply an
        insert after the master answered it), so a read does not meet a record being
        deleted or not there yet
    :param hashed: keys are the records' FNV hashes (:func:`record_key`)
    """

    def __init__(self, records, index, procs, pick, tx_size=1, guard=0, shared=None,
                 space=None, hashed=False):
        self.index, self.procs = index, procs
        self.hashed = hashed
        self._inserting = {}     # hashed: the key of each insert not answered yet -> seq
        self.lo = 0
        self.hi = self.acked = share(records, index, procs)
        self._early = set()      # acknowledged above ``acked``, out of order
        self.pick = pick
        self.tx_size = tx_size
        self.guard = guard
        self.exhausted = None    # why the run phase's items ended early (run_items)
        # One key space over all processes: ``shared`` holds each process's ``lo`` and
        # ``acked`` (2 * procs integers, each process writing its own two), ``space`` the
        # records of them all (a draw is a record number).
        self.shared, self.space = shared, space
        if shared is not None:
            shared[2 * index], shared[2 * index + 1] = self.lo, self.acked

    def key(self, seq):
        return record_key(self.index + self.procs * seq, self.hashed)

    def ack(self, key):
        """The insert of ``key`` was answered: records up to the first unanswered one
        become readable."""
        if self.hashed:
            seq = self._inserting.pop(key)
        else:
            seq = (key - self.index) // self.procs
        if seq != self.acked:
            self._early.add(seq)
            return
        self.acked += 1
        early = self._early
        while self.acked in early:
            early.discard(self.acked)
            self.acked += 1
        if self.shared is not None:
            self.shared[2 * self.index + 1] = self.acked

    def next(self, op):
        """The key ``op`` addresses (for ``tx``, its first), updating the window;
        None when the window cannot serve it (no acknowledged live record)."""
        if op == "insert":
            seq = self.hi
            self.hi += 1
            key = self.key(seq)
            if self.hashed:
                self._inserting[key] = seq
            return key
        if self.acked <= self.lo:
            return None
        if op == "delete":
            seq = self.lo
            self.lo += 1
            if self.shared is not None:
                self.shared[2 * self.index] = self.lo
            return self.key(seq)
        if self.shared is not None and op in SHARED_OPERATIONS:
            return self._anyones()
        lo, hi = self.lo, self.acked
        if hi - lo > 2 * self.guard:
            lo, hi = lo + self.guard, hi - self.guard
        if op == "tx":
            # The transaction's first record; it updates the next ones too
            # (bench.drivers.operations.tx_keys), so it starts low enough for them all.
            return self.key(self.pick(lo, max(lo + 1, hi - self.tx_size + 1)))
        return self.key(self.pick(lo, hi))


    def _anyones(self):
        """An acknowledged record of any process (None after many draws of records not
        acknowledged yet)."""
        shared, procs = self.shared, self.procs
        for _ in range(REDRAWS):
            record = self.pick(0, self.space)
            owner, seq = record % procs, record // procs
            if shared[2 * owner] + self.guard <= seq < shared[2 * owner + 1]:
                return record_key(record, self.hashed)
        return None


def expected_inserts(ops, mix):
    """The new records the scrambled zipfian's key space makes room for: YCSB's
    ``expectednewkeys``, the inserts ``ops`` operations are expected to make times its
    fudge factor of 2 (CoreWorkload)."""
    return int(ops * mix.get("insert", 0) / sum(mix.values()) * 2.0)


def run_items(mix, records, index, procs, distribution, seed, count=None, tx_size=1,
              guard=0, expected_ops=None, shared=None, expected_all=None, hashed=False,
              **params):
    """The run phase's ``(op, key)`` items for worker ``index``: ``count`` of them, or
    without end.  ``mix``: {op: weight}.  An operation the window cannot serve (a delete
    with no live record left) is drawn again.

    :param expected_ops: the operations a run of ``count`` None is expected to make
        (an open loop's rate times its duration): the zipfian's fixed key space
    :param shared: one key space over all processes (a zipfian with its space known and
        no deletes, which another process could not see coming): 2 * procs integers
        shared by them (``Window``); None: each process its own records
    :param expected_all: the operations every process together is expected to make (the
        shared key space's inserts, the same in each; None: ``expected_ops * procs``)
    :param hashed: YCSB's ``insertorder=hashed``: each record's key is its number's FNV
        hash (:func:`record_key`)
    :raises ValueError: an unknown operation or distribution, or a transaction with
        ``hashed`` (it writes consecutive keys)
    """
    unknown = set(mix) - set(RUN_OPERATIONS)
    if unknown:
        raise ValueError("unknown operations %s; known: %s"
                         % (", ".join(sorted(unknown)), ", ".join(RUN_OPERATIONS)))
    if hashed and mix.get("tx"):
        raise ValueError("tx writes records of consecutive keys: not with hashed insert order")
    rng = random.Random(seed)
    total = sum(mix.values())
    expected_ops = count if count is not None else expected_ops
    space = None
    if shared is not None and distribution == "zipfian" and expected_ops is not None \
            and not mix.get("delete"):
        # One key space over all processes: the same scrambled zipfian in each, its
        # hottest records the same records.
        everyone = expected_all if expected_all is not None else expected_ops * procs
        space = records + expected_inserts(everyone, mix) + 1
        params["space"] = space
    else:
        shared = None
    if distribution == "zipfian" and expected_ops is not None and "space" not in params:
        # YCSB's key space: the records plus the inserts the run is expected to make
        # (a run of unknown length: the window as it is).
        params["space"] = share(records, index, procs) + expected_inserts(expected_ops, mix) + 1
    if distribution == "latest" and "window" not in params:
        # Its generator built now, before the start barrier, not on the first draw.
        params["window"] = share(records, index, procs)
    window = Window(records, index, procs,
                    distributions.chooser(distribution, rng, **params), tx_size, guard,
                    shared, space, hashed)
    table = []
    for op in RUN_OPERATIONS:
        table += [op] * round(1000 * mix.get(op, 0) / total)
    slots = len(table)
    random_ = rng.random

    def items():
        draws = itertools.count() if count is None else range(count)
        for _ in draws:
            for _attempt in range(100):
                op = table[int(random_() * slots)]
                key = window.next(op)
                if key is not None:
                    break
            else:
                # The stream ends here (raising would kill the driver's greenlet or task
                # mid-phase); the worker reports why once the phase is over.
                window.exhausted = ("the mix cannot go on: no live record left to %s "
                                    "(load more --records or insert more)" % op)
                return
            yield op, key
    return items(), window
