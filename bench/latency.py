"""Plan latency and decode throughput of a bank, next to plain transformers and llama.cpp on the same weights.

One run reports, for hand-written requests (tests/fixtures/paraphrase_builtin*.jsonl, the bank's families):

- cold start, each in a fresh process: importing what ``plan`` needs, and ``skillbank plan BANK "..."`` end to
  end (wall time, as ``/usr/bin/time`` would give it);
- in this process, for each plan engine (llama.cpp on the embedded GGUF, and the torch reference; ``--engines``):
  ``SkillBank.open``, the first plan (model and shard load, grammar library, first compile), then
  batch-1 plan latency p50/p90 and tokens/s, and the aggregate tokens/s of batches of 8 and 16 (three
  batches' worth of requests each, so finished rows are refilled as in a busy planner; after one untimed pass,
  the median of ``--batch-rounds``), each with the grammar on and off; an out-of-scope request's latency
  (tests/fixtures/offdomain.jsonl);
- the references, on the same weights (the base with the shard merged in), the same prompts and the same
  token counts: transformers' ``generate`` (greedy, ``min_new_tokens = max_new_tokens``) in float32 and
  bfloat16, its batches once with rows of uniform length (its best case) and once with the requests' own
  counts (a static batch runs to its longest row), and llama.cpp on the base's GGUF when ``llama_cpp``
  (llama-cpp-python) is importable: one request at a time, and the bank's batches as many sequences per
  forward pass (what ``llama-batched-bench`` measures) - on the shipped Q4_1 file (the targets' reference) and
  again on the base re-encoded as the engine's merged models are (``skillbank.model.llamacpp.encoding_for``: Q8_0
  for one request, BF16 for batches where the CPU has BF16 dot products), so a reader sees what the encodings buy
  and what the engine's own loop does;
- the ratios the speed targets are stated in; batch 1 and batch 16 against llama.cpp are also timed alternated
  with llama.cpp (request by request, round by round), so that a host whose speed drifts slows both alike.

Every throughput is also given per CPU second of this process: on a machine shared with other jobs the wall
time of a multi-threaded torch process swings several-fold (its threads wait for each other), the CPU time
much less. The machine's load average is printed first; ``--threads 1`` gives the steadiest comparisons.

Without ``--bank`` a bank is made in a temporary directory on the embedded base, with one built-in family
learned from a few records (``--train-records``, one epoch): an undertrained shard, but decoding costs the
same per token whatever it learned, and the grammar keeps its outputs well-formed.

    .venv/bin/python bench/latency.py [--bank runs/demo/methods/fsm/bank] [--threads 2] [--json out.json]

llama.cpp comes with the ``fast`` extra (``make install`` builds it); without it only the torch engine is timed
and the llama.cpp reference says it is missing.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
FAMILY = "t1_daily_life"  # the family a standalone bank learns
COLD_RUNS = 3  # fresh-shell plans timed per request kind (the median is reported)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bank", type=Path, help="A bank; default: make a small one in a temporary directory.")
    ap.add_argument("--threads", type=int, default=None, help="Torch (and llama.cpp) threads; default: torch's.")
    ap.add_argument("--requests", type=int, default=16, help="Batch-1 requests timed (each free and constrained).")
    ap.add_argument("--max-new-tokens", type=int, default=96, help="Generation cap.")
    ap.add_argument("--train-records", type=int, default=16, help="Records the standalone bank learns from.")
    ap.add_argument("--dtype", default="float32", help="The base's dtype in memory (BaseModelConfig.dtype).")
    ap.add_argument("--device", default="auto", help="Where the torch engine runs (BaseModelConfig.device): auto "
                    "(CUDA when present), cpu, cuda, cuda:N.")
    ap.add_argument("--batch-sizes", default="8,16", help="Comma-separated batch sizes of the aggregate figures "
                    "(16 is the one the targets name).")
    ap.add_argument("--scope-encoder", default=None, help="Sentence encoder of the standalone bank's scope and "
                    "router; default: a new bank's ('none': word statistics and the lexical router, no encoder "
                    "files needed).")
    ap.add_argument("--hf-dtypes", default="float32,bfloat16", help="Dtypes of the transformers reference.")
    ap.add_argument("--skip", default="", help="Comma-separated parts to skip: cold,batch,hf,llama.")
    ap.add_argument("--engines", default=None, help="Comma-separated plan engines to time in process "
                    "(llama.cpp, torch); default: both where llama.cpp is installed, else torch.")
    ap.add_argument("--batch-rounds", type=int, default=3, help="Rounds of each batch size and mode (and of "
                    "llama.cpp's batched references); the median is reported.")
    ap.add_argument("--paired-rounds", type=int, default=3, help="Rounds of the batch-1 comparison that alternates "
                    "our plans and llama.cpp request by request.")
    ap.add_argument("--json", type=Path, help="Also write every figure to this file.")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    report: dict = {"machine": machine_state()}
    say(f"machine: {report['machine']}")

    tmp = None
    if args.bank is None:
        tmp = Path(tempfile.mkdtemp(prefix="latency-bank-"))
        args.bank = tmp / "bank"
        say(f"making a bank in {args.bank}: {FAMILY} from {args.train_records} records, one epoch ...")
        t0 = time.perf_counter()
        run_python(f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); import latency; "
                   f"latency.make_bank({str(args.bank)!r}, {args.train_records}, {args.scope_encoder!r}, "
                   f"{args.device!r})")
        say(f"  made in {time.perf_counter() - t0:.0f} s")
    try:
        requests = bank_requests(args.bank)
        if "cold" not in skip:
            report["cold"] = cold_start(args.bank, requests[0], args.threads)
        engines = (args.engines.split(",") if args.engines else
                   (["llama.cpp", "torch"] if _llama_installed() else ["torch"]))
        report["engines"] = {}
        for i, engine in enumerate(engines):
            say(f"-- engine {engine} --")
            report["engines"][engine] = warm(args, requests, skip | ({"hf", "llama"} if i else set()), engine)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    say("")
    for line in ratios(report):
        say(line)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


# -- the bank and its requests ---------------------------------------------------------------------------
def make_bank(path: str, records: int, encoder: str | None = None, device: str = "auto") -> None:
    """A bank at ``path`` on the embedded base with :data:`FAMILY` learned from ``records`` records, one epoch."""
    from skillbank.data.builtin import build_builtin_stream
    from skillbank.memory.bank import SkillBank
    from skillbank.model.base import BaseModelConfig, load_base
    from skillbank.train.executor import TrainConfig

    stream = build_builtin_stream(seed=0, train_per_family=max(records, 8), test_per_family=4)
    from skillbank.cli.common import scope_encoder_name
    bank = SkillBank.create(path, base=load_base(BaseModelConfig(device=device), progress=False),
                            scope_params={} if encoder is None else {"encoder": scope_encoder_name(encoder)})
    bank.learn(FAMILY, stream.train[FAMILY][:records], TrainConfig.for_small_cpu(epochs=1),
               skills=stream.catalog.family(FAMILY).skills, progress=False)


def bank_requests(bank: Path) -> list[str]:
    """Hand-written requests of the bank's families (paraphrase fixtures), in a fixed order."""
    families = {s["name"] for s in json.loads((bank / "bank.json").read_text())["shards"]}
    out = []
    for name in ("paraphrase_builtin.jsonl", "paraphrase_builtin_holdout.jsonl", "paraphrase_builtin_short.jsonl"):
        for line in (FIXTURES / name).read_text().splitlines():
            rec = json.loads(line)
            if rec.get("family") in families:
                out.append(rec["request"])
    if not out:
        sys.exit(f"{bank}: none of its families {sorted(families)} has hand-written requests in {FIXTURES}")
    return out


