"""Training one executor: a LoRA adapter on the frozen base (fresh, or starting from another adapter's
weights), fitted to one stage's records only.

The adapter learns request -> serialised task graph (``skillbank.model.serialization``) with the
closed-book prompt (``skillbank.model.prompts``); the loss is next-token cross-entropy on the target
tokens only. Logits are computed only at positions that predict a target token: the output layer
(49,152 x 576 for SmolLM2) is a fifth of the model's compute per position and the prompt positions carry
no loss, so this skips a large share of the work and memory.

Speed on a small CPU (bench/train_probe.py, bench/train_head.py): batches are grouped by length to cut padding;
the prompt head every example shares is run once per batch (``skillbank.train.loop``; ~1.1x); mixed
precision ``bf16`` (autocast) is ~1.3x faster than fp32 where the CPU supports bfloat16; LoRA restricted
to the top layers (``layers_to_transform``) makes backward stop at the lowest adapted layer (autograd
only differentiates what depends on a trainable tensor) -- ~1.5x faster, but it learned much worse.

The base holds every adapter (``LoadedBase.add_adapter``): training one leaves the weights of the base
and of every other adapter untouched, and the new adapter is frozen when training ends.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, replace
from typing import Mapping, Optional, Sequence

import torch

from skillbank.data.records import Record
from skillbank.errors import ModelError
from skillbank.model.base import LoadedBase, freeze_all
from skillbank.model.prompts import DEFAULT_SYSTEM_PROMPT, Example, build_example
from skillbank.model.serialization import FORMATS, encode
from skillbank.train.loop import (ATTENTIONS, PRECISIONS, FitResult, adapter_parameters, collate, fit,
                                  length_grouped_batches, resolve_precision, target_loss)

__all__ = ["TrainConfig", "TrainSummary", "train_executor", "add_lora", "build_examples", "summarize", "freeze_all",
           "common_prefix", "top_layers", "copy_lora", "lora_tensors", "resolve_precision", "collate",
           "length_grouped_batches", "target_loss"]


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of one executor (a LoRA adapter). Defaults follow the paper's recipe (r16, lr 4e-4,
    batch 8) except where noted.

    rank, alpha, dropout: LoRA rank r, scaling alpha (update scaled by alpha/r), dropout on the LoRA input.
    target_modules: module names that get LoRA (attention projections by default).
    layers_to_transform: layer indices that get LoRA; None = all. ``top_layers(n, k)`` gives the top k.
    lr: peak AdamW learning rate; warmup_ratio: fraction of optimizer steps of linear warm-up, then
        linear decay to 0; weight_decay: AdamW decoupled weight decay; max_grad_norm: clip (None = off).
    epochs, batch_size, grad_accum: passes over the records, examples per micro-batch, micro-batches per
        optimizer step (effective batch = batch_size * grad_accum).
    warm_epochs: passes over the records for a shard that does not start from a fresh LoRA (from earlier
        shards or the family-neutral start: the graph format is learned already); None = ``epochs``.
    max_length: examples longer than this many tokens (prompt + target) are dropped and counted in
        the summary (a truncated target would teach the model never to stop); None = no limit.
    seed: seeds adapter initialisation, dropout and batch order.
    target_format: "json" (the contract, full ids) or "compact" (see serialization; ~3x fewer tokens).
    system_prompt: the fixed system instruction (prompts.DEFAULT_SYSTEM_PROMPT or PAPER_SYSTEM_PROMPT).
    precision: "bf16" (autocast to bfloat16), "fp32", or "auto" = bf16 where the device supports it.
    attention: how attention is computed while training: "sdpa" (torch's fused kernel), "sdpa-fp32" (that kernel
        in float32 inside a bfloat16 step), "eager" (transformers' matrix products and softmax), or "auto" =
        sdpa-fp32 on a CPU (the demo trains 1.29x faster than with bf16 sdpa at the same EM; docs/lab-notebook.md),
        the model's own elsewhere. Planning keeps the model's own either way.
    """

    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.05
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    layers_to_transform: Optional[tuple[int, ...]] = None
    lr: float = 4e-4
    epochs: int = 6
    warm_epochs: Optional[int] = None
    batch_size: int = 8
    grad_accum: int = 1
    warmup_ratio: float = 0.05
    weight_decay: float = 0.0
    max_grad_norm: Optional[float] = 1.0
    max_length: Optional[int] = 1024
    seed: int = 0
    target_format: str = "json"
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    precision: str = "auto"
    attention: str = "auto"

    def __post_init__(self):
        def bad(name, expected):
            raise ModelError(f"TrainConfig.{name} must be {expected}, got {getattr(self, name)!r}")

        optional = ("warm_epochs",) if self.warm_epochs is not None else ()
        for name in ("rank", "epochs", "batch_size", "grad_accum") + optional:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                bad(name, "None or a positive integer" if name in optional else "a positive integer")
        if not isinstance(self.alpha, (int, float)) or self.alpha <= 0:
            bad("alpha", "a positive number")
        if not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
            bad("dropout", "in [0, 1)")
        if not isinstance(self.lr, (int, float)) or not 0 < self.lr < 1:
            bad("lr", "in (0, 1)")
        if not isinstance(self.warmup_ratio, (int, float)) or not 0 <= self.warmup_ratio < 1:
            bad("warmup_ratio", "in [0, 1)")
        if not isinstance(self.weight_decay, (int, float)) or self.weight_decay < 0:
            bad("weight_decay", ">= 0")
        clip = self.max_grad_norm
        if clip is not None and (not isinstance(clip, (int, float)) or clip <= 0):
            bad("max_grad_norm", "a positive number or None")
        if self.max_length is not None and (not isinstance(self.max_length, int) or self.max_length < 8):
            bad("max_length", "an integer >= 8 or None")
        if isinstance(self.target_modules, str) or not self.target_modules or \
                not all(isinstance(m, str) and m for m in self.target_modules):
            bad("target_modules", "a non-empty tuple of module names")
        object.__setattr__(self, "target_modules", tuple(self.target_modules))
        if self.layers_to_transform is not None:
            layers = self.layers_to_transform
            if isinstance(layers, (str, int)) or not layers or \
                    not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in layers):
                bad("layers_to_transform", "None or a non-empty tuple of layer indices >= 0")
            object.__setattr__(self, "layers_to_transform", tuple(sorted(set(layers))))
        if self.target_format not in FORMATS:
            bad("target_format", f"one of {list(FORMATS)}")
        if not isinstance(self.system_prompt, str):
            bad("system_prompt", "a string")
        if self.precision not in PRECISIONS:
            bad("precision", f"one of {list(PRECISIONS)}")
        if self.attention not in ATTENTIONS:
            bad("attention", f"one of {list(ATTENTIONS)}")
        if not isinstance(self.seed, int):
            bad("seed", "an integer")

    @classmethod
    def for_small_cpu(cls, **overrides) -> "TrainConfig":
        """The recipe measured best for a ~135M base on a few CPU cores (bench/train_probe.py and a learning check):
        compact targets (3.8x fewer target tokens than json), the short system prompt, no LoRA dropout
        (its random masks cost ~10% of a CPU step), lr 2e-3 (4e-4 is tuned for 8B models and learns a
        135M one several times slower), 3 epochs. ``overrides`` replace any field."""
        base = dict(target_format="compact", system_prompt=DEFAULT_SYSTEM_PROMPT, dropout=0.0, lr=2e-3, epochs=3)
        return cls(**{**base, **overrides})

    def warm(self) -> "TrainConfig":
        """The recipe of a shard that starts from earlier learning: ``warm_epochs`` in place of ``epochs``."""
        return self if self.warm_epochs is None else replace(self, epochs=self.warm_epochs)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["target_modules"] = list(self.target_modules)
        d["layers_to_transform"] = list(self.layers_to_transform) if self.layers_to_transform else None
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise ModelError(f"unknown TrainConfig field(s) {unknown}")
        d = dict(d)
        if d.get("target_modules") is not None:
            d["target_modules"] = tuple(d["target_modules"])
        if d.get("layers_to_transform") is not None:
            d["layers_to_transform"] = tuple(d["layers_to_transform"])
        return cls(**d)


