"""``python -m bench.capacity --slo p99=2ms``: the highest fixed rate that meets a latency SLO.

Runs the load of ``python -m bench`` (the same options) open-loop at one rate after another:
a staircase (``--start``, times ``--factor`` each step) until a step breaks the SLO or
cannot keep up (achieved below ``KEEP_UP`` of the target), then bisection between the last
rate that held and the first that broke until they are within ``--precision``.  The
latency judged is the one from the intended start (``bench.core.openloop``) over the run phases
(a load phase is not judged).  Prints a table (rate, achieved, p50, p99, p99.9, client and
server CPU) and a last line ``capacity: N ops/s at p99 X ms (SLO p99 <= 2 ms)``; ``--json``
and ``--plot`` (latency against rate) write the steps.

:func:`search` is the algorithm alone: ``measure(rate) -> Step`` in, steps out.
"""
import argparse
import dataclasses
import json
import math
import re
import sys
import time
from typing import Dict, List, Optional

import tarantool.error

from bench import drivers
from bench.core import config as options
from bench.core import dataset, openloop
from bench.run import runner
from bench.targets import SetupError, open_target

KEEP_UP = openloop.KEEP_UP   # a step holds only when it achieved this share of its schedule
CLIENT_BOUND_CPU = 0.85     # a worker process this busy (of one core) limits the step itself
MAX_ERRORS = 0.1            # percent of a step's requests that may fail (--max-errors)
MAX_RATE = 10_000_000       # ops/s: the staircase stops above it
SAMPLES = 100               # a step runs until its judged percentile rests on this many
                            # requests beyond it: SAMPLES / (1 - q) requests in all
CONFIRMATIONS = 3           # confirmation runs of one search at most
PERCENTILES = ("p50", "p90", "p99", "p99.9", "max")
UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}
UNMEASURED = ("load", "warmup")   # phases of a step that are not judged
WARMUP = 1.0                # seconds of each step's own load before it is measured


@dataclasses.dataclass
class Slo:
    """``p99 <= 2 ms``: a percentile of the latency from the intended start, of every
    operation together or of one (``op``)."""
    percentile: str
    ms: float
    op: Optional[str] = None

    def __str__(self):
        return "%s%s <= %g ms" % (self.op + " " if self.op else "", self.percentile, self.ms)

    @property
    def quantile(self):
        """The percentile as a share (0.99), None for max."""
        return None if self.percentile == "max" else float(self.percentile[1:]) / 100


def parse_slo(text):
    """``"p99=2ms"`` (also ``p99.9=500us``, ``p50=0.5ms``, ``max=1s``, and one operation's:
    ``select:p99=2ms``) -> :class:`Slo`.

    :raises ValueError: another form, an unknown percentile or operation, or a bound <= 0
    """
    match = re.fullmatch(r"\s*(?:([a-z_-]+)\s*:)?\s*(p[0-9.]+|max)\s*(?:=|<=)\s*([0-9.]+)"
                         r"\s*(us|ms|s)?\s*", str(text))
    if not match or match.group(2) not in PERCENTILES:
        raise ValueError("SLO must be [OPERATION:]PERCENTILE=BOUND with PERCENTILE one of %s "
                         "and BOUND in us, ms or s (e.g. p99=2ms, select:p99=2ms), got %r"
                         % (", ".join(PERCENTILES), text))
    op = match.group(1)
    if op is not None and op not in dataset.RUN_OPERATIONS:
        raise ValueError("the SLO's operation must be one of %s, got %r"
                         % (", ".join(dataset.RUN_OPERATIONS), op))
    ms = float(match.group(3)) * UNITS[match.group(4) or "ms"]
    if not ms > 0:
        raise ValueError("the SLO's bound must be > 0")
    return Slo(match.group(2), ms, op)


def parse_percent(text):
    """``"0.1"`` or ``"0.1%"`` -> 0.1 (percent).

    :raises ValueError: not a number in 0..100"""
    try:
        value = float(str(text).strip().rstrip("%"))
    except ValueError:
        value = -1.0
    if not 0 <= value <= 100:
        raise ValueError("need a percentage in 0..100, got %r" % text)
    return value


