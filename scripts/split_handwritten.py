"""The hand-written request sets, relabelled for a split of the built-in catalog (``skillbank exp stream build
--families K``), so a run on that stream can evaluate them as ``[eval] extra_sets``.

The fixtures name the five built-in families (``Builtin::t1_daily_life::get_weather``); a split moves each
skill into one finer family (``Builtin::t1_daily_life-01::get_weather``). A record whose skills all fall in one
finer family is written with that family and those ids; one whose skills span several finer families has no
family to be routed to in that stream and is left out (counted on the output).

    .venv/bin/python scripts/split_handwritten.py --stream runs/streams/builtin-k20-e2e \\
        --out runs/streams/builtin-k20-e2e/handwritten

Writes ``<out>/<fixture>.jsonl`` for the development sets (``paraphrase_builtin*``) and the frozen test set
(``users_indomain``). Why a script: it prepares data for a config; nothing in the package needs it.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from skillbank.data.records import read_records
from skillbank.data.stream import Stream

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
SETS = ["paraphrase_builtin", "paraphrase_builtin_holdout", "paraphrase_builtin_short", "users_indomain"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stream", type=Path, required=True, help="a stream directory built with --families K")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    stream = Stream.load(args.stream)
    finer = {}  # skill name -> (finer family, its skill id)
    for key in stream.family_keys:
        for sid in stream.catalog.family(key).skills:
            finer[sid.split("::")[-1]] = (key, sid)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in SETS:
        kept, spanning = [], 0
        for record in read_records(FIXTURES / f"{name}.jsonl").records:
            d = record.to_dict()
            homes = {finer[n["task"].split("::")[-1]][0] for n in d["graph"]["task_nodes"]}
            if len(homes) != 1:
                spanning += 1
                continue
            d["family"] = homes.pop()
            for node in d["graph"]["task_nodes"]:
                node["task"] = finer[node["task"].split("::")[-1]][1]
            for link in d["graph"]["task_links"]:  # links name their ends by skill id
                for end in ("source", "target"):
                    link[end] = finer[link[end].split("::")[-1]][1]
            kept.append(d)
        path = args.out / f"{name}.jsonl"
        path.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in kept), encoding="utf-8")
        print(f"{path}: {len(kept)} records ({spanning} left out: their skills span several families)")


if __name__ == "__main__":
    main()
