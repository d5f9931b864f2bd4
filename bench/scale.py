"""How a bank's costs grow with the number of families K: open time and resident memory, learn time
without training, routing latency and accuracy, at K = 5, 100 and 1,000.

A synthetic stream (``skillbank.data.synthetic``, labelled synthetic) gives K_max families. One LoRA
adapter of the small-CPU recipe's shape (rank 16 on q/k/v/o, fresh weights: the mechanics measured here
do not depend on what an adapter learned) is saved once; every family is then learned with
``SkillBank.learn(..., pretrained=<a copy of it>)``, which runs everything ``learn`` does except training:
loading the adapter, writing the shard and its digests, updating the Address Memory and its scope
statistics, publishing the manifest. The bank keeps at most ``--max-resident`` shards loaded while it is
built. At each K of ``--ks``:

  - ``open``: a fresh Python process opens the bank (``SkillBank.open``; the base model loaded from its
    cache) and reports the wall time of ``open`` and its resident memory (VmRSS) after opening;
  - ``learn``: the median wall time of the learns that brought the bank to K (the last few);
  - ``route``: Address Memory route accuracy on the held-out requests of the K families learned, and the
    median times of routing one request and of its scope check, one request at a time.

Prints one row per K and the ratios against the smallest K, and plots cost vs K. Then, on the finished bank,
the memory of a long-running planner: a fresh process opens it with ``--max-resident`` shards and plans one
request on each of ``--resident-shards`` distinct shards in turn (every use past the bound evicts one), and
reports its resident memory every 20 shards against the memory after the first 5 - it must stop growing
(shards, their grammars and the freed heap are all bounded). Disk: K_max shards of ~7 MB. Time here: about
10 minutes for K_max = 1,000, plus ~4 minutes for the memory probe.

    .venv/bin/python bench/scale.py [--ks 5,100,1000] [--out runs/bench-scale]
    .venv/bin/python bench/scale.py --resident-only [--out runs/bench-scale]    # the memory probe alone, on
                                                                                # the bank a full run left
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from skillbank.data.synthetic import build_synthetic_stream
from skillbank.memory.bank import SkillBank
from skillbank.model.base import load_base
from skillbank.train.executor import TrainConfig, add_lora, common_prefix

OPEN_PROBE = """
import json, sys, time
t0 = time.perf_counter()
from skillbank.model.base import load_base
base = load_base(progress=False)
t1 = time.perf_counter()
from skillbank.memory.bank import SkillBank
bank = SkillBank.open(sys.argv[1], base=base)
t2 = time.perf_counter()
rss = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS:"))
print(json.dumps({"base_seconds": t1 - t0, "open_seconds": t2 - t1, "rss_mb": rss / 1024,
                  "shards": len(bank.shard_names), "loaded": len(bank.execution.resident)}))
"""


RESIDENT_PROBE = """
import gc, json, sys
from skillbank.memory.bank import SkillBank
def rss():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS:")) / 1024
bank_dir, requests_file, max_resident = sys.argv[1], sys.argv[2], int(sys.argv[3])
requests = json.load(open(requests_file))  # shard name -> one request, in the order to plan with them
bank = SkillBank.open(bank_dir, max_resident=max_resident)
names = list(requests)
for i, name in enumerate(names, start=1):
    bank.plan([requests[name]], shard=name, max_new_tokens=48)
    if i == 5 or i % 20 == 0 or i == len(names):
        gc.collect()
        ex = bank.engine  # what plans: the llama.cpp engine keeps its models in `loaded`, torch its shards in `resident`
        print(json.dumps({"shards_used": i, "rss_mb": rss(), "engine": type(ex).__name__,
                          "resident": len(ex.loaded if hasattr(ex, "loaded") else ex.resident),
                          "loads": getattr(ex, "loads", None)}), flush=True)
"""


def template_adapter(base, cfg: TrainConfig, out: Path) -> Path:
    """One saved adapter of the recipe's shape; each family gets a copy with its own training.json."""
    add_lora(base, "template", cfg)
    base.save_adapter("template", out)
    base.remove_adapter("template")
    return out


def pretrained_copy(template: Path, out: Path, cfg: TrainConfig, prefix: str, n_examples: int) -> Path:
    shutil.copytree(template, out)
    summary = {"adapter_name": out.name, "examples": n_examples, "epochs": 0, "steps": 0, "wall_seconds": 0.0,
               "tokens_per_second": 0.0, "final_loss": None, "max_target_tokens": 64, "family_prefix": prefix,
               "config": cfg.to_dict(), "note": "bench/scale.py: untrained adapter (mechanics only)"}
    (out / "training.json").write_text(json.dumps(summary))
    return out


