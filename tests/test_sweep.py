"""Fair baselines: the validation split (from training requests only, never held-out) and `skillbank sweep`
(a grid screened on two-stage runs, resumable, selection = the argmax of the printed grid, bad grids refused
before any work)."""
import json
import math
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from skillbank.cli import app
from skillbank.config import ConfigError, RunConfig, SweepConfig
from skillbank.continual import runner as runner_mod
from skillbank.continual.methods import METHODS
from skillbank.run_dir import build_run_stream
from skillbank.continual.sweep import SECONDS_PER_REQUEST_EPOCH, expand_grid, plan_sweep, run_sweep, select
from skillbank.report.sweep import selected_toml, separation

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def _stream_cfg(**stream):
    return RunConfig.from_dict({"stream": {"source": "builtin", "train_per_family": 8, "test_per_family": 3, **stream}})


# -- the validation split -------------------------------------------------------------------------------
def test_validation_split_comes_from_training_only_and_is_seeded():
    plain = build_run_stream(_stream_cfg())
    split = build_run_stream(_stream_cfg(validation_per_family=3))
    again = build_run_stream(_stream_cfg(validation_per_family=3))
    other_seed = build_run_stream(_stream_cfg(validation_per_family=3, seed=1))
    assert not plain.validation  # unset: no split, the stream as it always was
    for k in plain.family_keys:
        val, train, test = split.validation[k], split.train[k], split.test[k]
        assert len(val) == 3 and len(train) == 5
        assert {r.id for r in val} | {r.id for r in train} == {r.id for r in plain.train[k]}  # carved from training
        assert not {r.id for r in val} & {r.id for r in train}  # the methods never train on it
        assert not {r.request for r in val} & {r.request for r in test}  # never a held-out request
        assert [r.id for r in test] == [r.id for r in plain.test[k]]  # the held-out set is untouched
        assert [r.id for r in val] == [r.id for r in again.validation[k]]  # deterministic
        assert [r.id for r in train] == [r.id for r in plain.train[k] if r.id not in {v.id for v in val}]
    assert any([r.id for r in split.validation[k]] != [r.id for r in other_seed.validation[k]] for k in plain.family_keys)
    frac = build_run_stream(_stream_cfg(validation_fraction=0.25))
    assert all(len(frac.validation[k]) == 2 and len(frac.train[k]) == 6 for k in frac.family_keys)
    assert split.summary()[split.family_keys[0]]["validation"] == 3


def test_validation_split_config_errors():
    with pytest.raises(ConfigError, match="not both"):
        _stream_cfg(validation_per_family=2, validation_fraction=0.5)
    with pytest.raises(ConfigError, match="split = 'validation' needs a validation split"):
        RunConfig.from_dict({"eval": {"split": "validation"}})
    with pytest.raises(ConfigError, match="split"):
        RunConfig.from_dict({"eval": {"split": "train"}})
    from skillbank.errors import StreamError
    with pytest.raises(StreamError, match="at least one must stay"):
        build_run_stream(_stream_cfg(validation_per_family=8))


def test_the_shipped_sweep_never_validates_on_the_comparisons_held_out_requests():
    sweep = SweepConfig.from_toml(CONFIGS / "sweep.toml")
    compare = RunConfig.from_toml(CONFIGS / "compare.toml")
    s, c = build_run_stream(sweep.run), build_run_stream(compare)
    held_out = {r.request for recs in c.test.values() for r in recs} | {r.request for recs in s.test.values() for r in recs}
    val = {r.request for recs in s.validation.values() for r in recs}
    assert len(val) == 5 * 40 and not val & held_out
    compare_train = {r.request for recs in c.train.values() for r in recs}
    assert val <= compare_train  # the validation requests are the comparison's own training requests


# -- sweeps on a tiny model -----------------------------------------------------------------------------
def tiny_sweep(model_dir, grid, **extra) -> SweepConfig:
    raw = {
        "name": "tiny-sweep",
        "stream": {"source": "builtin", "train_per_family": 5, "test_per_family": 2, "validation_per_family": 2},
        "base": {"name": str(model_dir)},
        "train": {"epochs": 1, "batch_size": 4, "rank": 4, "alpha": 8, "target_format": "compact"},
        "eval": {"max_new_tokens": 6, "batch_size": 4},
        "sweep": {"orders": ["O1", "O2"], "stages": 2, "grid": grid},
    }
    raw.update(extra)
    return SweepConfig.from_dict(raw)


