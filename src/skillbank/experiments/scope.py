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
from skillbank.experiments.provenance import write_provenance
from skillbank.report.scope import plot, render_markdown


def detector_for_stream(stream, families: Sequence[str] | None = None, **params) -> ScopeDetector:
    """The scope statistics a bank that learned ``families`` (default: all) of ``stream`` would hold: each
    family's training requests and its catalog's text, added as :meth:`SkillBank.learn` adds them; with a new
    bank's settings (encoder, outlier corpus) where ``params`` does not name others."""
    from skillbank.memory.bank import default_scope_params
    det = ScopeDetector(**default_scope_params(params))
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


def write(result: dict, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "scope.json").write_text(json.dumps(result, indent=1) + "\n")
    (out_dir / "scope.md").write_text(render_markdown(result) + "\n")
    plot(result, out_dir / "scope.png")
    write_provenance(out_dir)
