"""Does the executor's confidence add to the scope test? Plans in-domain and off-domain requests with the
scope check off (so every request is generated), then counts what a second rule - refuse when the executor's
mean token log-probability is below t - would keep and refuse on top of the scope threshold.

    python scripts/scope_confidence.py BANK --stream runs/streams/builtin-200-50 \
        --records tests/fixtures/paraphrase_builtin.jsonl --offdomain tests/fixtures/offdomain.jsonl \
        --out runs/scope-demo/confidence.json [--held-out-every 5]

Heavy (it generates every request): one job at a time.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from skillbank.data.records import iter_jsonl, read_records
from skillbank.data.stream import Stream
from skillbank.memory.bank import SkillBank

THRESHOLDS = (None, -0.2, -0.3, -0.4, -0.5, -0.6, -0.8)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bank", type=Path)
    ap.add_argument("--stream", type=Path, required=True)
    ap.add_argument("--records", type=Path, required=True)
    ap.add_argument("--offdomain", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--held-out-every", type=int, default=5, help="every n-th held-out request (time)")
    args = ap.parse_args()
    stream = Stream.load(args.stream)
    sets = {"held-out": [r.request for k in stream.family_keys for r in stream.test[k]][::args.held_out_every],
            args.records.stem: [r.request for r in read_records(args.records).records],
            args.offdomain.stem: [obj["request"] for _, obj in iter_jsonl(args.offdomain)]}
    bank = SkillBank.open(args.bank)
    rows = {}
    for name, requests in sets.items():
        t0 = time.perf_counter()
        plans = bank.plan(requests, scope=False, batch_size=16, max_new_tokens=256)
        print(f"{name}: {len(requests)} requests planned in {time.perf_counter() - t0:.0f} s", flush=True)
        rows[name] = [{"request": p.request, "in_scope": not p.out_of_scope,
                       "executor_logprob": p.confidence["executor_logprob"]} for p in plans]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n")
    names = list(rows)
    print("| executor log-prob floor | " + " | ".join(f"{n} kept" for n in names[:-1]) + f" | {names[-1]} refused |")
    print("|---" * (1 + len(names)) + "|")
    for t in THRESHOLDS:
        kept = {n: np.mean([r["in_scope"] and (t is None or r["executor_logprob"] >= t) for r in rows[n]])
                for n in names}
        label = "none (scope test only)" if t is None else f"{t}"
        print(f"| {label} | " + " | ".join(f"{kept[n]:.1%}" for n in names[:-1]) + f" | {1 - kept[names[-1]]:.1%} |")


if __name__ == "__main__":
    main()
