"""Negatives: requests a family must refuse. Their record form and its checks, their synthesis from a catalog,
the scope gate's statistics of them (refusal, exact forget, save/load, export/import), and a bank learning a
family with them (learn, `scope negatives`, banks without them)."""
import json
from pathlib import Path

import numpy as np
import pytest

from skillbank.data.negatives import Negative, read_negatives, synthesize_negatives
from skillbank.data.records import read_records, validate_records
from skillbank.errors import RecordError
from skillbank.memory.scope import ScopeDetector

ROOT = Path(__file__).resolve().parents[1]
HOME = ROOT / "examples" / "home_energy"


def write(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def positive(rid, request):
    return {"id": rid, "family": "home", "request": request,
            "graph": {"task_nodes": [{"task": "set_thermostat", "arguments": [{"name": "target", "value": "20"}]}],
                      "task_links": []}}


def negative(rid, request, kind="near_miss_action", **extra):
    return {"id": rid, "family": "home", "request": request, "graph": None, "kind": kind, **extra}


def test_negatives_sit_beside_records_and_are_checked_line_by_line(tmp_path):
    path = write(tmp_path / "r.jsonl", [positive("p1", "set the heating to 20"), negative("n1", "pay my gas bill"),
                                        negative("n2", "Set the heating to 20."),  # the request of line 1
                                        negative("n3", "what is a heat pump?", kind="trivia"),
                                        {**positive("p2", "warm the house to 20"), "kind": "near_miss_action"}])
    v = validate_records(path)
    assert [r.id for r in v.records] == ["p1"] and [n.id for n in v.negatives] == ["n1"]
    reasons = {e.line: e.reason for e in v.errors}
    assert "record on line 1" in reasons[3] and "both served and refused" in reasons[3]
    assert "unknown kind 'trivia'" in reasons[4]
    assert '"graph": null' in reasons[5]
    rs = read_records(write(tmp_path / "ok.jsonl", [positive("p1", "set the heating to 20"),
                                                    negative("n1", "pay my gas bill")]))
    assert len(rs.records) == 1 and rs.negatives[0].kind == "near_miss_action"


def test_a_file_of_negatives_only_is_no_records_file(tmp_path):
    v = validate_records(write(tmp_path / "n.jsonl", [negative("n1", "pay my gas bill")]))
    assert not v.ok and v.errors[0].line == 1 and "only negatives" in v.errors[0].reason
    assert "--negatives" in v.errors[0].reason


def test_a_negatives_file_names_each_bad_line(tmp_path):
    path = write(tmp_path / "n.jsonl", [negative("n1", "pay my gas bill"), positive("p1", "set the heating to 20"),
                                        {**negative("n3", "x"), "family": "other"}])
    with pytest.raises(RecordError) as exc:
        read_negatives(path, family="home")
    text = str(exc.value)
    assert f"{path}:2:" in text and "has a graph" in text and f"{path}:3:" in text and "'other'" in text
    assert [n.id for n in read_negatives(write(tmp_path / "ok.jsonl", [negative("n1", "pay my gas bill")]))] == ["n1"]


SPECS = [{"name": "set_thermostat", "description": "Set the thermostat's target temperature.",
          "arguments": [{"name": "target", "description": "degrees"}]},
         {"name": "cancel_schedule", "description": "Cancel an appliance run scheduled before.",
          "arguments": [{"name": "appliance", "description": "dishwasher, washer or dryer"}]},
         {"name": "get_meter_reading", "description": "Read the electricity meter."}]
REQUESTS = ["set the thermostat to 20", "cancel the dishwasher run", "cancel the washer", "read the meter now",
            "what does the meter say", "thermostat to 18 please"]


def test_synthesis_is_deterministic_and_never_refuses_what_a_skill_does():
    made = synthesize_negatives("home", SPECS, REQUESTS, [["20"], ["dishwasher"], ["washer"], [], [], ["18"]],
                                other_domain=["book a table for two at 8", "play some jazz on the meter"])
    again = synthesize_negatives("home", SPECS, REQUESTS, [["20"], ["dishwasher"], ["washer"], [], [], ["18"]],
                                 other_domain=["book a table for two at 8", "play some jazz on the meter"])
    assert made == again and {n.source for n in made} == {"synthesized"}
    kinds = {n.kind for n in made}
    assert kinds == {"near_miss_action", "near_miss_object", "domain_question", "other_domain"}
    actions = [n.request.lower() for n in made if n.kind == "near_miss_action"]
    # the catalog cancels and reads: neither is ever an action the family lacks
    assert actions and not any("cancel" in a or a.startswith("read") for a in actions)
    assert any("thermostat" in a or "meter" in a for a in actions)  # on the family's own objects
    others = [n.request for n in made if n.kind == "other_domain"]
    assert others == ["book a table for two at 8"]  # the one naming the family's meter is left out
    assert not {n.request for n in made} & set(REQUESTS)


MUSIC = ["play some jazz on the kitchen speaker", "play the next album by Miles Davis", "play my running playlist",
         "queue three songs by Nina Simone", "play lofi beats in the bedroom", "put on the new Adele album",
         "play something relaxing", "shuffle my liked songs"]
MUSIC_NEGATIVES = ["delete my running playlist", "delete the album I downloaded yesterday",
                   "delete all my liked songs", "remove this playlist from my library for good"]


def gate_with_negatives():
    det = ScopeDetector(encoder="minilm", reader="values", outliers=None, quantile=0.0)
    det.partial_fit(MUSIC, "music")
    det.fit_negatives("music", [Negative(f"n{i}", "music", r) for i, r in enumerate(MUSIC_NEGATIVES)])
    return det


def test_the_gate_refuses_what_looks_like_a_familys_negatives_and_keeps_its_requests():
    det = ScopeDetector(encoder="minilm", reader="values", outliers=None, quantile=0.0)
    det.partial_fit(MUSIC, "music")
    plain = det.decision_function(["delete the playlist I made yesterday", "play the album by Miles Davis"])
    assert (plain >= 0).all()  # without negatives both pass: the words and the sentence are the family's
    det = gate_with_negatives()
    decision, _, refused_by = det.verdicts(["delete the playlist I made yesterday", "play the album by Miles Davis"])
    assert decision[0] < 0 <= decision[1]
    assert refused_by[0].request in MUSIC_NEGATIVES and refused_by[1] is None


def test_negatives_are_forgotten_saved_and_exported_with_their_family(tmp_path):
    det = gate_with_negatives()
    det.partial_fit(["route me home", "how long is the drive to Bern", "avoid tolls to Lyon"], "maps")
    probe = ["delete the playlist I made yesterday", "play the album by Miles Davis", "route me to Bern"]
    det.save(tmp_path / "s")
    back = ScopeDetector.load(tmp_path / "s")
    np.testing.assert_allclose(back.decision_function(probe), det.decision_function(probe))
    assert [n.request for n in back.negatives_["music"]] == MUSIC_NEGATIVES
    other = ScopeDetector(**det.get_params())
    other.partial_fit(["route me home", "how long is the drive to Bern", "avoid tolls to Lyon"], "maps")
    other.add_family(det.family_detector("music"), "music", "tunes")
    assert [n.family for n in other.negatives_["tunes"]] == ["tunes"] * 4
    assert other.verdicts(probe[:1])[2][0] is not None
    det.forget("music")
    assert not det.negatives_ and not det.negative_counts_ and not det.negative_embeddings_
    det.save(tmp_path / "s")
    assert not (tmp_path / "s" / "scope-negatives.json").exists()


def test_a_bank_learns_a_family_with_its_negatives_and_lists_them(tmp_path, tiny_model_dir):
    from typer.testing import CliRunner

    from skillbank.cli import app
    from skillbank.data.tool_formats import load_catalog
    from skillbank.memory.bank import SkillBank
    from skillbank.model.base import BaseModelConfig, load_base
    from skillbank.train.executor import TrainConfig
    records = read_records(HOME / "records.jsonl").records[:24]
    given = read_negatives(HOME / "negatives.jsonl")
    cfg = TrainConfig(epochs=1, batch_size=8, rank=2, target_format="compact", seed=0)
    base = load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False)
    bank = SkillBank.create(tmp_path / "bank", base=base, scope_params={"outliers": None})
    with pytest.raises(RecordError, match="family 'home_energy', expected 'other'"):
        bank.learn("other", records, cfg, progress=False, negatives=given)  # checked before any training
    repeat = {**negative("n-dup", records[3].request.upper() + " "), "family": "home_energy"}
    with pytest.raises(RecordError, match=f"negative n-dup is the request of record {records[3].id} .*both served"):
        bank.learn("home_energy", records, cfg, progress=False, negatives=given + [repeat])  # the API checks it too
    assert not bank.shard_names
    bank.learn("home_energy", records, cfg, progress=False, init="fresh",
               catalog=load_catalog(HOME / "tools.json", "home_energy"), negatives=given)
    held = bank.scope.negatives_["home_energy"]
    assert sum(n.source == "given" for n in held) == len(given) >= 30  # enough given: nothing synthesized
    assert len(held) == len(given)
    [verdict] = bank.check_scope([given[0].request])
    assert verdict.in_scope is False and "has no skill for this" in verdict.reason
    [plan] = bank.plan([given[0].request], explain=True, max_new_tokens=4)
    assert plan.out_of_scope and plan.shard is None and "has no skill for this" in plan.reason
    closest = plan.explain["closest_negative"]
    assert closest["request"] == given[0].request and closest["kind"] == given[0].kind
    assert closest["own_minus_negatives"] < -0.25
    reopened = SkillBank.open_offline(tmp_path / "bank")
    assert [n.id for n in reopened.scope.negatives_["home_energy"]] == [n.id for n in held]

    runner = CliRunner()
    res = runner.invoke(app, ["scope", "negatives", str(tmp_path / "bank"), "home_energy", "--json"])
    assert res.exit_code == 0, res.output
    assert [json.loads(line)["id"] for line in res.stdout.splitlines()] == [n.id for n in held]
    extra = write(tmp_path / "more.jsonl", [{"id": "x1", "family": "home_energy", "request": "sell my solar panels",
                                             "kind": "near_miss_action"}])
    res = runner.invoke(app, ["scope", "negatives", str(tmp_path / "bank"), "home_energy", "--add", str(extra),
                              "--no-synthesize"])
    assert res.exit_code == 0, res.output
    assert "sell my solar panels" in res.stdout
    assert len(SkillBank.open_offline(tmp_path / "bank").scope.negatives_["home_energy"]) == len(given) + 1
    # correcting them: print, edit, hand back in place of what it held (what was handed back is the user's now)
    listed = runner.invoke(app, ["scope", "negatives", str(tmp_path / "bank"), "home_energy", "--json"]).stdout
    edited = tmp_path / "edited.jsonl"
    edited.write_text("".join(line + "\n" for line in listed.splitlines() if "sell my solar" not in line))
    res = runner.invoke(app, ["scope", "negatives", str(tmp_path / "bank"), "home_energy", "--add", str(edited),
                              "--replace", "--no-synthesize"])
    assert res.exit_code == 0, res.output
    held = SkillBank.open_offline(tmp_path / "bank").scope.negatives_["home_energy"]
    assert [n.id for n in held] == [n.id for n in given] and {n.source for n in held} == {"given"}


