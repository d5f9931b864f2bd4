"""Batched greedy generation with per-output confidence.

Prompts are decoded greedily, longest first, as one batch of at most ``batch_size`` rows whose finished
rows leave and whose free slots the next prompts take (``skillbank.model.decode``), until a stop token
(end-of-turn or EOS) or ``max_new_tokens``. Besides the text, each output carries the number of tokens
generated and the mean log-probability of those tokens under the model -- the confidence that
self-routing compares across executors.

Works with a bare base model or a ``peft.PeftModel`` (whatever adapter is active generates; to generate
with the bare base under a PeftModel use ``with peft_model.disable_adapter(): ...``).
"""
from __future__ import annotations

import functools
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Sequence

from skillbank.errors import ModelError
from skillbank.model.prompts import DEFAULT_SYSTEM_PROMPT, encode_text, render_prompt

DEFAULT_MAX_NEW_TOKENS = 768  # the paper's cap


@dataclass(frozen=True)
class Generation:
    """One generated output.

    text: the decoded generation without special tokens (the stop token is not part of it).
    n_tokens: tokens generated, the stop token included.
    mean_logprob: mean natural-log probability of the generated tokens (stop token included), <= 0.
    stopped: True if a stop token ended it, False if it ran into ``max_new_tokens`` (likely truncated) or into
        a dead end of its grammar.
    reason: why it did not stop (None when it stopped).
    """

    text: str
    n_tokens: int
    mean_logprob: float
    stopped: bool
    reason: str | None = None


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


def report_progress(finished: int, total: int, tokens: int, t0: float) -> None:
    """The one-line generation progress every decoder prints to stderr (outputs done, tokens/s, seconds, and the
    time left at this pace), redrawn in place; the caller ends it with a newline."""
    elapsed = max(time.perf_counter() - t0, 1e-9)
    left = f"  ~{elapsed / finished * (total - finished):.0f}s left" if 0 < finished < total else ""
    print(f"\rgenerate {finished}/{total}  {tokens / elapsed:.1f} tok/s  {elapsed:.0f}s elapsed{left}", end="",
          file=sys.stderr, flush=True)


def _inference_mode(fn):
    """``torch.inference_mode`` imported at call time: this module's constants and result types are read by
    the llama.cpp path, which never imports torch."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        import torch

        with torch.inference_mode():
            return fn(*args, **kwargs)
    return wrapper


@_inference_mode
def generate(model, tokenizer, prompts: Sequence[str], *, batch_size: int = 8,
             max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, progress: bool = False,
             stats: GenerationStats | None = None, adapter_names: Sequence[str] | None = None,
             base=None, grammars: Sequence | None = None, lora: str = "auto", prefixes=None,
             priors: Sequence | None = None) -> list[Generation]:
    """Greedy-decode every rendered prompt string (see ``prompts.render_prompt``); outputs in input order.

    batch_size: rows decoded together. A row leaves as soon as it stops and the next prompt takes its slot
        (:class:`~skillbank.model.decode.RowBatch`), so no row waits for a longer neighbour.
    adapter_names: per prompt, the LoRA adapter of ``model`` (a PeftModel) that generates it, rows of
        several adapters sharing a batch; ``base`` is the LoadedBase owning the model. None: the active one.
    stats: when given, totals are added to it.
    grammars: per prompt a :class:`~skillbank.model.constrain.GraphGrammar` its output must follow (or None:
        unconstrained); each is compiled once (``constrain.grammar_cache``) and every row gets its own matcher.
    lora: how a batch whose rows use several adapters applies them: ``"auto"``, ``"gathered"`` or ``"peft"``
        (:class:`~skillbank.model.decode.RowBatch`).
    prefixes: a :class:`~skillbank.model.decode.PrefixKV` kept by the caller across calls, so a prompt prefix
        the calls share is prefilled once; the caller drops it when the model's adapters change. None: this
        call's own.
    priors: per prompt a :class:`~skillbank.model.constrain.SkillPrior` weighing its skill names (or None);
        only where the prompt has a grammar.
    """
    from skillbank.model.decode import RowBatch

    if batch_size < 1:
        raise ModelError(f"batch_size must be >= 1, got {batch_size}")
    if max_new_tokens < 1:
        raise ModelError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    prompts = list(prompts)
    if adapter_names is not None and len(adapter_names) != len(prompts):
        raise ModelError(f"got {len(prompts)} prompts but {len(adapter_names)} adapter names")
    if grammars is not None and len(grammars) != len(prompts):
        raise ModelError(f"got {len(prompts)} prompts but {len(grammars)} grammars")
    if priors is not None and len(priors) != len(prompts):
        raise ModelError(f"got {len(prompts)} prompts but {len(priors)} skill priors")
    cache = None
    if grammars is not None and any(g is not None for g in grammars):
        from skillbank.model.constrain import grammar_cache
        cache = grammar_cache(model, tokenizer)
    if not prompts:
        return []
    model.eval()
    adapters = list(adapter_names) if adapter_names is not None else [None] * len(prompts)
    encoded = [encode_text(tokenizer, p) for p in prompts]
    lengths = [len(e) for e in encoded]
    # Longest first: the memory peak comes early and rows that join together need little padding.
    queue = deque(sorted(range(len(prompts)), key=lambda i: -lengths[i]))
    batch = RowBatch(model, tokenizer, base, lora=lora, prefixes=prefixes)
    results: list[Generation | None] = [None] * len(prompts)
    t0 = time.perf_counter()
    done_tokens = finished = 0
    # Refill once a quarter of the slots are free: joining rows are prefilled together, which costs less
    # than one prefill per freed slot.
    refill_at = max(1, batch_size // 4)
    while queue or batch.rows:
        free = batch_size - len(batch.rows)
        if queue and (free >= refill_at or not batch.rows):
            idx = [queue.popleft() for _ in range(min(free, len(queue)))]
            matchers = None
            if cache is not None:
                matchers = [cache.matcher(grammars[i], prior=priors[i] if priors is not None else None)
                            if grammars[i] is not None else None for i in idx]
            batch.add_ids([encoded[i] for i in idx], idx, [adapters[i] for i in idx], [max_new_tokens] * len(idx),
                          matchers)
        for row, d in batch.step():
            results[row.key] = Generation(d.text, d.n_tokens, d.mean_logprob, d.stopped, d.reason)
            done_tokens += d.n_tokens
            finished += 1
            if progress:
                report_progress(finished, len(prompts), done_tokens, t0)
    if progress:
        print(file=sys.stderr)
    if stats is not None:
        stats.prompts += len(prompts)
        stats.prompt_tokens += sum(lengths)
        stats.generated_tokens += done_tokens
        stats.seconds += time.perf_counter() - t0
    assert all(r is not None for r in results)
    return results  # type: ignore[return-value]


def generate_for_requests(model, tokenizer, requests: Sequence[str], *, system_prompt: str = DEFAULT_SYSTEM_PROMPT,
                          batch_size: int = 8, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, progress: bool = False,
                          stats: GenerationStats | None = None, grammars: Sequence | None = None,
                          adapter_names: Sequence[str] | None = None, base=None, lora: str = "auto",
                          prefixes=None, priors: Sequence | None = None) -> list[Generation]:
    """Render the closed-book prompt for each raw request and :func:`generate`."""
    prompts = [render_prompt(tokenizer, r, system_prompt) for r in requests]
    return generate(model, tokenizer, prompts, batch_size=batch_size, max_new_tokens=max_new_tokens,
                    progress=progress, stats=stats, grammars=grammars, adapter_names=adapter_names, base=base,
                    lora=lora, prefixes=prefixes, priors=priors)

