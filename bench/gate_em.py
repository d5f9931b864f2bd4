"""What the scope gate costs in plans: graph EM on hand-written in-domain requests with the gate on vs off.

One generation pass per request with the gate off (``scope=False``: every request is planned, and the gate's
verdict is still reported); "gate on" is the same plans with every request the gate refuses counted as a
miss, which is exactly what a user with the gate on gets (greedy decoding: a kept request is planned the
same either way). Requests: the frozen test set ``tests/fixtures/users_indomain.jsonl`` and the older
hand-written development sets, each reported on its own.

With ``--gates`` the same plans are also counted under other gates: scope detectors fitted on the demo
stream's training requests of the bank's families with bench/scope.py's settings (``values``: the value
reader, what banks made from 2026-12-03 hold; ``outliers-one``: plus one discriminant against the outlier corpus;
``outliers``: one per category of it, a bank's of 2026-12-06; ``new``: plus short values read as the families'
objects and each family on its own scale, a new bank's; ``new+negatives``: plus the built-in families' negatives),
so that one generation pass prices each.

Next to the bank's own router it also scores FSM's lexical Address Memory (``hashing-nb``, fitted on the same
training requests, stage by stage): a request it routes elsewhere is planned again by the shard it picks
(the rest share the bank's plan: same shard, same greedy output), so the two EM columns differ only by routing.

    .venv/bin/python bench/gate_em.py --bank runs/demo/methods/fsm/bank
    .venv/bin/python bench/gate_em.py --make runs/gate-bank     # first learn the five built-in families
                                                                # with the demo's recipe (about 30 min here)
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


def demo_stream():
    """The demo's run configuration and its stream (what the bank is learned from)."""
    from skillbank.config import RunConfig, packaged_config
    from skillbank.data.builtin import build_builtin_stream

    run = RunConfig.from_toml(packaged_config("demo"))
    return run, build_builtin_stream(seed=run.stream.seed, train_per_family=run.stream.train_per_family,
                                     test_per_family=run.stream.test_per_family)


def make_bank(path: Path) -> None:
    from skillbank.memory.bank import SkillBank
    from skillbank.model.base import load_base

    run, stream = demo_stream()
    bank = SkillBank.create(path, base=load_base(run.base_config()))
    for family in stream.family_keys:
        t0 = time.perf_counter()
        bank.learn(family, stream.train[family], run.train_config(), catalog=stream.catalog)
        print(f"learned {family} in {time.perf_counter() - t0:.0f} s", flush=True)


def lexical_router(bank):
    """FSM's Address Memory fitted on the demo stream's training requests of the bank's families, in its order."""
    from skillbank.memory.address import HashingNBAddress

    _, stream = demo_stream()
    router = HashingNBAddress()
    for family in bank.shard_names:
        router.partial_fit([r.request for r in stream.train[family]], family)
    return router


