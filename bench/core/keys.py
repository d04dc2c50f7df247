"""Key distributions of the workloads: which of ``n`` live records a request addresses.

``chooser(name, rng, **params)`` returns ``pick(lo, hi) -> int`` that draws a position in
``[lo, hi)``, the window of live records (it moves as inserts append at ``hi`` and deletes
drop records at ``lo``).  The shapes follow YCSB's core workload generators:

- ``uniform``: every live record alike.
- ``zipfian``: Gray et al.'s generator over a very large item space (``ITEM_COUNT``) with
  the constant 0.99, each item hashed with 64-bit FNV-1a onto the window, as YCSB's
  ``ScrambledZipfianGenerator`` does, so the popular records are scattered over the window
  and the distribution does not change as the window grows; ``zipfian_item(0)`` is the
  most popular record.
- ``hotspot``: ``hot_ops`` of the requests go to the first ``hot_set`` of the window.
- ``latest``: zipfian from the newest record down (YCSB's ``SkewedLatestGenerator``).
- ``sequential``: the window in order, round and round.
- ``gaussian``: around the middle of the window, sigma a eighth of it (a hot centre).
"""
import math

DISTRIBUTIONS = ("uniform", "zipfian", "hotspot", "latest", "sequential", "gaussian")

ZIPFIAN_CONSTANT = 0.99
ITEM_COUNT = 10 ** 16          # YCSB's item space for the scrambled zipfian
ZETAN = 26.46902820178302      # zeta(ITEM_COUNT, 0.99), as YCSB precomputes it
HOT_SET, HOT_OPS = 0.2, 0.8    # YCSB's hotspot defaults

FNV_OFFSET, FNV_PRIME, MASK64 = 0xCBF29CE484222325, 1099511628211, (1 << 64) - 1


def fnv64(value):
    """64-bit FNV hash of the eight little-endian bytes of ``value``, as YCSB's
    ``Utils.fnvhash64`` (its sign bit cleared)."""
    h = FNV_OFFSET
    for _ in range(8):
        h = ((h ^ (value & 0xFF)) * FNV_PRIME) & MASK64
        value >>= 8
    if h >= 1 << 63:      # Java's Math.abs of the signed 64-bit value
        h = (1 << 64) - h
    return h & ((1 << 63) - 1)


def zeta(n, theta):
    """sum(1 / i**theta for i in 1..n); exact below a million terms, Euler-Maclaurin above."""
    if n <= 1_000_000:
        return math.fsum(1.0 / i ** theta for i in range(1, n + 1))
    m = 1_000_000
    head = math.fsum(1.0 / i ** theta for i in range(1, m + 1))
    tail = (n ** (1 - theta) - m ** (1 - theta)) / (1 - theta) \
        + (n ** -theta - m ** -theta) / 2
    return head + tail


class Zipfian:
    """Items ``0..items-1``, item 0 the most popular (Gray et al., SIGMOD 1994).

    :param items: the item space
    :param theta: the zipfian constant, 0 < theta < 1
    :param zetan: zeta(items, theta) when known (it takes time to sum for large spaces)
    """

    def __init__(self, items, theta=ZIPFIAN_CONSTANT, zetan=None):
        if items < 2 or not 0 < theta < 1:
            raise ValueError("zipfian needs at least 2 items and 0 < constant < 1")
        self.items, self.theta = items, theta
        self.zetan = zeta(items, theta) if zetan is None else zetan
        self.alpha = 1.0 / (1.0 - theta)
        self.half_pow = 1.0 + 0.5 ** theta
        self.eta = (1 - (2.0 / items) ** (1 - theta)) / (1 - zeta(2, theta) / self.zetan)

    def item(self, u):
        """The item for ``u``, uniform in [0, 1)."""
        uz = u * self.zetan
        if uz < 1.0:
            return 0
        if uz < self.half_pow:
            return 1
        return int(self.items * (self.eta * u - self.eta + 1) ** self.alpha)


def zipfian_item(rank, n):
    """Where the scrambled zipfian puts its ``rank``-th most popular item in a window of
    ``n`` records (0 = the most popular)."""
    return fnv64(rank) % n


