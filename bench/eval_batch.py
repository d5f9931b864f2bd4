"""Evaluation batch size: the runner's constrained greedy evaluation at several ``[eval] batch_size`` values.

One trained adapter (a run's stage state, e.g. ``runs/compare-cpu/methods/sft/O1/stage-02/state/seq``) answers
--requests held-out requests of the built-in stream's first --families families, closed-book, each constrained
to a grammar over those families' skills (what a sequential method's evaluation after stage --families does),
with :func:`skillbank.model.generate.generate` at each batch size in turn, after a short warm-up. Prints output
tokens/s of each, the ratio against the first batch size, and how many outputs differ from the first batch
size's: greedy decoding with masked padding should not depend on the batch, so the batch size is a speed
setting (outside a run's identity, like the thread count) only while that count stays 0.

On a small CPU a decode step of a 135M model reads every weight once whatever the number of rows, so more rows
per step cost little more; with few prompts, the batch drains at the end (rows leave as they stop) and the gain
shrinks, so pass a --requests like the evaluation's (50 per family and variant on the built-in stream).

    .venv/bin/python bench/eval_batch.py --adapter RUN/methods/sft/O1/stage-02/state/seq \\
        [--config configs/compare.toml] [--requests 192] [--families 4] [--batch-sizes 16,32] [--threads 1]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from skillbank.config import RunConfig
from skillbank.data.builtin import build_builtin_stream
from skillbank.model.base import load_base
from skillbank.model.constrain import SkillSpec, build_grammar
from skillbank.model.generate import generate
from skillbank.model.prompts import render_prompt
from skillbank.train.executor import common_prefix


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--adapter", type=Path, required=True, help="a saved LoRA adapter directory of the config's base")
    ap.add_argument("--config", type=Path, default=Path("configs/compare.toml"))
    ap.add_argument("--requests", type=int, default=192)
    ap.add_argument("--families", type=int, default=4, help="requests and grammar from the first N families")
    ap.add_argument("--batch-sizes", default="16,32")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if not (args.adapter / "adapter_config.json").is_file():
        sys.exit(f"{args.adapter} is not a saved adapter (no adapter_config.json)")
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    torch.set_num_threads(args.threads)

    cfg = RunConfig.from_toml(args.config)
    base = load_base(cfg.base_config())
    base.load_adapter("bench", args.adapter)
    base.activate(["bench"])
    stream = build_builtin_stream(seed=cfg.stream.seed)
    families = stream.family_keys[:args.families]
    records = [r for k in families for r in stream.test[k]][:args.requests]
    skills = sorted(s for s in stream.catalog.skills if stream.catalog.family_of(s) in families)
    grammar = build_grammar([SkillSpec(s, stream.catalog.skills[s].argument_names) for s in skills], "compact",
                            common_prefix(sorted(stream.catalog.skills)))
    system = cfg.train_config().system_prompt
    prompts = [render_prompt(base.tokenizer, r.request, system) for r in records]
    print(f"{len(prompts)} requests of {len(families)} families, {len(skills)} skills in the grammar, greedy, "
          f"cap {cfg.eval.max_new_tokens} tokens, {args.threads} thread(s)")

    def run(batch_size: int, items: list[str]):
        return generate(base.peft, base.tokenizer, items, batch_size=batch_size,
                        max_new_tokens=cfg.eval.max_new_tokens, grammars=[grammar] * len(items))

    run(sizes[0], prompts[:2])  # warm-up: grammar compilation and first-call allocations
    texts, rates = {}, {}
    for size in sizes:
        t0 = time.perf_counter()
        out = run(size, prompts)
        seconds = time.perf_counter() - t0
        tokens = sum(o.n_tokens for o in out)
        texts[size], rates[size] = [o.text for o in out], tokens / seconds
        print(f"batch {size:>3}: {tokens} tokens in {seconds:.1f} s, {rates[size]:.1f} tok/s", flush=True)
    first = sizes[0]
    print(f"\n{'batch':>5}  {'tok/s':>7}  {'vs ' + str(first):>7}  outputs differing from batch {first}")
    for size in sizes:
        differ = sum(a != b for a, b in zip(texts[first], texts[size]))
        print(f"{size:>5}  {rates[size]:>7.1f}  {rates[size] / rates[first]:>6.2f}x  {differ} of {len(prompts)}")


if __name__ == "__main__":
    main()
