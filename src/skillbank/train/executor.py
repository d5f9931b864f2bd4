"""Training one executor: a fresh LoRA adapter on the frozen base, fitted to one stage's records only.

The adapter learns request -> serialised task graph (``skillbank.model.serialization``) with the
closed-book prompt (``skillbank.model.prompts``); the loss is next-token cross-entropy on the target
tokens only. Logits are computed only at positions that predict a target token: the output layer
(49,152 x 576 for SmolLM2) is a fifth of the model's compute per position and the prompt positions carry
no loss, so this skips a large share of the work and memory.

Speed on a small CPU (bench/train_probe.py): batches are grouped by length to cut padding; mixed
precision ``bf16`` (autocast) is ~1.3x faster than fp32 where the CPU supports bfloat16; LoRA restricted
to the top layers (``layers_to_transform``) makes backward stop at the lowest adapted layer (autograd
only differentiates what depends on a trainable tensor) -- ~1.5x faster, but it learned much worse.

The base holds every adapter (``LoadedBase.add_adapter``): training one leaves the weights of the base
and of every other adapter untouched, and the new adapter is frozen when training ends.
"""
from __future__ import annotations

import math
import random
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Optional, Sequence

import torch

from skillbank.data.records import Record
from skillbank.errors import ModelError
from skillbank.model.base import LoadedBase, freeze_all
from skillbank.model.prompts import DEFAULT_SYSTEM_PROMPT, IGNORE_INDEX, Example, build_example
from skillbank.model.serialization import FORMATS, encode

__all__ = ["TrainConfig", "TrainSummary", "train_executor", "freeze_all", "common_prefix", "top_layers",
           "resolve_precision"]