GRID = {"sft": {"train": {"lr": [2e-3, 5e-4]}}, "lwf": {"weight": [0.1, 1.0]}}


def _printed_rows(record):
    from rich.console import Console
    console = Console(record=True, width=250)
    from skillbank.report.sweep import sweep_table
    console.print(sweep_table(record))
    rows = []
    for line in console.export_text().splitlines():
        cells = [c.strip() for c in re.split(r"[│┃|]", line)]
        cells = [c for c in cells if c != ""]
        if len(cells) >= 6 and cells[0] in GRID and cells[1].isdigit():
            rows.append({"method": cells[0], "index": int(cells[1]), "score": float(cells[5]),
                         "selected": "selected" in line})
    return rows


def test_a_sweep_resumes_without_redoing_finished_points_and_selects_the_printed_argmax(tmp_path, tiny_model_dir,
                                                                                       monkeypatch):
    cfg = tiny_sweep(tiny_model_dir, GRID)
    out = tmp_path / "sweep"
    lwf = METHODS["lwf"]
    real_learn = lwf.learn
    calls = []

    def dying_learn(self, t, family, records):  # killed in the last point, screen T1,T2, stage 2
        if self.params.weight == 1.0 and t == 2:
            raise KeyboardInterrupt("killed")
        return real_learn(self, t, family, records)

    monkeypatch.setattr(lwf, "learn", dying_learn)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(cfg, out, progress=False)
    partial = json.loads((out / "sweep.json").read_text())
    assert [e["finished"] for e in partial["methods"]["sft"]["points"]] == [True, True]
    assert partial["methods"]["lwf"]["selected"] is None  # unfinished grid: nothing selected yet

    def counting(cls):
        real = cls.learn if cls is not lwf else real_learn

        def learn(self, t, family, records):
            calls.append((type(self).name, self.ctx.order_name, t, len(records)))
            return real(self, t, family, records)
        return learn

    monkeypatch.setattr(METHODS["sft"], "learn", counting(METHODS["sft"]))
    monkeypatch.setattr(lwf, "learn", counting(lwf))
    messages = []
    record = run_sweep(cfg, out, say=messages.append, progress=False)
    # only the killed point's remainder: its T1,T2 stage 2 (stage 1 was finished) and its T3,T1 screen
    assert calls == [("lwf", "T1,T2", 2, 3), ("lwf", "T3,T1", 1, 3), ("lwf", "T3,T1", 2, 3)]  # 5 - 2 validation
    assert sum("finished earlier, read back" in m for m in messages) == 3
    assert any("selection rule (fixed before running)" in m for m in messages)

    saved = json.loads((out / "sweep.json").read_text())
    assert saved["screens"] == ["T1,T2", "T3,T1"] and saved["split"] == "validation"
    # measured cost: every training once; a stage loaded from the stage cache cost no training
    fits = [json.loads(f.read_text()) for f in sorted((out / "points").glob("*/*/methods/*/*/stage-*/train.json"))]
    trained = [f["wall_seconds"] for f in fits if "shared_stage" not in f]
    assert len(fits) == 16 and len(trained) == 14  # lwf's second point loads the first's first stages
    assert saved["measured"]["stages"] == 16 and saved["measured"]["trainings"] == 14
    assert saved["measured"]["train_seconds"] == pytest.approx(sum(trained), abs=0.1)
    # the rate the remaining points are estimated at: those seconds over the trainings' request-epochs
    request_epochs = sum(f["examples"] * f["epochs"] for f in fits if "shared_stage" not in f)
    assert saved["measured"]["request_epochs"] == request_epochs
    assert saved["measured"]["seconds_per_request_epoch"] == pytest.approx(  # up to the rounding of the seconds
        (saved["measured"]["train_seconds"] + saved["measured"]["eval_seconds"]) / request_epochs,
        abs=0.1 / request_epochs + 5e-4)
    # the resumed point was estimated at the rate of the stages finished before it, not the built-in guess
    running = [m for m in messages if ": running" in m]
    rates = [float(re.search(r"at ([0-9.]+) s per request-epoch", m).group(1)) for m in running]
    assert len(rates) == 1 and rates[0] > 0 and rates[0] != SECONDS_PER_REQUEST_EPOCH
    rate = saved["measured"]["seconds_per_request_epoch"]
    assert f"at the {rate} s per request-epoch measured on this sweep's 14 finished" in plan_sweep(cfg).describe(saved["measured"])
    for method, info in saved["methods"].items():
        assert info["complete"]
        for e in info["points"]:
            assert set(e["screens"]) == {"T1,T2", "T3,T1"}
            for s in e["screens"].values():
                assert s["split"] == "validation"
                cells = s["em"]["cells"]
                assert s["diagonal_em"] == pytest.approx((cells[0][0] + cells[1][1]) / 2)
                assert s["retained_first_em"] == cells[1][0]
            assert e["score"] == round(100 * sum(s["seen_em"] for s in e["screens"].values()) / 2, 2)
        # evaluated on validation requests only: 2 per seen family
        ev = json.loads((out / info["points"][0]["dir"] / "methods" / method / "T3,T1" / "stage-02" / "eval.json").read_text())
        assert all(m["n"] == 2 for m in ev["variants"][method]["tasks"].values())
    # A tiny random model scores 0 everywhere: give the points distinct (and two tied) validation EMs on disk,
    # as a trained model would, and read the sweep back. The selection is the argmax of the printed grid,
    # the first in grid order on ties.
    fake = {("sft", 0): 0.5, ("sft", 1): 0.5, ("lwf", 0): 0.25, ("lwf", 1): 0.75}
    for method, info in saved["methods"].items():
        for e in info["points"]:
            for path in (out / e["dir"] / "methods" / method).glob("*/stage-*/eval.json"):
                ev = json.loads(path.read_text())
                for task, m in ev["variants"][method]["tasks"].items():
                    m["graph_em"] = fake[(method, e["index"])] * (0.5 if path.parent.name == "stage-02" and
                                                                  task == ev["order"][0] else 1.0)
                path.write_text(json.dumps(ev))
    record = run_sweep(cfg, out, progress=False)
    saved = json.loads((out / "sweep.json").read_text())
    assert [e["score"] for e in saved["methods"]["lwf"]["points"]] == [18.75, 56.25]
    assert saved["methods"]["lwf"]["points"][1]["retained_first_em"] == 0.375
    # the score's standard error by hand: per screen the last stage's cells 0.375 and 0.75, n = 2 each,
    # var = (0.375 * 0.625 / 2 + 0.75 * 0.25 / 2) / 2^2; the two screens averaged
    per_screen_var = (0.375 * 0.625 / 2 + 0.75 * 0.25 / 2) / 4
    assert saved["methods"]["lwf"]["points"][1]["score_se"] == round(100 * (2 * per_screen_var) ** 0.5 / 2, 2) == 16.24
    assert (saved["methods"]["sft"]["selected"], saved["methods"]["lwf"]["selected"]) == (0, 1)
    rows = _printed_rows(record)
    assert len(rows) == 4
    for method in GRID:
        mine = [r for r in rows if r["method"] == method]
        best = max(r["score"] for r in mine)
        first_best = next(r for r in mine if r["score"] == best)
        assert [r["selected"] for r in mine] == [r is first_best for r in mine]
        assert saved["methods"][method]["selected"] == first_best["index"]
    # the report and the block to paste
    assert (out / "sweep.md").is_file() and (out / "sweep-curves.png").is_file()
    md = (out / "sweep.md").read_text()
    assert "Selection rule (fixed before running)" in md and "sweep-curves.png" in md
    lwf_points = saved["methods"]["lwf"]["points"]
    z = separation(lwf_points[0], lwf_points[1])  # the unselected point, in SEs of the difference
    assert z == pytest.approx((56.25 - 18.75) / math.hypot(lwf_points[0]["score_se"], lwf_points[1]["score_se"]))
    assert f"| 18.75 | {lwf_points[0]['score_se']:.2f} | {z:.1f} |" in md
    pasted = tomllib.loads(selected_toml(saved))
    lwf_best = saved["methods"]["lwf"]["points"][saved["methods"]["lwf"]["selected"]]
    assert pasted["method_params"]["lwf"] == {"weight": lwf_best["params"]["weight"]}
    sft_best = saved["methods"]["sft"]["points"][saved["methods"]["sft"]["selected"]]
    assert pasted["method_train"] == {"sft": {"lr": sft_best["train"]["lr"]}}  # only sft tuned its lr
    assert "train" not in pasted  # the shared recipe stays as it is
    # a third run reruns nothing
    calls.clear()
    run_sweep(cfg, out, progress=False)
    assert calls == []
    # the same directory with another recipe is refused, even where every point is finished
    other = tiny_sweep(tiny_model_dir, GRID, train={"epochs": 2, "batch_size": 4, "rank": 4, "alpha": 8,
                                                    "target_format": "compact"})
    with pytest.raises(ConfigError, match="another configuration.*train.*delete"):
        run_sweep(other, out, progress=False)
    assert calls == []
    # the CLI reads the selection back
    res = CliRunner().invoke(app, ["exp", "sweep", "--out", str(out), "--selected-toml"])
    assert res.exit_code == 0, res.output
    assert tomllib.loads(res.output) == pasted


