"""Probe: what does llama.cpp's runtime LoRA cost a decode step, and does a merged model remove it?

Decodes the same tokens (a 120-token prompt already in the KV cache, 60 new tokens, four times) with the bare
embedded base, the base with a shard's adapter applied at run time (float32, float16 and Q8_0 adapter tensors)
and the base with the shard merged in (``merge_lora``: Q8_0 and float16 merged weights). The variants take turns
within each round, so a host whose speed drifts slows them alike; tokens/s per round are printed.

    .venv/bin/python scripts/llamacpp_lora_overhead.py --shard runs/gate-bank/shards/0001-t1_daily_life
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shard", type=Path, required=True, help="a shard directory of a bank on the embedded base")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    import gguf
    from gguf import GGUFWriter

    import skillbank.model.llamacpp as engine
    from skillbank.model.embedded import embedded_gguf_path

    base = embedded_gguf_path()
    shape, _ = engine.read_shape(base)
    tmp = Path(tempfile.mkdtemp())
    bare = engine.LlamaCppDecoder(base, threads=args.threads, n_ctx=512)
    variants = {"bare base": (bare, None)}
    # adapter tensors in other types: the same conversion, its tensors cast as they are written
    original = GGUFWriter.add_tensor

    def cast(kind: str):
        def add(self, name, t, *a, **k):
            if kind == "f16":
                return original(self, name, t.astype(np.float16), *a, **k)
            if kind == "q8_0" and t.shape[-1] % 32 == 0:
                q = gguf.quants.quantize(t, gguf.GGMLQuantizationType.Q8_0)
                return original(self, name, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            return original(self, name, t.astype(np.float16) if kind == "q8_0" else t, *a, **k)
        return add

    for kind in ("f32", "f16", "q8_0"):
        GGUFWriter.add_tensor = cast(kind)
        try:
            bare.load_adapter(kind, engine.convert_lora(args.shard, tmp / f"lora-{kind}.gguf", shape))
        finally:
            GGUFWriter.add_tensor = original
        variants[f"runtime LoRA, {kind} tensors"] = (bare, kind)
    for weights in ("q8_0", "f16"):
        path = engine.merge_lora(args.shard, base, tmp / f"merged-{weights}.gguf", shape, weights=weights)
        variants[f"merged, {weights} weights"] = (engine.LlamaCppDecoder(path, threads=args.threads, n_ctx=512), None)

    prompt = list(range(1000, 1120))
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, (decoder, adapter) in variants.items():
            decoder.decode(prompt + [0], adapter, 1, set())  # the prompt in the cache: decoding alone is timed
            t0 = time.perf_counter()
            for i in range(4):
                decoder.decode(prompt + [i], adapter, 60, set())
            rates[name].append(4 * 60 / (time.perf_counter() - t0))
    for name, r in rates.items():
        print(f"{name:28s} " + "  ".join(f"{x:6.1f}" for x in r) + "  tokens/s")


if __name__ == "__main__":
    main()
