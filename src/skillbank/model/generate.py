"""Batched greedy generation with per-output confidence.

Prompts are padded on the left (decoder-only models continue the last position of every row), batched
in order of length so rows of a batch need little padding, and decoded greedily until a stop token
(end-of-turn or EOS) or ``max_new_tokens``. Besides the text, each output carries the number of tokens
generated and the mean log-probability of those tokens under the model -- the confidence that
self-routing compares across executors.

Works with a bare base model or a ``peft.PeftModel`` (whatever adapter is active generates; to generate
with the bare base under a PeftModel use ``with peft_model.disable_adapter(): ...``).
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from skillbank.errors import ModelError
from skillbank.model.prompts import DEFAULT_SYSTEM_PROMPT, encode_text, render_prompt, stop_token_ids

DEFAULT_MAX_NEW_TOKENS = 768  # the paper's cap


@dataclass(frozen=True)
class Generation:
    """One generated output.

    text: the decoded generation without special tokens (the stop token is not part of it).
    n_tokens: tokens generated, the stop token included.
    mean_logprob: mean natural-log probability of the generated tokens (stop token included), <= 0.
    stopped: True if a stop token ended it, False if it ran into ``max_new_tokens`` (likely truncated).
    """

    text: str
    n_tokens: int
    mean_logprob: float
    stopped: bool


@dataclass
class GenerationStats:
    """Totals of one :func:`generate` call: prompts, generated tokens, wall seconds, tokens per second."""

    prompts: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds else 0.0


class _GreedyLogprob:
    """A logits processor that leaves the scores unchanged and records, per step, the log-probability of
    the token greedy decoding picks (the arg-max). It runs after any other processor; with the plain
    greedy configuration used here there is none, so the scores it sees are the model's logits."""

    def __init__(self):
        self.steps: list[torch.Tensor] = []  # per step: [B] log-probabilities
        self.choices: list[torch.Tensor] = []  # per step: [B] arg-max ids, to check against the output

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        idx = scores.argmax(dim=-1)  # [B], the same call greedy search makes
        logp = torch.log_softmax(scores.float(), dim=-1)  # [B, V]
        self.steps.append(logp.gather(1, idx[:, None]).squeeze(1))
        self.choices.append(idx)
        return scores


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows padded on the left into ids [B, T] and attention mask [B, T] (decoder-only generation
    continues every row from its last position)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r):] = 1
    return ids, mask


@torch.inference_mode()
def generate(model, tokenizer, prompts: Sequence[str], *, batch_size: int = 8,
             max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, progress: bool = False,
             stats: GenerationStats | None = None) -> list[Generation]:
    """Greedy-decode every rendered prompt string (see ``prompts.render_prompt``); outputs in input order.

    batch_size: prompts decoded together (rows that finish early idle until the batch ends).
    stats: when given, totals are added to it.
    """
    from transformers import GenerationConfig, LogitsProcessorList

    if batch_size < 1:
        raise ModelError(f"batch_size must be >= 1, got {batch_size}")
    if max_new_tokens < 1:
        raise ModelError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    prompts = list(prompts)
    if not prompts:
        return []
    model.eval()
    device = next(model.parameters()).device
    stops = stop_token_ids(tokenizer, model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    config = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=max_new_tokens,
                              eos_token_id=stops, pad_token_id=pad_id)
    encoded = [encode_text(tokenizer, p) for p in prompts]
    # Longest first: the largest batch (and memory peak) comes first, and similar lengths share a batch.
    order = sorted(range(len(prompts)), key=lambda i: -len(encoded[i]))
    results: list[Generation | None] = [None] * len(prompts)
    t0 = time.perf_counter()
    done_tokens = 0
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        ids, mask = left_pad([encoded[i] for i in idx], pad_id)
        tracker = _GreedyLogprob()
        out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=config,
                             logits_processor=LogitsProcessorList([tracker]))
        new = out[:, ids.shape[1]:].cpu()  # [b, steps]
        logps = torch.stack(tracker.steps, dim=1).cpu()  # [b, steps]
        choices = torch.stack(tracker.choices, dim=1).cpu()
        for row, i in enumerate(idx):
            toks = new[row].tolist()
            stop_at = next((k for k, t in enumerate(toks) if t in stops), None)
            n = stop_at + 1 if stop_at is not None else len(toks)
            if not torch.equal(choices[row, :n], new[row, :n]):
                raise ModelError("generation did not follow greedy arg-max; another logits processor is active")
            text = tokenizer.decode(toks[:stop_at] if stop_at is not None else toks, skip_special_tokens=True)
            results[i] = Generation(text=text.strip(), n_tokens=n, mean_logprob=float(logps[row, :n].mean()),
                                    stopped=stop_at is not None)
            done_tokens += n
        if progress:
            elapsed = time.perf_counter() - t0
            finished = min(start + batch_size, len(order))
            print(f"\rgenerate {finished}/{len(order)}  {done_tokens / elapsed:.1f} tok/s  "
                  f"{elapsed:.0f}s elapsed", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    if stats is not None:
        stats.prompts += len(prompts)
        stats.prompt_tokens += sum(len(e) for e in encoded)
        stats.generated_tokens += done_tokens
        stats.seconds += time.perf_counter() - t0
    assert all(r is not None for r in results)
    return results  # type: ignore[return-value]


def generate_for_requests(model, tokenizer, requests: Sequence[str], *, system_prompt: str = DEFAULT_SYSTEM_PROMPT,
                          batch_size: int = 8, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, progress: bool = False,
                          stats: GenerationStats | None = None) -> list[Generation]:
    """Render the closed-book prompt for each raw request and :func:`generate`."""
    prompts = [render_prompt(tokenizer, r, system_prompt) for r in requests]
    return generate(model, tokenizer, prompts, batch_size=batch_size, max_new_tokens=max_new_tokens,
                    progress=progress, stats=stats)

