"""A new LoRA per stage on top of the frozen earlier ones: stage t trains adapter ``stage-t`` with adapters
1..t-1 frozen and active (their updates add up in the forward pass). Three methods share this training and
differ in which adapters answer a request:

* :class:`StackedLoRA` (``stacked``, "Stacked-LoRA (summed, unrouted)") - every request, whatever its
  family, is answered by the sum of all t updates; nothing is ever routed. This is what the method
  named ``progressive`` ran before it was renamed (:class:`LegacyProgressive` keeps that name loadable).
* :class:`ProgressiveRoutedLoRA` (``progressive-routed``, "Progressive-LoRA (routed)") - the reading of
  Progressive Networks / Progressive Prompts, which pick a task's column at inference: a request of family
  j (the j-th family of the order) is answered by adapters 1..j, the model as it was right after family j
  was learned. Two variants choose the family, as FSM's do: ``progressive-routed`` by an Address Memory
  (refitted per order from each stage's requests, like FSM's) and ``progressive-oracle`` by the gold
  family.
* :class:`OLoRA` (``olora``) - the stacking of ``stacked`` plus O-LoRA's loss terms (Wang et al. 2023,
  :class:`OrthogonalityTerm`), optionally with its own adapter rank and target modules.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Optional, Sequence

import torch
from pydantic import Field

from skillbank.data.records import Record
from skillbank.continual.methods.base import AddressParams, Method, MethodParams, Query, weights_digest
from skillbank.memory.scope import family_catalog_text
from skillbank.train.executor import TrainConfig, add_lora, summarize
from skillbank.train.loop import LossTerm, StepContext, adapter_parameters


def stage_adapter(t: int) -> str:
    return f"stage-{t}"


class StackedLoRA(Method):
    """Stage t trains ``stage-t`` with ``stage-1..stage-(t-1)`` frozen and active; after stage t every
    request is answered closed-book by all t adapters at once (their LoRA updates summed), with no
    routing: the model's knowledge of family j has to survive every later update added on top of it."""

    name = "stacked"
    title = "Stacked-LoRA (summed, unrouted)"
    first_stage_group = "one-adapter-sft"  # stage 1 is plain SFT of one adapter (see learn)

    def __init__(self, ctx, params=None):
        super().__init__(ctx, params)
        self.stages = 0
        self.state_id = ""

    @property
    def adapters(self) -> list[str]:
        return [stage_adapter(t) for t in range(1, self.stages + 1)]

    @property
    def adapter_config(self) -> TrainConfig:
        """The recipe of each new adapter (the shared one; O-LoRA may change its rank and modules)."""
        return self.ctx.train

    def loss_terms(self, t: int) -> list[LossTerm]:
        return []

    def learn(self, t: int, family: str, records: Sequence[Record]) -> dict:
        cfg = self.adapter_config
        name = stage_adapter(t)
        # Stage 1 starts from the sequential methods' adapter (seed cfg.seed): with nothing stacked yet it is
        # their first stage, so the stage cache trains it once for all of them.
        add_lora(self.base, name, cfg, seed=cfg.seed if t == 1 else cfg.seed + t)
        examples, dropped = self.examples(records, self.stream_prefix)
        result, shared = self.fit_or_reuse(t, family, examples, self.loss_terms(t), adapter=name, cfg=cfg,
                                           active=self.adapters + [name])
        self.stages = t
        self._refresh_state()
        summary = summarize(name, examples, dropped, cfg, result, self.stream_prefix).to_dict()
        if shared:
            summary["shared_stage"] = shared
        return summary

    def _refresh_state(self) -> None:
        params = {}
        for a in self.adapters:
            params.update(adapter_parameters(self.base.peft, a))
        self.state_id = f"{self.name}-{weights_digest(params)}"

    def queries(self, t: int, records: Sequence[Record]) -> dict[str, list[Query]]:
        fmt, prefix = self.ctx.train.target_format, self.stream_prefix
        skills = self.seen_skills(t)
        return {self.name: [Query(self.state_id, self.closed_book_prompt(r.request), fmt, prefix, skills=skills)
                            for r in records]}

    def model_for(self, state: str):
        return self.adapters_active(self.adapters)

    def save(self, directory: Path) -> None:
        for a in self.adapters:
            self.base.save_adapter(a, directory / a)

    def load(self, directory: Path, t: int) -> None:
        for a in list(self.base.adapter_names):
            self.base.remove_adapter(a)
        self.stages = t
        for a in self.adapters:
            self.base.load_adapter(a, directory / a)
        self.base.activate(self.adapters)
        self._refresh_state()


