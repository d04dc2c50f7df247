"""How the pool picks an instance for a request of a given ``tarantool.Mode``.

A strategy has tarantool-python's interface: ``__init__(pool)`` with the pool's
dict of instances by name, ``update()`` when membership or a role changed, and
``getnext(mode)``, the name of the instance to use, raising
``tarantool.error.PoolTopologyError`` when none fits.  Any such class can be
passed as ``ConnectionPool(strategy_class=...)``.
"""
import itertools

from tarantool.connection_pool import Mode, Status
from tarantool.error import PoolTopologyError

__all__ = ["RoundRobinStrategy", "LeastInFlightStrategy"]

ANY, RW, RO, PREFER_RW, PREFER_RO = Mode.ANY, Mode.RW, Mode.RO, Mode.PREFER_RW, Mode.PREFER_RO
MODES = (ANY, RW, RO, PREFER_RW, PREFER_RO)   # their values are 1..5
HEALTHY = Status.HEALTHY

NO_INSTANCE = {
    ANY: "Can't find healthy instance in pool",
    RW: "Can't find healthy rw instance in pool",
    RO: "Can't find healthy ro instance in pool",
    PREFER_RW: "Can't find healthy instance in pool",
    PREFER_RO: "Can't find healthy instance in pool",
}


def _cycle(keys):
    return itertools.cycle(keys) if keys else None


class RoundRobinStrategy:
    """Rotate over the healthy instances of the role asked for (the default).

    ``pool`` is the pool's dict of instances by name; each has ``state``
    (``tarantool.connection_pool.InstanceState``) and ``in_flight``.
    """

    def __init__(self, pool):
        self.pool = pool
        self.rebuild_needed = True
        self.any = self.rw = self.ro = ()

    def update(self):
        """The pool changed: rebuild the candidate lists on the next getnext()."""
        self.rebuild_needed = True

    def build(self):
        """Sort the healthy instances' names into ``any``, ``rw`` and ``ro``."""
        self.any, self.rw, self.ro = [], [], []
        for key, instance in self.pool.items():
            state = instance.state
            if state.status is not HEALTHY:
                continue
            self.any.append(key)
            (self.rw if state.read_only is False else self.ro).append(key)
        self._cycles = [_cycle(self.any), _cycle(self.rw), _cycle(self.ro)]
        self.rebuild_needed = False

    def candidates(self, mode):
        """The names that fit ``mode``, best role first.

        :param mode: a ``tarantool.Mode``.
        :returns: a list of names, empty if none fits.
        :raises ValueError: ``mode`` is no ``tarantool.Mode``."""
        if self.rebuild_needed:
            self.build()
        if mode is RW:
            return self.rw
        if mode is ANY:
            return self.any
        if mode is RO:
            return self.ro
        if mode is PREFER_RO:
            return self.ro or self.rw
        if mode is PREFER_RW:
            return self.rw or self.ro
        raise ValueError("Unexpected mode %r" % (mode,))

    def getnext(self, mode):
        """The name of the next instance for ``mode``.

        :param mode: a ``tarantool.Mode``.
        :returns: an instance's name (a key of the pool's dict).
        :raises tarantool.error.PoolTopologyError: no healthy instance fits.
        :raises ValueError: ``mode`` is no ``tarantool.Mode``."""
        if self.rebuild_needed:
            self.build()
        any_, rw, ro = self._cycles
        if mode is RW:
            chosen = rw
        elif mode is ANY:
            chosen = any_
        elif mode is RO:
            chosen = ro
        elif mode is PREFER_RO:
            chosen = ro or rw
        elif mode is PREFER_RW:
            chosen = rw or ro
        else:
            raise ValueError("Unexpected mode %r" % (mode,))
        if chosen is None:
            raise PoolTopologyError(NO_INSTANCE[mode])
        return next(chosen)


class LeastInFlightStrategy(RoundRobinStrategy):
    """The instance of the role asked for with the fewest requests awaiting
    replies (ties rotate)."""

    def __init__(self, pool):
        super().__init__(pool)
        self._turn = 0

    def getnext(self, mode):
        """The name of the least loaded instance for ``mode`` (see
        :meth:`RoundRobinStrategy.getnext`)."""
        keys = self.candidates(mode)
        if not keys:
            raise PoolTopologyError(NO_INSTANCE[mode])
        self._turn += 1
        start = self._turn % len(keys)
        pool = self.pool
        best = least = None
        for key in keys[start:] + keys[:start]:
            load = pool[key].in_flight
            if best is None or load < least:
                best, least = key, load
        return best
