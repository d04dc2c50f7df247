"""Run one benchmark and return every figure as a dict: ``run(config[, target]) -> results``.

The parent starts P worker processes (forkserver), each with a pipe of its own each way,
and joins them at a barrier before every phase; :class:`Workers` keeps the processes for
one run after another (``run`` starts and stops them for one).  Between phases no request
is in flight, so ``box.stat()`` read right before the barrier opens and right after the last
worker reports covers exactly the phase's requests.  While a phase runs the parent merges
the workers' per-second counts, samples the server's counters once a second and prints a
line per second.
"""
import collections
import math
import multiprocessing
import multiprocessing.connection
import sys
import threading
import time

import tarantool

from bench.core import hlog, openloop, report
from bench.core.config import MIX_OPERATIONS, OPERATIONS
from bench.core.dataset import NEEDS
from bench.core.recorder import INTERVAL, decode_histogram, failed, is_own, new_histogram, split
from bench.core.workloads import MISMATCH, NOT_FOUND, is_server_error
from bench.run import worker
from bench.targets import SetupError, open_target

RECORDS_PHASES = ("load", "run")     # a mix or a preset: bench.core.dataset
SAMPLE_INTERVAL = 1.0   # seconds between box.stat() samples
MIN_SAMPLE_INTERVAL = 0.25  # shortest interval a server rps is computed over
PRINT_DELAY = 2         # seconds a per-second line waits for late worker counts
BARRIER_TIMEOUT = 120.0
# The box.stat() name of each operation that is one request; tx and scan count theirs
# themselves (the worker's "requests").  An eval is not compared: the run's own admin
# connection reads box.stat() with evals.
STAT_NAMES = {op: op.upper() for op in OPERATIONS + ("call", "execute")}
COMPOSITE_STATS = ("BEGIN", "COMMIT", "ROLLBACK")


def phase_names(config):
    if config.workload == "phases":
        return OPERATIONS
    return ("load", "warmup", "run") if config.warmup else RECORDS_PHASES


class BenchError(RuntimeError):
    """A worker failed or the run could not go on; the message says where."""


def run(config, target=None, out=None):
    """Run ``config`` against ``target`` (default: the server ``config`` names, or a new
    embedded one) and return the results dict that ``--json`` writes.  Progress lines go to
    ``out`` (default stdout) unless ``config.quiet``."""
    out = out or sys.stdout
    if target is None:
        with open_target(config) as target:
            return run(config, target, out)
    if config.workload != "phases":
        for op, (version, _) in NEEDS.items():
            if config.mix.get(op) and hasattr(target, "supports") \
                    and not target.supports(version):
                raise SetupError("operation %s needs Tarantool %s or later; the server is %s"
                                 % (op, ".".join(map(str, version)), target.version))
    with Workers(config, target, out) as workers:
        return workers.run(config)


# What may change from one run of the same worker processes to the next.
PER_RUN = ("rate", "duration", "warmup", "ops", "quiet", "json", "plot", "hlog")


