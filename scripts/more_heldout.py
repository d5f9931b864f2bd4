"""More held-out requests of a built-in stream, as one records file an ``[eval] extra_sets`` entry can name.

A family's 50 held-out requests give its EM to about +-7 points, and two methods compared on the same 50 differ by
as much from the requests alone (``scripts/target_names_probe.py``: two executors equal over 200 requests of t3,
6-12 points apart on its first 50). This writes the stream's next ``--more`` held-out requests of every family
(the requests after the stream's own ``test_per_family``; none occurs in training, and the training records do not
depend on how many held-out ones are drawn), so a finished run can be measured again on them without retraining:
extra sets are outside a run's identity, so rerunning ``skillbank exp run`` with the same ``--out`` and the set
added only evaluates them.

    .venv/bin/python scripts/more_heldout.py --config configs/compare-router-seed1.toml --more 200 \\
        --out runs/heldout/builtin-heldout-more.jsonl
"""
from __future__ import annotations

import argparse
from pathlib import Path

from skillbank.config import RunConfig
from skillbank.data.builtin import build_builtin_stream
from skillbank.data.records import write_records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="a run configuration with a built-in stream")
    ap.add_argument("--more", type=int, default=200, help="held-out requests per family beyond the stream's own")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    s = RunConfig.from_toml(args.config).stream
    if s.source != "builtin":
        raise SystemExit(f"{args.config}: [stream] source is {s.source!r}; only the built-in generator can draw more")
    own = s.test_per_family or 300
    big = build_builtin_stream(seed=s.seed, train_per_family=s.train_per_family, test_per_family=own + args.more)
    ref = build_builtin_stream(seed=s.seed, train_per_family=s.train_per_family, test_per_family=own)
    for key in ref.family_keys:
        if ([r.request for r in big.train[key]] != [r.request for r in ref.train[key]]
                or [r.request for r in big.test[key][:own]] != [r.request for r in ref.test[key]]):
            raise SystemExit(f"family {key}: drawing more held-out requests changed the stream's own records")
    records = [r for key in big.family_keys for r in big.test[key][own:]]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_records(args.out, records)
    print(f"{len(records)} held-out requests ({args.more} a family) -> {args.out}")


if __name__ == "__main__":
    main()
