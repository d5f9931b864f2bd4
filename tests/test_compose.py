"""Compositional augmentation: records made from a family's own records - values resampled across records of the
same skill and argument, single-step requests joined with the family's connectors and links - never a skill,
argument or value the records lack, every value verbatim, deterministic and capped; it steps aside, saying why,
where the records cannot support it."""
from pathlib import Path

import pytest

from skillbank.data.compose import Compose, ComposeError, compose_records
from skillbank.data.records import Record, read_records
from skillbank.graph import NODE_REF, TaskGraph, literal_values

HOME = Path(__file__).resolve().parents[1] / "examples" / "home_energy" / "records.jsonl"


def rec(rid, request, *nodes, links=()):
    return Record(rid, "fam", request, TaskGraph.from_dict({
        "task_nodes": [{"task": t, "arguments": [{"name": n, "value": v} for n, v in args]} for t, args in nodes],
        "task_links": [{"source": s, "target": t} for s, t in links]}))


def shape(records):
    """Every (skill, argument) the records use, and the literal values each takes."""
    out = {}
    for r in records:
        for n in r.graph.nodes:
            for a in n.arguments:
                values = out.setdefault((n.task, a.name), set())
                if not NODE_REF.match(a.value):
                    values.add(a.value)
    return out


def test_the_example_family_gets_resampled_and_joined_records_within_what_it_shows():
    records = read_records(HOME).records
    out, report = compose_records(records, Compose(seed=0))
    assert out[:len(records)] == records and len(out) - len(records) == sum(report.made.values()) <= len(records)
    assert report.made["resampled"] > 10 and report.made["joined"] + report.made["joined-unlinked"] > 5, \
        report.summary()
    assert " then " in report.connectors or ", then " in report.connectors
    original = shape(records)
    for r in out[len(records):]:
        assert all(v in r.request for v in literal_values(r.graph)), r
        for (skill, arg), values in shape([r]).items():
            assert (skill, arg) in original and values <= original[(skill, arg)], (r.request, skill, arg)
        if "~compose-j" in r.id:
            assert len(r.graph.nodes) == 2 and r.structure in ("chain", "dag")
    again, _ = compose_records(records, Compose(seed=0))
    assert [r.to_dict() for r in again] == [r.to_dict() for r in out]  # deterministic
    other, _ = compose_records(records, Compose(seed=1))
    assert [r.request for r in other] != [r.request for r in out]
    capped, small = compose_records(records, Compose(max_new=8))
    assert len(capped) <= len(records) + 8 and small.made["resampled"] == 4
    assert any("(cap 8, the kinds in the proportions" in n for n in small.notes)


def test_a_join_uses_only_the_links_the_multi_step_records_show():
    records = [
        rec("1", "get tomorrow's prices", ("prices", [("day", "tomorrow")])),
        rec("2", "prices for Sunday", ("prices", [("day", "Sunday")])),
        rec("3", "run the dishwasher", ("run", [("appliance", "dishwasher")])),
        rec("4", "run the dryer at 3am", ("run", [("appliance", "dryer"), ("start", "3am")])),
        rec("5", "get today's prices, then run the oven at the cheapest hour",
            ("prices", [("day", "today")]), ("run", [("appliance", "oven"), ("start", "<node-0>")])),
    ]
    out, report = compose_records(records, Compose(resample=False, max_new=50))
    assert report.links == [("prices", "run", "start")] and report.connectors == [", then "]
    joined = out[len(records):]
    assert joined and all(j.graph.nodes[1].task == "run" for j in joined)
    for j in joined:
        start = [a.value for a in j.graph.nodes[1].arguments if a.name == "start"]
        assert start == ["<node-0>"] and ", then " in j.request
        assert "3am" not in j.request  # a consumer that states its linked argument itself is never joined
    # multi-step records that disagree about which argument takes the output: that link steps aside, said
    disagree = records + [rec("6", "prices for Monday, then run the washer when they are lowest",
                              ("prices", [("day", "Monday")]), ("run", [("appliance", "washer"), ("note", "<node-0>")]))]
    out, report = compose_records(disagree, Compose(resample=False))
    assert report.links == [] and any("disagree" in n for n in report.notes) and len(out) == len(disagree)


def test_composition_steps_aside_where_the_records_cannot_support_it():
    one = [rec("1", "what's the weather in Lyon", ("weather", [("city", "Lyon")]))]
    out, report = compose_records(one)
    assert out == one and sum(report.made.values()) == 0
    assert any("one skill only" in n for n in report.notes) and any("resampled" in n for n in report.notes)
    singles = [rec("1", "weather in Lyon", ("weather", [("city", "Lyon")])),
               rec("2", "forecast for Oslo please", ("weather", [("city", "Oslo")])),
               rec("3", "alarm at 7am", ("alarm", [("time", "7am")]))]
    out, report = compose_records(singles)
    assert report.made == {"resampled": 2} and any("no multi-step record" in n for n in report.notes)
    assert sorted(r.request for r in out[3:]) == ["forecast for Lyon please", "weather in Oslo"]
    with pytest.raises(ComposeError, match="max_new"):
        Compose(max_new=-1)
    with pytest.raises(ComposeError, match="compose nothing"):
        Compose(resample=False, join=False)


def test_learn_trains_the_executor_on_composed_records_and_records_what_it_made(tmp_path, tiny_model_dir):
    """`learn(compose=...)`: the executor's examples are the records plus the composed ones, the training summary
    says what was composed, and the router and the scope gate read the given records only."""
    from skillbank.memory.bank import SkillBank
    from skillbank.model.base import BaseModelConfig, load_base
    from skillbank.train.executor import TrainConfig

    records = read_records(HOME).records[:40]
    cfg = TrainConfig(epochs=1, batch_size=8, rank=2, target_format="compact", seed=0)
    base = load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False)
    bank = SkillBank.create(tmp_path / "bank", base=base, scope_params={"encoder": None, "outliers": None})
    entry = bank.learn("home_energy", records, cfg, progress=False, init="fresh", compose=Compose(max_new=20))
    made = entry.training["augmentation"]
    assert made["compose"] == {"max_new": 20, "resample": True, "join": True, "seed": 0}
    assert entry.training["examples"] == len(records) + sum(made["made"].values()) > len(records)
    plain = SkillBank.create(tmp_path / "plain", base=load_base(BaseModelConfig(name=str(tiny_model_dir)),
                                                                progress=False),
                             scope_params={"encoder": None, "outliers": None})
    plain.learn("home_energy", records, cfg, progress=False, init="fresh")
    probe = ["read the gas meter", "set the battery to backup mode"]
    assert (bank.address.predict_proba(probe) == plain.address.predict_proba(probe)).all()
    assert "augmentation" not in plain.manifest.shards[0].training


def test_augment_compose_writes_the_records_and_what_it_composed(tmp_path):
    from typer.testing import CliRunner

    from skillbank.cli import app

    out = tmp_path / "composed.jsonl"
    r = CliRunner().invoke(app, ["augment", str(HOME), "--out", str(out), "--compose", "--compose-max", "10"])
    assert r.exit_code == 0, r.output
    written = read_records(out).records
    assert 85 < len(written) <= 95 and written[:85] == read_records(HOME).records
    assert "composed" in r.output and "resampled" in r.output
    bad = CliRunner().invoke(app, ["augment", str(HOME), "--out", str(out), "--compose", "--compose-max", "-1"])
    assert bad.exit_code == 2
