"""The continual runner on a tiny random model: every method through one loop, resume after a kill, the
report, config errors."""
import json

import pytest

from skillbank.config import ConfigError, RunConfig
from skillbank.continual import runner as runner_mod
from skillbank.continual.methods import METHODS
from skillbank.run_dir import build_run_stream, load_run
from skillbank.continual.runner import run
from skillbank.metrics import AccuracyMatrix
from skillbank.report.run_report import busy_seconds

from conftest import killed_after_checkpoint

ORDER = "T1,T2,T3"  # three stages keep the tests quick


def tiny_config(model_dir, methods, **extra):
    raw = {
        "name": "tiny", "methods": methods,
        "stream": {"source": "builtin", "train_per_family": 4, "test_per_family": 2},
        "base": {"name": str(model_dir)},
        "train": {"epochs": 1, "batch_size": 4, "rank": 4, "alpha": 8, "target_format": "compact"},
        "eval": {"orders": [ORDER], "max_new_tokens": 6, "batch_size": 4},
    }
    raw.update(extra)
    return RunConfig.from_dict(raw)


def _results_without_timing(record):
    out = {}
    for m, orders in record["methods"].items():
        for o, r in orders.items():
            out[(m, o)] = {"variants": r["variants"],
                           "steps": {k: s.get("steps") for k, s in r["training"].items()},
                           "loss": {k: s.get("final_loss") for k, s in r["training"].items()}}
    return out


def test_every_method_runs_and_fills_the_lower_triangle(tmp_path, tiny_model_dir):
    cfg = tiny_config(tiny_model_dir, list(METHODS), method_params={"replay": {"per_stage": 2}})
    messages = []
    record = run(cfg, tmp_path / "run", say=messages.append, progress=False)
    out = tmp_path / "run"
    for name in ("results.json", "config.json", "report.md", "report.html"):
        assert (out / name).is_file(), name
    variants = {v for m in record["methods"].values() for r in m.values() for v in r["variants"]}
    assert variants == set(METHODS) | {"oracle", "sft+address", "progressive-oracle"}
    for m, orders in record["methods"].items():
        r = orders[ORDER]
        for v, vr in r["variants"].items():
            em = AccuracyMatrix.from_dict(vr["em"])
            assert em.stages_done == 3
            assert all(em.cells[t][k] is None for t in range(3) for k in range(t + 1, 3))
            assert all(em.cells[t][k] is not None for t in range(3) for k in range(t + 1))
        assert (out / "methods" / m / ORDER / "predictions.jsonl").is_file()
    fsm = record["methods"]["fsm"][ORDER]["variants"]["fsm"]["summary"]
    assert fsm["route_per_stage"][0] == 1.0  # one shard: routing cannot fail
    saved = json.loads((out / "config.json").read_text())
    assert saved["method_params"]["lwf"] == {"temperature": 2.0, "weight": 1.0, "t_squared": False}
    assert saved["method_params"]["replay"] == {"per_stage": 2}
    routed = record["methods"]["progressive-routed"][ORDER]["variants"]["progressive-oracle"]["summary"]
    assert routed["route_per_stage"] == [1.0, 1.0, 1.0]  # the Oracle picks the gold family's column
    # progressive-routed trains exactly as stacked: its summed, unrouted variant is the stacked method's answer
    assert (record["methods"]["progressive-routed"][ORDER]["variants"]["stacked"]["em"]
            == record["methods"]["stacked"][ORDER]["variants"]["stacked"]["em"])
    # only the last stage keeps its state; frozen-base references train nothing
    assert not (out / "methods" / "sft" / ORDER / "stage-01" / "state").exists()
    assert (out / "methods" / "sft" / ORDER / "stage-03" / "state" / "seq" / "adapter_model.safetensors").is_file()
    assert record["methods"]["base-skill"][ORDER]["timing"]["train_seconds"] == 0
    html = (out / "report.html").read_text()
    assert "data:image/png;base64," in html and "<table>" in html
    for title in ("Stacked-LoRA (summed, unrouted)", "Progressive-LoRA (routed: Address Memory)",
                  "Progressive-LoRA (routed: Oracle)"):
        assert title in html
    md = (out / "report.md").read_text()
    assert "| Sequential SFT |" in md
    # every method's final predictions were re-read and classified (rows now carry the parsed graph)
    assert "## Why requests fail" in md and "Not analysed" not in md
    row = json.loads((out / "methods" / "sft" / ORDER / "predictions.jsonl").read_text().splitlines()[0])
    assert "graph" in row
    # the FSM bank is a real bank
    from skillbank.memory.bank import bank_info
    assert len(bank_info(out / "methods" / "fsm" / "bank")["shards"]) == 3