# -- cold start -----------------------------------------------------------------------------------------
def cold_start(bank: Path, request: str, threads: int | None) -> dict:
    env = dict(os.environ)
    t0 = time.perf_counter()
    run_python("import skillbank.cli, skillbank.memory.bank", env=env)
    python_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    run_python("pass", env=env)
    bare_s = time.perf_counter() - t0
    exe = Path(sys.executable).with_name("skillbank")

    def timed(args: list[str], environ: dict) -> tuple[subprocess.CompletedProcess, float]:
        t0 = time.perf_counter()
        done = subprocess.run([str(exe), *args], capture_output=True, text=True, env=environ)
        return done, time.perf_counter() - t0

    # a fresh process each time; the median of COLD_RUNS, as one start-up varies by a few tenths of a second
    plan_runs, off_runs = [], []
    for _ in range(COLD_RUNS):
        proc, seconds = timed(["plan", str(bank), request], env)
        if proc.returncode:
            sys.exit(f"skillbank plan failed: {proc.stderr[-2000:]}")
        plan_runs.append(seconds)
        off, seconds = timed(["plan", str(bank), _offdomain()[0]], env)
        off_runs.append(seconds)
    plan_s, off_s = statistics.median(plan_runs), statistics.median(off_runs)
    # The first plan of a shard on a machine makes its llama.cpp form (the base re-encoded, then the shard's merged
    # model); a shard just learned on a machine that has planned before only its merged model (patched into the
    # base already re-encoded). Each in a cache holding everything else (the encoder, the torch base).
    from skillbank.cache import cache_root

    def first_plan(keep_base: bool) -> float | None:
        with tempfile.TemporaryDirectory(prefix="latency-cache-") as tmp:
            for item in cache_root().iterdir():
                if item.name != "llamacpp":
                    (Path(tmp) / item.name).symlink_to(item)
            if keep_base:
                (Path(tmp) / "llamacpp").mkdir()
                (Path(tmp) / "llamacpp" / "base").symlink_to(cache_root() / "llamacpp" / "base")
            done, seconds = timed(["plan", str(bank), request], {**env, "SKILLBANK_CACHE": tmp})
        return seconds if done.returncode == 0 else None

    first_s = first_plan(keep_base=False)
    new_shard_s = first_plan(keep_base=True) if (cache_root() / "llamacpp" / "base").is_dir() else None
    out = {"python_s": round(bare_s, 2), "import_s": round(python_s - bare_s, 2), "cli_plan_s": round(plan_s, 2),
           "cli_plan_runs_s": [round(x, 2) for x in plan_runs], "cli_out_of_scope_runs_s": [round(x, 2) for x in off_runs],
           "cli_out_of_scope_s": round(off_s, 2) if off.returncode == 0 else None,
           "cli_plan_first_use_s": round(first_s, 2) if first_s is not None else None,
           "cli_plan_new_shard_s": round(new_shard_s, 2) if new_shard_s is not None else None}
    say(f"cold: python {bare_s:.2f} s, import cli+bank +{python_s - bare_s:.2f} s; "
        f"`skillbank plan BANK \"...\"` {plan_s:.2f} s wall (median of {[round(x, 2) for x in plan_runs]}); out-of-scope request {off_s:.2f} s "
        f"({[round(x, 2) for x in off_runs]}); the shard's first "
        f"plan on this machine (its llama.cpp form made) {f'{first_s:.2f} s' if first_s is not None else 'failed'}"
        + (f"; a new shard's first plan (the base converted before) {new_shard_s:.2f} s" if new_shard_s is not None
           else ""))
    return out


