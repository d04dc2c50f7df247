"""Per-operation counts, errors and latencies of one worker's phase, and HDR histogram helpers.

The hot path only bumps dict counters: a latency is counted per whole microsecond and turned
into an HDR histogram once, when the phase ends (``HdrHistogram.record_value`` costs ~1 us per
call here, ten times the dict update).  Once a second the counts of the second that just
ended go to the parent through ``send``.
"""
import collections
import math
import threading
import time

from hdrh.histogram import HdrHistogram

LOWEST_US, HIGHEST_US, SIGNIFICANT_DIGITS = 1, 3_600_000_000, 3


def new_histogram():
    return HdrHistogram(LOWEST_US, HIGHEST_US, SIGNIFICANT_DIGITS)


def decode_histogram(encoded):
    """A histogram from ``HdrHistogram.encode()`` output (what workers send over the pipe)."""
    merged = new_histogram()
    merged.add(HdrHistogram.decode(encoded))
    return merged


class Recorder:
    """Collects one phase.  ``record(op, t0, t1, error)`` after every request: times from
    ``time.monotonic()``, ``error`` None or the kind of error.

    ``drivers.serve`` does what ``record`` does for a correct answer itself, on ``latency``
    and ``second``, while ``t1 < next_tick``; ``shared`` recorders (threads) forbid that."""

    shared = False

    def __init__(self, phase, send):
        self.phase = phase
        self._send = send
        self.counts = collections.Counter()
        self.errors = collections.Counter()          # (op, kind) -> n
        self.latency = collections.defaultdict(dict)  # op -> {microseconds: n}
        self.second = collections.Counter()
        self._second_errors = collections.Counter()
        self.next_tick = math.floor(time.monotonic()) + 1

    def record(self, op, t0, t1, error):
        if t1 >= self.next_tick:
            self.flush(t1)
        us = int((t1 - t0) * 1e6)
        latency = self.latency[op]
        latency[us] = latency.get(us, 0) + 1
        self.second[op] += 1
        if error is not None:
            self.errors[op, error] += 1
            self._second_errors[error] += 1

    def flush(self, now=None):
        """Send the counts since the last flush, stamped with the whole second of the
        monotonic clock (the same clock in every process) they belong to."""
        if self.second or self._second_errors:
            self._send(("tick", self.phase, self.next_tick - 1,
                        dict(self.second), dict(self._second_errors)))
            self.counts.update(self.second)
            self.second.clear()
            self._second_errors.clear()
        self.next_tick = math.floor(now if now is not None else time.monotonic()) + 1

    def histograms(self):
        """op -> encoded HDR histogram of its latencies in microseconds."""
        out = {}
        for op, latency in self.latency.items():
            hist = new_histogram()
            for us, n in latency.items():
                hist.record_value(max(us, LOWEST_US), n)
            out[op] = hist.encode()
        return out


class LockedRecorder(Recorder):
    """For the threads driver: the dict updates above are not atomic across threads."""

    shared = True

    def __init__(self, phase, send):
        super().__init__(phase, send)
        self._lock = threading.Lock()

    def record(self, op, t0, t1, error):
        with self._lock:
            super().record(op, t0, t1, error)
