"""What each worker process does: which operation on which key, and what a correct answer is.

Tuples are ``(key, counter, payload)``.  The payload is a pure function of the key, so every
request checks the tuple it gets back (insert and delete return theirs too); updates only add
1 to the counter.

``phases``: worker ``w`` of ``P`` owns keys ``w, w+P, w+2P, ...`` and inserts, selects,
updates and deletes its own keys, one phase after another, so no two workers touch the same
tuple and every operation must succeed.  ``mix``: every worker draws operations by the given
percentages and keys from the shared range, so duplicate keys and missing keys happen by design.
"""
import functools
import itertools
import random
import time

from bench.core.config import OPERATIONS

# The ways a request can come back wrong that the workload itself produces or detects.
DUPLICATE_KEY = "duplicate_key"
NOT_FOUND = "not_found"
MISMATCH = "payload_mismatch"
SERVER_ERROR = "server_error"  # prefix: other errors the server answered with, by code

ER_TUPLE_FOUND = 3  # Tarantool's error code for a duplicate primary key


class Payloads:
    """``payload(key)``: ``size`` bytes that depend on the key, cheap to make and to compare:
    ``table[key % SPREAD]``."""

    SPREAD = 251  # distinct payloads; a prime, so neighbouring keys never share one

    def __init__(self, size, seed=0):
        rng = random.Random(seed)
        base = bytes(rng.getrandbits(8) for _ in range(size + self.SPREAD))
        self.table = [base[start:start + size] for start in range(self.SPREAD)]

    def __call__(self, key):
        return self.table[key % self.SPREAD]


def is_server_error(kind):
    """True for the kinds of error the server itself answered with (box.stat counts them)."""
    return kind == DUPLICATE_KEY or kind.startswith(SERVER_ERROR)


def check(op, key, rows, payloads):
    """None when ``rows`` (the tuples a request returned) are right for ``op`` on ``key``,
    otherwise the kind of error."""
    if not rows:
        return NOT_FOUND
    row = rows[0]
    if row[0] != key or row[2] != payloads(key):
        return MISMATCH
    return None


class Phase:
    """One measured stretch of a worker: ``take()`` hands out ``(op, key)`` until the count
    or the deadline runs out, then None.  Concurrent callers share it; with greenlets and
    asyncio tasks that is safe as is, threads wrap ``take`` in a lock."""

    def __init__(self, name, items):
        self.name = name
        self._items = iter(items)
        self._deadline = None
        # A C-level call: no Python frame per request in the harness.
        self.take = functools.partial(next, self._items, None)

    def start(self, duration):
        """Start the clock: a duration-bound phase stops handing out work ``duration`` s later."""
        if duration is not None:
            self._deadline = time.monotonic() + duration
            self.take = self._take_until_deadline

    def _take_until_deadline(self):
        if time.monotonic() >= self._deadline:
            return None
        return next(self._items, None)


def share(total, index, procs):
    """This worker's part of ``total`` when ``procs`` workers split it as evenly as possible."""
    return total // procs + (1 if index < total % procs else 0)


def plan(config, index):
    """Worker ``index``'s phases, as functions ``build(inserted) -> Phase`` called one after
    another: ``inserted`` is how many keys the insert phase handed out, which is what a
    duration-bound select/update/delete phase works on."""
    if config.workload == "mix":
        return [lambda inserted: mix(config, index)]
    procs = config.procs
    timed = config.duration is not None

    # Items are built by C iterators (zip, range, repeat): the harness's own cost
    # per request is added to every driver's and should stay small.
    def own(count):
        if count is None:
            return itertools.count(index, procs)
        return range(index, index + procs * count, procs)

    def insert(inserted):
        keys = own(None if timed else share(config.ops, index, procs))
        return Phase("insert", zip(itertools.repeat("insert"), keys))

    def later(op):
        def build(inserted):
            keys = own(inserted)
            # A timed select or update phase goes round the worker's keys again; a delete
            # phase stops when none are left.
            if timed and op != "delete" and inserted:
                keys = itertools.cycle(keys)
            return Phase(op, zip(itertools.repeat(op), keys))
        return build

    return [insert, later("select"), later("update"), later("delete")]


def mix(config, index):
    """The single phase of the mix workload for worker ``index``."""
    rng = random.Random(config.seed + index)
    total = sum(config.mix.values())
    # A 1,000-slot table turns one random() into a weighted choice of operation.
    table = []
    for op in OPERATIONS:
        table += [op] * round(1000 * config.mix.get(op, 0) / total)
    keys = config.keys
    if config.distribution == "uniform":
        def key():
            return int(rng.random() * keys)
    else:
        centre, sigma = (keys - 1) / 2, keys / 8

        def key():
            return min(keys - 1, max(0, int(rng.gauss(centre, sigma) + 0.5)))
    slots = len(table)
    draws = itertools.count() if config.duration is not None else range(
        share(config.ops, index, config.procs))
    return Phase("mix", ((table[int(rng.random() * slots)], key()) for _ in draws))
