"""Route accuracy of the text routers over several independently drawn built-in streams.

One held-out set of 250 requests separates routers by a request or two, so a comparison on one seed says
little; this draws ``--seeds`` streams (each its own training and held-out requests), feeds every router
the training requests stage by stage in order O1, and prints the final route accuracy per seed with the
mean and standard deviation.

    .venv/bin/python scripts/route_seeds.py --seeds 5 --train-per-family 200 --test-per-family 50
"""
from __future__ import annotations

import argparse
import statistics

from skillbank.data.builtin import build_builtin_stream
from skillbank.experiments.routing import fit_stages
from skillbank.memory.address import make_selector
from skillbank.metrics import route_accuracy

ROUTERS = ("hashing-nb", "embed-lda-nb", "tfidf-logreg")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--train-per-family", type=int, default=200)
    ap.add_argument("--test-per-family", type=int, default=50)
    ap.add_argument("--order", default="O1")
    ap.add_argument("--routers", nargs="+", default=list(ROUTERS))
    args = ap.parse_args()

    scores: dict[str, list[float]] = {k: [] for k in args.routers}
    print(f"{'seed':>4s} " + " ".join(f"{k:>14s}" for k in args.routers), flush=True)
    for seed in range(args.seeds):
        stream = build_builtin_stream(seed=seed, train_per_family=args.train_per_family,
                                      test_per_family=args.test_per_family)
        held_out = [r for k in stream.family_keys for r in stream.test[k]]
        for kind in args.routers:
            router = fit_stages(make_selector(kind), stream, stream.order(args.order))
            routed = router.predict([r.request for r in held_out])
            scores[kind].append(100 * route_accuracy([r.family for r in held_out], routed))
        print(f"{seed:4d} " + " ".join(f"{scores[k][-1]:14.2f}" for k in args.routers), flush=True)
    print("mean " + " ".join(f"{statistics.mean(v):14.2f}" for v in scores.values()))
    print(" std " + " ".join(f"{statistics.pstdev(v):14.2f}" for v in scores.values()))
    wins = sum(a > b for a, b in zip(scores.get("embed-lda-nb", []), scores.get("hashing-nb", [])))
    if "embed-lda-nb" in scores and "hashing-nb" in scores:
        print(f"embed-lda-nb above hashing-nb on {wins} of {args.seeds} seeds")


if __name__ == "__main__":
    main()