def chooser(name, rng, theta=ZIPFIAN_CONSTANT, hot_set=HOT_SET, hot_ops=HOT_OPS, space=None,
            window=None):
    """``pick(lo, hi)`` for distribution ``name``, drawing from ``rng.random``.

    :param name: one of :data:`DISTRIBUTIONS`
    :param rng: a ``random.Random``
    :param theta: the zipfian constant (zipfian, latest)
    :param hot_set: hotspot: the share of the window that is hot
    :param hot_ops: hotspot: the share of requests that go to it
    :param space: zipfian: a fixed key space (the records plus YCSB's expected new
        keys, ``bench.core.dataset.expected_inserts``): an item hashes onto it and a
        draw outside the window is drawn again, so the popular records stay where they
        are as the window grows; None: onto the window as it is now
    :param window: latest: the window's size at the start, for which its generator is
        built now rather than on the first draw (inside a measured phase)
    :returns: a function ``pick(lo, hi)`` -> a position in ``[lo, hi)``
    :raises ValueError: an unknown name or parameters out of range
    """
    random = rng.random
    if name == "uniform":
        return lambda lo, hi: lo + int(random() * (hi - lo))
    if name == "zipfian":
        zipf = Zipfian(ITEM_COUNT, theta, ZETAN if theta == ZIPFIAN_CONSTANT else None)
        hashes = []
        draw = _hashed_items(zipf, rng)

        def pick(lo, hi):
            if space is not None and hi > lo:
                for _ in range(REDRAWS):
                    if not hashes:
                        hashes.extend(draw())
                    position = hashes.pop() % space
                    if lo <= position < hi:
                        return position
            if not hashes:
                hashes.extend(draw())
            return lo + hashes.pop() % (hi - lo)
        return pick
    if name == "latest":
        return _latest(random, theta, window)
    if name == "hotspot":
        if not (0 < hot_set < 1 and 0 <= hot_ops <= 1):
            raise ValueError("hotspot needs 0 < hot set < 1 and 0 <= hot ops <= 1")

        def pick(lo, hi):
            n = hi - lo
            hot = max(1, int(n * hot_set))
            if random() < hot_ops or hot == n:
                return lo + int(random() * hot)
            return lo + hot + int(random() * (n - hot))
        return pick
    if name == "sequential":
        state = {"next": None}

        def pick(lo, hi):
            position = state["next"]
            if position is None or position < lo or position >= hi:
                position = lo
            state["next"] = position + 1
            return position
        return pick
    if name == "gaussian":
        gauss = rng.gauss

        def pick(lo, hi):
            n = hi - lo
            return lo + min(n - 1, max(0, int(gauss((n - 1) / 2, n / 8) + 0.5)))
        return pick
    raise ValueError("distribution must be one of %s" % ", ".join(DISTRIBUTIONS))


BATCH = 4096
REDRAWS = 1000   # draws outside the window before the fixed space gives way to the window


def _hashed_items(zipf, rng):
    """``draw()`` -> a list of ``BATCH`` zipfian items, each FNV-hashed: numpy does in a
    batch what costs ~10 us a draw in Python (the hash's eight rounds)."""
    import numpy as np
    generator = np.random.default_rng(rng.getrandbits(64))
    prime = np.uint64(FNV_PRIME)

    def draw():
        u = generator.random(BATCH)
        uz = u * zipf.zetan
        tail = np.floor(zipf.items * (zipf.eta * u - zipf.eta + 1) ** zipf.alpha)
        items = np.where(uz < 1.0, 0.0, np.where(uz < zipf.half_pow, 1.0, tail))
        value = items.astype(np.uint64)
        h = np.full(BATCH, FNV_OFFSET, dtype=np.uint64)
        with np.errstate(over="ignore"):
            for shift in range(0, 64, 8):
                h = (h ^ ((value >> np.uint64(shift)) & np.uint64(0xFF))) * prime
            h = np.where(h >= np.uint64(1 << 63), np.uint64(0) - h, h)
        return (h & np.uint64((1 << 63) - 1)).tolist()
    return draw


def _latest(random, theta, window=None):
    """Zipfian counted back from the newest record; the generator is built for twice
    ``window`` now (when given) and rebuilt only when the window grows past what it
    covers."""
    state = {"zipf": Zipfian(2 * window, theta) if window and window >= 2 else None}

    def pick(lo, hi):
        n = hi - lo
        if n < 2:
            return lo
        zipf = state["zipf"]
        if zipf is None or zipf.items < n:
            # Cover twice the window so that a growing window rarely rebuilds it.
            zipf = state["zipf"] = Zipfian(2 * n, theta)
        while True:
            back = zipf.item(random())
            if back < n:
                return hi - 1 - back
    return pick