def group_slos(slos):
    """The SLO sets a run searches: one per SLO of every operation together, each with
    the SLOs of single operations; only the latter: one set of them all."""
    whole = [slo for slo in slos if slo.op is None]
    single = [slo for slo in slos if slo.op is not None]
    return [[slo] + single for slo in whole] if whole else [single]


def _listed(slo):
    return list(slo) if isinstance(slo, (list, tuple)) else [slo]


@dataclasses.dataclass
class Step:
    """One rate tried: what it achieved and its latency (ms, from the intended start)."""
    rate: float
    achieved: float
    latency_ms: dict
    service_time_ms: Optional[dict] = None
    client_cpu: Optional[float] = None     # client CPU seconds per second, all processes
    server_cpu: Optional[float] = None
    backlog: int = 0
    errors: int = 0
    ok: bool = False
    stage: str = ""
    scheduled_rate: Optional[float] = None  # what the schedules asked for (None: ``rate``)
    ops: int = 0
    errors_by_kind: Dict[str, int] = dataclasses.field(default_factory=dict)
    latency_by_op_ms: Dict[str, dict] = dataclasses.field(default_factory=dict)
    worker_cpu: List[float] = dataclasses.field(default_factory=list)  # per process
    # per process: the share of the step it was ready to run but waited for a CPU
    worker_wait: List[Optional[float]] = dataclasses.field(default_factory=list)
    steal: Optional[float] = None          # the host's CPU steal, share of its CPU time
    seconds: Optional[float] = None
    reasons: List[str] = dataclasses.field(default_factory=list)
    client_bound: bool = False

    @property
    def error_percent(self):
        return 100.0 * self.errors / self.ops if self.ops else 0.0

    @property
    def worker_demand(self):
        """Each worker process's CPU plus its wait for one, in cores: what it would
        have used on a host of its own."""
        waits = self.worker_wait or [None] * len(self.worker_cpu)
        return [c + (w or 0.0) for c, w in zip(self.worker_cpu, waits)]

    @property
    def busiest(self):
        """The busiest worker process's CPU (cores), its wait for a CPU included; None
        when not known."""
        return max(self.worker_demand) if self.worker_cpu else None

    def judge(self, slos, max_errors=MAX_ERRORS):
        """Hold or break the step; ``reasons`` say why it broke, ``client_bound`` whether
        a worker process was at :data:`CLIENT_BOUND_CPU` of a core or more.

        :param slos: a :class:`Slo` or a list of them, all to be met
        :param max_errors: percent of the requests that may fail
        :returns: ``ok``
        """
        reasons = []
        for slo in _listed(slos):
            figures = self.latency_ms if slo.op is None else self.latency_by_op_ms.get(slo.op)
            if figures is None:
                reasons.append("no %s ran" % slo.op)
            elif figures[slo.percentile] is None:   # (latency: successful requests only)
                reasons.append("no %s succeeded" % (slo.op or "request"))
            elif figures[slo.percentile] > slo.ms:
                reasons.append("%s%s %.3f ms" % (slo.op + " " if slo.op else "",
                                                 slo.percentile, figures[slo.percentile]))
        expected = self.scheduled_rate or self.rate
        if self.achieved < KEEP_UP * expected:
            reasons.append("achieved {:.0%} of the schedule".format(self.achieved / expected))
        if self.ops and self.error_percent > max_errors:
            reasons.append("errors %s" % _percent(self.error_percent))
        self.client_bound = self.busiest is not None and self.busiest >= CLIENT_BOUND_CPU
        if self.client_bound:
            reasons.append("client-bound: %s" % _busy(self))
        self.reasons = reasons
        self.ok = not reasons
        return self.ok


def _percent(value):
    return "%.3g%%" % value


def _busy(step):
    """``1 worker process at 1.07 CPU``: the processes at the client-bound line or above
    (and, on a busy host, how much of it was waiting for a CPU)."""
    demand = step.worker_demand
    busy = [i for i, d in enumerate(demand) if d >= CLIENT_BOUND_CPU] or \
        [demand.index(max(demand))]
    top = max(busy, key=lambda i: demand[i])
    waits = step.worker_wait or [None] * len(demand)
    text = "%d worker process%s at %.2f CPU" % (len(busy), "es" if len(busy) > 1 else "",
                                                demand[top])
    if (waits[top] or 0.0) >= 0.05:
        text += " (%.2f of it waiting for a CPU: a busy host)" % waits[top]
    return text


