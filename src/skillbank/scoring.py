"""Scoring predictions against gold records (the engine behind ``skillbank score``).

A predictions file is JSON Lines, one object per request, keyed by the gold record ``id``, holding either
the raw model text (``"output": "..."``, parsed with :func:`skillbank.graph.parse_graph`) or an already
structured graph (``"graph": {"task_nodes": ..., "task_links": ...}``). A gold id without a prediction
is scored as an invalid prediction (and counted in ``missing``); a prediction for an unknown id is an
error, since it usually means the wrong pair of files.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from skillbank.data.records import Record, iter_jsonl
from skillbank.errors import GraphError, RecordError
from skillbank.graph import ParseResult, TaskGraph, parse_graph
from skillbank.metrics import aggregate, score_example, task_macro, taskbench_f1


def read_predictions(path: str | Path) -> dict[str, ParseResult]:
    preds: dict[str, ParseResult] = {}
    for lineno, obj in iter_jsonl(path):
        if not isinstance(obj, dict) or "id" not in obj:
            raise RecordError("a prediction needs an 'id' field", path, lineno)
        rid = str(obj["id"])
        if rid in preds:
            raise RecordError(f"duplicate prediction for id {rid!r}", path, lineno)
        if "output" in obj:
            preds[rid] = parse_graph(obj["output"])
        elif "graph" in obj:
            try:
                preds[rid] = ParseResult(TaskGraph.from_dict(obj["graph"]))
            except GraphError as exc:
                preds[rid] = ParseResult(None, str(exc))
        else:
            raise RecordError("a prediction needs 'output' (raw model text) or 'graph'", path, lineno)
    return preds


@dataclass
class ScoreReport:
    overall: dict[str, float]
    per_family: dict[str, dict[str, float]]
    task_macro_em: float
    missing: int = 0
    invalid_reasons: dict[str, int] = field(default_factory=dict)


def score_records(golds: Sequence[Record], preds: dict[str, ParseResult],
                  known_skills: set[str] | None = None) -> ScoreReport:
    unknown = sorted(set(preds) - {r.id for r in golds})
    if unknown:
        raise RecordError(f"{len(unknown)} prediction id(s) match no gold record, e.g. {unknown[:3]}")
    by_family: dict[str, list] = defaultdict(list)
    all_scores, gold_graphs, pred_graphs = [], [], []
    missing = 0
    reasons: dict[str, int] = defaultdict(int)
    for rec in golds:
        result = preds.get(rec.id)
        if result is None:
            missing += 1
            result = ParseResult(None, "no prediction")
        if result.graph is None:
            reasons[(result.error or "invalid").split(":")[0][:60]] += 1
        s = score_example(rec.graph, result.graph)
        all_scores.append(s)
        by_family[rec.family].append(s)
        gold_graphs.append(rec.graph)
        pred_graphs.append(result.graph)
    overall = aggregate(all_scores)
    overall.update(taskbench_f1(gold_graphs, pred_graphs, known_skills))
    per_family = {fam: aggregate(scores) for fam, scores in by_family.items()}
    return ScoreReport(overall, per_family, task_macro(f["graph_em"] for f in per_family.values()),
                       missing, dict(reasons))
