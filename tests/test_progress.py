"""``skillbank progress``: finished stages read from a run directory, and the remaining-time estimate."""
import json

import pytest
from typer.testing import CliRunner

from skillbank.cli import app
from skillbank.continual.progress import run_progress
from skillbank.errors import SkillbankError


def _stage(root, method, order, t, train=None, eval_seconds=None, machine=None):
    d = root / "methods" / method / order / f"stage-{t:02d}"
    d.mkdir(parents=True, exist_ok=True)
    where = {"machine": machine} if machine else {}  # stage files written before machines were recorded have none
    if train is not None:
        (d / "train.json").write_text(json.dumps({"wall_seconds": train, **where}))
    if eval_seconds is not None:
        (d / "eval.json").write_text(json.dumps({"eval_seconds": eval_seconds, **where}))


@pytest.fixture
def run_dir(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"task_labels": {"a": "T1", "b": "T2", "c": "T3"}}))
    (tmp_path / "config.json").write_text(json.dumps({"methods": ["sft", "base-skill"], "eval": {"orders": ["O1"]}}))
    _stage(tmp_path, "sft", "O1", 1, train=100, eval_seconds=10)     # 10 s per evaluated task
    _stage(tmp_path, "sft", "O1", 2, train=300, eval_seconds=40)     # 20 s per task (2 tasks)
    _stage(tmp_path, "sft", "O1", 3, train=250)                      # trained, not evaluated yet
    return tmp_path


def test_finished_stages_and_the_estimate(run_dir):
    rows = {(r.method, r.order): r for r in run_progress(run_dir, methods=["lwf", "fsm"], orders=["O1", "O2"])}
    sft = rows["sft", "O1"]
    assert (sft.evaluated, sft.trained_pending, sft.done) == (2, True, False)
    # medians: training 200 s a stage, evaluation 15 s a task
    assert sft.remaining_seconds == pytest.approx(15 * 3)               # stage 3: trained, evaluate 3 tasks
    assert rows["lwf", "O1"].remaining_seconds == pytest.approx(15 * (1 + 2 + 3) + 200 * 3)
    assert rows["base-skill", "O1"].remaining_seconds == pytest.approx(15 * 6)   # a frozen base only evaluates
    assert rows["fsm", "O1"].remaining_seconds == pytest.approx(15 * 6 + 200 * 3)
    assert rows["fsm", "O2"].remaining_seconds == pytest.approx(15 * 6)          # its executors are trained once
    _stage(run_dir, "sft", "O1", 3, eval_seconds=45)
    assert next(r for r in run_progress(run_dir) if r.method == "sft").done


def test_a_run_continued_on_another_machine_is_estimated_from_that_machines_stages(run_dir):
    # the three sft stages of the fixture ran on an older machine (unrecorded); LwF finished one stage here
    _stage(run_dir, "lwf", "O1", 1, train=40, eval_seconds=2, machine="fast CPU")
    rows = {(r.method, r.order): r for r in run_progress(run_dir, methods=["lwf"], orders=["O1"], machine="fast CPU")}
    assert rows["lwf", "O1"].remaining_seconds == pytest.approx(2 * (2 + 3) + 40 * 2) and rows["lwf", "O1"].estimated_here
    # SFT has no stage on this machine: every method's stages measured here stand in for its own elsewhere
    assert rows["sft", "O1"].remaining_seconds == pytest.approx(2 * 3) and rows["sft", "O1"].estimated_here
    # asked from a third machine, nothing was measured there: each method's own stages, wherever they ran
    rows = {(r.method, r.order): r for r in run_progress(run_dir, methods=["lwf"], orders=["O1"], machine="other")}
    assert rows["sft", "O1"].remaining_seconds == pytest.approx(15 * 3) and not rows["sft", "O1"].estimated_here


def test_the_machine_label_names_cpu_model_vector_width_and_cores():
    from skillbank.continual.progress import machine_label
    label = machine_label()
    assert label.endswith(" cores") and machine_label("cpu") == label


def test_nothing_measured_yet_is_not_estimated(tmp_path, run_dir):
    (tmp_path / "methods" / "sft").rename(tmp_path / "elsewhere")
    assert all(r.remaining_seconds is None for r in run_progress(run_dir))


def test_the_command_and_bad_directories(run_dir, tmp_path):
    res = CliRunner().invoke(app, ["exp", "progress", str(run_dir), "--jobs", "2"])
    assert res.exit_code == 0, res.output
    assert "0/2 method-orders finished" in res.output and "2/3" in res.output
    assert "remaining about 2 min of process time, 1 min at 2 processes" in " ".join(res.output.split())
    with pytest.raises(SkillbankError, match="not a run directory"):
        run_progress(tmp_path / "nothing")
    (run_dir / "methods" / "sft" / "O1" / "stage-01" / "eval.json").write_text("{torn")
    bad = CliRunner().invoke(app, ["exp", "progress", str(run_dir)])
    assert bad.exit_code == 2 and "stage-01/eval.json: not valid JSON" in bad.output