def test_learning_check_against_sft(tmp_path):
    """Each baseline's selected diagonal EM against 0.6 x SFT's, and whether any setting of its grid gets there;
    the report says so in a table."""
    from skillbank.report.sweep import learning_check, write_sweep_report

    def pt(label, diagonal, score, selected=False):
        return {"label": label, "index": 0, "finished": True, "diagonal_em": diagonal, "retained_first_em": 0.1,
                "score": score, "selected": selected, "params": {}, "train": {}}
    record = {"screens": ["T1,T2"], "screen_of": {}, "stages": 2, "rule": "r", "methods": {
        "sft": {"selected": 0, "complete": True, "points": [pt("lr=0.002", 0.5, 30, True)]},
        "ewc": {"selected": 1, "complete": True, "points": [pt("lam=0.001", 0.45, 20), pt("lam=1", 0.1, 25, True)]},
        "lwf": {"selected": 0, "complete": True, "points": [pt("weight=1", 0.2, 10, True), pt("weight=0.05", 0.25, 5)]}}}
    reference, rows = learning_check(record)
    assert reference == 0.5
    ewc, lwf = rows
    assert (ewc["learns"], ewc["ratio"], ewc["any_learns"], ewc["best"]) == (False, 0.2, True, "lam=0.001")
    assert (lwf["learns"], lwf["any_learns"], lwf["best"]) == (False, False, "weight=0.05")
    md = write_sweep_report(record, tmp_path).read_text()
    assert "| ewc | lam=1 | 10.0 | 0.20 | **no** | lam=0.001 (45.0) | yes |" in md
    assert "| lwf | weight=1 | 20.0 | 0.40 | **no** | weight=0.05 (25.0) | **no** |" in md


