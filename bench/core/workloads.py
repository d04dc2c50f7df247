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

from bench.core import dataset
from bench.core.values import parse_sizes

# The ways a request can come back wrong that the workload itself produces or detects.
DUPLICATE_KEY = "duplicate_key"
NOT_FOUND = "not_found"
MISMATCH = "payload_mismatch"
SERVER_ERROR = "server_error"  # prefix: other errors the server answered with, by code

ER_TUPLE_FOUND = 3  # Tarantool's error code for a duplicate primary key


class Payloads:
    """``payload(key)``: bytes that depend on the key, cheap to make and to compare:
    ``table[key % SPREAD]``.  ``size``: bytes, or a range or weighted list of sizes
    (``bench.core.values``), each of the SPREAD payloads drawn from it."""

    SPREAD = 251  # distinct payloads; a prime, so neighbouring keys never share one

    def __init__(self, size, seed=0):
        rng = random.Random(seed)
        parsed = parse_sizes(size)
        sizes = parsed.table(parsed.slots(self.SPREAD), rng)
        largest = max(sizes)
        base = bytes(rng.getrandbits(8) for _ in range(largest + len(sizes)))
        self.table = [base[start:start + n] for start, n in enumerate(sizes)]
        self.SPREAD = len(self.table)

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

    def __init__(self, name, items, count=None, window=None):
        self.name = name
        self.count = count      # items it hands out, when known before it starts
        self.window = window    # the record window of a run phase (bench.core.dataset)
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


def plan(config, index, shared=None):
    """Worker ``index``'s phases, as functions ``build(inserted) -> Phase`` called one after
    another: ``inserted`` is how many keys the insert phase handed out, which is what a
    duration-bound select/update/delete phase works on."""
    if config.workload != "phases":
        return records_plan(config, index, shared)
    procs = config.procs
    timed = config.duration is not None

    # Items are built by C iterators (zip, range, repeat): the harness's own cost
    # per request is added to every driver's and should stay small.
    def own(count):
        if count is None:
            return itertools.count(index, procs)
        return range(index, index + procs * count, procs)

    def insert(inserted):
        count = None if timed else share(config.ops, index, procs)
        return Phase("insert", zip(itertools.repeat("insert"), own(count)), count)

    def later(op):
        def build(inserted):
            keys = own(inserted)
            # A timed select or update phase goes round the worker's keys again; a delete
            # phase stops when none are left.
            if timed and op != "delete" and inserted:
                keys = itertools.cycle(keys)
            return Phase(op, zip(itertools.repeat(op), keys), None if timed else inserted)
        return build

    return [insert, later("select"), later("update"), later("delete")]


def records_plan(config, index, shared=None):
    """A mix or preset: the load phase (worker ``index``'s share of ``config.keys``
    records), with ``config.warmup`` a warm-up phase, then the run phase over them
    (``bench.core.dataset``; ``shared``: the processes' live records, one key space
    over them all).  The warm-up and the run phase draw from one stream of
    items over one record window: the run goes on where the warm-up stopped."""
    procs = config.procs
    hashed = config.insert_order == "hashed"
    load = dataset.load_keys(config.keys, index, procs, hashed)
    # Requests that may overtake each other need a guard at the window's ends.
    guard = config.concurrency if config.driver == "threads" or config.pool else 0
    made = []

    count = None if config.duration is not None else share(config.ops, index, procs)

    def stream():
        if made:
            return made[0]
        # The warm-up's items come first: a run of a count is cut off from an endless stream.
        expected = count
        everyone = None if count is None else config.ops
        if config.rate is not None:
            expected = (count or int(config.rate * config.duration / procs) + 1) \
                + int(config.rate * config.warmup / procs)
            everyone = (config.ops if count is not None else
                        int(config.rate * config.duration)) + int(config.rate * config.warmup)
        made.append(dataset.run_items(
            {op: n for op, n in config.mix.items() if n}, config.keys, index, procs,
            config.distribution, config.seed + index, None if config.warmup else count,
            config.tx_size, guard, expected_ops=expected,
            # (not where each process drives an instance of its own, nor a pool's
            # replicas, which apply an insert after the master answered it)
            shared=shared if procs > 1 and not config.pool and not config.hosts
            and config.instances == 1 else None, expected_all=everyone, hashed=hashed))
        return made[0]

    def warmup(inserted):
        items, window = stream()
        return Phase("warmup", items, None, window)

    def run(inserted):
        items, window = stream()
        if config.warmup and count is not None:
            items = itertools.islice(items, count)
        return Phase("run", items, count, window)
    loaded = dataset.share(config.keys, index, procs)
    return [lambda inserted: Phase("load", zip(itertools.repeat("insert"), load), loaded)] \
        + ([warmup] if config.warmup else []) + [run]