@dataclass
class TrainSummary:
    """What one training run did. Tokens count real (non-padding) tokens over all epochs; ``padded_tokens``
    counts what the model actually processed. Seconds are wall-clock; tokens_per_second = total_tokens /
    wall_seconds. ``loss_curve`` is the mean target-token loss per optimizer step (at most 200 points,
    averaged over equal windows when there are more steps). ``max_target_tokens`` (the longest target,
    end-of-turn included) is a sound basis for a generation cap: an output much longer is already wrong."""

    adapter_name: str
    examples: int
    dropped_too_long: int
    epochs: int
    steps: int
    total_tokens: int
    target_tokens: int
    padded_tokens: int
    max_target_tokens: int
    wall_seconds: float
    tokens_per_second: float
    examples_per_second: float
    final_loss: float
    loss_curve: list[float]
    trainable_parameters: int
    precision: str
    device: str
    target_format: str
    family_prefix: str | dict[str, str]  # one prefix, or one per family (a start trained for one-family shards)
    config: dict = field(default_factory=dict)
    terms: dict = field(default_factory=dict)  # mean of each extra loss term (continual methods)

    def to_dict(self) -> dict:
        return asdict(self)


# -- helpers -------------------------------------------------------------------------------------
def common_prefix(skills: Sequence[str]) -> str:
    """Longest ``::``-delimited prefix shared by all skill ids (``TaskBench::t1_daily_life::``), or ''."""
    parts = [s.split("::")[:-1] for s in skills]
    common: list[str] = []
    for group in zip(*parts) if parts else ():
        if len(set(group)) != 1:
            break
        common.append(group[0])
    return "::".join(common) + "::" if common else ""