@pytest.mark.parametrize("method", ["sft", "fsm", "ewc"])
def test_resume_after_a_kill_ends_with_identical_results(tmp_path, tiny_model_dir, monkeypatch, method):
    cfg = tiny_config(tiny_model_dir, [method])
    clean = run(cfg, tmp_path / "clean", progress=False)

    cls = METHODS[method]
    real_learn = cls.learn

    def dying_learn(self, t, family, records):
        if t == 3:
            raise KeyboardInterrupt("killed during stage 3")
        return real_learn(self, t, family, records)

    monkeypatch.setattr(cls, "learn", dying_learn)
    with pytest.raises(KeyboardInterrupt):
        run(cfg, tmp_path / "resumed", progress=False)
    odir = tmp_path / "resumed" / "methods" / method / ORDER
    assert (odir / "stage-02" / "eval.json").is_file() and not (odir / "stage-03" / "eval.json").exists()
    monkeypatch.setattr(cls, "learn", real_learn)
    messages = []
    resumed = run(cfg, tmp_path / "resumed", say=messages.append, progress=False)
    assert any("resuming after stage 2" in m for m in messages)
    assert _results_without_timing(resumed) == _results_without_timing(clean)
    # the wall time counts both sittings' stages, not only the process that finished the run
    spans = resumed["methods"][method][ORDER]["timing"]["stage_spans"]
    assert len(spans) == 3 and all(s["source"] == "recorded" and s["start"] <= s["end"] for s in spans)
    assert spans[0]["end"] <= spans[1]["end"] <= spans[2]["end"]
    assert "Wall time tiny: " in (tmp_path / "resumed" / "report.md").read_text()


def test_busy_seconds_is_the_union_of_stage_spans():
    assert busy_seconds([]) == 0
    assert busy_seconds([(0, 10), (5, 15), (20, 30)]) == 25  # overlap counted once, the gap not at all
    assert busy_seconds([(0, 100), (10, 20), (30, 40)]) == 100  # nested spans add nothing


def test_a_kill_during_evaluation_reuses_the_saved_state(tmp_path, tiny_model_dir, monkeypatch):
    cfg = tiny_config(tiny_model_dir, ["sft"])
    real = runner_mod.evaluate_stage
    calls = {"n": 0}

    def dying_eval(method, t, *a, **k):
        if t == 2:
            raise KeyboardInterrupt("killed during evaluation")
        return real(method, t, *a, **k)

    monkeypatch.setattr(runner_mod, "evaluate_stage", dying_eval)
    with pytest.raises(KeyboardInterrupt):
        run(cfg, tmp_path / "r", progress=False)
    monkeypatch.setattr(runner_mod, "evaluate_stage", real)
    learned = []
    real_learn = METHODS["sft"].learn
    monkeypatch.setattr(METHODS["sft"], "learn", lambda self, t, f, r: learned.append(t) or real_learn(self, t, f, r))
    run(cfg, tmp_path / "r", progress=False)
    assert learned == [3]  # stage 2 was trained before the kill: its saved state is loaded, not retrained
    # each stage records the dtype its base was loaded in ([base] dtype = "auto" resolves per machine)
    fits = sorted((tmp_path / "r" / "methods" / "sft").glob("*/stage-*/train.json"))
    assert fits and all(json.loads(f.read_text())["base_dtype"] == "float32" for f in fits)
    # and the machine it ran on, from which `skillbank progress` estimates a run continued elsewhere
    from skillbank.continual.progress import machine_label
    evals = sorted((tmp_path / "r" / "methods" / "sft").glob("*/stage-*/eval.json"))
    assert {json.loads(f.read_text())["machine"] for f in fits + evals} == {machine_label()}


def test_a_run_directory_refuses_another_configuration(tmp_path, tiny_model_dir):
    cfg = tiny_config(tiny_model_dir, ["base-oracle-fields"])
    run(cfg, tmp_path / "r", progress=False)
    other = tiny_config(tiny_model_dir, ["base-oracle-fields"], train={"epochs": 2, "batch_size": 4})
    with pytest.raises(ConfigError, match="another configuration.*train"):
        run(other, tmp_path / "r", progress=False)
    run(other, tmp_path / "r", progress=False, restart=True)  # --restart discards it
    faster = other.model_copy(update={"base": other.base.model_copy(update={"threads": 2})})
    run(faster, tmp_path / "r", progress=False)  # the thread count is not part of what a run learns
    wider = faster.model_copy(update={"eval": faster.eval.model_copy(update={"batch_size": 16})})
    run(wider, tmp_path / "r", progress=False)  # nor the evaluation's batch size (same greedy outputs)
    longer = faster.model_copy(update={"eval": faster.eval.model_copy(update={"max_new_tokens": 12})})
    with pytest.raises(ConfigError, match="another configuration.*eval"):
        run(longer, tmp_path / "r", progress=False)  # the output cap is: it changes what is scored
    # a method's own [train] overrides are part of what it learns; a saved run without them had none
    tuned = other.model_copy(update={"method_train": {"base-oracle-fields": {"lr": 1e-3}}})
    with pytest.raises(ConfigError, match="another configuration.*method_train.base-oracle-fields"):
        run(tuned, tmp_path / "r", progress=False)
    saved = json.loads((tmp_path / "r" / "config.json").read_text())
    del saved["method_train"]
    (tmp_path / "r" / "config.json").write_text(json.dumps(saved))
    run(other, tmp_path / "r", progress=False)


