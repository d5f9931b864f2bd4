"""Copy-constrained values by default where a family's records copy theirs: ``learn`` records whether every
literal value of the training graphs occurs verbatim in its request (``ShardEntry.values_copied``), and plans of
that shard then decode values as substrings of the request unless told otherwise; a family whose records
normalise values ("tomorrow" -> a date) keeps free values. Tiny random model: the bookkeeping and which
grammar each request gets, not what the executor writes."""
import dataclasses
import json

import pytest
from typer.testing import CliRunner

from skillbank.cli import app

from skillbank.graph import TaskGraph, literal_values, values_copied
from skillbank.memory.bank import SkillBank, bank_info, read_manifest
from skillbank.memory.execution import ExecutionMemory
from skillbank.model.base import BaseModelConfig, load_base
from skillbank.train.executor import TrainConfig

CFG = TrainConfig(epochs=1, batch_size=4, target_format="compact", seed=0)


def graph(*values):
    return TaskGraph.from_dict({"task_nodes": [{"task": "a", "arguments": [{"name": f"x{i}", "value": v}
                                                                           for i, v in enumerate(values)]},
                                               {"task": "b", "arguments": [{"name": "y", "value": "<node-0>"}]}],
                                "task_links": []})


def test_values_copied_reads_literal_values_only():
    g = graph("Kyoto", "tomorrow")
    assert literal_values(g) == ["Kyoto", "tomorrow"]  # the <node-0> reference is not a value
    assert values_copied([("Kyoto weather tomorrow", g)])
    assert not values_copied([("Kyoto weather tomorrow", g), ("weather in kyoto tomorrow", g)])  # case counts
    assert values_copied([])


@pytest.fixture()
def bank_two_families(tmp_path, tiny_model_dir, small_stream):
    """k1 learned from its records as they are (every value copied), k2 from records with one value normalised."""
    k1, k2 = small_stream.family_keys[:2]
    records2 = list(small_stream.train[k2])
    r = next(r for r in records2 if literal_values(r.graph))
    node = r.graph.nodes[0]
    arg = next(a for a in node.arguments if a in [x for x in node.arguments if not x.value.startswith("<node")])
    changed = dataclasses.replace(arg, value="2031-01-01 (normalised)")
    new_node = dataclasses.replace(node, arguments=tuple(changed if a is arg else a for a in node.arguments))
    records2[records2.index(r)] = dataclasses.replace(r, graph=dataclasses.replace(
        r.graph, nodes=(new_node,) + r.graph.nodes[1:]))
    bank = SkillBank.create(tmp_path / "bank", base=load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False))
    bank.learn(k1, small_stream.train[k1], CFG, catalog=small_stream.catalog, progress=False)
    bank.learn(k2, records2, CFG, catalog=small_stream.catalog, progress=False)
    return bank, k1, k2


def test_learn_records_whether_values_are_copied_and_plans_follow_it(bank_two_families, small_stream, monkeypatch):
    bank, k1, k2 = bank_two_families
    entries = {e.name: e for e in read_manifest(bank.root).shards}
    assert entries[k1].values_copied is True and entries[k2].values_copied is False
    assert {s["name"]: s["values_copied"] for s in bank_info(bank.root)["shards"]} == {k1: True, k2: False}
    shown = CliRunner().invoke(app, ["info", str(bank.root)], catch_exceptions=False)
    assert f"values copied from the request (every training record did): {k1}\n" in shown.stdout

    asked = []
    real = ExecutionMemory.grammar

    def grammar(self, name, copy_from=None):
        asked.append((name, copy_from))
        return real(self, name, copy_from)

    monkeypatch.setattr(ExecutionMemory, "grammar", grammar)
    requests = {k1: small_stream.test[k1][0].request, k2: small_stream.test[k2][0].request}

    def copy_used(**kw):
        asked.clear()
        for shard, request in requests.items():
            bank.plan([request], shard=shard, max_new_tokens=4, **kw)
        return {name: copy_from is not None for name, copy_from in asked}

    assert copy_used() == {k1: True, k2: False}  # the default: as each shard's records did
    assert copy_used(copy_values=False) == {k1: False, k2: False}
    assert copy_used(copy_values=True) == {k1: True, k2: True}
    # the copy grammar is the request's own
    asked.clear()
    bank.plan([requests[k1]], shard=k1, max_new_tokens=4)
    assert asked == [(k1, requests[k1])]


def test_a_bank_made_before_the_field_plans_as_before(bank_two_families):
    bank, k1, _ = bank_two_families
    manifest = json.loads((bank.root / "bank.json").read_text())
    for s in manifest["shards"]:
        del s["values_copied"]
    (bank.root / "bank.json").write_text(json.dumps(manifest))
    assert all(e.values_copied is False for e in read_manifest(bank.root).shards)
    reopened = SkillBank.open(bank.root, engine="torch")
    assert reopened.plan(["anything at all"], shard=k1, max_new_tokens=4)[0].shard == k1


def test_the_service_grammar_follows_the_shard(bank_two_families, small_stream):
    from skillbank.serve.state import open_snapshot

    bank, k1, k2 = bank_two_families
    snap = open_snapshot(bank.root, load_model=False)
    request = small_stream.test[k1][0].request
    assert snap.grammar(k1, request).copy_from == request
    assert snap.grammar(k2, request).copy_from is None
    assert snap.grammar(k1).copy_from is None  # no request: the shard's whole-plan grammar