def top_layers(num_layers: int, count: int) -> tuple[int, ...]:
    """Indices of the top ``count`` of ``num_layers`` layers, e.g. ``top_layers(30, 15)`` = 15..29."""
    if not 1 <= count <= num_layers:
        raise ModelError(f"count must be in 1..{num_layers}, got {count}")
    return tuple(range(num_layers - count, num_layers))


# -- training --------------------------------------------------------------------------------------
def train_executor(base: LoadedBase, records: Sequence[Record], cfg: TrainConfig | None = None, *,
                   adapter_name: str, family_prefix: str | Mapping[str, str] | None = None, progress: bool = True,
                   checkpoint=None,
                   init_adapter: str | None = None):
    """Train a LoRA adapter ``adapter_name`` on ``records`` and return ``(peft_model, TrainSummary)``.

    The adapter is added to ``base`` (``base.peft`` is the PeftModel holding every adapter), trained with
    AdamW + linear warm-up/decay, then frozen and left active in eval mode. ``family_prefix`` is the
    skill-id prefix the compact format strips (default: the longest ``::`` prefix shared by the records'
    skills); it is returned in the summary because decoding needs it. A mapping gives each record's family its
    own prefix: records of several families then train the format a one-family shard writes (bare skill names),
    which is what a start for such shards must teach. ``checkpoint``: see
    :func:`~skillbank.train.loop.fit` (a killed training continues from it).
    init_adapter: an adapter already on ``base`` whose LoRA A and B tensors the new adapter starts from
        (:func:`copy_lora`; same rank, target modules and layers) instead of a fresh initialisation; the
        training is otherwise the same.
    """
    cfg = cfg or TrainConfig()
    records = list(records)
    if not records:
        raise ModelError("no training records")
    if not all(isinstance(r, Record) for r in records):
        raise ModelError("records must be skillbank.data.records.Record objects")
    if family_prefix is None:
        family_prefix = common_prefix(sorted({t for r in records for t in r.graph.tasks}))

    if isinstance(family_prefix, Mapping):
        family_prefix = dict(family_prefix)
        missing = sorted({r.family for r in records} - set(family_prefix))
        if missing:
            raise ModelError(f"no family prefix given for the records of {missing}")
    examples, dropped = build_examples(base, records, cfg, family_prefix)
    peft_model = add_lora(base, adapter_name, cfg)
    try:
        if init_adapter is not None:
            copy_lora(base, init_adapter, adapter_name)
        # a warm start trains warm_epochs; the summary keeps the whole recipe (a relearn from scratch reads it)
        fit_cfg = cfg.warm() if init_adapter is not None else cfg
        result = fit(base, examples, fit_cfg, adapter=adapter_name, seed=cfg.seed, progress=progress,
                     checkpoint=checkpoint)
    except BaseException:
        base.remove_adapter(adapter_name)  # never leave a half-trained adapter behind
        raise
    return peft_model, summarize(adapter_name, examples, dropped, cfg, result, family_prefix, fit_cfg.epochs)


