"""One LoRA adapter trained stage after stage, and the three classic ways to protect it.

* :class:`SequentialSFT` - plain fine-tuning on each stage in turn: the forgetting reference.
* :class:`Replay` - adds a data mix: a buffer of ``per_stage`` examples kept from every earlier stage is
  trained on together with the current stage. It stores requests, so it breaks the replay-free rule
  FSM keeps; it is the strong reference.
* :class:`LwF` - adds :class:`DistillationTerm`: the model before the stage (a frozen copy of the
  adapter) is the teacher on the current stage's inputs; KL(teacher || student) at temperature T on the
  target positions.
* :class:`EWC` - adds :class:`EWCPenalty`: (lambda/2) * sum_i F_i (theta_i - theta*_i)^2 over the adapter
  parameters, with F the diagonal empirical Fisher estimated after each stage.

All four generate closed-book with the one adapter; the evaluated state after stage t is that adapter.
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Sequence

import torch
from pydantic import Field

from skillbank.data.records import Record
from skillbank.continual.methods.base import Method, MethodParams, Query, weights_digest
from skillbank.train.executor import add_lora, summarize
from skillbank.train.loop import LossTerm, StepContext, adapter_parameters, collate, fit, swapped_adapters, target_logits

ADAPTER = "seq"


class SFTParams(MethodParams):
    address_probe: bool = Field(True, description="also answer every request with its correct skill address "
                                                  "appended (variant sft+address): separates lost access from "
                                                  "lost execution in the report; not a closed-book result")


class SequentialSFT(Method):
    name = "sft"
    title = "Sequential SFT"
    Params = SFTParams

    def __init__(self, ctx, params=None):
        super().__init__(ctx, params)
        self.state_id = ""
        self.on_step = None  # optional callback(step) during training (the forgetting-trajectory diagnostic)

    # -- the pieces subclasses change ------------------------------------------------------------------
    def training_records(self, t: int, family: str, records: Sequence[Record]) -> list[Record]:
        return list(records)

    def loss_terms(self, t: int) -> list[LossTerm]:
        return []

    def after_stage(self, t: int, family: str, records: Sequence[Record]) -> None:
        pass

    # -- shared ------------------------------------------------------------------------------------------
    def learn(self, t: int, family: str, records: Sequence[Record]) -> dict:
        cfg = self.ctx.train
        if ADAPTER not in self.base.adapter_names:
            add_lora(self.base, ADAPTER, cfg)
        data = self.training_records(t, family, records)
        examples, dropped = self.examples(data, self.stream_prefix)
        terms = self.loss_terms(t)
        result = fit(self.base, examples, cfg, adapter=ADAPTER, terms=terms, seed=cfg.seed + t, on_step=self.on_step,
                     progress=self.ctx.progress, desc=f"{self.name} stage {t} {family}")
        self.after_stage(t, family, records)
        self._refresh_state()
        summary = summarize(ADAPTER, examples, dropped, cfg, result, self.stream_prefix).to_dict()
        summary["stage_records"] = len(records)
        return summary

    def _refresh_state(self) -> None:
        self.state_id = f"{self.name}-{weights_digest(adapter_parameters(self.base.peft, ADAPTER))}"

    def queries(self, t: int, records: Sequence[Record]) -> dict[str, list[Query]]:
        prefix = self.stream_prefix
        fmt = self.ctx.train.target_format
        skills = self.seen_skills(t)
        out = {self.name: [Query(self.state_id, self.closed_book_prompt(r.request), fmt, prefix, skills=skills)
                           for r in records]}
        if getattr(self.params, "address_probe", False):
            from skillbank.continual.diagnostics import address_hint, with_text
            out[f"{self.name}+address"] = [
                Query(self.state_id, self.closed_book_prompt(with_text(r.request, address_hint(r.graph.tasks))), fmt, prefix,
                      skills=skills)
                for r in records]
        return out

    def model_for(self, state: str):
        return self.adapters_active([ADAPTER])

    def save(self, directory: Path) -> None:
        self.base.save_adapter(ADAPTER, directory / ADAPTER)

    def load(self, directory: Path, t: int) -> None:
        if ADAPTER in self.base.adapter_names:
            self.base.remove_adapter(ADAPTER)
        self.base.load_adapter(ADAPTER, directory / ADAPTER)
        self._refresh_state()


# -- Replay: a data mix ------------------------------------------------------------------------------
class ReplayParams(MethodParams):
    per_stage: int = Field(100, ge=1, description="examples kept from each finished stage")


class ReplayBuffer:
    """Up to ``per_stage`` records of every finished stage, drawn uniformly with a seeded generator.
    Its size never exceeds ``per_stage`` times the number of finished stages."""

    def __init__(self, per_stage: int, seed: int = 0):
        self.per_stage = per_stage
        self.seed = seed
        self.kept: dict[str, list[Record]] = {}

    def add_stage(self, family: str, records: Sequence[Record], t: int) -> None:
        records = list(records)
        rng = random.Random(self.seed * 1000 + t)
        self.kept[family] = rng.sample(records, min(self.per_stage, len(records)))

    def records(self) -> list[Record]:
        return [r for fam in self.kept for r in self.kept[fam]]

    def __len__(self) -> int:
        return sum(len(v) for v in self.kept.values())

    @property
    def budget(self) -> int:
        return self.per_stage * len(self.kept)

    def ids(self) -> dict[str, list[str]]:
        return {fam: [r.id for r in recs] for fam, recs in self.kept.items()}


class Replay(SequentialSFT):
    name = "replay"
    title = "Replay (100/stage)"
    Params = ReplayParams

    def __init__(self, ctx, params=None):
        super().__init__(ctx, params)
        self.buffer = ReplayBuffer(self.params.per_stage, ctx.train.seed)

    def training_records(self, t, family, records):
        return list(records) + self.buffer.records()

    def after_stage(self, t, family, records):
        self.buffer.add_stage(family, records, t)

    def save(self, directory: Path) -> None:
        super().save(directory)
        # The buffer is stored as record ids of the stream (the records themselves live in the stream).
        (directory / "replay_buffer.json").write_text(json.dumps(self.buffer.ids(), indent=1) + "\n")

    def load(self, directory: Path, t: int) -> None:
        super().load(directory, t)
        ids = json.loads((directory / "replay_buffer.json").read_text())
        by_id = {r.id: r for fam in ids for r in self.ctx.stream.train[fam]}
        self.buffer.kept = {fam: [by_id[i] for i in fam_ids] for fam, fam_ids in ids.items()}


# -- LwF: distillation from the model before the stage ---------------------------------------------
class LwFParams(MethodParams):
    temperature: float = Field(2.0, gt=0, description="softening temperature T of both distributions")
    weight: float = Field(1.0, ge=0, description="weight of the distillation term (times T^2)")


class DistillationTerm(LossTerm):
    """weight * T^2 * KL(softmax(teacher/T) || softmax(student/T)), averaged over target positions.

    The teacher is another adapter on the same base (a frozen copy of the student before this stage),
    run on the same batch with gradients off."""

    name = "distill"

    def __init__(self, teacher: str, temperature: float, weight: float):
        self.teacher, self.temperature, self.weight = teacher, temperature, weight

    def __call__(self, ctx: StepContext) -> torch.Tensor:
        with torch.no_grad(), swapped_adapters(ctx.base, [self.teacher], list(ctx.trainable.values())):
            teacher_logits, _ = target_logits(ctx.lm, ctx.batch)
        return self.weight * distillation_loss(ctx.logits, teacher_logits, self.temperature)


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """T^2 * mean over positions of KL(softmax(teacher/T) || softmax(student/T)); [N, V] inputs."""
    t = temperature
    log_p_student = torch.log_softmax(student_logits.float() / t, dim=-1)
    log_p_teacher = torch.log_softmax(teacher_logits.float() / t, dim=-1)
    kl = torch.nn.functional.kl_div(log_p_student, log_p_teacher, log_target=True, reduction="batchmean")
    return kl * t * t


class LwF(SequentialSFT):
    name = "lwf"
    title = "LwF"
    Params = LwFParams
    TEACHER = "teacher"

    def loss_terms(self, t):
        if t == 1:
            return []
        self._snapshot_teacher()
        return [DistillationTerm(self.TEACHER, self.params.temperature, self.params.weight)]

    def _snapshot_teacher(self) -> None:
        if self.TEACHER in self.base.adapter_names:
            self.base.remove_adapter(self.TEACHER)
        add_lora(self.base, self.TEACHER, self.ctx.train)
        src = adapter_parameters(self.base.peft, ADAPTER)
        dst = adapter_parameters(self.base.peft, self.TEACHER)
        with torch.no_grad():
            for name, p in src.items():
                dst[name.replace(f".{ADAPTER}.", f".{self.TEACHER}.")].copy_(p)
        self.base.activate([ADAPTER])

    def after_stage(self, t, family, records):
        self.base.remove_adapter(self.TEACHER)
        self.base.activate([ADAPTER])


# -- EWC: a Fisher-weighted penalty on the adapter --------------------------------------------------
class EWCParams(MethodParams):
    lam: float = Field(1.0, ge=0, description="lambda; the Fisher is normalised to mean 1 per stage, so "
                                               "lambda/2 weighs the mean squared drift summed over parameters")
    fisher_examples: int = Field(200, ge=1, description="stage examples used to estimate the Fisher")


class EWCPenalty(LossTerm):
    """(lam/2) * sum_i F_i (theta_i - anchor_i)^2 over the trainable parameters."""

    name = "ewc"

    def __init__(self, fisher: dict[str, torch.Tensor], anchor: dict[str, torch.Tensor], lam: float):
        self.fisher, self.anchor, self.lam = fisher, anchor, lam
        self._on: torch.device | None = None

    def __call__(self, ctx: StepContext) -> torch.Tensor:
        device = next(iter(ctx.trainable.values())).device
        if self._on != device:  # once, not every step: the Fisher and anchor are as large as the adapter
            self.fisher = {n: f.to(device) for n, f in self.fisher.items()}
            self.anchor = {n: a.to(device) for n, a in self.anchor.items()}
            self._on = device
        return ewc_penalty(ctx.trainable, self.fisher, self.anchor, self.lam)


def ewc_penalty(params: dict[str, torch.Tensor], fisher: dict[str, torch.Tensor], anchor: dict[str, torch.Tensor],
                lam: float) -> torch.Tensor:
    total = None
    for name, p in params.items():
        f = fisher[name].to(p.device)
        a = anchor[name].to(p.device)
        term = (f * (p.float() - a) ** 2).sum()
        total = term if total is None else total + term
    return 0.5 * lam * total


def estimate_fisher(base, adapter: str, examples, batch_size: int, precision: str = "fp32") -> dict[str, torch.Tensor]:
    """Diagonal empirical Fisher of the adapter's parameters: the mean over mini-batches of the squared
    gradient of the target cross-entropy, normalised to mean 1 (so lambda has one meaning across models)."""
    peft_model = base.activate([adapter])
    params = adapter_parameters(peft_model, adapter)
    for p in params.values():
        p.requires_grad_(True)
    device = next(iter(params.values())).device
    lm = peft_model.get_base_model()
    sums = {n: torch.zeros_like(p, dtype=torch.float32) for n, p in params.items()}
    batches = 0
    try:
        for start in range(0, len(examples), batch_size):
            batch = {k: v.to(device) for k, v in collate(examples[start:start + batch_size], base.tokenizer.pad_token_id).items()}
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                logits, labels = target_logits(lm, batch)
                loss = torch.nn.functional.cross_entropy(logits.float(), labels)
            grads = torch.autograd.grad(loss, list(params.values()))
            for (n, _), g in zip(params.items(), grads):
                sums[n] += g.detach().float() ** 2
            batches += 1
    finally:
        base.activate([adapter])
    mean = sum(float(s.sum()) for s in sums.values()) / max(1, sum(s.numel() for s in sums.values()))
    scale = 1.0 / mean if mean > 0 else 1.0
    return {n: (s * scale).cpu() for n, s in sums.items()}


class EWC(SequentialSFT):
    name = "ewc"
    title = "EWC"
    Params = EWCParams

    def __init__(self, ctx, params=None):
        super().__init__(ctx, params)
        self.fisher: dict[str, torch.Tensor] = {}
        self.anchor: dict[str, torch.Tensor] = {}

    def loss_terms(self, t):
        if not self.fisher:
            return []
        return [EWCPenalty(self.fisher, self.anchor, self.params.lam)]

    def after_stage(self, t, family, records):
        from skillbank.train.loop import resolve_precision
        rng = random.Random(self.ctx.train.seed + t)
        sample = rng.sample(list(records), min(self.params.fisher_examples, len(records)))
        examples, _ = self.examples(sample, self.stream_prefix)
        device = next(self.base.peft.parameters()).device
        stage_fisher = estimate_fisher(self.base, ADAPTER, examples, self.ctx.train.batch_size,
                                       resolve_precision(self.ctx.train.precision, device))
        # Online EWC: Fishers of the stages add up; the anchor is the latest weights.
        self.fisher = {n: self.fisher.get(n, 0) + f for n, f in stage_fisher.items()}
        self.anchor = {n: p.detach().float().cpu().clone()
                       for n, p in adapter_parameters(self.base.peft, ADAPTER).items()}

    def save(self, directory: Path) -> None:
        from safetensors.torch import save_file
        super().save(directory)
        if self.fisher:
            save_file({f"fisher::{n}": v.contiguous() for n, v in self.fisher.items()}
                      | {f"anchor::{n}": v.contiguous() for n, v in self.anchor.items()}, str(directory / "ewc.safetensors"))

    def load(self, directory: Path, t: int) -> None:
        from safetensors.torch import load_file
        super().load(directory, t)
        path = directory / "ewc.safetensors"
        if path.is_file():
            state = load_file(str(path))
            self.fisher = {k.split("::", 1)[1]: v for k, v in state.items() if k.startswith("fisher::")}
            self.anchor = {k.split("::", 1)[1]: v for k, v in state.items() if k.startswith("anchor::")}