def test_a_run_saved_before_fsm_had_init_still_resumes(tmp_path, tiny_model_dir):
    """FSM's ``init`` was added later: a saved configuration without it means fresh (what every run saved
    before it did; the default is a merge since) and resumes; one that asks for the neutral start is another
    configuration."""
    from skillbank.continual.runner import check_same_config
    assert tiny_config(tiny_model_dir, ["fsm"]).resolved()["method_params"]["fsm"]["init"] == "merge"
    new = tiny_config(tiny_model_dir, ["fsm"], method_params={"fsm": {"init": "fresh"}}).resolved()
    saved = json.loads(json.dumps(new))
    del saved["method_params"]["fsm"]["init"]
    check_same_config(tmp_path, saved, new)
    neutral = tiny_config(tiny_model_dir, ["fsm"], method_params={"fsm": {"init": "neutral"}}).resolved()
    with pytest.raises(ConfigError, match="method_params.fsm"):
        check_same_config(tmp_path, saved, neutral)
    with pytest.raises(ConfigError, match="init"):
        tiny_config(tiny_model_dir, ["fsm"], method_params={"fsm": {"init": "shard:T1"}})


def test_fsm_starting_from_earlier_shards_grows_a_bank_per_order(tmp_path, tiny_model_dir):
    """init = previous/nearest/merge reads the shards learned before, so each order trains its own executors
    into its own bank (with the lineage skillbank learn records) instead of reusing the first order's."""
    from skillbank.continual.progress import run_progress
    from skillbank.memory.bank import SkillBank
    orders = [ORDER, "T3,T2,T1"]
    cfg = tiny_config(tiny_model_dir, ["fsm"], method_params={"fsm": {"init": "merge"}},
                      eval={"orders": orders, "max_new_tokens": 6, "batch_size": 4})
    record = run(cfg, tmp_path / "run", progress=False)
    mdir = tmp_path / "run" / "methods" / "fsm"
    # the stream's own order (here its first three families) keeps methods/fsm/bank; another order bank-<order>
    banks = {ORDER: mdir / "bank", "T3,T2,T1": mdir / "bank-T3,T2,T1"}
    assert not (mdir / f"bank-{ORDER}").exists()
    for order in orders:
        bank = SkillBank.open(banks[order])
        families = [e.name for e in bank.manifest.shards]
        assert families == [{"T1": "t1_daily_life", "T2": "t2_language_speech",
                             "T3": "t3_retrieval_understanding"}[t] for t in order.split(",")]
        lineage = [e.lineage for e in bank.manifest.shards]
        assert lineage[0]["init"] == "fresh"
        # one shard to merge: a start from it
        assert (lineage[1]["init"], lineage[1]["from"], lineage[1]["by"]) == ("shard", families[0], "merge")
        assert lineage[2]["init"] == "merge" and set(lineage[2]["from"]) == set(families[:2])
        training = record["methods"]["fsm"][order]["training"]
        assert not any(s["reused_from_earlier_order"] for s in training.values())
        assert all(s["wall_seconds"] > 0 for s in training.values())
    # the last family of the first order starts from a merge of the other two in the second order's bank,
    # so its executor differs; outputs are keyed by each bank's own adapter digests
    first = SkillBank.open(banks[ORDER]).manifest.shards[-1]
    second = next(e for e in SkillBank.open(mdir / "bank-T3,T2,T1").manifest.shards if e.name == first.name)
    assert first.lineage != second.lineage
    rows = run_progress(tmp_path / "run")
    assert {r.order for r in rows} == set(orders) and all(r.evaluated == 3 for r in rows)
    with pytest.raises(ConfigError, match="parallel_stages"):
        tiny_config(tiny_model_dir, ["fsm"], method_params={"fsm": {"init": "nearest"}},
                    runner={"parallel_stages": 2})


def test_method_config_errors():
    with pytest.raises(ConfigError, match="unknown method 'sgd'"):
        RunConfig.from_dict({"methods": ["sgd"]})
    with pytest.raises(ConfigError, match=r"method_params.lwf.*temperature"):
        RunConfig.from_dict({"methods": ["lwf"], "method_params": {"lwf": {"temperature": -1}}})
    with pytest.raises(ConfigError, match=r"method_params.ewc.*Extra inputs"):
        RunConfig.from_dict({"methods": ["ewc"], "method_params": {"ewc": {"lambda": 3}}})
    with pytest.raises(ConfigError, match="not in methods"):
        RunConfig.from_dict({"methods": ["sft"], "method_params": {"lwf": {"weight": 2}}})


