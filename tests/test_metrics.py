import pytest

from skillbank.graph import TaskGraph
from skillbank.metrics import (AccuracyMatrix, aggregate, failure_kind, graph_links, multiset_f1, route_accuracy,
                               score_example, task_macro, taskbench_f1)

A, B, C = "S::f::a", "S::f::b", "S::f::c"


def g(nodes, links=()):
    return TaskGraph.from_dict({
        "task_nodes": [{"task": t, "arguments": [{"name": n, "value": v} for n, v in args]} for t, args in nodes],
        "task_links": [{"source": s, "target": t} for s, t in links]})


GOLD = g([(A, [("x", "1"), ("y", "2")]), (B, [("z", "<node-0>")])], [(A, B)])


def test_exact_match_scores_one_everywhere():
    s = score_example(GOLD, g([(A, [("y", "2"), ("x", "1")]), (B, [("z", "<node-0>")])]))
    assert s.as_dict() == {"graph_em": 1, "tool_choice": 1, "arg_f1": 1, "node_set_exact": 1,
                           "arg_value_exact": 1, "edge_exact": 1, "valid": 1}


def test_wrong_value_breaks_em_but_not_tool_choice():
    s = score_example(GOLD, g([(A, [("x", "1"), ("y", "3")]), (B, [("z", "<node-0>")])]))
    assert (s.graph_em, s.tool_choice, s.node_set_exact, s.arg_value_exact, s.edge_exact) == (0, 1, 1, 0, 1)
    # gold tuples {(A,x,1),(A,y,2),(B,z,<node-0>)}, pred shares 2 of 3 -> P = R = 2/3
    assert s.arg_f1 == pytest.approx(2 / 3)


def test_reversed_dependency_keeps_node_set_but_not_tool_choice():
    pred = g([(B, [("z", "q")]), (A, [("x", "1"), ("y", "<node-0>")])])  # B -> A instead of A -> B
    s = score_example(GOLD, pred)
    assert (s.graph_em, s.tool_choice, s.node_set_exact, s.edge_exact) == (0, 0, 1, 0)


def test_listing_order_of_a_link_respecting_plan_does_not_matter():
    # B listed first, but the declared link A -> B puts it after A in canonical DAG order
    pred = g([(B, [("z", "q")]), (A, [("x", "1"), ("y", "2")])], [(A, B)])
    s = score_example(GOLD, pred)
    assert (s.graph_em, s.tool_choice, s.node_set_exact, s.edge_exact) == (0, 1, 1, 1)


def test_independent_nodes_in_another_order_are_an_exact_match():
    gold = g([(A, [("x", "1")]), (B, [("z", "2")]), (C, [("p", "<node-0>"), ("q", "<node-1>")])])
    pred = g([(B, [("z", "2")]), (A, [("x", "1")]), (C, [("p", "<node-1>"), ("q", "<node-0>")])])
    assert score_example(gold, pred).as_dict() == dict.fromkeys(
        ["graph_em", "tool_choice", "arg_f1", "node_set_exact", "arg_value_exact", "edge_exact", "valid"], 1.0)
    assert failure_kind(gold, pred) == "correct"
    # C's inputs swapped: the same nodes and links, a different graph
    wrong = g([(B, [("z", "2")]), (A, [("x", "1")]), (C, [("p", "<node-0>"), ("q", "<node-1>")])])
    s = score_example(gold, wrong)
    assert (s.graph_em, s.tool_choice, s.node_set_exact, s.edge_exact) == (0, 1, 1, 1)
    assert s.arg_f1 == pytest.approx(2 / 4)  # (A,x,1) and (B,z,2) shared; C's two references are not
    assert failure_kind(gold, wrong) == "arguments"


def test_missing_link_breaks_edge_exactness():
    gold = g([(A, [("x", "1")]), (B, [("z", "2")])], [(A, B)])
    pred = g([(A, [("x", "1")]), (B, [("z", "2")])])
    s = score_example(gold, pred)
    assert (s.graph_em, s.edge_exact, s.arg_value_exact) == (0, 0, 1)


def test_invalid_prediction_is_zero_not_a_crash():
    assert score_example(GOLD, None).as_dict() == dict.fromkeys(
        ["graph_em", "tool_choice", "arg_f1", "node_set_exact", "arg_value_exact", "edge_exact", "valid"], 0.0)


