"""The one training loop every method shares.

A continual method differs from sequential fine-tuning only in what it adds to this loop:

* which adapter trains and which adapters are active in the forward pass (FSM and sequential SFT: one;
  Progressive-LoRA and O-LoRA: every earlier frozen adapter plus the new one, summed);
* extra loss terms (:class:`LossTerm`: LwF's distillation, EWC's penalty, O-LoRA's orthogonality), each
  a small object that sees the step's batch and the target-position logits;
* the data mix (Replay), decided before the loop by whoever builds ``examples``.

Loss: next-token cross-entropy on the target tokens only. Logits are computed only at positions that
predict a target token: the output layer (49,152 x 576 for SmolLM2) is a fifth of the model's compute per
position and the prompt positions carry no loss.

Several processes (``accelerate launch``): every process builds the same batch order from the same seed
and takes its share of each optimizer step's micro-batches; gradients of the trainable parameters are
averaged across processes before the step, so all processes keep identical weights. (Hand-written rather
than DDP-wrapped because the loss calls the decoder and the output layer separately, which DDP's forward
hooks would not see.)
"""
from __future__ import annotations

import math
import random
import re
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional, Sequence

import torch

from skillbank.errors import ModelError
from skillbank.model.base import LoadedBase, bf16_is_fast, freeze_all
from skillbank.model.prompts import IGNORE_INDEX, Example
from skillbank.train.checkpoint import FitCheckpoint, fit_fingerprint, python_rng_state, set_python_rng_state

__all__ = ["LossTerm", "StepContext", "FitResult", "fit", "target_logits", "target_loss", "shared_head_length",
           "collate", "length_grouped_batches", "resolve_precision", "resolve_attention", "set_attention",
           "adapter_parameters", "swapped_adapters"]

PRECISIONS = ("auto", "fp32", "bf16")
ATTENTIONS = ("auto", "sdpa-fp32", "eager", "sdpa")


# -- pieces ------------------------------------------------------------------------------------
def process_state():
    """accelerate's process group state (one process, or several under ``accelerate launch``/torchrun).
    ``cpu=True`` where there is no GPU: without it accelerate ignores a CPU process group (gloo)."""
    from accelerate import PartialState
    return PartialState(cpu=not torch.cuda.is_available())


def resolve_precision(precision: str, device: torch.device) -> str:
    """"auto" -> "bf16" where bfloat16 matmuls are fast (CUDA with bf16, or an AVX-512 CPU)."""
    if precision != "auto":
        return precision
    return "bf16" if bf16_is_fast(device) else "fp32"


def resolve_attention(attention: str, device: torch.device, has_sdpa: bool = True) -> str | None:
    """"auto" -> "sdpa-fp32" on a CPU for an architecture with sdpa, else None (the model's own).

    On a CPU, torch's fused attention kernel is slow in bfloat16 (as autocast gives it) and fast in float32. Run in
    float32 inside the bfloat16 step it trains the demo in 756 s instead of 978 (eager attention: 730 s) at the
    bfloat16 kernel's EM (66.4 / 68.0 against 66.4 / 68.4; eager 65.6 / 67.6), and it is the most exact of the
    three (bench/train_attention.py, docs/lab-notebook.md). On a GPU the bfloat16 kernels are the fast ones."""
    if attention != "auto":
        return attention
    return "sdpa-fp32" if device.type == "cpu" and has_sdpa else None


# transformers' name for :func:`_sdpa_fp32` (its registries are process-wide)
_SDPA_FP32 = "skillbank_sdpa_fp32"