def test_report_command_over_two_runs(tmp_path, tiny_model_dir):
    from typer.testing import CliRunner
    from skillbank.cli import app
    run(tiny_config(tiny_model_dir, ["sft"], name="first"), tmp_path / "a", progress=False)
    # the deprecated name still runs (and a run saved under it reports) as what it always ran
    run(tiny_config(tiny_model_dir, ["progressive"], name="second"), tmp_path / "b", progress=False)
    assert (tmp_path / "b" / "methods" / "progressive" / ORDER / "stage-03" / "eval.json").is_file()
    res = CliRunner().invoke(app, ["exp", "report", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "rep")])
    assert res.exit_code == 0, res.output
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "Sequential SFT [first]" in md and "Stacked-LoRA (summed, unrouted; run as 'progressive') [second]" in md
    bad = CliRunner().invoke(app, ["exp", "report", str(tmp_path)])
    assert bad.exit_code == 2 and "no run.json" in bad.output


def test_report_of_a_stopped_run_marks_unfinished_methods(tmp_path, tiny_model_dir, monkeypatch):
    from skillbank.report.run_report import write_report
    cfg = tiny_config(tiny_model_dir, ["stacked"])
    real_learn = METHODS["stacked"].learn

    def dying_learn(self, t, family, records):
        if t == 3:
            raise KeyboardInterrupt
        return real_learn(self, t, family, records)

    monkeypatch.setattr(METHODS["stacked"], "learn", dying_learn)
    with pytest.raises(KeyboardInterrupt):
        run(cfg, tmp_path / "r", progress=False)
    md = write_report([tmp_path / "r"]).read_text()
    assert "Stacked-LoRA (summed, unrouted) (stopped after stage 2)" in md


def test_diagnostics_trajectory_and_reactivation_controls(tmp_path, tiny_model_dir):
    from skillbank.continual.diagnostics import control_texts, run_diagnostics
    cfg = tiny_config(tiny_model_dir, ["sft"])
    record = run_diagnostics(cfg, tmp_path / "d", eval_requests=2, schedule=(0, 1), progress=False)
    assert [p["step"] for p in record["trajectory"]] == [0, 1]
    assert set(record["reactivation_after_second"]) == {
        "closed_book", "correct_address", "wrong_address_same_family", "unrelated_valid_address",
        "token_matched_random", "generic_instruction", "frozen_base_correct_address"}
    for name in ("diagnostics.json", "diagnostics.md", "forgetting_trajectory.png"):
        assert (tmp_path / "d" / name).is_file()
    ex = record["examples"][0]
    assert ex["correct_address"].startswith("Skill address: ")
    assert ex["wrong_address_same_family"] != ex["correct_address"]


def test_control_texts_match_the_address_length(small_stream):
    import random
    from transformers import AutoTokenizer
    from skillbank.continual.diagnostics import control_texts
    from skillbank.model.base import embedded_tokenizer_dir
    tok = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    fam_a, fam_b = small_stream.family_keys[:2]
    rec = small_stream.test[fam_a][0]
    texts = control_texts(rec, small_stream.catalog.family(fam_a).skills, small_stream.catalog.family(fam_b).skills,
                          tok, random.Random(0))
    n = len(tok(texts["correct_address"], add_special_tokens=False)["input_ids"])
    m = len(tok(texts["token_matched_random"], add_special_tokens=False)["input_ids"])
    assert n <= m <= n + 3
    assert all(s in small_stream.catalog.family(fam_b).skills
               for s in texts["unrelated_valid_address"].removeprefix("Skill address: ").split(", "))


def test_two_processes_train_like_one_with_gradient_accumulation(tmp_path, tiny_model_dir):
    """The scale-out path: torchrun/accelerate launch with 2 processes (gloo on CPU) splits each optimizer
    step's micro-batches and averages gradients, so it must match 1 process with grad_accum=2."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import torch
    from safetensors.torch import load_file

    def config(path, accum):
        path.write_text(f'''
name = "ddp"
methods = ["sft"]
[method_params.sft]
address_probe = false
[stream]
source = "builtin"
train_per_family = 8
test_per_family = 1
[base]
name = "{tiny_model_dir}"
threads = 1
[train]
epochs = 1
batch_size = 2
grad_accum = {accum}
dropout = 0.0
rank = 4
alpha = 8.0
target_format = "compact"
[eval]
orders = ["T1,T2"]
max_new_tokens = 4
[runner]
keep_states = true
''')
        return path

    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    two = subprocess.run([str(torchrun), "--nproc_per_node", "2", "-m", "skillbank", "run", "--config",
                          str(config(tmp_path / "two.toml", 1)), "--out", str(tmp_path / "two"), "--no-report"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert two.returncode == 0, two.stderr[-2000:]
    one = subprocess.run([sys.executable, "-m", "skillbank", "run", "--config", str(config(tmp_path / "one.toml", 2)),
                          "--out", str(tmp_path / "one"), "--no-report"], capture_output=True, text=True, env=env,
                         timeout=300)
    assert one.returncode == 0, one.stderr[-2000:]
    rel = Path("methods/sft/T1,T2/stage-02/state/seq/adapter_model.safetensors")
    a, b = load_file(str(tmp_path / "two" / rel)), load_file(str(tmp_path / "one" / rel))
    assert a.keys() == b.keys()
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
    summary = json.loads((tmp_path / "two" / "methods/sft/T1,T2/stage-01/train.json").read_text())
    assert summary["steps"] == 2  # 8 examples, batches of 2, 2 micro-batches per step


def test_parallel_fsm_stages_build_the_same_bank(tmp_path, tiny_model_dir):
    """--parallel-stages: FSM's executors trained in worker processes equal the ones trained in turn."""
    from skillbank.memory.bank import read_manifest
    seq = run(tiny_config(tiny_model_dir, ["fsm"], method_params={"fsm": {"init": "fresh"}}), tmp_path / "seq",
              progress=False)
    par_cfg = tiny_config(tiny_model_dir, ["fsm"], runner={"parallel_stages": 2},
                          method_params={"fsm": {"init": "fresh"}})
    par = run(par_cfg, tmp_path / "par", progress=False)
    digests = {}
    for name in ("seq", "par"):
        manifest = read_manifest(tmp_path / name / "methods" / "fsm" / "bank")
        digests[name] = {s.name: s.digests["adapter_model.safetensors"] for s in manifest.shards}
    assert len(digests["par"]) == 3 and digests["par"] == digests["seq"]
    assert (tmp_path / "par" / "methods" / "fsm" / "pretrained").is_dir()
    assert _results_without_timing(par)[("fsm", ORDER)]["variants"] == _results_without_timing(seq)[("fsm", ORDER)]["variants"]


