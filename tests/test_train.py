"""Executor training: config validation, LoRA-only updates, adapters on one base, and one real-model smoke test."""
from __future__ import annotations

import random

import pytest
import torch

from skillbank.data.records import Record
from skillbank.errors import ModelError
from skillbank.graph import TaskGraph
from skillbank.model.base import BaseModelConfig, load_base
from skillbank.model.generate import generate_for_requests
from skillbank.model.serialization import decode
from skillbank.model.tiny import make_tiny_model
from skillbank.train.executor import (TrainConfig, common_prefix, freeze_all, length_grouped_batches, top_layers,
                                      train_executor)

P = "Builtin::t1_daily_life::"


def records(n: int = 16) -> list[Record]:
    out = []
    for i in range(n):
        skill = ("book_flight", "set_alarm")[i % 2]
        g = TaskGraph.from_dict({"task_nodes": [{"task": P + skill, "arguments": [{"name": "x", "value": str(i % 4)}]}],
                                 "task_links": []})
        out.append(Record(f"r{i}", "t1_daily_life", f"please {skill.replace('_', ' ')} number {i % 4}", g))
    return out


@pytest.fixture()
def tiny(tmp_path_factory):
    """A fresh tiny base per test: training injects adapters into the model in place."""
    path = tmp_path_factory.getbasetemp() / "tiny-train"
    if not (path / "config.json").exists():
        make_tiny_model(path, seed=0)
    return load_base(BaseModelConfig(name=str(path)), progress=False)


def base_bytes(model) -> dict[str, bytes]:
    """Every non-LoRA tensor of the model, as raw bytes (keys normalised to the plain model's names)."""
    out = {}
    for k, v in model.state_dict().items():
        if "lora_" in k:
            continue
        k = k.replace("base_model.model.", "").replace(".base_layer", "")
        out[k] = v.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    return out


FAST = dict(epochs=3, batch_size=8, lr=2e-2, warmup_ratio=0.0, target_modules=("q_proj", "k_proj", "v_proj", "o_proj",
                                                                              "gate_proj", "up_proj", "down_proj"))


# -- config --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, match", [
    ({"rank": 0}, r"TrainConfig\.rank"),
    ({"epochs": 1.5}, r"TrainConfig\.epochs"),
    ({"batch_size": -1}, r"TrainConfig\.batch_size"),
    ({"grad_accum": 0}, r"TrainConfig\.grad_accum"),
    ({"alpha": 0}, r"TrainConfig\.alpha"),
    ({"dropout": 1.0}, r"TrainConfig\.dropout"),
    ({"lr": 0}, r"TrainConfig\.lr"),
    ({"warmup_ratio": 1.0}, r"TrainConfig\.warmup_ratio"),
    ({"weight_decay": -0.1}, r"TrainConfig\.weight_decay"),
    ({"max_length": 4}, r"TrainConfig\.max_length"),
    ({"target_modules": "q_proj"}, r"TrainConfig\.target_modules"),
    ({"layers_to_transform": ()}, r"TrainConfig\.layers_to_transform"),
    ({"layers_to_transform": (-1,)}, r"TrainConfig\.layers_to_transform"),
    ({"target_format": "xml"}, r"TrainConfig\.target_format"),
    ({"precision": "fp16"}, r"TrainConfig\.precision"),
    ({"attention": "flash"}, r"TrainConfig\.attention"),
    ({"max_grad_norm": 0}, r"TrainConfig\.max_grad_norm"),
])
def test_config_validation_names_the_parameter(kwargs, match):
    with pytest.raises(ModelError, match=match):
        TrainConfig(**kwargs)


def test_config_round_trips_through_dict():
    cfg = TrainConfig(layers_to_transform=[5, 3, 5], target_format="compact")
    assert cfg.layers_to_transform == (3, 5)
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ModelError, match="unknown TrainConfig field"):
        TrainConfig.from_dict({"rnak": 8})


