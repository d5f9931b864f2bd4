"""Copy the results of a run or sweep directory without its weights, so they can be committed and a later
machine can read them back and continue.

    .venv/bin/python scripts/keep_results.py runs/sweep results/sweep        # after (part of) a sweep
    (the same: .venv/bin/python -m skillbank.continual.keep_results runs/sweep results/sweep)
    cp -r results/sweep runs/sweep && skillbank exp sweep --config configs/sweep.toml --out runs/sweep   # continue

Kept: every ``*.json``, ``*.md``, ``*.png`` and ``*predictions.jsonl`` (the report re-reads final predictions; an
extra set's, ``extra-<set>.predictions.jsonl``, are what its failure kinds were counted from).
Left out: adapter states, banks, the stage cache and the generation cache (``outputs.jsonl``): megabytes to
gigabytes of weights that a reader does not need and a resumed run does not need for a finished order. An
order of a method that has not finished all its stages is left out whole: a resumed run would look for the
state of its last finished stage, which is not kept, so it trains that order again from the start.

The resume logic is the runner's (finished = every stage's ``eval.json``); this only decides which files are
results. It lives in the package (scripts/keep_results.py calls it) so that its test imports it like any module.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

SKIP_DIRS = {"state", "bank", "shared-stages", "pretrained", ".state-tmp"}
#: a bank of one order (FSM started from earlier shards: ``bank-<order>``) is a bank too
SKIP_PREFIXES = ("bank-",)
KEEP_SUFFIXES = {".json", ".md", ".png"}
STAGE = re.compile(r"stage-(\d+)$")


def unfinished_orders(src: Path) -> set[Path]:
    """Order directories (methods/<m>/<order>) whose last stage has no eval.json yet."""
    out = set()
    for odir in (d for d in src.glob("**/methods/*/*") if d.is_dir()):
        stages = sorted(int(m.group(1)) for d in odir.iterdir() if d.is_dir() and (m := STAGE.match(d.name)))
        if not stages:
            continue
        evals = [odir / f"stage-{t:02d}" / "eval.json" for t in stages]
        done = [e for e in evals if e.is_file()]
        if not done:
            out.add(odir)
            continue
        n_stages = len(json.loads(done[-1].read_text()).get("order", []))
        if len(done) < n_stages:
            out.add(odir)
    return out


def keep(src: Path, dst: Path) -> tuple[int, int, list[Path]]:
    skipped = unfinished_orders(src)
    n, size = 0, 0
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if not path.is_file() or SKIP_DIRS & set(rel.parts) or any(o in path.parents for o in skipped) \
                or any(part.startswith(SKIP_PREFIXES) for part in rel.parts[:-1]):
            continue
        if path.suffix not in KEEP_SUFFIXES and not path.name.endswith("predictions.jsonl"):
            continue
        if path.name.endswith(".tmp"):
            continue
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
        n, size = n + 1, size + path.stat().st_size
    return n, size, sorted(skipped)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path, help="a run or sweep directory (runs/...)")
    ap.add_argument("dst", type=Path, help="where the results go (results/...)")
    args = ap.parse_args(argv)
    if not args.src.is_dir():
        print(f"keep_results: {args.src} is not a directory", file=sys.stderr)
        return 2
    n, size, skipped = keep(args.src, args.dst)
    print(f"kept {n} files ({size / 1e6:.1f} MB) in {args.dst}")
    for odir in skipped:
        print(f"  left out (not finished): {odir.relative_to(args.src)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
