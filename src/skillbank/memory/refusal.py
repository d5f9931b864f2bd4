"""An executor that can say no: a shard trained on its family's negatives to write the refusal skill.

The scope gate is the cheap first check; what passes it reaches an executor that, constrained to its family's
skills, always writes *some* plan. A shard learned with ``executor_refuses`` is also trained on its family's
negatives (:mod:`skillbank.data.negatives`), each with the one-node target ``<prefix>no_skill`` and no
arguments, and its grammar allows that node beside the family's skills. A plan that uses it is no plan: the
planner answers ``out_of_scope`` with the reason "the <family> executor has no skill for this".

The refusal is a skill of the grammar only: it is not one of the family's skills (routing, catalogs and
``skillbank skills`` never show it), and ``skills.json`` names it under ``"refusal"``. Shards learned without it
are unchanged.
"""
from __future__ import annotations

from typing import Sequence

from skillbank.errors import BankError

REFUSAL_NAME = "no_skill"
#: Refusal records trained beside the family's records: at most this share of them (given negatives first), so
#: that the executor does not learn to refuse more than it plans.
MAX_SHARE = 0.5
MIN_REFUSALS = 8


def refusal_id(family_prefix: str) -> str:
    return f"{family_prefix}{REFUSAL_NAME}"


def refusal_records(family: str, family_prefix: str, declared: Sequence[str], negatives: Sequence,
                    n_records: int) -> list:
    """Training records for the refusal: negatives (given before synthesized) with the one-node refusal target,
    at most ``MAX_SHARE`` of ``n_records`` (and at least ``MIN_REFUSALS`` where there are as many)."""
    from skillbank.data.records import Record
    from skillbank.graph import TaskGraph
    rid = refusal_id(family_prefix)
    if rid in declared:
        raise BankError(f"family {family!r} has a skill named {rid!r}: the executor's refusal needs that name; "
                        "learn it without executor_refuses")
    ordered = [n for n in negatives if n.source == "given"] + [n for n in negatives if n.source != "given"]
    keep = min(len(ordered), max(MIN_REFUSALS, int(MAX_SHARE * n_records)))
    graph = TaskGraph.from_dict({"task_nodes": [{"task": rid, "arguments": []}], "task_links": []})
    return [Record(f"refusal-{n.id}", family, n.request, graph) for n in ordered[:keep]]


def is_refusal(graph, refusal: str | None) -> bool:
    """Whether a decoded plan uses the shard's refusal skill."""
    return refusal is not None and graph is not None and any(node.task == refusal for node in graph.nodes)
