"""Probe: a new bank's router with other weights for its two experts. The embedding expert's covariance is shrunk
by ``prior_strength`` pseudo-observations (3000 in new banks), the lexical Naive Bayes is added with
``lexical_weight`` (1); this refits the router on the built-in stream (as bench/scope.py does) and rescores the same
embeddings and word likelihoods under each pair, printing route accuracy on held-out templates / hand-written
development / frozen test requests (the last printed, never chosen on). "words" is the lexical expert alone.

    .venv/bin/python scripts/route_weights.py [--families 5,20,50]

2026-12-06 (this CPU, 32 s; results/route-variants/weights.txt): the shipped pair (3000, 1) is the best on the development sets at K = 5, 20 and 50
or within a request of it (K = 5: 94.8%; the embedding alone 84.3%, the words alone 88.7%; more shrinkage loses
at every K): the router's gap on hand-written requests is not a matter of its weights. With --diagonal, the pooled
scatter cut to its diagonal (prior 3000, words weight 1) routes 95.6 / 79.1% of the K = 5 templates / development
requests against 99.2 / 94.8%: the router needs the full matrix, which is why each family keeps its own."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import route_variants as rv  # noqa: E402  (the router fitted as bench/scope.py fits it, and the evaluation sets)

PRIORS = (100, 300, 1000, 3000, 10000, 30000, 100000)
LEXICAL = (0.0, 0.3, 0.5, 1.0, 2.0, 3.0, None)  # None: the words alone


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default="5,20,50")
    ap.add_argument("--diagonal", action="store_true", help="also with the pooled scatter cut to its diagonal (what a "
                    "router keeping d numbers a family instead of a d x d matrix would have)")
    args = ap.parse_args()
    from skillbank.data.builtin import build_builtin_stream
    for k in [int(x) for x in args.families.split(",")]:
        stream = build_builtin_stream(seed=0, train_per_family=200, test_per_family=50, families=k)
        router = rv.fit(rv.make_router("default"), stream, "default")
        parts = {}
        for name, pairs in rv.builtin_sets(stream).items():
            texts = router.read([q for q, _ in pairs])
            jll = router.nb_.joint_log_likelihood(texts)
            parts[name] = (router.embed(texts), jll - jll.max(axis=1, keepdims=True),
                           np.array([router.classes_.index(f) for _, f in pairs]))
        full = router.stats_.scatter_.copy()
        for prior, scatter in [(p, "full") for p in PRIORS] + ([(3000, "diagonal")] if args.diagonal else []):
            stats = router.stats_
            stats.scatter_ = full if scatter == "full" else np.diag(np.diag(full))
            stats.prior_strength, stats._precision, stats._mean_terms = float(prior), None, None  # rescored, not refit
            for weight in LEXICAL:
                acc = []
                for name in ("templates", "dev", "test"):
                    E, jll, gold = parts[name]
                    scores = jll if weight is None else stats.log_scores(E) + weight * jll
                    acc.append(np.mean(scores.argmax(axis=1) == gold))
                label = "words" if weight is None else f"{weight:g}"
                print(f"K={k} {scatter} prior {prior:>6} lexical {label:>5}: templates {acc[0]:.1%} dev {acc[1]:.1%} "
                      f"test {acc[2]:.1%}", flush=True)


if __name__ == "__main__":
    main()
