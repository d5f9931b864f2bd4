"""Why a bank's executors fail on some requests when each request goes to its gold family: every output that
`skillbank selectors` cached for (gold family, request) sorted into one failure kind (`metrics.failure_kind`,
the same kinds as the run report's "Why requests fail").

    .venv/bin/python scripts/failure_kinds.py --bank runs/compare-cpu/methods/fsm/bank \\
        --outputs runs/selectors-handwritten/outputs.jsonl --stream runs/streams/builtin-200-50 \\
        --records tests/fixtures/paraphrase_builtin.jsonl --records tests/fixtures/paraphrase_builtin_holdout.jsonl

Prints one line per set (the stream's held-out requests, then each records file): its size and the count of
each kind. A request whose gold-family output is not in the cache is an error (run the selectors first).
Why a script: it reads files other commands wrote; nothing in the package needs it.
"""
from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from skillbank.data.records import read_records
from skillbank.data.stream import Stream
from skillbank.memory.bank import read_manifest
from skillbank.metrics import failure_kind
from skillbank.model.serialization import decode_output


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bank", required=True, type=Path)
    ap.add_argument("--outputs", required=True, type=Path, help="a selectors run's outputs.jsonl")
    ap.add_argument("--stream", required=True)
    ap.add_argument("--records", action="append", default=[], type=Path)
    args = ap.parse_args()
    stream = Stream.load(args.stream)
    shards = {e.name: e for e in read_manifest(args.bank).shards}
    outputs = {}
    with args.outputs.open() as fh:
        for line in fh:
            o = json.loads(line)
            outputs[(o["shard"], o["request"])] = o
    family_of = {skill: f for f in stream.family_keys for skill in stream.catalog.family(f).skills}
    sets = {"held-out": [r for k in stream.family_keys for r in stream.test[k]]}
    sets.update({p.stem: read_records(p, stream.catalog).records for p in args.records})
    for name, records in sets.items():
        kinds = Counter()
        for r in records:
            o = outputs.get((r.family, r.request))
            if o is None:
                raise SystemExit(f"{args.outputs}: no output of shard {r.family} for {r.request!r}")
            e = shards[r.family]
            pred = decode_output(o["text"], e.target_format, e.family_prefix, stopped=o.get("stopped", True),
                                 reason=o.get("reason")).graph
            kinds[failure_kind(r.graph, pred, None, family_of)] += 1
        print(f"{name} (n={len(records)}): " + ", ".join(f"{k} {v}" for k, v in kinds.most_common()))


if __name__ == "__main__":
    main()
