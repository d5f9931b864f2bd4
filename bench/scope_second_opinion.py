"""A second opinion on scope from the routed executor: does its plan's likelihood tell near misses apart?

The scope gate reads words and a sentence embedding; what it lets through are near misses, requests that name a
family's objects but ask for an action none of its skills performs ("cancel my hotel booking"). The routed
executor still writes some plan for them under its grammar, but it has to force it: the mean log-probability of
its tokens under the model (``Plan.mean_logprob``, read before the grammar's mask) should be lower than for a
request its skills really serve. This plans every request of the hand-written sets with the gate off (so the
gate's verdict and the executor's likelihood are both known for each), then:

- chooses a likelihood threshold on the development sets only (``paraphrase_builtin*`` in domain,
  ``offdomain*`` out of domain): the one that refuses the most development off-domain requests the gate kept
  while keeping at least ``--keep`` of the development in-domain requests the gate kept;
- reports, on the frozen test sets (``users_indomain`` / ``users_offdomain``, nothing chosen on them), kept /
  refused / near misses refused with the gate alone and with the gate plus the second opinion, and the seconds
  the second opinion costs (a request the gate keeps is generated anyway; the opinion reads its plan).

    .venv/bin/python bench/scope_second_opinion.py --bank runs/gate-bank [--json results/scope/second_opinion.json]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
DEV_IN = ["paraphrase_builtin", "paraphrase_builtin_holdout", "paraphrase_builtin_short"]
DEV_OUT = ["offdomain", "offdomain_holdout", "offdomain_short"]
TEST_IN, TEST_OUT = ["users_indomain"], ["users_offdomain"]
NEAR = {"near_miss", "missing_tool"}  # the test sets' and the development sets' names for a near miss


def rows(files: list[str]) -> list[dict]:
    return [json.loads(line) for f in files for line in (FIXTURES / f"{f}.jsonl").read_text().splitlines()
            if line.strip()]


def opinions(bank, records: list[dict], batch_size: int) -> list[dict]:
    t0 = time.perf_counter()
    plans = bank.plan([r["request"] for r in records], scope=False, batch_size=batch_size)
    seconds = (time.perf_counter() - t0) / max(1, len(records))
    return [{"kept_by_gate": not p.out_of_scope, "logprob": p.mean_logprob if p.mean_logprob is not None else -99.0,
             "near": r.get("category") in NEAR, "seconds": seconds} for r, p in zip(records, plans)]


def rates(ins: list[dict], outs: list[dict], tau: float | None) -> dict:
    def kept(o):
        return o["kept_by_gate"] and (tau is None or o["logprob"] >= tau)
    near = [o for o in outs if o["near"]]
    return {"kept": round(100 * np.mean([kept(o) for o in ins]), 1),
            "refused": round(100 * np.mean([not kept(o) for o in outs]), 1),
            "near_misses_refused": round(100 * np.mean([not kept(o) for o in near]), 1) if near else None}


def choose(ins: list[dict], outs: list[dict], keep: float) -> float | None:
    """The highest threshold that still keeps ``keep`` of the in-domain requests the gate kept."""
    passed = sorted(o["logprob"] for o in ins if o["kept_by_gate"])
    if not passed:
        return None
    return float(passed[int(np.floor((1 - keep) * len(passed)))])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bank", type=Path, required=True)
    ap.add_argument("--keep", type=float, default=0.98, help="share of gate-kept development in-domain requests "
                    "the second opinion must keep")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from skillbank.memory.bank import SkillBank
    bank = SkillBank.open(args.bank)
    data = {name: opinions(bank, rows(files), args.batch_size)
            for name, files in (("dev_in", DEV_IN), ("dev_out", DEV_OUT), ("test_in", TEST_IN), ("test_out", TEST_OUT))}
    tau = choose(data["dev_in"], data["dev_out"], args.keep)
    report: dict = {"bank": str(args.bank), "engine": type(bank.engine).__name__, "keep": args.keep,
                    "threshold_logprob": tau}
    for split in ("dev", "test"):
        ins, outs = data[f"{split}_in"], data[f"{split}_out"]
        report[split] = {"gate": rates(ins, outs, None), "gate+executor": rates(ins, outs, tau),
                         "logprob_in_kept": [round(o["logprob"], 3) for o in ins if o["kept_by_gate"]],
                         "logprob_out_kept": [round(o["logprob"], 3) for o in outs if o["kept_by_gate"]]}
        g, s = report[split]["gate"], report[split]["gate+executor"]
        print(f"{split}: gate alone kept {g['kept']}% / refused {g['refused']}% (near misses "
              f"{g['near_misses_refused']}%); with the executor's opinion (mean log-prob >= {tau:.3f}) kept "
              f"{s['kept']}% / refused {s['refused']}% (near misses {s['near_misses_refused']}%)", flush=True)
    cost = [o["seconds"] for o in data["test_out"] if o["kept_by_gate"]]
    report["seconds_per_generated_request"] = round(float(np.mean([o["seconds"] for v in data.values() for o in v])), 3)
    print(f"cost: an off-domain request the gate lets through is generated before the opinion refuses it: "
          f"{report['seconds_per_generated_request']:.2f} s a request here ({len(cost)} such test requests)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