def other_gates(bank, names: list[str]) -> dict:
    """name -> a scope detector with bench/scope.py's settings of that name, fitted on the demo stream's
    training requests of the bank's families (as the bank's learn would have fitted it)."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from scope import GATES

    from skillbank.experiments.scope import detector_for_stream
    _, stream = demo_stream()
    gates = {**GATES, **NEW_GATES}
    unknown = [n for n in names if n not in gates and n != NEGATIVES_GATE]
    if unknown:
        raise SystemExit(f"unknown gate(s) {unknown}; choose from {sorted([*gates, NEGATIVES_GATE])}")
    out = {}
    for n in names:
        if n != NEGATIVES_GATE:
            out[n] = detector_for_stream(stream, families=bank.shard_names, **gates[n])
            continue
        # a new bank's gate holding the built-in negatives (30+ a family: nothing synthesized, as learn does)
        from skillbank.data.negatives import read_negatives
        from skillbank.memory.bank import family_negatives
        det = detector_for_stream(stream, families=bank.shard_names, **NEW_GATES["new"])
        given = read_negatives(Path(__file__).resolve().parents[1] / "src" / "skillbank" / "resources" / "negatives"
                               / "builtin.jsonl")
        for k in det.classes_:
            specs = [stream.catalog.skills[s].to_dict() for s in stream.catalog.family(k).skills]
            det.fit_negatives(k, family_negatives(k, specs, stream.train[k], [g for g in given if g.family == k]))
        out[n] = det
    return out


#: A new bank's gate since 2026-12-07 (short values read as objects, each family on its own scale); with
#: ``new+negatives`` it also holds the built-in families' negatives.
NEW_GATES = {"new": {"reader": "values", "outliers": "builtin", "objects": True, "family_scales": True}}
NEGATIVES_GATE = "new+negatives"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bank", type=Path, help="an existing bank of the five built-in families")
    ap.add_argument("--make", type=Path, help="make the bank here first (the demo's recipe)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--gates", default="", help="comma-separated gates to price besides the bank's own: "
                    "values, outliers-one, outliers, raw, new, new+negatives")
    args = ap.parse_args()
    if (args.bank is None) == (args.make is None):
        ap.error("give exactly one of --bank, --make")
    if args.make is not None:
        make_bank(args.make)
        args.bank = args.make

    from skillbank.data.records import Record
    from skillbank.graph import TaskGraph
    from skillbank.memory.bank import SkillBank
    from skillbank.metrics import score_example

    bank = SkillBank.open(args.bank)
    lexical = lexical_router(bank)
    gates = other_gates(bank, [g for g in args.gates.split(",") if g])
    report = {"bank": str(args.bank), "router": {"kind": bank.manifest.address_kind,
                                                 "params": bank.manifest.address_params}}
    for name, files in SETS.items():
        records = [Record.from_dict(json.loads(line)) for f in files
                   for line in (FIXTURES / f"{f}.jsonl").read_text().splitlines() if line.strip()]
        records = [r for r in records if r.family in bank.shard_names]
        t0 = time.perf_counter()
        plans = bank.plan([r.request for r in records], scope=False, batch_size=args.batch_size)
        seconds = time.perf_counter() - t0
        em = [score_example(r.graph, TaskGraph.from_dict(p.graph) if p.graph else None).graph_em
              for r, p in zip(records, plans)]
        kept = [not p.out_of_scope for p in plans]
        off = 100 * sum(em) / len(em)
        on = 100 * sum(e for e, k in zip(em, kept) if k) / len(em)
        lost = sum(1 for e, k in zip(em, kept) if e and not k)
        row = {"n": len(records), "em_gate_off": round(off, 1), "em_gate_on": round(on, 1),
               "kept": round(100 * sum(kept) / len(kept), 1), "correct_plans_refused": lost,
               "route_acc": round(100 * sum(p.shard == r.family for p, r in zip(plans, records)) / len(records), 1),
               "seconds": round(seconds, 1)}
        # the same requests routed by the lexical Address Memory: only those it sends elsewhere are planned again
        routes = lexical.predict([r.request for r in records])
        lex_em = list(em)
        for shard in sorted(set(routes)):
            idx = [i for i, (p, s) in enumerate(zip(plans, routes)) if s == shard and p.shard != shard]
            if idx:
                again = bank.plan([records[i].request for i in idx], shard=shard, batch_size=args.batch_size)
                for i, p in zip(idx, again):
                    lex_em[i] = score_example(records[i].graph,
                                              TaskGraph.from_dict(p.graph) if p.graph else None).graph_em
        row["lexical_router"] = {"route_acc": round(100 * sum(s == r.family for s, r in zip(routes, records)) / len(records), 1),
                                 "em_gate_off": round(100 * sum(lex_em) / len(lex_em), 1)}
        for gate, det in gates.items():
            keep = det.predict([r.request for r in records])
            row.setdefault("gates", {})[gate] = {
                "em_gate_on": round(100 * sum(e for e, k in zip(em, keep) if k) / len(em), 1),
                "kept": round(100 * float(keep.mean()), 1),
                "correct_plans_refused": int(sum(1 for e, k in zip(em, keep) if e and not k))}
        report[name] = row
        print(f"{name}: n={row['n']}  EM gate off {off:.1f}  gate on {on:.1f}  (kept {row['kept']}%, "
              f"{lost} correct plans refused; routed to the right family {row['route_acc']}%); with the lexical "
              f"Address Memory: EM gate off {row['lexical_router']['em_gate_off']}, routed right "
              f"{row['lexical_router']['route_acc']}%", flush=True)
        for gate, g in row.get("gates", {}).items():
            print(f"  gate {gate}: EM gate on {g['em_gate_on']} (kept {g['kept']}%, {g['correct_plans_refused']} "
                  "correct plans refused)", flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
