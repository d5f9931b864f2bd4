"""Scoring a predictions file against gold records (the engine behind ``skillbank score``); the per-example
metrics it aggregates are :mod:`skillbank.metrics`.

A predictions file is JSON Lines, one object per request, keyed by the gold record ``id``, holding either
an already structured graph (``"graph": {"task_nodes": ..., "task_links": ...}``) or the raw model text
(``"output": "..."``). When a row has both (the continual runner's ``predictions.jsonl``), ``graph`` is the
prediction: its writer decoded the output with the shard's own target format and family prefix and knew
whether generation stopped (a capped output may still parse), and ``"graph": null`` is an invalid output
whose reason is the row's ``error``. ``output`` alone is decoded with :func:`skillbank.model.serialization.decode`
in the row's ``format`` (``"json"``, the default, or ``"compact"``); a compact output's short skill names get
the row's ``family_prefix``, else the prefix of the family that generated it (``route``, ``shard`` or
``family``) as the gold records or the catalog give it.

Rows may carry group fields (:data:`GROUP_FIELDS`, e.g. the runner's ``variant``: ``fsm`` and ``oracle``
answer the same requests): each group is scored on its own, and an id may repeat across groups but not within
one. Every row of a file names the same group fields. A gold id without a prediction in a group is scored as
an invalid prediction (and counted in ``missing``); a prediction for an unknown id is an error, since it usually
means the wrong pair of files.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from skillbank.data.records import Record, iter_jsonl
from skillbank.data.taskbench import domain_of
from skillbank.errors import GraphError, RecordError
from skillbank.graph import ParseResult, TaskGraph
from skillbank.metrics import aggregate, score_example, task_macro, taskbench_f1
from skillbank.model.serialization import FORMATS, decode

GROUP_FIELDS = ("method", "order", "stage", "variant", "mode")


@dataclass
class PredictionGroup:
    """The predictions of one group: ``key`` maps each group field to its value ({} in an ungrouped file)."""

    key: dict[str, str]
    predictions: dict[str, ParseResult] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.key.items()) or "all"


def family_prefixes(golds: Sequence[Record], catalog=None) -> dict[str, str]:
    """Family -> the prefix its shard strips from skill ids in compact outputs: from the catalog's families when
    given (what ``learn`` uses), else from the skill ids of the family's gold graphs."""
    from skillbank.train.executor import common_prefix  # imports torch: only when a compact row needs it
    if catalog is not None:
        return {f.key: common_prefix(list(f.skills)) for f in catalog.families}
    skills: dict[str, set[str]] = defaultdict(set)
    for r in golds:
        skills[r.family].update(n.task for n in r.graph.nodes)
    return {fam: common_prefix(sorted(s)) for fam, s in skills.items()}


def read_predictions(path: str | Path, *, default_format: str = "json",
                     prefixes: Callable[[], dict[str, str]] | None = None) -> list[PredictionGroup]:
    """The groups of a predictions file, in the order they first occur.

    default_format: how ``output`` is written in rows without a ``format`` field.
    prefixes: returns family -> family prefix (:func:`family_prefixes`); called once, when a compact row
        names no ``family_prefix``.
    """
    if default_format not in FORMATS:
        raise RecordError(f"output format must be one of {list(FORMATS)}, got {default_format!r}")
    groups: dict[tuple, PredictionGroup] = {}
    fields: tuple[str, ...] | None = None
    cache: dict[str, str] | None = None

    def prefix_of(obj: dict, lineno: int) -> str:
        nonlocal cache
        if isinstance(obj.get("family_prefix"), str):
            return obj["family_prefix"]
        fam = next((obj[k] for k in ("route", "shard", "family") if isinstance(obj.get(k), str)), None)
        if cache is None and prefixes is not None:
            cache = prefixes()
        if fam is None or cache is None or fam not in cache:
            raise RecordError("a compact output needs the family prefix of the shard that wrote it: give "
                              "'family_prefix', or a 'route'/'family' that the gold records or --catalog know"
                              + (f" (got {fam!r})" if fam is not None else ""), path, lineno)
        return cache[fam]

    for lineno, obj in iter_jsonl(path):
        if not isinstance(obj, dict) or "id" not in obj:
            raise RecordError("a prediction needs an 'id' field", path, lineno)
        mine = tuple(k for k in GROUP_FIELDS if k in obj)
        if fields is None:
            fields = mine
        elif mine != fields:
            raise RecordError(f"group fields {list(mine)} differ from the first row's {list(fields)}; every row "
                              f"of a predictions file names the same ones (of {list(GROUP_FIELDS)})", path, lineno)
        key = {k: str(obj[k]) for k in mine}
        group = groups.setdefault(tuple(key.values()), PredictionGroup(key))
        rid = str(obj["id"])
        if rid in group.predictions:
            where = f" in group {group.label}" if key else ""
            raise RecordError(f"duplicate prediction for id {rid!r}{where}", path, lineno)
        if "graph" in obj:
            if obj["graph"] is None:
                group.predictions[rid] = ParseResult(None, str(obj.get("error") or "graph is null"))
                continue
            try:
                group.predictions[rid] = ParseResult(TaskGraph.from_dict(obj["graph"]))
            except GraphError as exc:
                group.predictions[rid] = ParseResult(None, str(exc))
        elif "output" in obj:
            fmt = obj.get("format", default_format)
            if fmt not in FORMATS:
                raise RecordError(f"'format' must be one of {list(FORMATS)}, got {fmt!r}", path, lineno)
            prefix = prefix_of(obj, lineno) if fmt == "compact" else None
            group.predictions[rid] = decode(obj["output"], fmt, prefix)
        else:
            raise RecordError("a prediction needs 'graph' or 'output' (raw model text)", path, lineno)
    return list(groups.values())


@dataclass
class ScoreReport:
    overall: dict[str, float]
    per_family: dict[str, dict[str, float]]
    task_macro_em: float
    missing: int = 0
    invalid_reasons: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"overall": self.overall, "per_family": self.per_family, "task_macro_em": self.task_macro_em,
                "missing": self.missing, "invalid_reasons": self.invalid_reasons}


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
    # TaskBench reads links per domain (metrics module docstring); records of other sources: canonical links
    conventions = [domain_of(rec.id) or "canonical" for rec in golds]
    overall.update(taskbench_f1(gold_graphs, pred_graphs, known_skills, convention=conventions))
    per_family = {fam: aggregate(scores) for fam, scores in by_family.items()}
    return ScoreReport(overall, per_family, task_macro(f["graph_em"] for f in per_family.values()),
                       missing, dict(reasons))


def score_groups(golds: Sequence[Record], groups: Sequence[PredictionGroup],
                 known_skills: set[str] | None = None, where: str | Path | None = None
                 ) -> list[tuple[PredictionGroup, ScoreReport]]:
    """:func:`score_records` for every group; an error names the file and the group."""
    out = []
    for g in groups:
        try:
            out.append((g, score_records(golds, g.predictions, known_skills)))
        except RecordError as exc:
            raise RecordError(exc.reason + (f" (group {g.label})" if g.key else ""), where) from None
    return out
