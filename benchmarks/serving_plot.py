"""``serving.png``: each configuration's throughput and TPOT against load."""

from __future__ import annotations

from pathlib import Path

from benchmarks.configs import BASELINE
from benchmarks.serving_cells import LOAD_KINDS
from benchmarks.serving_report import METRICS, _table, crossovers, workload_label
from benchmarks.stats import median


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = _table(res)
    keys = sorted(table)
    fig, axes = plt.subplots(len(keys), len(METRICS), figsize=(5 * len(METRICS), 3.6 * len(keys)),
                             squeeze=False)
    cross = crossovers(res)
    for i, key in enumerate(keys):
        loads = table[key]
        configs = sorted({c for load in loads.values() for c in load})
        for j, (metric, label) in enumerate(METRICS):
            ax = axes[i][j]
            for c in configs:
                xs = [x for x in sorted(loads) if c in loads[x]]
                ys = [median([v for v in loads[x][c][metric] if v is not None] or [float("nan")])
                      for x in xs]
                ax.plot(xs, ys, marker="o", label=c, lw=2.5 if c == BASELINE else 1.5)
                x_cross = cross[key].get(c)
                if x_cross is not None and metric == "output_throughput":
                    ax.axvline(x_cross, ls=":", lw=1, color=ax.lines[-1].get_color())
            ax.set_xscale("log", base=2)
            ax.set_xlabel(dict(LOAD_KINDS)[key[1]])
            ax.set_ylabel(label)
            ax.set_title(f"{workload_label(key[0])}: {label}", fontsize=9)
            ax.grid(alpha=0.3)
        axes[i][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