PRECISIONS = ("auto", "fp32", "bf16")


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
    max_length: examples longer than this many tokens (prompt + target) are dropped and counted in
        the summary (a truncated target would teach the model never to stop); None = no limit.
    seed: seeds adapter initialisation, dropout and batch order.
    target_format: "json" (the contract, full ids) or "compact" (see serialization; ~3x fewer tokens).
    system_prompt: the fixed system instruction (prompts.DEFAULT_SYSTEM_PROMPT or PAPER_SYSTEM_PROMPT).
    precision: "bf16" (autocast to bfloat16), "fp32", or "auto" = bf16 where the device supports it.
    """

    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.05
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    layers_to_transform: Optional[tuple[int, ...]] = None
    lr: float = 4e-4
    epochs: int = 6
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

    def __post_init__(self):
        def bad(name, expected):
            raise ModelError(f"TrainConfig.{name} must be {expected}, got {getattr(self, name)!r}")

        for name in ("rank", "epochs", "batch_size", "grad_accum"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                bad(name, "a positive integer")
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
    family_prefix: str
    config: dict = field(default_factory=dict)

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


def resolve_precision(precision: str, device: torch.device) -> str:
    """"auto" -> "bf16" where bfloat16 matmuls are fast (CUDA with bf16, or a CPU with AVX512-BF16/AMX)."""
    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    if device.type == "cpu":
        try:
            return "bf16" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "fp32"
        except (AttributeError, RuntimeError):
            return "fp32"
    return "fp32"


def length_grouped_batches(lengths: Sequence[int], batch_size: int, generator: random.Random,
                           group: int = 64) -> list[list[int]]:
    """Shuffle, cut into groups of ``group`` batches, sort each group by length, batch, shuffle the batches.

    Rows of a batch then have similar lengths (little padding) while batch order stays random.
    """
    order = list(range(len(lengths)))
    generator.shuffle(order)
    span = batch_size * group
    batches = []
    for start in range(0, len(order), span):
        chunk = sorted(order[start:start + span], key=lambda i: -lengths[i])
        batches += [chunk[k:k + batch_size] for k in range(0, len(chunk), batch_size)]
    generator.shuffle(batches)
    return batches


def collate(examples: Sequence[Example], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad to the longest row: input_ids [B, T], attention_mask [B, T], labels [B, T] (IGNORE on pads)."""
    width = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for i, e in enumerate(examples):
        n = len(e.input_ids)
        ids[i, :n] = torch.tensor(e.input_ids)
        labels[i, :n] = torch.tensor(e.labels)
        mask[i, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _fast_head_ok(model) -> bool:
    """True when logits are plainly lm_head(last hidden state): no soft-capping or logit scaling to re-apply."""
    cfg = getattr(model, "config", None)
    if any(getattr(cfg, a, None) not in (None, 1, 1.0) for a in ("final_logit_softcapping", "logit_scale")):
        return False
    return hasattr(model, "get_decoder") and model.get_output_embeddings() is not None


def target_loss(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean cross-entropy over the target tokens of a batch (a scalar).

    model: the plain causal LM with LoRA layers injected (``peft_model.get_base_model()``).
    Position t predicts token t+1, so hidden states [B, T-1] are matched with labels[:, 1:]; only the N
    positions whose next token is a target are sent through the output layer ([N, H] -> [N, V]).
    """
    labels = batch["labels"][:, 1:]  # [B, T-1]
    keep = labels != IGNORE_INDEX  # [B, T-1]
    if _fast_head_ok(model):
        hidden = model.get_decoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                     use_cache=False).last_hidden_state  # [B, T, H]
        logits = model.get_output_embeddings()(hidden[:, :-1][keep])  # [N, V]
    else:
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       use_cache=False).logits[:, :-1][keep]  # [N, V]
    return torch.nn.functional.cross_entropy(logits.float(), labels[keep])


def _downsample(values: list[float], points: int = 200) -> list[float]:
    if len(values) <= points:
        return [round(v, 5) for v in values]
    step = len(values) / points
    return [round(sum(values[int(i * step):int((i + 1) * step)]) / max(1, int((i + 1) * step) - int(i * step)), 5)
            for i in range(points)]


# -- training --------------------------------------------------------------------------------------
def train_executor(base: LoadedBase, records: Sequence[Record], cfg: TrainConfig | None = None, *,
                   adapter_name: str, family_prefix: str | None = None, progress: bool = True):
    """Train a fresh LoRA adapter ``adapter_name`` on ``records`` and return ``(peft_model, TrainSummary)``.

    The adapter is added to ``base`` (``base.peft`` is the PeftModel holding every adapter), trained with
    AdamW + linear warm-up/decay, then frozen and left active in eval mode. ``family_prefix`` is the
    skill-id prefix the compact format strips (default: the longest ``::`` prefix shared by the records'
    skills); it is returned in the summary because decoding needs it.
    """
    from peft import LoraConfig

    cfg = cfg or TrainConfig()
    records = list(records)
    if not records:
        raise ModelError("no training records")
    if not all(isinstance(r, Record) for r in records):
        raise ModelError("records must be skillbank.data.records.Record objects")
    num_layers = base.num_layers
    if cfg.layers_to_transform and max(cfg.layers_to_transform) >= num_layers:
        raise ModelError(f"TrainConfig.layers_to_transform names layer {max(cfg.layers_to_transform)}, "
                         f"but the base has layers 0..{num_layers - 1}")
    if family_prefix is None:
        family_prefix = common_prefix(sorted({t for r in records for t in r.graph.tasks}))

    tokenizer = base.tokenizer
    examples, dropped = [], 0
    for r in records:
        ex = build_example(tokenizer, r.request, encode(r.graph, cfg.target_format, family_prefix), cfg.system_prompt)
        if cfg.max_length is not None and len(ex.input_ids) > cfg.max_length:
            dropped += 1
            continue
        examples.append(ex)
    if not examples:
        raise ModelError(f"all {len(records)} records are longer than TrainConfig.max_length={cfg.max_length} tokens")

    rng = random.Random(cfg.seed)
    torch.manual_seed(cfg.seed)  # adapter initialisation and dropout masks
    lora = LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, bias="none",
                      target_modules=list(cfg.target_modules), task_type="CAUSAL_LM",
                      layers_to_transform=list(cfg.layers_to_transform) if cfg.layers_to_transform else None)
    try:
        peft_model = base.add_adapter(adapter_name, lora)
    except ModelError:
        raise
    except ValueError as exc:  # peft: a target module that does not exist, etc.
        raise ModelError(f"cannot add LoRA adapter {adapter_name!r}: {exc}") from exc
    try:
        summary = _fit(base, peft_model, examples, cfg, rng, adapter_name, progress)
    except BaseException:
        base.remove_adapter(adapter_name)  # never leave a half-trained adapter behind
        raise
    summary.dropped_too_long = dropped
    summary.family_prefix = family_prefix
    return peft_model, summary


def _fit(base: LoadedBase, peft_model, examples: list[Example], cfg: TrainConfig, rng: random.Random,
         adapter_name: str, progress: bool) -> TrainSummary:
    from accelerate import Accelerator
    from transformers import get_scheduler

    # Accelerator picks the device (CUDA when present) and runs backward; autocast is applied directly
    # rather than through Accelerator(mixed_precision=...), whose process-wide state cannot change
    # between two trainings in one process.
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    device = accelerator.device
    peft_model.to(device)
    precision = resolve_precision(cfg.precision, device)
    # Only the new adapter trains: its lora_A / lora_B weights (module keys end in the adapter name).
    freeze_all(peft_model)
    params = []
    mine = re.compile(rf"\.lora_\w+\.{re.escape(adapter_name)}(\.|$)")
    for name, p in peft_model.named_parameters():
        if mine.search(name):
            p.requires_grad_(True)
            params.append(p)
    if not params:
        raise ModelError(f"adapter {adapter_name!r} has no parameters; check TrainConfig.target_modules")
    trainable = sum(p.numel() for p in params)
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    per_epoch = math.ceil(len(examples) / cfg.batch_size)
    steps_per_epoch = math.ceil(per_epoch / cfg.grad_accum)
    total_steps = steps_per_epoch * cfg.epochs
    scheduler = get_scheduler("linear", optimizer, num_warmup_steps=int(cfg.warmup_ratio * total_steps),
                              num_training_steps=total_steps)
    pad_id = base.tokenizer.pad_token_id
    lm = peft_model.get_base_model()
    lengths = [len(e.input_ids) for e in examples]

    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=total_steps, desc=f"train {adapter_name}", unit="step", file=sys.stderr,
                   dynamic_ncols=True, leave=True)
    curve: list[float] = []
    tokens = target_tokens = padded = 0
    t0 = time.perf_counter()
    peft_model.train()
    try:
        for epoch in range(cfg.epochs):
            batches = length_grouped_batches(lengths, cfg.batch_size, rng)
            for k in range(0, len(batches), cfg.grad_accum):
                group = batches[k:k + cfg.grad_accum]
                step_loss = 0.0
                for idx in group:
                    batch = {n: t.to(device) for n, t in collate([examples[i] for i in idx], pad_id).items()}
                    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                        loss = target_loss(lm, batch) / len(group)
                    accelerator.backward(loss)
                    step_loss += float(loss.detach())
                    tokens += int(batch["attention_mask"].sum())
                    target_tokens += int((batch["labels"] != IGNORE_INDEX).sum())
                    padded += batch["input_ids"].numel()
                if cfg.max_grad_norm is not None:
                    torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                curve.append(step_loss)
                if bar is not None:
                    rate = tokens / max(time.perf_counter() - t0, 1e-9)
                    bar.set_postfix(epoch=f"{epoch + 1}/{cfg.epochs}", loss=f"{step_loss:.4f}", tok_s=f"{rate:.0f}")
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        peft_model.eval()
        freeze_all(peft_model)
        optimizer.zero_grad(set_to_none=True)
    wall = time.perf_counter() - t0
    last = curve[-steps_per_epoch:]
    return TrainSummary(
        adapter_name=adapter_name, examples=len(examples), dropped_too_long=0, epochs=cfg.epochs,
        steps=len(curve), total_tokens=tokens, target_tokens=target_tokens, padded_tokens=padded,
        max_target_tokens=max(e.n_target for e in examples),
        wall_seconds=round(wall, 3), tokens_per_second=round(tokens / wall, 2) if wall else 0.0,
        examples_per_second=round(len(examples) * cfg.epochs / wall, 3) if wall else 0.0,
        final_loss=round(sum(last) / len(last), 5), loss_curve=_downsample(curve), trainable_parameters=trainable,
        precision=precision, device=str(device), target_format=cfg.target_format, family_prefix="",
        config=cfg.to_dict())
