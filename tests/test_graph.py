import json

import pytest

from skillbank.errors import GraphError
from skillbank.graph import Argument, Link, Node, TaskGraph, canonical_value, parse_graph

A = "TaskBench::t1_daily_life::daily_bill_payment"
B = "TaskBench::t1_daily_life::attend_meeting_online"
C = "TaskBench::t1_daily_life::send_email"


def graph_dict(nodes, links=()):
    return {"task_nodes": [{"task": t, "arguments": [{"name": n, "value": v} for n, v in args]} for t, args in nodes],
            "task_links": [{"source": s, "target": t} for s, t in links]}


def test_round_trip_keeps_key_order_and_node_order():
    d = graph_dict([(A, [("bill", "electricity")]), (B, [("topic", "Bills")])], [(A, B)])
    g = TaskGraph.from_dict(d)
    assert list(json.loads(g.to_json())) == ["task_nodes", "task_links"]
    assert g.tasks == (A, B)
    assert TaskGraph.from_json(g.to_json()) == g


def test_canonical_ignores_argument_and_link_order_and_duplicate_links():
    g1 = TaskGraph.from_dict(graph_dict([(C, [("email_address", "a@b.c"), ("content", "hi")]), (A, [("bill", "gas")])],
                                        [(C, A)]))
    g2 = TaskGraph.from_dict(graph_dict([(C, [("content", "hi"), ("email_address", "a@b.c")]), (A, [("bill", "gas")])],
                                        [(C, A), (C, A)]))
    assert g1 != g2
    assert g1.canonical() == g2.canonical()
    assert g1.canonical_key() == g2.canonical_key()


def test_canonical_keeps_node_order():
    g1 = TaskGraph.from_dict(graph_dict([(A, []), (B, [])]))
    g2 = TaskGraph.from_dict(graph_dict([(B, []), (A, [])]))
    assert g1.canonical_key() != g2.canonical_key()


def test_reference_implies_link_in_canonical_form():
    with_ref = TaskGraph.from_dict(graph_dict([(A, [("bill", "gas")]), (C, [("content", "<node-0>")])]))
    with_both = TaskGraph.from_dict(graph_dict([(A, [("bill", "gas")]), (C, [("content", "<node-0>")])], [(A, C)]))
    assert with_ref.canonical_links() == (Link(A, C),)
    assert with_ref.canonical() == with_both.canonical()


def test_values_are_canonical_strings():
    assert canonical_value(3) == "3"
    assert canonical_value(2.5) == "2.5"
    assert canonical_value(True) == "true"
    assert canonical_value("  x ") == "x"
    with pytest.raises(GraphError, match="string or number"):
        canonical_value(None)
    with pytest.raises(GraphError, match="string or number"):
        canonical_value(["a"])


@pytest.mark.parametrize("obj, reason", [
    ([], "expected a JSON object"),
    ({"task_nodes": []}, "missing key 'task_links'"),
    ({"task_nodes": [], "task_links": []}, "non-empty"),
    ({"task_nodes": [{"task": A, "arguments": []}], "task_links": [], "plan": 1}, "unexpected key"),
    ({"task_nodes": [{"task": A}], "task_links": []}, "missing 'arguments'"),
    ({"task_nodes": [{"task": A, "arguments": "electricity"}], "task_links": []}, "must be a list"),
    ({"task_nodes": [{"task": A, "arguments": [{"name": "bill"}]}], "task_links": []}, "exactly name and value"),
    ({"task_nodes": [{"task": "", "arguments": []}], "task_links": []}, "non-empty string 'task'"),
    (graph_dict([(A, [("bill", "x"), ("bill", "y")])]), "repeats argument name"),
    (graph_dict([(A, [("bill", "<node-3>")])]), "does not exist"),
    (graph_dict([(A, [("bill", "<node-1>")]), (B, [])]), "not an earlier node"),
    (graph_dict([(A, [("bill", "<node-0>")])]), "not an earlier node"),
    (graph_dict([(A, [])], [(A, C)]), "not a node task"),
    (graph_dict([(A, [])], [(A, A)]), "self-loop"),
    (graph_dict([(A, []), (B, [])], [(A, B), (B, A)]), "cycle"),
    (graph_dict([(A, []), (B, []), (C, [])], [(A, B), (B, C), (C, A)]), "cycle"),
])
def test_off_contract_graphs_are_rejected_with_reason(obj, reason):
    with pytest.raises(GraphError, match=reason):
        TaskGraph.from_dict(obj)
    result = parse_graph(json.dumps(obj))
    assert not result.valid
    if isinstance(obj, dict):
        assert reason.split("'")[0] in result.error


def test_parse_takes_first_json_object_in_prose_and_fences():
    g = graph_dict([(A, [("bill", "water")])])
    text = "Sure! Here is the plan:\n```json\n" + json.dumps(g) + "\n```\nand {\"other\": 1}"
    result = parse_graph(text)
    assert result.valid and result.graph.tasks == (A,)


@pytest.mark.parametrize("text, reason", [
    ("", "empty output"),
    (None, "empty output"),
    ("no json here", "no JSON object"),
    ('{"task_nodes": [{"task": "x", "arguments": [{"name": "a", "value": "b"}', "no complete JSON object"),
    ('[1, 2]', "no JSON object"),
])
def test_parse_never_raises(text, reason):
    result = parse_graph(text)
    assert result.graph is None
    assert reason in result.error


def test_truncated_graph_reports_truncation_not_inner_fragment():
    result = parse_graph('{"task_nodes": [{"task": "x", "arguments": [{"name": "a", "value": "b"}]}, {"task"')
    assert not result.valid and "no complete JSON object" in result.error


def test_node_references():
    n = Node(C, (Argument("content", "<node-0>"), Argument("email_address", "x")))
    assert n.references() == [0]
