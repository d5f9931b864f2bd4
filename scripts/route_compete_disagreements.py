"""Probe: where a bank's router and its scope gate's best family disagree, let the two executors compete. Each
such hand-written in-domain request is planned by both shards; the plan with the higher mean token log-probability
(or that plus the router's log-probability of its family) wins. Prints each disagreement with both plans' log-prob
and graph EM, and how often each rule picks the gold family.

    .venv/bin/python scripts/route_compete_disagreements.py BANK [--sets paraphrase_builtin,...]

BANK holds the five built-in families with a gate that has an outlier corpus (a copy of the demo bank whose scope
was refit with `SkillBank.fit_scope` under a new bank's settings will do). 2026-12-06, on such a copy of
runs/demo-engine (12 s): 18 of the 115 development requests disagree, 5 of the router's 6 errors among them; the
log-probability picks the gold family for 14 (router 13, gate 5): 4 errors fixed, 3 right routes broken. Not
adopted."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from scope import DEV_IN, family_of, rows  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bank", type=Path)
    ap.add_argument("--sets", default=",".join(DEV_IN))
    args = ap.parse_args()
    from skillbank.graph import TaskGraph
    from skillbank.memory.bank import SkillBank
    from skillbank.metrics import score_example

    bank = SkillBank.open(args.bank)
    skill_family = {sid.split("::")[-1]: e.name for e in bank.manifest.shards
                    for sid in json.loads((bank.root / e.dir / "skills.json").read_text())["skills"]}
    records = [(r, family_of(r, skill_family)) for n in args.sets.split(",") for r in rows(n)]
    records = [(r, f) for r, f in records if f is not None]
    requests = [r["request"] for r, _ in records]
    proba = bank.address.predict_proba(requests)
    routed = [bank.address.classes_[j] for j in proba.argmax(axis=1)]
    gate = [bank.scope.classes_[j] for j in bank.scope.score(requests).argmax(axis=1)]
    apart = [i for i in range(len(requests)) if routed[i] != gate[i]]
    print(f"{len(requests)} requests, router right {np.mean([routed[i] == f for i, (_, f) in enumerate(records)]):.1%}; "
          f"{len(apart)} where the gate's best family differs")
    right = {"router": 0, "gate": 0, "log-prob": 0, "log-prob + route": 0}
    for i in apart:
        record, gold = records[i]
        a, b = (bank.plan([requests[i]], shard=s)[0] for s in (routed[i], gate[i]))

        def em(plan):
            return score_example(TaskGraph.from_dict(record["graph"]),
                                 TaskGraph.from_dict(plan.graph) if plan.graph else None).graph_em

        la = a.mean_logprob * a.n_tokens + np.log(proba[i][bank.address.classes_.index(routed[i])])
        lb = b.mean_logprob * b.n_tokens + np.log(max(proba[i][bank.address.classes_.index(gate[i])], 1e-300))
        picks = {"router": routed[i], "gate": gate[i],
                 "log-prob": routed[i] if a.mean_logprob >= b.mean_logprob else gate[i],
                 "log-prob + route": routed[i] if la >= lb else gate[i]}
        for rule, pick in picks.items():
            right[rule] += pick == gold
        print(f"gold {gold}: router {routed[i]} ({a.mean_logprob:.3f}, EM {em(a)}) gate {gate[i]} "
              f"({b.mean_logprob:.3f}, EM {em(b)}) :: {requests[i][:70]!r}")
    print("gold family picked, of the disagreements:", right)


if __name__ == "__main__":
    main()
