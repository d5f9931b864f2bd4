"""Does torch.compile make a training epoch faster on this CPU? Eager vs regionally compiled decoder layers.

Trains one epoch of the demo's recipe (rank 64 on the attention projections, batch 8, bf16 autocast where the CPU
has it) on built-in training records, alternating: eager with the shared prompt head (``loop.SHARE_PROMPT_HEAD``,
the default), and every decoder layer compiled (``module.compile(dynamic=True)``: inductor, one compiled
layer reused by all thirty) with the shared head off, because the head's key/value cache makes dynamo recompile
per layer. The first compiled round includes the compilation. Prints tokens/s and seconds per round.

    .venv/bin/python scripts/train_compile_probe.py [--records 48] [--rounds 2]
"""
from __future__ import annotations

import argparse
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=2, help="rounds of (eager, compiled)")
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
    records = stream.train["t2_language_speech"][:args.records]
    prefix = common_prefix(sorted({t for r in records for t in r.graph.tasks}))
    examples, _ = build_examples(base, records, cfg, prefix)
    one_epoch = type(cfg)(**{**cfg.to_dict(), "epochs": 1})
    layers = base.model.model.layers
    print(f"{len(examples)} examples, {torch.get_num_threads()} threads, torch {torch.__version__}", flush=True)
    for r in range(args.rounds):
        for compiled in (False, True):
            loop.SHARE_PROMPT_HEAD = not compiled
            name = f"probe-{r}-{int(compiled)}"
            add_lora(base, name, one_epoch)
            for layer in layers:
                if compiled:
                    layer.compile(dynamic=True)
                else:
                    layer._compiled_call_impl = None  # back to eager (nn.Module.compile's own slot)
            t0 = time.perf_counter()
            result = loop.fit(base, examples, one_epoch, adapter=name, progress=False)
            wall = time.perf_counter() - t0
            base.remove_adapter(name)
            print(f"round {r + 1} {'compiled, head off' if compiled else 'eager, head on   '}: "
                  f"{result.total_tokens / wall:6.1f} tokens/s, {wall:5.1f} s, first-step loss {result.loss_curve[0]:.5f}",
                  flush=True)
    loop.SHARE_PROMPT_HEAD = True


if __name__ == "__main__":
    main()
