"""Probe: does standardising the scope score per family (and a threshold per family) separate in- from
off-domain requests better than the pooled standardisation the gate uses? AUC on the development and frozen
test sets of bench/scope.py, and the refusal at a threshold keeping 97% of development in-domain requests.

    .venv/bin/python scripts/scope_per_family.py 5,50

Measured 2026-12-04 (docs/scope.md): no gain; not adopted."""
import sys, json, numpy as np
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "bench"))
from scope import rows, DEV_IN, DEV_OFF, TEST_IN, TEST_OFF
from skillbank.data.builtin import build_builtin_stream
from skillbank.experiments.scope import detector_for_stream
from sklearn.metrics import roc_auc_score

def tail(v):
    v = v[np.isfinite(v)]
    m = float(np.median(v)); return m, max(m - float(np.quantile(v, 0.05)), 1e-6)

for k in [int(x) for x in sys.argv[1].split(",")]:
    stream = build_builtin_stream(seed=0, train_per_family=200, test_per_family=50, families=k)
    det = detector_for_stream(stream, reader="values", outliers=None)
    sets = {n: [r["request"] for r in rows(n)] for n in DEV_IN + DEV_OFF + TEST_IN + TEST_OFF}
    W = {n: det.word_scores(q) for n, q in sets.items()}
    E = {n: det.embedding_scores(q) for n, q in sets.items()}
    pooled = {n: det._combine(W[n], E[n]).max(axis=1) for n in sets}
    # per-family scales and per-family thresholds
    fam = [(tail(det.train_scores_[c]), tail(det.train_embedding_scores_[c])) for c in det.classes_]
    mw = np.array([f[0][0] for f in fam]); sw = np.array([f[0][1] for f in fam])
    me = np.array([f[1][0] for f in fam]); se = np.array([f[1][1] for f in fam])
    own = []
    for i, c in enumerate(det.classes_):
        w, e = det.train_scores_[c], det.train_embedding_scores_[c]
        z = np.where(np.isnan(e), (w - mw[i]) / sw[i], 0.5 * (w - mw[i]) / sw[i] + 0.5 * (e - me[i]) / se[i])
        own.append(z)
    qf = np.array([np.quantile(z, 0.01) for z in own])
    perfam_z = {n: 0.5 * (W[n] - mw) / sw + 0.5 * (E[n] - me) / se for n in sets}
    variants = {"pooled": (pooled, det.threshold_),
                "perfam_scale_global_thr": ({n: z.max(axis=1) for n, z in perfam_z.items()},
                                            float(np.quantile(np.concatenate(own), 0.01))),
                "perfam_scale_perfam_thr": ({n: (z - qf).max(axis=1) for n, z in perfam_z.items()}, 0.0),
                "embedding_only": ({n: E[n].max(axis=1) for n in sets}, None),
                "words_only": ({n: W[n].max(axis=1) for n in sets}, None)}
    for name, (S, thr) in variants.items():
        di = np.concatenate([S[n] for n in DEV_IN]); do = np.concatenate([S[n] for n in DEV_OFF])
        ti = S[TEST_IN[0]]; to = S[TEST_OFF[0]]
        auc_d = roc_auc_score(np.r_[np.ones(len(di)), np.zeros(len(do))], np.nan_to_num(np.r_[di, do], neginf=-1e9))
        auc_t = roc_auc_score(np.r_[np.ones(len(ti)), np.zeros(len(to))], np.nan_to_num(np.r_[ti, to], neginf=-1e9))
        # threshold keeping 97% of dev in-domain: refused dev/test at that threshold
        t97 = np.quantile(di, 0.03)
        line = f"K={k} {name:26s} AUC dev {auc_d:.3f} test {auc_t:.3f} | at dev-kept 97%: dev refused {np.mean(do < t97):.1%}, test kept {np.mean(ti >= t97):.1%} refused {np.mean(to < t97):.1%}"
        if thr is not None:
            line += f" | own thr: dev {np.mean(di>=thr):.1%}/{np.mean(do<thr):.1%} test {np.mean(ti>=thr):.1%}/{np.mean(to<thr):.1%}"
        print(line, flush=True)
