"""How much of this CPU's float32 peak a training step uses, and what each training speed-up changes.

The peak is measured, not looked up: torch's float32 matrix product at the shapes a training step of the embedded
base multiplies (tokens x 576 by 576 x 1536, and the rest), on the same threads, median of 20 repeats - the rate
torch's kernels (oneDNN / MKL) reach here, which the frozen base's matrix products cannot beat. Printed beside it:
the theoretical peak from the CPU's clock and its SIMD width (AVX-512: 32 float32 multiply-adds a cycle and
core with two FMA units, AVX2: 16), where /proc/cpuinfo gives the clock.

A step's floating-point work is counted by torch's own FlopCounterMode over one batch, forward and backward, so
the rate is (counted FLOPs x steps) / time. Then one epoch of ``fit`` with the demo's recipe (rank 64 on the
attention projections, batch 8, compact targets) on built-in records is timed in each variant, the variants
alternating round by round so a drift of the host's speed hits all alike:

- ``fp32``: the recipe as it trains on a CPU without fast bfloat16;
- ``fp32-1t``: the same on one thread (what a demo whose thread count was fixed from one busy sample got).

    .venv/bin/python bench/train_flops.py [--records 48] [--rounds 3] [--threads 2]
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import time
from pathlib import Path


def simd_flops_per_cycle() -> tuple[int, str]:
    """float32 FLOPs a core can issue a cycle (two FMA units), from the CPU flags, and which extension."""
    try:
        flags = re.search(r"^flags\s*:(.*)$", Path("/proc/cpuinfo").read_text(), re.M).group(1).split()
    except (OSError, AttributeError):
        return 0, "unknown"
    if "avx512f" in flags:
        return 64, "AVX-512 (2 x 16-wide FMA)"
    if "avx2" in flags and "fma" in flags:
        return 32, "AVX2 (2 x 8-wide FMA)"
    return 8, "SSE"


def clock_ghz() -> float | None:
    try:
        mhz = [float(m) for m in re.findall(r"^cpu MHz\s*:\s*([\d.]+)", Path("/proc/cpuinfo").read_text(), re.M)]
    except OSError:
        return None
    return max(mhz) / 1000 if mhz else None


def matmul_peak(threads: int, tokens: int = 1024) -> float:
    """GFLOP/s of torch's float32 matrix products at a training step's shapes (the median over shapes)."""
    import torch

    torch.set_num_threads(threads)
    rates = []
    for m, k, n in ((tokens, 576, 1536), (tokens, 1536, 576), (tokens, 576, 576), (tokens, 576, 192)):
        a, w = torch.randn(m, k), torch.randn(n, k)
        a @ w.t()
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            a @ w.t()
            times.append(time.perf_counter() - t0)
        rates.append(2 * m * k * n / statistics.median(times) / 1e9)
    return statistics.median(rates)


def step_flops(base, examples, cfg) -> float:
    """FLOPs of one forward and backward pass over the first batch of ``examples`` (torch's FlopCounterMode)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from skillbank.train.executor import add_lora
    from skillbank.train.loop import SHARE_PROMPT_HEAD, collate, target_logits

    add_lora(base, "flops", cfg)
    lm = base.activate("flops")
    for name, p in lm.named_parameters():
        p.requires_grad_("lora_" in name and ".flops." in name)
    batch = collate(examples[:cfg.batch_size], base.tokenizer.pad_token_id)
    with FlopCounterMode(display=False) as counter:
        logits, labels = target_logits(lm, batch, share_head=SHARE_PROMPT_HEAD and cfg.dropout == 0)
        torch.nn.functional.cross_entropy(logits.float(), labels).backward()
    tokens = int(batch["attention_mask"].sum())
    base.remove_adapter("flops")
    return counter.get_total_flops() / tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=48, help="training records per round (batch 8: records/8 steps)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="default: what a command not told uses")
    ap.add_argument("--family", default="t1_daily_life")
    args = ap.parse_args()

    import dataclasses

    import torch
    from train_head import built_in_examples, timed_epoch

    from skillbank.config import RunConfig, packaged_config
    from skillbank.model.base import load_base
    from skillbank.model.encoding_choice import cpu_identity
    from skillbank.model.threads import default_threads

    threads = args.threads or default_threads()
    run = RunConfig.from_toml(packaged_config("demo"))
    cfg = run.train_config()
    base = load_base(dataclasses.replace(run.base_config(), threads=threads), progress=False)
    examples = built_in_examples(base, cfg, args.family, args.records)
    per, ext = simd_flops_per_cycle()
    ghz = clock_ghz()
    peak = matmul_peak(threads)
    print(f"CPU {cpu_identity()}; {threads} threads; torch {torch.__version__}; dtype {next(base.model.parameters()).dtype}")
    theory = f"{threads * per * ghz:.0f} GFLOP/s ({threads} cores x {ghz:.2f} GHz x {per} FLOP/cycle, {ext})" \
        if ghz and per else "unknown (no clock in /proc/cpuinfo)"
    print(f"float32 peak: measured {peak:.0f} GFLOP/s (torch matmul at a step's shapes); theoretical {theory}")
    per_token = step_flops(base, examples, cfg)
    print(f"one training step: {per_token / 1e9:.3f} GFLOP per token (forward + backward, FlopCounterMode)")
    variants = {"fp32": threads, "fp32-1t": 1}
    rates: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(args.rounds):
        order = list(variants) if r % 2 == 0 else list(variants)[::-1]
        for name in order:
            torch.set_num_threads(variants[name])
            rate, result = timed_epoch(base, examples, cfg, f"{name}-{r}")
            rates[name].append(rate)
            print(f"round {r + 1} {name:<8} {rate:6.1f} tokens/s = {rate * per_token / 1e9:5.1f} GFLOP/s "
                  f"({100 * rate * per_token / 1e9 / peak:4.1f}% of the measured peak), loss {result.final_loss:.4f}",
                  flush=True)
    torch.set_num_threads(threads)
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"{name:<8} median {median:6.1f} tokens/s, {median * per_token / 1e9:5.1f} GFLOP/s, "
              f"{100 * median * per_token / 1e9 / peak:4.1f}% of the measured peak; "
              f"{median / statistics.median(rates['fp32-1t']):.2f}x one thread")
    print(f"load {os.getloadavg()[0]:.2f} ({platform.node()})")


if __name__ == "__main__":
    main()
