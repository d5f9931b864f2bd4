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


def test_method_params_check_each_baselines_own_settings():
    with pytest.raises(ConfigError, match=r"\[method_params.replay\]: the Replay budget is per_stage .* not both"):
        RunConfig.from_dict({"methods": ["replay"], "method_params": {"replay": {"per_stage": 10, "fraction": 0.1}}})
    with pytest.raises(ConfigError, match=r"\[method_params.replay\] fraction"):
        RunConfig.from_dict({"methods": ["replay"], "method_params": {"replay": {"fraction": 2}}})
    with pytest.raises(ConfigError, match=r"\[method_params.olora\] target_modules"):
        RunConfig.from_dict({"methods": ["olora"], "method_params": {"olora": {"target_modules": []}}})
    cfg = RunConfig.from_dict({"methods": ["replay", "olora", "lwf"], "method_params": {
        "replay": {"fraction": 0.1}, "olora": {"rank": 8, "target_modules": ["q_proj", "v_proj"]}}})
    saved = cfg.resolved()["method_params"]
    assert saved["replay"] == {"fraction": 0.1}  # the unset budget is not written
    assert saved["olora"] == {"lambda_orth": 0.5, "lambda_l2": 0.0, "rank": 8, "target_modules": ["q_proj", "v_proj"]}
    assert saved["lwf"] == {"temperature": 2.0, "weight": 1.0, "t_squared": False}


def test_the_deprecated_progressive_name_still_parses_for_saved_runs():
    saved = RunConfig.from_dict({"methods": ["sft", "progressive"]})  # a config.json written before the rename
    assert saved.method_params_for("progressive").model_dump() == {}
    with pytest.raises(ConfigError, match="unknown method 'progresive'.*progressive-routed"):
        RunConfig.from_dict({"methods": ["progresive"]})


def test_compare_config_runs_every_registered_method():
    """Every registered method is in the comparison, except stacked: progressive-routed trains the very same
    adapters and evaluates the stacked (summed, unrouted) reading as one of its variants."""
    from pathlib import Path
    from skillbank.method_registry import method_names
    cfg = RunConfig.from_toml(Path(__file__).resolve().parents[1] / "configs" / "compare.toml")
    assert cfg.methods == [m for m in method_names() if m != "stacked"]
    assert cfg.method_params_for("lwf").t_squared is False


def test_compare_config_carries_the_committed_sweeps_selection():
    """configs/compare.toml runs each baseline with the values results/sweep selected on validation data: its
    own hyperparameters under [method_params] and its tuned [train] fields under [method_train]."""
    import json
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    cfg = RunConfig.from_toml(root / "configs" / "compare.toml")
    sweep = json.loads((root / "results" / "sweep" / "sweep.json").read_text())
    checked = []
    for method, result in sweep["methods"].items():
        (point,) = [p for p in result["points"] if p["selected"]]
        params = cfg.method_params_for(method).model_dump()
        assert {k: params[k] for k in point["params"]} == point["params"], method
        assert {k: cfg.train_config_for(method).to_dict()[k] for k in point["train"]} == point["train"], method
        assert cfg.method_train.get(method, {}) == point["train"], method
        checked.append(method)
    assert sorted(checked) == ["ewc", "lwf", "olora", "replay", "sft"]


def test_the_llama_cpp_encoding_is_resolved_once_and_kept_when_a_run_resumes(tmp_path, monkeypatch):
    """``[eval] llamacpp_encoding``: "auto" resolves to this machine's batched encoding when the run starts and is
    saved; a run resumed with "auto" keeps the encoding it started with, even where this machine would pick
    another (a run saved before the setting existed used Q8_0); an explicit other encoding is refused by name."""
    import skillbank.model.llamacpp as llamacpp
    from skillbank.config import saved_encoding
    from skillbank.continual.runner import _check_config

    monkeypatch.setattr(RunConfig, "eval_engine", lambda self: "llama.cpp")
    monkeypatch.setattr(llamacpp, "encoding_for", lambda rows, threads=None: "q8_0")
    cfg = RunConfig.from_dict({})
    assert cfg.resolved()["eval"]["llamacpp_encoding"] == "q8_0"
    _check_config(tmp_path, cfg)  # the run starts on a machine without BF16 kernels

    monkeypatch.setattr(llamacpp, "encoding_for", lambda rows, threads=None: "bf16")  # resumed on one with them
    assert cfg.resolved()["eval"]["llamacpp_encoding"] == "bf16"
    _check_config(tmp_path, cfg)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["eval"]["llamacpp_encoding"] == "q8_0" == saved_encoding(saved)
    assert RunConfig.from_run(saved).eval_encoding() == "q8_0"
    with pytest.raises(ConfigError, match=r"models in q8_0, not bf16 \(\[eval\] llamacpp_encoding\)"):
        _check_config(tmp_path, RunConfig.from_dict({"eval": {"llamacpp_encoding": "bf16"}}))
    _check_config(tmp_path, RunConfig.from_dict({"eval": {"llamacpp_encoding": "q8_0"}}))  # the same, named

    del saved["eval"]["llamacpp_encoding"]  # written before the setting existed
    assert saved_encoding(saved) == "q8_0" and RunConfig.from_run(saved).eval.llamacpp_encoding == "q8_0"
    assert saved_encoding({"eval": {"engine": "torch"}}) == "auto"
    with pytest.raises(ConfigError, match="llamacpp_encoding"):
        RunConfig.from_dict({"eval": {"llamacpp_encoding": "fp8"}})


def test_the_eval_engine_is_resolved_saved_and_part_of_a_run_s_identity(tmp_path, tiny_model_dir):
    """``[eval] engine``: "auto" is llama.cpp only where it runs the base (the embedded model), torch for any
    other; an explicit "llama.cpp" on another base is an error naming why; a run saved before engines existed
    generated with torch, so it resumes on torch and refuses llama.cpp."""
    from skillbank.continual.runner import check_same_config

    other = RunConfig.from_dict({"base": {"name": str(tiny_model_dir)}})
    assert other.eval_engine() == "torch" and other.resolved()["eval"]["engine"] == "torch"
    with pytest.raises(ConfigError, match="embedded GGUF model only"):
        RunConfig.from_dict({"base": {"name": str(tiny_model_dir)}, "eval": {"engine": "llama.cpp"}}).eval_engine()
    with pytest.raises(ConfigError, match="engine"):
        RunConfig.from_dict({"eval": {"engine": "vllm"}})
    assert RunConfig.from_dict({"eval": {"engine": "torch"}}).eval_engine() == "torch"
    assert RunConfig.from_dict({"base": {"device": "cuda"}}).eval_engine() == "torch"  # a GPU named generates

    old = other.resolved()
    del old["eval"]["engine"]  # a run directory written before the setting existed
    assert RunConfig.from_run(old).eval.engine == "torch"
    check_same_config(tmp_path, old, other.resolved())  # torch both: resumes
    llama = {**other.resolved(), "eval": {**other.resolved()["eval"], "engine": "llama.cpp"}}
    with pytest.raises(ConfigError, match="differs in: eval"):
        check_same_config(tmp_path, old, llama)
