"""Probe, not adopted: the outlier expert with each learned family as a class of its own. The shipped gate pools
every family into one inside class and fits one discriminant per corpus category; here the families and the
corpus categories are the K + C classes of one linear discriminant (one shared covariance: each family's own
scatter diagonal, as the gate keeps it, each category's full; shrunk towards a multiple of the identity), and
each family's score gets its own outside term, the least over categories of its scaled log-odds against that
category (weight w). Development sets only; the threshold refuses 90% of the corpus, scored out of fold.

    .venv/bin/python scripts/scope_outliers_per_family.py 5,50 [shrinkage]

2026-12-06 (this CPU, 1 min a run; w 0.5-3, shrinkage 0.8 and 0.5): no better than the shipped gate. K = 5:
AUC 0.942-0.950 against 0.949, kept / refused at the corpus threshold 86.1-89.6 / 85.0-86.4% against 89.6 / 86.1%;
K = 50: 0.940-0.950 against 0.951, 87.0-90.4 / 82.1-83.9% against 94.8 / 84.6%. Separate inside classes make the
families' blobs tighter, and near misses sit close to one of them all the same."""
import sys, numpy as np
sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parents[1] / 'bench'))
from scope import rows, GATES, DEV_IN, DEV_OFF, curve_points
from skillbank.data.builtin import build_builtin_stream
from skillbank.experiments.scope import detector_for_stream
from skillbank.memory.outliers import corpus_groups, folds, FOLDS
SHR = float(sys.argv[2]) if len(sys.argv) > 2 else 0.8
for k in [int(x) for x in sys.argv[1].split(",")]:
    stream = build_builtin_stream(seed=0, train_per_family=200, test_per_family=50, families=k)
    det = detector_for_stream(stream, **GATES["outliers"])
    n = det.embedding_count_; S = det.embedding_sum_; Q = np.stack([det.embedding_squares_[f] for f in det.classes_])
    mu_f = S / n[:, None]; d = S.shape[1]
    fam_within_diag = (Q - S * S / n[:, None]).sum(0)  # sum over families of diagonal within scatter
    C = det.outlier_embeddings_.astype(float)
    groups = corpus_groups(det.outlier_categories_, len(C))
    def fit(parts_idx):
        mus, scat, cnt = [], np.zeros((d, d)), 0
        for idx in parts_idx:
            X = C[idx]; m = X.mean(0); mus.append(m); D = X - m; scat += D.T @ D; cnt += len(X)
        cov = (np.diag(fam_within_diag) + scat) / (n.sum() + cnt - len(n) - len(parts_idx))
        cov = (1 - SHR) * cov + SHR * np.trace(cov) / d * np.eye(d)
        P = np.linalg.inv(cov)
        M = np.vstack([mu_f] + mus)
        return P, M
    def outside_per_family(X, P, M):
        PM = M @ P; const = 0.5 * np.einsum('ij,ij->i', PM, M)
        g = X @ PM.T - const  # (n, K + C)
        K = len(n); gf, gc = g[:, :K], g[:, K:]
        Mf, Mc = M[:K], M[K:]
        # half Mahalanobis between each family and each part
        diff = Mf[:, None, :] - Mc[None, :, :]
        half = 0.5 * np.einsum('fcd,de,fce->fc', diff, P, diff)
        r = (gf[:, :, None] - gc[:, None, :]) / half[None]  # (n, K, C)
        return r.min(2)  # (n, K): per family, its worst part
    P, M = fit([idx for _, idx in groups])
    # corpus OOF: refit parts without each fold (family stats unchanged)
    oof = np.empty((len(C), len(n)))
    for f in range(FOLDS):
        parts = []; held_all = []
        for _, idx in groups:
            fo = folds(len(idx)); parts.append(idx[fo != f]); held_all.append(idx[fo == f])
        Pf, Mf = fit(parts)
        h = np.concatenate(held_all); oof[h] = outside_per_family(C[h], Pf, Mf)
    def gate_parts(qs):
        m = det.read(qs); E = det._embed(det._texts(m)[1])
        return det._combine(det.word_scores(m), det._embedding_scores_of(E)), E
    qi = [r["request"] for n_ in DEV_IN for r in rows(n_)]; qo = [r["request"] for n_ in DEV_OFF for r in rows(n_)]
    mt = np.array([r["category"] == "missing_tool" for n_ in DEV_OFF for r in rows(n_)])
    inj = np.array([r["category"] == "prompt_injection" for n_ in DEV_OFF for r in rows(n_)])
    Gi, Ei = gate_parts(qi); Go, Eo = gate_parts(qo)
    wc = det.word_scores(det.read(det.outlier_requests_)); Gc = det._combine(wc, det._embedding_scores_of(C))
    *_, oof_ship = det._discriminant()
    ship_i = Gi.max(1) + det._outside_of(Ei); ship_o = Go.max(1) + det._outside_of(Eo); ship_c = Gc.max(1) + oof_ship
    for w in (0.5, 1.0, 2.0, 3.0):
        new_i = (Gi + w * outside_per_family(Ei, P, M)).max(1); new_o = (Go + w * outside_per_family(Eo, P, M)).max(1)
        new_c = (Gc + w * oof).max(1)
        for name, si, so, sc in (("shipped", ship_i, ship_o, ship_c), (f"per-family w{w}", new_i, new_o, new_c)):
            if name == "shipped" and w != 0.5: continue
            t = np.quantile(sc, 0.9); p = curve_points(si, so)
            print(f"K={k} shr {SHR} {name:<16} AUC {p['auc']:.3f} kept@95 {p['kept_at_95_refused']:.1%} | at corpus q0.9: kept {np.mean(si>=t):.1%} refused {np.mean(so<t):.1%} mt {np.mean(so[mt]<t):.0%} inj {np.mean(so[inj]<t):.0%}")
