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
import re
import sys
import time
from typing import List, Optional

from bench import drivers
from bench.core import config as options
from bench.run import runner
from bench.targets import SetupError, open_target

KEEP_UP = 0.95      # a step holds only when it achieved this share of its target rate
PERCENTILES = ("p50", "p90", "p99", "p99.9", "max")
UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


@dataclasses.dataclass
class Slo:
    """``p99 <= 2 ms``: a percentile of the latency from the intended start."""
    percentile: str
    ms: float

    def __str__(self):
        return "%s <= %g ms" % (self.percentile, self.ms)


def parse_slo(text):
    """``"p99=2ms"`` (also ``p99.9=500us``, ``p50=0.5ms``, ``max=1s``) -> :class:`Slo`.

    :raises ValueError: another form, an unknown percentile or a bound <= 0
    """
    match = re.fullmatch(r"\s*(p[0-9.]+|max)\s*(?:=|<=)\s*([0-9.]+)\s*(us|ms|s)?\s*",
                         str(text))
    if not match or match.group(1) not in PERCENTILES:
        raise ValueError("SLO must be PERCENTILE=BOUND with PERCENTILE one of %s and BOUND "
                         "in us, ms or s (e.g. p99=2ms), got %r"
                         % (", ".join(PERCENTILES), text))
    ms = float(match.group(2)) * UNITS[match.group(3) or "ms"]
    if not ms > 0:
        raise ValueError("the SLO's bound must be > 0")
    return Slo(match.group(1), ms)


@dataclasses.dataclass
class Step:
    """One rate tried: what it achieved and its latency (ms, from the intended start)."""
    rate: float
    achieved: float
    latency_ms: dict
    service_time_ms: Optional[dict] = None
    client_cpu: Optional[float] = None     # client CPU seconds per second of the step
    server_cpu: Optional[float] = None
    backlog: int = 0
    errors: int = 0
    ok: bool = False
    stage: str = ""

    def judge(self, slo):
        self.ok = (self.latency_ms[slo.percentile] <= slo.ms
                   and self.achieved >= KEEP_UP * self.rate)
        return self.ok


def search(measure, slo, start=1000.0, factor=2.0, precision=0.05, budget=None,
           clock=time.monotonic, max_rate=10_000_000, on_step=None):
    """Find the highest rate whose step meets ``slo``.

    :param measure: ``measure(rate) -> Step``
    :param slo: a :class:`Slo`
    :param start: the staircase's first rate
    :param factor: the staircase's ratio between steps
    :param precision: bisection stops when the failing rate is within this share above
        the holding one
    :param budget: seconds after which no new step starts (None: no limit)
    :param on_step: called with each step once judged (progress lines)
    :returns: ``(steps, best)``: every step in order and the highest holding one (None
        when even ``start`` broke the SLO)
    :raises ValueError: parameters out of range
    """
    if not (start > 0 and factor > 1 and 0 < precision < 1):
        raise ValueError("need start > 0, factor > 1 and 0 < precision < 1")
    began = clock()
    steps: List[Step] = []

    def run(rate, stage):
        step = measure(rate)
        step.stage = stage
        step.judge(slo)
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
    while best is not None and failed is not None and time_left() \
            and failed > best.rate * (1 + precision):
        rate = (best.rate + failed) / 2
        step = run(rate, "bisection")
        if step.ok:
            best = step
        else:
            failed = rate
    return steps, best


def _fmt(value, digits=2):
    return "n/a" if value is None else "%.*f" % (digits, value)


def table(steps):
    """The steps as text, one line each."""
    lines = ["%-10s %10s %10s %8s %8s %8s %8s %8s %8s  %s" % (
        "stage", "rate", "achieved", "p50", "p99", "p99.9", "max", "client", "server",
        "SLO"),
        "%-10s %10s %10s %35s %8s %8s" % ("", "ops/s", "ops/s", "latency ms (intended)",
                                           "CPU", "CPU")]
    for s in steps:
        lat = s.latency_ms
        lines.append("%-10s %10s %10s %8.3f %8.3f %8.3f %8.3f %8s %8s  %s" % (
            s.stage, "{:,.0f}".format(s.rate), "{:,.0f}".format(s.achieved), lat["p50"],
            lat["p99"], lat["p99.9"], lat["max"], _fmt(s.client_cpu), _fmt(s.server_cpu),
            "holds" if s.ok else "broken" + (" (backlog %d)" % s.backlog if s.backlog else "")))
    return "\n".join(lines)


def verdict(best, slo, steps=()):
    """The last line; a capacity that no broken step bounds from above (the budget or
    the highest rate ran out first) is marked as a lower bound."""
    if best is None:
        return "capacity: none found: the lowest rate tried broke the SLO (%s)" % slo
    line = "capacity: {:,.0f} ops/s at {} {:.3f} ms (SLO {})".format(
        best.rate, slo.percentile, best.latency_ms[slo.percentile], slo)
    if steps and not any(not s.ok and s.rate > best.rate for s in steps):
        line += ", at least: no step broke it"
    return line


def step_from_results(rate, results):
    """A :class:`Step` from ``bench.runner.run`` results: the run phases (not a load
    phase), the worst of them when there are several."""
    phases = [p for p in results["phases"] if p["name"] != "load"] or results["phases"]
    worst = max(phases, key=lambda p: p["latency_ms"]["p99"])
    ops = sum(p["ops"] for p in phases)
    seconds = sum(p["seconds"] for p in phases)
    cpu = sum(p["client_cpu_seconds"] for p in phases)
    server = [p["server"]["cpu_seconds"] for p in phases]
    latency = {k: max(p["latency_ms"][k] for p in phases) for k in PERCENTILES}
    open_loop = [p.get("open_loop") or {} for p in phases]
    achieved = [o["achieved_rate"] for o in open_loop if o.get("achieved_rate")]
    return Step(rate=rate, achieved=min(achieved) if achieved else
                ops / seconds if seconds else 0.0, latency_ms=latency,
                service_time_ms=worst.get("service_time_ms"),
                client_cpu=cpu / seconds if seconds else None,
                server_cpu=sum(server) / seconds if seconds and None not in server else None,
                backlog=sum(o.get("backlog_at_end", 0) for o in open_loop),
                errors=sum(sum(p["errors"].values()) for p in phases))