class Workers:
    """P worker processes, started and connected once, for runs of ``config`` that differ
    only in :data:`PER_RUN` (a capacity search's steps): each run hands its config to
    the same processes, so none pays for a process start and a connection again.

    ``with Workers(config, target) as workers: workers.run(config.replace(rate=R))``;
    leaving the block stops the workers (terminates them after a failure)."""

    def __init__(self, config, target, out=None):
        self.config, self.target, self.out = config, target, out or sys.stdout
        self.pipes, self.controls, self.procs = [], [], []
        self.barrier = None
        self.prepared = False

    def __enter__(self):
        config = self.config
        self.target.prepare(config.space)
        self.prepared = True
        # Workers start from a clean interpreter (forkserver): a parent that already
        # ran gevent (its DNS thread pool, its hub) must not leak that into them.
        ctx = multiprocessing.get_context("forkserver")
        self.barrier = ctx.Barrier(config.procs + 1)
        # Each process's live records (oldest, acknowledged): one key space over them all.
        self.shared = ctx.RawArray("q", 2 * config.procs)
        # Many instances (bench.targets.instances): worker i drives instance i % N.
        address = getattr(self.target, "address", lambda i: (self.target.host, self.target.port))
        self.addresses = [address(index) for index in range(config.procs)]
        try:
            for index in range(config.procs):
                reader, writer = ctx.Pipe(duplex=False)
                orders, control = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=worker.main, daemon=True,
                                   name="bench-worker-%d" % index,
                                   args=(index, config, *self.addresses[index],
                                         writer, self.barrier, orders, self.shared))
                proc.start()
                writer.close()
                orders.close()
                self.pipes.append(reader)
                self.controls.append(control)
                self.procs.append(proc)
            _collect(self, "ready")
        except BaseException:
            self._stop(failed=True)
            raise
        return self

    def __exit__(self, kind, exc, tb):
        self._stop(failed=kind is not None)
        return False

    def _stop(self, failed):
        try:
            if not failed:
                for control in self.controls:
                    control.send(("stop",))
                _collect(self, "done")
                for proc in self.procs:
                    proc.join(30)
        finally:
            if self.barrier is not None:
                self.barrier.abort()
            for control in self.controls:
                control.close()
            for proc in self.procs:
                if proc.is_alive():
                    proc.terminate()
                proc.join()

    def run(self, config):
        """One run of ``config`` by these workers; returns its results dict.

        :raises ValueError: ``config`` differs from the workers' beyond :data:`PER_RUN`
        :raises BenchError: a worker failed or exited
        """
        def fixed(c):
            return {k: v for k, v in vars(c).items() if k not in PER_RUN}
        if fixed(config) != fixed(self.config):
            raise ValueError("workers started for one config run another that differs "
                             "beyond %s" % ", ".join(PER_RUN))
        if not self.prepared:
            self.target.prepare(config.space)   # each run starts from an empty space
        self.prepared = False
        for control in self.controls:
            control.send(("run", config))
        return _Run(config, self).execute()


def _collect(workers, kind):
    """Outside a run: read the pipes until every worker has sent ``kind``."""
    got = set()
    while len(got) < len(workers.pipes):
        waiting = [pipe for i, pipe in enumerate(workers.pipes) if i not in got]
        for pipe in multiprocessing.connection.wait(waiting, 5.0):
            index = workers.pipes.index(pipe)
            try:
                message = pipe.recv()
            except EOFError:
                raise BenchError("worker %d exited (code %s) before sending %r"
                                 % (index, workers.procs[index].exitcode, kind)) from None
            if message[0] == "error":
                raise BenchError(message[1])
            if message[0] != kind:
                raise BenchError("worker %d sent %r while %r was due"
                                 % (index, message[0], kind))
            got.add(index)