def test_a_bank_without_negatives_says_how_to_add_them(tmp_path, tiny_model_dir):
    from typer.testing import CliRunner

    from skillbank.cli import app
    from skillbank.memory.bank import SkillBank
    from skillbank.model.base import BaseModelConfig, load_base
    from skillbank.train.executor import TrainConfig
    records = read_records(HOME / "records.jsonl").records[:16]
    base = load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False)
    bank = SkillBank.create(tmp_path / "bank", base=base, scope_params={"outliers": None})
    bank.learn("home_energy", records, TrainConfig(epochs=1, batch_size=8, rank=2, target_format="compact"),
               progress=False, init="fresh", synthesize=False)
    assert "home_energy" not in bank.scope.negatives_
    res = CliRunner().invoke(app, ["scope", "negatives", str(tmp_path / "bank"), "home_energy"])
    assert res.exit_code == 0 and "has no negatives" in res.output and "--add" in res.output
    res = CliRunner().invoke(app, ["info", str(tmp_path / "bank")])
    assert res.exit_code == 0 and "none for home_energy" in res.output and "--add" in res.output


def test_a_request_of_the_familys_objects_alone_is_read_not_refused_for_lack_of_words():
    from skillbank.memory.bank import default_scope_params
    from skillbank.memory.scope import fit_inputs
    records = read_records(HOME / "records.jsonl").records
    gates = {}
    for objects in (False, True):
        det = ScopeDetector(**{**default_scope_params({"outliers": None}), "objects": objects})
        det.partial_fit([r.request for r in records], "home_energy", **fit_inputs(records, "home_energy"))
        gates[objects] = det
    terse = "dishwasher @ 3am"
    # read as values only ("dishwasher" is one of the family's values, "3am" a time): no words without objects
    assert gates[False].score([terse])[0, 0] == -np.inf
    assert np.isfinite(gates[True].score([terse])[0, 0]) and gates[True].predict([terse])[0]
    assert gates[True].get_params()["objects"] is True and "objects" not in gates[False].get_params()