@dataclasses.dataclass
class Search:
    """One capacity search: a driver, an SLO, its steps and the best step (or None)."""
    driver: str
    slo: Slo
    steps: List[Step]
    best: Optional[Step]

    def as_dict(self):
        return {"driver": self.driver, "slo": dataclasses.asdict(self.slo),
                "steps": [dataclasses.asdict(s) for s in self.steps],
                "capacity": self.best.rate if self.best else None,
                "capacity_latency_ms": self.best.latency_ms if self.best else None}


def plot(searches, path, title=""):
    """Latency from the intended start against the rate tried: p50, p99 and p99.9 of one
    search, or the p99 of each driver when there are several; the SLOs dashed, each
    capacity dotted."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    fig, ax = plt.subplots(figsize=(8, 4.5))
    by_driver = {}
    for found in searches:
        by_driver.setdefault(found.driver, []).extend(found.steps)
    for driver, steps in by_driver.items():
        # A rate tried more than once (one search per SLO): the mean of its steps.
        at = {}
        for step in steps:
            at.setdefault(step.rate, []).append(step)
        rates = sorted(at)
        shown = ("p50", "p99", "p99.9") if len(by_driver) == 1 else ("p99",)
        for p, marker in zip(shown, "os^"):
            label = p if len(by_driver) == 1 else "%s %s" % (driver, p)
            ax.plot(rates, [sum(s.latency_ms[p] for s in at[r]) / len(at[r]) for r in rates],
                    marker + "-", label=label, markersize=4)
    for slo in {found.slo.ms: found.slo for found in searches}.values():
        ax.axhline(slo.ms, color="red", linestyle="--", linewidth=0.8, label="SLO %s" % slo)
    for found in searches:
        if found.best is not None:
            ax.axvline(found.best.rate, color="green", linestyle=":", linewidth=0.8,
                       label="%s: {:,.0f} ops/s at %s".format(found.best.rate)
                       % (found.driver, found.slo))
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("offered rate, ops/s")
    ax.set_ylabel("latency from the intended start, ms")
    ax.set_title(title or "latency against rate")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def add_arguments(parser):
    group = parser.add_argument_group("capacity")
    group.add_argument("--slo", type=parse_slo, action="append",
                       help="PERCENTILE=BOUND the latency from the intended start must "
                            "meet, e.g. p99=2ms, p99.9=5ms, p50=500us; repeat it for a "
                            "search per SLO (default p99=2ms)")
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
                       help="seconds per step (default %(default)g)")
    group.add_argument("--budget", type=float, default=100.0,
                       help="seconds of one search after which no new step starts "
                            "(default %(default)g)")


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m bench.capacity",
        description="Find the highest fixed request rate at which a latency percentile "
                    "(from the intended start) stays within an SLO: a staircase of rates, "
                    "then bisection.  Takes every option of python -m bench.")
    options.add_arguments(parser)
    add_arguments(parser)
    # A mix over loaded records unless told otherwise: the phases workload would run
    # each step four times, once per operation.
    parser.set_defaults(workload="mix")
    args = parser.parse_args(argv)
    if not (args.start > 0 and args.factor > 1 and 0 < args.precision < 1 and args.step > 0):
        parser.error("need --start > 0, --factor > 1, 0 < --precision < 1 and --step > 0")
    slos = args.slo or [parse_slo("p99=2ms")]
    names = [n.strip() for n in args.drivers.split(",") if n.strip()] if args.drivers \
        else [args.driver]
    try:
        configs = [options.from_args(args, driver=name, rate=args.start, duration=args.step,
                                     quiet=True, json=None, plot=None,
                                     lazy_errors=args.lazy_errors and name == "gtarantool")
                   for name in names]
    except ValueError as exc:
        parser.error(str(exc))
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
                for slo in slos:
                    searches.append(_search(base, slo, target, args))
    except KeyboardInterrupt:
        print("\ninterrupted; the server and the workers are stopped", file=sys.stderr)
        return 130
    except (SetupError, runner.BenchError) as exc:
        print("bench.capacity: %s" % exc, file=sys.stderr)
        return 1
    for found in searches:
        print("\n== %s, SLO %s" % (found.driver, found.slo))
        print(table(found.steps))
    print()
    for found in searches:
        line = verdict(found.best, found.slo, found.steps)
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
    return 0


def _search(base, slo, target, args):
    print("capacity: driver %s, %d procs x %d concurrent, workload %s, %g s steps, "
          "SLO %s; server %s:%s (Tarantool %s)" % (
              base.driver, base.procs, base.concurrency, base.workload, args.step, slo,
              target.host, target.port, target.version), flush=True)
    print(table([]), flush=True)

    def measure(rate):
        return step_from_results(rate, runner.run(base.replace(rate=rate), target))

    def progress(step):
        print(table([step]).splitlines()[-1], flush=True)
    steps, best = search(measure, slo, start=args.start, factor=args.factor,
                         precision=args.precision, budget=args.budget, on_step=progress)
    return Search(base.driver, slo, steps, best)


if __name__ == "__main__":
    sys.exit(main())
