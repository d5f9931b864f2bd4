"""``skillbank progress``: finished stages read from a run directory, and the remaining-time estimate."""
import json

import pytest
from typer.testing import CliRunner

from skillbank.cli import app
from skillbank.continual.progress import run_progress
from skillbank.errors import SkillbankError


def _stage(root, method, order, t, train=None, eval_seconds=None):
    d = root / "methods" / method / order / f"stage-{t:02d}"
    d.mkdir(parents=True, exist_ok=True)
    if train is not None:
        (d / "train.json").write_text(json.dumps({"wall_seconds": train}))
    if eval_seconds is not None:
        (d / "eval.json").write_text(json.dumps({"eval_seconds": eval_seconds}))


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


def test_nothing_measured_yet_is_not_estimated(tmp_path, run_dir):
    (tmp_path / "methods" / "sft").rename(tmp_path / "elsewhere")
    assert all(r.remaining_seconds is None for r in run_progress(run_dir))


def test_the_command_and_bad_directories(run_dir, tmp_path):
    res = CliRunner().invoke(app, ["progress", str(run_dir), "--jobs", "2"])
    assert res.exit_code == 0, res.output
    assert "0/2 method-orders finished" in res.output and "2/3" in res.output
    assert "remaining about 2 min of process time, 1 min at 2 processes" in " ".join(res.output.split())
    with pytest.raises(SkillbankError, match="not a run directory"):
        run_progress(tmp_path / "nothing")
    (run_dir / "methods" / "sft" / "O1" / "stage-01" / "eval.json").write_text("{torn")
    bad = CliRunner().invoke(app, ["progress", str(run_dir)])
    assert bad.exit_code == 2 and "stage-01/eval.json: not valid JSON" in bad.output