def test_reactivate_probes_final_checkpoints_with_the_correct_address(tmp_path, tiny_model_dir, monkeypatch):
    """The paper's "w/ correct skill address" rows: the final checkpoint of a finished method re-evaluated
    with the address appended, once; unfinished methods and untrained references are not probed."""
    from typer.testing import CliRunner

    from skillbank.cli import app
    from skillbank.continual.reactivation import address_records
    out = tmp_path / "r"
    run(tiny_config(tiny_model_dir, ["lwf", "olora"]), out, progress=False)
    real_learn = METHODS["ewc"].learn
    monkeypatch.setattr(METHODS["ewc"], "learn",
                        lambda self, t, f, r: (_ for _ in ()).throw(KeyboardInterrupt) if t == 2 else real_learn(self, t, f, r))
    with pytest.raises(KeyboardInterrupt):
        run(tiny_config(tiny_model_dir, ["ewc"]), out, progress=False)
    cached = (out / "methods" / "lwf" / "outputs.jsonl").read_text().count("\n")

    res = CliRunner().invoke(app, ["exp", "reactivate", str(out)])  # the paper's three: lwf, ewc, olora
    assert res.exit_code == 0, res.output
    assert f"lwf {ORDER}: probed" in res.output and f"olora {ORDER}: probed" in res.output
    assert f"ewc {ORDER}: not finished: skipped" in res.output
    final = out / "methods" / "lwf" / ORDER / "stage-03"
    probe = json.loads((final / "address.json").read_text())
    assert list(probe["variants"]) == ["lwf+address"] and len(probe["variants"]["lwf+address"]["tasks"]) == 3
    held_out = sum(t["n"] for t in probe["variants"]["lwf+address"]["tasks"].values())
    assert (out / "methods" / "lwf" / "outputs.jsonl").read_text().count("\n") == cached + held_out
    record = load_run(out)
    assert record["methods"]["lwf"][ORDER]["variants"]["lwf+address"]["final_only"]
    md = (out / "report.md").read_text()
    assert "| LwF |" in md and "↳ w/ correct skill address (diagnostic)" in md

    again = CliRunner().invoke(app, ["exp", "reactivate", str(out), "--method", "lwf", "--no-report"])
    assert f"lwf {ORDER}: already probed" in again.output
    refused = CliRunner().invoke(app, ["exp", "reactivate", str(out), "--method", "base-skill"])
    assert refused.exit_code != 0 and "trains nothing" in refused.output
    nowhere = CliRunner().invoke(app, ["exp", "reactivate", str(tmp_path / "nothing")])
    assert nowhere.exit_code != 0 and "not a run directory" in nowhere.output

    rec = build_run_stream(tiny_config(tiny_model_dir, ["lwf"])).test["t1_daily_life"][0]
    probed = address_records([rec])[0]
    assert probed.request.startswith(rec.request) and probed.request.endswith(", ".join(rec.graph.tasks))
    assert probed.graph == rec.graph and probed.id == rec.id


