"""What negatives buy the scope gate: kept / refused / near misses refused, negatives none / synthesized / given /
both, on the hand-written sets. No shard is trained: the gate's statistics are what a bank learning these
families would hold (requests, gold values, catalog; :func:`skillbank.experiments.scope.detector_for_stream`).

Banks:

- ``K=5``: the five built-in families (200 template records each), given negatives from
  ``src/skillbank/resources/negatives/builtin.jsonl``; development sets (``paraphrase_builtin*`` / ``offdomain*``,
  where the margin was chosen) and the frozen K = 5 test sets (``users_indomain`` / ``users_offdomain``, written
  blind, nothing chosen on them), near misses apart;
- ``home_energy`` and ``dev_tools`` (``--families``): an example family alone (85 / 78 records, negatives
  ``examples/<name>/negatives.jsonl``), and ``K=5+<name>``: beside the five; its frozen sets
  ``tests/fixtures/frozen/<name>_*`` (what the other
  families serve counts as in domain there, so only the family's own refusals are counted off domain).

At K = 5 it also prints, per family, the frozen in-domain requests kept and the frozen near misses written against
that family refused. Each row also gives the gate's time per request (scope check only, one at a time). Prints a table; ``--out``
writes the numbers as JSON.

    .venv/bin/python bench/scope_negatives.py --out results/scope-negatives
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from skillbank.data.builtin import build_builtin_stream
from skillbank.data.catalog import Catalog
from skillbank.data.negatives import read_negatives
from skillbank.data.records import read_records
from skillbank.data.tool_formats import load_catalog
from skillbank.experiments.scope import detector_for_stream
from skillbank.memory.bank import default_scope_params, family_negatives
from skillbank.memory.scope import ScopeDetector, catalog_text, fit_inputs

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures"
MODES = ("none", "synthesized", "given", "both")


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def builtin_sets(stream):
    skill_family = {sid.split("::")[-1]: k for k in stream.family_keys for sid in stream.catalog.family(k).skills}

    def fam(r):
        fams = {skill_family.get(n["task"].split("::")[-1]) for n in r["graph"]["task_nodes"]}
        return fams.pop() if len(fams) == 1 else None
    dev_in = [r["request"] for n in ("paraphrase_builtin", "paraphrase_builtin_holdout", "paraphrase_builtin_short")
              for r in rows(FIX / f"{n}.jsonl") if fam(r)]
    dev_off = [(r["request"], r["category"]) for n in ("offdomain", "offdomain_holdout", "offdomain_short",
                                                       "offdomain_injection") for r in rows(FIX / f"{n}.jsonl")]
    test_in = [r["request"] for r in rows(FIX / "users_indomain.jsonl") if fam(r)]
    test_off = [(r["request"], r["category"]) for r in rows(FIX / "users_offdomain.jsonl")]
    # per family: its frozen in-domain requests, and the frozen near misses written against it
    by_family = {k: ([r["request"] for r in rows(FIX / "users_indomain.jsonl") if fam(r) == k],
                     [(r["request"], "near_miss") for r in rows(FIX / "users_offdomain.jsonl")
                      if r["category"] == "near_miss" and r.get("closest_family") == k]) for k in stream.family_keys}
    return {"dev": (dev_in, dev_off), "frozen": (test_in, test_off), "by_family": by_family}


def family_sets(family: str):
    test_in = [r["request"] for r in rows(FIX / "frozen" / f"{family}_indomain.jsonl")]
    test_off = [(r["request"], r["category"]) for r in rows(FIX / "frozen" / f"{family}_offdomain.jsonl")]
    return {"frozen": (test_in, test_off)}


def measure(det: ScopeDetector, sets: dict) -> dict:
    out = {}
    for family, (ins, near) in sets.get("by_family", {}).items():
        out.setdefault("by_family", {})[family] = {
            "kept": float(np.mean(det.decision_function(ins) >= 0)), "n_in": len(ins),
            "near_misses_refused": float(np.mean(det.decision_function([q for q, _ in near]) < 0)), "n_near": len(near)}
    sets = {k: v for k, v in sets.items() if k != "by_family"}
    for part, (ins, offs) in sets.items():
        kept = det.decision_function(ins) >= 0
        refused = det.decision_function([q for q, _ in offs]) < 0
        near = np.array([c == "near_miss" for _, c in offs])
        out[part] = {"kept": float(kept.mean()), "refused": float(refused.mean()),
                     "near_misses_refused": float(refused[near].mean()) if near.any() else None,
                     "n_in": len(ins), "n_off": len(offs), "n_near": int(near.sum())}
    probe = next(iter(sets.values()))[0][:40]
    det.decision_function(probe[:5])
    t0 = time.perf_counter()
    for q in probe:
        det.decision_function([q])
    out["ms_per_request"] = (time.perf_counter() - t0) * 1000 / len(probe)
    return out


def set_negatives(det: ScopeDetector, family: str, specs, records, given, mode: str) -> None:
    if mode == "none":
        det.fit_negatives(family, [])
        return
    held = family_negatives(family, specs, records, given if mode in ("given", "both") else [],
                            synthesize=mode in ("synthesized", "both"))
    det.fit_negatives(family, held)


def example_family(family: str):
    """An example family (``examples/<family>``): its records, skill specs and given negatives."""
    here = ROOT / "examples" / family
    catalog = load_catalog(here / "tools.json", family)
    records = read_records(here / "records.jsonl").records
    specs = [catalog.skills[s].to_dict() for s in catalog.family(family).skills]
    return records, specs, read_negatives(here / "negatives.jsonl")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--families", default="home_energy,dev_tools", help="example families (examples/<name>, with "
                    "frozen sets tests/fixtures/frozen/<name>_*), each alone and beside the five")
    args = ap.parse_args()
    modes = args.modes.split(",")
    stream = build_builtin_stream(seed=0, train_per_family=200, test_per_family=50, families=5)
    given = read_negatives(ROOT / "src" / "skillbank" / "resources" / "negatives" / "builtin.jsonl")
    specs_of = {k: [stream.catalog.skills[s].to_dict() for s in stream.catalog.family(k).skills]
                for k in stream.family_keys}
    examples = {f: example_family(f) for f in args.families.split(",") if f}
    results = {}

    banks = {"K=5": (detector_for_stream(stream), builtin_sets(stream))}
    for family, (records, specs, _) in examples.items():
        alone = ScopeDetector(**default_scope_params())
        beside = detector_for_stream(stream)
        for det in (alone, beside):
            det.partial_fit([r.request for r in records], family, catalog_text(specs), **fit_inputs(records, family))
        banks[family] = (alone, family_sets(family))
        banks[f"K=5+{family}"] = (beside, family_sets(family))
    print("| bank | negatives | set | in-domain kept | off-domain refused | near misses refused | ms/request |")
    print("|---|---|---|---|---|---|---|")
    for bank, (det, sets) in banks.items():
        for mode in modes:
            for k in det.classes_:
                if k in examples:
                    records, specs, own = examples[k]
                    set_negatives(det, k, specs, records, own, mode)
                else:
                    set_negatives(det, k, specs_of[k], stream.train[k], [n for n in given if n.family == k], mode)
            r = measure(det, sets)
            results[f"{bank}/{mode}"] = r
            for part in (p for p in sets if p != "by_family"):
                p = r[part]
                near = "-" if p["near_misses_refused"] is None else f"{p['near_misses_refused']:.1%} (n={p['n_near']})"
                print(f"| {bank} | {mode} | {part} | {p['kept']:.1%} (n={p['n_in']}) | {p['refused']:.1%} "
                      f"(n={p['n_off']}) | {near} | {r['ms_per_request']:.1f} |", flush=True)
    per_family = {key: r["by_family"] for key, r in results.items() if "by_family" in r}
    if per_family:
        print("\nPer family, K=5 frozen sets: in-domain kept / the near misses written against it refused")
        print("| negatives | " + " | ".join(next(iter(per_family.values()))) + " |")
        print("|---|" + "---|" * len(next(iter(per_family.values()))))
        for key, fams in per_family.items():
            print(f"| {key.split('/')[1]} | " + " | ".join(f"{v['kept']:.0%} / {v['near_misses_refused']:.0%}"
                                                         for v in fams.values()) + " |")
    if args.out:
        from skillbank.model.encoding_choice import cpu_identity
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "scope-negatives.json").write_text(json.dumps({"cpu": cpu_identity(), "results": results},
                                                                  indent=1) + "\n")


if __name__ == "__main__":
    main()
