"""What lanes and grammar drafts buy the llama.cpp engine's batches, against the engine without them, same run.

Two parts, both on this machine's cores as the engine uses them (``--threads``, default 2):

- the decoder alone (``--skip decoder`` leaves it out): a forward pass over R rows of one token each, timed on
  one decoder with every thread and on two one-thread decoders running side by side (two shards' models), for
  R = 1, 4, 8, 16; and one decoder's pass over one row of k tokens (what a drafted pass costs);
- the engine on a bank's hand-written requests (the bank's families, tests/fixtures/paraphrase_builtin*), 48
  requests routed by the bank, planned in batches of 8 and 16 under each of four settings - lanes on or off
  (``SKILLBANK_LANES=1``: one shard group after another) crossed with drafts on or off - in alternating rounds,
  so a host whose speed drifts slows every setting alike. Prints tokens/s per setting, each one's ratio to
  "no lanes, no drafts", and how many plans differ from that setting's (llama.cpp rounds a pass of several
  tokens differently from one token's, so a near-tie can go the other way; the EM check is
  ``bench/engine_parity.py``).

    .venv/bin/python bench/llamacpp_batches.py --bank runs/gate-bank [--rounds 2] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from latency import bank_requests, machine_state  # noqa: E402


def decoder_part(bank, threads: int) -> dict:
    """Tokens/s of forward passes: one decoder with ``threads`` threads, two one-thread decoders side by side."""
    from skillbank.model.llamacpp import LlamaCppDecoder

    engine = bank.engine
    paths = []
    for name in bank.shard_names[:2]:  # the shards merged as batches decode them (model.llamacpp.encoding_for)
        engine.decoder_for(name, rows=16)
        paths.append(engine.merged_cache() / f"{engine.loaded[(name, engine.encoding(16))]}.gguf")
    print(f"merged models in {engine.encoding(16)}")
    prompt = list(range(1000, 1300))  # 300 cached tokens a row, as a plan's prompt and first tokens

    def passes(decoder, rows: int, k: int, reps: int, out: list | None = None) -> float:
        decoder._clear()
        for s in range(rows):
            decoder._prefill(prompt, 0, s)
        t0 = time.perf_counter()
        for _ in range(reps):
            decoder._run([(1500 + j, len(prompt) + j, s, True) for s in range(rows) for j in range(k)])
            decoder.L.llama_memory_seq_rm(decoder.memory, -1, len(prompt), -1)
        rate = rows * k * reps / (time.perf_counter() - t0)
        if out is not None:
            out.append(rate)
        return rate

    report = {"one_decoder": {}, "two_side_by_side": {}, "one_row_k_tokens_ms": {}}
    wide = LlamaCppDecoder(paths[0], threads=threads, n_ctx=8192, width=16)
    for rows in (1, 4, 8, 16):
        report["one_decoder"][rows] = round(passes(wide, rows, 1, 8), 1)
    for k in (1, 2, 4, 8):
        report["one_row_k_tokens_ms"][k] = round(1000 * k / passes(wide, 1, k, 8), 1)
    wide.close()
    pair = [LlamaCppDecoder(p, threads=max(1, threads // 2), n_ctx=8192, width=16) for p in paths]
    for rows in (1, 4, 8, 16):
        rates: list[float] = []
        lanes = [threading.Thread(target=passes, args=(d, rows, 1, 8, rates)) for d in pair]
        for t in lanes:
            t.start()
        for t in lanes:
            t.join()
        report["two_side_by_side"][rows] = round(sum(rates), 1)
    for d in pair:
        d.close()
    for rows in (1, 4, 8, 16):
        print(f"decoder, {rows:2d} rows x 1 token: one decoder ({threads} threads) "
              f"{report['one_decoder'][rows]:6.1f} tokens/s; two ({max(1, threads // 2)} thread each) side by side "
              f"{report['two_side_by_side'][rows]:6.1f}")
    print("decoder, one row of k tokens: " + ", ".join(f"k={k} {ms} ms" for k, ms in
                                                        report["one_row_k_tokens_ms"].items()))
    return report


def engine_part(bank, requests: list[str], rounds: int, sizes: list[int]) -> dict:
    from skillbank.model.llamacpp import DRAFT_FED

    engine = bank.engine
    shards, _ = bank.route(requests)
    engine.generate(requests[:8], shards[:8], batch_size=8)  # every shard's model made and loaded once
    settings = {"plain": ("1", 1), "lanes": ("", 1), "drafts": ("1", DRAFT_FED), "lanes+drafts": ("", DRAFT_FED)}
    seconds: dict = {(s, b): [] for s in settings for b in sizes}
    tokens: dict = {}
    texts: dict = {}
    for _ in range(rounds):
        for size in sizes:
            for name, (lanes, fed) in settings.items():
                os.environ["SKILLBANK_LANES"] = lanes
                engine.draft_fed = fed
                t0 = time.perf_counter()
                outs = []
                for k in range(0, len(requests), size):
                    outs += engine.generate(requests[k:k + size], shards[k:k + size], batch_size=size)
                seconds[(name, size)].append(time.perf_counter() - t0)
                tokens[(name, size)] = sum(o.n_tokens for o in outs)
                texts[(name, size)] = [o.text for o in outs]
    engine.draft_fed = DRAFT_FED
    os.environ.pop("SKILLBANK_LANES", None)
    report = {}
    for size in sizes:
        base = tokens[("plain", size)] / statistics.median(seconds[("plain", size)])
        for name in settings:
            rate = tokens[(name, size)] / statistics.median(seconds[(name, size)])
            differ = sum(a != b for a, b in zip(texts[(name, size)], texts[("plain", size)]))
            report[f"{name}_batch{size}"] = {"tokens_per_s": round(rate, 1), "ratio": round(rate / base, 2),
                                             "plans_differing": differ, "tokens": tokens[(name, size)]}
            print(f"engine, batch {size:2d}, {name:12s}: {rate:6.1f} tokens/s ({rate / base:.2f}x plain; "
                  f"{differ} of {len(requests)} plans differ from plain's)")
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bank", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--batch-sizes", default="8,16")
    ap.add_argument("--skip", default="", help="comma-separated: decoder, engine")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        sys.exit('llama.cpp is not installed (pip install -e ".[fast]"): nothing to measure')
    from skillbank.memory.bank import SkillBank

    print(machine_state())
    bank = SkillBank.open(args.bank, engine="llama.cpp", threads=args.threads)
    skip = set(filter(None, args.skip.split(",")))
    report = {"threads": args.threads, "machine": machine_state()}
    if "decoder" not in skip:
        report["decoder"] = decoder_part(bank, args.threads)
    if "engine" not in skip:
        requests = bank_requests(args.bank)[:args.requests]
        report["engine"] = engine_part(bank, requests, args.rounds,
                                       [int(b) for b in args.batch_sizes.split(",")])
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
