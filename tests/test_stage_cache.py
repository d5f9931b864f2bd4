"""Stages trained once and loaded by every method whose training is the same computation."""
import json

from skillbank.continual.methods.base import weights_digest
from skillbank.continual.runner import run
from skillbank.continual.stage_cache import StageCache
from skillbank.model.base import BaseModelConfig, load_base
from skillbank.train.loop import adapter_parameters
from test_runner import tiny_config

ORDER = "T1,T2"


def _stage(out, method, t):
    d = out / "methods" / method / ORDER / f"stage-{t:02d}"
    return json.loads((d / "train.json").read_text()), json.loads((d / "eval.json").read_text())


def _final_em(record, method):
    return record["methods"][method][ORDER]["variants"][method]["em"]


def test_first_stage_is_trained_once_and_loading_it_changes_nothing(tmp_path, tiny_model_dir):
    # Stacked/Progressive/O-LoRA's stage 1 is the same training (nothing stacked yet, no O-LoRA term there)
    stacked = ["olora", "progressive-routed"]
    methods = ["sft", "ewc", "replay", "lwf"] + stacked
    cfg = tiny_config(tiny_model_dir, methods, eval={"orders": [ORDER], "max_new_tokens": 6, "batch_size": 4},
                      method_params={"replay": {"per_stage": 2}, "sft": {"address_probe": False}})
    shared = run(cfg, tmp_path / "shared", progress=False, report=False)
    cache = tmp_path / "shared" / "shared-stages"
    keys = [p.name for p in cache.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert len(keys) == 1 and (cache / keys[0] / "COMPLETE").is_file()  # stage 1: one training for all six
    first, _ = _stage(tmp_path / "shared", "sft", 1)
    assert "shared_stage" not in first  # sft trained it
    for m in ("ewc", "replay", "lwf", *stacked):
        train1, eval1 = _stage(tmp_path / "shared", m, 1)
        assert train1["shared_stage"] == keys[0]
        assert train1["steps"] == first["steps"] and train1["final_loss"] == first["final_loss"]
        train2, _ = _stage(tmp_path / "shared", m, 2)
        assert "shared_stage" not in train2  # stage 2 differs by method: always trained

    # the same runs with nothing shared give the same numbers: loading the stage is the training, bit for bit
    alone = run(cfg, tmp_path / "alone", progress=False, report=False, stage_cache=None)
    assert not (tmp_path / "alone" / "shared-stages").exists()
    for m in methods:
        assert _final_em(alone, m) == _final_em(shared, m), m
        assert _stage(tmp_path / "alone", m, 1)[0]["final_loss"] == first["final_loss"], m  # trained alike alone
        a2, _ = _stage(tmp_path / "alone", m, 2)
        s2, _ = _stage(tmp_path / "shared", m, 2)
        assert a2["final_loss"] == s2["final_loss"], m

    # the stored adapter has the weights the training produced
    base = load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False)
    base.load_adapter("seq", cache / keys[0] / "seq")
    stored = weights_digest(adapter_parameters(base.peft, "seq"))
    states = {json.loads(line)["state"] for line in
              (tmp_path / "alone" / "methods" / "ewc" / "outputs.jsonl").read_text().splitlines()}
    assert f"seq-{stored}" in states  # the state ewc evaluated after training stage 1 itself

    # the shared stage's outputs are generated once too: the others answer stage 1 from the shared outputs
    def generated(record, m):
        return record["methods"][m][ORDER]["timing"]["generated_this_run"]
    assert generated(shared, "sft") == generated(alone, "sft")
    for m in ("ewc", "replay", "lwf"):
        assert generated(shared, m) < generated(alone, m), m
        own = (tmp_path / "shared" / "methods" / m / "outputs.jsonl").read_text().splitlines()
        assert any(json.loads(line)["state"] == f"seq-{stored}" for line in own)  # copied into its own file


def test_the_key_changes_with_anything_the_training_reads():
    class Ex:
        def __init__(self, ids):
            self.input_ids, self.labels = ids, ids
    base = dict(base_identity={"name": "m", "digest": "d"}, start_digest="s", examples=[Ex([1, 2])],
                train_config={"lr": 2e-3}, seed=1, device="cpu")
    k = StageCache.key(**base)
    assert StageCache.key(**base) == k
    for change in ({"train_config": {"lr": 5e-4}}, {"seed": 2}, {"start_digest": "t"}, {"device": "cuda"},
                   {"examples": [Ex([1, 3])]}, {"examples": [Ex([1, 2]), Ex([1, 2])]},
                   {"base_identity": {"name": "m", "digest": "e"}}):
        assert StageCache.key(**{**base, **change}) != k, change


def test_only_a_first_stage_without_a_term_at_the_recipes_adapter_is_shared():
    from skillbank.method_registry import method_class
    from skillbank.continual.methods.stacked import OLoRAParams
    from skillbank.train.executor import TrainConfig
    recipe = TrainConfig(rank=64, target_modules=("q_proj", "k_proj", "v_proj", "o_proj"))
    olora = method_class("olora")
    assert olora.first_stage_recipe(recipe, OLoRAParams(lambda_orth=0.5)) == recipe
    official = olora.first_stage_recipe(recipe, OLoRAParams(rank=8, target_modules=["q_proj", "v_proj"]))
    assert official.rank == 8 and official.target_modules == ("q_proj", "v_proj")  # its own stage 1
    assert olora.first_stage_recipe(recipe, OLoRAParams(lambda_l2=0.1)) is None  # a term from stage 1 on
    assert method_class("sft").first_stage_recipe(recipe, method_class("sft").Params()) == recipe
    assert method_class("fsm").first_stage_recipe(recipe, method_class("fsm").Params()) is None
