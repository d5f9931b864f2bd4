"""Does where a shard started change what a plan costs per token? Fresh vs merged-start shards of one bank.

A bank's first family always starts fresh (there is nothing to start from); with the default merged start every
later one starts from its nearest shards' updates. Each is one LoRA of the same rank and modules, which the llama.cpp
engine merges into the base, so the cost of a decoded token should not depend on the start. This measures it: every
shard of the bank decodes the same prompts (hand-written requests under its own instruction) for exactly
``--tokens`` tokens each, no grammar and no stop token, so every shard does the same work; at batch 1 and at batch 16,
the shards taken in turn within each round, each round starting at the next shard, so a host whose
speed drifts slows all alike and none is always first. Printed: tokens/s of each
shard (median round) and its ratio to the fresh-started shard's.

    .venv/bin/python bench/start_decode_cost.py --bank runs/demo-engine/methods/fsm/bank --threads 2 \\
        [--json results/init/start-decode-cost.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from latency import bank_requests  # noqa: E402  (bench/latency.py: the bank's hand-written requests)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bank", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32, help="tokens each request decodes")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reverse-load", action="store_true",
                    help="load the shards last to first (tells a load-order effect from a start effect)")
    ap.add_argument("--json")
    args = ap.parse_args()

    from skillbank.memory.bank import SkillBank
    from skillbank.memory.execution_llamacpp import LlamaCppExecution
    from skillbank.model.prompts import prompt_ids

    bank = SkillBank.open(args.bank, engine="llama.cpp", threads=args.threads)
    requests = bank_requests(Path(args.bank))[:args.requests]
    shards = {e.name: e for e in bank.manifest.shards}
    starts = {name: (e.lineage or {}).get("init", "fresh") for name, e in shards.items()}
    if "fresh" not in starts.values():
        raise SystemExit(f"{args.bank}: no shard started fresh; nothing to compare against")
    engine = bank.engine
    if not isinstance(engine, LlamaCppExecution):
        raise SystemExit(f"{args.bank}: the llama.cpp engine cannot serve this bank here")
    rows = {name: [prompt_ids(engine.tokenizer, r, e.system_prompt) for r in requests] for name, e in shards.items()}
    rows["(the base, no shard)"] = rows[next(iter(shards))]
    load_order = list(shards)[::-1] if args.reverse_load else list(shards)
    decoders = {name: engine.decoder_for(name) for name in load_order}  # loaded in this order
    decoders = {name: decoders[name] for name in shards}
    decoders["(the base, no shard)"] = (engine.base, None)  # the bare re-encoded base: what no update costs
    starts["(the base, no shard)"] = "none"
    timed: dict[tuple[str, int], list[float]] = {}
    for width in (1, 16):
        for name, (decoder, adapter) in decoders.items():  # one untimed pass each: pages mapped, caches warm
            decoder.decode_many(rows[name][:2], adapter, 4, set(), width=min(width, 2))
        names = list(decoders)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:  # each shard first in some round
                decoder, adapter = decoders[name]
                t0 = time.perf_counter()
                steps = decoder.decode_many(rows[name], adapter, args.tokens, set(), width=width)
                wall = time.perf_counter() - t0
                n = sum(len(s.tokens) for s in steps)
                if n != args.tokens * len(rows[name]):
                    raise SystemExit(f"{name}: wrote {n} tokens, not {args.tokens * len(rows[name])}")
                timed.setdefault((name, width), []).append(n / wall)
    fresh = [n for n, s in starts.items() if s == "fresh"]
    report = {"bank": args.bank, "threads": args.threads, "tokens": args.tokens, "requests": len(requests),
              "rounds": args.rounds, "shards": {}}
    print(f"{len(requests)} requests x {args.tokens} tokens, {args.rounds} rounds, {args.threads} threads")
    for width in (1, 16):
        ref = statistics.median(statistics.median(timed[(n, width)]) for n in fresh)
        print(f"batch {width}: fresh-started shard(s) {ref:.1f} tokens/s")
        for name in decoders:
            tps = statistics.median(timed[(name, width)])
            report["shards"].setdefault(name, {"start": starts[name]})[f"batch{width}"] = {
                "tokens_per_s": round(tps, 1), "rounds": [round(x, 1) for x in timed[(name, width)]],
                "vs_fresh": round(tps / ref, 3)}
            print(f"  {name:<32} {starts[name]:<7} {tps:7.1f} tokens/s  {tps / ref:.3f}x fresh")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