def test_family_scales_put_each_family_on_its_own_training_scale():
    from skillbank.memory.scope import MIN_FAMILY_SCORES
    music = [f"play {w} on the kitchen speaker please" for w in ("jazz", "soul", "blues", "funk", "rock", "folk",
                                                                  "pop", "disco", "reggae", "metal", "punk",
                                                                  "house", "techno", "opera", "gospel", "salsa",
                                                                  "tango", "swing", "grunge", "ska", "trance",
                                                                  "dub")]
    maps = ["route me home", "how long is the drive to Bern", "avoid tolls to Lyon"]
    det = ScopeDetector(encoder=None, reader="values", family_scales=True)
    det.partial_fit(music, "music")
    det.partial_fit(maps, "maps")
    mw, sw, _, _ = det._training_scales()
    assert len(music) >= MIN_FAMILY_SCORES > len(maps)
    own = det.train_scores_["music"]
    assert mw[0] == pytest.approx(np.median(own))  # its own median
    pooled = np.concatenate([det.train_scores_["music"], det.train_scores_["maps"]])
    assert mw[1] == pytest.approx(np.median(pooled[np.isfinite(pooled)]))  # too few of its own: pooled


def test_an_executor_trained_to_refuse_has_the_refusal_in_its_grammar_and_the_planner_answers_out_of_scope(
        tmp_path, tiny_model_dir):
    from types import SimpleNamespace

    from skillbank.data.tool_formats import load_catalog
    from skillbank.memory.bank import SkillBank
    from skillbank.memory.refusal import MAX_SHARE, is_refusal
    from skillbank.model.base import BaseModelConfig, load_base
    from skillbank.model.serialization import decode
    from skillbank.planner import Planner
    from skillbank.train.executor import TrainConfig
    records = read_records(HOME / "records.jsonl").records[:20]
    cfg = TrainConfig(epochs=1, batch_size=8, rank=2, target_format="compact", seed=0)
    base = load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False)
    bank = SkillBank.create(tmp_path / "bank", base=base, scope_params={"outliers": None})
    entry = bank.learn("home_energy", records, cfg, progress=False, init="fresh",
                       catalog=load_catalog(HOME / "tools.json", "home_energy"),
                       negatives=read_negatives(HOME / "negatives.jsonl"), executor_refuses=True)
    refusal = entry.training["refusal"]
    assert refusal == {"skill": entry.family_prefix + "no_skill", "records": int(MAX_SHARE * len(records))}
    assert entry.training["examples"] == len(records) + refusal["records"]
    assert refusal["skill"] not in entry.skills and bank.refusal_of("home_energy") == refusal["skill"]
    from skillbank.memory.execution import read_skills_json, shard_grammar
    g = shard_grammar(entry, read_skills_json(tmp_path / "bank" / entry.dir / "skills.json"), "skills.json")
    assert '"no_skill"' in g.lark()
    # the planner turns a plan that uses the refusal into out_of_scope, naming the family
    parsed = decode("no_skill{}", "compact", entry.family_prefix)
    assert is_refusal(parsed.graph, refusal["skill"])
    planner = Planner(bank)
    [decision] = planner.decide(["cancel the dishwasher run"], scope=False)
    out = SimpleNamespace(parsed=parsed, text="no_skill{}", n_tokens=3, stopped=True, mean_logprob=-0.1)
    plan = planner.settle(decision, out)
    assert plan.out_of_scope and plan.graph is None and "home_energy executor has no skill" in plan.reason
    # and a real generation under the shard's grammar goes through the same path (whatever the tiny model writes)
    [real] = bank.plan(["cancel the dishwasher run"], scope=False, max_new_tokens=8)
    wrote_refusal = real.raw.startswith("no_skill")
    said_no = real.out_of_scope and real.graph is None and "executor has no skill" in (real.reason or "")
    assert said_no == wrote_refusal
