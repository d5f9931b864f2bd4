"""Mixed-shard batches: a 16-row decode step whose rows use 16 different shards vs a 16-row step of one shard.

On the embedded base, --shards fresh adapters of the small-CPU recipe (TrainConfig.for_small_cpu: r 16 on
q/k/v/o, random weights instead of PEFT's zero B) decode --rows rows together, one short generation per
configuration and round: prefill the prompts (whole: prefix reuse is off, as it would prefill a shard's first
prompt alone once per shard, a cost of the shard count that is not the LoRA's), then --new-tokens tokens per
row. Reported: the median 16-row decode step (RowBatch.step, every row alive) and the whole generation's time
(median over --rounds). Every configuration is measured in the same run and they take turns step by step, so
a busy moment of the machine falls on all of them alike.

Rows of several shards go through PEFT's per-adapter path (``lora="peft"``) and the gathered path
(``lora="gathered"``, skillbank.model.multi_lora); the baseline is every row on one shard (the plain one-adapter
forward). Stop tokens are ignored, so every configuration decodes the same number of tokens; the bench checks
that both paths pick the same tokens. Prints the table with ratios against the one-shard baseline. Before
decoding, it also times what a bounded bank (``max_resident``) pays per eviction: one shard removed and
another added, then the stack brought up to date, against stacking every shard again.

    .venv/bin/python bench/mixed_batch.py [--shards 16] [--rows 16] [--new-tokens 16] [--threads 1] [--rounds 3]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from skillbank.data.builtin import build_builtin_stream
from skillbank.model.base import BaseModelConfig, load_base
from skillbank.model.decode import RowBatch
from skillbank.model.multi_lora import StackedLoRA
from skillbank.model.prompts import render_prompt
from skillbank.train.executor import TrainConfig, add_lora


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=16, help="tokens per row in the short generation")
    ap.add_argument("--rounds", type=int, default=3, help="each configuration is measured once per round; medians")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: the ratios are the point, and one thread keeps them steady on a shared machine)")
    args = ap.parse_args()

    base = load_base(BaseModelConfig(threads=args.threads))
    cfg = TrainConfig.for_small_cpu()
    names = [f"shard{i:02d}" for i in range(args.shards)]
    g = torch.Generator().manual_seed(0)
    for i, name in enumerate(names):
        add_lora(base, name, cfg, seed=i)
        with torch.no_grad():  # PEFT starts B at zero; a trained shard has no zeros (the cost is the same)
            for module in base.peft.modules():
                if hasattr(module, "lora_B") and name in module.lora_B:
                    module.lora_B[name].weight.copy_(torch.randn(module.lora_B[name].weight.shape, generator=g) * 0.02)
    t0 = time.perf_counter()
    stack = base.stacked_lora()
    print(f"{base.identity['name']} base, {args.shards} shards (r {cfg.rank}, {'/'.join(cfg.target_modules)}), "
          f"{args.rows} rows, {torch.get_num_threads()} threads; stacking the shards: "
          f"{1000 * (time.perf_counter() - t0):.0f} ms, {stack.nbytes / 2**20:.0f} MiB")

    # A bank with max_resident shards evicts one and loads another between batches: the stack then copies the
    # new shard into the freed slot (sync) instead of stacking every shard again (what it did before).
    swap_sync, swap_build = [], []
    for i in range(5):
        gone, fresh = names.pop(0), f"swapped{i:02d}"
        base.remove_adapter(gone)
        add_lora(base, fresh, cfg, seed=100 + i)
        names.append(fresh)
        t = time.perf_counter()
        assert base.stacked_lora() is stack  # synced in place
        swap_sync.append(time.perf_counter() - t)
        t = time.perf_counter()
        StackedLoRA(base.peft)
        swap_build.append(time.perf_counter() - t)
    sync_ms, build_ms = 1000 * statistics.median(swap_sync), 1000 * statistics.median(swap_build)
    print(f"one shard evicted and another loaded, then a mixed batch: the stack syncs in {sync_ms:.1f} ms "
          f"(copies the new shard), stacking all {args.shards} again takes {build_ms:.1f} ms "
          f"({sync_ms / build_ms:.2f}x; median of 5)")

    stream = build_builtin_stream(seed=0)
    requests = [r.request for k in stream.family_keys for r in stream.test[k]][:args.rows]
    prompts = [render_prompt(base.tokenizer, r) for r in requests]
    lengths = [len(base.tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    print(f"prompts: {min(lengths)}-{max(lengths)} tokens (built-in stream's held-out requests)")

    def rows_of(k: int) -> list[str]:
        return [names[i % k] for i in range(args.rows)]

    configs = {"1 shard (baseline)": (rows_of(1), "gathered")}
    for k in sorted({min(5, args.shards), args.shards}):
        for path in ("peft", "gathered"):
            configs[f"{k} shards, {path}"] = (rows_of(k), path)

    def batch_of(adapters, path):
        batch = RowBatch(base.peft, base.tokenizer, base, lora=path, reuse_prefixes=False)
        batch.stops = set()  # every row decodes exactly --new-tokens tokens, whatever it writes
        batch.add(prompts, list(range(args.rows)), adapters, [args.new_tokens] * args.rows)
        return batch

    batch_of(*configs["1 shard (baseline)"]).step()  # warm-up: first-call allocations
    steps = {label: [] for label in configs}  # seconds of every decode step (all rows alive)
    gens = {label: [] for label in configs}  # seconds of each whole generation: prefill + every step
    tokens: dict[str, dict] = {}
    for _ in range(args.rounds):
        # The configurations take turns step by step, so a busy moment of the machine falls on all of them.
        batches, spent = {}, {}
        for label, (adapters, path) in configs.items():
            t = time.perf_counter()
            batches[label] = batch_of(adapters, path)
            spent[label] = time.perf_counter() - t
        done = {label: {} for label in configs}
        while any(b.rows for b in batches.values()):
            for label, batch in batches.items():
                if not batch.rows:
                    continue
                t = time.perf_counter()
                finished = batch.step()
                took = time.perf_counter() - t
                spent[label] += took
                if not finished:
                    steps[label].append(took)
                done[label].update((row.key, row.tokens) for row, _ in finished)
        for label in configs:
            gens[label].append(spent[label])
        tokens = done

    step0 = 1000 * statistics.median(steps["1 shard (baseline)"])
    gen0 = statistics.median(gens["1 shard (baseline)"])
    print(f"{'configuration':24s} {'decode step':>12s} {'ratio':>6s} {'generation':>11s} {'ratio':>6s}")
    for label in configs:
        s, gen = 1000 * statistics.median(steps[label]), statistics.median(gens[label])
        print(f"{label:24s} {s:9.1f} ms {s / step0:5.2f}x {gen:9.2f} s {gen / gen0:5.2f}x")
    for k in sorted({min(5, args.shards), args.shards}):
        same = tokens[f"{k} shards, peft"] == tokens[f"{k} shards, gathered"]
        print(f"{k} shards: gathered and PEFT paths picked {'the same' if same else 'DIFFERENT'} tokens "
              f"({args.rows} rows x {args.new_tokens})")


if __name__ == "__main__":
    main()