def _sdpa_fp32(module, query, key, value, attention_mask, **kwargs):
    """transformers' own sdpa attention with autocast off and its inputs in float32, the output cast back. Written
    here because transformers has no setting for the precision of attention alone."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if attention_mask is not None and attention_mask.is_floating_point():
        attention_mask = attention_mask.float()
    with torch.autocast(device_type=query.device.type, enabled=False):
        out, weights = sdpa_attention_forward(module, query.float(), key.float(), value.float(), attention_mask,
                                              **kwargs)
    return out.to(query.dtype), weights


def _registered(implementation: str) -> str:
    """transformers' name of ``implementation``, registering "sdpa-fp32" (with sdpa's masks) on the way."""
    if implementation != "sdpa-fp32":
        return implementation
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(_SDPA_FP32, _sdpa_fp32)
    AttentionMaskInterface.register(_SDPA_FP32, sdpa_mask)
    return _SDPA_FP32


def set_attention(model, implementation: str | None) -> Callable[[], None]:
    """Set ``model``'s attention to ``implementation`` (None: leave it); return what puts the model's own back, so
    that what plans with the same loaded model afterwards computes exactly as before."""
    before = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if implementation is None or before is None or implementation == before:
        return lambda: None
    try:
        model.set_attn_implementation(_registered(implementation))
    except (ValueError, ImportError) as exc:  # a model transformers cannot run that way
        raise ModelError(f"TrainConfig.attention {implementation!r} does not work with this model: {exc}") from exc
    return lambda: model.set_attn_implementation(before)


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


# A prompt head shorter than this is not worth a forward pass of its own.
MIN_SHARED_HEAD = 8
# fit runs the shared prompt head once per batch (when there is no dropout); False: every row runs it, as before
# (bench/train_head.py times both).
SHARE_PROMPT_HEAD = True


def shared_head_length(batch: dict[str, torch.Tensor]) -> int:
    """How many leading tokens every row of ``batch`` shares with no target predicted from them: the fixed
    prompt head (system instruction, chat markup: 30 of the built-in stream's ~119 tokens a row). 0 when that
    is shorter than :data:`MIN_SHARED_HEAD` or the batch has one row."""
    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    if ids.shape[0] < 2:
        return 0
    same = ((ids == ids[:1]) & (mask == 1)).all(dim=0).long()  # [T]
    common = int(same.cumprod(0).sum())
    targets = (labels != IGNORE_INDEX).any(dim=0).nonzero()
    first_target = int(targets[0]) if len(targets) else ids.shape[1]
    head = min(common, first_target - 1)  # position t predicts token t+1: the head predicts no target
    return head if head >= MIN_SHARED_HEAD else 0


def _decoder_with_head(decoder, batch: dict[str, torch.Tensor], head: int) -> torch.Tensor:
    """The decoder's hidden states at positions ``head``..T-1 of every row, the shared head run once.

    Same arithmetic as the whole batch's forward: the head's keys and values are computed for one row and
    repeated for the others (gradients of the adapter's weights sum over the rows, as they would), then the
    rows' own tokens attend to them. Written by hand because training forwards in transformers take no shared
    prefix."""
    from transformers import DynamicCache

    from skillbank.model.decode import cache_keyword

    ids, mask = batch["input_ids"], batch["attention_mask"]
    rows, width = ids.shape
    cache_arg, cache = cache_keyword(decoder), DynamicCache()
    decoder(input_ids=ids[:1, :head], attention_mask=mask[:1, :head], use_cache=True, **{cache_arg: cache})
    cache.batch_repeat_interleave(rows)
    positions = torch.arange(head, width, device=ids.device).expand(rows, -1)
    return decoder(input_ids=ids[:, head:], attention_mask=mask, position_ids=positions, use_cache=True,
                   **{cache_arg: cache}).last_hidden_state  # [B, T - head, H]


def target_logits(model, batch: dict[str, torch.Tensor], *, share_head: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits at the positions that predict a target token, and those targets: ``([N, V], [N])``.

    model: the plain causal LM with LoRA layers injected (``peft_model.get_base_model()``).
    Position t predicts token t+1, so hidden states [B, T-1] are matched with labels[:, 1:]; only the N
    positions whose next token is a target are sent through the output layer ([N, H] -> [N, V]).
    share_head: run the prompt head that every row shares once instead of once a row
        (:func:`shared_head_length`; a fifth fewer tokens through the model on the built-in stream). Only
        exact without dropout (the rows would share one dropout draw there); the training loop asks for it then.
    """
    labels = batch["labels"][:, 1:]  # [B, T-1]
    keep = labels != IGNORE_INDEX  # [B, T-1]
    if _fast_head_ok(model):
        head = shared_head_length(batch) if share_head else 0
        if head:
            hidden = _decoder_with_head(model.get_decoder(), batch, head)  # positions head..T-1: [B, T-head, H]
        else:
            hidden = model.get_decoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                         use_cache=False).last_hidden_state  # [B, T, H]
        logits = model.get_output_embeddings()(hidden[:, :-1][keep[:, head:]])  # [N, V]
    else:
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       use_cache=False).logits[:, :-1][keep]  # [N, V]
    return logits, labels[keep]


