"""Training with the shared prompt head run once per batch vs once per row, on the embedded base.

Every training example starts with the same prompt head (the system instruction and chat markup: 30 of the
built-in stream's ~119 tokens a row). ``skillbank.train.loop`` runs it once per batch and lets the rows attend to
its keys and values (``SHARE_PROMPT_HEAD``); this times ``fit`` both ways with the demo's recipe (rank 64 on the
attention projections, batch 8, bf16 autocast where the CPU has it) on built-in training records, the two
settings alternating round by round so that a drift of the host's speed hits both, and prints tokens/s and the
ratio per round. The losses of the two are printed too: the same to float rounding at the first step.

    .venv/bin/python bench/train_head.py [--records 48] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import statistics


def built_in_examples(base, cfg, family: str, n: int) -> list:
    """The first ``n`` built-in training records of ``family`` as training examples of recipe ``cfg``."""
    from skillbank.data.builtin import build_builtin_stream
    from skillbank.train.executor import build_examples, common_prefix

    stream = build_builtin_stream(seed=0, train_per_family=max(n, 8), test_per_family=1)
    records = stream.train[family][:n]
    prefix = common_prefix(sorted({t for r in records for t in r.graph.tasks}))
    return build_examples(base, records, cfg, prefix)[0]


def timed_epoch(base, examples, cfg, name: str):
    """One epoch of ``fit`` on a fresh adapter ``name`` (removed after): (tokens/s, the FitResult)."""
    import dataclasses

    from skillbank.train import loop
    from skillbank.train.executor import add_lora

    one_epoch = dataclasses.replace(cfg, epochs=1)
    add_lora(base, name, one_epoch)
    result = loop.fit(base, examples, one_epoch, adapter=name, progress=False)
    base.remove_adapter(name)
    return result.total_tokens / result.wall_seconds, result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=48, help="training records per round (batch 8: records/8 steps)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--family", default="t2_language_speech")
    args = ap.parse_args()

    import torch

    from skillbank.config import RunConfig, packaged_config
    from skillbank.model.base import load_base
    from skillbank.train import loop

    run = RunConfig.from_toml(packaged_config("demo"))
    cfg = run.train_config()
    base = load_base(run.base_config(), progress=False)
    examples = built_in_examples(base, cfg, args.family, args.records)
    print(f"{len(examples)} examples, {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.2f}", flush=True)
    rates: dict[bool, list[float]] = {True: [], False: []}
    for r in range(args.rounds):
        for share in (False, True) if r % 2 == 0 else (True, False):
            loop.SHARE_PROMPT_HEAD = share
            rate, result = timed_epoch(base, examples, cfg, f"head-{r}-{int(share)}")
            rates[share].append(rate)
            print(f"round {r + 1} shared head {'on ' if share else 'off'}: {rate:6.1f} tokens/s, "
                  f"{result.wall_seconds:5.1f} s, first-step loss {result.loss_curve[0]:.5f}", flush=True)
    ratios = [a / b for a, b in zip(rates[True], rates[False])]
    print(f"shared head on / off: median {statistics.median(ratios):.2f}x (rounds: "
          f"{', '.join(f'{x:.2f}' for x in ratios)}); load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