def test_helpers():
    assert top_layers(30, 15) == tuple(range(15, 30))
    with pytest.raises(ModelError):
        top_layers(4, 5)
    assert common_prefix([P + "a", P + "b"]) == P and common_prefix(["A::x::a", "B::x::b"]) == ""
    lengths = [random.Random(0).randint(5, 50) for _ in range(37)]
    batches = length_grouped_batches(lengths, 8, random.Random(1))
    assert sorted(i for b in batches for i in b) == list(range(37))
    assert batches == length_grouped_batches(lengths, 8, random.Random(1))


# -- training --------------------------------------------------------------------------------------------
def test_training_reduces_loss_and_changes_only_lora(tiny):
    before = base_bytes(tiny.model)
    model, s = train_executor(tiny, records(), TrainConfig(**FAST, target_format="compact"), adapter_name="t1",
                              progress=False)
    assert model is tiny.peft and tiny.active_adapter == "t1"
    assert s.steps == 3 * 2 and s.examples == 16 and s.epochs == 3 and s.dropped_too_long == 0
    assert s.loss_curve[-1] < s.loss_curve[0] - 0.5
    assert s.target_tokens < s.total_tokens <= s.padded_tokens and s.tokens_per_second > 0
    assert s.family_prefix == P and s.trainable_parameters > 0 and s.to_dict()["config"]["target_format"] == "compact"
    assert base_bytes(tiny.peft) == before  # the base weights did not move
    assert not any(p.requires_grad for p in tiny.peft.parameters()) and not tiny.peft.training
    lora = [v for k, v in tiny.peft.state_dict().items() if "lora_B" in k]
    assert lora and any(v.abs().sum() > 0 for v in lora)  # lora_B starts at zero: it was trained


