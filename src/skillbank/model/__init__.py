"""The language-model side of an executor: base loading, the closed-book prompt, target formats, generation.

* ``base``: :class:`BaseModelConfig`, :func:`load_base` -> :class:`LoadedBase` (frozen model, tokenizer,
  identity with weights digest; holds the LoRA adapters by name).
* ``prompts``: the fixed system instruction + ``Plan the following request: <request>``; label masks.
* ``serialization``: ``json`` (the contract) and ``compact`` target text, :func:`encode` / :func:`decode`.
* ``generate``: batched greedy decoding with per-output mean token log-probability.
* ``tiny``: a tiny random Llama for fast tests.
"""
from skillbank.model.base import BaseModelConfig, LoadedBase, freeze_all, load_base
from skillbank.model.generate import Generation, GenerationStats, generate, generate_for_requests
from skillbank.model.prompts import DEFAULT_SYSTEM_PROMPT, PAPER_SYSTEM_PROMPT, build_example, render_prompt
from skillbank.model.serialization import FORMATS, decode, encode

__all__ = ["BaseModelConfig", "LoadedBase", "load_base", "freeze_all", "Generation", "GenerationStats", "generate",
           "generate_for_requests", "DEFAULT_SYSTEM_PROMPT", "PAPER_SYSTEM_PROMPT", "build_example", "render_prompt",
           "FORMATS", "encode", "decode"]