def test_a_validation_run_trains_without_the_split_and_evaluates_on_it(tmp_path, tiny_model_dir, monkeypatch):
    cfg = tiny_config(tiny_model_dir, ["sft"], stream={"source": "builtin", "train_per_family": 5, "test_per_family": 2,
                                                       "validation_per_family": 2},
                      eval={"orders": ["T1,T2"], "max_new_tokens": 6, "batch_size": 4, "split": "validation"})
    stream = build_run_stream(cfg)
    val_ids = {r.id for recs in stream.validation.values() for r in recs}
    test_ids = {r.id for recs in stream.test.values() for r in recs}
    trained = []
    real = METHODS["sft"].learn
    monkeypatch.setattr(METHODS["sft"], "learn", lambda self, t, f, r: trained.extend(x.id for x in r) or real(self, t, f, r))
    run(cfg, tmp_path / "r", progress=False, report=False)
    assert trained and not set(trained) & val_ids and not set(trained) & test_ids
    saved = json.loads((tmp_path / "r" / "config.json").read_text())
    assert saved["stream"]["validation_per_family"] == 2 and saved["eval"]["split"] == "validation"
    odir = tmp_path / "r" / "methods" / "sft" / "T1,T2"
    ev = json.loads((odir / "stage-02" / "eval.json").read_text())
    assert ev["split"] == "validation" and all(m["n"] == 2 for m in ev["variants"]["sft"]["tasks"].values())
    predicted = {json.loads(line)["id"] for line in (odir / "predictions.jsonl").read_text().splitlines()}
    assert predicted and predicted <= val_ids


def test_runs_saved_before_the_validation_split_existed_resume(tmp_path, tiny_model_dir):
    cfg = tiny_config(tiny_model_dir, ["base-oracle-fields"])
    run(cfg, tmp_path / "r", progress=False, report=False)
    path = tmp_path / "r" / "config.json"
    saved = json.loads(path.read_text())
    for section, key in (("stream", "validation_per_family"), ("stream", "validation_fraction"), ("eval", "split")):
        del saved[section][key]
    path.write_text(json.dumps(saved))
    run(cfg, tmp_path / "r", progress=False, report=False)  # no "another configuration" error
    ev = json.loads((tmp_path / "r" / "methods" / "base-oracle-fields" / ORDER / "stage-01" / "eval.json").read_text())
    assert "split" not in ev  # test-split runs write what they always wrote
    with pytest.raises(ConfigError, match="another configuration.*stream"):
        run(tiny_config(tiny_model_dir, ["base-oracle-fields"], stream={
            "source": "builtin", "train_per_family": 4, "test_per_family": 2, "validation_per_family": 1}),
            tmp_path / "r", progress=False, report=False)


@pytest.mark.parametrize("method", ["sft", "olora", "fsm"])  # one adapter, stacked adapters, a bank's shard
def test_a_kill_inside_a_stages_training_continues_from_its_checkpoint(tmp_path, tiny_model_dir, capsys, method):
    # 4 requests in batches of 2 for 3 epochs: 6 optimizer steps per stage; a checkpoint after every step
    extra = {"train": {"epochs": 3, "batch_size": 2, "rank": 4, "alpha": 8, "target_format": "compact"},
             "runner": {"checkpoint_minutes": 1e-9}}
    cfg = tiny_config(tiny_model_dir, [method], **extra)
    clean = run(cfg, tmp_path / "clean", progress=False)
    assert not list((tmp_path / "clean").rglob("fit-checkpoint.pt"))  # removed when each training finished

    # killed inside stage 2's second epoch
    with killed_after_checkpoint(4, in_dir="stage-02"), pytest.raises(KeyboardInterrupt):
        run(cfg, tmp_path / "resumed", progress=False)
    checkpoint = tmp_path / "resumed" / "methods" / method / ORDER / "stage-02" / "fit-checkpoint.pt"
    assert checkpoint.is_file()
    capsys.readouterr()
    resumed = run(cfg, tmp_path / "resumed", progress=False)
    assert f"fit checkpoint {checkpoint}: continuing this training after step 4" in capsys.readouterr().err
    assert not checkpoint.exists()
    assert _results_without_timing(resumed) == _results_without_timing(clean)


@pytest.mark.parametrize("method", ["ewc", "fsm"])  # a Fisher after the training; a bank's shard
def test_a_kill_after_a_stages_training_loads_the_finished_weights(tmp_path, tiny_model_dir, capsys, method):
    # 6 optimizer steps per stage; the kill comes right after the training's last step, before the stage's
    # state is saved (EWC has yet to estimate its Fisher): the rerun must train no step of that stage again
    extra = {"train": {"epochs": 3, "batch_size": 2, "rank": 4, "alpha": 8, "target_format": "compact"},
             "runner": {"checkpoint_minutes": 1e-9}}
    cfg = tiny_config(tiny_model_dir, [method], **extra)
    clean = run(cfg, tmp_path / "clean", progress=False)
    with killed_after_checkpoint(6, in_dir="stage-02"), pytest.raises(KeyboardInterrupt):
        run(cfg, tmp_path / "resumed", progress=False)
    stage = tmp_path / "resumed" / "methods" / method / ORDER / "stage-02"
    assert not (stage / "train.json").exists()  # killed before the stage's state was stored
    capsys.readouterr()
    resumed = run(cfg, tmp_path / "resumed", progress=False)
    err = capsys.readouterr().err
    assert f"fit checkpoint {stage / 'fit-checkpoint.pt'}: this training had finished (step 6)" in err
    assert not list((tmp_path / "resumed").rglob("fit-checkpoint.pt"))  # removed once each state was saved
    assert _results_without_timing(resumed) == _results_without_timing(clean)