class _Run:
    def __init__(self, config, workers):
        self.config, self.target, self.out = config, workers.target, workers.out
        self.pipes, self.procs = workers.pipes, workers.procs
        self.addresses, self.barrier = workers.addresses, workers.barrier
        self.ticks = collections.defaultdict(
            lambda: (collections.Counter(), collections.Counter()))  # (phase, second) -> ...
        self.open_ticks = collections.defaultdict(openloop.new_second)
        self.samples = []
        self.t0 = None
        self.t0_epoch = None
        # (phase result, {interval index: {series: {op: histogram}}},
        #  {interval index: {op: requests}})
        self.intervals = []
        self.span = None  # (start, end) of the running phase, monotonic
        self.printed = set()

    def execute(self):
        config = self.config
        if not config.quiet:
            print(report.banner(config, self.target.describe()), file=self.out, flush=True)
        phases = [self._phase(name, self.barrier) for name in phase_names(config)]
        self._collect("ran")
        return self._results(phases)

    def _collect(self, kind, phase=None):
        """Read the pipes until every worker has sent ``kind``; returns their payloads.
        Ticks are merged on the way; during a phase the server is sampled once a second."""
        got = {}
        next_sample = time.monotonic() + SAMPLE_INTERVAL
        while len(got) < len(self.pipes):
            waiting = [pipe for i, pipe in enumerate(self.pipes) if i not in got]
            timeout = max(0.0, next_sample - time.monotonic()) if phase else 5.0
            for pipe in multiprocessing.connection.wait(waiting, timeout):
                index = self.pipes.index(pipe)
                try:
                    message = pipe.recv()
                except EOFError:
                    raise BenchError("worker %d exited (code %s) before sending %r"
                                     % (index, self.procs[index].exitcode, kind)) from None
                if message[0] == "tick":
                    name, second, counts, errors = message[1:5]
                    ops, errs = self.ticks[name, second]
                    ops.update(counts)
                    errs.update(errors)
                    if len(message) > 5:    # an open-loop phase's latency in that second
                        openloop.merge_second(self.open_ticks[name, second], message[5])
                elif message[0] == "error":
                    raise BenchError(message[1])
                elif message[0] == kind:
                    got[index] = message[1] if len(message) > 1 else None
                else:
                    raise BenchError("worker %d sent %r while %r was due"
                                     % (index, message[0], kind))
            if phase and time.monotonic() >= next_sample:
                self._sample(phase)
                next_sample += SAMPLE_INTERVAL
                self._print_seconds(phase, math.floor(time.monotonic()) - PRINT_DELAY)
        return [got[i] for i in range(len(self.pipes))]

    def _worker_error(self, wait=5.0):
        """The first error a worker sent (a worker that fails breaks the barrier, then
        says why), or None."""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            ready = multiprocessing.connection.wait(
                self.pipes, max(0.0, deadline - time.monotonic()))
            if not ready:
                return None
            for pipe in ready:
                try:
                    message = pipe.recv()
                except EOFError:
                    index = self.pipes.index(pipe)
                    return "worker %d exited (code %s)" % (index, self.procs[index].exitcode)
                if message[0] == "error":
                    return message[1]
        return None

    def _phase(self, name, barrier):
        """Open the barrier for one phase and gather it; returns the phase's results."""
        self.target.settle()
        stat_before = self.target.stat()
        cpu_before = self.target.cpu_seconds()
        try:
            barrier.wait(BARRIER_TIMEOUT)
        except threading.BrokenBarrierError:
            raise BenchError(self._worker_error() or "a worker did not reach the start of "
                             "phase %s within %.0f s" % (name, BARRIER_TIMEOUT)) from None
        started = time.monotonic()
        if self.t0 is None:
            self.t0, self.t0_epoch = started, time.time()
        self.samples.append({"t": started - self.t0, "phase": name, "stat": stat_before})
        self.span = (started, math.inf)
        parts = self._collect("phase", name)
        stat_after = self.target.stat()
        cpu_after = self.target.cpu_seconds()
        self._sample(name, stat_after)
        self.span = (started, max(p["end"] for p in parts))
        self._print_seconds(name, math.inf)
        server_cpu = None if cpu_before is None else cpu_after - cpu_before
        result = _phase_result(name, parts, stat_before, stat_after, server_cpu, self.t0,
                               self.config)
        if hasattr(self.target, "address"):
            _check_instances(result, parts, self.addresses, stat_before, stat_after)
        if hasattr(self.target, "check_phase"):   # per replica set (bench.targets.sharded)
            self.target.check_phase(result, stat_before, stat_after)
        self.intervals.append((result, *_merge_intervals(parts)))
        return result

    def _sample(self, phase, stat=None):
        if stat is None:
            try:
                stat = self.target.stat()
            except tarantool.error.Error:
                return  # the server is unreachable (restart, network fault): no sample
        self.samples.append({"t": time.monotonic() - self.t0, "phase": phase, "stat": stat})

    def _print_seconds(self, phase, upto):
        """Print the per-second lines of ``phase`` up to monotonic second ``upto``."""
        if self.config.quiet:
            return
        for (name, second) in sorted(self.ticks, key=lambda k: k[1]):
            if name != phase or second > upto or (name, second) in self.printed:
                continue
            self.printed.add((name, second))
            ops, errors = self.ticks[name, second]
            # The phase's first and last seconds are partial: a rate over the part it ran
            # (at least a quarter second, unless the whole phase was shorter: a few
            # requests in a sliver of a second make no rate).
            covered = min(second + 1, self.span[1]) - max(second, self.span[0])
            floor = min(MIN_SAMPLE_INTERVAL, self.span[1] - self.span[0])
            line = report.second_line(second - math.floor(self.t0), phase, ops, errors,
                                      max(covered, floor, 1e-9),
                                      self._server_rps(second))
            if (name, second) in self.open_ticks:
                line += openloop.second_text(self.open_ticks[name, second])
            print(line, file=self.out, flush=True)

    def _server_rps(self, second):
        """Requests/s of the four operations between the samples around ``second``."""
        t = second - self.t0
        before = [s for s in self.samples if s["t"] <= t]
        after = [s for s in self.samples if s["t"] >= t + 1]
        if not before or not after:
            return None
        a, b = before[-1], after[0]
        total = sum(b["stat"].get(n, 0) - a["stat"].get(n, 0) for n in STAT_NAMES.values())
        if total < 0:
            return None  # the server restarted in between
        return total / (b["t"] - a["t"])

    def _results(self, phases):
        spans = {phase["name"]: (phase["start"], phase["end"]) for phase in phases}
        series = []
        for (name, second), (ops, errors) in sorted(self.ticks.items(), key=lambda kv: kv[0][1]):
            # A phase's first and last seconds are partial: "covered" is the part it ran.
            start, end = spans[name]
            covered = min(second + 1 - self.t0, end) - max(second - self.t0, start)
            entry = {"t": second - math.floor(self.t0), "phase": name,
                     "covered": covered, "ops": dict(ops), "errors": dict(errors)}
            if (name, second) in self.open_ticks:
                merged = self.open_ticks[name, second]
                entry["latency_p99_ms"] = openloop.percentile(merged["latency"], 99)
                entry["service_time_p99_ms"] = openloop.percentile(merged["service"], 99)
                entry["send_lag_max_ms"] = merged["lag"] * 1000
            series.append(entry)
        server_rps = []
        for name in phase_names(self.config):
            points = _spaced([s for s in self.samples if s["phase"] == name])
            for a, b in zip(points, points[1:]):
                rps = {op: (b["stat"].get(n, 0) - a["stat"].get(n, 0)) / (b["t"] - a["t"])
                       for op, n in STAT_NAMES.items()
                       if op in OPERATIONS or self.config.mix.get(op)}
                if min(rps.values()) >= 0:   # negative across a server restart
                    server_rps.append({"t": round(b["t"], 3), "phase": name, "rps": rps})
        intervals, logged = self._intervals()
        if self.config.hlog:
            hlog.write(self.config.hlog, self.t0_epoch, logged)
        ops = sum(p["ops"] for p in phases)
        seconds = sum(p["seconds"] for p in phases)
        cpu = sum(p["client_cpu_seconds"] for p in phases)
        return {
            "config": self.config.as_dict(),
            "server": self.target.describe(),
            "concurrency": self.config.procs * self.config.concurrency,
            "phases": phases,
            "totals": {
                "ops": ops, "seconds": seconds, "ops_per_sec": _rate(ops, seconds),
                "client_cpu_seconds": cpu, "ops_per_client_cpu_second": _rate(ops, cpu),
                "errors": sum(sum(p["errors"].values()) for p in phases),
                "server_counts_match": all(p["server"]["match"] for p in phases),
            },
            "series": series,
            "interval_seconds": INTERVAL,
            "intervals": intervals,
            "gaps": outages(series),
            "server_rps": server_rps,
        }

    def _intervals(self):
        """Every phase's intervals: figures for the JSON and the plot (``t`` and ``seconds``:
        the part of the interval the phase ran, from the start of the first phase), and
        ``(start, end, {tag: histogram})`` for :func:`bench.core.hlog.write`: tag None is
        every operation's latency, ``op`` one operation's, ``series`` and ``series.op``
        another series of times (``Recorder.SERIES``).  The untagged histogram and an
        interval's ``<series>_ms`` hold the successful requests' times; a failed
        request's are tagged ``<op>-failed``.  ``ops`` and ``operations`` count the
        requests (failed ones included), from the workers' counts."""
        figures, logged = [], []
        for phase, merged, counted in self.intervals:
            start, end = phase["start"] + self.t0, phase["end"] + self.t0
            for index in sorted(set(merged) | set(counted)):
                # (a worker may start a hair before the parent's clock: no negative times)
                lo = max(index * INTERVAL - self.t0, start - self.t0, 0.0)
                hi = max(min((index + 1) * INTERVAL, end) - self.t0, lo + 1e-3)
                entry = {"t": round(lo, 4), "seconds": round(hi - lo, 4), "phase": phase["name"]}
                operations = counted.get(index, {})
                entry["ops"] = sum(operations.values())
                entry["operations"] = dict(operations)
                tagged = {}
                for series, by_op in sorted(merged.get(index, {}).items()):
                    total = new_histogram()
                    for op, hist in by_op.items():
                        if is_own(op):
                            total.add(hist)
                    figures_ms = latency_ms(total)
                    if figures_ms is not None:   # (an interval of failures only: none)
                        entry[series + "_ms"] = figures_ms
                    base = None if series == "latency" else series
                    tagged[base] = total
                    for op, hist in sorted(by_op.items()):
                        tagged[op if base is None else "%s.%s" % (base, op)] = hist
                figures.append(entry)
                logged.append((lo, hi, tagged))
        return figures, logged


