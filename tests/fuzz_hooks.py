"""schemathesis hooks for tests/test_serve_fuzz.py (loaded through $SCHEMATHESIS_HOOKS).

The learn call has rules JSON Schema cannot state: each record's family is the call's, its graph's references
and links point at its own nodes, ids are unique, its skills are new to the bank and within ``skills`` when
given, at least one record fits ``train.max_length`` tokens - and the JSON Lines form is a string whose lines
are records. The schema states the shape of all of it; for schema-valid (positive) cases of ``POST
/v1/families`` this hook supplies the rest, as schemathesis recommends for rules between fields: the records
become a small valid set of the generated family, ``skills`` and ``train.max_length`` are dropped (the other
generated settings are sent as generated). Negative cases are sent untouched: the service must refuse them.
"""
from __future__ import annotations

import json

import schemathesis


def records_for(family: str) -> str:
    """Three records of ``family`` over skills no bank has (prefix ``Fuzz::``), as JSON Lines."""
    skills = [f"Fuzz::{family}::{name}" for name in ("find", "book", "notify")]
    records = []
    for i, request in enumerate(("find a room in Lisbon", "book the room found in Lisbon",
                                 "book a room in Porto and tell Ana")):
        nodes = [{"task": skills[min(i, 1)], "arguments": [{"name": "city", "value": "Lisbon" if i < 2 else "Porto"}]}]
        links = []
        if i == 2:
            nodes.append({"task": skills[2], "arguments": [{"name": "input", "value": "<node-0>"}]})
            links.append({"source": skills[1], "target": skills[2]})
        records.append({"id": f"fuzz-{i}", "family": family, "request": request,
                        "graph": {"task_nodes": nodes, "task_links": links}})
    return "".join(json.dumps(r) + "\n" for r in records)


@schemathesis.hook
def before_call(context, case, kwargs):
    if (case.operation.method.upper(), case.operation.path) != ("POST", "/v1/families"):
        return
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or not isinstance(case.body, dict):
        return
    family = case.body.get("family")
    if not isinstance(family, str):
        return
    body = {k: v for k, v in case.body.items() if k != "skills"}
    body["records"] = records_for(family)
    if isinstance(body.get("train"), dict):
        body["train"] = {k: v for k, v in body["train"].items() if k != "max_length"}
    case.body = body
