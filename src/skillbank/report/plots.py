"""Figures people would rather see than read: accuracy-matrix heatmaps and per-stage trajectories."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from skillbank.metrics import AccuracyMatrix  # noqa: E402


def matrix_heatmap(matrix: AccuracyMatrix, labels: Sequence[str], path: str | Path, title: str,
                   reference: AccuracyMatrix | None = None) -> Path:
    """Heatmap of ``a[t][k]`` in percent: rows = after stage t, columns = task k (arrival order).

    With ``reference`` (e.g. Oracle routing) each cell also shows the reference value in brackets.
    """
    n = len(matrix.order)
    data = np.full((n, n), np.nan)
    for t in range(n):
        for k in range(n):
            v = matrix.cells[t][k]
            if v is not None:
                data[t, k] = 100 * v
    fig, ax = plt.subplots(figsize=(1.3 * n + 2.2, 1.1 * n + 1.6), dpi=120)
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#eeeeee")
    im = ax.imshow(np.ma.masked_invalid(data), cmap=cmap, vmin=0, vmax=100)
    for t in range(n):
        for k in range(n):
            if np.isnan(data[t, k]):
                continue
            text = f"{data[t, k]:.1f}"
            if reference is not None and reference.cells[t][k] is not None:
                text += f"\n({100 * reference.cells[t][k]:.1f})"
            ax.text(k, t, text, ha="center", va="center", fontsize=9,
                    color="white" if data[t, k] < 60 else "black", fontweight="bold" if t == k else "normal")
    ax.set_xticks(range(n), labels)
    ax.set_yticks(range(n), [f"after {lab}" for lab in labels])
    ax.set_xlabel("evaluated task")
    ax.set_ylabel("stage")
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="EM (%)")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def trajectories(series: dict[str, Sequence[float]], path: str | Path, title: str, ylabel: str = "percent",
                 xlabels: Sequence[str] | None = None) -> Path:
    """One line per named series over stages (e.g. macro EM and route accuracy after each stage)."""
    fig, ax = plt.subplots(figsize=(6.4, 3.8), dpi=120)
    for name, values in series.items():
        xs = list(range(1, len(values) + 1))
        ax.plot(xs, [100 * v for v in values], marker="o", label=name)
    if xlabels:
        ax.set_xticks(range(1, len(xlabels) + 1), xlabels)
    ax.set_ylim(0, 105)
    ax.set_xlabel("stage")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
