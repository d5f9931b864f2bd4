"""Probe: how much should a word the family rarely or never uses count against it? The gate's word expert adds,
per word, log(lam p(w | family) / p_english(w) + 1 - lam): positive for the family's own words, down to log(1 - lam)
= -0.69 for a common word it never saw. A short request such as "play some jazz" has one family word (+1.41) and
two it never saw (-0.19, -0.69), and is refused. Here the negative part of every word's contribution is scaled by
gamma (1: the gate as it is; 0: words count only for a family, never against it), in training (leave-one-out)
and plan-time scores alike, so the threshold is recalibrated the same way.

    .venv/bin/python scripts/scope_word_penalty.py 5 --gammas 1,0.5,0.25,0

Prints per split and gamma: AUC on the development / frozen test sets, kept / refused at the detector's own
threshold, short in-domain requests kept, near misses refused."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from scope import DEV_IN, DEV_OFF, TEST_IN, TEST_OFF, rows  # noqa: E402

from skillbank.data.builtin import build_builtin_stream  # noqa: E402
from skillbank.experiments.scope import detector_for_stream  # noqa: E402
from skillbank.memory import scope as scope_mod  # noqa: E402

GAMMA = {"g": 1.0}


def family_scores(self, X, c, leave_out=None, seen_any=None):
    """ScopeDetector._family_scores with the negative part of each word's contribution scaled by GAMMA; at plan
    time (``seen_any``: words any family uses) a word counts when some family uses it, as the gate's fast path."""
    bg = self.background_.astype(float)
    fam = self.counts_[c].toarray().ravel()
    total = fam.sum()
    out = np.full(X.shape[0], -np.inf)
    for i in range(X.shape[0]):
        idx, cnt = X.indices[X.indptr[i]:X.indptr[i + 1]], X.data[X.indptr[i]:X.indptr[i + 1]]
        if not len(idx):
            continue
        gone = leave_out[i].toarray().ravel()[idx] if leave_out is not None else 0
        own, tot = fam[idx] - gone, total - (leave_out[i].sum() if leave_out is not None else 0)
        p_fam = np.maximum(own, 0) / tot if tot > 0 else np.zeros_like(own)
        word = np.log(self.lam * p_fam / bg[idx] + (1 - self.lam))
        if self.reader == "values":
            known = (own > 0) if seen_any is None else seen_any[idx]
            word = np.where(known | (bg[idx] >= scope_mod.COMMON_WORD), word, 0.0)
        word = np.where(word < 0, GAMMA["g"] * word, word)
        out[i] = float(cnt @ word)
    return out


def word_scores(self, requests):
    masked = self._as_masked(requests)
    X = self._vec.transform(self._texts(masked)[0]).tocsr()
    seen_any = np.asarray(self.counts_.sum(axis=0)).ravel() > 0
    return np.stack([family_scores(self, X, c, seen_any=seen_any) for c in range(len(self.classes_))], axis=1)


scope_mod.ScopeDetector._family_scores = family_scores
scope_mod.ScopeDetector.word_scores = word_scores


def main() -> None:
    from sklearn.metrics import roc_auc_score
    ap = argparse.ArgumentParser()
    ap.add_argument("families", default="5")
    ap.add_argument("--gammas", default="1,0.5,0.25,0")
    args = ap.parse_args()
    sets = {n: [r["request"] for r in rows(n)] for n in DEV_IN + DEV_OFF + TEST_IN + TEST_OFF}
    cats = np.array([r["category"] for r in rows(TEST_OFF[0])])

    def auc(i, o):
        i, o = np.nan_to_num(i, neginf=-1e9), np.nan_to_num(o, neginf=-1e9)
        return roc_auc_score(np.r_[np.ones(len(i)), np.zeros(len(o))], np.r_[i, o])

    for k in [int(x) for x in args.families.split(",")]:
        stream = build_builtin_stream(seed=0, train_per_family=200, test_per_family=50, families=k)
        for g in [float(x) for x in args.gammas.split(",")]:
            GAMMA["g"] = g
            det = detector_for_stream(stream, reader="values")
            thr = det.threshold_
            S = {n: det.score(q).max(axis=1) for n, q in sets.items()}
            di = np.concatenate([S[n] for n in DEV_IN])
            do = np.concatenate([S[n] for n in DEV_OFF])
            ti, to = S[TEST_IN[0]], S[TEST_OFF[0]]
            short = S["paraphrase_builtin_short"]
            print(f"K={k} gamma={g:g}: AUC dev {auc(di, do):.3f} test {auc(ti, to):.3f} | dev kept {np.mean(di >= thr):.1%} "
                  f"refused {np.mean(do < thr):.1%} (short kept {np.mean(short >= thr):.0%}) | TEST kept "
                  f"{np.mean(ti >= thr):.1%} refused {np.mean(to < thr):.1%} near misses {np.mean(to[cats == 'near_miss'] < thr):.0%}",
                  flush=True)


if __name__ == "__main__":
    main()