def search(measure, slo, start=1000.0, factor=2.0, precision=0.05, budget=None,
           clock=time.monotonic, max_rate=MAX_RATE, on_step=None, max_errors=MAX_ERRORS,
           confirm=True):
    """Find the highest rate whose step meets ``slo``, confirmed by a second run at it.

    :param measure: ``measure(rate) -> Step``
    :param slo: a :class:`Slo` or a list of them, all to be met
    :param start: the staircase's first rate
    :param factor: the staircase's ratio between steps
    :param precision: bisection stops when the failing rate is within this share above
        the holding one
    :param budget: seconds after which no new step starts (None: no limit); a
        confirmation run starts regardless
    :param on_step: called with each step once judged (progress lines)
    :param max_errors: percent of a step's requests that may fail
    :param confirm: run the best rate again; when that run breaks, the rate counts as
        broken and the search goes on below it
    :returns: ``(steps, best)``: every step in order and the highest holding one (None
        when no rate held)
    :raises ValueError: parameters out of range
    """
    if not (start > 0 and factor > 1 and 0 < precision < 1):
        raise ValueError("need start > 0, factor > 1 and 0 < precision < 1")
    began = clock()
    steps: List[Step] = []

    def run(rate, stage):
        step = measure(rate)
        step.stage = stage
        step.judge(slo, max_errors)
        steps.append(step)
        if on_step is not None:
            on_step(step)
        return step

    def time_left():
        return budget is None or clock() - began < budget

    best, failed = None, None
    rate = start
    while time_left() and rate <= max_rate:
        step = run(rate, "staircase")
        if not step.ok:
            failed = rate
            break
        best = step
        rate *= factor
    if best is None and failed is not None:
        # Even the first step broke: go down the staircase instead.
        rate = start / factor
        while time_left() and rate >= 1:
            step = run(rate, "staircase")
            if step.ok:
                best = step
                break
            failed = rate
            rate /= factor
    for _ in range(CONFIRMATIONS if confirm else 0):
        while best is not None and failed is not None and time_left() \
                and failed > best.rate * (1 + precision):
            rate = (best.rate + failed) / 2
            step = run(rate, "bisection")
            if step.ok:
                best = step
            else:
                failed = rate
        if best is None:
            break
        again = run(best.rate, "confirm")
        if again.ok:
            break
        # A lucky step: its rate is broken after all; the best is the next one down.
        failed = best.rate
        below = [s for s in steps if s.ok and s.rate < failed and s.stage != "confirm"]
        best = max(below, key=lambda s: s.rate) if below else None
    else:
        while best is not None and failed is not None and time_left() \
                and failed > best.rate * (1 + precision):
            rate = (best.rate + failed) / 2
            step = run(rate, "bisection")
            if step.ok:
                best = step
            else:
                failed = rate
    return steps, best


def _fmt(value, digits=2, none="n/a"):
    return none if value is None else "%.*f" % (digits, value)


def _errors_text(step):
    """``0.11% (server_error_33 11)``: the share of requests that failed, by kind."""
    if not step.errors:
        return ""
    kinds = ", ".join("%s %s" % (kind, "{:,}".format(n))
                      for kind, n in sorted(step.errors_by_kind.items(), key=lambda kv: -kv[1]))
    return "  errors %s (%s)" % (_percent(step.error_percent), kinds)


def table(steps):
    """The steps as text, one line each: ``client`` is the busiest worker process's CPU
    (of one core), ``server`` the server's CPU seconds per second, ``errors`` the share
    of requests that failed (by kind after the verdict)."""
    lines = ["%-10s %10s %10s %8s %8s %8s %8s %7s %7s %7s %6s  %s" % (
        "stage", "rate", "achieved", "p50", "p99", "p99.9", "max", "errors", "client",
        "server", "steal", "verdict"),
        "%-10s %10s %10s %35s %7s %7s %7s" % ("", "ops/s", "ops/s", "latency ms (intended)",
                                              "", "CPU", "CPU")]
    for s in steps:
        lat = s.latency_ms
        verdict = "holds" if s.ok else "broken: " + "; ".join(s.reasons)
        lines.append("%-10s %10s %10s %8s %8s %8s %8s %7s %7s %7s %6s  %s%s" % (
            s.stage, "{:,.0f}".format(s.rate), "{:,.0f}".format(s.achieved),
            *(_fmt(lat[p], 3, "-") for p in ("p50", "p99", "p99.9", "max")),
            _percent(s.error_percent) if s.errors
            else "-", _fmt(s.busiest), _fmt(s.server_cpu),
            _percent(100 * s.steal) if s.steal else "-", verdict, _errors_text(s)))
    return "\n".join(lines)