def probe_open(bank_dir: Path) -> dict:
    run = subprocess.run([sys.executable, "-c", OPEN_PROBE, str(bank_dir)], capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"open probe failed: {run.stderr[-2000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def route_point(bank: SkillBank, stream, families: list[str], sample: int = 200) -> dict:
    test = [(r.request, f) for f in families for r in stream.test[f]]
    predicted, _ = bank.route([q for q, _ in test])
    accuracy = float(np.mean([p == g for p, (_, g) in zip(predicted, test)]))
    rng = np.random.default_rng(0)
    route_times, scope_times = [], []
    for i in rng.choice(len(test), min(sample, len(test)), replace=False):
        t0 = time.perf_counter()
        bank.route([test[i][0]])
        t1 = time.perf_counter()
        bank.check_scope([test[i][0]])
        route_times.append((t1 - t0) * 1000)
        scope_times.append((time.perf_counter() - t1) * 1000)
    return {"route_accuracy": accuracy, "route_ms": float(np.median(route_times)),
            "scope_ms": float(np.median(scope_times)), "route_requests": len(test)}


def probe_resident(bank_dir: Path, requests: dict[str, str], max_resident: int) -> list[dict]:
    """RSS of a fresh process planning ``requests`` (shard -> request) on their shards in turn, every 20 shards."""
    requests_file = bank_dir.parent / "resident_requests.json"
    requests_file.write_text(json.dumps(requests))
    run = subprocess.run([sys.executable, "-c", RESIDENT_PROBE, str(bank_dir), str(requests_file), str(max_resident)],
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"resident-memory probe failed: {run.stderr[-2000:]}")
    return [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]


def report_resident(rows: list[dict], out: Path, max_resident: int) -> None:
    first = rows[0]
    print(f"\nplanning on distinct shards with max_resident = {max_resident} (RSS against after "
          f"{first['shards_used']} shards, {first['rss_mb']:.0f} MB)")
    print(f"{'shards used':>11} {'RSS MB':>8} {'growth MB':>10} {'x':>6} {'resident':>8} {'loads':>6}")
    for r in rows:
        print(f"{r['shards_used']:>11} {r['rss_mb']:>8.0f} {r['rss_mb'] - first['rss_mb']:>+10.1f} "
              f"{r['rss_mb'] / first['rss_mb']:>5.2f}x {r['resident']:>8} {str(r['loads']):>6}")
    (out / "resident.json").write_text(json.dumps({"max_resident": max_resident, "rows": rows}, indent=1) + "\n")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 3.4))
    ax.plot([r["shards_used"] for r in rows], [r["rss_mb"] - first["rss_mb"] for r in rows], marker="o")
    ax.set_xlabel("distinct shards planned with, in turn")
    ax.set_ylabel(f"RSS growth since {first['shards_used']} shards (MB)")
    ax.set_title(f"Planner memory with max_resident = {max_resident} (bench/scale.py)", fontsize=9)
    ax.set_ylim(bottom=min(0, *(r["rss_mb"] - first["rss_mb"] for r in rows)))
    fig.tight_layout()
    fig.savefig(out / "resident.png", dpi=120)
    plt.close(fig)
    print(f"wrote {out / 'resident.json'} and {out / 'resident.png'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ks", default="5,100,1000", help="comma-separated K values to measure at")
    ap.add_argument("--train-per-family", type=int, default=20)
    ap.add_argument("--test-per-family", type=int, default=5)
    ap.add_argument("--max-resident", type=int, default=4)
    ap.add_argument("--resident-shards", type=int, default=120,
                    help="distinct shards the memory probe plans with (at most K_max)")
    ap.add_argument("--resident-only", action="store_true",
                    help="only the memory probe, on the bank an earlier full run left in --out")
    ap.add_argument("--out", type=Path, default=Path("runs/bench-scale"))
    args = ap.parse_args()
    ks = sorted(int(k) for k in args.ks.split(","))
    if args.resident_only:
        if not (args.out / "bank" / "bank.json").is_file():
            sys.exit(f"{args.out / 'bank'}: no bank there; run bench/scale.py without --resident-only first")
        stream = build_synthetic_stream(families=ks[-1], seed=0, train_per_family=args.train_per_family,
                                        test_per_family=args.test_per_family)
        run_resident(args, stream)
        return
    if args.out.exists():
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True)
    stream = build_synthetic_stream(families=ks[-1], seed=0, train_per_family=args.train_per_family,
                                    test_per_family=args.test_per_family)
    families = stream.family_keys
    cfg = TrainConfig.for_small_cpu()
    base = load_base(progress=False)
    template = template_adapter(base, cfg, args.out / "template")
    bank = SkillBank.create(args.out / "bank", base=base)
    bank.execution.max_resident = args.max_resident
    rows, learn_seconds = [], []
    print(f"building a bank of {ks[-1]} synthetic families (learn without training), measuring at K = {ks}",
          file=sys.stderr, flush=True)
    for k, family in enumerate(families, start=1):
        skills = list(stream.catalog.family(family).skills)
        pre = pretrained_copy(template, args.out / "pre" / family, cfg, common_prefix(sorted(skills)),
                              len(stream.train[family]))
        t0 = time.perf_counter()
        # init="fresh": a pretrained adapter was trained from a fresh LoRA, not from the bank's merged start
        bank.learn(family, stream.train[family], cfg, catalog=stream.catalog, pretrained=pre, progress=False,
                   init="fresh")
        learn_seconds.append(time.perf_counter() - t0)
        bank.execution.ensure_resident([family])  # applies max_resident to the bank being built
        shutil.rmtree(pre)
        if k % 100 == 0:
            print(f"  K = {k}: last learn {learn_seconds[-1]:.2f} s", file=sys.stderr, flush=True)
        if k in ks:
            point = {"k": k, "learn_seconds": statistics.median(learn_seconds[-5:]), **probe_open(args.out / "bank"),
                     **route_point(bank, stream, families[:k])}
            rows.append(point)
            print(json.dumps(point), flush=True)
    first = rows[0]
    print(f"\n{'K':>6} {'open s':>8} {'x':>6} {'RSS MB':>8} {'x':>6} {'learn s':>8} {'x':>6} "
          f"{'route ms':>9} {'x':>6} {'scope ms':>9} {'route acc':>9}")
    for r in rows:
        print(f"{r['k']:>6} {r['open_seconds']:>8.3f} {r['open_seconds'] / first['open_seconds']:>5.2f}x "
              f"{r['rss_mb']:>8.0f} {r['rss_mb'] / first['rss_mb']:>5.2f}x {r['learn_seconds']:>8.3f} "
              f"{r['learn_seconds'] / first['learn_seconds']:>5.2f}x {r['route_ms']:>9.3f} "
              f"{r['route_ms'] / first['route_ms']:>5.2f}x {r['scope_ms']:>9.3f} {r['route_accuracy']:>8.1%}")
    (args.out / "scale.json").write_text(json.dumps(rows, indent=1) + "\n")
    plot(rows, args.out / "scale.png")
    print(f"\nwrote {args.out / 'scale.json'} and {args.out / 'scale.png'}; the base model itself takes "
          f"{first['base_seconds']:.1f} s to load in each open probe (not part of open)")
    del bank, base  # the probe process loads its own base: do not hold a second one while it measures
    run_resident(args, stream)


def run_resident(args, stream) -> None:
    """The memory probe on the bank in ``args.out``, with one held-out request per shard it plans with."""
    names = stream.family_keys[:min(args.resident_shards, len(stream.family_keys))]
    requests = {name: stream.test[name][0].request for name in names}
    print(f"\nmemory probe: planning on {len(names)} distinct shards, max_resident = {args.max_resident}",
          file=sys.stderr, flush=True)
    report_resident(probe_resident(args.out / "bank", requests, args.max_resident), args.out,
                    args.max_resident)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ks = [r["k"] for r in rows]
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.4))
    for ax, key, label in zip(axes, ("open_seconds", "rss_mb", "learn_seconds", "route_ms"),
                              ("SkillBank.open (s)", "RSS after open (MB)", "learn without training (s)",
                               "routing one request (ms)")):
        ax.plot(ks, [r[key] for r in rows], marker="o")
        ax.set_xscale("log")
        ax.set_xlabel("families K")
        ax.set_title(label, fontsize=9)
        ax.set_ylim(bottom=0)
    fig.suptitle("Cost vs number of families (synthetic families; bench/scale.py)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
