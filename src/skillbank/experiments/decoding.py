"""Free vs constrained decoding over one bank: the same routed requests planned both ways, in one run.

For each request set (a stream's held-out requests, the hand-written paraphrase set, ...) and each decoding
mode, every request is routed by the bank's Address Memory and planned by the routed shard
(:meth:`SkillBank.plan`). Measured per mode: graph EM per family and overall, route accuracy, outputs that
do not parse (apart from those that hit the token cap, counted on their own), skill ids outside the
routed shard and outside the whole bank, argument names the skill does not declare, the failure kinds of
:func:`skillbank.metrics.failure_kind`, generated tokens and wall time. ``copy`` mode (values copied from
the request) is measured when asked for; how many gold graphs it could reproduce at all is
:func:`copy_coverage`.
"""
from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Sequence

from skillbank.data.records import Record
from skillbank.graph import TaskGraph, literal_values, values_copied
from skillbank.metrics import FAILURE_KINDS, failure_kind, score_example
from skillbank.experiments.provenance import write_provenance
from skillbank.report.decoding import plot, render_markdown


MODES = {"free": {"constrain": False}, "constrained": {"constrain": True, "copy_values": False},
         "copy": {"constrain": True, "copy_values": True}}


def copy_coverage(records: Sequence[Record]) -> dict:
    """How many gold graphs have every literal argument value as a substring of their request - the graphs
    copy-constrained decoding can reproduce at all."""
    ok = sum(values_copied([(r.request, r.graph)]) for r in records)
    values = [(v, r.request) for r in records for v in literal_values(r.graph)]
    return {"records": len(records), "records_all_copied": ok,
            "values": len(values), "values_copied": sum(v in req for v, req in values)}


def evaluate_decoding(bank, sets: dict[str, Sequence[Record]], modes: Sequence[str] = ("free", "constrained"), *,
                      batch_size: int = 16, max_new_tokens: int = 256, say=None) -> dict:
    """Plan every request of every set in every mode; returns the measurements (module docstring)."""
    specs = _declared_arguments(bank)
    families = {s: e.name for e in bank.manifest.shards for s in e.skills}  # skill -> its shard
    result: dict = {"bank": str(bank.root), "max_new_tokens": max_new_tokens, "batch_size": batch_size, "sets": {}}
    for set_name, records in sets.items():
        records = list(records)
        entry: dict = {"n": len(records), "copy_coverage": copy_coverage(records), "modes": {}}
        for mode in modes:
            if say:
                say(f"{set_name}: planning {len(records)} requests, {mode} decoding")
            t0 = time.perf_counter()
            tokens0 = bank.execution.stats.generated_tokens
            # scope=False: every request here is in domain; decoding is measured on all of them
            plans = bank.plan([r.request for r in records], batch_size=batch_size, max_new_tokens=max_new_tokens,
                              scope=False, **MODES[mode])
            seconds = time.perf_counter() - t0
            entry["modes"][mode], ems = _measure(records, plans, specs, families, seconds,
                                                 bank.execution.stats.generated_tokens - tokens0)
            result.setdefault("predictions", []).extend(
                {"set": set_name, "mode": mode, "id": r.id, "family": r.family, "shard": p.shard, "raw": p.raw,
                 "error": p.error, "em": em} for r, p, em in zip(records, plans, ems))
        result["sets"][set_name] = entry
    return result


def _declared_arguments(bank) -> dict[str, tuple[str, ...] | None]:
    out: dict[str, tuple[str, ...] | None] = {}
    for e in bank.manifest.shards:
        grammar = bank.execution.grammar(e.name)
        out.update({s.id: s.arguments for s in grammar.skills})
    return out


def _measure(records, plans, specs, families, seconds: float, tokens: int) -> tuple[dict, list[float]]:
    """The measurements of one set in one mode, and each request's graph EM."""
    per_family: dict[str, list[float]] = {}
    ems: list[float] = []
    kinds: Counter = Counter()
    outside_shard = outside_bank = undeclared = unparsed = capped = 0
    for r, p in zip(records, plans):
        graph = TaskGraph.from_dict(p.graph) if p.graph is not None else None
        ems.append(score_example(r.graph, graph).graph_em)
        per_family.setdefault(r.family, []).append(ems[-1])
        kinds[failure_kind(r.graph, graph, families=families)] += 1
        if graph is None:
            if p.error and "token cap" in p.error:
                capped += 1
            else:
                unparsed += 1
            continue
        outside_shard += any(families.get(t) != p.shard for t in graph.tasks)
        outside_bank += any(t not in families for t in graph.tasks)
        undeclared += any(specs.get(n.task) is not None and a.name not in specs[n.task]
                          for n in graph.nodes for a in n.arguments)
    return {"em": 100 * sum(ems) / max(1, len(ems)),
            "em_per_family": {k: 100 * sum(v) / len(v) for k, v in per_family.items()},
            "route_accuracy": 100 * sum(p.shard == r.family for r, p in zip(records, plans)) / max(1, len(records)),
            "unparsed": unparsed, "token_cap": capped, "skill_outside_shard": outside_shard,
            "skill_outside_bank": outside_bank, "undeclared_argument": undeclared,
            "failure_kinds": {k: kinds.get(k, 0) for k in FAILURE_KINDS},
            "seconds": round(seconds, 1), "generated_tokens": tokens}, ems


def write(result: dict, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    predictions = result.get("predictions", [])
    summary = {k: v for k, v in result.items() if k != "predictions"}
    (out_dir / "decoding.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out_dir / "predictions.jsonl").write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in predictions))
    (out_dir / "decoding.md").write_text(render_markdown(result) + "\n")
    plot(result, out_dir / "decoding.png")
    write_provenance(out_dir)