def test_select_takes_the_first_of_tied_scores():
    pts = [{"score": 10.0}, {"score": 12.5}, {"score": 12.5}, {"score": None}]
    assert select(pts) == 1
    assert select([]) is None


def test_selected_learning_rates_reach_each_method_alone(tmp_path):
    """Methods tuned to different learning rates each get their own [method_train] block; pasted under a
    run config, each method trains with its own lr and the others with the shared [train]."""
    from skillbank.config import RunConfig

    def point(params, train, score):
        return {"label": "x", "params": params, "train": train, "score": score, "selected": True}
    record = {"screens": ["T1,T2"], "rule": "r", "methods": {
        "sft": {"selected": 0, "points": [point({}, {"lr": 2e-3}, 1.0)]},
        "lwf": {"selected": 0, "points": [point({"weight": 0.1}, {"lr": 5e-4}, 1.0)]},
        "olora": {"selected": 0, "points": [point({"rank": 8, "target_modules": ["q_proj", "v_proj"]}, {}, 1.0)]}}}
    text = selected_toml(record)
    parsed = tomllib.loads(text)
    assert parsed["method_train"] == {"sft": {"lr": 2e-3}, "lwf": {"lr": 5e-4}} and "train" not in parsed
    assert parsed["method_params"]["olora"] == {"rank": 8, "target_modules": ["q_proj", "v_proj"]}
    config = tmp_path / "compare.toml"
    config.write_text('methods = ["sft", "lwf", "olora", "fsm"]\n[train]\nlr = 1e-3\nepochs = 2\n' + text)
    cfg = RunConfig.from_toml(config)
    assert [cfg.train_config_for(m).lr for m in ("sft", "lwf", "olora", "fsm")] == [2e-3, 5e-4, 1e-3, 1e-3]
    assert {cfg.train_config_for(m).epochs for m in ("sft", "lwf", "olora", "fsm")} == {2}  # the same budget
    assert cfg.resolved()["method_train"] == {"sft": {"lr": 2e-3}, "lwf": {"lr": 5e-4}}


