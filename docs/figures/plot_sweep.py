"""Draw the benchmarks page's sweep plots from a CSV of ``make sweep``'s table.

    .venv/bin/python docs/figures/plot_sweep.py docs/figures/sweep-3.8.0.csv docs/figures

writes ``sweep-ops.png`` (ops/s and ops per client CPU-second against the
number of greenlets or tasks) and ``sweep-latency.png`` (p50 and p99).
Columns: G, op, driver, ops_s, ops_cpu_s, p50_ms, p99_ms.
"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only
import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend

STYLE = {"gtarantool": "C0", "asynctnt": "C1", "sync": "C2"}


def load(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def series(rows, op, driver, column):
    points = [(int(r["G"]), float(r[column])) for r in rows
              if r["op"] == op and r["driver"] == driver]
    return zip(*sorted(points)) if points else ((), ())


def draw(rows, columns, ylabels, path, title):
    fig, axes = plt.subplots(len(columns), 2, figsize=(10, 3.4 * len(columns)), squeeze=False)
    for i, (column, ylabel) in enumerate(zip(columns, ylabels)):
        for j, op in enumerate(("insert", "select")):
            ax = axes[i, j]
            for driver, color in STYLE.items():
                xs, ys = series(rows, op, driver, column)
                if xs:
                    ax.plot(xs, ys, marker="o", color=color, label=driver)
            ax.set_xscale("log")
            if column.endswith("_ms"):
                ax.set_yscale("log")
            ax.set_title("%s: %s" % (op, ylabel))
            ax.set_xlabel("greenlets / tasks on one connection")
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(csv_path, out_dir):
    rows = load(csv_path)
    title = "make sweep, Tarantool 3.8.0, WAL on, 1.5 KB tuples, medians of 5 runs"
    draw(rows, ("ops_s", "ops_cpu_s"), ("ops/s", "ops per client CPU-second"),
         os.path.join(out_dir, "sweep-ops.png"), title)
    draw(rows, ("p50_ms", "p99_ms"), ("p50 latency, ms", "p99 latency, ms"),
         os.path.join(out_dir, "sweep-latency.png"), title)


if __name__ == "__main__":
    main(*sys.argv[1:3])
