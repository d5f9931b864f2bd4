"""Probe: a skill's catalog description as one more prototype for the gate's meaning expert. Each skill's
prototype is the mean embedding of the training requests that use it, and most of those are long multi-step
requests (at K = 5, two in three use two to five skills), so "play some jazz" is at cosine 0.27 from
`play_music`'s prototype. Here each skill's catalog text (name, description, argument names) is embedded too and
a family's meaning score is the best cosine over its prototypes and its descriptions, in training (leave-one-out,
on the restyled calibration requests) and at plan time alike, so the threshold is recalibrated the same way.

    .venv/bin/python scripts/scope_description_prototypes.py 5,50

Prints per split: AUC on the development / frozen test sets and kept / refused at the detector's own threshold,
for the gate as it is and with the descriptions."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from scope import DEV_IN, DEV_OFF, gate_figures, rows  # noqa: E402

from skillbank.data.builtin import build_builtin_stream  # noqa: E402
from skillbank.experiments.scope import detector_for_stream  # noqa: E402
from skillbank.memory import scope as scope_mod  # noqa: E402
from skillbank.memory.scope import family_catalog_text  # noqa: E402

CAL: dict[str, list[np.ndarray]] = {}
_add_skills = scope_mod.ScopeDetector._add_skills


def add_skills(self, label, skills, embeddings, cal_embeddings):
    CAL.setdefault(label, []).append(cal_embeddings)
    return _add_skills(self, label, skills, embeddings, cal_embeddings)


scope_mod.ScopeDetector._add_skills = add_skills


def with_descriptions(det, stream, weight: float):
    """Add each family's skill descriptions as prototypes: plan-time scores and leave-one-out training scores
    become the best cosine over prototypes and descriptions (descriptions' cosines times ``weight``)."""
    desc = {}
    for label in det.classes_:
        docs = family_catalog_text(stream.catalog, label)
        E = det._embed(docs)
        desc[label] = E / np.maximum(np.linalg.norm(E, axis=1, keepdims=True), 1e-12)
    for label in det.classes_:
        cal = np.vstack(CAL[label])
        best = (cal @ desc[label].T).max(axis=1) * weight
        old = det.train_embedding_scores_[label]
        det.train_embedding_scores_[label] = np.where(np.isnan(old), old, np.maximum(old, best))
    det._reset_derived()
    plain = det.embedding_scores

    def embedding_scores(requests):
        out = plain(requests)
        X = det._embed(det._texts(det._as_masked(requests))[1])
        for c, label in enumerate(det.classes_):
            out[:, c] = np.maximum(out[:, c], (X @ desc[label].T).max(axis=1) * weight)
        return out

    det.embedding_scores = embedding_scores
    return det


def main() -> None:
    from sklearn.metrics import roc_auc_score
    ins = [r["request"] for n in DEV_IN for r in rows(n)]
    offs = [r["request"] for n in DEV_OFF for r in rows(n)]
    for k in [int(x) for x in sys.argv[1].split(",")]:
        stream = build_builtin_stream(seed=0, train_per_family=200, test_per_family=50, families=k)
        for weight in [None] + [float(w) for w in (sys.argv[2] if len(sys.argv) > 2 else "1").split(",")]:
            CAL.clear()
            det = detector_for_stream(stream, reader="values", outliers=None)
            if weight is not None:
                with_descriptions(det, stream, weight)
            meaning = np.r_[det.embedding_scores(ins).max(axis=1), det.embedding_scores(offs).max(axis=1)]
            alone = roc_auc_score(np.r_[np.ones(len(ins)), np.zeros(len(offs))], meaning)
            name = "gate as it is" if weight is None else f"with descriptions x{weight:g}"
            print(f"K={k} {name}: meaning alone AUC dev {alone:.3f} | {gate_figures(det)}", flush=True)


if __name__ == "__main__":
    main()
