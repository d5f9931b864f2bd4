"""How fast does llama.cpp decode the embedded base stored in each weight encoding, at batch 1 and batch 16?

The llama.cpp engine stores every merged model's matrices as Q8_0 (``skillbank.model.llamacpp._reencoded``), chosen
when Q8_0's tiled kernels ran batches about twice as fast as the shipped Q4_1 file. CPUs with AVX512-BF16 (this
project's AMD EPYC) also have fast BF16 and F16 matrix kernels in llama.cpp, at twice Q8_0's bytes. This writes the
base again with its quantized matrices as Q8_0, F16 and BF16 (values dequantized from the shipped Q4_1 file, nothing
else changed), and decodes the same prompts (the bank's hand-written requests under the shard instruction) for
exactly ``--tokens`` tokens each, no grammar, no stop token, the encodings in turn within each round. Printed: each
encoding's tokens/s (median round) and its ratio to Q8_0's. Speed only: what an encoding does to plans' EM is
``bench/engine_parity.py``'s question once an engine uses it.

    .venv/bin/python scripts/llamacpp_encodings.py --bank runs/demo-engine/methods/fsm/bank --threads 2

Why a script: one measurement for a decision (which encoding the engine's merged models should use), not a feature.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from latency import _decode_rows, _rows_decoder, bank_requests  # noqa: E402


def rewrite(src: Path, out: Path, kind: str, updates: dict | None = None) -> Path:
    """``src`` with every quantized matrix stored as ``kind`` (q8_0 | f16 | bf16), each tensor of ``updates`` (a
    shard's LoRA, llama.cpp name -> (A, B)) with its B A added first; other tensors keep their bytes."""
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize, quantize

    from skillbank.model.llamacpp import _read_gguf, _with_update, _write_gguf, copy_fields, read_shape

    arch = read_shape(src)[0].arch
    st = os.stat(src)
    reader = _read_gguf(str(src), st.st_mtime_ns, st.st_size)
    target = {"q8_0": Q.Q8_0, "f16": Q.F16, "bf16": Q.BF16}[kind]

    def fill(writer) -> None:
        copy_fields(reader, writer)
        for t in reader.tensors:
            update = (updates or {}).get(t.name)
            if update is None and (len(t.shape) < 2 or t.tensor_type in (Q.F32, Q.F16, Q.BF16, target)):
                writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
                continue
            weight = (dequantize(t.data, t.tensor_type) if update is None
                      else _with_update(src, t.name, t.data, t.tensor_type, update))
            if kind == "f16":
                writer.add_tensor(t.name, weight.astype(np.float16))
            else:
                writer.add_tensor(t.name, quantize(weight, target), raw_dtype=target)

    return _write_gguf(out, arch, fill)


def parity(bank_dir: Path, threads: int, batch: int) -> dict:
    """Graph EM of every shard of ``bank_dir`` on its family's held-out template requests (the demo stream's), its
    update merged into the base stored as Q8_0 (the engine's form) and as BF16; decoded by llama.cpp under the
    shard's grammar (the harness's llama.cpp engine with its merge swapped for :func:`rewrite`)."""
    import skillbank.model.llamacpp as llamacpp
    from skillbank.continual.engines import LlamaCppOutputs
    from skillbank.data.builtin import build_builtin_stream
    from skillbank.memory.bank import SkillBank
    from target_names_probe import oracle_outputs  # scripts/, beside this one

    bank = SkillBank.open(bank_dir, engine="torch")
    base = bank.execution.base
    stream = build_builtin_stream(seed=0, train_per_family=200, test_per_family=50)  # the demo's stream
    catalog = stream.catalog
    merge = llamacpp.merge_updates
    out: dict = {}
    texts: dict = {}
    for kind in ("q8_0", "bf16"):
        if kind == "bf16":  # the harness engine merges through this name: a BF16 file instead
            llamacpp.merge_updates = lambda updates, gguf, path, shape, **kw: rewrite(Path(gguf), Path(path), "bf16",
                                                                                      dict(updates))
        engine = LlamaCppOutputs(base.identity, threads=threads)
        try:
            for entry in bank.manifest.shards:
                em, texts.setdefault(entry.name, {})[kind] = oracle_outputs(
                    engine, bank.execution.activate(entry.name), base.tokenizer, catalog, entry.skills,
                    stream.test[entry.name], entry.target_format, entry.family_prefix, entry.system_prompt, batch)
                out.setdefault(entry.name, {})[kind] = round(100 * sum(em) / len(em), 1)
                print(f"{entry.name:<28} {kind:<5} EM {out[entry.name][kind]:.1f}", flush=True)
        finally:
            engine.close()
            llamacpp.merge_updates = merge
    for name, t in texts.items():
        out[name]["same_text"] = round(sum(a == b for a, b in zip(t["q8_0"], t["bf16"])) / len(t["q8_0"]), 3)
    for kind in ("q8_0", "bf16"):
        out.setdefault("macro", {})[kind] = round(sum(v[kind] for k, v in out.items() if k != "macro") / len(texts), 1)
    print(f"macro EM: Q8_0 {out['macro']['q8_0']:.1f}, BF16 {out['macro']['bf16']:.1f}; same text "
          + ", ".join(f"{k} {v['same_text']:.0%}" for k, v in out.items() if k != "macro"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bank", required=True, help="whose hand-written requests and instruction to decode")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=31)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--parity", action="store_true", help="instead: EM of the bank's shards merged as Q8_0 and as "
                    "BF16 on the demo stream's held-out requests (the bank must be the demo's)")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.parity:
        report = parity(Path(args.bank), args.threads, 16)
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
        return

    from skillbank.model.embedded import embedded_gguf_path, embedded_tokenizer_dir
    from skillbank.model.light_tokenizer import LightTokenizer
    from skillbank.model.prompts import prompt_ids

    bank = Path(args.bank)
    instruction = json.loads((bank / "bank.json").read_text())["shards"][0]["system_prompt"]
    tok = LightTokenizer(embedded_tokenizer_dir())
    rows = [(prompt_ids(tok, r, instruction), args.tokens) for r in bank_requests(bank)[:48]]
    src = embedded_gguf_path()
    scratch = Path(tempfile.mkdtemp(prefix="skillbank-encodings-"))
    files = {"q4_1 (shipped)": src}
    for kind in ("q8_0", "f16", "bf16"):
        files[kind] = rewrite(src, scratch / f"{kind}.gguf", kind)
    report = {"threads": args.threads, "tokens": args.tokens, "rounds": args.rounds,
              "size_mb": {k: round(os.path.getsize(v) / 1e6) for k, v in files.items()}, "tokens_per_s": {}}
    print("sizes:", ", ".join(f"{k} {v} MB" for k, v in report["size_mb"].items()))
    for width, use in ((1, rows[:8]), (16, rows)):
        decoders = {k: _rows_decoder(v, args.threads, width) for k, v in files.items()}
        timed: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for k, dec in decoders.items():
                wall, _, n = _decode_rows(dec, use, width)
                timed.setdefault(k, []).append(n / wall)
        ref = statistics.median(timed["q8_0"])
        for k, xs in timed.items():
            med = statistics.median(xs)
            report["tokens_per_s"][f"{k} batch {width}"] = {"median": round(med, 1), "rounds": [round(x, 1) for x in xs]}
            print(f"batch {width:>2} {k:<15} {med:6.1f} tokens/s  {med / ref:.2f}x Q8_0   rounds {[round(x, 1) for x in xs]}")
        for dec in decoders.values():
            dec.close()
    for path in scratch.iterdir():
        path.unlink()
    scratch.rmdir()
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
