"""Training with each way of computing attention, on the embedded base: torch's fused kernel as autocast gives it
(``sdpa``, bfloat16 on a CPU with native bf16), the same kernel in float32 inside the bfloat16 step (``sdpa-fp32``)
and transformers' eager attention (matrix products and a softmax, ``eager``).

``TrainConfig.attention = "auto"`` trains with sdpa-fp32 on a CPU; with the demo runs of docs/lab-notebook.md this
is the measurement behind that choice.
It times one epoch of ``fit`` with the demo's recipe (rank 64 on the attention projections, batch 8, the shared
prompt head, bf16 autocast where the CPU has it) on built-in training records each way, the order reversed round
by round so that a drift of the host's speed hits all alike, and prints tokens/s per round, the ratios to sdpa,
and each round's first-step and last-epoch loss (how far each computation is from the others).

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

    from train_head import built_in_examples, timed_epoch

    from skillbank.config import RunConfig, packaged_config
    from skillbank.model.base import load_base
    from skillbank.train import loop

    run = RunConfig.from_toml(packaged_config("demo"))
    cfg, base_cfg = run.train_config(), run.base_config()
    if args.precision == "fp32":
        cfg, base_cfg = dataclasses.replace(cfg, precision="fp32"), dataclasses.replace(base_cfg, dtype="float32")
    base = load_base(base_cfg, progress=False)
    examples = built_in_examples(base, cfg, args.family, args.records)
    device = next(base.model.parameters()).device
    print(f"{len(examples)} examples of {args.family}, {torch.get_num_threads()} threads, weights "
          f"{next(base.model.parameters()).dtype}, precision {loop.resolve_precision(cfg.precision, device)}, "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    kernels = ("sdpa", "sdpa-fp32", "eager")
    rates: dict[str, list[float]] = {k: [] for k in kernels}
    for r in range(args.rounds):
        for kernel in kernels if r % 2 == 0 else kernels[::-1]:
            rate, result = timed_epoch(base, examples, dataclasses.replace(cfg, attention=kernel), f"attn-{r}-{kernel}")
            rates[kernel].append(rate)
            print(f"round {r + 1} {kernel:9s}: {rate:6.1f} tokens/s, {result.wall_seconds:5.1f} s, first-step loss "
                  f"{result.loss_curve[0]:.5f}, epoch loss {result.final_loss:.4f}", flush=True)
    for kernel in kernels[1:]:
        ratios = [a / b for a, b in zip(rates[kernel], rates["sdpa"])]
        print(f"{kernel} / sdpa: median {statistics.median(ratios):.2f}x (rounds: "
              f"{', '.join(f'{x:.2f}' for x in ratios)})")
    print(f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