def _merge_intervals(parts):
    """The workers' intervals of one phase merged: ``{index: {series: {op: histogram}}}``
    and the requests of each, ``{index: {op: n}}``."""
    merged = {}
    counted = collections.defaultdict(collections.Counter)
    for part in parts:
        for index, counts in part.get("interval_counts", ()):
            counted[index].update(counts)
        for index, by_series in part["intervals"]:
            slot = merged.setdefault(index, {})
            for series, by_op in by_series.items():
                for op, encoded in by_op.items():
                    slot.setdefault(series, {}).setdefault(op, new_histogram()).add(
                        decode_histogram(encoded))
    return merged, {index: dict(counts) for index, counts in counted.items()}


def _answered(ops, errors):
    """Requests of one second that the server answered (its refusals included)."""
    return sum(ops.values()) - sum(n for kind, n in errors.items() if not _by_server(kind))


def _by_server(kind):
    return is_server_error(kind) or kind in (NOT_FOUND, MISMATCH)


def outages(series):
    """Stretches of whole seconds in which no request got an answer (a server restart,
    a network fault), with the errors counted meanwhile."""
    gaps = []
    for entry in series:
        if _answered(entry["ops"], entry["errors"]) or not entry["ops"]:
            continue
        gap = gaps[-1] if gaps and gaps[-1]["phase"] == entry["phase"] \
            and gaps[-1]["to"] == entry["t"] else None
        if gap is None:
            gap = {"phase": entry["phase"], "from": entry["t"], "to": entry["t"],
                   "errors": collections.Counter()}
            gaps.append(gap)
        gap["to"] = entry["t"] + 1
        gap["errors"].update(entry["errors"])
    return [dict(gap, seconds=gap["to"] - gap["from"], errors=dict(gap["errors"]))
            for gap in gaps]


