"""Run configuration files: errors name the field; the shipped configs parse."""
import json

import pytest

from skillbank.config import ConfigError, RunConfig


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
