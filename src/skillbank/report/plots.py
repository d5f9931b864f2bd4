"""Figures people would rather see than read: accuracy-matrix heatmaps, per-stage trajectories, failure kinds."""
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
    fig, ax = plt.subplots(figsize=(6.4 if len(series) <= 3 else 8.6, 3.8), dpi=120)
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
    if len(series) <= 3:
        ax.legend(fontsize=8)
    else:  # many methods: keep the legend off the lines
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def line_plot(series: dict[str, Sequence[tuple[float, float]]], path: str | Path, title: str, xlabel: str,
              ylabel: str = "percent") -> Path:
    """One line per named series of (x, fraction) points, y in percent."""
    fig, ax = plt.subplots(figsize=(6.8, 3.8), dpi=120)
    for name, points in series.items():
        ax.plot([x for x, _ in points], [100 * y for _, y in points], marker="o", markersize=3, label=name)
    ax.set_ylim(-2, 105)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


ACCESS_COLOURS = {"diagonal": "#d9d9d9", "retained": "#4daf4a", "addressing-forgotten": "#ffb000",
                  "execution-forgotten": "#d7301f"}


def classify_cell(closed: float, address: float, learned: float, threshold: float = 0.5) -> str:
    """retained: closed-book keeps >= threshold of the EM right after learning; addressing-forgotten:
    closed-book lost it but the correct address brings it back (>= threshold); else execution-forgotten."""
    if learned <= 0:
        return "execution-forgotten" if address <= 0 and closed <= 0 else "retained"
    if closed >= threshold * learned:
        return "retained"
    if address >= threshold * learned:
        return "addressing-forgotten"
    return "execution-forgotten"


def access_heatmap(closed: AccuracyMatrix, address: AccuracyMatrix, labels: Sequence[str], path: str | Path,
                   title: str) -> Path:
    """Off-diagonal cells show closed-book / +address EM, coloured retained / addressing-forgotten /
    execution-forgotten (relative to the task's EM right after it was learned)."""
    from matplotlib.patches import Patch

    n = len(closed.order)
    fig, ax = plt.subplots(figsize=(1.5 * n + 2.4, 1.1 * n + 1.9), dpi=120)
    ax.set_xlim(-0.5, n - 0.5)
    ax.set_ylim(n - 0.5, -0.5)
    for t in range(n):
        for k in range(t + 1):
            c, a = closed.cells[t][k], address.cells[t][k]
            if c is None or a is None:
                continue
            kind = "diagonal" if t == k else classify_cell(c, a, closed.cells[k][k] or 0.0)
            ax.add_patch(plt.Rectangle((k - 0.5, t - 0.5), 1, 1, color=ACCESS_COLOURS[kind]))
            ax.text(k, t, f"{100 * c:.0f} / {100 * a:.0f}", ha="center", va="center", fontsize=9)
    ax.set_xticks(range(n), labels)
    ax.set_yticks(range(n), [f"after {lab}" for lab in labels])
    ax.set_xlabel("evaluated task")
    ax.set_title(title, fontsize=10)
    ax.legend(handles=[Patch(color=v, label=k) for k, v in ACCESS_COLOURS.items()], fontsize=7,
              loc="upper right", bbox_to_anchor=(1.0, -0.18), ncol=2)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


# exact, wrong arguments, drifted address, newest family, another family, wrong own-family skill, unparsable
FAILURE_COLORS = ("#2e7d32", "#9ccc65", "#ffb300", "#e53935", "#f48fb1", "#8e24aa", "#9e9e9e")


def failure_bars(shares: dict[str, Sequence[float]], kinds: Sequence[str], path: str | Path, title: str) -> Path:
    """One horizontal bar per method, split into the shares (fractions summing to 1) of each kind."""
    fig, ax = plt.subplots(figsize=(10.0, 0.45 * len(shares) + 1.6), dpi=120)
    names = list(shares)
    left = np.zeros(len(names))
    for i, kind in enumerate(kinds):
        values = np.array([100 * shares[n][i] for n in names])
        ax.barh(names, values, left=left, color=FAILURE_COLORS[i % len(FAILURE_COLORS)], label=kind)
        left += values
    ax.invert_yaxis()  # first method on top, as in the tables
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of requests (%)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path
