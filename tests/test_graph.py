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


def test_canonical_keeps_node_order_but_the_key_does_not_depend_on_it():
    g1 = TaskGraph.from_dict(graph_dict([(A, []), (B, [])]))
    g2 = TaskGraph.from_dict(graph_dict([(B, []), (A, [])]))
    assert g1.canonical().tasks == (A, B) and g2.canonical().tasks == (B, A)  # stored records keep their order
    assert g1.canonical_dag() == g2.canonical_dag()
    assert g1.canonical_key() == g2.canonical_key()


D = "TaskBench::t1_daily_life::print_document"


def test_dag_order_renumbers_references_and_ignores_the_listing():
    # C consumes A (as 'content') and B (as 'email_address'); A and B are independent.
    listed = TaskGraph.from_dict(graph_dict([(A, [("bill", "gas")]), (B, [("topic", "x")]),
                                             (C, [("content", "<node-0>"), ("email_address", "<node-1>")])]))
    swapped = TaskGraph.from_dict(graph_dict([(B, [("topic", "x")]), (A, [("bill", "gas")]),
                                              (C, [("content", "<node-1>"), ("email_address", "<node-0>")])]))
    assert listed.canonical() != swapped.canonical()
    assert listed.canonical_dag() == swapped.canonical_dag()
    assert listed.canonical_key() == swapped.canonical_key()
    # attend_meeting_online < daily_bill_payment < send_email: B first, references renumbered to match
    dag = listed.canonical_dag()
    assert dag.tasks == (B, A, C)
    assert dag.nodes[2].arguments == (Argument("content", "<node-1>"), Argument("email_address", "<node-0>"))
    assert swapped.canonical_order() == [0, 1, 2] and listed.canonical_order() == [1, 0, 2]
    assert dag.canonical_dag() == dag  # idempotent
    # a different DAG: the same nodes, but C takes A's output as its address and B's as its content
    other = TaskGraph.from_dict(graph_dict([(A, [("bill", "gas")]), (B, [("topic", "x")]),
                                            (C, [("content", "<node-1>"), ("email_address", "<node-0>")])]))
    assert other.canonical_key() != listed.canonical_key()
    assert other.canonical_links() == listed.canonical_links()  # the links alone do not tell them apart


def test_dag_order_follows_declared_links_and_leaves_chains_and_single_nodes_alone():
    # daily-life style: dependencies only in task_links; the consumer comes after its producers
    g1 = TaskGraph.from_dict(graph_dict([(C, []), (A, []), (D, [])], [(A, D), (C, D)]))
    g2 = TaskGraph.from_dict(graph_dict([(A, []), (C, []), (D, [])], [(C, D), (A, D)]))
    assert g1.canonical_dag() == g2.canonical_dag() and g1.canonical_dag().tasks == (A, C, D)
    # a chain has one topological order: the listed one, even against the key order
    chain = TaskGraph.from_dict(graph_dict([(C, [("content", "hi")]), (B, [("topic", "<node-0>")]),
                                            (A, [("bill", "<node-1>")])]))
    assert chain.canonical_dag() == chain.canonical()
    linked = TaskGraph.from_dict(graph_dict([(C, []), (A, [])], [(C, A)]))
    assert linked.canonical_dag() == linked.canonical()
    single = TaskGraph.from_dict(graph_dict([(C, [("email_address", "a@b.c"), ("content", "hi")])]))
    assert single.canonical_dag() == single.canonical()


def test_dag_order_with_repeated_skills_is_deterministic():
    # two identical A nodes feeding B and C: which A is listed first must not matter
    g1 = TaskGraph.from_dict(graph_dict([(A, [("bill", "gas")]), (A, [("bill", "gas")]),
                                         (B, [("topic", "<node-0>")]), (C, [("content", "<node-1>")])]))
    g2 = TaskGraph.from_dict(graph_dict([(A, [("bill", "gas")]), (A, [("bill", "gas")]),
                                         (B, [("topic", "<node-1>")]), (C, [("content", "<node-0>")])]))
    g3 = TaskGraph.from_dict(graph_dict([(A, [("bill", "gas")]), (C, [("content", "<node-0>")]),
                                         (A, [("bill", "gas")]), (B, [("topic", "<node-2>")])]))
    assert g1.canonical_key() == g2.canonical_key() == g3.canonical_key()
    assert [n.arguments for n in g1.canonical_dag().nodes[2:]] == [(Argument("topic", "<node-0>"),),
                                                                  (Argument("content", "<node-1>"),)]
    # same skill, different arguments: ordered by the arguments
    g4 = TaskGraph.from_dict(graph_dict([(A, [("bill", "water")]), (A, [("bill", "gas")])]))
    assert [n.arguments[0].value for n in g4.canonical_dag().nodes] == ["gas", "water"]
    # B fed by the gas bill vs by the water bill: different graphs
    g5 = TaskGraph.from_dict(graph_dict([(A, [("bill", "water")]), (A, [("bill", "gas")]), (B, [("topic", "<node-0>")])]))
    g6 = TaskGraph.from_dict(graph_dict([(A, [("bill", "gas")]), (A, [("bill", "water")]), (B, [("topic", "<node-0>")])]))
    assert g5.canonical_key() != g6.canonical_key()


def test_dag_order_renumbers_references_inside_longer_values():
    g1 = TaskGraph.from_dict(graph_dict([(A, [("bill", "gas")]), (B, [("topic", "x")]),
                                         (C, [("content", "see <node-0>")])]))
    g2 = TaskGraph.from_dict(graph_dict([(B, [("topic", "x")]), (A, [("bill", "gas")]),
                                         (C, [("content", "see <node-1>")])]))
    assert g1.canonical_key() == g2.canonical_key()
    assert g1.canonical_dag().nodes[2].arguments == (Argument("content", "see <node-1>"),)
    # a forward reference inside text is no dependency we can order by: the listing is kept
    fwd = TaskGraph.from_dict(graph_dict([(C, [("content", "see <node-1>")]), (A, [("bill", "gas")])]))
    assert fwd.canonical_dag() == fwd.canonical()


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


def test_canonical_dag_keeps_a_dangling_reference_of_a_generated_graph():
    """A model can write <node-1> in a one-node graph; scoring it must not crash (the comparison did)."""
    from skillbank.metrics import score_example
    pred = TaskGraph((Node("a", (Argument("x", "<node-1>"),)),), ())  # as decoded, before any validation
    assert pred.canonical_dag().nodes[0].arguments[0].value == "<node-1>"
    gold = TaskGraph.from_dict({"task_nodes": [{"task": "a", "arguments": [{"name": "x", "value": "v"}]}],
                                "task_links": []})
    assert not score_example(gold, pred).graph_em
