"""Training with torch's fused attention kernel (sdpa) vs transformers' eager attention, on the embedded base.

``TrainConfig.attention = "auto"`` trains with eager attention on a CPU; this is the measurement behind that
choice. It times one epoch of ``fit`` with the demo's recipe (rank 64 on the attention projections, batch 8,
the shared prompt head, bf16 autocast where the CPU has it) on built-in training records both ways, the two
kernels alternating round by round so that a drift of the host's speed hits both, and prints tokens/s per round,
the ratio eager / sdpa, and each round's first-step and last-epoch loss (the same computation to rounding).

    .venv/bin/python bench/train_attention.py [--records 96] [--rounds 3] [--precision fp32]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=96, help="training records per round (batch 8: records/8 steps)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--family", default="t1_daily_life")
    ap.add_argument("--precision", choices=["auto", "fp32"], default="auto",
                    help="fp32: float32 weights and arithmetic (the comparison configs'), instead of the demo's")
    args = ap.parse_args()

    import torch

    from skillbank.config import RunConfig, packaged_config
    from skillbank.data.builtin import build_builtin_stream
    from skillbank.model.base import load_base
    from skillbank.train import loop
    from skillbank.train.executor import add_lora, build_examples, common_prefix

    run = RunConfig.from_toml(packaged_config("demo"))
    cfg, base_cfg = run.train_config(), run.base_config()
    if args.precision == "fp32":
        cfg, base_cfg = dataclasses.replace(cfg, precision="fp32"), dataclasses.replace(base_cfg, dtype="float32")
    base = load_base(base_cfg, progress=False)
    stream = build_builtin_stream(seed=0, train_per_family=max(args.records, 8), test_per_family=1)
    records = stream.train[args.family][:args.records]
    prefix = common_prefix(sorted({t for r in records for t in r.graph.tasks}))
    examples, _ = build_examples(base, records, cfg, prefix)
    device = next(base.model.parameters()).device
    print(f"{len(examples)} examples of {args.family}, {torch.get_num_threads()} threads, weights "
          f"{next(base.model.parameters()).dtype}, precision {loop.resolve_precision(cfg.precision, device)}, "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    rates: dict[str, list[float]] = {"sdpa": [], "eager": []}
    for r in range(args.rounds):
        for kernel in ("sdpa", "eager") if r % 2 == 0 else ("eager", "sdpa"):
            one_epoch = dataclasses.replace(cfg, epochs=1, attention=kernel)
            name = f"attn-{r}-{kernel}"
            add_lora(base, name, one_epoch)
            result = loop.fit(base, examples, one_epoch, adapter=name, progress=False)
            base.remove_adapter(name)
            rate = result.total_tokens / result.wall_seconds
            rates[kernel].append(rate)
            print(f"round {r + 1} {kernel:5s}: {rate:6.1f} tokens/s, {result.wall_seconds:5.1f} s, first-step loss "
                  f"{result.loss_curve[0]:.5f}, epoch loss {result.final_loss:.4f}", flush=True)
    ratios = [e / s for e, s in zip(rates["eager"], rates["sdpa"])]
    print(f"eager / sdpa: median {statistics.median(ratios):.2f}x (rounds: {', '.join(f'{x:.2f}' for x in ratios)}); "
          f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
