"""Routing throughput: requests/second of `predict` on a batch of 10,000 requests.

Measures FSM's replay-free Address Memory (hashing + incremental NB) against the offline reference
(TF-IDF + logistic regression) in the same run, both fitted on the five families of the built-in stream.

    .venv/bin/python bench/route.py [--requests 10000] [--repeats 3]
"""
from __future__ import annotations

import argparse
import random
import time

from skillbank.data.builtin import build_builtin_stream
from skillbank.memory.address import HashingNBAddress, TfidfLogRegAddress


def best_rate(fn, n: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return n / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    stream = build_builtin_stream(seed=0)
    pool = [r.request for k in stream.family_keys for r in stream.test[k]]
    rng = random.Random(0)
    batch = [rng.choice(pool) for _ in range(args.requests)]

    rates = {}
    for name, selector in (("offline TF-IDF+LR (baseline)", TfidfLogRegAddress()),
                           ("address hashing+NB", HashingNBAddress())):
        for key in stream.family_keys:  # stage by stage, as in the continual stream
            selector.partial_fit([r.request for r in stream.train[key]], key)
        selector.predict(batch[:100])  # warm-up
        rates[name] = best_rate(lambda: selector.predict(batch), len(batch), args.repeats)

    base = rates["offline TF-IDF+LR (baseline)"]
    print(f"routing throughput, batch of {len(batch)} requests, best of {args.repeats}")
    for name, rate in rates.items():
        print(f"  {name:32s} {rate:12,.0f} requests/s   ratio vs baseline {rate / base:5.2f}x")


if __name__ == "__main__":
    main()