def target_loss(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean cross-entropy over the target tokens of a batch (a scalar)."""
    logits, labels = target_logits(model, batch)
    return torch.nn.functional.cross_entropy(logits.float(), labels)


def adapter_parameters(peft_model, adapter: str) -> dict[str, torch.nn.Parameter]:
    """The LoRA parameters of one adapter (module keys end in the adapter name), by parameter name."""
    mine = re.compile(rf"\.lora_\w+\.{re.escape(adapter)}(\.|$)")
    return {n: p for n, p in peft_model.named_parameters() if mine.search(n)}


@contextmanager
def swapped_adapters(base: LoadedBase, names: Sequence[str], trainable: Sequence[torch.nn.Parameter]
                     ) -> Iterator[None]:
    """Run the body with ``names`` active (e.g. LwF's teacher), then restore the previous active adapters
    and the trainable flags of ``trainable`` (peft's set_adapter rewrites requires_grad)."""
    tuner = base.peft.base_model
    before = tuner.active_adapters
    try:
        tuner.set_adapter(list(names), inference_mode=True)
        yield
    finally:
        tuner.set_adapter(list(before), inference_mode=True)
        for p in trainable:
            p.requires_grad_(True)


@dataclass
class StepContext:
    """What a loss term sees at one micro-batch.

    lm: the causal LM with LoRA layers; base: the LoadedBase (to swap adapters); batch: the collated
    batch on the device; logits [N, V] / labels [N]: the target positions' logits (with grad) and tokens;
    step: optimizer step (0-based); trainable: the parameters being trained, by name.
    """

    lm: object
    base: LoadedBase
    batch: dict
    logits: torch.Tensor
    labels: torch.Tensor
    step: int
    trainable: dict[str, torch.nn.Parameter]


class LossTerm:
    """An extra term added to the target cross-entropy; a method's distinctive piece. Subclasses set
    ``name`` and implement ``__call__`` returning a scalar tensor (already weighted)."""

    name: str = "term"

    def __call__(self, ctx: StepContext) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError


@dataclass
class FitResult:
    """Totals of one :func:`fit`. Tokens count real (non-padding) tokens over all epochs; ``padded_tokens``
    what the model processed; ``loss_curve`` is the mean target cross-entropy per optimizer step (at most
    200 points); ``term_means`` the mean of each extra loss term over the run."""

    steps: int
    total_tokens: int
    target_tokens: int
    padded_tokens: int
    wall_seconds: float
    final_loss: float
    loss_curve: list[float]
    trainable_parameters: int
    precision: str
    device: str
    term_means: dict[str, float] = field(default_factory=dict)


def _downsample(values: list[float], points: int = 200) -> list[float]:
    if len(values) <= points:
        return [round(v, 5) for v in values]
    step = len(values) / points
    return [round(sum(values[int(i * step):int((i + 1) * step)]) / max(1, int((i + 1) * step) - int(i * step)), 5)
            for i in range(points)]


# -- the loop ----------------------------------------------------------------------------------
def fit(base: LoadedBase, examples: Sequence[Example], cfg, *, adapter: str, active: Optional[Sequence[str]] = None,
        terms: Sequence[LossTerm] = (), on_step: Optional[Callable[[int], None]] = None, seed: int | None = None,
        progress: bool = True, desc: str | None = None, checkpoint: "FitCheckpoint | None" = None) -> FitResult:
    """Train adapter ``adapter`` (already added to ``base``) on ``examples`` with ``cfg`` (a TrainConfig).

    active: adapters in the forward pass (default: just ``adapter``); only ``adapter`` trains.
    terms: extra loss terms added to the target cross-entropy at every micro-batch.
    on_step: called after every optimizer step with the number of steps done (model back in train mode
        afterwards; a callback that evaluates must itself switch to eval and back).
    seed: batch order and dropout (default ``cfg.seed``).
    checkpoint: a :class:`~skillbank.train.checkpoint.FitCheckpoint`: the training writes its state there
        every few minutes and, when a checkpoint of this same training is there already, continues from
        it (same result as an uninterrupted run); the file is removed at the end.
    A fresh AdamW with linear warm-up/decay is used; at the end every parameter is frozen again, the
    model is in eval mode and ``active`` is left active.
    """
    from accelerate import Accelerator
    from transformers import get_scheduler

    if not examples:
        raise ModelError("no training examples")
    active = list(active) if active is not None else [adapter]
    if adapter not in active:
        raise ModelError(f"the trained adapter {adapter!r} must be among the active ones {active}")
    seed = cfg.seed if seed is None else seed
    rng = random.Random(seed)
    torch.manual_seed(seed)
    # Accelerator picks the device (CUDA when present), knows the process group, and runs backward;
    # autocast is applied directly rather than through Accelerator(mixed_precision=...), whose
    # process-wide state cannot change between two trainings in one process.
    process_state()  # the shared state first, so Accelerator sees the process group
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    world, rank = accelerator.num_processes, accelerator.process_index
    peft_model = base.activate(active)
    device = next(peft_model.parameters()).device  # where the base was loaded (BaseModelConfig.device)
    precision = resolve_precision(cfg.precision, device)
    attention = resolve_attention(cfg.attention, device,
                                  has_sdpa=getattr(peft_model.get_base_model(), "_supports_sdpa", False))
    named = adapter_parameters(peft_model, adapter)
    if not named:
        raise ModelError(f"adapter {adapter!r} has no parameters; check TrainConfig.target_modules")
    params = list(named.values())
    for p in params:
        p.requires_grad_(True)
    trainable = sum(p.numel() for p in params)
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    per_epoch = math.ceil(len(examples) / cfg.batch_size)
    group_size = cfg.grad_accum * world  # micro-batches per optimizer step, over all processes
    steps_per_epoch = math.ceil(per_epoch / group_size)
    total_steps = steps_per_epoch * cfg.epochs
    scheduler = get_scheduler("linear", optimizer, num_warmup_steps=int(cfg.warmup_ratio * total_steps),
                              num_training_steps=total_steps)
    pad_id = base.tokenizer.pad_token_id
    lm = peft_model.get_base_model()
    lengths = [len(e.input_ids) for e in examples]

    curve: list[float] = []
    term_sums = {t.name: 0.0 for t in terms}
    tokens = target_tokens = padded = 0
    step = 0
    start_epoch, start_batch, done_seconds = 0, 0, 0.0
    resume_rng = None
    fingerprint = None
    if checkpoint is not None:
        fingerprint = fit_fingerprint(adapter=adapter, active=active, train_config=cfg.to_dict(), seed=seed,
                                      world=world, examples=examples, start_weights=named,
                                      terms=[t.name for t in terms])
        saved = checkpoint.load(fingerprint)
        if saved is not None:
            with torch.no_grad():
                for n, p in named.items():
                    p.copy_(saved["weights"][n])
            optimizer.load_state_dict(saved["optimizer"])
            scheduler.load_state_dict(saved["scheduler"])
            torch.set_rng_state(saved["torch_rng"])
            if torch.cuda.is_available() and "cuda_rng" in saved:
                torch.cuda.set_rng_state_all(saved["cuda_rng"])
            step, start_epoch, start_batch = saved["step"], saved["epoch"], saved["next_batch"]
            resume_rng = saved["epoch_rng"]
            curve = list(saved["curve"])
            term_sums.update(saved["term_sums"])
            tokens, target_tokens, padded = saved["tokens"], saved["target_tokens"], saved["padded"]
            done_seconds = float(saved["seconds"])

    def snapshot(epoch: int, next_batch: int, epoch_rng: list) -> dict:
        """Everything the rest of the training depends on, for the checkpoint (train/checkpoint.py)."""
        return {"fingerprint": fingerprint, "weights": {n: p.detach().clone() for n, p in named.items()},
                "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "torch_rng": torch.get_rng_state(),
                **({"cuda_rng": torch.cuda.get_rng_state_all()} if torch.cuda.is_available() else {}),
                "step": step, "epoch": epoch, "next_batch": next_batch, "epoch_rng": epoch_rng,
                "curve": curve, "term_sums": term_sums, "tokens": tokens, "target_tokens": target_tokens,
                "padded": padded, "seconds": time.perf_counter() - t0}

    bar = None
    if progress and accelerator.is_main_process:
        from tqdm.auto import tqdm
        # the thread count in the bar: a job that crawls on one core of several says so at a glance
        bar = tqdm(total=total_steps, initial=step, desc=f"{desc or f'train {adapter}'} [{torch.get_num_threads()} threads]",
                   unit="step", file=sys.stderr, dynamic_ncols=True, leave=True)
    t0 = time.perf_counter() - done_seconds
    peft_model.train()
    restore_attention = set_attention(lm, attention)  # undone in the finally below
    try:
        for epoch in range(cfg.epochs):
            if epoch < start_epoch:  # finished before the checkpoint (whose generator state is that of its epoch)
                continue
            if epoch == start_epoch and resume_rng is not None:
                set_python_rng_state(rng, resume_rng)
            epoch_rng = python_rng_state(rng)
            batches = length_grouped_batches(lengths, cfg.batch_size, rng)
            first = start_batch if epoch == start_epoch else 0
            for k in range(first, len(batches), group_size):
                group = batches[k:k + group_size]
                mine = group[rank::world]
                step_loss = 0.0
                for idx in mine:
                    batch = {n: t.to(device) for n, t in collate([examples[i] for i in idx], pad_id).items()}
                    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                        logits, labels = target_logits(lm, batch, share_head=SHARE_PROMPT_HEAD and cfg.dropout == 0)
                        loss = torch.nn.functional.cross_entropy(logits.float(), labels)
                        step_loss += float(loss.detach()) / len(mine)
                        if terms:
                            ctx = StepContext(lm, base, batch, logits, labels, step, named)
                            for term in terms:
                                value = term(ctx)
                                term_sums[term.name] += float(value.detach()) / len(mine)
                                loss = loss + value
                    accelerator.backward(loss / len(group))
                    tokens += int(batch["attention_mask"].sum())
                    target_tokens += int((batch["labels"] != IGNORE_INDEX).sum())
                    padded += batch["input_ids"].numel()
                if world > 1:  # every process must apply the same update
                    for p in params:
                        if p.grad is None:
                            p.grad = torch.zeros_like(p)
                        p.grad = accelerator.reduce(p.grad, reduction="sum")
                if cfg.max_grad_norm is not None:
                    torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                step += 1
                curve.append(step_loss)
                if bar is not None:
                    rate = tokens * world / max(time.perf_counter() - t0, 1e-9)
                    bar.set_postfix(epoch=f"{epoch + 1}/{cfg.epochs}", loss=f"{step_loss:.4f}", tok_s=f"{rate:.0f}")
                    bar.update(1)
                if checkpoint is not None and step < total_steps and checkpoint.due() and accelerator.is_main_process:
                    checkpoint.save(snapshot(epoch, k + group_size, epoch_rng))
                if on_step is not None:
                    on_step(step)
                    peft_model.train()
                    for p in params:
                        p.requires_grad_(True)
        if checkpoint is not None and accelerator.is_main_process:
            if checkpoint.keep_final:  # past the last epoch: a rerun loads these weights and trains no step
                checkpoint.save({**snapshot(cfg.epochs, 0, python_rng_state(rng)), "finished": True})
            else:
                checkpoint.remove()
    finally:
        restore_attention()
        if bar is not None:
            bar.close()
        optimizer.zero_grad(set_to_none=True)
        base.activate(active)  # eval mode, everything frozen
    wall = time.perf_counter() - t0
    last = curve[-steps_per_epoch:]
    return FitResult(steps=len(curve), total_tokens=tokens * world, target_tokens=target_tokens * world,
                     padded_tokens=padded * world, wall_seconds=round(wall, 3),
                     final_loss=round(sum(last) / len(last), 5), loss_curve=_downsample(curve),
                     trainable_parameters=trainable, precision=precision, device=str(device),
                     term_means={k: round(v / max(1, step), 6) for k, v in term_sums.items()})
