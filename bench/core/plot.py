"""``--plot``: ops/s over time per operation, one panel per run, server rps dashed."""
from bench.core.config import OPERATIONS

MIN_COVERED = 0.2  # seconds


def draw(runs, path):
    """``runs``: {title: results of bench.run.runner.run}; writes a PNG to ``path``."""
    # matplotlib takes most of a second to import: only runs with --plot pay for it.
    import matplotlib
    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 3.2 * len(runs)), squeeze=False)
    for ax, (title, results) in zip(axes[:, 0], runs.items()):
        for op in OPERATIONS:
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
        ax.legend(loc="upper right", fontsize="small")
    axes[-1, 0].set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
