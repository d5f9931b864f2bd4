"""The start rules' banks on the frozen hand-written test set, measured after the default was chosen on the
development sets: routed, scope gate off, grammar on, values decoded freely (as ``bench/init_strategies.py``).

    .venv/bin/python scripts/frozen_start_rules.py runs/init-cmp/fresh runs/init-cmp/previous runs/init-cmp/merge \\
        runs/init-cmp-O2/previous runs/init-cmp-O2/merge

Prints one line per bank: its path and graph EM on ``tests/fixtures/users_indomain.jsonl`` (100 requests).
Why a script: it reads banks the bench made; nothing in the package needs it.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from init_strategies import graph_em  # noqa: E402

from skillbank.data.records import Record  # noqa: E402
from skillbank.memory.bank import SkillBank  # noqa: E402


def main(paths: list[str]) -> None:
    if not paths:
        sys.exit(__doc__)
    records = [Record.from_dict(json.loads(line)) for line in
               (ROOT / "tests" / "fixtures" / "users_indomain.jsonl").read_text().splitlines() if line.strip()]
    for path in paths:
        bank = SkillBank.open(path)
        plans = bank.plan([r.request for r in records], scope=False, batch_size=16, copy_values=False)
        print(f"{path} {100 * sum(graph_em(records, plans)) / len(records):.1f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