class LegacyProgressive(StackedLoRA):
    """Deprecated name ``progressive``: exactly :class:`StackedLoRA` (summed, unrouted), under the name it was
    run with, so a run directory holding ``methods/progressive`` keeps resuming (same variant name, same
    state ids, so its cached outputs stay valid) and reporting. New configs name ``stacked`` or
    ``progressive-routed``."""

    name = "progressive"
    title = "Stacked-LoRA (summed, unrouted; run as 'progressive')"


class ProgressiveRoutedLoRA(StackedLoRA):
    """Trained as :class:`StackedLoRA`; a request routed to family j (the j-th of the order) is answered by
    adapters 1..j only (family j's column). Variants: ``progressive-routed`` (the family chosen by the
    Address Memory from the raw request) and ``progressive-oracle`` (the gold family); and ``stacked``, every
    request answered by the last column (all adapters summed): :class:`StackedLoRA`'s own answer, from the
    same training, so a comparison gets both readings of Progressive-LoRA for one method's training."""

    name = "progressive-routed"
    title = "Progressive-LoRA (routed)"
    ORACLE = "progressive-oracle"
    Params = AddressParams

    def __init__(self, ctx, params=None):
        from skillbank.memory.address import make_selector
        super().__init__(ctx, params)
        self.address_kind, self.address_params = self.params.resolve(ctx)
        self.address = make_selector(self.address_kind, **self.address_params)  # this order's own
        self.columns: list[str] = []  # state of column j (adapters 1..j) at index j-1

    def learn(self, t: int, family: str, records: Sequence[Record]) -> dict:
        summary = super().learn(t, family, records)
        self.address.partial_fit([r.request for r in records], family)
        self.address.partial_fit_catalog(family_catalog_text(self.ctx.stream.catalog, family), family)
        return summary

    def _refresh_state(self) -> None:
        super()._refresh_state()
        params: dict[str, torch.Tensor] = {}
        self.columns = []
        for j, a in enumerate(self.adapters, 1):
            params.update(adapter_parameters(self.base.peft, a))
            self.columns.append(f"{self.name}:{j}:{weights_digest(params)}")

    def column(self, family: str) -> int:
        """1-based position of ``family`` among the learned families of this order (its column)."""
        learned = self.ctx.order[:self.stages]
        if family not in learned:
            raise ValueError(f"{family!r} is not among the families learned so far ({learned})")
        return learned.index(family) + 1

    def queries(self, t: int, records: Sequence[Record]) -> dict[str, list[Query]]:
        fmt, prefix = self.ctx.train.target_format, self.stream_prefix
        routed = self.address.predict([r.request for r in records]) if records else []
        out: dict[str, list[Query]] = {self.name: [], self.ORACLE: [], StackedLoRA.name: []}
        for r, route in zip(records, routed):
            prompt = self.closed_book_prompt(r.request)
            for variant, family in ((self.name, route), (self.ORACLE, r.family)):
                j = self.column(family)
                out[variant].append(Query(self.columns[j - 1], prompt, fmt, prefix, route=family,
                                          skills=self.seen_skills(j)))
            out[StackedLoRA.name].append(Query(self.columns[t - 1], prompt, fmt, prefix, skills=self.seen_skills(t)))
        return out

    def model_for(self, state: str):
        j = int(state.split(":")[1])
        return self.adapters_active(self.adapters[:j])

    def save(self, directory: Path) -> None:
        super().save(directory)
        self.address.save(directory / "address")

    def load(self, directory: Path, t: int) -> None:
        from skillbank.memory.address import load_selector
        super().load(directory, t)
        self.address = load_selector(directory / "address")


# -- O-LoRA -------------------------------------------------------------------------------------------------
class OLoRAParams(MethodParams):
    lambda_orth: float = Field(0.5, ge=0, description="O-LoRA's lambda_1: weight of sum over adapted modules and "
                                                      "earlier adapters j of the L1 norm of A_t A_j^T")
    lambda_l2: float = Field(0.0, ge=0, description="O-LoRA's lambda_2: weight of the sum of the Frobenius norms "
                                                    "(not squared) of the new adapter's LoRA matrices A_t and B_t")
    rank: Optional[int] = Field(None, ge=1, description="rank of each new adapter; unset = the [train] recipe's "
                                                        "(O-LoRA's official setting: 8)")
    target_modules: Optional[list[str]] = Field(None, min_length=1, description="modules that get the new adapters; "
                                                "unset = the [train] recipe's (O-LoRA's official: q_proj, v_proj)")
    alpha: Optional[float] = Field(None, gt=0, description="LoRA alpha of the new adapters; unset = the recipe's "
                                                           "alpha/rank ratio kept at this rank")


