"""Generation throughput: shard-grouped batched generation vs the same requests one at a time.

64 held-out requests spread over the five shards of a trained bank are routed by its Address Memory and
generated (greedy, the bank's shards) twice in one run:
  - grouped: requests grouped by routed shard, each shard activated once, row batches of --batch-size
    (a finished row leaves and the next request takes its slot);
  - one at a time: each request alone (batch 1), switching to its shard every time (the baseline).
Prints output tokens/s for both and the ratio, and checks both produced the same texts.

    .venv/bin/python bench/generate.py [--bank runs/demo/bank] [--requests 64] [--batch-size 16]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from skillbank.data.builtin import build_builtin_stream
from skillbank.memory.bank import SkillBank


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bank", type=Path, default=Path("runs/demo/bank"))
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    args = ap.parse_args()
    if not (args.bank / "bank.json").is_file():
        sys.exit(f"{args.bank} is not a bank: run `make demo` first (it writes runs/demo/bank) or pass --bank")

    bank = SkillBank.open(args.bank)
    stream = build_builtin_stream(seed=0)
    # Interleave the families so the requests spread evenly over the shards; take them from the end of
    # each held-out list, away from the demo's own evaluation cut.
    per_family = [[r.request for r in reversed(stream.test[k])] for k in bank.shard_names]
    requests = [per_family[i % len(per_family)][i // len(per_family)] for i in range(args.requests)]
    shards, _ = bank.route(requests)
    ex = bank.execution
    print(f"{len(requests)} requests over {len(set(shards))} shards, greedy, cap {args.max_new_tokens} tokens")

    def timed(fn):
        before = ex.stats.generated_tokens
        t0 = time.perf_counter()
        outs = fn()
        return outs, ex.stats.generated_tokens - before, time.perf_counter() - t0

    grouped, g_tok, g_s = timed(lambda: ex.generate(requests, shards, batch_size=args.batch_size,
                                                    max_new_tokens=args.max_new_tokens))
    single, s_tok, s_s = timed(lambda: [ex.generate([r], [s], batch_size=1, max_new_tokens=args.max_new_tokens)[0]
                                        for r, s in zip(requests, shards)])
    same = sum(a.text == b.text for a, b in zip(grouped, single))
    print(f"  one at a time (baseline)  {s_tok:6d} tokens in {s_s:7.1f} s = {s_tok / s_s:7.1f} tokens/s")
    print(f"  shard-grouped, batch {args.batch_size:<3d} {g_tok:6d} tokens in {g_s:7.1f} s = {g_tok / g_s:7.1f} tokens/s")
    print(f"  ratio {g_tok / g_s / (s_tok / s_s):.2f}x; identical outputs {same}/{len(requests)}")


if __name__ == "__main__":
    main()
