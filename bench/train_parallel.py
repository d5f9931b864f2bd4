"""Training FSM families side by side: two one-thread processes vs one two-thread process, on the embedded base.

FSM's fresh executors are independent given their family's records, so a bank can train two families at
once (``[runner] parallel_stages``) instead of one after the other with every core. Which is faster on a
small CPU depends on how well one training step uses two threads: this 135M model's matrices are small and
much of a step (LoRA products, element-wise ops, Python) runs on one thread. This times both on the same
work - two families' records, the demo's recipe (rank 64 on the attention projections, batch 8, bf16
autocast where the CPU has it), one epoch each - alternating the two layouts round by round so that a drift
of the host's speed hits both, and prints the time for the pair and the ratio per round.

    .venv/bin/python bench/train_parallel.py [--records 48] [--rounds 2] [--cores 2]

Each training runs in a process of its own (the base loaded before the clock starts; the side-by-side
workers wait for a common start time), so only ``fit`` is timed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

FAMILIES = ("t2_language_speech", "t5_generation_editing")


def worker(family: str, records: int, threads: int, start_at: float) -> None:
    from dataclasses import replace

    import torch

    from skillbank.config import RunConfig, packaged_config
    from skillbank.data.builtin import build_builtin_stream
    from skillbank.model.base import load_base
    from skillbank.train import loop
    from skillbank.train.executor import add_lora, build_examples, common_prefix

    run = RunConfig.from_toml(packaged_config("demo"))
    cfg = run.train_config()
    base = load_base(replace(run.base_config(), threads=threads), progress=False)
    stream = build_builtin_stream(seed=0, train_per_family=max(records, 8), test_per_family=1)
    recs = stream.train[family][:records]
    prefix = common_prefix(sorted({t for r in recs for t in r.graph.tasks}))
    examples, _ = build_examples(base, recs, cfg, prefix)
    one_epoch = type(cfg)(**{**cfg.to_dict(), "epochs": 1})
    add_lora(base, family, one_epoch)
    time.sleep(max(0.0, start_at - time.time()))
    t0 = time.time()
    result = loop.fit(base, examples, one_epoch, adapter=family, progress=False)
    print(json.dumps({"family": family, "threads": torch.get_num_threads(), "start": t0, "end": time.time(),
                      "tokens": result.total_tokens}), flush=True)


def _spawn(family: str, records: int, threads: int, start_at: float) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.Popen([sys.executable, __file__, "--worker", family, "--records", str(records),
                             "--threads", str(threads), "--start-at", repr(start_at)],
                            stdout=subprocess.PIPE, text=True, env=env)


def _results(procs: list[subprocess.Popen]) -> list[dict]:
    out = []
    for p in procs:
        stdout, _ = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"a training worker failed (exit {p.returncode})")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def side_by_side(records: int, cores: int) -> tuple[float, int]:
    start_at = time.time() + 25  # both load the base first; the clock starts together
    rows = _results([_spawn(f, records, 1, start_at) for f in FAMILIES[:cores]])
    return max(r["end"] for r in rows) - min(r["start"] for r in rows), sum(r["tokens"] for r in rows)


def one_after_another(records: int, cores: int) -> tuple[float, int]:
    wall, tokens = 0.0, 0
    for f in FAMILIES[:cores]:
        (row,) = _results([_spawn(f, records, cores, time.time())])
        wall += row["end"] - row["start"]
        tokens += row["tokens"]
    return wall, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=48, help="training records per family (batch 8)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cores", type=int, default=2, help="processes side by side = threads of the single process")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.records, args.threads, args.start_at)
        return
    if args.cores > len(FAMILIES):
        raise SystemExit(f"--cores at most {len(FAMILIES)}")
    print(f"{args.cores} families x {args.records} records, one epoch each; load {os.getloadavg()[0]:.2f}", flush=True)
    ratios = []
    for r in range(args.rounds):
        walls = {}
        for layout in ("serial", "parallel") if r % 2 == 0 else ("parallel", "serial"):
            wall, tokens = (one_after_another if layout == "serial" else side_by_side)(args.records, args.cores)
            walls[layout] = wall
            what = (f"1 process x {args.cores} threads, one family after another" if layout == "serial"
                    else f"{args.cores} processes x 1 thread, side by side")
            print(f"round {r + 1} {what}: {wall:6.1f} s, {tokens / wall:6.1f} tokens/s", flush=True)
        ratios.append(walls["serial"] / walls["parallel"])
    print(f"side by side is {statistics.median(ratios):.2f}x faster (rounds: {', '.join(f'{x:.2f}' for x in ratios)}); "
          f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