def _spaced(samples):
    """A phase's samples, first and last kept, none closer than MIN_SAMPLE_INTERVAL to the
    one before: rps over a sliver of a second is noise."""
    kept = samples[:1]
    for sample in samples[1:]:
        if sample["t"] - kept[-1]["t"] >= MIN_SAMPLE_INTERVAL:
            kept.append(sample)
        elif sample is samples[-1]:  # the phase's end replaces the sample just before it
            if len(kept) > 1:
                kept[-1] = sample
            else:
                kept.append(sample)
    return kept


def _rate(n, seconds):
    return n / seconds if seconds > 0 else None


def latency_ms(hist):
    """Percentiles, max and mean of a histogram of microseconds, in milliseconds; None
    for an empty one (no latency: no request of the row succeeded)."""
    if not hist.get_total_count():
        return None
    figures = {"p%g" % p: hist.get_value_at_percentile(p) / 1000 for p in (50, 90, 99, 99.9)}
    figures["max"] = hist.get_max_value() / 1000
    figures["mean"] = hist.get_mean_value() / 1000
    return figures


# The percentile curve's points: 1/(1-p) evenly spaced on a log scale, 0% to 99.999%.
CURVE = [100 * (1 - 10 ** (-k / 10)) for k in range(51)]


def percentile_curve(hist):
    """``[[percentile, milliseconds], ...]`` from 0 to 99.999% and the maximum (100), what
    HdrHistogram's percentile distribution plots."""
    if not hist.get_total_count():
        return []
    points = [[round(p, 4), hist.get_value_at_percentile(p) / 1000] for p in CURVE]
    return points + [[100.0, hist.get_max_value() / 1000]]


