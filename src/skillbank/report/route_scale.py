"""Routing at scale, rendered: the markdown table and the accuracy / latency figure of
:mod:`skillbank.experiments.route_scale`'s results."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence


def render_markdown(results: Sequence[dict]) -> str:
    lines = ["# Routing at scale", ""]
    for res in results:
        lines += [f"## {res['stream']}: K = {res['families']}", "",
                  "| selector | K learned | held-out accuracy | macro | ms / request (single) | ms / request (batch) "
                  "| fit s (cumulative) | hand-written accuracy |", "|---|---|---|---|---|---|---|---|"]
        for name, points in res["selectors"].items():
            for p in points:
                hand = ", ".join(f"{n} {a:.1%} (n={p['records_n'][n]})" for n, a in p["records_accuracy"].items())
                lines.append(f"| {name} | {p['k']} | {p['accuracy']:.1%} | {p['macro']:.1%} | "
                             f"{p['ms_per_request']:.3f} | {p['ms_per_request_batched']:.4f} | {p['fit_seconds']:.2f} | "
                             f"{hand} |")
        if any(res["records_left_out"].values()):
            lines += ["", "Hand-written records left out (skills outside the catalog or across families): "
                      + ", ".join(f"{n}: {c}" for n, c in res["records_left_out"].items())]
        lines.append("")
    return "\n".join(lines)


def plot(results: Sequence[dict], path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc_ax, lat_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for res in results:
        for name, points in res["selectors"].items():
            ks = [p["k"] for p in points]
            label = f"{name} ({res['stream']})"
            acc_ax.plot(ks, [p["accuracy"] for p in points], marker="o", ms=3, label=label)
            lat_ax.plot(ks, [p["ms_per_request"] for p in points], marker="o", ms=3, label=label)
    for ax in (acc_ax, lat_ax):
        ax.set_xscale("log")
        ax.set_xlabel("families learned (K)")
    acc_ax.set_ylabel("route accuracy (held-out)")
    acc_ax.set_ylim(0, 1.02)
    lat_ax.set_ylabel("ms per request (one at a time)")
    lat_ax.set_yscale("log")
    lat_ax.axhline(1.0, color="grey", lw=0.6, ls=":")
    acc_ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
