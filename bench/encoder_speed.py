"""Scope check plus routing per request with each sentence encoder, measured side by side in one run.

For one split of the built-in catalog (K families) it fits, for each encoder, the scope statistics and the
router a new bank would hold (no shard is trained), then times hand-written requests one at a time - the
scope check, then routing, as a plan does - in rounds that alternate the encoders, so a machine whose speed
drifts slows both alike. One encoder pass alone is timed too. It prints each round and the ratio of the
medians to the first encoder's (the baseline).

    .venv/bin/python bench/encoder_speed.py --families 5 --encoders minilm,minilm-int8
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from skillbank.data.builtin import build_builtin_stream
from skillbank.experiments.routing import fit_stages
from skillbank.experiments.scope import detector_for_stream
from skillbank.memory.address import make_selector
from skillbank.memory.bank import default_address
from skillbank.memory.selectors.embedding import get_encoder

from scope import time_per_request  # bench/scope.py: the same timing, one request at a time

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", type=int, default=5, help="split of the built-in catalog (5, 20 or 50)")
    ap.add_argument("--encoders", default="minilm,minilm-int8", help="comma-separated; the first is the baseline")
    ap.add_argument("--requests", type=int, default=40, help="hand-written requests timed per round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    stream = build_builtin_stream(seed=0, train_per_family=200, test_per_family=50, families=args.families)
    rows = (FIXTURES / "users_indomain.jsonl").read_text().splitlines()
    sample = [json.loads(line)["request"] for line in rows if line.strip()][:args.requests]
    setups = {}
    for name in args.encoders.split(","):
        kind, params = default_address(name)
        setups[name] = (detector_for_stream(stream, reader="values", encoder=name),
                        fit_stages(make_selector(kind, **params), stream, stream.family_keys))
    totals: dict[str, list[float]] = {name: [] for name in setups}
    for rnd in range(args.rounds):
        for name, (det, router) in setups.items():
            scope_ms, route_ms = time_per_request(det, router, sample)
            encoder = get_encoder(name)
            t0 = time.perf_counter()
            for q in sample:
                encoder.encode([q])
            encode_s = time.perf_counter() - t0
            n = len(sample)
            totals[name].append(scope_ms + route_ms)
            print(f"K={args.families} round {rnd} {name:12s}: scope {scope_ms:.1f} ms + routing "
                  f"{route_ms:.1f} ms = {totals[name][-1]:.1f} ms a request; one encoder pass "
                  f"{encode_s / n * 1000:.1f} ms", flush=True)
    base = next(iter(totals))
    for name, ms in totals.items():
        print(f"{name}: median {statistics.median(ms):.1f} ms a request, "
              f"{statistics.median(ms) / statistics.median(totals[base]):.2f}x {base}'s")


if __name__ == "__main__":
    main()
