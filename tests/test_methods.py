"""Each continual method's distinctive piece, on the tiny model: LwF's distillation, EWC's penalty and
Fisher, O-LoRA's orthogonality term and own adapter shape, Stacked-LoRA and routed Progressive-LoRA,
Replay's buffer budget; and the method registry."""
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


def move_every_lora_b(params, by=0.5):
    """Every B, not one: the tiny stage-1 adapter's softmax is saturated (max probability >= 0.997 at each
    target position), and one module's change can leave the distribution equal within float precision."""
    with torch.no_grad():
        for name, p in params.items():
            if "lora_B" in name:
                p.add_(by)


# -- LwF -----------------------------------------------------------------------------------------------
def test_distillation_loss_is_the_softened_kl_without_t_squared():
    torch.manual_seed(0)
    s, t = torch.randn(5, 11), torch.randn(5, 11)
    assert distillation_loss(s, s.clone(), 2.0).item() == pytest.approx(0.0, abs=1e-6)
    T = 2.0
    p_t = torch.softmax(t / T, -1)
    manual = (p_t * (torch.log(p_t) - torch.log_softmax(s / T, -1))).sum(-1).mean()  # Avalanche's form
    assert distillation_loss(s, t, T).item() == pytest.approx(manual.item(), rel=1e-5)
    # T^2 only when asked for (Hinton et al.'s scaling; what runs before the option used)
    assert distillation_loss(s, t, T, t_squared=True).item() == pytest.approx(manual.item() * T * T, rel=1e-5)
    assert METHODS["lwf"].Params().t_squared is False


def test_distillation_term_weight_multiplies_the_kl(base, small_stream, tmp_path):
    """weight 1 at T = 2 is the references' setting: the term equals the KL, not 4 times it."""
    method = METHODS["lwf"](ctx_for(base, small_stream, tmp_path))
    fam = small_stream.family_keys[0]
    method.learn(1, fam, small_stream.train[fam])
    method.loss_terms(2)  # snapshots the teacher
    student = adapter_parameters(base.peft, ADAPTER)
    move_every_lora_b(student)
    examples, _ = build_examples(base, small_stream.train[fam][:2], CFG, method.stream_prefix)
    peft = base.activate([ADAPTER])
    device = next(peft.parameters()).device
    batch = {k: v.to(device) for k, v in collate(examples, base.tokenizer.pad_token_id).items()}
    lm = peft.get_base_model()
    with torch.no_grad():
        logits, labels = target_logits(lm, batch)
        ctx = StepContext(lm, base, batch, logits, labels, 0, student)
        plain = DistillationTerm("teacher", 2.0, 1.0)(ctx).item()
        scaled = DistillationTerm("teacher", 2.0, 1.0, t_squared=True)(ctx).item()
        half = DistillationTerm("teacher", 2.0, 0.5)(ctx).item()
    assert plain > 0 and scaled == pytest.approx(4 * plain, rel=1e-4) and half == pytest.approx(plain / 2, rel=1e-4)


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
    move_every_lora_b(student)  # away from the teacher
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
    # lambda_2 term: Frobenius norms, not squared (O-LoRA's torch.norm per matrix): |A| = sqrt 2, |B| = 2
    assert orthogonality_loss(trainable, {}, "stage-2", 0.0, 0.1).item() == pytest.approx(0.1 * (2 ** 0.5 + 2))
    # summed over earlier adapters j: the L1 of the product with each one
    assert orthogonality_loss(trainable, {"m": [a_mix, a_mix]}, "stage-2", 0.5, 0.0).item() == pytest.approx(3.0)


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


