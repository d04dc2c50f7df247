"""Open-loop load (``--rate R``): requests at their intended times, latency from there.

Each of the P worker processes sends R/P requests per second on a :class:`Schedule`:
evenly spaced (process i shifted by i/R, so the processes interleave) or with exponential
gaps (``poisson``).  The free greenlets, threads or tasks take the scheduled requests in
order (:class:`OpenPhase`), wait for each one's intended time and send it; none is
skipped, so when the client or the server falls behind, requests queue and their latency
grows.  :class:`OpenRecorder` counts the latency from the intended start (what a user of
the server waits) and the service time from the actual send (what the server and the
client's path took).

The event loops' timers count whole milliseconds and wake up to a millisecond late, so a
request leaves up to ``EARLY`` seconds before its intended time rather than after it; its
latency then counts from its send.
"""
import asyncio
import collections
import itertools
import math
import random
import threading
import time

from bench.core.config import ARRIVALS
from bench.core.recorder import (
    FAILED,
    LOWEST_US,
    Recorder,
    decode_histogram,
    is_own,
    new_histogram,
)
from bench.core.workloads import check

EARLY = 0.001   # seconds: the timers' granularity (libev, libuv)
KEEP_UP = 0.95  # a run kept up when it achieved this share of its scheduled rate
DRAIN = 10.0    # seconds at least that a backlog left when the schedule ends is sent for


class Schedule:
    """The intended start times of one worker's requests.

    :param rate: requests per second over all processes
    :param procs: the number of worker processes
    :param index: this worker's index
    :param arrivals: "uniform" or "poisson"
    :param seed: the Poisson gaps' random seed (the worker's own)
    :param count: at most this many requests (None: until ``duration``)
    :param duration: seconds from the start (None: ``count`` requests)
    """

    def __init__(self, rate, procs, index, arrivals="uniform", seed=0, count=None,
                 duration=None):
        if not rate > 0:
            raise ValueError("rate must be > 0")
        if arrivals not in ARRIVALS:
            raise ValueError("arrivals must be one of %s" % ", ".join(ARRIVALS))
        if count is None and duration is None:
            raise ValueError("a schedule needs a count or a duration")
        self.rate = rate / procs        # this worker's
        self.arrivals = arrivals
        self.offset = index / rate if arrivals == "uniform" else 0.0
        self.count, self.duration = count, duration
        # Arrivals draw from a stream of their own: the keys use the worker's seed.
        self._rng = random.Random("arrivals-%s" % seed)
        self.start = self.end = self.period_end = None

    def begin(self, now):
        """Start the clock at ``now``; returns an iterator of the intended times, in order,
        and sets ``end``, the last one's (or the duration's end)."""
        self.start = now
        first = now + self.offset
        if self.arrivals == "uniform":
            # i / rate, not a running sum: no drift from adding the gap a million times.
            rate = self.rate
            times = (first + i / rate for i in itertools.count())
        else:
            expovariate, rate = self._rng.expovariate, self.rate
            times = itertools.accumulate((expovariate(rate) for _ in itertools.count()),
                                         initial=first)
        if self.count is not None:
            times = itertools.islice(times, self.count)
        if self.duration is not None:
            stop = now + self.duration
            times = itertools.takewhile(lambda t: t < stop, times)
            self.end = stop
        if self.count is not None and self.arrivals == "uniform":
            last = now + self.offset + (self.count - 1) / self.rate
            self.end = last if self.end is None else min(self.end, last)
        elif self.end is None:
            # Poisson gaps for a count: drawn now, since the end must be known up front.
            times = list(times)
            self.end = times[-1] if times else now
            times = iter(times)
        # The stretch the schedule's requests are spread over: the duration, or for a
        # count the time to its last request plus one gap (n requests take n gaps).
        self.period_end = stop if self.duration is not None else self.end + 1 / self.rate
        return times


class OpenPhase:
    """A workload phase (``bench.core.workloads.Phase``) on a schedule: ``take()`` hands out
    ``(op, key, intended)`` in intended order until either runs out, then None.

    ``late_at_end`` counts the requests taken after the schedule's last intended time:
    the backlog the run had when its schedule ended.  That backlog is sent for at most
    ``DRAIN`` seconds or the schedule's own length, whichever is longer (a server that
    died would otherwise keep the run going for as long as failing the backlog takes);
    ``dropped_at_end`` counts the requests still unsent then."""

    def __init__(self, phase, schedule, clock=time.monotonic):
        self.phase = phase
        self.name = phase.name
        self.schedule = schedule
        self._clock = clock
        self._items = phase._items
        self._times = None
        self.taken = 0
        self.late_at_end = 0
        self.dropped_at_end = 0
        self._drained_by = None
        self.take = self._take

    def start(self, duration=None):
        """Start the schedule now (its duration is the schedule's own)."""
        now = self._clock()
        self._times = self.schedule.begin(now)
        self._drained_by = self.schedule.end + max(DRAIN, self.schedule.end - now)

    def _take(self):
        intended = next(self._times, None)
        if intended is None:
            return None
        now = self._clock()
        if now > self._drained_by:   # this one and the rest are not sent
            self.dropped_at_end += 1 + sum(1 for _ in self._times)
            return None
        item = next(self._items, None)
        if item is None:
            return None
        self.taken += 1
        if now > self.schedule.end:
            self.late_at_end += 1
        return item[0], item[1], intended

    def figures(self):
        """What the worker reports about the schedule."""
        return {"scheduled": self.taken, "late_at_end": self.late_at_end,
                "dropped_at_end": self.dropped_at_end,
                "schedule_start": self.schedule.start, "schedule_end": self.schedule.end,
                "period_end": self.schedule.period_end, "worker_rate": self.schedule.rate}


