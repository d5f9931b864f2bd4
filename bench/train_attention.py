"""Training with each way of computing attention, on the embedded base: torch's fused kernel as autocast gives it
(``sdpa``, bfloat16 on a CPU with native bf16), the same kernel in float32 inside the bfloat16 step (``sdpa-fp32``)
and transformers' eager attention (matrix products and a softmax, ``eager``).

``TrainConfig.attention = "auto"`` trains with eager attention on a CPU; this is the measurement behind that choice.
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
    kernels = ("sdpa", "sdpa-fp32", "eager")
    rates: dict[str, list[float]] = {k: [] for k in kernels}
    for r in range(args.rounds):
        for kernel in kernels if r % 2 == 0 else kernels[::-1]:
            one_epoch = dataclasses.replace(cfg, epochs=1, attention=kernel)
            name = f"attn-{r}-{kernel}"
            add_lora(base, name, one_epoch)
            result = loop.fit(base, examples, one_epoch, adapter=name, progress=False)
            base.remove_adapter(name)
            rate = result.total_tokens / result.wall_seconds
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