def add_lora(base: LoadedBase, name: str, cfg: TrainConfig, seed: int | None = None):
    """Add a fresh LoRA adapter ``name`` shaped by ``cfg`` (initialised from ``seed``, default cfg.seed)."""
    from peft import LoraConfig

    if cfg.layers_to_transform and max(cfg.layers_to_transform) >= base.num_layers:
        raise ModelError(f"TrainConfig.layers_to_transform names layer {max(cfg.layers_to_transform)}, "
                         f"but the base has layers 0..{base.num_layers - 1}")
    torch.manual_seed(cfg.seed if seed is None else seed)
    lora = LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, bias="none",
                      target_modules=list(cfg.target_modules), task_type="CAUSAL_LM",
                      layers_to_transform=list(cfg.layers_to_transform) if cfg.layers_to_transform else None)
    try:
        return base.add_adapter(name, lora)
    except ModelError:
        raise
    except ValueError as exc:  # peft: a target module that does not exist, etc.
        raise ModelError(f"cannot add LoRA adapter {name!r}: {exc}") from exc


def lora_tensors(peft_model, adapter: str) -> dict[str, torch.nn.Parameter]:
    """Every LoRA parameter of ``adapter``, keyed by its place in the model (the adapter's name taken out of
    the parameter name, so two adapters' keys match)."""
    place = re.compile(rf"(\.lora_\w+)\.{re.escape(adapter)}(\.|$)")
    return {place.sub(r"\1\2", n, count=1): p for n, p in adapter_parameters(peft_model, adapter).items()}


def copy_lora(base: LoadedBase, source: str, target: str) -> None:
    """Copy adapter ``source``'s LoRA tensors (A and B of every adapted module) into adapter ``target``.
    Both must have the same shape: the same modules adapted, with the same rank."""
    src, dst = lora_tensors(base.peft, source), lora_tensors(base.peft, target)
    if not src:
        raise ModelError(f"adapter {source!r} has no LoRA parameters to start {target!r} from")
    missing, extra = sorted(set(dst) - set(src)), sorted(set(src) - set(dst))
    shapes = [k for k in dst if k in src and src[k].shape != dst[k].shape]
    if missing or extra or shapes:
        why = (f"{len(missing)} of its LoRA tensors have no counterpart in {source!r} (e.g. {missing[0]})" if missing
               else f"{source!r} adapts modules it does not (e.g. {extra[0]})" if extra
               else f"{shapes[0]} is {tuple(src[shapes[0]].shape)} in {source!r}, {tuple(dst[shapes[0]].shape)} here")
        raise ModelError(f"adapter {target!r} cannot start from {source!r}: {why}; the rank, target modules and "
                         "layers must be the same")
    with torch.no_grad():
        for key, tensor in dst.items():
            tensor.copy_(src[key].to(dtype=tensor.dtype, device=tensor.device))


