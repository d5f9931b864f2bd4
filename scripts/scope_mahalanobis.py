"""Probe: is the embedding router's Gaussian (Mahalanobis to the nearest family mean, or relative to one
Gaussian over every family, Ren et al. 2021) better evidence for the scope gate than its cosine to skill
prototypes? AUC on the development / frozen test sets of bench/scope.py and the refusal at a threshold
keeping 97% of the development in-domain requests.

    .venv/bin/python scripts/scope_mahalanobis.py 5,50

Measured 2026-12-04 (docs/scope.md): no gain (AUC 0.948 / 0.863 against the gate's 0.948 / 0.861 at K = 5);
not adopted."""
import sys, numpy as np
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "bench"))
from scope import rows, DEV_IN, DEV_OFF, TEST_IN, TEST_OFF
from skillbank.data.builtin import build_builtin_stream
from skillbank.experiments.scope import detector_for_stream
from skillbank.memory.selectors.embedding import get_encoder, memoize_encoders
from skillbank.memory.selectors.gaussian import GaussianClassStats
from skillbank.memory.values import mask_payloads
from sklearn.metrics import roc_auc_score
memoize_encoders(True); enc = get_encoder()
def auc(i, o):
    i = np.nan_to_num(i, neginf=-1e9); o = np.nan_to_num(o, neginf=-1e9)
    return roc_auc_score(np.r_[np.ones(len(i)), np.zeros(len(o))], np.r_[i, o])
def report(name, S, cats):
    di = np.concatenate([S[n] for n in DEV_IN]); do = np.concatenate([S[n] for n in DEV_OFF]); ti, to = S[TEST_IN[0]], S[TEST_OFF[0]]
    t97 = np.quantile(di, 0.03)
    print(f"  {name:30s} AUC dev {auc(di,do):.3f} test {auc(ti,to):.3f} | dev97: dev ref {np.mean(do<t97):.0%} test kept {np.mean(ti>=t97):.0%} ref {np.mean(to<t97):.0%} nm {np.mean(to[cats=='near_miss']<t97):.0%}", flush=True)
def z(v, ref):
    ref = ref[np.isfinite(ref)]; m = np.median(ref); return (v - m) / max(m - np.quantile(ref, 0.05), 1e-6)
for k in [int(x) for x in sys.argv[1].split(",")]:
    stream = build_builtin_stream(seed=0, train_per_family=200, test_per_family=50, families=k)
    det = detector_for_stream(stream, reader="values", outliers=None)
    sets = {n: [r["request"] for r in rows(n)] for n in DEV_IN + DEV_OFF + TEST_IN + TEST_OFF}
    cats = np.array([r["category"] for r in rows(TEST_OFF[0])])
    f = lambda qs: [mask_payloads(q, 6) for q in qs]
    X = {n: enc.encode(f(q)).astype(float) for n, q in sets.items()}
    tr = [(r.request, key) for key in stream.family_keys for r in stream.train[key]]
    Xtr = enc.encode(f([q for q, _ in tr])).astype(float); ytr = [key for _, key in tr]
    W = {n: det.word_scores(q).max(1) for n, q in sets.items()}
    Wref = np.concatenate(list(det.train_scores_.values()))
    report("current gate", {n: det.score(q).max(1) for n, q in sets.items()}, cats)
    for ps in (3000.0, 300.0):
        g = GaussianClassStats(ps, per_class=True).partial_fit(Xtr, ytr)
        g0 = GaussianClassStats(ps).partial_fit(Xtr, ["all"] * len(ytr))
        # relative: class log-lik minus a single global Gaussian's (same shrinkage); cov differs: use each own
        def ll(gs, Xn):
            P = gs.precision(); sign, logdet = np.linalg.slogdet(gs.covariance())
            return gs.log_scores(Xn) - 0.5 * logdet
        M = {n: ll(g, X[n]).max(1) for n in sets}
        R = {n: (ll(g, X[n]) - ll(g0, X[n])).max(1) for n in sets}
        report(f"maha ps={ps:g}", M, cats)
        report(f"rel-maha ps={ps:g}", R, cats)
        Rref = (ll(g, Xtr) - ll(g0, Xtr)).max(1)
        report(f"words+rel-maha ps={ps:g}", {n: 0.5 * z(W[n], Wref) + 0.5 * z(R[n], Rref) for n in sets}, cats)
