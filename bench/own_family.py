"""Your own family from a few examples: what an example family's executor plans on its frozen hand-written set.

Teaches an example family (``examples/<name>``: ``records.jsonl`` and ``tools.json``) into a new bank - and, with
``--demo-bank``, into a copy of a demo bank (K = 6) - with compositional augmentation off and on
(``skillbank.data.compose``), then plans the family's frozen in-domain set (``tests/fixtures/frozen/<name>_indomain.jsonl``,
written by someone shown only the catalog; no setting is chosen on it). One generation pass a request with the
gate off (every request planned; the gate's verdict is still reported), so "gate on" is the same plans with every
refused request counted a miss; the family's negatives (``examples/<name>/negatives.jsonl``) are given to its
gate, and with ``--refuse on`` its executor is also trained to refuse them, then the family's frozen off-domain set
is planned too: refused by the gate, by the executor, by either. Printed per variant: graph EM gate on / off, tool choice, argument-value F1, EM by
structure (single / chain / DAG), route accuracy (the family's own shard chosen, K = 6), learning time. With
``--records 20,40`` the records are subsampled (seeded, every structure kept in proportion) for the curve of EM
against the number of records.

    .venv/bin/python bench/own_family.py --family home_energy --compose off,on --out results/own-family
    .venv/bin/python bench/own_family.py --family dev_tools --demo-bank runs/demo/methods/fsm/bank
    .venv/bin/python bench/own_family.py --compose off --refuse off,on --into new   # the executor's second opinion
    .venv/bin/python bench/own_family.py --compose off --records 20,40 --min-steps 33 --into new   # more epochs

Each variant's figures are written to ``--out`` (JSON) with the command and the CPU; ``--rows`` adds every
request's plan and score.
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def subsample(records: list, n: int, seed: int = 0) -> list:
    """``n`` of ``records`` (all where ``n`` >= their number), each structure in proportion, seeded."""
    if n >= len(records):
        return list(records)
    rng = random.Random(seed)
    by: dict[str, list] = {}
    for r in records:
        by.setdefault(r.structure, []).append(r)
    picked = []
    for structure, group in sorted(by.items()):
        picked += rng.sample(group, max(1, round(n * len(group) / len(records))))
    return sorted(picked[:n], key=lambda r: records.index(r))


def score(plans, gold_records, family: str) -> dict:
    from skillbank.graph import TaskGraph
    from skillbank.metrics import score_example

    rows = []
    for p, r in zip(plans, gold_records):
        pred = None
        if p.graph is not None:
            try:
                pred = TaskGraph.from_dict(p.graph)
            except Exception:  # noqa: BLE001 - an invalid output counts as wrong, never as a crash
                pred = None
        s = score_example(r.graph, pred)
        rows.append({"id": r.id, "structure": r.structure, "em": bool(s.graph_em), "tool": s.tool_choice, "arg_f1": s.arg_f1,
                     "kept": not p.out_of_scope, "routed_home": p.shard == family, "shard": p.shard,
                     "graph": p.graph})

    def pct(values) -> float | None:
        values = list(values)
        return round(100 * statistics.mean(values), 1) if values else None

    out = {"n": len(rows), "em_gate_off": pct(r["em"] for r in rows),
           "em_gate_on": pct(r["em"] and r["kept"] for r in rows), "kept": pct(r["kept"] for r in rows),
           "tool_choice": pct(r["tool"] for r in rows), "arg_f1": pct(r["arg_f1"] for r in rows),
           "route": pct(r["routed_home"] for r in rows)}
    for structure in ("single", "chain", "dag"):
        out[f"em_{structure}"] = pct(r["em"] for r in rows if r["structure"] == structure)
        out[f"n_{structure}"] = sum(r["structure"] == structure for r in rows)
    return out, rows


def refusals(bank, family: str) -> dict:
    """The gate's and the executor's refusals of the family's frozen off-domain set (near misses apart); the
    executor plans every request (scope=False), so its verdict is known for those the gate refuses too."""
    off = [json.loads(line) for line in (ROOT / "tests" / "fixtures" / "frozen" / f"{family}_offdomain.jsonl")
           .read_text().splitlines() if line.strip()]
    requests = [r["request"] for r in off]
    gate = [v.in_scope is False for v in bank.check_scope(requests)]
    plans = bank.plan(requests, scope=False)
    executor = ["executor has no skill" in (p.reason or "") for p in plans]
    near = [r.get("category") == "near_miss" for r in off]

    def pct(flags, where=None):
        chosen = [f for f, w in zip(flags, where or [True] * len(flags)) if w]
        return round(100 * sum(chosen) / len(chosen), 1) if chosen else None
    either = [a or b for a, b in zip(gate, executor)]
    return {"n_off": len(off), "n_near": sum(near), "gate": pct(gate), "executor": pct(executor),
            "gate_or_executor": pct(either), "near_gate": pct(gate, near), "near_executor": pct(executor, near),
            "near_gate_or_executor": pct(either, near)}


def variant(family: str, records: list, catalog, gold: list, *, compose: bool, demo_bank: Path | None,
            work: Path, name: str, refuse: bool = False, min_steps: int = 0) -> dict:
    from skillbank.data.compose import Compose
    from skillbank.data.negatives import read_negatives
    from skillbank.memory.bank import SkillBank
    from skillbank.train.executor import TrainConfig

    bank_dir = work / name
    if demo_bank is not None:
        shutil.copytree(demo_bank, bank_dir)
        bank = SkillBank.open(bank_dir)
    else:
        bank = SkillBank.create(bank_dir)
    t0 = time.perf_counter()
    negatives_file = ROOT / "examples" / family / "negatives.jsonl"
    negatives = read_negatives(negatives_file) if negatives_file.is_file() else None
    train_config = None
    if min_steps:  # the small-cpu recipe with as many epochs as reach min_steps optimizer steps (at least its 3)
        recipe = TrainConfig.for_small_cpu()
        batches = -(-len(records) // recipe.batch_size)
        train_config = TrainConfig.for_small_cpu(epochs=max(recipe.epochs, -(-min_steps // batches)))
    entry = bank.learn(family, records, train_config, catalog=catalog, compose=Compose() if compose else None,
                       negatives=negatives, executor_refuses=refuse)
    learn_s = time.perf_counter() - t0
    del bank
    planner = SkillBank.open(bank_dir)
    t0 = time.perf_counter()
    plans = planner.plan([r.request for r in gold], scope=False)
    plan_s = time.perf_counter() - t0
    figures, rows = score(plans, gold, family)
    figures["executor_refused_in_domain"] = round(100 * sum("executor has no skill" in (p.reason or "") for p in plans)
                                                  / len(plans), 1)
    figures["off_domain"] = refusals(planner, family)
    figures.update({"variant": name, "records": len(records), "compose": compose, "k": len(planner.shard_names),
                    "executor_refuses": refuse, "refusal": entry.training.get("refusal"),
                    "learn_seconds": round(learn_s, 1), "plan_seconds": round(plan_s, 1),
                    "train_examples": entry.training["examples"], "final_loss": entry.training["final_loss"],
                    "augmentation": entry.training.get("augmentation"), "lineage": entry.lineage})
    return figures, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="home_energy", help="an example family: examples/<family>/")
    ap.add_argument("--compose", default="off,on", help="comma list of off/on")
    ap.add_argument("--records", default="all", help="comma list of record counts (all: every record)")
    ap.add_argument("--refuse", default="off", help="comma list of off/on: the executor also trained to refuse "
                    "the family's negatives (examples/<family>/negatives.jsonl, always given to the gate)")
    ap.add_argument("--demo-bank", type=Path, default=None, help="also teach it into a copy of this bank (K = 6)")
    ap.add_argument("--into", default="new,demo", help="which banks: new (a new bank), demo (a copy of --demo-bank)")
    ap.add_argument("--min-steps", type=int, default=0, help="train at least this many optimizer steps: the recipe's "
                    "epochs raised for few records (0: the recipe as it is)")
    ap.add_argument("--out", type=Path, default=None, help="write the figures here (JSON)")
    ap.add_argument("--rows", type=Path, default=None, help="also write every request's plan and score here (JSON; "
                    "keep it under runs/, not results/)")
    args = ap.parse_args()

    from skillbank.data.records import read_records
    from skillbank.data.tool_formats import load_catalog
    from skillbank.model.encoding_choice import cpu_identity

    here = ROOT / "examples" / args.family
    records = read_records(here / "records.jsonl").records
    catalog = load_catalog(here / "tools.json", args.family)
    gold = read_records(ROOT / "tests" / "fixtures" / "frozen" / f"{args.family}_indomain.jsonl").records
    counts = [len(records) if c == "all" else int(c) for c in args.records.split(",")]
    into = args.into.split(",")
    targets = ([("new", None)] if "new" in into else []) + \
        ([("demo", args.demo_bank)] if args.demo_bank and "demo" in into else [])
    results, all_rows = [], {}
    print(f"{args.family}: {len(records)} records, frozen set {len(gold)} requests; CPU {cpu_identity()}",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="own-family-") as tmp:
        for where, bank in targets:
            for n in counts:
                for mode, refuse in [(m, r) for m in args.compose.split(",") for r in args.refuse.split(",")]:
                    name = f"{where}-{n}-compose-{mode}" + ("-refuse" if refuse == "on" else "") + \
                        (f"-steps{args.min_steps}" if args.min_steps else "")
                    figures, rows = variant(args.family, subsample(records, n), catalog, gold, compose=mode == "on",
                                            demo_bank=bank, work=Path(tmp), name=name, refuse=refuse == "on",
                                            min_steps=args.min_steps)
                    results.append(figures)
                    all_rows[name] = rows
                    print(f"{name:<28} K={figures['k']} EM gate on/off {figures['em_gate_on']}/{figures['em_gate_off']}"
                          f" (single {figures['em_single']}, chain {figures['em_chain']}, dag {figures['em_dag']}); "
                          f"tool {figures['tool_choice']}, arg F1 {figures['arg_f1']}, kept {figures['kept']}, "
                          f"route {figures['route']}; learn {figures['learn_seconds']} s "
                          f"({figures['train_examples']} examples, loss {figures['final_loss']:.3f}); executor "
                          f"refused {figures['executor_refused_in_domain']}% in domain; off domain "
                          f"{figures['off_domain']}", flush=True)
    meta = {"command": " ".join(sys.argv), "cpu": cpu_identity(), "date": time.strftime("%Y-%m-%d")}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.family}.json").write_text(json.dumps({**meta, "results": results}, indent=1))
    if args.rows:
        args.rows.parent.mkdir(parents=True, exist_ok=True)
        args.rows.write_text(json.dumps({**meta, "rows": all_rows}, indent=1))


if __name__ == "__main__":
    main()
