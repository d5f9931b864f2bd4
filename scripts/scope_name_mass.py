"""Probe: does the routed executor want to write a skill its family lacks? At every step where the constrained
executor writes a skill name, the share of its own (unmasked) probability that the grammar allows is evidence
that the request asks for a skill the family has; a near miss ("cancel my alarm" to a family with set_alarm
only) should put its mass on a name the catalog lacks. Scores each hand-written development / frozen test
request routed by a bank (scope gate off), prints ROC AUC in-domain vs off-domain, alone and with the gate.

    .venv/bin/python scripts/scope_name_mass.py runs/demo-prior/methods/fsm/bank --json results/scope/name_mass.json

Needs a bank whose shards hold skill statistics (the prior's row tells where a name is written). Measured
2026-12-05 (docs/scope.md, "Where the executor wants a skill the family lacks"): among gate-kept requests AUC
0.80 / 0.72 (development / frozen test); as a second rule chosen on the development sets, test kept 83.0 -> 80.0%,
refused 71.2 -> 75.6%, near misses 34 -> 44%. Not adopted."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from scope import DEV_IN, DEV_OFF, TEST_IN, TEST_OFF, rows  # noqa: E402

from skillbank.memory.bank import SkillBank  # noqa: E402
from skillbank.model import llamacpp  # noqa: E402
from skillbank.model.constrain import _PriorRow  # noqa: E402

STEPS: list[tuple[float, float, str]] = []  # per name step: log allowed mass, log p(pick), top token


def _logsumexp(x: np.ndarray) -> float:
    m = float(x.max())
    return m + float(np.log(np.exp(x - m, dtype=np.float64).sum()))


_orig_pick = llamacpp.LlamaCppDecoder._pick


def _pick(self, row, bitmask, cap, stops):
    m = row.matcher
    if isinstance(m, _PriorRow) and m._partial_text() is not None and bitmask is not None:
        m.fill(bitmask, 0)
        allowed = np.flatnonzero(np.unpackbits(bitmask[0].view(np.uint8), bitorder="little")[:self.n_vocab])
        if len(allowed):
            logits = row.logits.astype(np.float64)
            total = _logsumexp(logits)
            STEPS.append((_logsumexp(logits[allowed]) - total, float(logits[allowed].max()) - total,
                          str(int(np.argmax(logits)))))
    return _orig_pick(self, row, bitmask, cap, stops)


llamacpp.LlamaCppDecoder._pick = _pick


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bank")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--limit", type=int, default=0)
    args = ap.parse_args()
    from sklearn.metrics import roc_auc_score

    bank = SkillBank.open(args.bank)
    sets = {n: [r["request"] for r in rows(n)] for n in DEV_IN + DEV_OFF + TEST_IN + TEST_OFF}
    out = {}
    for name, reqs in sets.items():
        reqs = reqs[:args.limit] if args.limit else reqs
        res = []
        for q in reqs:
            STEPS.clear()
            plan = bank.plan(q, scope=False, explain=False)[0]
            steps = list(STEPS)
            res.append({"request": q, "shard": plan.shard, "output": plan.raw,
                        "margin": (plan.confidence or {}).get("scope_margin"),
                        "name_first": steps[0][0] if steps else 0.0,
                        "name_min": min((s[0] for s in steps), default=0.0),
                        "name_mean": float(np.mean([s[0] for s in steps])) if steps else 0.0,
                        "pick_min": min((s[1] for s in steps), default=0.0)})
        out[name] = res
        print(f"{name}: {len(res)} done", flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))

    def auc(ins, offs, key):
        a = np.array([r[key] for r in ins], float)
        b = np.array([r[key] for r in offs], float)
        a, b = np.nan_to_num(a, nan=-1e9), np.nan_to_num(b, nan=-1e9)
        return roc_auc_score(np.r_[np.ones(len(a)), np.zeros(len(b))], np.r_[a, b])

    for part, ins_n, offs_n in (("dev", DEV_IN, DEV_OFF), ("test", TEST_IN, TEST_OFF)):
        ins = [r for n in ins_n for r in out[n]]
        offs = [r for n in offs_n for r in out[n]]
        kept_in = [r for r in ins if (r["margin"] or -1) >= 0]
        kept_off = [r for r in offs if (r["margin"] or -1) >= 0]
        for key in ("margin", "name_first", "name_min", "name_mean", "pick_min"):
            print(f"{part} {key:10s} AUC all {auc(ins, offs, key):.3f}  among gate-kept "
                  f"({len(kept_in)}/{len(kept_off)}) {auc(kept_in, kept_off, key):.3f}")


if __name__ == "__main__":
    main()
