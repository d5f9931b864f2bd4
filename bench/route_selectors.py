"""Routing cost per request of every selector, in one run: requests/second of ``predict``, and the ratio to
FSM's Address Memory (hashing + NB).

Text-only selectors are fitted stage by stage on the stream's training requests and time ``predict`` on
a batch drawn from its held-out requests. With ``--bank`` (a trained bank, e.g. runs/demo/methods/fsm/bank, and the
stream it was trained on), the model-based selectors are measured too, on ``--model-requests`` requests:
EPI (one frozen-base forward pass per request), AdapterCL (one forward pass per shard), Self-route (one
full generation per shard). No memo or output cache is used: every request is routed from scratch.

    .venv/bin/python bench/route_selectors.py                            # text-only, built-in stream
    .venv/bin/python bench/route_selectors.py --bank runs/demo/methods/fsm/bank --stream streams/demo --model-requests 16
"""
from __future__ import annotations

import argparse
import random
import sys
import time

from skillbank.experiments.routing import fit_stages
from skillbank.memory.address import make_selector

TEXT = (("hashing-nb", "FSM Address (hashing+NB)"), ("tfidf-logreg", "offline TF-IDF+LR"),
        ("embed-lda-nb", "ours: MiniLM LDA + hashing NB"))
MODEL = (("epi", "EPI (base hidden states)"), ("adaptercl", "AdapterCL (request perplexity)"),
         ("self-route", "Self-route (every shard generates)"))


def rate(fn, n: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return n / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stream", help="stream directory (default: the built-in stream, built in memory)")
    ap.add_argument("--bank", help="a trained bank: also measure EPI, AdapterCL and Self-route")
    ap.add_argument("--requests", type=int, default=10_000, help="batch for the lexical selectors")
    ap.add_argument("--embed-requests", type=int, default=1_000, help="batch for the embedding router")
    ap.add_argument("--model-requests", type=int, default=16, help="batch for the model-based selectors")
    ap.add_argument("--max-new-tokens", type=int, default=256, help="Self-route's generation cap")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    if args.stream:
        from skillbank.data.stream import Stream
        stream = Stream.load(args.stream)
    else:
        from skillbank.data.builtin import build_builtin_stream
        stream = build_builtin_stream(seed=0)
    pool = [r.request for k in stream.family_keys for r in stream.test[k]]
    rng = random.Random(0)
    batch = [rng.choice(pool) for _ in range(args.requests)]

    kinds: list[tuple[str, str, dict, int, int]] = [
        (k, label, {}, args.embed_requests if k == "embed-lda-nb" else args.requests,
         1 if k == "embed-lda-nb" else args.repeats) for k, label in TEXT]
    if args.bank:
        from skillbank.memory.bank import SkillBank
        bank = SkillBank.open(args.bank)
        ctx = {"epi": {"base": bank.execution.base}, "adaptercl": {"execution": bank.execution},
               "self-route": {"execution": bank.execution, "max_new_tokens": args.max_new_tokens, "batch_size": 16}}
        kinds += [(k, label, ctx[k], args.model_requests, 1) for k, label in MODEL]

    rates = {}
    for kind, label, ctx, n, repeats in kinds:
        sel = fit_stages(make_selector(kind, **ctx), stream, stream.family_keys)  # stage by stage, as in the stream
        sel.predict(batch[:2])  # warm-up (loads encoders, first kernels)
        if kind == "self-route":  # its output cache would otherwise answer the measured requests from memory
            sel.clear_outputs()
        rates[label] = rate(lambda: sel.predict(batch[:n]), n, repeats)
        print(f"  measured {label}: {rates[label]:,.2f} requests/s on {n}", file=sys.stderr, flush=True)

    ref = rates["FSM Address (hashing+NB)"]
    print(f"routing cost, {stream.name} stream, {len(stream.family_keys)} shards (best of {args.repeats} for the "
          f"lexical selectors, one pass otherwise)")
    print(f"  {'selector':40s} {'requests/s':>14s} {'ms/request':>11s} {'vs hashing+NB':>14s}")
    for label, r in rates.items():
        print(f"  {label:40s} {r:14,.2f} {1000 / r:11.3f} {r / ref:13.5f}x")


if __name__ == "__main__":
    main()
