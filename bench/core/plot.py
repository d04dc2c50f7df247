"""``--plot``: ops/s over time per operation, one panel per run, server rps dashed; an
open-loop run adds each second's p99 from the intended start and from the send."""
from bench.core.config import MIX_OPERATIONS

MIN_COVERED = 0.2  # seconds


def draw(runs, path):
    """``runs``: {title: results of bench.run.runner.run}; writes a PNG to ``path``."""
    # matplotlib takes most of a second to import: only runs with --plot pay for it.
    import matplotlib
    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 3.2 * len(runs)), squeeze=False)
    for ax, (title, results) in zip(axes[:, 0], runs.items()):
        for op in MIX_OPERATIONS:
            # Rates over the part of each second the phase ran; slivers are noise.
            points = [(s["t"], s["ops"][op] / s["covered"]) for s in results["series"]
                      if op in s["ops"] and s["covered"] >= MIN_COVERED]
            if points:
                ax.plot(*zip(*points), label=op, marker=".")
        server = [(s["t"], sum(s["rps"].values())) for s in results["server_rps"]]
        if server:
            ax.plot(*zip(*server), "k--", linewidth=0.8, label="server rps")
        ax.set_title(title)
        ax.set_ylabel("ops/s")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize="small")
        latency = [(s["t"], s["latency_p99_ms"], s["service_time_p99_ms"])
                   for s in results["series"] if s.get("latency_p99_ms") is not None]
        if latency:
            right = ax.twinx()
            t, intended, service = zip(*latency)
            right.plot(t, intended, "r-", linewidth=1, label="p99 from the intended start")
            right.plot(t, service, "r:", linewidth=1, label="p99 service time")
            right.set_ylabel("ms")
            right.set_ylim(bottom=0)
            right.legend(loc="upper right", fontsize="small")
    axes[-1, 0].set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