def _offdomain() -> list[str]:
    return [json.loads(line)["request"] for line in (FIXTURES / "offdomain.jsonl").read_text().splitlines()]


# -- in this process ------------------------------------------------------------------------------------
def _llama_installed() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def warm(args, requests: list[str], skip: set, engine: str) -> dict:
    """One engine in this process (the first plan is the engine's first: its model loads there)."""
    t0 = time.perf_counter()
    from skillbank.memory.bank import SkillBank
    import_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    if args.dtype == "float32" and args.device == "auto":
        bank = SkillBank.open(args.bank, engine=engine, threads=args.threads)
    else:
        from skillbank.model.base import BaseModelConfig
        name = json.loads((args.bank / "bank.json").read_text())["base"]["name"]
        bank = SkillBank.open(args.bank, base_config=BaseModelConfig(name=name, dtype=args.dtype, device=args.device),
                              engine=engine, threads=args.threads)
    open_s = time.perf_counter() - t0
    cap = args.max_new_tokens
    t0 = time.perf_counter()
    first = bank.plan([requests[0]], batch_size=1, max_new_tokens=cap)[0]  # as `skillbank plan` does it
    first_s = time.perf_counter() - t0
    import torch  # (after the first plan: the llama.cpp engine does not need it)
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = getattr(bank.engine, "threads", None) or torch.get_num_threads()
    device = "llama.cpp (CPU)" if engine != "torch" else _device_name(bank.execution.base.model)
    say(f"in process, engine {engine} on {device} ({threads} threads, {args.dtype}): import {import_s:.2f} s, "
        f"SkillBank.open {open_s:.2f} s, first plan {first_s:.2f} s ({first.n_tokens} tokens)")
    out: dict = {"engine": engine, "device": device, "threads": threads, "import_s": round(import_s, 2),
                 "open_s": round(open_s, 2), "first_plan_s": round(first_s, 2)}

    batch1 = (requests * ((args.requests + len(requests) - 1) // len(requests)))[:args.requests]
    counts: dict[str, int] = {}
    # The grammar (values free), no grammar, and the grammar with values copy-constrained to the request (built per
    # request) alternate request by request (a shared host whose speed drifts slows all alike), in three passes
    # with the modes rotated, so each request is timed in every mode but never right after itself (a request's
    # second plan would find its whole prompt in the KV cache).
    modes = ("grammar", "free", "copy")
    settings = {"grammar": {"constrain": True, "copy_values": False}, "free": {"constrain": False},
                "copy": {"constrain": True, "copy_values": True}}
    times: dict[str, list[float]] = {m: [] for m in modes}
    tokens: dict[str, list[int]] = {m: [] for m in modes}
    cpu = {m: 0.0 for m in modes}
    for first in range(len(modes)):
        for k, r in enumerate(batch1):
            mode = modes[(k + first) % len(modes)]
            t0, c0 = time.perf_counter(), time.process_time()
            p = bank.plan([r], batch_size=1, max_new_tokens=cap, scope=False, **settings[mode])[0]
            times[mode].append(time.perf_counter() - t0)
            cpu[mode] += time.process_time() - c0
            tokens[mode].append(p.n_tokens)
            if mode == "grammar":
                counts[r] = p.n_tokens
    for mode in modes:
        t, n = times[mode], tokens[mode]
        out[f"batch1_{mode}"] = row = {"p50_s": round(statistics.median(t), 3), "p90_s": round(_quantile(t, 0.9), 3),
                                        "tokens_mean": round(sum(n) / len(n), 1),
                                        "tokens_per_s": round(sum(n) / sum(t), 1),
                                        "tokens_per_cpu_s": round(sum(n) / cpu[mode], 1)}
        say(f"batch 1, {mode:7s}: p50 {row['p50_s']:.3f} s, p90 {row['p90_s']:.3f} s, "
            f"{row['tokens_mean']:.1f} tokens/plan, {row['tokens_per_s']:.1f} tokens/s "
            f"({row['tokens_per_cpu_s']:.1f} per CPU second)")

    off = _offdomain()[:5]
    if bank.scope is not None:
        times = []
        for r in off:
            t0 = time.perf_counter()
            p = bank.plan([r], batch_size=1, max_new_tokens=cap)[0]
            times.append(time.perf_counter() - t0)
        out["out_of_scope_p50_s"] = round(statistics.median(times), 3)
        say(f"out of scope ({sum(1 for _ in off)} requests): p50 {out['out_of_scope_p50_s']:.3f} s")

    # Three batches' worth of requests per size: finished rows are refilled, as a busy planner's would be.
    sizes = [int(x) for x in args.batch_sizes.split(",")]
    batches = {size: (requests * ((3 * size + len(requests) - 1) // len(requests)))[:3 * size] for size in sizes}
    if "batch" not in skip:
        # One untimed pass first: each shard's merged model loaded and its prefix grammars compiled, as in a
        # planner that has been serving for a while (a cold batch paid up to 20% more in one run here).
        bank.plan(batches[max(sizes)], batch_size=max(sizes), max_new_tokens=cap, scope=False, copy_values=False)
        # Each size and mode timed in --batch-rounds rounds, the modes alternating, and the median reported: on
        # this shared host one batch's figure moves 10-15% from one run to the next.
        for size, reqs in batches.items():
            runs: dict[str, list[tuple[float, float, int]]] = {"grammar": [], "free": []}
            for _ in range(args.batch_rounds):
                for constrain in (True, False):
                    mode = "grammar" if constrain else "free"
                    t0, c0 = time.perf_counter(), time.process_time()
                    plans = bank.plan(reqs, batch_size=size, max_new_tokens=cap, scope=False, constrain=constrain,
                                      copy_values=False)
                    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                    n = sum(p.n_tokens for p in plans)
                    runs[mode].append((wall, cpu, n))
                    if constrain:
                        for r, p in zip(reqs, plans):
                            counts.setdefault(r, p.n_tokens)
            for mode, timed in runs.items():
                wall, cpu, n = _median_round(timed)
                out[f"batch{size}_{mode}"] = {"requests": len(reqs), "seconds": round(wall, 2), "tokens": n,
                                              "tokens_per_s": round(n / wall, 1), "tokens_per_cpu_s": round(n / cpu, 1),
                                              "rounds_tokens_per_s": [round(x[2] / x[0], 1) for x in timed]}
                say(f"batch {size}, {mode:7s}: {len(reqs)} requests, {n} tokens in {wall:.2f} s, "
                    f"{n / wall:.1f} tokens/s ({n / cpu:.1f} per CPU second; median of rounds at "
                    f"{', '.join(f'{x[2] / x[0]:.1f}' for x in timed)})")

    out["token_counts"] = [counts[r] for r in dict.fromkeys(batch1)]
    shard = bank.route(requests[:1])[0][0]
    if "hf" not in skip or "llama" not in skip:
        merged = merged_model(bank, shard)
        entry = bank.execution.shards[shard]
        from skillbank.model.prompts import prompt_ids
        tok = bank.execution.base.tokenizer
        prompts = [(prompt_ids(tok, r, entry.system_prompt), counts[r]) for r in batch1]
        rows = {size: [(prompt_ids(tok, r, entry.system_prompt), counts[r]) for r in reqs]
                for size, reqs in batches.items() if all(r in counts for r in reqs)}
        if "hf" not in skip:
            for dtype in args.hf_dtypes.split(","):
                out[f"hf_{dtype}"] = hf_reference(merged.to(getattr(torch, dtype)), tok, prompts, rows, dtype, sizes)
            merged.to(torch.float32)
        if "llama" not in skip:
            run = llama_runner(bank, threads)
            if run is not None:
                out["llama_cpp"] = llama_reference(run, prompts, threads)
                out["llama_cpp"].update(llama_batched_reference(rows, threads, rounds=args.batch_rounds))
                out["batch1_paired"] = paired(bank, batch1, prompts, run, cap, args.paired_rounds)
                size = max(rows) if rows else None
                if size:
                    out[f"batch{size}_paired"] = paired_batched(bank, batches[size], rows[size], size, threads, cap,
                                                                args.paired_rounds)
                out["llama_cpp_reencoded"] = reencoded_reference(prompts, rows, threads, args.batch_rounds)
    return out


def reencoded_reference(prompts: list[tuple[list[int], int]], rows: dict, threads: int, rounds: int) -> dict:
    """llama.cpp on the base re-encoded as the engine's merged models are (:func:`skillbank.model.llamacpp
    .reencode_base`; one request at a time in :func:`~skillbank.model.llamacpp.encoding_for`'s one-row encoding,
    the batches in its batched one): the same rows again, to tell what the encodings' kernels buy from what the
    engine's loop does. The issue's ratios stay against the shipped file."""
    from skillbank.model.embedded import embedded_gguf_path
    from skillbank.model.llamacpp import encoding_for, reencode_base

    one, many = encoding_for(1), encoding_for(16)
    out: dict = {"encoding_batch1": one, "encoding_batched": many}
    with tempfile.TemporaryDirectory(prefix="latency-reencoded-") as tmp:
        paths = {e: reencode_base(embedded_gguf_path(), Path(tmp) / f"base-{e}.gguf", e) for e in {one, many}}
        run = llama_runner(None, threads, paths[one])
        out.update(llama_reference(run, prompts, threads, f"llama.cpp, base re-encoded as {one.upper()}"))
        del run
        out.update(llama_batched_reference(rows, threads, paths[many], f"llama.cpp, base re-encoded as "
                                           f"{many.upper()}", rounds))
    return out


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


# -- references -----------------------------------------------------------------------------------------
def merged_model(bank, shard: str):
    """A second copy of the base with ``shard``'s LoRA merged into its weights: plain transformers, no PEFT."""
    from peft import PeftModel

    from skillbank.model.base import BaseModelConfig, load_base
    fresh = load_base(BaseModelConfig(name=bank.manifest.base["name"], device=str(bank.execution.base.model.device)),
                      progress=False)
    model = PeftModel.from_pretrained(fresh.model, str(bank.execution.dirs[shard])).merge_and_unload()
    return model.eval()


def hf_reference(model, tokenizer, prompts: list[tuple[list[int], int]], batches: dict, dtype: str,
                 sizes: list[int]) -> dict:
    """transformers' greedy ``generate`` of each prompt's token count: ``prompts`` one at a time, then each of
    ``batches`` (size -> the rows [(prompt ids, token count)] the bank's own batch of that size wrote), left
    padded, once with every row writing the batch's mean count and once to its longest row."""
    import torch

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def run(ids: list[list[int]], n: int) -> None:
        width = max(len(i) for i in ids)
        x = torch.tensor([[pad] * (width - len(i)) + i for i in ids], device=model.device)
        mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids], device=model.device)
        with torch.inference_mode():
            model.generate(input_ids=x, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                           pad_token_id=pad)
        if model.device.type == "cuda":
            torch.cuda.synchronize()  # the timer must not stop while kernels are still queued

    run([prompts[0][0]], 4)  # warm-up
    t0, c0 = time.perf_counter(), time.process_time()
    for ids, n in prompts:
        run([ids], n)
    b1, cpu = time.perf_counter() - t0, time.process_time() - c0
    n1 = sum(n for _, n in prompts)
    out = {"batch1_tokens_per_s": round(n1 / b1, 1), "batch1_mean_s": round(b1 / len(prompts), 3),
           "batch1_tokens_per_cpu_s": round(n1 / cpu, 1)}
    if not batches:  # the bank's batches were skipped: rows from the batch-1 prompts
        batches = {size: (prompts * ((size + len(prompts) - 1) // len(prompts)))[:size] for size in sizes}
    for size, rows in batches.items():
        chunks = [rows[i:i + size] for i in range(0, len(rows), size)]
        # uniform: every row writes its batch's mean count (the kernel's best case); same counts: a static batch
        # runs until its longest row, and only each row's own tokens count (generate on these very requests)
        for how in ("uniform", "same"):
            tokens = 0
            t0, c0 = time.perf_counter(), time.process_time()
            for chunk in chunks:
                counts = [c for _, c in chunk]
                n = round(sum(counts) / len(chunk)) if how == "uniform" else max(counts)
                run([ids for ids, _ in chunk], n)
                tokens += len(chunk) * n if how == "uniform" else sum(counts)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            key = f"batch{size}" + ("" if how == "uniform" else "_same_counts")
            out[f"{key}_tokens_per_s"] = round(tokens / wall, 1)
            out[f"{key}_tokens_per_cpu_s"] = round(tokens / cpu, 1)

    def each(suffix: str) -> str:
        return ", ".join(f"batch {size} {out[f'batch{size}{suffix}_tokens_per_s']:.1f} "
                         f"({out[f'batch{size}{suffix}_tokens_per_cpu_s']:.1f})" for size in batches)

    say(f"transformers generate, {dtype}: batch 1 {out['batch1_tokens_per_s']:.1f} tokens/s "
        f"({out['batch1_tokens_per_cpu_s']:.1f} per CPU s); rows of uniform length: {each('')}; the requests' own "
        f"counts (a static batch runs to its longest row): {each('_same_counts')}")
    return out


def llama_runner(bank, threads: int, gguf: Path | None = None):
    """A function generating ``n`` tokens greedily from prompt ids with llama.cpp on the base's GGUF (the
    embedded base only; the shard is not applied: the same shapes and token counts, so the same work per
    token), or on ``gguf``; None, said why, when it cannot."""
    try:
        import llama_cpp
    except ImportError:
        say('llama.cpp reference: not installed (pip install llama-cpp-python, or pip install -e ".[bench]")')
        return None
    from skillbank.model.base import EMBEDDED, embedded_gguf_path
    if bank is not None and bank.manifest.base["name"] != EMBEDDED:
        say("llama.cpp reference: skipped (the bank's base is not the embedded GGUF)")
        return None
    llm = llama_cpp.Llama(model_path=str(gguf or embedded_gguf_path()), n_threads=threads, n_threads_batch=threads,
                          n_ctx=1024, n_batch=512, verbose=False)

    def run(ids: list[int], n: int) -> None:
        llm.reset()
        for k, _ in enumerate(llm.generate(ids, top_k=1, temp=0.0, reset=True)):
            if k + 1 >= n:
                break

    run.version = getattr(llama_cpp, "__version__", "?")
    run(list(range(100, 120)), 4)  # warm-up
    return run


def llama_reference(run, prompts: list[tuple[list[int], int]], threads: int, label: str = "llama.cpp") -> dict:
    """llama.cpp, one request at a time, every prompt in turn."""
    t0, c0 = time.perf_counter(), time.process_time()
    for ids, n in prompts:
        run(ids, n)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    total = sum(n for _, n in prompts)
    out = {"batch1_tokens_per_s": round(total / wall, 1), "batch1_mean_s": round(wall / len(prompts), 3),
           "batch1_tokens_per_cpu_s": round(total / cpu, 1), "version": run.version}
    say(f"{label} {out['version']} ({threads} threads): batch 1 {out['batch1_tokens_per_s']:.1f} tokens/s "
        f"({out['batch1_tokens_per_cpu_s']:.1f} per CPU s), {out['batch1_mean_s']:.3f} s per request")
    return out


def llama_batched_reference(batches: dict, threads: int, gguf: Path | None = None,
                            label: str = "llama.cpp", rounds: int = 1) -> dict:
    """llama.cpp decoding many sequences per forward pass (what ``llama-batched-bench`` times), on the bank's
    own batches: each size's rows (prompt ids, the token count our plan wrote), ``size`` sequences advancing
    together in one ``llama_decode`` per step, a finished row's sequence given to the next prompt, the prompts'
    common head prefilled once - the multi-sequence loop of the llama.cpp engine
    (:class:`skillbank.model.llamacpp.LlamaCppDecoder`), here on the bare base GGUF, with no grammar, no
    adapter and no stop token: every row writes exactly its count. Greedy picks are numpy argmaxes (~1 ms a
    step for 16 rows); prefill of each row's own tokens is included, as in our batches. The median of ``rounds``."""
    if not batches:
        return {}
    out: dict = {}
    decoder = _rows_decoder(gguf, threads, max(batches))
    try:
        for size, rows in batches.items():
            timed = [_decode_rows(decoder, rows, size) for _ in range(rounds)]
            wall, cpu, tokens = _median_round(timed)
            out[f"batch{size}_tokens_per_s"] = round(tokens / wall, 1)
            out[f"batch{size}_tokens_per_cpu_s"] = round(tokens / cpu, 1)
            out[f"batch{size}_rounds_tokens_per_s"] = [round(x[2] / x[0], 1) for x in timed]
    finally:
        decoder.close()
    say(f"{label}, many sequences per forward pass (the same rows and token counts as our batches): " + ", ".join(
        f"batch {size} {out[f'batch{size}_tokens_per_s']:.1f} tokens/s ({out[f'batch{size}_tokens_per_cpu_s']:.1f} "
        f"per CPU s)" for size in batches))
    return out


def _rows_decoder(gguf: Path | None, threads: int, width: int):
    """A llama.cpp decoder of ``width`` sequences on ``gguf`` (default: the shipped base), warmed up."""
    from skillbank.model.embedded import embedded_gguf_path
    from skillbank.model.llamacpp import LlamaCppDecoder

    decoder = LlamaCppDecoder(gguf or embedded_gguf_path(), threads=threads, width=width)
    decoder.decode_many([list(range(100, 140))] * 2, None, 4, set())  # warm-up
    return decoder


def _decode_rows(decoder, rows: list[tuple[list[int], int]], size: int) -> tuple[float, float, int]:
    """One timed batched decoding of ``rows`` (prompt ids, token count), ``size`` sequences a pass, no grammar
    and no stop token, so every row writes exactly its count: (wall s, CPU s, tokens)."""
    t0, c0 = time.perf_counter(), time.process_time()
    steps = decoder.decode_many([ids for ids, _ in rows], None, [n for _, n in rows], set(), width=size)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    tokens = sum(len(s.tokens) for s in steps)
    if tokens != sum(n for _, n in rows):
        raise SystemExit(f"llama.cpp batched reference wrote {tokens} tokens, not {sum(n for _, n in rows)}")
    return wall, cpu, tokens


def _median_round(timed: list[tuple[float, float, int]]) -> tuple[float, float, int]:
    """The round of median tokens/s among (wall s, CPU s, tokens) rounds."""
    return sorted(timed, key=lambda x: x[2] / x[0])[len(timed) // 2]


def paired_batched(bank, requests: list[str], rows: list[tuple[list[int], int]], size: int, threads: int,
                   cap: int, rounds: int) -> dict:
    """Our batch of ``size`` and llama.cpp's batched decoding of the same rows on the shipped GGUF, alternated
    round by round (a host whose speed drifts slows both alike): the ratio of tokens/s per round and its median.
    This machine's speed moved by up to a third within one run of this bench; the ratio moves far less."""
    decoder = _rows_decoder(None, threads, size)
    ratios_, ours_tps, theirs_tps = [], [], []
    try:
        for _ in range(rounds):
            t0 = time.perf_counter()
            plans = bank.plan(requests, batch_size=size, max_new_tokens=cap, scope=False, copy_values=False)
            ours = sum(p.n_tokens for p in plans) / (time.perf_counter() - t0)
            wall, _, tokens = _decode_rows(decoder, rows, size)
            theirs = tokens / wall
            ratios_.append(ours / theirs)
            ours_tps.append(ours)
            theirs_tps.append(theirs)
    finally:
        decoder.close()
    # kept to 6 decimals: printed to 2, a ratio is rounded once (1.4949 rounded to 3 first would print 1.50)
    out = {"rounds": rounds, "ratio_median": round(statistics.median(ratios_), 6),
           "ratios": [round(x, 3) for x in ratios_], "ours_tokens_per_s": [round(x, 1) for x in ours_tps],
           "llama_cpp_tokens_per_s": [round(x, 1) for x in theirs_tps]}
    say(f"batch {size} paired with llama.cpp's batched decoding ({rounds} rounds, alternating): ours "
        f"{', '.join(f'{x:.1f}' for x in ours_tps)} tokens/s, llama.cpp {', '.join(f'{x:.1f}' for x in theirs_tps)}; "
        f"ratio per round {', '.join(f'{x:.2f}' for x in ratios_)} (median {out['ratio_median']:.2f})")
    return out


def paired(bank, requests: list[str], prompts: list[tuple[list[int], int]], run, cap: int, rounds: int) -> dict:
    """Batch-1 plans and llama.cpp on the same prompt and token count, alternated request by request, so that
    a machine whose speed drifts (a shared host) slows both sides alike: the ratio of the summed times per
    round, and its median over rounds."""
    ratios_, ours_s, theirs_s = [], 0.0, 0.0
    for _ in range(rounds):
        ours = theirs = 0.0
        for r, (ids, n) in zip(requests, prompts):
            t0 = time.perf_counter()
            bank.plan([r], batch_size=1, max_new_tokens=cap, scope=False, copy_values=False)
            t1 = time.perf_counter()
            run(ids, n)
            ours, theirs = ours + t1 - t0, theirs + time.perf_counter() - t1
        ratios_.append(ours / theirs)
        ours_s, theirs_s = ours_s + ours, theirs_s + theirs
    # kept to 6 decimals: printed to 2, a ratio is rounded once (1.4949 rounded to 3 first would print 1.50)
    out = {"rounds": rounds, "ratio_median": round(statistics.median(ratios_), 6),
           "ratios": [round(x, 3) for x in ratios_], "ours_mean_s": round(ours_s / rounds / len(prompts), 3),
           "llama_cpp_mean_s": round(theirs_s / rounds / len(prompts), 3)}
    say(f"batch 1 paired with llama.cpp ({rounds} rounds of {len(prompts)} requests, alternating): ours "
        f"{out['ours_mean_s']:.3f} s, llama.cpp {out['llama_cpp_mean_s']:.3f} s per request; time ratio per round "
        f"{', '.join(f'{x:.2f}' for x in ratios_)} (median {out['ratio_median']:.2f})")
    return out


def ratios(report: dict) -> list[str]:
    """The issue's targets, as measured, per engine."""
    lines = ["ratios (target in brackets):"]
    engines = report.get("engines", {})
    refs: dict = {}
    for row in engines.values():
        refs.update({k: v for k, v in row.items()
                     if k in ("llama_cpp", "llama_cpp_reencoded", "hf_float32", "hf_bfloat16") and v})

    def ref(key: str, field: str) -> float | None:
        return (refs.get(key) or {}).get(field)

    llama = ref("llama_cpp", "batch1_tokens_per_s")
    llama_b16 = ref("llama_cpp", "batch16_tokens_per_s")
    hf = max(filter(None, [ref("hf_float32", "batch16_tokens_per_s"), ref("hf_bfloat16", "batch16_tokens_per_s")]),
             default=None)
    hf_same = max(filter(None, [ref("hf_float32", "batch16_same_counts_tokens_per_s"),
                                ref("hf_bfloat16", "batch16_same_counts_tokens_per_s")]), default=None)
    for engine, r in engines.items():
        def tps(key: str) -> float | None:
            return (r.get(key) or {}).get("tokens_per_s")

        b1, b16, b16f = tps("batch1_grammar"), tps("batch16_grammar"), tps("batch16_free")
        lines.append(f" engine {engine}:")
        if r.get("batch1_paired"):
            lines.append(f"  batch-1 plan time / llama.cpp's, alternated request by request (same prompts, same "
                         f"token counts; grammar and LoRA on ours only): {r['batch1_paired']['ratio_median']:.2f}x  "
                         f"[<= 1.0x]")
        elif llama and b1:
            lines.append(f"  batch-1 plan time / llama.cpp's (same prompts, same token counts; grammar and LoRA "
                         f"on ours only): {llama / b1:.2f}x  [<= 1.0x]")
        if r.get("batch16_paired"):
            lines.append(f"  batch-16 tokens/s / llama.cpp batch-16, alternated round by round (same rows and counts, "
                         f"many sequences per forward pass): {r['batch16_paired']['ratio_median']:.2f}x  [>= 1.5x]")
        elif llama_b16 and b16:
            lines.append(f"  batch-16 tokens/s / llama.cpp batch-16 (same rows and counts, many sequences per "
                         f"forward pass): {b16 / llama_b16:.2f}x  [>= 1.5x]")
        re_b1, re_b16 = ref("llama_cpp_reencoded", "batch1_tokens_per_s"), ref("llama_cpp_reencoded",
                                                                                "batch16_tokens_per_s")
        one, many = (str(ref("llama_cpp_reencoded", f"encoding_{k}") or "?").upper() for k in ("batch1", "batched"))
        b1f, b1c = tps("batch1_free"), tps("batch1_copy")
        for label, num, den, target in (  # (what, numerator, denominator, target) of each plain ratio
                ("batch-16 tokens/s / llama.cpp batch-1", b16, llama, ""),
                (f"batch-1 plan time / llama.cpp's on the base re-encoded as {one} (our one-row merged models' "
                 f"encoding; tokens/s ratio)", re_b1, b1, ""),
                (f"batch-16 tokens/s / llama.cpp's batched on the base re-encoded as {many} (our batched merged "
                 f"models' encoding)", b16, re_b16, ""),
                ("batch-16 tokens/s / transformers generate batch-16, rows of uniform length (best dtype)", b16, hf,
                 ">= 1.0x"),
                ("batch-16 tokens/s / transformers generate batch-16, the same token counts (best dtype)", b16,
                 hf_same, ">= 1.0x"),
                ("constrained / free, batch 16", b16, b16f, ">= 0.95x"),
                ("constrained / free, batch 1", b1, b1f, ">= 0.95x"),
                ("constrained with copied values / free, batch 1", b1c, b1f, "")):
            if num and den:
                lines.append(f"  {label}: {num / den:.2f}x" + (f"  [{target}]" if target else ""))
        if r.get("out_of_scope_p50_s") is not None:
            lines.append(f"  out-of-scope plan, warm: {r['out_of_scope_p50_s']:.3f} s  [<= 1 s]")
    if report.get("cold"):
        lines.append(f" cold `skillbank plan` (default engine): {report['cold']['cli_plan_s']:.2f} s  [<= 3 s]")
        if report["cold"].get("cli_out_of_scope_s") is not None:
            lines.append(f" cold out-of-scope `skillbank plan`: {report['cold']['cli_out_of_scope_s']:.2f} s  [<= 1 s]")
        if report["cold"].get("cli_plan_new_shard_s") is not None:
            lines.append(f" cold `skillbank plan` of a shard not planned on this machine before: "
                         f"{report['cold']['cli_plan_new_shard_s']:.2f} s")
    return lines


# -- helpers --------------------------------------------------------------------------------------------
def _device_name(model) -> str:
    import torch
    device = next(model.parameters()).device
    return f"{device} ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else str(device)


def machine_state() -> str:
    load = os.getloadavg()
    return f"{os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"


def run_python(code: str, env: dict | None = None) -> None:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if proc.returncode:
        sys.exit(f"a child python failed:\n{proc.stderr[-3000:]}")


def say(msg: str) -> None:
    print(msg, flush=True)


if __name__ == "__main__":
    main()