def test_run_one_method_of_a_config_that_tunes_several(tmp_path, monkeypatch):
    """`skillbank run --method sft` on configs/compare.toml, as scripts/compare.sh runs it: the other methods'
    [method_params] and [method_train] blocks are left out, not refused; a config error keeps its [section]."""
    from pathlib import Path
    from typer.testing import CliRunner
    from skillbank.cli import app

    compare = Path(__file__).resolve().parents[1] / "configs" / "compare.toml"
    started = []

    class Started(Exception):
        pass

    def fake_run(cfg, out, **kwargs):
        started.append(cfg)
        raise Started

    monkeypatch.setattr(runner_mod, "run", fake_run)
    r = CliRunner().invoke(app, ["exp", "run", "--config", str(compare), "--out", str(tmp_path / "c"), "--method", "lwf",
                                 "--order", "O2", "--no-report", "--threads", "1"])
    assert isinstance(r.exception, Started), r.output
    (cfg,) = started
    assert cfg.methods == ["lwf"] and cfg.eval.orders == ["O2"] and list(cfg.method_train) == ["lwf"]
    assert cfg.base.threads == 1  # compare.sh's THREADS=1, without a copy of the config
    assert cfg.method_params_for("lwf").weight == RunConfig.from_toml(compare).method_params_for("lwf").weight

    # --extra-set adds to [eval] extra_sets (outside the identity: a finished run only evaluates it), once each
    own = RunConfig.from_toml(compare).eval.extra_sets
    r = CliRunner().invoke(app, ["exp", "run", "--config", str(compare), "--out", str(tmp_path / "c"), "--method", "fsm",
                                 "--extra-set", "more.jsonl", "--extra-set", "more.jsonl", "--extra-set", own[0]])
    assert isinstance(r.exception, Started), r.output
    assert started[-1].eval.extra_sets == own + ["more.jsonl"]
    assert started[-1].eval.orders == RunConfig.from_toml(compare).eval.orders

    bad = tmp_path / "bad.toml"
    bad.write_text('methods = ["sft"]\n[method_train.lwf]\nlr = 1e-3\n')
    r = CliRunner().invoke(app, ["exp", "run", "--config", str(bad), "--out", str(tmp_path / "b")])
    assert r.exit_code == 2 and "[method_train] names method(s) ['lwf']" in " ".join(r.output.split())


def test_a_parallel_fsm_worker_killed_inside_its_training_continues_from_its_checkpoint(tmp_path, tiny_model_dir):
    """A worker of --parallel-stages checkpoints like a stage trained in turn: killed halfway, the next run's
    worker continues and writes the adapter an uninterrupted worker writes, byte for byte."""
    from skillbank.continual.parallel import _family_prefix, _train_one

    cfg = tiny_config(tiny_model_dir, ["fsm"], runner={"parallel_stages": 2, "checkpoint_minutes": 1e-9},
                      method_params={"fsm": {"init": "fresh"}}, train={"epochs": 2, "batch_size": 2, "rank": 4, "alpha": 8, "target_format": "compact"})
    stream = build_run_stream(cfg)
    family = stream.order(ORDER)[0]
    args = (cfg.model_dump(), family, stream.train[family], _family_prefix(stream, family))
    _train_one(*args, str(tmp_path / "clean" / family), None, 1)
    with killed_after_checkpoint(3), pytest.raises(KeyboardInterrupt):
        _train_one(*args, str(tmp_path / "killed" / family), None, 1)
    checkpoint = tmp_path / "killed" / f"{family}.fit.pt"
    assert checkpoint.is_file() and not (tmp_path / "killed" / family).exists()
    _train_one(*args, str(tmp_path / "killed" / family), None, 1)
    assert not checkpoint.exists()
    clean, resumed = ((tmp_path / d / family / "adapter_model.safetensors").read_bytes() for d in ("clean", "killed"))
    assert resumed == clean


def _extra_file(path, families, per_family=2):
    """A small set of hand-written requests (tests/fixtures/paraphrase_builtin.jsonl) of ``families``."""
    from pathlib import Path
    rows = [json.loads(line) for line in (Path(__file__).parent / "fixtures" / "paraphrase_builtin.jsonl")
            .read_text().splitlines() if line.strip()]
    picked = [r for f in families for r in [r for r in rows if r["family"] == f][:per_family]]
    path.write_text("".join(json.dumps(r) + "\n" for r in picked))
    return path


