"""How often ``outside_like`` (the outlier-corpus category a request looks likest to, shown by ``plan --explain``)
names the category a development off-domain request was written as (missing-tool requests count as the corpus's
other services' tools), with a new bank's gate fitted on the built-in K = 5 stream.

    .venv/bin/python scripts/scope_outside_like.py

2026-12-06: 184 of 280 (other tools 52 / 53, prompt injections 50 / 60, advice 35 / 53, chit-chat 29 / 61,
general questions 18 / 53): a pointer, not a classification, so refusal reasons do not repeat it."""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from scope import DEV_OFF, GATES, rows  # noqa: E402

from skillbank.data.builtin import build_builtin_stream  # noqa: E402
from skillbank.experiments.scope import detector_for_stream  # noqa: E402

AS_CORPUS = {"missing_tool": "other_tools"}


def main() -> None:
    stream = build_builtin_stream(seed=0, train_per_family=200, test_per_family=50, families=5)
    det = detector_for_stream(stream, **GATES["outliers"])
    records = [r for n in DEV_OFF for r in rows(n)]
    _, named = det.closest_outside([r["request"] for r in records])
    right, total, confused = Counter(), Counter(), Counter()
    for r, like in zip(records, named):
        written = AS_CORPUS.get(r["category"], r["category"])
        total[written] += 1
        right[written] += like == written
        confused[written, like] += 1
    for cat in total:
        often = [f"{like} {n}" for (w, like), n in confused.most_common() if w == cat][:4]
        print(f"{cat:<18} {right[cat]:>3} / {total[cat]:<3} named: {', '.join(often)}")
    print(f"all: {sum(right.values())} / {sum(total.values())}")


if __name__ == "__main__":
    main()