def test_method_train_bad_input(tmp_path):
    from skillbank.config import ConfigError, RunConfig
    for body, match in (('[method_train.ewc]\nlr = 1e-3\n', r"\[method_train\] names method\(s\) \['ewc'\]"),
                        ('[method_train.sft]\nlearning_rate = 1e-3\n', r"\[method_train.sft\].*learning_rate"),
                        ('[method_train.sft]\nlr = -1\n', r"\[method_train.sft\].*lr")):
        config = tmp_path / "c.toml"
        config.write_text('methods = ["sft"]\n' + body)
        with pytest.raises(ConfigError, match=match):
            RunConfig.from_toml(config)


@pytest.mark.parametrize("grid,match", [
    ({"sgd": {"lr": [1]}}, r"\[sweep.grid.sgd\].*unknown method 'sgd'"),
    ({"lwf": {"lambda": [1.0]}}, r"\[sweep.grid.lwf\].*unknown parameter.*'lambda'.*weight"),
    ({"ewc": {"train": {"learning_rate": [1e-3]}}}, r"unknown \[train\] field.*train.learning_rate"),
    ({"lwf": {"weight": [0.5, -1.0]}}, r"\[sweep.grid.lwf\] point weight=-1.*weight"),
    ({"sft": {"train": {"lr": [5.0]}}}, r"\[sweep.grid.sft\] point train.lr=5.*lr"),
    ({"lwf": {"weight": []}}, r"empty list"),
    ({"lwf": [{"weight": [0.1]}, {"weight": 0.1}]}, r"listed twice"),
])
def test_bad_grids_fail_before_any_work(tmp_path, tiny_model_dir, monkeypatch, grid, match):
    started = []
    monkeypatch.setattr(runner_mod, "run", lambda *a, **k: started.append(a))
    with pytest.raises(ConfigError, match=match):
        run_sweep(tiny_sweep(tiny_model_dir, grid), tmp_path / "s", progress=False)
    assert started == [] and not (tmp_path / "s").exists()


def test_processes_can_split_a_sweep_by_method(tmp_path, tiny_model_dir, monkeypatch):
    """`--method` runs only those methods' points, in the order given; `--threads` reaches every point's run
    and is not part of its identity."""
    started = []
    monkeypatch.setattr(runner_mod, "run", lambda cfg, out, **k: started.append((cfg.methods[0], cfg.base.threads)))
    cfg = tiny_sweep(tiny_model_dir, GRID)
    run_sweep(cfg.with_threads(1), tmp_path / "s", progress=False, methods=["lwf"])
    assert started == [("lwf", 1), ("lwf", 1)]
    started.clear()
    run_sweep(cfg, tmp_path / "s", progress=False, methods=["lwf", "sft"])
    assert [m for m, _ in started] == ["lwf", "lwf", "sft", "sft"]
    record = json.loads((tmp_path / "s" / "sweep.json").read_text())
    assert set(record["methods"]) == {"sft", "lwf"}  # the record always covers the whole grid
    with pytest.raises(ConfigError, match="--method ewc: not in this sweep's grid"):
        run_sweep(cfg, tmp_path / "s", progress=False, methods=["ewc"])
    # the thread count is not part of a point's identity: a point finished with 1 thread reads back with 2
    from skillbank.continual.sweep import point_config
    point = plan_sweep(cfg).points[0]
    a = point_config(cfg.with_threads(1), point, ["T1,T2"]).resolved()
    b = point_config(cfg.with_threads(2), point, ["T1,T2"]).resolved()
    runner_mod.check_same_config(tmp_path, a, b)
    assert a["base"]["threads"] == 1 and b["base"]["threads"] == 2


