"""How fast does llama.cpp decode the embedded base stored in each weight encoding, at each batch width?

The llama.cpp engine stored every merged model's matrices as Q8_0, chosen when Q8_0's tiled kernels ran batches
about twice as fast as the shipped Q4_1 file. CPUs with AVX512-BF16 (this project's AMD EPYC) also have fast BF16
and F16 matrix kernels in llama.cpp, at twice Q8_0's bytes. This writes the base again with its quantized matrices
as Q8_0, F16 and BF16 (values dequantized from the shipped Q4_1 file, nothing else changed), and decodes the same
prompts (the bank's hand-written requests under the shard instruction) for exactly ``--tokens`` tokens each, no
grammar, no stop token, the encodings in turn within each round. Printed: each encoding's tokens/s (median round)
and its ratio to Q8_0's. What it found decides ``skillbank.model.llamacpp.encoding_for`` (Q8_0 for one row, BF16
for more). ``--parity``: what the two encodings do to plans' EM.

    .venv/bin/python scripts/llamacpp_encodings.py --bank runs/demo-engine/methods/fsm/bank --threads 2 \
        --widths 1,2,4,8,16 --kinds q8_0,bf16

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


def rewrite_f16(src: Path, out: Path) -> Path:
    """``src`` with every quantized matrix stored as F16 (the package re-encodes as Q8_0 or BF16 only:
    :func:`skillbank.model.llamacpp.reencode_base`); other tensors keep their bytes."""
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize

    from skillbank.model.llamacpp import _read_gguf, _write_gguf, copy_fields, read_shape

    arch = read_shape(src)[0].arch
    st = os.stat(src)
    reader = _read_gguf(str(src), st.st_mtime_ns, st.st_size)

    def fill(writer) -> None:
        copy_fields(reader, writer)
        for t in reader.tensors:
            if len(t.shape) < 2 or t.tensor_type in (Q.F32, Q.F16, Q.BF16):
                writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
            else:
                writer.add_tensor(t.name, dequantize(t.data, t.tensor_type).astype(np.float16))

    return _write_gguf(out, arch, fill)


def parity(bank_dir: Path, threads: int, batch: int) -> dict:
    """Graph EM of every shard of ``bank_dir`` on its family's held-out template requests (the demo stream's), its
    update merged into the base stored as Q8_0 and as BF16 (the harness's llama.cpp engine in each encoding);
    decoded by llama.cpp under the shard's grammar."""
    from skillbank.continual.engines import LlamaCppOutputs
    from skillbank.data.builtin import build_builtin_stream
    from skillbank.memory.bank import SkillBank
    from target_names_probe import oracle_outputs  # scripts/, beside this one

    bank = SkillBank.open(bank_dir, engine="torch")
    base = bank.execution.base
    stream = build_builtin_stream(seed=0, train_per_family=200, test_per_family=50)  # the demo's stream
    catalog = stream.catalog
    out: dict = {}
    texts: dict = {}
    for kind in ("q8_0", "bf16"):
        engine = LlamaCppOutputs(base.identity, threads=threads, encoding=kind)
        try:
            for entry in bank.manifest.shards:
                em, texts.setdefault(entry.name, {})[kind] = oracle_outputs(
                    engine, bank.execution.activate(entry.name), base.tokenizer, catalog, entry.skills,
                    stream.test[entry.name], entry.target_format, entry.family_prefix, entry.system_prompt, batch)
                out.setdefault(entry.name, {})[kind] = round(100 * sum(em) / len(em), 1)
                print(f"{entry.name:<28} {kind:<5} EM {out[entry.name][kind]:.1f}", flush=True)
        finally:
            engine.close()
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
    ap.add_argument("--widths", default="1,16", help="rows decoded together, comma-separated")
    ap.add_argument("--kinds", default="q8_0,f16,bf16", help="encodings beside the shipped file")
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
    from skillbank.model.llamacpp import reencode_base
    from skillbank.model.prompts import prompt_ids

    bank = Path(args.bank)
    instruction = json.loads((bank / "bank.json").read_text())["shards"][0]["system_prompt"]
    tok = LightTokenizer(embedded_tokenizer_dir())
    rows = [(prompt_ids(tok, r, instruction), args.tokens) for r in bank_requests(bank)[:48]]
    src = embedded_gguf_path()
    scratch = Path(tempfile.mkdtemp(prefix="skillbank-encodings-"))
    files = {"q4_1 (shipped)": src}
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if "q8_0" not in kinds:
        raise SystemExit("--kinds must include q8_0 (the ratios' reference)")
    for kind in kinds:
        path = scratch / f"{kind}.gguf"
        files[kind] = rewrite_f16(src, path) if kind == "f16" else reencode_base(src, path, kind)
    report = {"threads": args.threads, "tokens": args.tokens, "rounds": args.rounds,
              "size_mb": {k: round(os.path.getsize(v) / 1e6) for k, v in files.items()}, "tokens_per_s": {}}
    print("sizes:", ", ".join(f"{k} {v} MB" for k, v in report["size_mb"].items()))
    for width in (int(w) for w in args.widths.split(",")):
        use = rows[:8] if width == 1 else rows[:max(16, 3 * width)]
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
