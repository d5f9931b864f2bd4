"""One LoRA adapter trained stage after stage, and the three classic ways to protect it.

* :class:`SequentialSFT` - plain fine-tuning on each stage in turn: the forgetting reference.
* :class:`Replay` - adds a data mix: a buffer of examples kept from every earlier stage (``per_stage`` of
  each, or a ``fraction`` of each stage's training requests) is trained on together with the current
  stage. It stores requests, so it breaks the replay-free rule FSM keeps; it is the strong reference.
* :class:`LwF` - adds :class:`DistillationTerm`: the model before the stage (a frozen copy of the
  adapter) is the teacher on the current stage's inputs; ``weight`` * KL(teacher || student) at
  temperature T on the target positions (Li & Hoiem's lambda_o and Avalanche's ``alpha``: no T^2 factor
  unless ``t_squared`` asks for it).
* :class:`EWC` - adds :class:`EWCPenalty`: (lambda/2) * sum_i F_i (theta_i - theta*_i)^2 over the adapter
  parameters, with F the sum over finished stages of each stage's diagonal empirical Fisher, normalised to
  mean 1 over the adapter's parameters (see :func:`estimate_fisher`).

All four generate closed-book with the one adapter; the evaluated state after stage t is that adapter.
"""
from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Optional, Sequence

import torch
from pydantic import Field, model_validator

from skillbank.data.records import Record
from skillbank.continual.methods.base import Method, MethodParams, Query, address_hint, weights_digest, with_text
from skillbank.train.executor import add_lora, summarize
from skillbank.train.loop import LossTerm, StepContext, adapter_parameters, collate, swapped_adapters, target_logits

ADAPTER = "seq"


class SFTParams(MethodParams):
    address_probe: bool = Field(True, description="also answer every request with its correct skill address "
                                                  "appended (variant sft+address): separates lost access from "
                                                  "lost execution in the report; not a closed-book result")


class SequentialSFT(Method):
    name = "sft"
    title = "Sequential SFT"
    Params = SFTParams
    # Replay's buffer, LwF's teacher and EWC's Fisher act only from stage 2: stage 1 is plain SFT for all four
    # (the stage cache checks this by content, the group only lets a sweep count it once in its estimate).
    first_stage_group = "one-adapter-sft"

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
        result, shared = self.fit_or_reuse(t, family, examples, terms, adapter=ADAPTER, cfg=cfg, on_step=self.on_step)
        self.after_stage(t, family, records)
        self._refresh_state()
        summary = summarize(ADAPTER, examples, dropped, cfg, result, self.stream_prefix).to_dict()
        summary["stage_records"] = len(records)
        if shared:
            summary["shared_stage"] = shared
        return summary

    def _refresh_state(self) -> None:
        # Named by the adapter, not the method: the four methods answer with the one adapter alone, so equal
        # weights give equal outputs whichever method holds them (the first stage, shared through the stage
        # cache, is then evaluated once for all of them).
        self.state_id = f"{ADAPTER}-{weights_digest(adapter_parameters(self.base.peft, ADAPTER))}"

    def queries(self, t: int, records: Sequence[Record]) -> dict[str, list[Query]]:
        prefix = self.stream_prefix
        fmt = self.ctx.train.target_format
        skills = self.seen_skills(t)
        out = {self.name: [Query(self.state_id, self.closed_book_prompt(r.request), fmt, prefix, skills=skills)
                           for r in records]}
        if getattr(self.params, "address_probe", False):
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
DEFAULT_PER_STAGE = 100  # the paper's Replay budget


class ReplayParams(MethodParams):
    """The buffer's budget, given one way: ``per_stage`` (examples kept from each finished stage) or
    ``fraction`` (of each finished stage's training requests). Neither given: ``per_stage = 100``."""

    per_stage: Optional[int] = Field(None, ge=1, description="examples kept from each finished stage "
                                                             f"(absolute); default {DEFAULT_PER_STAGE} when "
                                                             "fraction is unset")
    fraction: Optional[float] = Field(None, gt=0, le=1, description="examples kept from each finished stage as a "
                                                                    "fraction of that stage's training requests "
                                                                    "(rounded half up, at least 1); instead of per_stage")

    @model_validator(mode="after")
    def _one_budget(self):
        if self.per_stage is not None and self.fraction is not None:
            raise ValueError(f"the Replay budget is per_stage (examples per finished stage) or fraction (of each "
                             f"stage's training requests), not both: got per_stage={self.per_stage}, "
                             f"fraction={self.fraction}")
        if self.per_stage is None and self.fraction is None:
            self.per_stage = DEFAULT_PER_STAGE
        return self


class ReplayBuffer:
    """Records of every finished stage, drawn uniformly with a seeded generator: ``per_stage`` of each
    (all of a smaller stage), or with ``fraction`` set, fraction * n rounded half up of a stage of n training
    records (at least 1, at most n). Exactly one of the two is given. The buffer never holds more than
    :attr:`budget` records."""

    def __init__(self, per_stage: int | None = DEFAULT_PER_STAGE, seed: int = 0, fraction: float | None = None):
        if (per_stage is None) == (fraction is None):
            raise ValueError(f"ReplayBuffer takes exactly one of per_stage and fraction, got per_stage={per_stage}, "
                             f"fraction={fraction}")
        if per_stage is not None and per_stage < 1:
            raise ValueError(f"per_stage must be >= 1, got {per_stage}")
        if fraction is not None and not 0 < fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        self.per_stage = per_stage
        self.fraction = fraction
        self.seed = seed
        self.kept: dict[str, list[Record]] = {}
        self.stage_sizes: dict[str, int] = {}

    def quota(self, n: int) -> int:
        """How many of a finished stage's ``n`` training records are kept."""
        if self.fraction is not None:
            return min(n, max(1, math.floor(self.fraction * n + 0.5)))
        return min(self.per_stage, n)

    def add_stage(self, family: str, records: Sequence[Record], t: int) -> None:
        records = list(records)
        rng = random.Random(self.seed * 1000 + t)
        self.stage_sizes[family] = len(records)
        self.kept[family] = rng.sample(records, self.quota(len(records)))

    def records(self) -> list[Record]:
        return [r for fam in self.kept for r in self.kept[fam]]

    def __len__(self) -> int:
        return sum(len(v) for v in self.kept.values())

    @property
    def budget(self) -> int:
        """The most records the buffer may hold after the stages added so far."""
        if self.fraction is not None:
            return sum(self.quota(n) for n in self.stage_sizes.values())
        return self.per_stage * len(self.kept)

    def ids(self) -> dict[str, list[str]]:
        return {fam: [r.id for r in recs] for fam, recs in self.kept.items()}