def test_processes_split_the_points_of_one_method_by_claims(tmp_path, tiny_model_dir, monkeypatch):
    """A point another process holds is skipped and come back to at the end; if that process died without
    finishing it (its claim released, no stage files), this one runs it."""
    from contextlib import ExitStack
    from skillbank.continual.sweep import point_claim, point_dir
    cfg = tiny_sweep(tiny_model_dir, GRID)
    out = tmp_path / "s"
    first, second = [p for p in plan_sweep(cfg).points if p.method == "lwf"]
    other_process = ExitStack()
    assert other_process.enter_context(point_claim(point_dir(out, first), wait=False)) is True
    started = []

    def fake_run(run_cfg, pdir, **k):
        started.append(Path(pdir).name)
        if Path(pdir) == point_dir(out, second):
            other_process.close()  # the other process dies mid-point: its claim goes, its point is unfinished

    monkeypatch.setattr(runner_mod, "run", fake_run)
    messages = []
    run_sweep(cfg, out, say=messages.append, progress=False, methods=["lwf"])
    assert started == [point_dir(out, second).name, point_dir(out, first).name]
    assert any(f"lwf {first.label}: another process is running it" in m for m in messages)
    # a held claim is not taken twice, and a released one is free again
    with point_claim(point_dir(out, first), wait=False) as mine:
        assert mine is True
        with point_claim(point_dir(out, first), wait=False) as again:
            assert again is False


def test_a_sweep_without_a_validation_split_is_refused(tiny_model_dir, tmp_path):
    cfg = tiny_sweep(tiny_model_dir, {"sft": {"train": {"lr": [2e-3]}}},
                     stream={"source": "builtin", "train_per_family": 5, "test_per_family": 2})
    with pytest.raises(ConfigError, match="validation split"):
        run_sweep(cfg, tmp_path / "s", progress=False)
    with pytest.raises(ConfigError, match="no \\[sweep\\] section"):
        SweepConfig.from_dict({"name": "x"})


def test_the_shipped_sweep_grid_and_its_budget():
    cfg = SweepConfig.from_toml(CONFIGS / "sweep.toml")
    points = expand_grid(cfg)
    by_method = {}
    for p in points:
        by_method.setdefault(p.method, []).append(p)
    assert sorted({p.params["weight"] for p in by_method["lwf"]}) == [0.05, 0.1, 0.25, 0.5, 1.0]
    assert sorted({p.params["lam"] for p in by_method["ewc"]}) == [1e-3, 1e-2, 1e-1, 1.0]
    assert [p.params for p in by_method["olora"]] == [
        {"lambda_orth": 0.005}, {"lambda_orth": 0.05}, {"lambda_orth": 0.5},
        {"lambda_orth": 0.5, "rank": 8, "target_modules": ["q_proj", "v_proj"]}]
    assert sorted({p.params["fraction"] for p in by_method["replay"]}) == [0.1, 0.5]
    for m in ("sft", "replay", "lwf", "ewc"):
        assert sorted({p.train["lr"] for p in by_method[m]}) == [5e-4, 2e-3]
    assert all(not p.train for p in by_method["olora"])
    plan = plan_sweep(cfg)
    assert plan.screens == ["T1,T2", "T3,T1"]
    # the config's budget note: ~2.3 CPU hours, the first stages of SFT/Replay/LwF/EWC and O-LoRA at r64 trained
    # once per screen and learning rate (4 of them instead of 54); O-LoRA's r8 point trains its own
    assert plan.seconds <= 2.4 * 3600
    res = CliRunner().invoke(app, ["exp", "sweep", "--config", str(CONFIGS / "sweep.toml"), "--plan"])
    assert res.exit_code == 0, res.output
    assert "28 grid points x 2 screens" in res.output and "11,592 training request-epochs" in res.output
    assert "2.3 CPU hours" in res.output