def bounding(best, steps):
    """The lowest broken step above ``best`` (or the lowest broken one when ``best`` is
    None): what the search ran into."""
    above = [s for s in steps if not s.ok and (best is None or s.rate > best.rate)]
    return min(above, key=lambda s: s.rate) if above else None


def confirmed(best, steps):
    """The confirmation run of ``best`` (None without one)."""
    runs = [s for s in steps if s.stage == "confirm" and s.ok and best is not None
            and s.rate == best.rate]
    return runs[-1] if runs else None


def capacity_of(best, steps):
    """``(ops/s achieved, latency figures)`` the search reports: the lower achieved and
    the higher latency of the best step and its confirmation run."""
    if best is None:
        return None, None
    again = confirmed(best, steps)
    both = [best] + ([again] if again else [])
    return (min(s.achieved for s in both),
            {k: max(s.latency_ms[k] for s in both) for k in best.latency_ms})


def verdict(best, slo, steps=()):
    """The last line.  A capacity that no broken step bounds from above (the budget or
    the highest rate ran out first) is marked as a lower bound; one bounded by the client
    (a worker process at :data:`CLIENT_BOUND_CPU` of a core) says ``client-bound``."""
    slos = _listed(slo)
    bound = bounding(best, steps)
    if best is None:
        if not steps:
            return "capacity: none: no step ran (SLO %s)" % ", ".join(map(str, slos))
        line = "capacity: none: every rate tried broke the SLO (%s)" % ", ".join(
            map(str, slos))
        if bound is not None:
            line += "; at {:,.0f} ops/s: {}".format(bound.rate, "; ".join(bound.reasons))
        if bound is not None and bound.client_bound:
            line += "; add -p"
        return line
    achieved, latency = capacity_of(best, steps)
    if bound is not None and bound.client_bound:
        return "capacity: >= {:,.0f} ops/s (client-bound: {}; add -p)".format(
            achieved, _busy(bound))
    first = slos[0]
    if first.op is not None:
        # One operation's: the higher of the step's and its confirmation's, as the blend's.
        again = confirmed(best, steps)
        latency = {first.percentile: max(
            s.latency_by_op_ms[first.op][first.percentile]
            for s in [best] + ([again] if again else []))}
    line = "capacity: {:,.0f} ops/s at {} {:.3f} ms (SLO {})".format(
        achieved, first.percentile, latency[first.percentile], ", ".join(map(str, slos)))
    if steps and bound is None:
        line += ", at least: no step broke it"
    return line


def step_duration(step, slos, rate, samples=SAMPLES):
    """Seconds of a step at ``rate``: ``step``, lengthened until the strictest percentile
    judged rests on ``samples`` requests beyond it (``samples / (1 - q)`` in all)."""
    quantiles = [slo.quantile for slo in _listed(slos) if slo.quantile is not None]
    if not quantiles or not samples:
        return step
    return max(step, samples / (1 - max(quantiles)) / rate)


