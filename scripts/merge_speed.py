"""Probe: how long does making a shard's merged llama.cpp model take - rewritten from the shipped base, or
patched into the base re-encoded once per machine (what the engine does) - and do the two agree?

Times, in one process: the base re-encoded (``reencode_base``, the once-per-machine step), the patched merge
(``merge_lora(..., reencoded=)``), and the whole rewrite (``merge_lora`` without it; gguf-py's parse of the base
is kept for the process, so this is the faster, second-in-a-process rewrite). Then checks every tensor of the
two merged files byte for byte.

    .venv/bin/python scripts/merge_speed.py --shard runs/demo-memo/methods/fsm/bank/shards/0003-t3_retrieval_understanding
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shard", type=Path, required=True, help="A shard directory (adapter_config.json, weights).")
    args = ap.parse_args()

    from gguf import GGUFReader

    import skillbank.model.llamacpp as engine
    from skillbank.model.embedded import embedded_gguf_path

    shipped = embedded_gguf_path()
    shape, _ = engine.read_shape(shipped)
    with tempfile.TemporaryDirectory(prefix="merge-speed-") as tmp:
        tmp = Path(tmp)
        timed = {}
        t = time.perf_counter()
        base = engine.reencode_base(shipped, tmp / "base.gguf")
        timed["base re-encoded (once per machine)"] = time.perf_counter() - t
        t = time.perf_counter()
        patched = engine.merge_lora(args.shard, shipped, tmp / "patched.gguf", shape, reencoded=base)
        timed["merged, patched into it"] = time.perf_counter() - t
        t = time.perf_counter()
        whole = engine.merge_lora(args.shard, shipped, tmp / "whole.gguf", shape)
        timed["merged, whole rewrite (base parsed already)"] = time.perf_counter() - t
        for what, seconds in timed.items():
            print(f"{what}: {seconds:.2f} s")
        a = {x.name: x for x in GGUFReader(str(patched)).tensors}
        b = {x.name: x for x in GGUFReader(str(whole)).tensors}
        same = sum(np.array_equal(a[n].data, b[n].data) for n in a)
        print(f"tensors byte-identical: {same} of {len(a)} ({len(b)} in the rewrite)")


if __name__ == "__main__":
    main()