def test_extra_sets_are_evaluated_after_the_last_stage_and_added_later_without_training(tmp_path, tiny_model_dir):
    from skillbank.data.builtin import build_builtin_stream
    keys = build_builtin_stream(seed=0, train_per_family=4, test_per_family=2).family_keys
    # T4's requests are of a family this three-stage order never learns: not counted
    first = _extra_file(tmp_path / "hand.jsonl", [keys[0], keys[2], keys[3]])
    out = tmp_path / "run"
    record = run(tiny_config(tiny_model_dir, ["sft", "fsm"], eval={"orders": [ORDER], "max_new_tokens": 6,
                                                                  "batch_size": 4, "extra_sets": [str(first)]}),
                 out, progress=False)
    fsm = record["methods"]["fsm"][ORDER]["extra"]["hand"]
    assert set(fsm["variants"]) == {"fsm", "oracle"}
    assert fsm["variants"]["fsm"]["n"] == 4 and set(fsm["variants"]["fsm"]["tasks"]) == {keys[0], keys[2]}
    assert fsm["variants"]["fsm"]["route_accuracy"] is not None
    assert sum(fsm["variants"]["oracle"]["failures"].values()) == 4  # every request ends in one failure kind
    assert "sft" in record["methods"]["sft"][ORDER]["extra"]["hand"]["variants"]
    lines = (out / "methods" / "fsm" / ORDER / "extra-hand.predictions.jsonl").read_text().splitlines()
    assert len(lines) == 8  # 4 requests x 2 variants
    assert "## Requests written elsewhere" in (out / "report.md").read_text()
    assert "| hand (n=4) |" in (out / "report.md").read_text()
    assert "How the requests of every set together end" in (out / "report.md").read_text()

    # a second set added to the finished run: evaluated from the saved last state, nothing trained again
    second = _extra_file(tmp_path / "more.jsonl", [keys[1]], per_family=3)
    messages = []
    again = run(tiny_config(tiny_model_dir, ["sft", "fsm"], eval={"orders": [ORDER], "max_new_tokens": 6,
                                                                 "batch_size": 4, "extra_sets": [str(first), str(second)]}),
                out, say=messages.append, progress=False)
    assert not any("learning" in m for m in messages)
    assert any("evaluating 3 requests of more" in m for m in messages)
    assert not any("requests of hand" in m for m in messages)  # its digest did not change
    extra = again["methods"]["fsm"][ORDER]["extra"]
    assert extra["hand"] == fsm and extra["more"]["variants"]["oracle"]["n"] == 3


def test_extra_sets_are_checked_before_anything_trains(tmp_path, tiny_model_dir):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "x", "family": "t9_nowhere", "request": "do it", "graph": {
        "task_nodes": [{"task": "Builtin::t1_daily_life::set_alarm", "arguments": [{"name": "time", "value": "6"}]}],
        "task_links": []}}) + "\n")
    for path, message in ((bad, "t9_nowhere"), (tmp_path / "absent.jsonl", "is not a file")):
        cfg = tiny_config(tiny_model_dir, ["sft"], eval={"orders": [ORDER], "max_new_tokens": 6, "batch_size": 4,
                                                         "extra_sets": [str(path)]})
        with pytest.raises(ConfigError, match=message):
            run(cfg, tmp_path / "run", progress=False)
        assert not list((tmp_path / "run" / "methods").glob("*/*/stage-01/train.json"))


def test_a_run_says_how_long_it_will_take_here_before_it_trains(tmp_path, tiny_model_dir):
    """skillbank demo's estimate: a few steps of the run's recipe timed on this machine, extrapolated to every
    stage's tokens and epochs; said once, before the first stage, and not again when the run is resumed."""
    from skillbank.continual.estimate import TIMED_EXAMPLES, estimate_run

    cfg = tiny_config(tiny_model_dir, ["fsm"], train={"epochs": 2, "batch_size": 4, "rank": 4, "alpha": 8,
                                                      "target_format": "compact"})
    stream = build_run_stream(cfg)
    est = estimate_run(cfg, stream, "torch", "auto")
    assert est.tokens_per_second > 0 and est.eval_seconds is None and est.threads >= 1
    assert est.eval_requests == sum(len(stream.test[f]) for f in stream.family_keys)
    from skillbank.model.base import load_base
    from skillbank.train.executor import build_examples, common_prefix
    base = load_base(cfg.base_config(), progress=False)
    tokens = 0
    for family in stream.family_keys:  # every stage's examples, two epochs each (no warm_epochs in this recipe)
        recs = stream.train[family]
        ex = build_examples(base, recs, cfg.train_config(), common_prefix(sorted({s for r in recs for s in r.graph.tasks})))[0]
        tokens += 2 * sum(len(e.input_ids) for e in ex)
    assert est.training_tokens == tokens
    assert est.training_seconds == pytest.approx(tokens / est.tokens_per_second)
    assert f"timed from {TIMED_EXAMPLES} training examples" in est.text() and "not priced" in est.text()
    messages = []
    run(cfg, tmp_path / "run", say=messages.append, progress=False, estimate=True)
    assert sum("estimate for this CPU" in m for m in messages) == 1
    assert messages.index(next(m for m in messages if "estimate" in m)) < \
        messages.index(next(m for m in messages if "stage 1/" in m))
    again = []
    run(cfg, tmp_path / "run", say=again.append, progress=False, estimate=True)
    assert not any("estimate for this CPU" in m for m in again)
