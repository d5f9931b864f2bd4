"""Each continual method's distinctive piece, on the tiny model: LwF's distillation, EWC's penalty and
Fisher, O-LoRA's orthogonality term, Progressive stacking, Replay's buffer budget."""
from pathlib import Path

import pytest
import torch

from skillbank.continual.methods import METHODS, MethodContext
from skillbank.continual.methods.sequential import (ADAPTER, DistillationTerm, ReplayBuffer, distillation_loss,
                                                    estimate_fisher, ewc_penalty)
from skillbank.continual.methods.stacked import lora_A_by_module, orthogonality_loss, stage_adapter
from skillbank.model.base import BaseModelConfig, load_base
from skillbank.train.executor import TrainConfig, add_lora, build_examples
from skillbank.train.loop import StepContext, adapter_parameters, collate, target_logits

CFG = TrainConfig(epochs=1, batch_size=4, rank=4, alpha=8, target_format="compact", lr=5e-3)


@pytest.fixture()
def base(tiny_model_dir):
    return load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False)


def ctx_for(base, stream, tmp_path, order="T1,T2,T3"):
    return MethodContext(base=base, train=CFG, stream=stream, order_name=order, order=stream.order(order),
                         workdir=Path(tmp_path), progress=False)


# -- LwF -----------------------------------------------------------------------------------------------
def test_distillation_loss_is_temperature_scaled_kl():
    torch.manual_seed(0)
    s, t = torch.randn(5, 11), torch.randn(5, 11)
    assert distillation_loss(s, s.clone(), 2.0).item() == pytest.approx(0.0, abs=1e-6)
    T = 2.0
    p_t = torch.softmax(t / T, -1)
    manual = (p_t * (torch.log(p_t) - torch.log_softmax(s / T, -1))).sum(-1).mean() * T * T
    assert distillation_loss(s, t, T).item() == pytest.approx(manual.item(), rel=1e-5)


def test_lwf_teacher_is_a_frozen_copy_and_only_the_student_gets_gradients(base, small_stream, tmp_path):
    method = METHODS["lwf"](ctx_for(base, small_stream, tmp_path))
    fam = small_stream.family_keys[0]
    method.learn(1, fam, small_stream.train[fam])
    terms = method.loss_terms(2)  # snapshots the teacher
    assert len(terms) == 1 and "teacher" in base.adapter_names
    student = adapter_parameters(base.peft, ADAPTER)
    teacher = adapter_parameters(base.peft, "teacher")
    for n, p in student.items():
        assert torch.equal(p, teacher[n.replace(f".{ADAPTER}.", ".teacher.")])
    examples, _ = build_examples(base, small_stream.train[fam][:2], CFG, method.stream_prefix)
    peft = base.activate([ADAPTER])
    device = next(peft.parameters()).device
    batch = {k: v.to(device) for k, v in collate(examples, base.tokenizer.pad_token_id).items()}
    for p in student.values():
        p.requires_grad_(True)
    lm = peft.get_base_model()
    logits, labels = target_logits(lm, batch)
    ctx = StepContext(lm, base, batch, logits, labels, 0, student)
    assert terms[0](ctx).item() == pytest.approx(0.0, abs=1e-5)  # student == teacher
    with torch.no_grad():  # move the student away from the teacher
        next(p for n, p in student.items() if "lora_B" in n).add_(0.5)
    logits, labels = target_logits(lm, batch)
    value = terms[0](StepContext(lm, base, batch, logits, labels, 0, student))
    assert value.item() > 0
    value.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in student.values())
    assert all(p.grad is None for p in teacher.values())
    assert base.peft.base_model.active_adapters == [ADAPTER]  # the swap restored the student


# -- EWC -----------------------------------------------------------------------------------------------
def test_ewc_penalty_matches_hand_computation_and_is_zero_at_the_anchor():
    p = {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([[0.5]])}
    anchor = {"a": torch.tensor([0.0, 2.0]), "b": torch.tensor([[1.5]])}
    fisher = {"a": torch.tensor([2.0, 7.0]), "b": torch.tensor([[3.0]])}
    # 0.5 * lam * (2*1^2 + 7*0 + 3*1^2) = 0.5 * 4 * 5
    assert ewc_penalty(p, fisher, anchor, 4.0).item() == pytest.approx(10.0)
    assert ewc_penalty(anchor, fisher, anchor, 4.0).item() == 0.0


def test_ewc_fisher_is_normalised_and_penalty_pulls_back_to_the_anchor(base, small_stream, tmp_path):
    method = METHODS["ewc"](ctx_for(base, small_stream, tmp_path))
    fam = small_stream.family_keys[0]
    method.learn(1, fam, small_stream.train[fam])
    assert method.fisher and set(method.fisher) == set(adapter_parameters(base.peft, ADAPTER))
    total = sum(float(f.sum()) for f in method.fisher.values())
    count = sum(f.numel() for f in method.fisher.values())
    assert total / count == pytest.approx(1.0, rel=1e-4)
    assert all(bool((f >= 0).all()) for f in method.fisher.values())
    [term] = method.loss_terms(2)
    params = adapter_parameters(base.peft, ADAPTER)
    assert ewc_penalty(params, method.fisher, method.anchor, 1.0).item() == pytest.approx(0.0, abs=1e-9)
    name, p = max(params.items(), key=lambda kv: float(method.fisher[kv[0]].sum()))
    with torch.no_grad():
        p.add_(0.1)
    p.requires_grad_(True)
    value = ewc_penalty(params, method.fisher, method.anchor, 1.0)
    value.backward()
    assert value.item() > 0 and float((p.grad * 0.1).sum()) > 0  # the gradient points back to the anchor