def test_olora_can_use_its_own_rank_and_target_modules(base, small_stream, tmp_path):
    params = METHODS["olora"].Params(rank=2, target_modules=["q_proj", "v_proj"])
    method = METHODS["olora"](ctx_for(base, small_stream, tmp_path), params)
    f1, f2 = small_stream.family_keys[:2]
    method.learn(1, f1, small_stream.train[f1])
    summary = method.learn(2, f2, small_stream.train[f2])
    assert summary["config"]["rank"] == 2 and summary["config"]["target_modules"] == ["q_proj", "v_proj"]
    assert summary["config"]["alpha"] == pytest.approx(CFG.alpha * 2 / CFG.rank)  # the recipe's alpha/r kept
    a2 = lora_A_by_module(adapter_parameters(base.peft, stage_adapter(2)), stage_adapter(2))
    assert a2 and all(w.shape[0] == 2 for w in a2.values())
    assert {m.rsplit(".", 1)[-1] for m in a2} == {"q_proj", "v_proj"}
    method.save(tmp_path / "s")
    fresh = METHODS["olora"](ctx_for(base, small_stream, tmp_path), params)
    fresh.load(tmp_path / "s", 2)
    assert fresh.state_id == method.state_id
    # unset: the shared recipe's adapter
    assert METHODS["olora"](ctx_for(base, small_stream, tmp_path)).adapter_config is CFG
    assert METHODS["olora"].Params(rank=8, alpha=32).model_dump() == {
        "lambda_orth": 0.5, "lambda_l2": 0.0, "rank": 8, "alpha": 32.0}


# -- Stacked-LoRA (summed, unrouted) and Progressive-LoRA (routed) ------------------------------------------
def test_stacked_stacks_frozen_adapters_and_runs_them_all(base, small_stream, tmp_path):
    method = METHODS["stacked"](ctx_for(base, small_stream, tmp_path))
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
    queries = method.queries(2, small_stream.test[f1][:2])
    assert list(queries) == ["stacked"] and {q.state for q in queries["stacked"]} == {method.state_id}
    assert all(q.route is None for q in queries["stacked"])


def test_progressive_routed_answers_family_j_with_adapters_1_to_j(base, small_stream, tmp_path):
    ctx = ctx_for(base, small_stream, tmp_path)
    method = METHODS["progressive-routed"](ctx)
    f1, f2 = ctx.order[:2]
    method.learn(1, f1, small_stream.train[f1])
    first = {n: p.detach().clone() for n, p in adapter_parameters(base.peft, stage_adapter(1)).items()}
    column1 = method.columns[0]
    method.learn(2, f2, small_stream.train[f2])
    after = adapter_parameters(base.peft, stage_adapter(1))
    assert all(torch.equal(first[n], after[n]) for n in first)  # trained as stacked: stage 1 frozen
    assert method.columns[0] == column1 and len(method.columns) == 2 and column1 != method.columns[1]
    records = small_stream.test[f1][:2] + small_stream.test[f2][:2]
    queries = method.queries(2, records)
    assert set(queries) == {"progressive-routed", "progressive-oracle", "stacked"}
    # the summed, unrouted reading from the same training: the last column (every adapter) for every request
    assert [q.state for q in queries["stacked"]] == [method.columns[1]] * 4
    assert all(q.route is None and set(q.skills) == set(method.seen_skills(2)) for q in queries["stacked"])
    oracle = queries["progressive-oracle"]
    assert [q.route for q in oracle] == [f1, f1, f2, f2]
    assert [q.state for q in oracle] == [method.columns[0]] * 2 + [method.columns[1]] * 2
    assert set(oracle[0].skills) == set(small_stream.catalog.family(f1).skills)  # column 1 knows family 1
    assert set(oracle[2].skills) == set(method.seen_skills(2))
    routed = queries["progressive-routed"]
    for q in routed:  # the Address Memory's choice picks the column
        assert q.route in (f1, f2) and q.state == method.columns[method.column(q.route) - 1]
    with method.model_for(method.columns[0]) as model:
        assert list(model.base_model.active_adapters) == ["stage-1"]
    with method.model_for(method.columns[1]) as model:
        assert list(model.base_model.active_adapters) == ["stage-1", "stage-2"]
    method.save(tmp_path / "s")
    fresh = METHODS["progressive-routed"](ctx_for(base, small_stream, tmp_path))
    fresh.load(tmp_path / "s", 2)
    assert fresh.columns == method.columns
    assert [q.route for q in fresh.queries(2, records)["progressive-routed"]] == [q.route for q in routed]


def test_the_old_progressive_name_is_the_stacked_method_under_that_name():
    from skillbank.continual.methods import method_class
    from skillbank.method_registry import deprecation
    old = method_class("progressive")
    assert "progressive" not in METHODS and issubclass(old, METHODS["stacked"]) and old.name == "progressive"
    assert "summed, unrouted" in old.title and "progressive-routed" in deprecation("progressive")
    assert deprecation("stacked") is None


