"""How many gold graphs copy-constrained decoding could reproduce at all: records whose every literal argument
value is a substring of the request, on the built-in stream, a TaskBench folder and any records files.

    .venv/bin/python scripts/copy_coverage.py [--taskbench PATH] [--records FILE ...]
"""
from __future__ import annotations

import argparse
from pathlib import Path

from skillbank.data.builtin import build_builtin_stream
from skillbank.data.records import read_records
from skillbank.experiments.decoding import copy_coverage


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--taskbench", type=Path, help="a TaskBench folder (official layout or the sample)")
    ap.add_argument("--records", type=Path, nargs="*", default=[])
    args = ap.parse_args()
    sets = {}
    stream = build_builtin_stream(seed=0, train_per_family=1000, test_per_family=300)
    sets["built-in stream (seed 0, 1000/300 per family)"] = [r for k in stream.family_keys
                                                             for r in stream.train[k] + stream.test[k]]
    if args.taskbench:
        from skillbank.data.taskbench import load_taskbench
        tb = load_taskbench(args.taskbench, train_per_family=100_000, test_per_family=0)
        sets[f"TaskBench {args.taskbench}"] = [r for k in tb.family_keys for r in tb.train[k] + tb.test[k]]
    for path in args.records:
        sets[str(path)] = read_records(path).records
    for name, records in sets.items():
        c = copy_coverage(records)
        print(f"{name}: {c['records_all_copied']}/{c['records']} records "
              f"({100 * c['records_all_copied'] / c['records']:.1f}%), {c['values_copied']}/{c['values']} values "
              f"({100 * c['values_copied'] / c['values']:.1f}%) copied verbatim")


if __name__ == "__main__":
    main()