def test_multiset_f1_hand_computed():
    assert multiset_f1([], []) == 1.0
    assert multiset_f1(["a"], []) == 0.0
    assert multiset_f1(["a", "a", "b"], ["a", "b", "b"]) == pytest.approx(2 / 3)  # overlap a,b: P=R=2/3
    assert multiset_f1(["a", "b"], ["a"]) == pytest.approx(2 * 1 * 0.5 / 1.5)


def test_aggregate_means():
    scores = [score_example(GOLD, GOLD), score_example(GOLD, None)]
    agg = aggregate(scores)
    assert agg["n"] == 2 and agg["graph_em"] == 0.5 and agg["valid"] == 0.5


def test_taskbench_f1_hand_computed():
    golds = [g([(A, []), (B, [("z", "<node-0>")])]), g([(C, [])])]
    preds = [g([(A, []), (C, [])]), None]
    # nodes: ex1 gold {A,B} pred {A,C} -> tp1 fp1 fn1; ex2 gold {C} pred {} -> fn1. F1 = 2/(2+1+2) = 0.4
    # edges: ex1 gold {A->B} pred {} -> fn1. F1 = 0
    out = taskbench_f1(golds, preds)
    assert out["node_f1"] == pytest.approx(0.4)
    assert out["edge_f1"] == 0.0
    # TaskBench ignores predicted tools outside the catalog
    out = taskbench_f1(golds, preds, known_skills={A, B})
    assert out["node_f1"] == pytest.approx(2 / (2 + 0 + 2))


# TaskBench-style pair (Hugging Face / multimedia bare values turned into named slots)
D, E = "S::f::d", "S::f::e"
TB_GOLDS = [
    # A -> B -> C by references; only A -> B is declared
    g([(A, [("image", "example.jpg")]), (B, [("image", "<node-0>")]), (C, [("text", "<node-1>")])], [(A, B)]),
    g([(D, [("text", "hi")])]),
]
TB_PREDS = [
    # C reads A instead of B; declares A -> B and B -> C
    g([(A, [("image", "example.jpg")]), (C, [("text", "<node-0>")]), (B, [("image", "<node-0>")])], [(A, B), (B, C)]),
    # an extra node E fed by D, declared too
    g([(D, [("text", "hi")]), (E, [("text", "<node-0>")])], [(D, E)]),
]


def test_taskbench_edge_f1_follows_each_domains_convention():
    # references (Hugging Face, multimedia): ex1 gold {A>B, B>C}, pred {A>B, A>C} -> tp 1, fp 1, fn 1;
    #   ex2 gold {}, pred {D>E} -> fp 1. F1 = 2*1 / (2*1 + 2 + 1) = 0.4
    # declared (daily life): ex1 gold {A>B}, pred {A>B, B>C} -> tp 1, fp 1; ex2 pred {D>E} -> fp 1.
    #   F1 = 2 / (2 + 2 + 0) = 0.5
    # canonical (skillbank: declared + implied): ex1 gold {A>B, B>C}, pred {A>B, B>C, A>C} -> tp 2, fp 1;
    #   ex2 fp 1. F1 = 4 / (4 + 2) = 2/3
    expected = {"huggingface": ("references", 0.4), "multimedia": ("references", 0.4),
                "dailylifeapis": ("declared", 0.5), "references": ("references", 0.4),
                "declared": ("declared", 0.5), "canonical": ("canonical", 2 / 3)}
    for name, (convention, f1) in expected.items():
        out = taskbench_f1(TB_GOLDS, TB_PREDS, convention=name)
        assert out["edge_convention"] == convention, name
        assert out["edge_f1"] == pytest.approx(f1), name
        # nodes: ex1 {A,B,C} vs {A,B,C}: tp 3; ex2 {D} vs {D,E}: tp 1, fp 1 -> 8 / (8 + 1) whatever the links
        assert out["node_f1"] == pytest.approx(8 / 9), name
    assert taskbench_f1(TB_GOLDS, TB_PREDS)["edge_convention"] == "canonical"  # the default
    # one convention per example (a stream mixing domains): ex1 references (tp 1, fp 1, fn 1), ex2 declared (fp 1)
    out = taskbench_f1(TB_GOLDS, TB_PREDS, convention=["huggingface", "dailylifeapis"])
    assert out["edge_convention"] == "per example: declared x1, references x1"
    assert out["edge_f1"] == pytest.approx(2 / (2 + 2 + 1))
    with pytest.raises(ValueError, match="unknown TaskBench domain or link convention 'daily'"):
        taskbench_f1(TB_GOLDS, TB_PREDS, convention="daily")
    with pytest.raises(ValueError, match="2 examples"):
        taskbench_f1(TB_GOLDS, TB_PREDS, convention=["huggingface"])


