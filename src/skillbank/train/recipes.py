"""Which training recipe suits a base model, decided from its name or config.json without loading it.

``paper`` (rank 16, lr 4e-4, 6 epochs, JSON targets) is the paper's recipe for a multi-billion-parameter
base; ``small-cpu`` (compact targets, lr 2e-3, 3 epochs) is what a ~135M base needs to learn at all in a CPU
budget. ``learn`` (CLI, Python and service) uses :func:`recipe_for_base` when no recipe is given.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

SMALL_BASE_PARAMETERS = 1_000_000_000  # below this the paper recipe (lr 4e-4, JSON targets) barely moves the model


def recipe_for_base(base: str) -> tuple[str, str]:
    """('small-cpu' or 'paper', why) for a base model name, without loading it: the embedded base by name,
    others by the parameter count their config.json implies (a local directory, or the Hugging Face cache),
    else by a size written in the name ("Qwen3-8B", "SmolLM2-360M")."""
    if base == "embedded":
        return "small-cpu", "the embedded base is SmolLM2-135M (~135M parameters), too small for the paper recipe"
    config_file, where = None, ""
    local = Path(base).expanduser()
    if local.is_dir():
        config_file, where = local / "config.json", "its config.json"
    else:
        try:
            from huggingface_hub import try_to_load_from_cache
            cached = try_to_load_from_cache(base, "config.json")
            if isinstance(cached, str):
                config_file, where = Path(cached), "its cached config.json"
        except Exception:  # noqa: BLE001 - an id the hub library rejects simply has no cached config
            config_file = None
    n = parameters_from_config(config_file) if config_file is not None and config_file.is_file() else None
    if n is None:
        m = re.search(r"(?<![\d.])(\d+(?:\.\d+)?)\s*([MmBb])(?![A-Za-z])", base)
        if m:
            n = int(float(m.group(1)) * (1e6 if m.group(2) in "Mm" else 1e9))
            where = "the size in its name"
    if n is None:
        return "paper", (f"the size of base {base!r} is unknown (no config.json found locally, no size in its name); "
                         "the paper recipe is for multi-billion-parameter bases: pass --recipe small-cpu for a small one")
    size = f"~{n / 1e9:.1f}B" if n >= 1e9 else f"~{n / 1e6:.0f}M"
    if n < SMALL_BASE_PARAMETERS:
        return "small-cpu", f"base {base!r} has {size} parameters ({where}), under 1B: the paper recipe cannot teach it"
    return "paper", f"base {base!r} has {size} parameters ({where}), 1B or more"


def parameters_from_config(path: Path) -> int | None:
    """A decoder-only transformer's parameter count from its config.json (embeddings, attention, MLP)."""
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    cfg = cfg.get("text_config", cfg) if isinstance(cfg, dict) else {}
    try:
        h = int(cfg.get("hidden_size") or cfg.get("n_embd") or cfg["d_model"])
        layers = int(cfg.get("num_hidden_layers") or cfg["n_layer"])
        vocab = int(cfg["vocab_size"])
    except (KeyError, TypeError, ValueError):
        return None
    heads = int(cfg.get("num_attention_heads") or cfg.get("n_head") or 1)
    head_dim = int(cfg.get("head_dim") or h // heads)
    kv = int(cfg.get("num_key_value_heads") or heads)
    inter = int(cfg.get("intermediate_size") or cfg.get("n_inner") or 4 * h)
    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 1)
    if experts > 1:
        inter = int(cfg.get("moe_intermediate_size") or inter)
    attention = h * heads * head_dim * 2 + h * kv * head_dim * 2
    mlp = 3 * h * inter * experts
    embeddings = vocab * h * (1 if cfg.get("tie_word_embeddings", True) else 2)
    return embeddings + layers * (attention + mlp)


RECIPES = ("paper", "small-cpu")


def train_config_for_recipe(recipe: str, overrides: dict | None = None):
    """The TrainConfig of a named recipe (``paper`` or ``small-cpu``) with field ``overrides`` on top: the one
    conversion that ``skillbank learn --recipe``, ``POST /v1/families`` and :func:`train_config_for_base` share.
    Raises ValueError for another name (each caller words it for its own users)."""
    from skillbank.train.executor import TrainConfig
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; choose one of {list(RECIPES)}")
    values = TrainConfig.for_small_cpu().to_dict() if recipe == "small-cpu" else {}
    values.update(overrides or {})
    return TrainConfig.from_dict(values)


def train_config_for_base(base: str):
    """(TrainConfig, recipe name, why) for a base model name: see :func:`recipe_for_base`."""
    recipe, why = recipe_for_base(base)
    return train_config_for_recipe(recipe), recipe, why
