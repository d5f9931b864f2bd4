"""Probe: does dividing the gate's word evidence by a power of the request's word count (a score that does not
grow with length) keep more short hand-written requests at the same off-domain refusal? The word expert's
score is a sum over words, so a three-word request ("play Bohemian Rhapsody") can only reach a small fraction
of the long template requests' scores the threshold is drawn from. p = 0 is the gate as it is, p = 1 the mean
per word, p = 0.5 the scale of a sum of independent terms. Training (leave-one-out) and plan-time scores are
divided alike, so the threshold is recalibrated the same way.

    .venv/bin/python scripts/scope_length_norm.py 5,50 --powers 0,0.5,1

Prints, per split and power: AUC on the development / frozen test sets, kept / refused at the detector's own
threshold (development, then test), short in-domain requests kept, near misses refused."""
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

POWER = {"p": 0.0}
_family_scores = scope_mod.ScopeDetector._family_scores
_word_scores = scope_mod.ScopeDetector.word_scores


def family_scores(self, X, c, leave_out=None):
    out = _family_scores(self, X, c, leave_out)
    n = np.asarray(X.sum(axis=1)).ravel()
    return out / np.maximum(n, 1.0) ** POWER["p"]


def word_scores(self, requests):
    scores = _word_scores(self, requests)
    masked = self._as_masked(requests)
    X = self._vec.transform(self._texts(masked)[0]).tocsr()
    n = np.asarray(X.sum(axis=1)).ravel()
    return scores / np.maximum(n, 1.0)[:, None] ** POWER["p"]


scope_mod.ScopeDetector._family_scores = family_scores
scope_mod.ScopeDetector.word_scores = word_scores


def main() -> None:
    from sklearn.metrics import roc_auc_score
    ap = argparse.ArgumentParser()
    ap.add_argument("families", default="5")
    ap.add_argument("--powers", default="0,0.5,1")
    args = ap.parse_args()
    sets = {n: [r["request"] for r in rows(n)] for n in DEV_IN + DEV_OFF + TEST_IN + TEST_OFF}
    cats = np.array([r["category"] for r in rows(TEST_OFF[0])])

    def auc(i, o):
        i, o = np.nan_to_num(i, neginf=-1e9), np.nan_to_num(o, neginf=-1e9)
        return roc_auc_score(np.r_[np.ones(len(i)), np.zeros(len(o))], np.r_[i, o])

    for k in [int(x) for x in args.families.split(",")]:
        stream = build_builtin_stream(seed=0, train_per_family=200, test_per_family=50, families=k)
        for p in [float(x) for x in args.powers.split(",")]:
            POWER["p"] = p
            det = detector_for_stream(stream, reader="values")
            thr = det.threshold_
            S = {n: det.score(q).max(axis=1) for n, q in sets.items()}
            di = np.concatenate([S[n] for n in DEV_IN])
            do = np.concatenate([S[n] for n in DEV_OFF])
            ti, to = S[TEST_IN[0]], S[TEST_OFF[0]]
            short = S["paraphrase_builtin_short"]
            print(f"K={k} p={p:g}: AUC dev {auc(di, do):.3f} test {auc(ti, to):.3f} | dev kept {np.mean(di >= thr):.1%} "
                  f"refused {np.mean(do < thr):.1%} (short kept {np.mean(short >= thr):.0%}) | TEST kept "
                  f"{np.mean(ti >= thr):.1%} refused {np.mean(to < thr):.1%} near misses {np.mean(to[cats == 'near_miss'] < thr):.0%}",
                  flush=True)


if __name__ == "__main__":
    main()
