"""Probe: does a background of procedurally generated families' requests (tool requests that belong to no
user) sharpen the scope gate's meaning evidence (cosine or Gaussian scores relative to the background)?
Same figures as scripts/scope_mahalanobis.py.

    .venv/bin/python scripts/scope_background.py 5

Measured 2026-12-04 (docs/scope.md): it hurts (test AUC 0.63-0.78 against 0.861); not adopted."""
import sys, time, numpy as np
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "bench"))
from scope import rows, DEV_IN, DEV_OFF, TEST_IN, TEST_OFF, family_of
from skillbank.data.builtin import build_builtin_stream
from skillbank.data.synthetic import build_synthetic_stream
from skillbank.experiments.scope import detector_for_stream
from skillbank.memory.selectors.embedding import get_encoder, memoize_encoders
from skillbank.memory.selectors.gaussian import GaussianClassStats
from sklearn.metrics import roc_auc_score
memoize_encoders(True)
enc = get_encoder()

def auc(i, o):
    i = np.nan_to_num(i, neginf=-1e9); o = np.nan_to_num(o, neginf=-1e9)
    return roc_auc_score(np.r_[np.ones(len(i)), np.zeros(len(o))], np.r_[i, o])

def report(name, S, cats):
    di = np.concatenate([S[n] for n in DEV_IN]); do = np.concatenate([S[n] for n in DEV_OFF])
    ti, to = S[TEST_IN[0]], S[TEST_OFF[0]]
    t97 = np.quantile(di, 0.03)
    nm = to[cats == "near_miss"]
    print(f"  {name:34s} AUC dev {auc(di,do):.3f} test {auc(ti,to):.3f} | dev97: dev ref {np.mean(do<t97):.0%} test kept {np.mean(ti>=t97):.0%} ref {np.mean(to<t97):.0%} nm {np.mean(nm<t97):.0%}", flush=True)

def z(v, ref):
    ref = ref[np.isfinite(ref)]; m = np.median(ref); return (v - m) / max(m - np.quantile(ref, 0.05), 1e-6)

bg_stream = build_synthetic_stream(40, seed=0, train_per_family=30, test_per_family=1)
bg_texts = [r.request for k in bg_stream.family_keys for r in bg_stream.train[k]]
bg_labels = [k for k in bg_stream.family_keys for r in bg_stream.train[k]]

for k in [int(x) for x in sys.argv[1].split(",")]:
    t0 = time.time()
    stream = build_builtin_stream(seed=0, train_per_family=200, test_per_family=50, families=k)
    det = detector_for_stream(stream, reader="values", outliers=None)
    sets = {n: [r["request"] for r in rows(n)] for n in DEV_IN + DEV_OFF + TEST_IN + TEST_OFF}
    cats = np.array([r["category"] for r in rows(TEST_OFF[0])])
    prose = lambda qs: det._texts(det.read(qs))[1]
    W = {n: det.word_scores(q) for n, q in sets.items()}
    E = {n: det.embedding_scores(q) for n, q in sets.items()}
    X = {n: enc.encode(prose(q)).astype(np.float64) for n, q in sets.items()}
    print(f"K={k} ({time.time()-t0:.0f}s)")
    report("current (words+cos skill protos)", {n: det._combine(W[n], E[n]).max(1) for n in sets}, cats)
    report("words", {n: W[n].max(1) for n in sets}, cats)
    report("cos skill protos", {n: E[n].max(1) for n in sets}, cats)
    tr = [(r.request, key) for key in stream.family_keys for r in stream.train[key]]
    Xtr = enc.encode(prose([q for q, _ in tr])).astype(np.float64)
    ytr = [key for _, key in tr]
    Xbg = enc.encode(det._texts(det.read(bg_texts))[1]).astype(np.float64)
    for ps in (30.0, 300.0, 3000.0):
        g = GaussianClassStats(ps).partial_fit(Xtr, ytr)
        M = {n: g.log_scores(X[n]).max(1) for n in sets}
        report(f"maha ps={ps:g}", M, cats)
        ref = g.log_scores(Xtr).max(1)
        wref = det.training_scores()
        report(f"words+maha ps={ps:g}", {n: 0.5*z(W[n].max(1), np.concatenate(list(det.train_scores_.values()))) + 0.5*z(M[n], ref) for n in sets}, cats)
        # with background classes: log-sum-exp over families minus over background
        gb = GaussianClassStats(ps).partial_fit(np.vstack([Xtr, Xbg]), ytr + ["bg:"+b for b in bg_labels])
        fam = np.array([not c.startswith("bg:") for c in gb.classes_])
        def rel(Xn):
            s = gb.log_scores(Xn); from scipy.special import logsumexp
            return logsumexp(s[:, fam], 1) - logsumexp(s[:, ~fam], 1)
        R = {n: rel(X[n]) for n in sets}
        report(f"maha-vs-bg ps={ps:g}", R, cats)
    # cosine background contrast
    bgm = {}
    for x, l in zip(Xbg, bg_labels): bgm.setdefault(l, []).append(x)
    B = np.array([np.mean(v, 0) for v in bgm.values()]); B /= np.linalg.norm(B, axis=1, keepdims=True)
    C = {n: E[n].max(1) - (X[n] @ B.T).max(1) for n in sets}
    report("cos protos - cos bg", C, cats)
    # the gate's combined score, its embedding part made relative to the background's best cosine
    report("words + (cos - bg)", {n: det._combine(W[n], E[n]).max(1)
                                  - 0.5 * (X[n] @ B.T).max(1) / det._training_scales()[1][1] for n in sets}, cats)
