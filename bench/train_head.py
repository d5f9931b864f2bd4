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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=48, help="training records per round (batch 8: records/8 steps)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--family", default="t2_language_speech")
    args = ap.parse_args()

    import torch

    from skillbank.config import RunConfig, packaged_config
    from skillbank.data.builtin import build_builtin_stream
    from skillbank.model.base import load_base
    from skillbank.train import loop
    from skillbank.train.executor import add_lora, build_examples, common_prefix

    run = RunConfig.from_toml(packaged_config("demo"))
    cfg = run.train_config()
    base = load_base(run.base_config(), progress=False)
    stream = build_builtin_stream(seed=0, train_per_family=max(args.records, 8), test_per_family=1)
    records = stream.train[args.family][:args.records]
    prefix = common_prefix(sorted({t for r in records for t in r.graph.tasks}))
    examples, _ = build_examples(base, records, cfg, prefix)
    one_epoch = type(cfg)(**{**cfg.to_dict(), "epochs": 1})
    print(f"{len(examples)} examples, {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.2f}", flush=True)
    rates: dict[bool, list[float]] = {True: [], False: []}
    for r in range(args.rounds):
        for share in (False, True) if r % 2 == 0 else (True, False):
            loop.SHARE_PROMPT_HEAD = share
            name = f"head-{r}-{int(share)}"
            add_lora(base, name, one_epoch)
            result = loop.fit(base, examples, one_epoch, adapter=name, progress=False)
            base.remove_adapter(name)
            rate = result.total_tokens / result.wall_seconds
            rates[share].append(rate)
            print(f"round {r + 1} shared head {'on ' if share else 'off'}: {rate:6.1f} tokens/s, "
                  f"{result.wall_seconds:5.1f} s, first-step loss {result.loss_curve[0]:.5f}", flush=True)
    ratios = [a / b for a, b in zip(rates[True], rates[False])]
    print(f"shared head on / off: median {statistics.median(ratios):.2f}x (rounds: "
          f"{', '.join(f'{x:.2f}' for x in ratios)}); load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
