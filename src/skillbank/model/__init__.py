"""The language-model side of an executor: base loading, the closed-book prompt, target formats, generation.

* ``base``: :class:`BaseModelConfig`, :func:`load_base` -> :class:`LoadedBase` (frozen model, tokenizer,
  identity with weights digest; holds the LoRA adapters by name).
* ``prompts``: the fixed system instruction + ``Plan the following request: <request>``; label masks.
* ``serialization``: ``json`` (the contract) and ``compact`` target text, :func:`encode` / :func:`decode`.
* ``generate``: batched greedy decoding with per-output mean token log-probability.
* ``tiny``: a tiny random Llama for fast tests.
* ``llamacpp``: the embedded base's GGUF in llama.cpp with each shard's LoRA converted (the fast path).

Names are imported on first use: the llama.cpp path imports ``skillbank.model.*`` modules without torch.
"""
_LAZY = {
    **dict.fromkeys(["BaseModelConfig", "LoadedBase", "freeze_all", "load_base"], "skillbank.model.base"),
    **dict.fromkeys(["Generation", "GenerationStats", "generate", "generate_for_requests"], "skillbank.model.generate"),
    **dict.fromkeys(["DEFAULT_SYSTEM_PROMPT", "PAPER_SYSTEM_PROMPT", "build_example", "render_prompt"],
                    "skillbank.model.prompts"),
    **dict.fromkeys(["FORMATS", "encode", "decode"], "skillbank.model.serialization"),
}
__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'skillbank.model' has no attribute {name!r}")
