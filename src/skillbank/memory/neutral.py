"""A family-neutral start for new executors: a LoRA that learned the graph format on invented families.

A shard started from another family's shard (``init="previous"``, ``"nearest"``) learns faster, but carries that
family in its weights: forgetting the family exactly takes the descendant too (:mod:`skillbank.memory.lineage`).
The neutral start gives a new shard the same head start with no such tie: an adapter trained once per base model
and recipe on procedurally generated families that belong to no user (:mod:`skillbank.data.synthetic`: invented
domains, skills and values, requests rendered like the built-in benchmark's), so what it teaches is the task - a
request in, a graph of skill calls with their arguments out - and no user's skills or requests.

It is built on first use (as long as one family's training: the same recipe, ``NEUTRAL_FAMILIES`` x
``PER_FAMILY`` records) into ``<cache root>/neutral/<key>/``, a PEFT adapter directory written aside and renamed
into place, so a half-built start never exists under its name. The key hashes the base model's digest, the
recipe (the LoRA's shape and the training settings) and this module's and the generator's versions: another
base, another recipe or a newer generator builds its own. A shard's lineage records ``{"init": "neutral",
"digest": ..., "key": ...}``; planning never needs the start again (a shard's weights are complete), so export,
import and forget treat it like a fresh shard.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from skillbank.cache import cache_root
from skillbank.errors import BankError
from skillbank.memory.shard_files import file_digest

# Part of the key: a change to what the start is trained on builds it again. Version 1 trained its records with
# one prefix for all twenty families, so its targets spelled out "syn0001_grid::approve_battery" where every
# shard writes the bare skill name: it taught another output format than the one its shards must learn.
VERSION = 2
NEUTRAL_FAMILIES = 20
PER_FAMILY = 10  # 200 records: the size of one built-in family's training set, so one family's training time
SEED = 20261204  # the synthetic catalog's seed: invented families, none of them a user's
WEIGHTS = "adapter_model.safetensors"
ADAPTER = "__neutral_start__"  # the name it is trained under and loaded as, never a family name


def neutral_key(base_digest: str, cfg) -> str:
    from skillbank.data.synthetic import GENERATOR_VERSION
    # warm_epochs is how shards built on the start train, not how the start itself does
    recipe = {k: v for k, v in cfg.to_dict().items() if k != "warm_epochs"}
    text = json.dumps({"version": VERSION, "generator": GENERATOR_VERSION, "base": base_digest,
                       "families": NEUTRAL_FAMILIES, "per_family": PER_FAMILY, "seed": SEED,
                       "recipe": recipe}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def neutral_dir(base_digest: str, cfg) -> Path:
    return cache_root() / "neutral" / neutral_key(base_digest, cfg)


def neutral_records() -> list:
    """The start's training records: ``PER_FAMILY`` requests of each of ``NEUTRAL_FAMILIES`` synthetic families,
    the families interleaved."""
    from skillbank.data.synthetic import build_synthetic_stream
    stream = build_synthetic_stream(NEUTRAL_FAMILIES, seed=SEED, train_per_family=PER_FAMILY, test_per_family=1)
    per_family = [stream.train[k] for k in stream.family_keys]
    return [recs[i] for i in range(PER_FAMILY) for recs in per_family if i < len(recs)]


def ensure_neutral_start(execution, base_digest: str, cfg, *, progress: bool = True) -> tuple[Path, dict]:
    """The neutral start for this base and recipe: (its adapter directory, the lineage record of a shard that
    starts from it). Trained now if this machine has not built it yet (progress shown); a cached directory that
    is incomplete or unreadable is built again."""
    directory = neutral_dir(base_digest, cfg)
    meta = _record(directory)
    if meta is None:
        directory.parent.mkdir(parents=True, exist_ok=True)
        staging = directory.parent / f".staging-{directory.name}-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        if progress:
            print(f"skillbank: building the family-neutral start for this base and recipe (once per machine: "
                  f"{NEUTRAL_FAMILIES} synthetic families, {NEUTRAL_FAMILIES * PER_FAMILY} records)", flush=True)
        from skillbank.train.executor import train_executor
        base = execution.base
        try:
            from skillbank.predictions import family_prefixes
            records = neutral_records()
            # each family's own prefix: the start then writes what its shards will write (bare skill names)
            _, summary = train_executor(base, records, cfg, adapter_name=ADAPTER, progress=progress,
                                        family_prefix=family_prefixes(records))
            base.save_adapter(ADAPTER, staging)
            (staging / "neutral.json").write_text(json.dumps(
                {"key": directory.name, "base_digest": base_digest, "recipe": cfg.to_dict(),
                 "families": NEUTRAL_FAMILIES, "per_family": PER_FAMILY, "seed": SEED,
                 "training": summary.to_dict()}, indent=1) + "\n")
            shutil.rmtree(directory, ignore_errors=True)  # an incomplete one
            os.replace(staging, directory)
        finally:
            if ADAPTER in base.adapter_names:
                base.remove_adapter(ADAPTER)
            shutil.rmtree(staging, ignore_errors=True)
        meta = _record(directory)
        if meta is None:
            raise BankError(f"the neutral start in {directory} is unreadable right after it was built; delete "
                            "the directory to build it again")
    return directory, {"init": "neutral", "digest": file_digest(directory / WEIGHTS), "key": meta["key"]}


def _record(directory: Path) -> dict | None:
    """The start's neutral.json when the directory holds a complete start; None otherwise (to be built)."""
    try:
        meta = json.loads((directory / "neutral.json").read_text())
    except (OSError, ValueError):
        return None
    complete = (directory / WEIGHTS).is_file() and (directory / "adapter_config.json").is_file()
    return meta if complete and isinstance(meta, dict) and "key" in meta else None


__all__ = ["ensure_neutral_start", "neutral_dir", "neutral_key", "neutral_records"]
