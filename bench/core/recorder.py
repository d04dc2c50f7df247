"""Per-operation counts, errors and latencies of one worker's phase, and HDR histogram helpers.

The hot path only bumps dict counters: a latency is counted per whole microsecond in the
current interval's dict and turned into HDR histograms once, when the phase ends
(``HdrHistogram.record_value`` costs ~1 us per call here, ten times the dict update).
Intervals are ``INTERVAL`` seconds long on a grid of the monotonic clock (the same clock in
every process, so the parent merges the workers' intervals by their index).  When an
interval ends its latencies are put aside as two arrays per operation until the phase
ends, and when a whole second of the clock ends its counts go to the parent through
``send`` (a ``tick``; once a second, since a message costs more than the arrays).

A recorder keeps one dict per *series* of times (``SERIES``): ``latency`` is what every
driver records; a second series (for example ``service_time``, from the actual send when
``latency`` runs from the intended start) is another attribute of the same shape named in
``SERIES``, filled by the driver beside ``latency``; everything downstream (histograms,
intervals, the JSON's ``<series>_ms``, ``--hlog`` tags, the plot) follows ``SERIES``.

A failed request (an exception, or an answer ``check`` refuses) is counted under its
operation like any other, but its time goes to the series under ``<op>-failed``
(:func:`failed`), as YCSB measures ``READ-FAILED``: a fast failure never lowers the
percentiles of the requests that succeeded.  What counts the requests is ``counts`` and
the intervals' counts (:meth:`Recorder.interval_counts`), never a histogram's total.

An operation made of requests (YCSB's read-modify-write) records its whole through
``record`` and each request's time through :meth:`Recorder.sample` under
``<whole>/<op>`` (:func:`part`: ``rmw/select``), as YCSB's DBWrapper measures each
call: the report shows them in the ``select`` and ``update`` rows, no request counted.
"""
import array
import collections
import math
import threading
import time

from hdrh.histogram import HdrHistogram

LOWEST_US, HIGHEST_US, SIGNIFICANT_DIGITS = 1, 3_600_000_000, 3
INTERVAL = 0.2   # seconds: --hlog's and the plot's intervals
FAILED = "-failed"   # the suffix of a failed request's operation in the series of times


def failed(op):
    """The name a failed ``op``'s times go under: ``call`` -> ``call-failed``."""
    return op + FAILED


def is_failed(name):
    """Whether a series' operation name is a failed operation's (:func:`failed`)."""
    return name.endswith(FAILED)


PART = "/"


def part(whole, op):
    """The name the times of ``whole``'s requests of ``op`` go under: ``rmw/select``."""
    return whole + PART + op


def split(name):
    """``(row, whole)`` of a series' operation name: ``select`` -> ``("select", None)``,
    ``rmw/select-failed`` -> ``("select-failed", "rmw")``."""
    whole, _, op = name.rpartition(PART)
    return op, whole or None


def is_own(name):
    """Whether a series' operation name holds an operation's own successful requests
    (not failed ones, not another operation's parts)."""
    return not name.endswith(FAILED) and PART not in name


def new_histogram():
    return HdrHistogram(LOWEST_US, HIGHEST_US, SIGNIFICANT_DIGITS)


def decode_histogram(encoded):
    """A histogram from ``HdrHistogram.encode()`` output (what workers send over the pipe)."""
    merged = new_histogram()
    merged.add(HdrHistogram.decode(encoded))
    return merged


def interval_index(t, interval=INTERVAL):
    """The index of the interval holding monotonic time ``t``."""
    return math.floor(t / interval)


