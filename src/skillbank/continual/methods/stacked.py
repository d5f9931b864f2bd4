"""A new LoRA per stage on top of the frozen earlier ones, all active at inference, no routing.

* :class:`ProgressiveLoRA` - stage t trains adapter ``stage-t`` with adapters 1..t-1 frozen and active;
  the model after stage t runs the sum of all t updates (and no request is ever routed).
* :class:`OLoRA` - the same stacking plus :class:`OrthogonalityTerm` (O-LoRA, Wang et al. 2023):
  lambda_orth * sum over adapted modules and earlier adapters of |A_t A_j^T| (the L1 norm of the product
  of the LoRA down-projections, pushing the new update into a subspace orthogonal to the earlier ones)
  plus lambda_l2 * the squared norm of the new adapter's parameters.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

import torch
from pydantic import Field

from skillbank.data.records import Record
from skillbank.continual.methods.base import Method, MethodParams, Query, weights_digest
from skillbank.train.executor import add_lora, summarize
from skillbank.train.loop import LossTerm, StepContext, adapter_parameters, fit


def stage_adapter(t: int) -> str:
    return f"stage-{t}"


class ProgressiveLoRA(Method):
    name = "progressive"
    title = "Progressive-LoRA"

    def __init__(self, ctx, params=None):
        super().__init__(ctx, params)
        self.stages = 0
        self.state_id = ""

    @property
    def adapters(self) -> list[str]:
        return [stage_adapter(t) for t in range(1, self.stages + 1)]

    def loss_terms(self, t: int) -> list[LossTerm]:
        return []

    def learn(self, t: int, family: str, records: Sequence[Record]) -> dict:
        cfg = self.ctx.train
        name = stage_adapter(t)
        add_lora(self.base, name, cfg, seed=cfg.seed + t)
        examples, dropped = self.examples(records, self.stream_prefix)
        result = fit(self.base, examples, cfg, adapter=name, active=self.adapters + [name],
                     terms=self.loss_terms(t), seed=cfg.seed + t, progress=self.ctx.progress,
                     desc=f"{self.name} stage {t} {family}")
        self.stages = t
        self._refresh_state()
        return summarize(name, examples, dropped, cfg, result, self.stream_prefix).to_dict()

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


class OLoRAParams(MethodParams):
    lambda_orth: float = Field(0.5, ge=0, description="weight of the orthogonality term (O-LoRA's lambda_1)")
    lambda_l2: float = Field(0.0, ge=0, description="weight of the L2 term on the new adapter (O-LoRA's lambda_2)")


class OrthogonalityTerm(LossTerm):
    """lambda_orth * sum_{module, j<t} |A_t A_j^T|_1 + lambda_l2 * |theta_t|^2."""

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
    new_A = lora_A_by_module(trainable, adapter)
    total = next(iter(trainable.values())).new_zeros((), dtype=torch.float32)
    if lambda_orth:
        for module, a_new in new_A.items():
            for a_old in frozen_A.get(module, []):
                total = total + lambda_orth * (a_new.float() @ a_old.to(a_new.device).float().T).abs().sum()
    if lambda_l2:
        total = total + lambda_l2 * sum((p.float() ** 2).sum() for p in trainable.values())
    return total


class OLoRA(ProgressiveLoRA):
    name = "olora"
    title = "O-LoRA"
    Params = OLoRAParams

    def loss_terms(self, t: int) -> list[LossTerm]:
        frozen: dict[str, list[torch.Tensor]] = {}
        for a in self.adapters:  # adapters 1..t-1 (self.stages is still t-1 here)
            for module, w in lora_A_by_module(adapter_parameters(self.base.peft, a), a).items():
                frozen.setdefault(module, []).append(w.detach())
        if not frozen and not self.params.lambda_l2:
            return []
        return [OrthogonalityTerm(frozen, self.params.lambda_orth, self.params.lambda_l2, stage_adapter(t))]