def test_ewc_state_survives_save_and_load(base, small_stream, tmp_path):
    method = METHODS["ewc"](ctx_for(base, small_stream, tmp_path))
    fam = small_stream.family_keys[0]
    method.learn(1, fam, small_stream.train[fam])
    method.save(tmp_path / "state")
    fresh = METHODS["ewc"](ctx_for(base, small_stream, tmp_path))
    fresh.load(tmp_path / "state", 1)
    assert fresh.state_id == method.state_id
    assert all(torch.equal(fresh.fisher[n], method.fisher[n]) for n in method.fisher)


# -- O-LoRA ----------------------------------------------------------------------------------------------
def test_orthogonality_loss_is_l1_of_A_products():
    a_new = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], requires_grad=True)
    a_orth = torch.tensor([[0.0, 0.0, 1.0]])
    a_mix = torch.tensor([[1.0, -2.0, 0.0]])
    trainable = {"m.lora_A.stage-2.weight": a_new, "m.lora_B.stage-2.weight": torch.ones(2, 2)}
    assert orthogonality_loss(trainable, {"m": [a_orth]}, "stage-2", 1.0, 0.0).item() == 0.0
    # A_new @ A_mix^T = [1, -2] -> L1 = 3, weighted 0.5
    assert orthogonality_loss(trainable, {"m": [a_mix]}, "stage-2", 0.5, 0.0).item() == pytest.approx(1.5)
    # L2 term: |A|^2 = 2, |B|^2 = 4
    assert orthogonality_loss(trainable, {}, "stage-2", 0.0, 0.1).item() == pytest.approx(0.6)


def test_olora_term_sees_every_earlier_adapter(base, small_stream, tmp_path):
    method = METHODS["olora"](ctx_for(base, small_stream, tmp_path), METHODS["olora"].Params(lambda_orth=1.0))
    f1, f2 = small_stream.family_keys[:2]
    assert method.loss_terms(1) == []  # nothing earlier to be orthogonal to
    method.learn(1, f1, small_stream.train[f1])
    [term] = method.loss_terms(2)
    assert all(len(v) == 1 for v in term.frozen_A.values()) and term.frozen_A
    summary = method.learn(2, f2, small_stream.train[f2])
    assert "orth" in summary["terms"] and summary["terms"]["orth"] > 0
    a1 = lora_A_by_module(adapter_parameters(base.peft, stage_adapter(1)), stage_adapter(1))
    a2 = lora_A_by_module(adapter_parameters(base.peft, stage_adapter(2)), stage_adapter(2))
    assert set(a1) == set(a2) and a1


# -- Progressive stacking ----------------------------------------------------------------------------------
def test_progressive_stacks_frozen_adapters_and_runs_them_all(base, small_stream, tmp_path):
    method = METHODS["progressive"](ctx_for(base, small_stream, tmp_path))
    f1, f2 = small_stream.family_keys[:2]
    method.learn(1, f1, small_stream.train[f1])
    first = {n: p.detach().clone() for n, p in adapter_parameters(base.peft, stage_adapter(1)).items()}
    state1 = method.state_id
    method.learn(2, f2, small_stream.train[f2])
    after = adapter_parameters(base.peft, stage_adapter(1))
    assert all(torch.equal(first[n], after[n]) for n in first)  # the earlier adapter stayed frozen
    assert method.adapters == ["stage-1", "stage-2"] and method.state_id != state1
    batch = collate(build_examples(base, small_stream.test[f1][:1], CFG, method.stream_prefix)[0],
                    base.tokenizer.pad_token_id)
    batch = {k: v.to(next(base.peft.parameters()).device) for k, v in batch.items()}
    with method.model_for(method.state_id) as model:
        assert list(model.base_model.active_adapters) == ["stage-1", "stage-2"]
        both = model(input_ids=batch["input_ids"]).logits
    with method.adapters_active(["stage-2"]) as model:
        only_new = model(input_ids=batch["input_ids"]).logits
    assert not torch.allclose(both, only_new)


# -- Replay ---------------------------------------------------------------------------------------------
def test_replay_buffer_never_exceeds_its_budget(small_stream):
    buf = ReplayBuffer(per_stage=4, seed=0)
    for t, fam in enumerate(small_stream.family_keys, 1):
        buf.add_stage(fam, small_stream.train[fam], t)
        assert len(buf) <= buf.budget == 4 * t
        assert all(len(v) <= 4 for v in buf.kept.values())
    again = ReplayBuffer(per_stage=4, seed=0)
    fam = small_stream.family_keys[0]
    again.add_stage(fam, small_stream.train[fam], 1)
    assert again.ids()[fam] == buf.ids()[fam]  # seeded: the same draw on a rerun


def test_replay_mixes_the_buffer_into_later_stages(base, small_stream, tmp_path):
    method = METHODS["replay"](ctx_for(base, small_stream, tmp_path), METHODS["replay"].Params(per_stage=2))
    f1, f2 = small_stream.family_keys[:2]
    assert method.training_records(1, f1, small_stream.train[f1]) == small_stream.train[f1]
    method.learn(1, f1, small_stream.train[f1])
    mix = method.training_records(2, f2, small_stream.train[f2])
    assert len(mix) == len(small_stream.train[f2]) + 2
    assert sum(r.family == f1 for r in mix) == 2
    method.save(tmp_path / "s")
    fresh = METHODS["replay"](ctx_for(base, small_stream, tmp_path), METHODS["replay"].Params(per_stage=2))
    fresh.load(tmp_path / "s", 1)
    assert fresh.buffer.ids() == method.buffer.ids()
