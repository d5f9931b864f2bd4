"""Out-of-scope detection: how many in-domain requests a detector keeps and off-domain ones it refuses.

The detector is a bank's, or the one a bank learning a stream would hold (:func:`detector_for_stream`:
the same statistics, built in seconds without training a shard). Every request of every set is scored by
the scope detector (:mod:`skillbank.memory.scope`; no generation, so this is cheap). In-domain sets (a
stream's held-out requests, hand-written paraphrases) give the acceptance rate, off-domain sets (requests
no family covers, with a ``category``) the refusal rate, at the detector's own threshold (chosen on its
training requests) and along a sweep of thresholds: the trade-off curve. The threshold is never fitted to
these sets here; the curve shows what another one would give.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Sequence

import numpy as np

from skillbank.memory.scope import ScopeDetector, catalog_text, fit_inputs


def detector_for_stream(stream, families: Sequence[str] | None = None, **params) -> ScopeDetector:
    """The scope statistics a bank that learned ``families`` (default: all) of ``stream`` would hold: each
    family's training requests and its catalog's text, added as :meth:`SkillBank.learn` adds them."""
    det = ScopeDetector(**params)
    for key in families or stream.family_keys:
        specs = [stream.catalog.skills[s].to_dict() for s in sorted(set(stream.catalog.family(key).skills))]
        records = stream.train[key]
        det.partial_fit([r.request for r in records], key, catalog_text(specs), **fit_inputs(records, key))
    return det


def evaluate_scope(det: ScopeDetector, in_domain: dict[str, Sequence[str]],
                   off_domain: dict[str, Sequence[tuple[str, str]]], *, source: str,
                   quantiles: Sequence[float] = (0.0, 0.005, 0.01, 0.02, 0.05, 0.1)) -> dict:
    """in_domain: set name -> requests; off_domain: set name -> (request, category) pairs; source: where the
    detector comes from (a bank's path, or the stream it was fitted on), for the report's title."""
    threshold = det.threshold_
    loo = det.training_scores()
    scores = {name: det.score(list(reqs)).max(axis=1) for name, reqs in in_domain.items()}
    off_scores = {name: det.score([r for r, _ in pairs]).max(axis=1) for name, pairs in off_domain.items()}
    result = {"source": source, "families": list(det.classes_), "params": det.get_params(),
              "threshold": threshold, "train_requests": int(len(loo)), "in_domain": {}, "off_domain": {},
              "thresholds_by_quantile": {str(q): float(np.quantile(loo, q)) for q in quantiles}}
    for name, s in scores.items():
        result["in_domain"][name] = {
            "n": int(len(s)), "accepted": float((s >= threshold).mean()), "scores": s.tolist(),
            "refused_examples": [req for req, v in sorted(zip(in_domain[name], s), key=lambda t: t[1])
                                 if v < threshold][:10]}
    for name, pairs in off_domain.items():
        s = off_scores[name]
        by_cat = defaultdict(list)
        for (req, cat), v in zip(pairs, s):
            by_cat[cat].append(v)
        result["off_domain"][name] = {
            "n": int(len(s)), "refused": float((s < threshold).mean()), "scores": s.tolist(),
            "refused_by_category": {c: float((np.array(v) < threshold).mean()) for c, v in sorted(by_cat.items())},
            "accepted_examples": [req for (req, _), v in sorted(zip(pairs, s), key=lambda t: -t[1]) if v >= threshold][:10]}
    finite = np.concatenate([x[np.isfinite(x)] for x in [*scores.values(), *off_scores.values(), loo]])
    sweep = np.linspace(np.quantile(finite, 0.01), np.quantile(finite, 0.99), 121)
    result["curve"] = {"thresholds": sweep.tolist(),
                       "accepted": {n: [float((s >= t).mean()) for t in sweep] for n, s in scores.items()},
                       "refused": {n: [float((s < t).mean()) for t in sweep] for n, s in off_scores.items()}}
    return result


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


def write(result: dict, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "scope.json").write_text(json.dumps(result, indent=1) + "\n")
    (out_dir / "scope.md").write_text(render_markdown(result) + "\n")
    plot(result, out_dir / "scope.png")