def _bucket(us):
    """Microseconds rounded to two significant digits: per-second percentiles for the
    progress lines, cheap to send; the final figures come from full HDR histograms."""
    if us < 100:
        return max(us, LOWEST_US)
    step = 10 ** (int(math.log10(us)) - 1)
    return (us + step // 2) // step * step


class OpenRecorder(Recorder):
    """A :class:`bench.core.recorder.Recorder` that also keeps the service time: ``latency``
    counts from the intended start, ``service`` from the send.  Its ticks carry a
    sixth item: the second's latency and service time (``{microseconds: n}``, two
    significant digits) and the largest lag of a send behind its intended time."""

    SERIES = ("latency", "service_time")

    def __init__(self, phase, send):
        super().__init__(phase, send)
        self.service_time = collections.defaultdict(dict)   # op -> {microseconds: n}
        self._second_latency = collections.Counter()
        self._second_service = collections.Counter()
        self._second_lag = 0.0
        self.max_lag = 0.0
        self.last_send = 0.0

    def record_open(self, op, intended, t0, t1, error):
        if t1 >= self.next_tick:
            self._next_interval(t1)
        if t0 > self.last_send:
            self.last_send = t0
        lag = t0 - intended
        us = int((t1 - (intended if lag > 0 else t0)) * 1e6)
        service_us = int((t1 - t0) * 1e6)
        if lag > self._second_lag:
            self._second_lag = lag
        self.interval[op] += 1
        if error is not None:
            # counted, its times under <op>-failed; the second's percentiles are the
            # successful requests'
            self.errors[op, error] += 1
            self._interval_errors[error] += 1
            op = op + FAILED
        else:
            self._second_latency[_bucket(us)] += 1
            self._second_service[_bucket(service_us)] += 1
        latency, service = self.latency[op], self.service_time[op]
        latency[us] = latency.get(us, 0) + 1
        service[service_us] = service.get(service_us, 0) + 1

    def sample(self, op, t0, t1, failed=False):
        """A part's time (``Recorder.sample``), in both series: a part's intended start
        is its send (an rmw's update leaves when its read is answered)."""
        if t1 >= self.next_tick:
            self._next_interval(t1)
        us = int((t1 - t0) * 1e6)
        name = op + FAILED if failed else op
        latency, service = self.latency[name], self.service_time[name]
        latency[us] = latency.get(us, 0) + 1
        service[us] = service.get(us, 0) + 1

    def _send_second(self):
        """The second's tick, with its latency and service time buckets and largest lag."""
        if self._second or self._second_errors:
            self._send(("tick", self.phase, self._second_of, dict(self._second),
                        dict(self._second_errors),
                        {"latency": dict(self._second_latency),
                         "service": dict(self._second_service),
                         "lag": self._second_lag}))
            self._second.clear()
            self._second_errors.clear()
            self._second_latency.clear()
            self._second_service.clear()
            self.max_lag = max(self.max_lag, self._second_lag)
            self._second_lag = 0.0

    def service_histograms(self):
        """op -> encoded HDR histogram of its service times in microseconds."""
        out = {}
        for op, counts in self.merged("service_time").items():
            hist = new_histogram()
            for us, n in counts.items():
                hist.record_value(max(us, LOWEST_US), n)
            out[op] = hist.encode()
        return out


class LockedOpenRecorder(OpenRecorder):
    """For the threads driver."""

    shared = True

    def __init__(self, phase, send):
        super().__init__(phase, send)
        self._lock = threading.Lock()

    def record_open(self, op, intended, t0, t1, error):
        with self._lock:
            super().record_open(op, intended, t0, t1, error)

    def sample(self, op, t0, t1, failed=False):
        with self._lock:
            super().sample(op, t0, t1, failed)


def _outcome(op, key, rows, payloads, expected, spread):
    if rows and rows[0][0] == key and rows[0][2] == expected[key % spread]:
        return None
    return check(op, key, rows, payloads)


def serve_open(take, recorder, calls, payloads, error_kind, sleep, go=None):
    """The open-loop body of every greenlet and thread: take the next scheduled request,
    wait (``sleep``) for its intended time, send it, record it; until ``take()`` runs dry.

    :param error_kind: ``error_kind(exc)`` -> the kind an exception is counted as
    :param sleep: ``gevent.sleep`` or ``time.sleep``: what waits without blocking the rest
    """
    clock = time.monotonic
    record = recorder.record_open
    expected, spread = payloads.table, payloads.SPREAD
    if go is not None:
        go()
    while True:
        item = take()
        if item is None:
            return
        op, key, intended = item
        wait = intended - clock()
        if wait > EARLY:
            sleep(wait - EARLY)
        t0 = clock()
        try:
            rows = calls[op](key)
        except Exception as exc:  # a failed request is a counted result, not a dead worker
            record(op, intended, t0, clock(), error_kind(exc))
            continue
        t1 = clock()
        record(op, intended, t0, t1, _outcome(op, key, rows, payloads, expected, spread))


async def serve_open_async(take, recorder, calls, payloads, error_kind, go=None):
    """``serve_open`` for asyncio tasks."""
    clock = time.monotonic
    record = recorder.record_open
    expected, spread = payloads.table, payloads.SPREAD
    if go is not None:
        await go()
    while True:
        item = take()
        if item is None:
            return
        op, key, intended = item
        wait = intended - clock()
        if wait > EARLY:
            await asyncio.sleep(wait - EARLY)
        t0 = clock()
        try:
            rows = await calls[op](key)
        except Exception as exc:  # a failed request is a counted result, not a dead worker
            record(op, intended, t0, clock(), error_kind(exc))
            continue
        t1 = clock()
        record(op, intended, t0, t1, _outcome(op, key, rows, payloads, expected, spread))


def percentile(buckets, p):
    """The ``p``-th percentile of merged ``{microseconds: n}`` buckets, in ms (None if empty)."""
    total = sum(buckets.values())
    if not total:
        return None
    rank = math.ceil(total * p / 100)
    seen = 0
    for us in sorted(buckets):
        seen += buckets[us]
        if seen >= rank:
            return us / 1000
    return max(buckets) / 1000


# -- the parent's side: merging the workers' open-loop figures ---------------------------

def merge_second(into, extra):
    """Add a tick's open-loop part (``OpenRecorder.flush``) to ``into``, a dict made by
    ``new_second()``."""
    into["latency"].update(extra["latency"])
    into["service"].update(extra["service"])
    into["lag"] = max(into["lag"], extra["lag"])


def new_second():
    return {"latency": collections.Counter(), "service": collections.Counter(), "lag": 0.0}


def second_text(merged):
    """The open-loop part of a progress line."""
    latency, service = percentile(merged["latency"], 99), percentile(merged["service"], 99)
    if latency is None:
        return ""
    return "  p99 %.2f ms (service %.2f), send lag max %.1f ms" % (
        latency, service, merged["lag"] * 1000)


def phase_figures(parts, rate, arrivals, ops, seconds, latency_ms):
    """The phase's ``open_loop`` object and service times (``service_time_ms`` of the
    phase, and ``{op: service_time_ms}``) from the workers' results.

    :param latency_ms: ``latency_ms(histogram)``, the runner's percentiles of a histogram
    """
    hists = collections.defaultdict(new_histogram)
    for part in parts:
        for op, encoded in (part.get("service_histograms") or {}).items():
            hists[op].add(decode_histogram(encoded))
    everything = new_histogram()   # the operations' successful requests'
    for op, hist in hists.items():
        if is_own(op):
            everything.add(hist)
    figures = [p["open_loop"] for p in parts]
    # The rate the requests left at, worker by worker: one that kept up sent its last
    # request within its schedule's period; one that fell behind, later.  (Not ops over
    # the phase's seconds, which add the last answer's latency to a short run.)  The
    # scheduled rate is what the schedules asked for over the same periods, so a worker
    # that kept up achieved exactly its scheduled rate, whatever the count's rounding.
    achieved = scheduled_rate = 0.0
    for f, p in zip(figures, parts):
        period = f["period_end"] - f["schedule_start"]
        if period <= 0:
            continue
        sending = max(f["period_end"], p.get("last_send", 0.0)) - f["schedule_start"]
        achieved += sum(p["counts"].values()) / sending
        scheduled_rate += f["scheduled"] / period
    backlog = sum(f["late_at_end"] for f in figures)
    dropped = sum(f.get("dropped_at_end", 0) for f in figures)
    lag = max(p.get("max_lag", 0.0) for p in parts)
    open_loop = {
        "target_rate": rate, "arrivals": arrivals, "achieved_rate": achieved or None,
        "scheduled_rate": scheduled_rate or None,
        "scheduled": sum(f["scheduled"] for f in figures), "backlog_at_end": backlog,
        "dropped_at_end": dropped,
        "max_send_lag_ms": lag * 1000,
        # Kept up: (nearly) every request left on time and the schedule's rate was reached.
        "kept_up": backlog <= max(1, 0.001 * ops) and not dropped and scheduled_rate > 0
        and achieved >= KEEP_UP * scheduled_rate,
    }
    return open_loop, latency_ms(everything), {op: latency_ms(h) for op, h in hists.items()}
