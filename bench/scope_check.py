"""Cost of the out-of-scope check per request, in one run: the word statistics alone against words plus the
sentence encoder (the default), as ``plan`` and the service call it, one request at a time and in batches.

Both detectors are fitted on the stream's training requests (what a bank learning it would hold); the
timed call is ``decision_function`` on held-out requests, from scratch each time (the encoder keeps no memo).
The encoder is loaded before timing: a process pays that once (reported separately).

    .venv/bin/python bench/scope_check.py                       # the built-in stream, built in memory
    .venv/bin/python bench/scope_check.py --stream runs/streams/builtin-200-50 --batch-sizes 1,16
"""
from __future__ import annotations

import argparse
import time

from skillbank.data.builtin import build_builtin_stream
from skillbank.data.stream import Stream
from skillbank.experiments.scope import detector_for_stream


def best_seconds(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stream", help="stream directory (default: the built-in stream, 200 / 50 per family)")
    ap.add_argument("--requests", type=int, default=64, help="held-out requests timed per batch size")
    ap.add_argument("--batch-sizes", default="1,16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the encoder")
    args = ap.parse_args()
    import torch
    torch.set_num_threads(args.threads)
    stream = Stream.load(args.stream) if args.stream else build_builtin_stream(seed=0, train_per_family=200,
                                                                               test_per_family=50)
    requests = [r.request for k in stream.family_keys for r in stream.test[k]][:args.requests]
    words = detector_for_stream(stream, encoder=None)
    start = time.perf_counter()
    from skillbank.memory.selectors.embedding import get_encoder
    get_encoder("minilm")
    load_s = time.perf_counter() - start
    both = detector_for_stream(stream)
    print(f"{len(stream.family_keys)} families, {len(requests)} requests, {args.threads} torch thread(s); "
          f"encoder load {load_s:.2f} s (once per process)")
    print("| batch | words alone (ms / request) | words + encoder (ms / request) | ratio |")
    print("|---|---|---|---|")
    for b in (int(x) for x in args.batch_sizes.split(",")):
        batches = [requests[i:i + b] for i in range(0, len(requests), b)]
        timed = [best_seconds(lambda: [det.decision_function(x) for x in batches], args.repeats) * 1000 / len(requests)
                 for det in (words, both)]
        print(f"| {b} | {timed[0]:.2f} | {timed[1]:.2f} | {timed[1] / timed[0]:.1f}x |")


if __name__ == "__main__":
    main()