def test_reference_links_read_like_taskbench():
    # a reference inside a longer value counts (TaskBench looks for '<node-' anywhere); the first one per value
    graph = g([(A, [("image", "a.jpg")]), (B, [("text", "x")]), (C, [("text", "describe <node-0> and <node-1>")])])
    assert graph_links(graph, "references") == {(A, C)}
    assert graph_links(graph, "canonical") == set()  # not a whole-value reference: no implied link
    assert graph_links(GOLD, "declared") == {(A, B)}


def test_edge_f1_is_one_when_no_example_has_links():
    golds = [g([(A, [("x", "1")])]), g([(B, [])])]
    preds = [g([(A, [("x", "2")])]), None]
    for convention in ("huggingface", "dailylifeapis", "canonical"):
        out = taskbench_f1(golds, preds, convention=convention)
        assert out["edge_f1"] == 1.0, convention
        assert out["node_f1"] == pytest.approx(2 / (2 + 0 + 1)), convention
    # a link on one side only is 0, as before
    assert taskbench_f1(golds, [g([(A, []), (B, [("z", "<node-0>")])]), None], convention="references")["edge_f1"] == 0.0


def test_route_accuracy():
    assert route_accuracy(["a", "b", "b"], ["a", "a", "b"]) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="differ in length"):
        route_accuracy(["a"], [])


def test_accuracy_matrix_macro_and_bwt_hand_computed():
    m = AccuracyMatrix(["t3", "t1", "t2"])
    m.set(1, "t3", 0.8)
    m.set(2, "t3", 0.6); m.set(2, "t1", 0.5)
    m.set(3, "t3", 0.4); m.set(3, "t1", 0.5); m.set(3, "t2", 0.9)
    assert m.stages_done == 3
    assert m.diagonal() == {"t3": 0.8, "t1": 0.5, "t2": 0.9}
    assert m.macro() == pytest.approx((0.4 + 0.5 + 0.9) / 3)
    assert m.macro(2) == pytest.approx(0.55)
    # BWT = mean(a[3][1]-a[1][1], a[3][2]-a[2][2]) = mean(0.4-0.8, 0.5-0.5) = -0.2
    assert m.bwt() == pytest.approx(-0.2)
    assert m.get(1, "t1") is None
    assert AccuracyMatrix.from_dict(m.to_dict()).cells == m.cells
    assert task_macro([]) == 0.0


def test_failure_kinds_separate_a_drifted_address_from_a_lost_skill():
    assert failure_kind(GOLD, GOLD) == "correct"
    assert failure_kind(GOLD, None) == "unparsed"
    assert failure_kind(GOLD, g([(A, [("x", "9"), ("y", "2")]), (B, [("z", "<node-0>")])], [(A, B)])) == "arguments"
    # the same skill names written under another family's id: the skill is known, the address is not
    drifted = g([("S::t5::a", [("x", "1"), ("y", "2")]), ("S::t5::b", [("z", "<node-0>")])], [("S::t5::a", "S::t5::b")])
    assert failure_kind(GOLD, drifted) == "address"
    assert failure_kind(GOLD, g([("S::t5::q", [("x", "1")])])) == "other_family"
    assert failure_kind(GOLD, g([(A, [("x", "1")]), ("S::t5::q", [])])) == "other_family"
    assert failure_kind(GOLD, g([("S::t5::q", [("x", "1")])]), newest_family="t5") == "newest_family"
    assert failure_kind(GOLD, g([("S::t5::q", [("x", "1")])]), newest_family="t4") == "other_family"
    assert failure_kind(GOLD, drifted, newest_family="t5") == "address"  # names kept: the address drifted
    assert failure_kind(GOLD, GOLD, newest_family="f") == "correct"
    # ids outside the <Source>::<family>::<name> pattern are placed by the catalog's families
    plain_gold = g([("a", [("x", "1")])])
    assert failure_kind(plain_gold, g([("q", [("x", "1")])]), newest_family="new",
                        families={"a": "old", "q": "new"}) == "newest_family"
    assert failure_kind(plain_gold, g([("b", [("x", "1")])]), families={"a": "old", "b": "old"}) == "wrong_skill"
    assert failure_kind(GOLD, g([(C, [("x", "1")])])) == "wrong_skill"
    assert failure_kind(GOLD, g([(A, [("x", "1"), ("y", "2")])])) == "wrong_skill"  # a node missing