def test_second_adapter_leaves_first_unchanged_and_switches(tiny, tmp_path):
    recs = records()
    train_executor(tiny, recs, TrainConfig(**FAST), adapter_name="first", progress=False)
    first = {k: v.clone() for k, v in tiny.peft.state_dict().items() if ".first." in k}
    out_first = generate_for_requests(tiny.peft, tiny.tokenizer, [recs[0].request], max_new_tokens=8)[0]
    train_executor(tiny, recs[:8], TrainConfig(**FAST, seed=3), adapter_name="second", progress=False)
    assert tiny.adapter_names == ["first", "second"] and tiny.active_adapter == "second"
    now = {k: v for k, v in tiny.peft.state_dict().items() if ".first." in k}
    assert first.keys() == now.keys() and all(torch.equal(first[k], now[k]) for k in first)
    # Switching back gives the first executor's behaviour, frozen; a saved copy loads back the same.
    tiny.activate("first")
    assert not any(p.requires_grad for p in tiny.peft.parameters())
    again = generate_for_requests(tiny.peft, tiny.tokenizer, [recs[0].request], max_new_tokens=8)[0]
    assert again == out_first
    saved = tiny.save_adapter("first", tmp_path / "shard")
    assert sorted(p.name for p in saved.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    tiny.load_adapter("first_copy", saved)
    assert not any(p.requires_grad for p in tiny.peft.parameters())
    copy = generate_for_requests(tiny.peft, tiny.tokenizer, [recs[0].request], max_new_tokens=8)[0]
    assert copy.text == out_first.text
    with pytest.raises(ModelError, match="already loaded"):
        train_executor(tiny, recs, TrainConfig(**FAST), adapter_name="first", progress=False)
    with pytest.raises(ModelError, match="no adapter named"):
        tiny.activate("missing")


def test_training_errors(tiny):
    with pytest.raises(ModelError, match="no training records"):
        train_executor(tiny, [], adapter_name="x", progress=False)
    with pytest.raises(ModelError, match="layers 0..1"):
        train_executor(tiny, records(), TrainConfig(layers_to_transform=(5,)), adapter_name="x", progress=False)
    with pytest.raises(ModelError, match="longer than TrainConfig.max_length"):
        train_executor(tiny, records(), TrainConfig(max_length=8), adapter_name="x", progress=False)
    with pytest.raises(ModelError, match="cannot add LoRA adapter"):
        train_executor(tiny, records(), TrainConfig(target_modules=("nope_proj",)), adapter_name="x", progress=False)
    assert "x" not in tiny.adapter_names


def test_freeze_all_after_peft_set_adapter(tiny):
    train_executor(tiny, records(4), TrainConfig(epochs=1), adapter_name="solo", progress=False)
    tiny.peft.set_adapter("solo")  # peft marks the active adapter trainable again ...
    assert any(p.requires_grad for p in tiny.peft.parameters())
    freeze_all(tiny.peft)  # ... which is why every switch must freeze explicitly
    assert not any(p.requires_grad for p in tiny.peft.parameters())


# -- the real embedded model ------------------------------------------------------------------------------
@pytest.mark.real_model
def test_real_model_trains_one_step_and_generates():
    base = load_base(progress=False)  # through the converted cache (converted on first use)
    assert base.identity["name"] == "embedded" and base.identity["num_layers"] == 30
    cfg = TrainConfig(epochs=1, batch_size=2, rank=4, dropout=0.0, target_format="compact",
                      layers_to_transform=top_layers(30, 2), target_modules=("q_proj", "v_proj"))
    model, s = train_executor(base, records(2), cfg, adapter_name="smoke", progress=False)
    assert s.steps == 1 and s.final_loss > 0
    out = generate_for_requests(model, base.tokenizer, [records(1)[0].request], max_new_tokens=12)[0]
    assert 1 <= out.n_tokens <= 12 and out.mean_logprob <= 0
    decode(out.text, "compact", P)  # whatever it says, decoding does not raise


def test_small_cpu_preset():
    cfg = TrainConfig.for_small_cpu(epochs=4)
    assert (cfg.target_format, cfg.dropout, cfg.lr, cfg.epochs, cfg.rank) == ("compact", 0.0, 2e-3, 4, 16)


def perturbed_adapter(tiny, name: str):
    """A rank-4 adapter ``name`` whose weights are random (a fresh LoRA's B is zero: the adapter's weights then have
    something to differ on), trainable, with six examples and their collated batch."""
    from skillbank.train.executor import add_lora, build_examples
    from skillbank.train.loop import collate

    cfg = TrainConfig(rank=4, alpha=8, dropout=0.0, target_format="compact")
    examples, _ = build_examples(tiny, records(6), cfg, P)
    peft = add_lora(tiny, name, cfg)
    tiny.activate([name])
    params = [p for n, p in peft.named_parameters() if "lora_" in n and f".{name}." in n]
    with torch.no_grad():
        for p in params:
            p.normal_(std=0.05)
    for p in params:
        p.requires_grad_(True)
    return peft, params, examples, collate(examples, tiny.tokenizer.pad_token_id)


def test_the_shared_prompt_head_runs_once_with_the_same_logits_and_gradients(tiny):
    """The training forward may run the prompt head every row shares (system instruction, chat markup) once and
    let the rows attend to its keys and values: the target logits and the adapter's gradients are those of the
    whole batch's forward, to float rounding."""
    from skillbank.train.loop import collate, shared_head_length, target_logits

    peft, params, examples, batch = perturbed_adapter(tiny, "head")
    head = shared_head_length(batch)
    prompt = batch["labels"][0].ne(-100).nonzero()[0].item()
    assert 8 <= head < prompt  # the system turn and "Plan the following request:", not a request's own words
    lm = peft.get_base_model()
    results = []
    for share in (False, True):
        for p in params:
            p.grad = None
        logits, labels = target_logits(lm, batch, share_head=share)
        torch.nn.functional.cross_entropy(logits.float(), labels).backward()
        results.append((logits.detach(), labels, [p.grad.clone() for p in params]))
    (whole, labels_a, grads_a), (shared, labels_b, grads_b) = results
    assert torch.equal(labels_a, labels_b)
    torch.testing.assert_close(shared, whole, rtol=1e-4, atol=1e-4)
    for a, b in zip(grads_a, grads_b):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5 * float(a.abs().max()) + 1e-8)
    # nothing to share: one row, or rows that differ from the first token
    one = collate(examples[:1], tiny.tokenizer.pad_token_id)
    assert shared_head_length(one) == 0
    odd = {k: v.clone() for k, v in batch.items()}
    odd["input_ids"][1, 0] = odd["input_ids"][0, 0] + 1
    assert shared_head_length(odd) == 0


