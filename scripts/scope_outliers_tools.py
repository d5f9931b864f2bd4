"""Probe (development sets only): a second discriminant, the learned families against the outlier corpus's
other_tools part alone (requests for tools no family has), added to the shipped gate's score, for near misses.

    .venv/bin/python scripts/scope_outliers_tools.py

Measured 2026-12-06: the shipped gate AUC 0.960, at its threshold 90.4% kept / 88.6% refused, missing-tool
refused 68%; with the second discriminant (shrinkage 0.5 or 0.8, weight 0.5 or 1) AUC 0.958-0.960, 90.4-91.3% /
87.7-89.1%, missing-tool 70-74%: a request or two. Not adopted."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from scope import DEV_IN, DEV_OFF, curve_points, rows  # noqa: E402


def main() -> None:
    from skillbank.data.builtin import build_builtin_stream
    from skillbank.experiments.scope import detector_for_stream
    from skillbank.memory.outliers import FOLDS, Moments, corpus_path, discriminant, folds

    stream = build_builtin_stream(seed=0, train_per_family=200, test_per_family=50)
    det = detector_for_stream(stream)  # the shipped gate
    categories = [json.loads(line)["category"] for line in corpus_path().read_text().splitlines() if line.strip()]
    corpus = det.outlier_embeddings_.astype(float)
    tools = np.array([c == "other_tools" for c in categories])

    def load(names):
        return [r["request"] for n in names for r in rows(n)]

    def embed(requests):
        return det._embed(det._texts(det.read(requests))[1])

    dev_in, dev_off = load(DEV_IN), load(DEV_OFF)
    missing = np.array([r["category"] == "missing_tool" for n in DEV_OFF for r in rows(n)])
    X_in, X_off = embed(dev_in), embed(dev_off)
    g_in = np.nan_to_num(det.score(dev_in).max(axis=1), neginf=-50.0)
    g_off = np.nan_to_num(det.score(dev_off).max(axis=1), neginf=-50.0)
    inside = det._inside_moments()  # the families' moments as the gate holds them
    gate_corpus = det._corpus_scores()

    def show(name, s_in, s_off, s_corpus):
        p = curve_points(s_in, s_off)
        t = np.quantile(s_corpus, det.outlier_refusal)
        print(f"{name:30s} AUC {p['auc']:.3f} | kept@95 {p['kept_at_95_refused']:.1%} refused@97 "
              f"{p['refused_at_97_kept']:.1%} | at the corpus "
              f"threshold: kept {np.mean(s_in >= t):.1%}, refused {np.mean(s_off < t):.1%}, missing tool "
              f"{np.mean(s_off[missing] < t):.0%}")

    show("shipped gate", g_in, g_off, gate_corpus)
    T = corpus[tools]
    fold = folds(len(T))
    for shrink in (0.5, 0.8):
        w, b = discriminant(inside, Moments.of(T), shrink)
        half = 0.5 * float((inside.mean() - T.mean(axis=0)) @ w)
        own = np.empty(len(T))  # the other-tools requests out of fold, as the threshold needs them
        for k in range(FOLDS):
            wk, bk = discriminant(inside, Moments.of(T[fold != k]), shrink)
            own[fold == k] = T[fold == k] @ wk + bk
        s_corpus = (corpus @ w + b) / half
        s_corpus[tools] = own / half
        for weight in (0.5, 1.0):
            show(f"+ other-tools LDA {shrink} x{weight}", g_in + weight * (X_in @ w + b) / half,
                 g_off + weight * (X_off @ w + b) / half, gate_corpus + weight * s_corpus)


if __name__ == "__main__":
    main()
