"""Probe: two variants of the gate's word expert, each in training (leave-one-out) and plan-time scores alike,
so the threshold is recalibrated the same way. The expert adds, per word, log(lam p(w | family) / p_english(w) +
1 - lam): positive for the family's own words, down to log(1 - lam) = -0.69 for a common word it never saw.

- ``--powers``: the sum divided by n^p (n words read after masking): p = 0 is the gate, p = 1 the mean per word,
  p = 0.5 the scale of a sum of independent terms. The sum grows with length, so a three-word request ("play
  Bohemian Rhapsody") reaches a fraction of what long template requests score.
- ``--gammas``: the negative part of every word's contribution scaled by gamma (1: the gate; 0: words count only
  for a family, never against it). "play some jazz" has one family word (+1.41) and two it never saw (-0.19,
  -0.69).

    .venv/bin/python scripts/scope_word_variants.py 5,50 --powers 0,0.5,1
    .venv/bin/python scripts/scope_word_variants.py 5 --gammas 1,0.5,0.25,0

Prints per split and setting: AUC on the development / frozen test sets, kept / refused at the detector's own
threshold, short in-domain requests kept, near misses refused (bench/scope.py's gate_figures). Measured
2026-12-05, docs/scope.md: neither separates better; not adopted."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from scope import gate_figures  # noqa: E402

from skillbank.data.builtin import build_builtin_stream  # noqa: E402
from skillbank.experiments.scope import detector_for_stream  # noqa: E402
from skillbank.memory import scope as scope_mod  # noqa: E402

SETTING = {"power": 0.0, "gamma": 1.0}


def family_scores(self, X, c, leave_out=None, seen_any=None):
    """ScopeDetector._family_scores with the two variants applied to its per-word terms (the package keeps no knob
    for them). At plan time (``seen_any``: words any family uses) a word counts when some family uses it, as the
    gate's fast path has it."""
    out = np.full(X.shape[0], -np.inf)
    for i, cnt, word in self._word_terms(X, c, leave_out, known=seen_any):
        word = np.where(word < 0, SETTING["gamma"] * word, word)
        out[i] = float(cnt @ word) / max(float(cnt.sum()), 1.0) ** SETTING["power"]
    return out


def word_scores(self, requests):
    X = self._vec.transform(self._texts(self._as_masked(requests))[0]).tocsr()
    seen_any = np.asarray(self.counts_.sum(axis=0)).ravel() > 0
    return np.stack([family_scores(self, X, c, seen_any=seen_any) for c in range(len(self.classes_))], axis=1)


scope_mod.ScopeDetector._family_scores = family_scores
scope_mod.ScopeDetector.word_scores = word_scores


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("families", default="5")
    ap.add_argument("--powers", default="0")
    ap.add_argument("--gammas", default="1")
    args = ap.parse_args()
    for k in [int(x) for x in args.families.split(",")]:
        stream = build_builtin_stream(seed=0, train_per_family=200, test_per_family=50, families=k)
        for power in [float(x) for x in args.powers.split(",")]:
            for gamma in [float(x) for x in args.gammas.split(",")]:
                SETTING.update(power=power, gamma=gamma)
                det = detector_for_stream(stream, reader="values", outliers=None)
                print(f"K={k} p={power:g} gamma={gamma:g}: {gate_figures(det)}", flush=True)


if __name__ == "__main__":
    main()
