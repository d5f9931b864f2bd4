"""Probe (development sets only): a second discriminant, the learned families against the outlier corpus's
other_tools part alone (requests for tools no family has), added to the shipped gate's score, for near misses.

    .venv/bin/python scripts/scope_outliers_tools.py

Measured 2026-12-06: the shipped gate AUC 0.960, at its threshold 90.4% kept / 88.6% refused, missing-tool
refused 68%; with the second discriminant (shrinkage 0.5 or 0.8, weight 0.5 or 1) AUC 0.958-0.960, 90.4-91.3% /
87.7-89.1%, missing-tool 70-74%: a request or two. Not adopted."""
import sys, json, numpy as np
sys.path.insert(0, 'bench'); sys.path.insert(0, 'scripts')
from scope import DEV_IN, DEV_OFF, rows
from scope_ceiling import operating_points
from skillbank.data.builtin import build_builtin_stream
from skillbank.experiments.scope import detector_for_stream
from skillbank.memory.outliers import Moments, discriminant, out_of_fold_scores, corpus_path
from skillbank.memory.values import mask
s = build_builtin_stream(seed=0, train_per_family=200, test_per_family=50)
det = detector_for_stream(s)  # the shipped gate (outliers)
cats = [json.loads(l)["category"] for l in corpus_path().read_text().splitlines() if l.strip()]
E = det.outlier_embeddings_.astype(float); tools = np.array([c == "other_tools" for c in cats])
load = lambda names: [r["request"] for n in names for r in rows(n)]
din, doff = load(DEV_IN), load(DEV_OFF)
special = np.array([r["category"] == "missing_tool" for n in DEV_OFF for r in rows(n)])
emb = lambda reqs: det._embed(det._texts(det.read(reqs))[1])
Xi, Xo = emb(din), emb(doff)
gi, go = np.nan_to_num(det.score(din).max(1), neginf=-50.), np.nan_to_num(det.score(doff).max(1), neginf=-50.)
# inside moments as the gate holds them
d = det.embedding_sum_.shape[1]; moment = np.zeros((d, d))
for c, lab in enumerate(det.classes_):
    t, n = det.embedding_sum_[c], det.embedding_count_[c]
    moment += np.outer(t, t) / n; moment[np.diag_indices(d)] += det.embedding_squares_[lab] - t * t / n
inside = Moments(float(det.embedding_count_.sum()), det.embedding_sum_.sum(0), moment)
gate_corpus = det._corpus_scores()
def show(name, si, so, sc):
    auc, k95, r97 = operating_points(si, so)
    t97 = np.quantile(si, 0.03, method="lower")
    ops = " ".join(f"[q{q}: {np.mean(si >= np.quantile(sc, q)):.1%} / {np.mean(so < np.quantile(sc, q)):.1%} mt {np.mean(so[special] < np.quantile(sc, q)):.0%}]" for q in (0.9,))
    print(f"{name:28s} AUC {auc:.3f} k@95 {k95:.1%} r@97 {r97:.1%} (mt {np.mean(so[special] < t97):.0%}) {ops}")
show("shipped gate", gi, go, gate_corpus)
for shrink in (0.5, 0.8):
    T = E[tools]
    w, b = discriminant(inside, Moments.of(T), shrink)
    half = 0.5 * float((inside.mean() - T.mean(0)) @ w)
    oof = np.full(len(E), np.nan)
    # out of fold for the tools part; the rest scored by the full tools discriminant
    fold = np.arange(len(T)) % 5
    o = np.empty(len(T))
    for k in range(5):
        w2, b2 = discriminant(inside, Moments.of(T[fold != k]), shrink); o[fold == k] = T[fold == k] @ w2 + b2
    sc_t = (E @ w + b) / half; sc_t[tools] = o / half
    for lam in (0.5, 1.0):
        show(f"+ tools lda {shrink} x{lam}", gi + lam * (Xi @ w + b) / half, go + lam * (Xo @ w + b) / half, gate_corpus + lam * sc_t)