@pytest.mark.parametrize("autocast", [False, True])
def test_training_attention_is_fp32_sdpa_on_a_cpu_and_planning_keeps_the_models_own(tiny, autocast):
    """"auto" trains with the fused attention kernel in float32 on a CPU (faster there inside a bf16 step than in
    bf16), and "eager" with transformers' own: the same target logits and adapter gradients as the model's, to rounding,
    and the model's own attention back in place once fit returns, so planning with the same model is unchanged."""
    from skillbank.train.loop import fit, resolve_attention, set_attention, target_logits

    lm = tiny.model
    own = lm.config._attn_implementation
    assert own == "sdpa"
    assert resolve_attention("auto", torch.device("cpu")) == "sdpa-fp32"
    assert resolve_attention("auto", torch.device("cuda")) is None and resolve_attention("sdpa", torch.device("cpu")) == "sdpa"
    assert resolve_attention("auto", torch.device("cpu"), has_sdpa=False) is None

    peft, params, examples, batch = perturbed_adapter(tiny, "attn")
    results = []
    for impl in ("sdpa", "sdpa-fp32", "eager"):
        for p in params:
            p.grad = None
        restore = set_attention(peft.get_base_model(), impl)
        assert peft.get_base_model().config._attn_implementation.endswith(impl.replace("-", "_"))
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=autocast):
            logits, labels = target_logits(peft.get_base_model(), batch, share_head=True)
            loss = torch.nn.functional.cross_entropy(logits.float(), labels)
        loss.backward()
        restore()
        assert lm.config._attn_implementation == own
        results.append((logits.detach().float(), [p.grad.clone() for p in params]))
    tol = 5e-2 if autocast else 1e-4  # bf16 matrix products: each way rounds its own
    for logits, grads in results[1:]:
        torch.testing.assert_close(logits, results[0][0], rtol=tol, atol=tol)
        for a, b in zip(results[0][1], grads):
            torch.testing.assert_close(b, a, rtol=tol, atol=tol * float(a.abs().max()) + 1e-8)

    for attention, used in (("auto", "skillbank_sdpa_fp32"), ("sdpa", "sdpa"), ("eager", "eager")):
        seen = []
        fit(tiny, examples, TrainConfig(**{**FAST, "epochs": 1, "attention": attention}), adapter="attn",
            progress=False, on_step=lambda step: seen.append(lm.config._attn_implementation))
        assert seen and set(seen) == {used} and lm.config._attn_implementation == own


def test_an_attention_the_model_cannot_run_is_a_clear_error(tiny):
    from skillbank.train.loop import set_attention

    with pytest.raises(ModelError, match="TrainConfig.attention 'flash_attention_2'"):
        set_attention(tiny.model, "flash_attention_2")
    assert tiny.model.config._attn_implementation == "sdpa"


def test_auto_attention_keeps_the_models_own_where_the_architecture_has_no_sdpa(tiny, monkeypatch):
    _, _, examples, _ = perturbed_adapter(tiny, "own")
    monkeypatch.setattr(tiny.model, "_supports_sdpa", False)
    seen = []
    from skillbank.train.loop import fit
    fit(tiny, examples, TrainConfig(**{**FAST, "epochs": 1}), adapter="own", progress=False,
        on_step=lambda step: seen.append(tiny.model.config._attn_implementation))
    assert seen and set(seen) == {"sdpa"}
