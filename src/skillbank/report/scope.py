"""Out-of-scope detection, rendered: the markdown tables and the trade-off figure of
:mod:`skillbank.experiments.scope`'s results."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def render_markdown(result: dict) -> str:
    lines = [f"# Out-of-scope detection: {result['source']}", "",
             f"Threshold {result['threshold']:.2f} (the {result['params']['quantile']:.1%} quantile of "
             f"{result['train_requests']} training requests' leave-one-out scores; evidence: "
             + ("word statistics" if result['params'].get('encoder') is None else
                f"word statistics and the sentence encoder {result['params']['encoder']}")
             + f", lam {result['params']['lam']}).", "",
             "| set | requests | kept in scope | refused |", "|---|---|---|---|"]
    for name, e in result["in_domain"].items():
        lines.append(f"| {name} (in domain) | {e['n']} | {e['accepted']:.1%} | {1 - e['accepted']:.1%} |")
    for name, e in result["off_domain"].items():
        lines.append(f"| {name} (off domain) | {e['n']} | {1 - e['refused']:.1%} | {e['refused']:.1%} |")
        for cat, r in e["refused_by_category"].items():
            lines.append(f"| &nbsp; {cat} | | {1 - r:.1%} | {r:.1%} |")
    lines += ["", "Threshold at other training quantiles (what each would give):", "",
              "| training quantile | threshold | " + " | ".join(f"{n} kept" for n in result["in_domain"]) + " | "
              + " | ".join(f"{n} refused" for n in result["off_domain"]) + " |",
              "|---" * (2 + len(result["in_domain"]) + len(result["off_domain"])) + "|"]
    for q, t in result["thresholds_by_quantile"].items():
        kept = [np.mean(np.array(e["scores"]) >= t) for e in result["in_domain"].values()]
        refused = [np.mean(np.array(e["scores"]) < t) for e in result["off_domain"].values()]
        lines.append(f"| {float(q):.1%} | {t:.2f} | " + " | ".join(f"{k:.1%}" for k in kept) + " | "
                     + " | ".join(f"{r:.1%}" for r in refused) + " |")
    for name, e in result["in_domain"].items():
        if e["refused_examples"]:
            lines += ["", f"In-domain requests of {name} refused (lowest scores first):", ""]
            lines += [f"- {r}" for r in e["refused_examples"]]
    for name, e in result["off_domain"].items():
        if e["accepted_examples"]:
            lines += ["", f"Off-domain requests of {name} still accepted (highest scores first):", ""]
            lines += [f"- {r}" for r in e["accepted_examples"]]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> Path:
    """The trade-off: fraction of each in-domain set kept vs fraction of each off-domain set refused."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = result["curve"]
    thr = np.array(curve["thresholds"])
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    for off_name, refused in curve["refused"].items():
        for in_name, accepted in curve["accepted"].items():
            ax.plot(refused, accepted, label=f"{in_name} vs {off_name}")
            at = int(np.argmin(np.abs(thr - result["threshold"])))
            ax.plot([refused[at]], [accepted[at]], "o", color=ax.lines[-1].get_color())
    ax.set_xlabel("off-domain refused")
    ax.set_ylabel("in-domain kept")
    ax.set_xlim(0, 1.01)
    ax.set_ylim(0, 1.01)
    ax.axhline(0.98, color="grey", lw=0.6, ls=":")
    ax.axvline(0.90, color="grey", lw=0.6, ls=":")
    ax.set_title("Out-of-scope trade-off (dot: the detector's threshold)")
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
