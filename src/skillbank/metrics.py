"""Metrics: per-example graph metrics, TaskBench's node/edge F1, route accuracy, the accuracy matrix, BWT.

Per example (gold graph ``g``, prediction ``p`` or ``None`` when the output did not parse; an invalid
prediction scores 0 on every metric, never raises):

Every metric compares the graphs' :meth:`~skillbank.graph.TaskGraph.canonical_dag` forms: nodes in the
canonical DAG order (:mod:`skillbank.graph`, rule 1), so listing independent nodes in another order (with
``<node-j>`` references renumbered to match) changes nothing.

* **graph_em** - ``canonical_dag(p) == canonical_dag(g)``.
* **tool_choice** - the list of skill ids in canonical DAG order is identical (for a chain or a single
  node, the listed order).
* **arg_f1** - F1 over the multisets of (skill, argument name, value) tuples; 1.0 when both are empty.
* **node_set_exact** - the multiset of skill ids is identical (order ignored).
* **arg_value_exact** - the multiset of (skill, name, value) tuples is identical.
* **edge_exact** - the set of canonical links is identical. Not a success measure on its own: a
  single-node gold graph has no links, so any link-free prediction is edge-exact.

Why a prediction misses (:func:`failure_kind`, one kind per example, for the report's failure analysis):
exact; right skill ids but wrong arguments or links; the right skill *names* under another family's id
(``S::t5::book_flight`` for ``S::t1::book_flight``: the skill survived, its address did not); skills of
the newest family (given which it is); skills of another family; wrong skills of the request's own
family; unparsable output.

Aggregates are means over examples (reported as fractions; reports multiply by 100).

TaskBench comparability (:func:`taskbench_f1`): TaskBench's ``evaluate.py`` reports "node micro F1
[no matching]" and "link binary F1": per example, the *sets* of predicted and gold tool names (links:
(source, target) pairs) are compared; true/false positives and negatives are pooled over all examples.
A predicted tool outside the catalog is ignored by TaskBench's node F1 (it is mapped to the negative
class), which :func:`taskbench_f1` reproduces when ``known_skills`` is given. TaskBench skips
predictions it cannot parse; here they count as empty predictions (all gold nodes missed), which is
stricter and documented as such.

Which links an example has depends on the domain, as in TaskBench's evaluator (:data:`LINK_CONVENTIONS`,
:data:`DOMAIN_LINK_CONVENTIONS`): for Hugging Face and multimedia it derives the links, gold and predicted
alike, from the ``<node-j>`` references in the arguments (``references``: the first ``<node-j>`` in each
value, whole or inside longer text, a self-reference skipped) and ignores ``task_links``; for the
daily-life APIs it takes ``task_links`` as declared (``declared``). skillbank's own ``canonical`` links
(declared plus implied) are the default for other sources. Edge F1 is 1.0 when no example has a link on
either side (our convention: nothing was missed or invented; TaskBench's scikit-learn call has no positive
class there and does not report 1).

Continual metrics: ``a[t][k]`` is the EM on task ``k`` after stage ``t`` (both 1-based positions in the
arrival order); task-macro averages weight every task equally; BWT = mean over k < T of
``a[T][k] - a[k][k]`` (negative = forgetting).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Iterable, Mapping, Sequence

from skillbank.graph import ANY_NODE_REF, TaskGraph

EXAMPLE_METRICS = ("graph_em", "tool_choice", "arg_f1", "node_set_exact", "arg_value_exact", "edge_exact", "valid")


@dataclass(frozen=True)
class ExampleScore:
    graph_em: float
    tool_choice: float
    arg_f1: float
    node_set_exact: float
    arg_value_exact: float
    edge_exact: float
    valid: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


INVALID = ExampleScore(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


def multiset_f1(gold: Iterable, pred: Iterable) -> float:
    """F1 between two multisets; 1.0 when both are empty, 0.0 when exactly one is."""
    g, p = Counter(gold), Counter(pred)
    n_g, n_p = sum(g.values()), sum(p.values())
    if n_g == 0 and n_p == 0:
        return 1.0
    overlap = sum((g & p).values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / n_p, overlap / n_g
    return 2 * precision * recall / (precision + recall)


def score_example(gold: TaskGraph, pred: TaskGraph | None) -> ExampleScore:
    if pred is None:
        return INVALID
    g, p = gold.canonical_dag(), pred.canonical_dag()
    g_args, p_args = g.argument_tuples(), p.argument_tuples()
    return ExampleScore(
        graph_em=float(g == p),
        tool_choice=float(g.tasks == p.tasks),
        arg_f1=multiset_f1(g_args, p_args),
        node_set_exact=float(Counter(g.tasks) == Counter(p.tasks)),
        arg_value_exact=float(Counter(g_args) == Counter(p_args)),
        edge_exact=float(set(g.links) == set(p.links)),
        valid=1.0,
    )


# Why a prediction misses, first matching kind wins. "address" separates a skill that is still known
# but written under another family's id (the address drifted) from a skill that is gone.
FAILURE_TITLES = {
    "correct": "exact",
    "arguments": "right skills, wrong arguments or links",
    "address": "right skill names under another family's id",
    "newest_family": "the newest family's skills",
    "other_family": "another family's skills",
    "wrong_skill": "wrong skills of the request's family",
    "unparsed": "unparsable output",
}
FAILURE_KINDS = tuple(FAILURE_TITLES)


def _id_family(skill_id: str) -> str:
    """The family part of ``<Source>::<family>::<name>`` ('' for an id without one)."""
    parts = skill_id.split("::")
    return parts[-2] if len(parts) >= 2 else ""


def _name(skill_id: str) -> str:
    return skill_id.split("::")[-1]


def failure_kind(gold: TaskGraph, pred: TaskGraph | None, newest_family: str | None = None,
                 families: Mapping[str, str] | None = None) -> str:
    """One of :data:`FAILURE_KINDS` for a prediction (see ``FAILURE_TITLES``), checked in that order.

    newest_family: the family learned last; separates intrusions of the most recent skills, the usual
        face of forgetting, from other families' skills (without it those count as ``other_family``).
    families: skill id -> family key from the catalog; an id it does not know (an invented skill) is
        placed by its ``<Source>::<family>::`` part.
    """
    if pred is None:
        return "unparsed"
    g, p = gold.canonical_dag(), pred.canonical_dag()
    if g == p:
        return "correct"
    if Counter(g.tasks) == Counter(p.tasks):
        return "arguments"
    if Counter(map(_name, g.tasks)) == Counter(map(_name, p.tasks)):
        return "address"
    known = families or {}

    def family(skill_id: str) -> str:
        return known.get(skill_id) or _id_family(skill_id)

    gold_families = {family(t) for t in g.tasks}
    if newest_family is not None and newest_family not in gold_families \
            and any(family(t) == newest_family for t in p.tasks):
        return "newest_family"
    if any(family(t) not in gold_families for t in p.tasks):
        return "other_family"
    return "wrong_skill"


def aggregate(scores: Sequence[ExampleScore]) -> dict[str, float]:
    """Mean of every per-example metric (fractions in [0, 1]); ``n`` is the example count."""
    out: dict[str, float] = {"n": float(len(scores))}
    for name in EXAMPLE_METRICS:
        out[name] = sum(getattr(s, name) for s in scores) / len(scores) if scores else 0.0
    return out


def _pooled_f1(tp: int, fp: int, fn: int) -> float:
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


# How an example's links are read for TaskBench's link F1 (module docstring).
LINK_CONVENTIONS = {
    "references": "links implied by <node-j> references in the arguments (TaskBench: Hugging Face, multimedia)",
    "declared": "task_links as declared (TaskBench: daily-life APIs)",
    "canonical": "declared links plus those implied by <node-j> references (skillbank's canonical links)",
}
DOMAIN_LINK_CONVENTIONS = {"dailylifeapis": "declared", "huggingface": "references", "multimedia": "references"}


def link_convention(name: str) -> str:
    """The link convention a TaskBench domain (``huggingface``...) or a convention name stands for."""
    if name in LINK_CONVENTIONS:
        return name
    if name in DOMAIN_LINK_CONVENTIONS:
        return DOMAIN_LINK_CONVENTIONS[name]
    raise ValueError(f"unknown TaskBench domain or link convention {name!r}: use a domain "
                     f"{sorted(DOMAIN_LINK_CONVENTIONS)} or a convention {sorted(LINK_CONVENTIONS)}")


def graph_links(graph: TaskGraph, convention: str) -> set[tuple[str, str]]:
    """The (source, target) skill-id pairs of ``graph`` under a link convention (or a domain's)."""
    convention = link_convention(convention)
    if convention == "declared":
        return {(link.source, link.target) for link in graph.links}
    if convention == "canonical":
        return {(link.source, link.target) for link in graph.canonical_links()}
    out = set()
    for i, node in enumerate(graph.nodes):
        for arg in node.arguments:
            m = ANY_NODE_REF.search(arg.value)
            if m and int(m.group(1)) != i and int(m.group(1)) < len(graph.nodes):
                out.add((graph.nodes[int(m.group(1))].task, node.task))
    return out


def taskbench_f1(golds: Sequence[TaskGraph], preds: Sequence[TaskGraph | None],
                 known_skills: set[str] | None = None,
                 convention: str | Sequence[str] = "canonical") -> dict[str, float | str]:
    """TaskBench's node micro F1 and link binary F1 (see module docstring).

    convention: how links are read: a TaskBench domain (``dailylifeapis``, ``huggingface``,
        ``multimedia``) or a convention name (:data:`LINK_CONVENTIONS`), for all examples or one per
        example (a stream mixing domains). An unknown name raises :class:`ValueError`.
    Returns ``node_f1``, ``edge_f1`` and ``edge_convention``: the convention used, or
    ``"per example: declared x67, references x241"`` when they differ.
    """
    if len(golds) != len(preds):
        raise ValueError(f"golds and preds differ in length: {len(golds)} vs {len(preds)}")
    if isinstance(convention, str):
        conventions = [link_convention(convention)] * len(golds)
    else:
        conventions = [link_convention(c) for c in convention]
        if len(conventions) != len(golds):
            raise ValueError(f"{len(conventions)} link conventions for {len(golds)} examples")
    n_tp = n_fp = n_fn = e_tp = e_fp = e_fn = 0
    for gold, pred, conv in zip(golds, preds, conventions):
        g_nodes = set(gold.tasks)
        p_nodes = set(pred.tasks) if pred is not None else set()
        if known_skills is not None:
            p_nodes &= known_skills | g_nodes
        n_tp += len(g_nodes & p_nodes)
        n_fp += len(p_nodes - g_nodes)
        n_fn += len(g_nodes - p_nodes)
        g_edges = graph_links(gold, conv)
        p_edges = graph_links(pred, conv) if pred is not None else set()
        e_tp += len(g_edges & p_edges)
        e_fp += len(p_edges - g_edges)
        e_fn += len(g_edges - p_edges)
    used = Counter(conventions)
    if isinstance(convention, str):
        name = link_convention(convention)
    elif len(used) <= 1:
        name = next(iter(used), "canonical")
    else:
        name = "per example: " + ", ".join(f"{c} x{n}" for c, n in sorted(used.items()))
    edge_f1 = 1.0 if e_tp + e_fp + e_fn == 0 else _pooled_f1(e_tp, e_fp, e_fn)
    return {"node_f1": _pooled_f1(n_tp, n_fp, n_fn), "edge_f1": edge_f1, "edge_convention": name}


def route_accuracy(gold_labels: Sequence[str], predicted: Sequence[str]) -> float:
    if len(gold_labels) != len(predicted):
        raise ValueError(f"label lists differ in length: {len(gold_labels)} vs {len(predicted)}")
    if not gold_labels:
        return 0.0
    return sum(g == p for g, p in zip(gold_labels, predicted)) / len(gold_labels)


def task_macro(values: Iterable[float]) -> float:
    vals = list(values)
    return sum(vals) / len(vals) if vals else 0.0


class AccuracyMatrix:
    """``a[t][k]``: a metric on task ``k`` after stage ``t``, tasks named by their arrival order.

    ``order`` lists the task keys in arrival order; ``t`` and ``k`` are 1-based positions in it.
    Cells not yet evaluated (the upper triangle) are ``None``.
    """

    def __init__(self, order: Sequence[str]):
        self.order = list(order)
        n = len(self.order)
        self.cells: list[list[float | None]] = [[None] * n for _ in range(n)]

    def _k(self, task: str | int) -> int:
        return task - 1 if isinstance(task, int) else self.order.index(task)

    def set(self, stage: int, task: str | int, value: float) -> None:
        self.cells[stage - 1][self._k(task)] = value

    def get(self, stage: int, task: str | int) -> float | None:
        return self.cells[stage - 1][self._k(task)]

    @property
    def stages_done(self) -> int:
        return sum(1 for row in self.cells if any(v is not None for v in row))

    def row(self, stage: int) -> dict[str, float]:
        return {k: v for k, v in zip(self.order, self.cells[stage - 1]) if v is not None}

    def diagonal(self) -> dict[str, float]:
        return {k: self.cells[i][i] for i, k in enumerate(self.order) if self.cells[i][i] is not None}

    def macro(self, stage: int | None = None) -> float:
        """Task-macro mean of row ``stage`` (default: the last stage evaluated)."""
        stage = stage or self.stages_done
        return task_macro(self.row(stage).values())

    def bwt(self, stage: int | None = None) -> float:
        """Backward transfer after ``stage`` (default: last): mean over k < T of a[T][k] - a[k][k]."""
        T = stage or self.stages_done
        diffs = [self.cells[T - 1][k] - self.cells[k][k] for k in range(T - 1)
                 if self.cells[T - 1][k] is not None and self.cells[k][k] is not None]
        return task_macro(diffs)

    def to_dict(self) -> dict:
        return {"order": self.order, "cells": self.cells}

    @classmethod
    def from_dict(cls, d: dict) -> "AccuracyMatrix":
        m = cls(d["order"])
        m.cells = [list(r) for r in d["cells"]]
        return m
