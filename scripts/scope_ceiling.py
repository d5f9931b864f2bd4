"""Probe: how far can the evidence the gate has (word statistics, the sentence encoder's embedding) go at all,
when a classifier is *taught* in- against off-domain requests written by hand? If even the optimistic
settings below stay short of the issue's operating point (K = 5: 97% of in-domain requests kept at 95% of
off-domain refused), no threshold or combination of these representations reaches it, and the gap is the
representations'.

Rows, each a score per request on the frozen test sets (users_indomain vs users_offdomain):
  gate             the gate as shipped (its combined score on the best family)
  scalars: dev     logistic regression on the gate's scalar evidence (best word / embedding / combined score,
                   margin to the second family, length, values masked), taught on the development sets
  embedding: dev   logistic regression on the encoder's embedding of the value-masked request plus those
                   scalars, taught on the development sets (supervised out-of-domain detection)
  embedding: CV    the same, 5-fold cross-validated over development and frozen test sets pooled: it is
                   taught on requests from the frozen sets' own authors and styles (optimistic)
  scalars: fit on test   the scalars fitted on the frozen test sets themselves, scored in-sample (a ceiling
                   for any combination of the scalar evidence)
The frozen sets are read here only to bound what is possible; nothing here is adopted or chosen on them.

    .venv/bin/python scripts/scope_ceiling.py

Measured 2026-12-06 (K = 5, the gate before the outlier corpus; AUC / kept where 95% is refused / refused where
97% is kept, frozen test): gate 0.860 / 43% / 29%; scalars taught on development 0.861-0.863 / 39-47% / 30%;
scalars fitted on the test sets themselves 0.881 / 47% / 33%; embedding taught on development 0.932-0.934 /
64% / 56-58%; embedding 5-fold over both pooled 0.932-0.939 / 68-73% / 51%. No combination of the gate's two
scores gets far (0.88 fitted on the answers); the embedding taught what lies outside does (0.93), and even
taught on the frozen sets' own authors stays far from 97% kept at 95% refused. What followed: the outlier
corpus (src/skillbank/memory/outliers.py), which teaches the outside without hand-written in-domain requests.
Rerun the same evening, the development sets holding 60 prompt injections more (280 off-domain): embedding
taught on development 0.923 / 56-58% / 57%; 5-fold over both pooled 0.939-0.941 / 66-71% / 58-61%. Taught on the
frozen sets' own authors, this encoder's embedding keeps 71% at most where 95% is refused.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from scope import DEV_IN, DEV_OFF, TEST_IN, TEST_OFF, curve_points, rows  # noqa: E402


def main() -> None:
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_predict
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from skillbank.data.builtin import build_builtin_stream
    from skillbank.experiments.scope import detector_for_stream

    stream = build_builtin_stream(seed=0, train_per_family=200, test_per_family=50)
    det = detector_for_stream(stream, outliers=None)  # the gate before the outlier corpus

    def features(requests: list[str]) -> tuple[np.ndarray, np.ndarray]:
        masked = det.read(requests)
        words, emb = det.word_scores(masked), det.embedding_scores(masked)
        comb = det._combine(words, emb)
        top2 = np.sort(comb, axis=1)[:, -2:]
        scalars = np.c_[words.max(1), emb.max(1), comb.max(1), top2[:, 1] - top2[:, 0],
                        [np.log1p(len(m.intent.split())) for m in masked], [len(m.spans) for m in masked]]
        scalars = np.nan_to_num(scalars, neginf=-50.0, posinf=50.0)
        vectors = det._embed(det._texts(masked)[1])
        return scalars, np.c_[vectors, scalars]

    def load(names):
        return [r["request"] for n in names for r in rows(n)]

    sets = {k: load(v) for k, v in (("dev_in", DEV_IN), ("dev_off", DEV_OFF), ("test_in", TEST_IN),
                                     ("test_off", TEST_OFF))}
    X = {k: features(v) for k, v in sets.items()}
    y_dev = np.r_[np.ones(len(sets["dev_in"])), np.zeros(len(sets["dev_off"]))]
    y_test = np.r_[np.ones(len(sets["test_in"])), np.zeros(len(sets["test_off"]))]
    n_in = len(sets["test_in"])
    near = np.array([r["category"] == "near_miss" for n in TEST_OFF for r in rows(n)])

    def line(name: str, s: np.ndarray) -> None:
        s_in, s_off = s[:n_in], s[n_in:]
        p = curve_points(s_in, s_off)
        auc, kept, refused = p["auc"], p["kept_at_95_refused"], p["refused_at_97_kept"]
        t97 = np.quantile(s_in, 0.03, method="lower")
        print(f"{name:<24} AUC {auc:.3f} | kept at 95% refused {kept:6.1%} | refused at 97% kept {refused:6.1%}"
              f" (near misses {np.mean(s_off[near] < t97):5.1%})")

    def model(C: float):
        return make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=5000))

    print(f"frozen test: {n_in} in-domain, {len(near)} off-domain ({near.sum()} near misses); "
          f"development: {int(y_dev.sum())} / {int(len(y_dev) - y_dev.sum())}")
    line("gate", X["test_in"][0][:, 2].tolist() + X["test_off"][0][:, 2].tolist() and
         np.r_[X["test_in"][0][:, 2], X["test_off"][0][:, 2]])
    for which, label in ((0, "scalars"), (1, "embedding")):
        dev = np.r_[X["dev_in"][which], X["dev_off"][which]]
        test = np.r_[X["test_in"][which], X["test_off"][which]]
        for C in (0.1, 1.0):
            line(f"{label}: dev, C={C}", model(C).fit(dev, y_dev).decision_function(test))
        if which == 1:
            pooled, y = np.r_[dev, test], np.r_[y_dev, y_test]
            folds = StratifiedKFold(5, shuffle=True, random_state=0)
            for C in (0.1, 1.0):
                s = cross_val_predict(model(C), pooled, y, cv=folds, method="decision_function")
                line(f"{label}: CV pooled, C={C}", s[len(dev):])
        else:
            line("scalars: fit on test", model(100.0).fit(test, y_test).decision_function(test))


if __name__ == "__main__":
    main()