def read_steal():
    """``(steal, total)`` jiffies of the host's CPUs from /proc/stat, None elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


def steal_between(before, after):
    """The share of the host's CPU time stolen between two :func:`read_steal`."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def step_from_results(rate, results):
    """A :class:`Step` from ``bench.runner.run`` results: the run phases (not a load
    phase, not a warm-up), the worst of them when there are several."""
    phases = [p for p in results["phases"] if p["name"] not in UNMEASURED] \
        or results["phases"]
    # Latency: the successful requests' (a failed one's is the phase's "failed"); a phase
    # where none succeeded has none, and a step without any has None for each figure.
    timed = [p for p in phases if p["latency_ms"] is not None]
    worst = max(timed, key=lambda p: p["latency_ms"]["p99"], default={})
    ops = sum(p["ops"] for p in phases)
    seconds = sum(p["seconds"] for p in phases)
    cpu = sum(p["client_cpu_seconds"] for p in phases)
    server = [p["server"]["cpu_seconds"] for p in phases]
    latency = {k: max((p["latency_ms"][k] for p in timed), default=None) for k in PERCENTILES}
    open_loop = [p.get("open_loop") or {} for p in phases]
    achieved = [o["achieved_rate"] for o in open_loop if o.get("achieved_rate")]
    scheduled = [o["scheduled_rate"] for o in open_loop if o.get("scheduled_rate")]
    by_op: Dict[str, dict] = {}
    for phase in phases:
        for op, figures in phase["operations"].items():
            mine = by_op.setdefault(op, {k: None for k in PERCENTILES})
            for k in PERCENTILES:
                if figures["latency_ms"] is not None:
                    mine[k] = max(mine[k] or 0.0, figures["latency_ms"][k])
    kinds: Dict[str, int] = {}
    for phase in phases:
        for kind, n in phase["errors"].items():
            kinds[kind] = kinds.get(kind, 0) + n
    workers = [max(c) for c in zip(*(p.get("client_cpu_by_process") or [] for p in phases))]
    waits = [max((w or 0.0 for w in c), default=0.0) if any(w is not None for w in c) else None
             for c in zip(*(p.get("client_cpu_wait_by_process") or [] for p in phases))]
    return Step(rate=rate, achieved=min(achieved) if achieved else
                ops / seconds if seconds else 0.0, latency_ms=latency,
                service_time_ms=worst.get("service_time_ms"),
                client_cpu=cpu / seconds if seconds else None,
                server_cpu=sum(server) / seconds if seconds and None not in server else None,
                backlog=sum(o.get("backlog_at_end", 0) for o in open_loop),
                errors=sum(kinds.values()), scheduled_rate=min(scheduled) if scheduled
                else None, ops=ops, errors_by_kind=kinds, latency_by_op_ms=by_op,
                worker_cpu=workers, worker_wait=waits, seconds=seconds)


@dataclasses.dataclass
class Search:
    """One capacity search: a driver, its SLOs, its steps and the best step (or None)."""
    driver: str
    slos: List[Slo]
    steps: List[Step]
    best: Optional[Step]

    @property
    def slo(self):
        return self.slos[0]

    @property
    def client_bound(self):
        bound = bounding(self.best, self.steps)
        return bound is not None and bound.client_bound

    def as_dict(self):
        achieved, latency = capacity_of(self.best, self.steps)
        again = confirmed(self.best, self.steps)
        return {"driver": self.driver, "slo": dataclasses.asdict(self.slo),
                "slos": [dataclasses.asdict(slo) for slo in self.slos],
                "steps": [dict(dataclasses.asdict(s), error_percent=s.error_percent)
                          for s in self.steps],
                "capacity": achieved,
                "capacity_rate_tried": self.best.rate if self.best else None,
                "capacity_latency_ms": latency,
                "confirmation": None if again is None else {
                    "achieved": again.achieved, "latency_ms": again.latency_ms,
                    "first_achieved": self.best.achieved,
                    "first_latency_ms": self.best.latency_ms},
                "client_bound": self.client_bound,
                "verdict": verdict(self.best, self.slos, self.steps)}


