"""Generation throughput: free vs constrained decoding, at batch 1 and batch 16, plus the batching gain.

Held-out requests spread over the five shards of a trained bank are routed by its Address Memory and
generated (greedy, the bank's shards) in one run, after a warm-up:
  - batch 1 (each request alone, switching to its shard every time), free and constrained;
  - shard-grouped row batches of --batch-size (a finished row leaves, the next request takes its slot),
    free and constrained.
Prints output tokens/s of each and the ratios constrained/free (same batch size) and batched/batch-1
(same decoding), and the grammar costs: converting the tokenizer for the library once, compiling each
shard's grammar once (cached afterwards), and compiling one grammar over the whole 100-skill catalog and
one over a synthetic 300-skill family.

    .venv/bin/python bench/generate.py [--bank runs/demo/methods/fsm/bank] [--requests 64] [--batch-size 16]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from skillbank.data.builtin import build_builtin_stream
from skillbank.memory.bank import SkillBank
from skillbank.model.constrain import SkillSpec, build_grammar, grammar_cache
from skillbank.train.executor import common_prefix


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bank", type=Path, default=Path("runs/demo/methods/fsm/bank"))
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    args = ap.parse_args()
    if not (args.bank / "bank.json").is_file():
        sys.exit(f"{args.bank} is not a bank: run `make demo` first (it writes runs/demo/methods/fsm/bank) or pass --bank")

    bank = SkillBank.open(args.bank)
    stream = build_builtin_stream(seed=0)
    # Interleave the families so the requests spread evenly over the shards; take them from the end of
    # each held-out list, away from the demo's own evaluation cut.
    per_family = [[r.request for r in reversed(stream.test[k])] for k in bank.shard_names]
    requests = [per_family[i % len(per_family)][i // len(per_family)] for i in range(args.requests)]
    shards, _ = bank.route(requests)
    ex = bank.execution
    print(f"{len(requests)} requests over {len(set(shards))} shards, greedy, cap {args.max_new_tokens} tokens")

    # Grammar costs, paid once: the tokenizer for the library, then each shard's grammar.
    t0 = time.perf_counter()
    cache = grammar_cache(ex.base.peft, ex.base.tokenizer)
    print(f"grammar library: tokenizer converted in {time.perf_counter() - t0:.2f} s (once per base model)")
    for name in bank.shard_names:
        grammar = ex.grammar(name)
        cache.compile(grammar)
        print(f"  grammar of {name:28s} {len(grammar.skills):3d} skills, compiled once in "
              f"{1000 * cache.compile_seconds[grammar.digest]:6.1f} ms")
    ids = sorted(stream.catalog.skills)
    whole = build_grammar([SkillSpec(s, stream.catalog.skills[s].argument_names) for s in ids], "compact",
                          common_prefix(ids))
    cache.compile(whole)
    print(f"  grammar of the whole catalog    {len(ids):3d} skills, compiled once in "
          f"{1000 * cache.compile_seconds[whole.digest]:6.1f} ms")

    many = [SkillSpec(f"Synthetic::big::skill_{i:03d}", tuple(f"arg_{j}" for j in range(i % 5))) for i in range(300)]
    big = build_grammar(many, "compact", "Synthetic::big::")
    cache.compile(big)
    print(f"  grammar of a synthetic family  {len(many):3d} skills, compiled once in "
          f"{1000 * cache.compile_seconds[big.digest]:6.1f} ms")

    def timed(fn):
        before = ex.stats.generated_tokens
        t0 = time.perf_counter()
        fn()
        tokens = ex.stats.generated_tokens - before
        return tokens, time.perf_counter() - t0

    def one_at_a_time(constrain: bool):
        return timed(lambda: [ex.generate([r], [s], batch_size=1, max_new_tokens=args.max_new_tokens,
                                          constrain=constrain) for r, s in zip(requests, shards)])

    def batched(constrain: bool):
        return timed(lambda: ex.generate(requests, shards, batch_size=args.batch_size,
                                         max_new_tokens=args.max_new_tokens, constrain=constrain))

    ex.generate(requests[:8], shards[:8], batch_size=8, max_new_tokens=args.max_new_tokens)  # warm-up
    rows = {}
    for label, fn in (("batch 1, free", lambda: one_at_a_time(False)), ("batch 1, constrained", lambda: one_at_a_time(True)),
                      (f"batch {args.batch_size}, free", lambda: batched(False)),
                      (f"batch {args.batch_size}, constrained", lambda: batched(True))):
        tokens, seconds = fn()
        rows[label] = tokens / seconds
        print(f"  {label:24s} {tokens:6d} tokens in {seconds:7.1f} s = {tokens / seconds:7.1f} tokens/s")
    b1f, b1c, bnf, bnc = rows.values()
    print(f"constrained / free: batch 1 {b1c / b1f:.2f}x, batch {args.batch_size} {bnc / bnf:.2f}x")
    print(f"batched / batch 1: free {bnf / b1f:.2f}x, constrained {bnc / b1c:.2f}x")


if __name__ == "__main__":
    main()