class OrthogonalityTerm(LossTerm):
    """lambda_orth * sum_{module, j<t} |A_t A_j^T|_1 + lambda_l2 * sum_{W in A_t, B_t} |W|_F (see
    :func:`orthogonality_loss`)."""

    name = "orth"

    def __init__(self, frozen_A: dict[str, list[torch.Tensor]], lambda_orth: float, lambda_l2: float, adapter: str):
        self.frozen_A = frozen_A  # module path -> the earlier adapters' lora_A weights [r, d_in]
        self.lambda_orth, self.lambda_l2, self.adapter = lambda_orth, lambda_l2, adapter

    def __call__(self, ctx: StepContext) -> torch.Tensor:
        return orthogonality_loss(ctx.trainable, self.frozen_A, self.adapter, self.lambda_orth, self.lambda_l2)


_A_KEY = re.compile(r"^(.*)\.lora_A\.([^.]+)\.weight$")


def lora_A_by_module(named: dict[str, torch.Tensor], adapter: str) -> dict[str, torch.Tensor]:
    """module path -> lora_A weight [r, d_in] of ``adapter``."""
    out = {}
    for n, p in named.items():
        m = _A_KEY.match(n)
        if m and m.group(2) == adapter:
            out[m.group(1)] = p
    return out


def orthogonality_loss(trainable: dict[str, torch.Tensor], frozen_A: dict[str, list[torch.Tensor]], adapter: str,
                       lambda_orth: float, lambda_l2: float) -> torch.Tensor:
    """O-LoRA's two terms (Wang et al. 2023, and its official trainer).

    lambda_orth (lambda_1) * sum over adapted modules m and earlier adapters j < t of sum_{k,l} |(A_t A_j^T)_kl|:
    the L1 norm of the product of the new and an earlier LoRA down-projection ([r, d_in] each), zero when the
    new update reads a subspace orthogonal to the earlier ones'. (The official code concatenates the earlier
    A_j into one matrix; the L1 norm of that product is the same sum.)

    lambda_l2 (lambda_2) * sum over the new adapter's LoRA matrices W (every module's A_t and B_t, i.e. the
    ``trainable`` parameters) of the Frobenius norm |W|_F - a norm, not its square, as the official code's
    ``torch.norm(param, p=2)`` per matrix."""
    new_A = lora_A_by_module(trainable, adapter)
    total = next(iter(trainable.values())).new_zeros((), dtype=torch.float32)
    if lambda_orth:
        for module, a_new in new_A.items():
            for a_old in frozen_A.get(module, []):
                total = total + lambda_orth * (a_new.float() @ a_old.to(a_new.device).float().T).abs().sum()
    if lambda_l2:
        total = total + lambda_l2 * sum(torch.linalg.vector_norm(p.float()) for p in trainable.values())
    return total


class OLoRA(StackedLoRA):
    """Stacked-LoRA (summed, unrouted: every adapter answers every request, as O-LoRA's merged model does)
    plus :class:`OrthogonalityTerm` from stage 2 on (and from stage 1 when lambda_l2 > 0)."""

    name = "olora"
    title = "O-LoRA"
    Params = OLoRAParams

    @property
    def adapter_config(self) -> TrainConfig:
        return self.own_adapter_config(self.ctx.train, self.params)

    @staticmethod
    def own_adapter_config(cfg: TrainConfig, p: OLoRAParams) -> TrainConfig:
        if p.rank is None and p.target_modules is None and p.alpha is None:
            return cfg
        rank = p.rank if p.rank is not None else cfg.rank
        alpha = p.alpha if p.alpha is not None else cfg.alpha * rank / cfg.rank
        modules = tuple(p.target_modules) if p.target_modules is not None else cfg.target_modules
        return dataclasses.replace(cfg, rank=rank, alpha=alpha, target_modules=modules)

    @classmethod
    def first_stage_recipe(cls, train: TrainConfig, params: OLoRAParams) -> TrainConfig | None:
        # lambda_2 is a term from stage 1 on: that stage is then O-LoRA's own
        return None if params.lambda_l2 else cls.own_adapter_config(train, params)

    def loss_terms(self, t: int) -> list[LossTerm]:
        frozen: dict[str, list[torch.Tensor]] = {}
        for a in self.adapters:  # adapters 1..t-1 (self.stages is still t-1 here)
            for module, w in lora_A_by_module(adapter_parameters(self.base.peft, a), a).items():
                frozen.setdefault(module, []).append(w.detach())
        if not frozen and not self.params.lambda_l2:
            return []
        return [OrthogonalityTerm(frozen, self.params.lambda_orth, self.params.lambda_l2, stage_adapter(t))]
