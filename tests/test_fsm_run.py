"""The whole FSM run (stream -> bank -> prefix evaluation -> report) on a tiny random model."""
import json

import pytest

from skillbank.config import ConfigError, RunConfig
from skillbank.continual.fsm import run_fsm
from skillbank.metrics import AccuracyMatrix


def test_run_writes_results_report_and_plots(tmp_path, tiny_model_dir):
    cfg = RunConfig.from_dict({
        "name": "tiny", "stream": {"source": "builtin", "train_per_family": 4, "test_per_family": 2},
        "base": {"name": str(tiny_model_dir)},
        "train": {"epochs": 1, "batch_size": 4, "target_format": "compact"},
        "eval": {"orders": ["O1", "O2"], "max_new_tokens": 6, "batch_size": 4},
    })
    messages = []
    record = run_fsm(cfg, tmp_path / "run", say=messages.append, progress=False)
    out = tmp_path / "run"
    for name in ("results.json", "config.json", "report.md", "predictions.jsonl", "matrix_O1.png", "matrix_O2.png",
                 "trajectory_O1.png"):
        assert (out / name).is_file(), name
    saved = json.loads((out / "results.json").read_text())
    assert saved["config"]["train"]["epochs"] == 1 and saved["config"]["train"]["rank"] == 16
    for order in ("O1", "O2"):
        res = saved["orders"][order]
        m = AccuracyMatrix.from_dict(res["fsm_em"])
        assert m.stages_done == 5
        assert all(m.cells[t][k] is None for t in range(5) for k in range(t + 1, 5))  # upper triangle empty
        assert res["route_micro"][0] == 1.0  # one shard: routing cannot fail
        assert len(res["route"]) == 5 and set(res["final"]) == set(res["order"])
    # shards are trained once (order-independent) and every (shard, request) output is generated once
    assert len(saved["training"]) == 5
    preds = [json.loads(l) for l in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(preds) == 2 * 10 and {p["order"] for p in preds} == {"O1", "O2"}
    assert "Order O2: T3 -> T1 -> T5 -> T2 -> T4" in (out / "report.md").read_text()
    assert any("stage 5/5" in m for m in messages)
    assert record["timing"]["generated_outputs"] >= 10


def test_config_errors_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match="train_per_family"):
        RunConfig.from_dict({"stream": {"train_per_family": 0}})
    with pytest.raises(ConfigError, match="Extra inputs"):
        RunConfig.from_dict({"stream": {"sorce": "builtin"}})
    with pytest.raises(ConfigError, match=r"\[train\].*lr"):
        RunConfig.from_dict({"train": {"lr": 5}})
    with pytest.raises(ConfigError, match="unknown TrainConfig field"):
        RunConfig.from_dict({"train": {"learning_rate": 1e-3}})
    (tmp_path / "bad.toml").write_text("name = [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        RunConfig.from_toml(tmp_path / "bad.toml")
    with pytest.raises(ConfigError, match="no such config"):
        RunConfig.from_toml(tmp_path / "missing.toml")


def test_shipped_configs_parse():
    from pathlib import Path
    from skillbank.config import packaged_config
    demo = RunConfig.from_toml(packaged_config("demo"))
    assert demo.eval.orders == ["O1"] and demo.train_config().target_format == "compact"
    paper = RunConfig.from_toml(Path(__file__).resolve().parents[1] / "configs" / "paper.toml")
    t = paper.train_config()
    assert (t.rank, t.lr, t.epochs, t.batch_size * t.grad_accum) == (16, 4e-4, 6, 8)
    assert paper.eval.max_new_tokens == 768 and paper.eval.orders == ["O1", "O2"]