class Recorder:
    """Collects one phase.  ``record(op, t0, t1, error)`` after every request: times from
    ``time.monotonic()``, ``error`` None or the kind of error.

    ``drivers.serve`` does what ``record`` does for a correct answer itself, on ``latency``
    and ``interval``, while ``t1 < next_tick``; ``shared`` recorders (threads) forbid that.
    """

    shared = False
    SERIES = ("latency",)

    def __init__(self, phase, send, interval=INTERVAL):
        """:param phase: the phase's name, in every ``tick``.
        :param send: called with each ``tick`` message.
        :param interval: the intervals' length in seconds (``INTERVAL``, which the runner's
            merge of the workers' intervals assumes)."""
        self.phase = phase
        self._send = send
        self._length = interval
        self.counts = collections.Counter()
        self.errors = collections.Counter()          # (op, kind) -> n
        self.latency = collections.defaultdict(dict)  # op -> {microseconds: n}, this interval
        self.interval = collections.Counter()         # op -> requests, this interval
        self._interval_errors = collections.Counter()
        self._second = collections.Counter()          # op -> requests, not sent yet
        self._second_errors = collections.Counter()
        self._second_of = None                        # the whole second they belong to
        self._done = []   # [(interval index, {series: {op: (microseconds, counts) arrays}})]
        self._done_counts = []   # [(interval index, {op: requests})], the same intervals
        self._built = None   # the same as HDR histograms, built once the phase is over
        self._index = interval_index(time.monotonic(), interval)
        self.next_tick = (self._index + 1) * interval

    def record(self, op, t0, t1, error):
        if t1 >= self.next_tick:
            self._next_interval(t1)
        us = int((t1 - t0) * 1e6)
        self.interval[op] += 1
        if error is not None:
            self.errors[op, error] += 1
            self._interval_errors[error] += 1
            op = op + FAILED
        latency = self.latency[op]
        latency[us] = latency.get(us, 0) + 1

    def sample(self, op, t0, t1, failed=False):
        """The time of one request an operation is made of (``op``, a :func:`part` name,
        ``<op>-failed`` when ``failed``): a latency, no request counted."""
        if t1 >= self.next_tick:
            self._next_interval(t1)
        us = int((t1 - t0) * 1e6)
        latency = self.latency[op + FAILED if failed else op]
        latency[us] = latency.get(us, 0) + 1

    def flush(self, now=None):
        """End the current interval and send every count not sent yet (the phase is over)."""
        self._next_interval(now if now is not None else time.monotonic())
        self._send_second()

    def _send_second(self):
        """Send the counts of the second the last interval belonged to, stamped with that
        whole second of the monotonic clock."""
        if self._second or self._second_errors:
            self._send(("tick", self.phase, self._second_of, dict(self._second),
                        dict(self._second_errors)))
            self._second.clear()
            self._second_errors.clear()

    def _next_interval(self, now):
        """End the current interval (put its latencies aside) and start the one holding
        ``now``; a second that is over goes to the parent."""
        if self.interval or self._interval_errors:
            self._second_of = math.floor(self._index * self._length)
            self._second.update(self.interval)
            self._second_errors.update(self._interval_errors)
            self.counts.update(self.interval)
            self._done_counts.append((self._index, dict(self.interval)))
            self.interval.clear()
            self._interval_errors.clear()
            kept = {}
            for name in self.SERIES:
                times = getattr(self, name)
                kept[name] = {op: (array.array("q", d.keys()), array.array("q", d.values()))
                              for op, d in times.items() if d}
                for op in list(times):   # (the same outer dict: serve holds it)
                    times[op] = {}
            self._done.append((self._index, kept))
        self._index = interval_index(now, self._length)
        self.next_tick = (self._index + 1) * self._length
        if math.floor(self._index * self._length) != self._second_of:
            self._send_second()

    def merged(self, series="latency"):
        """op -> {microseconds: n} over the whole phase (after :meth:`flush`)."""
        out = collections.defaultdict(collections.Counter)
        for _, kept in self._done:
            for op, (values, counts) in kept.get(series, {}).items():
                out[op].update(dict(zip(values, counts)))
        return out

    def histograms(self):
        """``{series: {op: encoded HDR histogram}}`` of the whole phase (microseconds)."""
        whole = {name: collections.defaultdict(new_histogram) for name in self.SERIES}
        for _, hists in self._interval_histograms():
            for name, by_op in hists.items():
                for op, hist in by_op.items():
                    whole[name][op].add(hist)
        return {name: {op: hist.encode() for op, hist in by_op.items()}
                for name, by_op in whole.items()}

    def intervals(self):
        """``[[interval index, {series: {op: encoded HDR histogram}}], ...]``."""
        return [[index, {name: {op: hist.encode() for op, hist in by_op.items()}
                         for name, by_op in hists.items()}]
                for index, hists in self._interval_histograms()]

    def interval_counts(self):
        """``[[interval index, {op: requests}], ...]``: the requests of each interval,
        failed ones included (a histogram's total is not a count of requests)."""
        return [[index, counts] for index, counts in self._done_counts]

    def _interval_histograms(self):
        if self._built is None:
            self._built = []
            for index, kept in self._done:
                hists = {}
                for name, by_op in kept.items():
                    hists[name] = {}
                    for op, (values, counts) in by_op.items():
                        hist = hists[name][op] = new_histogram()
                        for us, n in zip(values, counts):
                            hist.record_value(max(us, LOWEST_US), n)
                self._built.append((index, hists))
        return self._built


class LockedRecorder(Recorder):
    """For the threads driver: the dict updates above are not atomic across threads."""

    shared = True

    def __init__(self, phase, send, interval=INTERVAL):
        super().__init__(phase, send, interval)
        self._lock = threading.Lock()

    def record(self, op, t0, t1, error):
        with self._lock:
            super().record(op, t0, t1, error)

    def sample(self, op, t0, t1, failed=False):
        with self._lock:
            super().sample(op, t0, t1, failed)
