"""Do the two engines write the same plans? Graph EM and identical outputs, llama.cpp vs the torch reference.

The llama.cpp engine runs the embedded base's Q4_1 GGUF with 8-bit activations; the reference runs the same
weights dequantized to float32, so a near-tie between two tokens can go either way. This plans the same
requests with both engines (routed by the Address Memory, scope gate off so every request is generated, the
shards' grammars on) and reports, per request set: graph EM on each engine, the share of requests whose raw
output is identical, route accuracy and the seconds each engine took. Sets: the built-in stream's template
held-out requests (the demo recipe's seed and sizes), the frozen hand-written test set
``tests/fixtures/users_indomain.jsonl`` and the hand-written development sets.

    .venv/bin/python bench/engine_parity.py --bank runs/gate-bank [--json results/engines/parity.json]

The bank must be on the embedded base (the only one with a GGUF here); ``bench/gate_em.py --make`` makes one.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
SETS = {"users_indomain (frozen test)": ["users_indomain"],
        "paraphrase_builtin* (development)": ["paraphrase_builtin", "paraphrase_builtin_holdout",
                                              "paraphrase_builtin_short"]}


def request_sets(families: list[str]) -> dict[str, list]:
    from skillbank.config import RunConfig, packaged_config
    from skillbank.data.builtin import build_builtin_stream
    from skillbank.data.records import Record

    run = RunConfig.from_toml(packaged_config("demo"))
    stream = build_builtin_stream(seed=run.stream.seed, train_per_family=run.stream.train_per_family,
                                  test_per_family=run.stream.test_per_family)
    sets = {"template held-out (built-in stream test split)": [r for f in families if f in stream.test
                                                              for r in stream.test[f]]}
    for name, files in SETS.items():
        records = [Record.from_dict(json.loads(line)) for f in files
                   for line in (FIXTURES / f"{f}.jsonl").read_text().splitlines() if line.strip()]
        sets[name] = [r for r in records if r.family in families]
    return sets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bank", type=Path, required=True, help="a bank on the embedded base")
    ap.add_argument("--batch-size", type=int, default=16, help="the torch engine's batch (llama.cpp: one at a time)")
    ap.add_argument("--limit", type=int, default=None, help="at most this many requests per set")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    from skillbank.graph import TaskGraph
    from skillbank.memory.bank import SkillBank
    from skillbank.metrics import score_example

    banks = {engine: SkillBank.open(args.bank, engine=engine) for engine in ("llama.cpp", "torch")}
    report: dict = {"bank": str(args.bank), "sets": {}}
    for name, records in request_sets(banks["torch"].shard_names).items():
        records = records[:args.limit] if args.limit else records
        requests = [r.request for r in records]
        plans, seconds = {}, {}
        for engine, bank in banks.items():
            t0 = time.perf_counter()
            plans[engine] = bank.plan(requests, scope=False, batch_size=args.batch_size)
            seconds[engine] = time.perf_counter() - t0
        row: dict = {"n": len(records)}
        for engine, ps in plans.items():
            em = [score_example(r.graph, TaskGraph.from_dict(p.graph) if p.graph else None).graph_em
                  for r, p in zip(records, ps)]
            row[f"em_{engine}"] = round(100 * sum(em) / len(em), 1)
            row[f"seconds_{engine}"] = round(seconds[engine], 1)
            row[f"tokens_{engine}"] = sum(p.tokens for p in ps)
        same = [a.raw == b.raw for a, b in zip(plans["llama.cpp"], plans["torch"])]
        row["identical_outputs"] = round(100 * sum(same) / len(same), 1)
        row["route_acc"] = round(100 * sum(p.shard == r.family for p, r in zip(plans["torch"], records)) / len(records), 1)
        row["differing"] = [{"request": r.request, "llama.cpp": a.raw, "torch": b.raw}
                            for r, a, b, s in zip(records, plans["llama.cpp"], plans["torch"], same) if not s][:10]
        report["sets"][name] = row
        print(f"{name}: n={row['n']}  EM llama.cpp {row['em_llama.cpp']:.1f} / torch {row['em_torch']:.1f}  "
              f"identical outputs {row['identical_outputs']:.1f}%  seconds {row['seconds_llama.cpp']:.0f} / "
              f"{row['seconds_torch']:.0f} (tokens {row['tokens_llama.cpp']} / {row['tokens_torch']})", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