def _check_instances(result, parts, addresses, stat_before, stat_after):
    """Many instances: each one's box.stat requests against the requests of the
    workers that drove it (their connections' counters); the phase matches only
    when every instance does.  Adds ``requests@host:port`` to the connection
    counters, which the report prints beside each instance's box.stat."""
    connection = result["connection"]
    if connection is None:
        return   # a driver without counters: the totals are checked as usual
    sent = collections.Counter()
    for part, (host, port) in zip(parts, addresses):
        sent["%s:%s" % (host, port)] += part["connection"]["requests"]
    matches = {}
    for where, requests in sent.items():
        counted = sum(stat_after.get("%s@%s" % (n, where), 0)
                      - stat_before.get("%s@%s" % (n, where), 0) for n in STAT_NAMES.values())
        connection["requests@" + where] = requests
        matches[where] = counted == requests
    server = result["server"]
    server["instances_match"] = matches
    server["match"] = server["match"] and all(matches.values())


def _phase_result(name, parts, stat_before, stat_after, server_cpu, t0, config=None):
    """Merge the workers' results for one phase with the server's counters; times are
    seconds since ``t0``, the start of the first phase."""
    start, end = min(p["start"] for p in parts), max(p["end"] for p in parts)
    seconds = end - start
    counts = collections.Counter()
    errors = collections.defaultdict(collections.Counter)
    by_series = collections.defaultdict(lambda: collections.defaultdict(new_histogram))
    for part in parts:
        counts.update(part["counts"])
        for op, kind, n in part["errors"]:
            errors[op][kind] += n
        for series, by_op in part["histograms"].items():
            for op, encoded in by_op.items():
                by_series[series][op].add(decode_histogram(encoded))
    everything = {}   # series -> every operation's successful requests' histogram
    for series, by_op in by_series.items():
        everything[series] = new_histogram()
        for op, hist in by_op.items():
            if is_own(op):
                everything[series].add(hist)
    rows = collections.defaultdict(list)   # a report's row -> the names it merges
    for recorded in sorted(by_series["latency"]):
        rows[split(recorded)[0]].append(recorded)
    ops = sum(counts.values())
    cpu = sum(p["cpu_seconds"] for p in parts)
    system = sum(p["cpu_system_seconds"] for p in parts)

    # Requests the server answered: all but those that failed in the client (network, timeout).
    answered = {op: counts[op] - sum(n for kind, n in errors[op].items() if not _by_server(kind))
                for op in STAT_NAMES}
    # What tx and scan sent, request by request.
    for part in parts:
        for stat, n in part.get("requests", {}).items():
            op = stat.lower()
            answered[op] = answered.get(op, 0) + n
    # The four always, the rest when this run sent them.
    names = {op: op.upper() for op in answered if op in OPERATIONS or answered[op]}
    answered = {op: answered[op] for op in names}
    server_requests = {op: stat_after.get(n, 0) - stat_before.get(n, 0)
                       for op, n in names.items()}
    # box.stat() counts what Lua does too: a call's or an eval's get is a SELECT, and
    # on 2.10+ every write's own transaction a BEGIN and a COMMIT.  Those are shown,
    # not compared.
    lua = counts["call"] or counts["eval"]
    compared = [op for op in names if op.upper() not in COMPOSITE_STATS
                and not (op == "select" and lua)]
    client_server_errors = sum(n for kinds in errors.values() for kind, n in kinds.items()
                               if is_server_error(kind))
    server_errors = stat_after["ERROR"] - stat_before["ERROR"]

    connection = None
    if all(p["connection"] is not None for p in parts):
        connection = collections.Counter()
        for part in parts:
            for key, value in part["connection"].items():
                if key == "max_in_flight":
                    connection[key] = max(connection[key], value)
                else:
                    connection[key] += value
        connection = dict(connection)
        for key in ("send_calls", "recv_calls"):
            if key in connection:
                connection[key + "_per_1000_ops"] = 1000 * connection[key] / ops if ops else None

    result = {
        "name": name,
        "start": start - t0,
        "end": end - t0,
        "seconds": seconds,
        "ops": ops,
        "ops_per_sec": _rate(ops, seconds),
        # the successful requests' (None: none succeeded); failures: "failed" below
        "latency_ms": latency_ms(everything.get("latency", new_histogram())),
        # (and "<series>_ms" of every other series of times the recorder keeps)
        **{series + "_ms": latency_ms(hist) for series, hist in everything.items()
           if series != "latency"},
        "percentiles_ms": {series: percentile_curve(hist) for series, hist in everything.items()},
        "errors": dict(sum(errors.values(), collections.Counter())),
        # Each operation's requests; its latency_ms the successful ones' (None: none
        # succeeded), over "samples" times: its own and, in "parts", how many were
        # requests of another operation (an rmw's select and update).
        "operations": {op: _op_figures(counts[op], seconds, rows.get(op, ()), by_series,
                                       errors[op])
                       for op in MIX_OPERATIONS if counts[op] or op in rows},
        # ... and its failed requests' latency (YCSB's READ-FAILED): the row <op>-failed
        "failed": {op: _op_figures(sum(errors[op].values()), seconds, rows[failed(op)],
                                   by_series, errors[op])
                   for op in MIX_OPERATIONS if failed(op) in rows},
        "client_cpu_seconds": cpu,
        "client_system_seconds": system,
        # Each worker process's CPU seconds per second of its phase: one process of an
        # event loop cannot go past one core, which a sum over processes hides.
        "client_cpu_by_process": [p["cpu_seconds"] / (p["end"] - p["start"])
                                  if p["end"] > p["start"] else 0.0 for p in parts],
        # ... and the time each one was ready to run but waited for a CPU: a process
        # busy or waiting all the time is what limits the step, not the server.
        "client_cpu_wait_by_process": [
            p["cpu_wait_seconds"] / (p["end"] - p["start"])
            if p.get("cpu_wait_seconds") is not None and p["end"] > p["start"] else None
            for p in parts],
        # The client's garbage collections during the phase, by generation.
        "client_gc_collections": [sum(p.get("gc_collections", (0, 0, 0))[g] for p in parts)
                                  for g in range(3)],
        "ops_per_client_cpu_second": _rate(ops, cpu),
        "connection": connection,
        "server": {
            "requests": server_requests,
            "client_requests": answered,
            "errors": server_errors,
            "client_errors": client_server_errors,
            "match": all(server_requests[op] == answered[op] for op in compared)
            and server_errors == client_server_errors,
            "compared": compared,
            # box.stat starts again from zero when the server restarts mid-phase.
            "restarted": any(stat_after[n] < stat_before[n] for n in stat_before),
            "cpu_seconds": server_cpu,
            # --pool: each instance's box.stat counts, "SELECT@host:port"
            "instances": {key: stat_after[key] - stat_before[key] for key in stat_after
                          if key.split("@")[0] in names.values() and "@" in key
                          and stat_after[key] != stat_before.get(key, 0)},
        },
    }
    if all("open_loop" in p for p in parts):
        # Open loop: latency_ms counts from the intended start, service_time_ms from the send.
        # (each row's service_time_ms is its service_time series, as _op_figures gives)
        result["open_loop"], result["service_time_ms"], _ = openloop.phase_figures(
            parts, config.rate, config.arrivals, ops, seconds, latency_ms)
    return result


def _op_figures(n, seconds, names, by_series, errors):
    """One row of a phase: ``n`` requests, the times recorded under ``names`` (``op``,
    ``<op>-failed``, and the same as parts of another operation: ``rmw/select``) in each
    series merged, and the operation's errors by kind."""
    merged = {}
    for series, by_op in by_series.items():
        hists = [by_op[name] for name in names if name in by_op]
        if hists:
            merged[series] = new_histogram()
            for hist in hists:
                merged[series].add(hist)
    latency = merged.get("latency")
    parts = {}
    for name in names:
        whole = split(name)[1]
        if whole is not None and name in by_series["latency"]:
            parts[whole] = parts.get(whole, 0) + by_series["latency"][name].get_total_count()
    return {"ops": n, "ops_per_sec": _rate(n, seconds),
            "latency_ms": None if latency is None else latency_ms(latency),
            "samples": 0 if latency is None else latency.get_total_count(),
            **({"parts": parts} if parts else {}),
            **{series + "_ms": latency_ms(hist) for series, hist in merged.items()
               if series != "latency"},
            "errors": dict(errors)}