def plot(searches, path, title=""):
    """Latency from the intended start against the rate offered: p50, p99 and p99.9 of
    one search, or the p99 of each driver when there are several; the SLOs dashed, each
    capacity dotted; steps broken by the client hollow."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    fig, ax = plt.subplots(figsize=(9, 5))
    by_driver: Dict[str, List[Step]] = {}
    for found in searches:
        by_driver.setdefault(found.driver, []).extend(found.steps)
    for driver, steps in by_driver.items():
        # A rate tried more than once (one search per SLO, a confirmation): the mean.
        at: Dict[float, List[Step]] = {}
        for step in steps:
            at.setdefault(step.rate, []).append(step)
        rates = sorted(at)
        x = rates
        shown = ("p50", "p99", "p99.9") if len(by_driver) == 1 else ("p99",)
        for p, marker in zip(shown, "os^"):
            label = p if len(by_driver) == 1 else "%s %s" % (driver, p)
            # (a step where no request succeeded has no latency: no point)
            y = [sum(s.latency_ms[p] for s in at[r]) / len(at[r])
                 if all(s.latency_ms[p] is not None for s in at[r]) else float("nan")
                 for r in rates]
            line, = ax.plot(x, y, marker + "-", label=label, markersize=4)
            bound = [(xi, yi) for xi, yi, r in zip(x, y, rates)
                     if any(s.client_bound for s in at[r])]
            if bound:
                ax.plot(*zip(*bound), marker, markersize=9, markerfacecolor="none",
                        color=line.get_color(), label="%s: client-bound" % driver
                        if p == shown[0] else None)
    for slo in {str(slo): slo for found in searches for slo in found.slos}.values():
        ax.axhline(slo.ms, color="red", linestyle="--", linewidth=0.8, label="SLO %s" % slo)
    for found in searches:
        achieved, _ = capacity_of(found.best, found.steps)
        if achieved is not None:
            ax.axvline(achieved, color="green", linestyle=":", linewidth=0.8,
                       label="%s: {:,.0f} ops/s%s".format(achieved)
                       % (found.driver, " (client-bound)" if found.client_bound else ""))
    ax.set_yscale("log")
    ms = matplotlib.ticker.FuncFormatter(lambda v, _: "%g" % v)
    ax.yaxis.set_major_formatter(ms)
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(
        lambda v, _: "{:,.0f}".format(v)))
    ax.set_xlabel("offered rate, ops/s (the capacity line: the rate achieved)")
    ax.set_ylabel("latency from the intended start, ms")
    ax.set_title(title or "latency against rate")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _option(parse):
    """``parse`` as an argparse type: its ValueError's message is the usage error (argparse
    itself would print only "invalid parse_slo value")."""
    def convert(text):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return convert


def add_arguments(parser):
    group = parser.add_argument_group("capacity")
    group.add_argument("--slo", type=_option(parse_slo), action="append",
                       help="[OPERATION:]PERCENTILE=BOUND the latency from the intended "
                            "start must meet, e.g. p99=2ms, p99.9=5ms, select:p99=2ms; "
                            "each SLO of all operations is a search of its own, the SLOs "
                            "of single operations hold in every search (default p99=2ms)")
    group.add_argument("--max-errors", type=_option(parse_percent), default=MAX_ERRORS,
                       metavar="PERCENT",
                       help="percent of a step's requests that may fail (default %(default)g)")
    group.add_argument("--drivers", metavar="NAME,...",
                       help="a search per driver, one after another on the same server "
                            "(instead of --driver)")
    group.add_argument("--start", type=float, default=1000.0,
                       help="the staircase's first rate, ops/s (default %(default)g)")
    group.add_argument("--factor", type=float, default=2.0,
                       help="the staircase's ratio between steps (default %(default)g)")
    group.add_argument("--precision", type=float, default=0.05,
                       help="bisection stops within this share (default %(default)g)")
    group.add_argument("--step", type=float, default=3.0,
                       help="seconds per step at least (default %(default)g)")
    group.add_argument("--samples", type=float, default=SAMPLES,
                       help="a step lasts until the judged percentile q rests on "
                            "SAMPLES/(1-q) requests (default %(default)g; 0: --step only)")
    group.add_argument("--no-confirm", dest="confirm", action="store_false",
                       help="no confirmation run at the rate found")
    group.add_argument("--budget", type=float, default=100.0,
                       help="seconds of one search after which no new step starts "
                            "(default %(default)g)")


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m bench.capacity",
        description="Find the highest fixed request rate at which a latency percentile "
                    "(from the intended start) stays within an SLO, with few enough "
                    "errors and a client that is not the limit: a staircase of rates, "
                    "then bisection, then a confirmation run.  Takes every option of "
                    "python -m bench.  Exit status 1 when no rate held.")
    options.add_arguments(parser)
    add_arguments(parser)
    # A mix over loaded records unless told otherwise: the phases workload would run
    # each step four times, once per operation.
    parser.set_defaults(workload="mix", warmup=WARMUP)
    args = parser.parse_args(argv)
    if not (0 < args.start <= MAX_RATE and 1 < args.factor < math.inf
            and 0 < args.precision < 1 and 0 < args.step < math.inf
            and 0 <= args.samples < math.inf and 0 < args.budget < math.inf):
        parser.error("need 0 < --start <= %d, and finite: --factor > 1, 0 < --precision < 1, "
                     "--step > 0, --samples >= 0 and --budget > 0" % MAX_RATE)
    slo_sets = group_slos(args.slo or [parse_slo("p99=2ms")])
    names = [n.strip() for n in args.drivers.split(",") if n.strip()] if args.drivers \
        else [args.driver]
    if not names:
        parser.error("--drivers names no driver")
    try:
        configs = [options.from_args(args, driver=name, rate=args.start, duration=args.step,
                                     quiet=True, json=None, plot=None,
                                     lazy_errors=args.lazy_errors and name == "gtarantool")
                   for name in names]
    except ValueError as exc:
        parser.error(str(exc))
    for config in configs:
        ran = [op for op, n in config.mix.items() if n]
        for slo in (slo for slos in slo_sets for slo in slos):
            if slo.op is not None and slo.op not in ran:
                parser.error("the SLO %s names an operation the mix does not run (%s)"
                             % (slo, ", ".join(ran)))
    for name in names:
        module = drivers.missing(name)
        if module:
            parser.error("driver %s needs the %r module: pip install %s"
                         % (name, module, module))
    searches = []
    try:
        with open_target(configs[0]) as target:
            version = target.version
            for base in configs:
                for slos in slo_sets:
                    searches.append(_search(base, slos, target, args))
    except KeyboardInterrupt:
        print("\ninterrupted; the server and the workers are stopped", file=sys.stderr)
        return 130
    except (SetupError, runner.BenchError) as exc:
        print("bench.capacity: %s" % exc, file=sys.stderr)
        return 1
    except tarantool.error.NetworkError as exc:   # (the server went away during a step)
        print("bench.capacity: lost the server: %s; no capacity" % exc, file=sys.stderr)
        return 1
    for found in searches:
        print("\n== %s, SLO %s" % (found.driver, ", ".join(map(str, found.slos))))
        print(table(found.steps))
    print()
    for found in searches:
        line = verdict(found.best, found.slos, found.steps)
        print(line if len(searches) == 1 else "%s, driver %s" % (line, found.driver))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(searches[0].as_dict(), config=configs[0].as_dict(),
                           server_version=version,
                           searches=[found.as_dict() for found in searches]), f, indent=1)
        print("wrote %s" % args.json)
    if args.plot:
        plot(searches, args.plot, "%s, %s, Tarantool %s" % (
            ", ".join(names), configs[0].workload, version))
        print("wrote %s" % args.plot)
    return 0 if all(found.best is not None for found in searches) else 1


def _search(base, slos, target, args):
    print("capacity: driver %s, %d procs x %d concurrent, workload %s, steps of %g s or "
          "more after %g s of warm-up, SLO %s, errors <= %g%%; server %s:%s (Tarantool %s)" % (
              base.driver, base.procs, base.concurrency, base.workload, args.step, base.warmup,
              ", ".join(map(str, slos)), args.max_errors, target.host, target.port,
              target.version), flush=True)
    missing = getattr(target, "cpu_missing", None)
    if missing:
        print("server CPU: n/a, %s" % missing, flush=True)
    print(table([]), flush=True)

    def progress(step):
        print(table([step]).splitlines()[-1], flush=True)
    # One set of worker processes for every step: no process start or connection per step.
    with runner.Workers(base, target) as workers:
        def measure(rate):
            duration = step_duration(args.step, slos, rate, args.samples)
            before = read_steal()
            step = step_from_results(rate, workers.run(base.replace(rate=rate,
                                                                    duration=duration)))
            step.steal = steal_between(before, read_steal())
            return step
        steps, best = search(measure, slos, start=args.start, factor=args.factor,
                             precision=args.precision, budget=args.budget, on_step=progress,
                             max_errors=args.max_errors, confirm=args.confirm)
    return Search(base.driver, slos, steps, best)


if __name__ == "__main__":
    sys.exit(main())
