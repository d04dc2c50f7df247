"""``--plot``: one row of three panels per run (per driver for ``bench.compare``).

- throughput over time: requests per second of each operation in intervals of
  ``interval_seconds`` (the server's box.stat rate dashed, once a second);
- latency over time: p50, p99 and p99.9 of every operation per interval (log scale), a
  second series of times (``service_time``) dashed beside it;
- the latency distribution: each phase's HDR percentile curve, latency against percentile
  on a log scale of 1/(1 - p), as HdrHistogram's plotter draws it.
"""
from bench.core.config import MIX_OPERATIONS

PERCENTILES = ("p50", "p99", "p99.9")
TICKS = (0, 90, 99, 99.9, 99.99, 99.999)
MIN_COVERED = 0.5   # share of an interval a phase must cover for a throughput point


def draw(runs, path):
    """``runs``: {title: results of bench.run.runner.run}; writes a PNG to ``path``."""
    # matplotlib takes most of a second to import: only runs with --plot pay for it.
    import matplotlib
    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter, NullFormatter

    fig, axes = plt.subplots(len(runs), 3, figsize=(16, 3.8 * len(runs)), squeeze=False)
    for row, (title, results) in zip(axes, runs.items()):
        _throughput(row[0], title, results)
        _latency(row[1], results)
        row[1].yaxis.set_major_formatter(FormatStrFormatter("%g"))   # not 2x10^1
        row[1].yaxis.set_minor_formatter(NullFormatter())             # not 6x10^0
        _distribution(row[2], results)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _by_phase(entries):
    """``entries`` (intervals or server samples) split where the phase changes: a line
    does not bridge the pause between two phases."""
    runs = []
    for entry in entries:
        if not runs or runs[-1][0]["phase"] != entry["phase"]:
            runs.append([])
        runs[-1].append(entry)
    return runs


def _lines(ax, segments, label, **style):
    """One line per segment of ``[(x, y), ...]``, labelled once."""
    for segment in segments:
        if segment:
            ax.plot(*zip(*segment), label=label, **style)
            label = None


def _measured(entries):
    """The entries of the run phases when a load phase came first: its rate (as fast as
    it goes) would set the scale and flatten the run's."""
    kept = [e for e in entries if e["phase"] != "load"]
    return kept or entries


def _throughput(ax, title, results):
    width = results["interval_seconds"]
    intervals = _measured([i for i in results["intervals"]
                           if i["seconds"] >= MIN_COVERED * width])
    if len({op for i in intervals for op in i["operations"]}) > 1:
        _lines(ax, [[(i["t"] + i["seconds"] / 2, i["ops"] / i["seconds"]) for i in run]
                    for run in _by_phase(intervals)],
               "total", color="k", marker=".", markersize=3, linewidth=1.2)
    rate = (results.get("config") or {}).get("rate")
    if rate:
        ax.axhline(rate, color="red", linestyle=":", linewidth=1,
                   label="target {:,.0f}/s".format(rate))
    for op in MIX_OPERATIONS:
        _lines(ax, [[(i["t"] + i["seconds"] / 2, i["operations"][op] / i["seconds"])
                     for i in run if op in i["operations"]] for run in _by_phase(intervals)],
               op, marker=".", markersize=3, linewidth=1)
    _lines(ax, [[(s["t"], sum(s["rps"].values())) for s in run]
                for run in _by_phase(_measured(results["server_rps"]))],
           "server (box.stat)", color="grey", linestyle="--", linewidth=0.8)
    left_out = " (load phase left out)" if any(
        i["phase"] == "load" for i in results["intervals"]) and intervals and \
        intervals[0]["phase"] != "load" else ""
    ax.set_title("%s: requests/s per %g s%s" % (title, width, left_out))
    ax.set_xlabel("seconds")
    ax.set_ylabel("ops/s")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize="small", framealpha=0.6)


def _series(results):
    """The series of times the run recorded, ``latency`` first."""
    names = {key[:-3] for i in results["intervals"] for key in i if key.endswith("_ms")}
    return sorted(names, key=lambda name: (name != "latency", name))


def _latency(ax, results):
    for series in _series(results):
        style = "-" if series == "latency" else "--"
        for percentile, color in zip(PERCENTILES, ("tab:green", "tab:orange", "tab:red")):
            _lines(ax, [[(i["t"] + i["seconds"] / 2, i[series + "_ms"][percentile])
                         for i in run if series + "_ms" in i]
                        for run in _by_phase(results["intervals"])],
                   "%s %s" % (series.replace("_", " "), percentile), linestyle=style,
                   color=color, marker=".", markersize=3, linewidth=1)
    ax.set_title("latency over time")
    ax.set_xlabel("seconds")
    ax.set_ylabel("ms")
    ax.set_yscale("log")
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="best", fontsize="small", framealpha=0.6)


def _distribution(ax, results):
    for phase in results["phases"]:
        for series, points in sorted(phase.get("percentiles_ms", {}).items()):
            # the maximum (100%) has no place on a 1/(1-p) axis
            points = [(1 / (1 - p / 100), ms) for p, ms in points if p < 100]
            if points:
                ax.plot(*zip(*points), "-" if series == "latency" else "--", linewidth=1,
                        label=phase["name"] if series == "latency"
                        else "%s %s" % (phase["name"], series.replace("_", " ")))
    ax.set_xscale("log")
    ax.set_xticks([1 / (1 - p / 100) for p in TICKS])
    ax.set_xticklabels(["%g%%" % p for p in TICKS])
    ax.set_title("latency by percentile")
    ax.set_xlabel("percentile")
    ax.set_ylabel("ms")
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="upper left", fontsize="small")