# -- Replay ---------------------------------------------------------------------------------------------
def test_replay_budget_is_per_stage_or_a_fraction_never_both(small_stream):
    from pydantic import ValidationError
    Params = METHODS["replay"].Params
    assert Params().per_stage == 100 and Params().fraction is None
    assert Params().model_dump() == {"per_stage": 100}  # as saved before the fraction existed
    assert Params(fraction=0.1).model_dump() == {"fraction": 0.1}
    with pytest.raises(ValidationError, match="not both"):
        Params(per_stage=5, fraction=0.1)
    for bad in ({"fraction": 0}, {"fraction": 1.5}, {"per_stage": 0}):
        with pytest.raises(ValidationError):
            Params(**bad)
    with pytest.raises(ValueError, match="exactly one"):
        ReplayBuffer(per_stage=None)
    buf = ReplayBuffer(per_stage=None, fraction=0.25, seed=0)
    sizes = []
    for t, fam in enumerate(small_stream.family_keys, 1):
        n = len(small_stream.train[fam])
        buf.add_stage(fam, small_stream.train[fam], t)
        sizes.append(n)
        assert len(buf.kept[fam]) == max(1, int(0.25 * n + 0.5))
        assert len(buf) <= buf.budget == sum(max(1, int(0.25 * m + 0.5)) for m in sizes)
    assert ReplayBuffer(per_stage=None, fraction=0.001).quota(10) == 1  # at least one record of a stage
    assert ReplayBuffer(per_stage=None, fraction=1.0).quota(10) == 10


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


def test_replay_with_a_fraction_keeps_that_share_of_each_stage(base, small_stream, tmp_path):
    params = METHODS["replay"].Params(fraction=0.5)
    method = METHODS["replay"](ctx_for(base, small_stream, tmp_path), params)
    f1, f2 = small_stream.family_keys[:2]
    method.learn(1, f1, small_stream.train[f1])
    mix = method.training_records(2, f2, small_stream.train[f2])
    assert sum(r.family == f1 for r in mix) == max(1, int(0.5 * len(small_stream.train[f1]) + 0.5))
    method.save(tmp_path / "s")
    fresh = METHODS["replay"](ctx_for(base, small_stream, tmp_path), params)
    fresh.load(tmp_path / "s", 1)
    assert fresh.buffer.ids() == method.buffer.ids() and fresh.buffer.budget == method.buffer.budget


# -- FSM -------------------------------------------------------------------------------------------------
def test_fsm_second_order_generates_with_shards_of_the_first(tiny_model_dir, small_stream, tmp_path):
    """The runner gives each order a fresh base, and the bank opens lazily: the second order reuses the
    first order's shard without training, so nothing has loaded it when an output is missing from the cache."""
    f1 = small_stream.family_keys[0]
    fresh_start = METHODS["fsm"].Params(init="fresh")  # order-independent executors (the default merge trains each order's own)
    first = METHODS["fsm"](ctx_for(load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False),
                                   small_stream, tmp_path), fresh_start)
    first.learn(1, f1, small_stream.train[f1])
    fresh = load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False)
    second = METHODS["fsm"](ctx_for(fresh, small_stream, tmp_path, order="T1,T3,T2"), fresh_start)
    assert second.learn(1, f1, small_stream.train[f1])["reused_from_earlier_order"] is True
    [query] = second.queries(1, small_stream.test[f1][:1])["oracle"]
    with second.model_for(query.state) as model:
        assert list(model.base_model.active_adapters) == [f1]


# -- the registry -----------------------------------------------------------------------------------------------
def test_every_registered_name_resolves_to_its_class():
    from skillbank.continual.methods import UnknownMethodError, method_class
    from skillbank.method_registry import METHOD_PATHS, method_names
    assert list(METHODS) == list(METHOD_PATHS) == method_names()
    assert method_names(deprecated=True)[-1] == "progressive"
    for name, cls in METHODS.items():
        assert cls.name == name and method_class(name) is cls
    with pytest.raises(UnknownMethodError, match="unknown method 'sgd'"):
        method_class("sgd")