def merge_lora(base: LoadedBase, sources: Sequence[str], weights: Sequence[float], target: str, *, rank: int,
               alpha: float) -> None:
    """Add adapter ``target`` to ``base``: the weighted sum of ``sources``' updates (each one's B A times its
    scaling), cut back to ``rank`` by SVD, ready to be copied (:func:`copy_lora`) into an adapter of ``rank`` and
    ``alpha``, where it then applies that same summed update.

    The sum and SVD are PEFT's (``add_weighted_adapter``, combination "svd"). PEFT gives the result scaling 1 and
    all of each component's size in B (B = U S, A = V^T); here B is divided by the copy's scaling alpha / rank and
    each component's size is shared between A and B (sqrt of its singular value each), as in a trained LoRA, so
    the first optimizer steps move A and B alike."""
    missing = [s for s in sources if s not in base.adapter_names]
    if missing:
        raise ModelError(f"cannot merge {missing}: no such adapter on the base")
    if target in base.adapter_names:
        raise ModelError(f"an adapter named {target!r} is already loaded")
    names, shares = list(sources), [float(w) for w in weights]
    if len(names) == 1:  # PEFT sums a single adapter linearly, at its own rank: as two halves it takes the SVD path
        names, shares = names * 2, [shares[0] / 2] * 2
    base.peft.add_weighted_adapter(names, shares, target, combination_type="svd", svd_rank=rank)
    with torch.no_grad():
        for module in base.peft.modules():
            lora_a, lora_b = getattr(module, "lora_A", None), getattr(module, "lora_B", None)
            if lora_a is None or target not in lora_a:
                continue
            a, b = lora_a[target].weight, lora_b[target].weight  # [r, in], [out, r]
            singular = b.float().norm(dim=0)
            size = singular.clamp_min(1e-12).sqrt()  # sqrt of each component's singular value
            b.mul_((rank / alpha / size).to(b.dtype))
            a.mul_(size[:, None].to(a.dtype))
            # Components the sum does not fill (a start of lower rank than the recipe's) would have A and B zero,
            # and a LoRA component with both zero gets no gradient: they start as a fresh LoRA's do (A as PEFT
            # initialises it, B zero), so the update is unchanged and all of the rank can learn.
            empty = singular <= 1e-6 * float(singular.max().clamp_min(1e-30))
            if bool(empty.any()):
                fresh_a = torch.empty_like(a)
                torch.nn.init.kaiming_uniform_(fresh_a, a=math.sqrt(5))
                a[empty] = fresh_a[empty]
                b[:, empty] = 0
    freeze_all(base.peft)


def build_examples(base: LoadedBase, records: Sequence[Record], cfg: TrainConfig,
                   family_prefix: str | Mapping[str, str]) -> tuple[list[Example], int]:
    """Tokenized (prompt, target) pairs of ``records``; examples over ``cfg.max_length`` are dropped and
    counted (a truncated target would teach the model never to stop). ``family_prefix``: one prefix for every
    record, or a prefix per ``record.family``."""
    examples, dropped = [], 0
    for r in records:
        prefix = family_prefix[r.family] if isinstance(family_prefix, Mapping) else family_prefix
        ex = build_example(base.tokenizer, r.request, encode(r.graph, cfg.target_format, prefix),
                           cfg.system_prompt)
        if cfg.max_length is not None and len(ex.input_ids) > cfg.max_length:
            dropped += 1
            continue
        examples.append(ex)
    if not examples and records:
        raise ModelError(f"all {len(records)} records are longer than TrainConfig.max_length={cfg.max_length} tokens")
    return examples, dropped


def summarize(adapter_name: str, examples: Sequence[Example], dropped: int, cfg: TrainConfig, result: FitResult,
              family_prefix: str, epochs: int | None = None) -> TrainSummary:
    """epochs: the passes made (default ``cfg.epochs``; ``warm_epochs`` after a warm start); ``config`` keeps
    the whole recipe."""
    wall = result.wall_seconds
    epochs = cfg.epochs if epochs is None else epochs
    return TrainSummary(
        adapter_name=adapter_name, examples=len(examples), dropped_too_long=dropped, epochs=epochs,
        steps=result.steps, total_tokens=result.total_tokens, target_tokens=result.target_tokens,
        padded_tokens=result.padded_tokens, max_target_tokens=max(e.n_target for e in examples),
        wall_seconds=wall, tokens_per_second=round(result.total_tokens / wall, 2) if wall else 0.0,
        examples_per_second=round(len(examples) * epochs / wall, 3) if wall else 0.0,
        final_loss=result.final_loss, loss_curve=result.loss_curve, trainable_parameters=result.trainable_parameters,
        precision=result.precision, device=result.device, target_format=cfg.target_format,
        family_prefix=family_prefix, config=cfg.to_dict(), terms=result.term_means)