class Replay(SequentialSFT):
    name = "replay"
    title = "Replay"
    Params = ReplayParams

    def __init__(self, ctx, params=None):
        super().__init__(ctx, params)
        self.buffer = ReplayBuffer(self.params.per_stage, ctx.train.seed, fraction=self.params.fraction)

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
        self.buffer.stage_sizes = {fam: len(self.ctx.stream.train[fam]) for fam in ids}


# -- LwF: distillation from the model before the stage ---------------------------------------------
class LwFParams(MethodParams):
    temperature: float = Field(2.0, gt=0, description="softening temperature T of both distributions "
                                                      "(Li & Hoiem and Avalanche: 2)")
    weight: float = Field(1.0, ge=0, description="weight of the distillation term, multiplying the KL itself "
                                                 "(Li & Hoiem's lambda_o, Avalanche's alpha; both 1)")
    t_squared: bool = Field(False, description="also multiply the term by T^2 (Hinton et al.'s gradient-scale "
                                               "correction; not in Li & Hoiem or Avalanche). Runs saved before "
                                               "this option existed used it")


class DistillationTerm(LossTerm):
    """weight * KL(softmax(teacher/T) || softmax(student/T)), averaged over target positions (times T^2
    when ``t_squared``).

    The teacher is another adapter on the same base (a frozen copy of the student before this stage),
    run on the same batch with gradients off."""

    name = "distill"

    def __init__(self, teacher: str, temperature: float, weight: float, t_squared: bool = False):
        self.teacher, self.temperature, self.weight, self.t_squared = teacher, temperature, weight, t_squared

    def __call__(self, ctx: StepContext) -> torch.Tensor:
        with torch.no_grad(), swapped_adapters(ctx.base, [self.teacher], list(ctx.trainable.values())):
            teacher_logits, _ = target_logits(ctx.lm, ctx.batch)
        return self.weight * distillation_loss(ctx.logits, teacher_logits, self.temperature, self.t_squared)


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float,
                      t_squared: bool = False) -> torch.Tensor:
    """Mean over positions (rows) of KL(softmax(teacher/T) || softmax(student/T)); [N, V] inputs.

    This is Avalanche's LwF distillation (``kl_div(log_softmax(out/T), softmax(prev_out/T), "batchmean")``)
    and, up to the teacher's entropy (a constant for the student), Li & Hoiem's cross-entropy on
    T-softened outputs. ``t_squared`` multiplies it by T^2 (Hinton et al.'s knowledge distillation)."""
    t = temperature
    log_p_student = torch.log_softmax(student_logits.float() / t, dim=-1)
    log_p_teacher = torch.log_softmax(teacher_logits.float() / t, dim=-1)
    kl = torch.nn.functional.kl_div(log_p_student, log_p_teacher, log_target=True, reduction="batchmean")
    return kl * (t * t) if t_squared else kl


class LwF(SequentialSFT):
    name = "lwf"
    title = "LwF"
    Params = LwFParams
    TEACHER = "teacher"

    def loss_terms(self, t):
        if t == 1:
            return []
        self._snapshot_teacher()
        return [DistillationTerm(self.TEACHER, self.params.temperature, self.params.weight, self.params.t_squared)]

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
    lam: float = Field(1.0, ge=0, description="lambda in (lambda/2) * sum_i F_i (theta_i - theta*_i)^2, F the sum "
                                               "of the finished stages' Fishers, each normalised to mean 1 over "
                                               "the adapter's parameters (so after k stages F has mean k)")
    fisher_examples: int = Field(200, ge=1, description="stage examples used to estimate the Fisher")


class EWCPenalty(LossTerm):
    """(lam/2) * sum_i F_i (theta_i - anchor_i)^2 over the trainable (adapter) parameters.

    The 1/2 is Kirkpatrick et al.'s; Avalanche's EWC plugin has none (its ``ewc_lambda`` is our lam/2).
    ``fisher``: the sum over finished stages of each stage's mean-1 normalised Fisher (online EWC without
    decay); ``anchor``: the adapter's weights after the last finished stage."""

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
    """Diagonal empirical Fisher of the adapter's parameters, normalised to mean 1.

    For each mini-batch of ``examples`` (``batch_size`` of them), the gradient of the batch's mean target
    cross-entropy (against the gold targets, not sampled ones) is squared element-wise; F is the mean of
    these over the mini-batches (as Avalanche's EWC estimates its importances), then divided by its own mean
    over every entry of every adapter parameter (lora_A and lora_B of every adapted module), so that the
    mean of F over the adapter is exactly 1 (the stage's total importance is fixed; only its distribution
    over parameters is measured). This makes lambda comparable across models and stages, but not with EWC
    settings on an unnormalised Fisher."""
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
        # Online EWC without decay: each stage's mean-1 Fisher is added (after k stages F has mean k), and
        # the anchor is the latest weights.
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
