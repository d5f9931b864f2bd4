"""What the skill prior buys: graph EM with each shard's skill statistics weighing the executor's choice of skill
names, against the same bank without them, on requests written by hand and on the template held-out requests.

Every request is planned by its gold family's shard (the Oracle route) so that only the choice inside the family
differs, then routed by the bank (what a user gets). A bank learned before the skill statistics existed gets them
fitted here from the demo stream's training records and its shards' own catalog specs - what ``learn`` now writes
beside each shard - held in memory only (the bank's files are not touched).

    .venv/bin/python bench/skill_prior.py --bank runs/gate-bank-1205 --weights 0,0.25,0.5,1 --floors -5,-10
    .venv/bin/python bench/skill_prior.py --bank BANK --frozen     # also the frozen test set (choose nothing on it)
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
DEV = ["paraphrase_builtin", "paraphrase_builtin_holdout", "paraphrase_builtin_short"]
FROZEN = ["users_indomain"]


def read_records(names):
    from skillbank.data.records import Record
    return [Record.from_dict(json.loads(line)) for f in names
            for line in (FIXTURES / f"{f}.jsonl").read_text().splitlines() if line.strip()]


def ensure_skill_stats(bank, stream) -> list[str]:
    """Fit in memory the skill statistics of every shard that has none (see the module docstring)."""
    from skillbank.memory.skill_address import fit_skill_address
    fitted = []
    for name in bank.shard_names:
        if bank.skill_address(name) is not None:
            continue
        entry = bank._entry(name)
        specs = json.loads((bank.root / entry.dir / "skills.json").read_text()).get("specs", [])
        selector = fit_skill_address(stream.train[name], specs, bank.manifest.address_kind,
                                     bank.manifest.address_params)
        bank._skill_addresses[name] = ("", selector)  # the key a shard without stats files has
        fitted.append(name)
    return fitted


def scores_of(records, plans) -> dict[str, float]:
    """Graph EM, the exact set of skills (node-set exact) and argument F1, in percent."""
    from skillbank.graph import TaskGraph
    from skillbank.metrics import score_example
    scores = [score_example(r.graph, TaskGraph.from_dict(p.graph) if p.graph else None) for r, p in zip(records, plans)]
    n = max(1, len(scores))
    return {"em": round(100.0 * sum(s.graph_em for s in scores) / n, 1),
            "skills": round(100.0 * sum(s.node_set_exact for s in scores) / n, 1),
            "arg_f1": round(100.0 * sum(s.arg_f1 for s in scores) / n, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bank", type=Path, required=True, help="a bank of the five built-in families")
    ap.add_argument("--weights", default="0,0.5", help="prior weights to compare (0: no prior)")
    ap.add_argument("--floors", default="-5", help="floors under the prior's log-probability")
    ap.add_argument("--templates", type=int, default=20, help="template held-out requests per family")
    ap.add_argument("--frozen", action="store_true", help="also the frozen hand-written test set")
    ap.add_argument("--routed", action="store_true", help="also route each request with the bank")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--latency", type=int, default=0,
                    help="also time N development requests one at a time (batch 1), without and with the prior, "
                         "in alternating rounds")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from skillbank.memory.bank import SkillBank
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from gate_em import demo_stream

    _, stream = demo_stream()
    bank = SkillBank.open(args.bank)
    fitted = ensure_skill_stats(bank, stream)
    if fitted:
        print(f"skill statistics fitted in memory for {fitted} (the bank's shards have none)")
    sets = {"hand-written development": [r for r in read_records(DEV) if r.family in bank.shard_names],
            "template held-out": [r for f in bank.shard_names for r in stream.test[f][:args.templates]]}
    if args.frozen:
        sets["frozen hand-written test"] = [r for r in read_records(FROZEN) if r.family in bank.shard_names]
    weights = [float(w) for w in args.weights.split(",")]
    floors = [float(f) for f in args.floors.split(",")]
    rows = []
    for name, records in sets.items():
        for w in weights:
            for floor in (floors if w > 0 else [None]):
                row = {"set": name, "n": len(records), "weight": w, "floor": floor}
                for route in ["oracle"] + (["routed"] if args.routed else []):
                    t0 = time.perf_counter()
                    priors_for = {"skill_prior": w}
                    if floor is not None:
                        import skillbank.memory.skill_address as sa
                        sa.PRIOR_FLOOR = floor  # read by SkillBank.skill_priors when no floor is given
                    plans = []
                    if route == "oracle":
                        for fam in sorted({r.family for r in records}):
                            mine = [r for r in records if r.family == fam]
                            out = bank.plan([r.request for r in mine], shard=fam, batch_size=args.batch_size,
                                            **priors_for)
                            plans += list(zip(mine, out))
                        scores = scores_of([r for r, _ in plans], [p for _, p in plans])
                    else:
                        out = bank.plan([r.request for r in records], scope=False, batch_size=args.batch_size,
                                        **priors_for)
                        scores = scores_of(records, out)
                    row.update({f"{k}_{route}": v for k, v in scores.items()})
                    row[f"seconds_{route}"] = round(time.perf_counter() - t0, 1)
                rows.append(row)
                print(json.dumps(row), flush=True)
    latency = latency_rounds(bank, sets["hand-written development"][:args.latency], weights) if args.latency else {}
    if args.json:
        args.json.write_text(json.dumps({"bank": str(args.bank), "fitted_in_memory": fitted, "rows": rows,
                                         "latency": latency}, indent=1) + "\n")


def latency_rounds(bank, records, weights, rounds: int = 2) -> dict:
    """Batch-1 plan time and tokens/s per weight, the weights alternating within each round (a slow spell
    then falls on both); the first plan of each shard is made before timing."""
    for fam in sorted({r.family for r in records}):
        bank.plan([next(r.request for r in records if r.family == fam)], shard=fam, batch_size=1)
    totals = {w: [0.0, 0] for w in weights}
    for k in range(rounds):
        for w in (weights if k % 2 == 0 else list(reversed(weights))):
            for r in records:
                t0 = time.perf_counter()
                [p] = bank.plan([r.request], shard=r.family, batch_size=1, skill_prior=w)
                totals[w][0] += time.perf_counter() - t0
                totals[w][1] += p.tokens
    out = {}
    for w, (seconds, tokens) in totals.items():
        out[str(w)] = {"seconds_per_plan": round(seconds / (rounds * len(records)), 4),
                       "tokens_per_second": round(tokens / seconds, 1)}
        print(f"batch 1, weight {w}: {out[str(w)]['seconds_per_plan']:.3f} s a plan, "
              f"{out[str(w)]['tokens_per_second']} tokens/s", flush=True)
    return out


if __name__ == "__main__":
    main()
