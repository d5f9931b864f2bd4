"""Where a new executor starts, and which shards descend from which.

A new shard starts from a fresh LoRA, from the family-neutral start (an adapter trained once per base and
recipe on invented families: :mod:`skillbank.memory.neutral`) or from the weights of a shard the bank already
holds (its LoRA A and B tensors copied, then trained on the new family's requests only). The manifest records
the starting point of every shard (``ShardEntry.lineage``)::

    {"init": "fresh"}
    {"init": "neutral", "digest": "sha256:...", "key": "..."}
    {"init": "shard", "from": "t1_daily_life", "digest": "sha256:...", "by": "previous"}
    {"init": "merge", "from": ["t1_daily_life", "t3_..."], "digests": ["sha256:...", ...], "weights": [0.7, 0.3]}

``digest`` is the start shard's ``adapter_model.safetensors`` digest at the time, so the start stays identified
after a relearn replaces it or an import renames it; ``by`` says which rule chose it. A merged start (``merge``)
is the weighted sum of the update of the :data:`MERGE_K` shards nearest the new family, cut back to the recipe's
rank (:class:`MergedStart`); it descends from each of them. A shard started from another carries some of that
family's knowledge in its weights: forgetting a family exactly means forgetting its descendants too
(``descendants``); the neutral start holds no user's data and ties no shard to another. Manifests written
before lineage existed read as fresh.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from skillbank.errors import BankError
from skillbank.memory.shard_files import shard_file_problems

WEIGHTS = "adapter_model.safetensors"
INIT_CHOICES = ("fresh", "neutral", "previous", "nearest", "merge", "shard:NAME")
#: the rules that choose among the shards already in the bank (so their result depends on what was learned before)
EARLIER_SHARD_RULES = ("previous", "nearest", "merge")
FRESH = {"init": "fresh"}
#: the start rule of `learn`, `relearn`, the service's learn jobs and FSM in the harness when none is named
DEFAULT_INIT = "merge"
#: how many of the nearest shards a merged start sums (fewer when the bank has fewer)
MERGE_K = 3


@dataclass(frozen=True)
class MergedStart:
    """A start made of several shards: their LoRA updates summed with ``weights`` (which add up to 1), then cut
    back to the new shard's rank (:meth:`~skillbank.memory.execution.ExecutionMemory.train_shard` builds it)."""
    names: tuple[str, ...]
    weights: tuple[float, ...]


def fresh() -> dict:
    return dict(FRESH)


def parse_init(init: str) -> tuple[str, str | None]:
    """``init`` as (rule, shard name): ("fresh", None), ("neutral", None), ("previous", None), ("nearest", None),
    ("merge", None) or ("shard", NAME)."""
    if isinstance(init, str) and init in ("fresh", "neutral", "previous", "nearest", "merge"):
        return init, None
    if isinstance(init, str) and init.startswith("shard:") and init[len("shard:"):]:
        return "shard", init[len("shard:"):]
    raise BankError(f"init must be one of {', '.join(INIT_CHOICES)}, got {init!r}")


def start_names(entry) -> list[str]:
    """The shards ``entry`` started from: one (a shard start), several (a merged start) or none."""
    lineage = getattr(entry, "lineage", None) or FRESH
    if lineage.get("init") == "shard":
        return [lineage.get("from")]
    if lineage.get("init") == "merge":
        return list(lineage.get("from") or [])
    return []


def descendants(shards: Sequence, family: str) -> list[str]:
    """Every shard that started from ``family``'s weights, directly or through another descendant, in the
    manifest's order (``family`` itself excluded, even where a relearn made a cycle)."""
    found: set[str] = set()
    frontier = {family}
    while frontier:
        new = {e.name for e in shards if frontier & set(start_names(e)) and e.name not in found and e.name != family}
        found |= new
        frontier = new
    return [e.name for e in shards if e.name in found]


def weights_digest(entry) -> str:
    return (getattr(entry, "digests", None) or {}).get(WEIGHTS, "")


def lineage_of(entry, shards: Sequence) -> dict:
    """What ``skillbank info`` shows of one shard's starting point: its record, plus ``start_current`` - whether
    the named start is still in the bank with the weights it had (False after a relearn kept it as it was)."""
    lineage = dict(getattr(entry, "lineage", None) or FRESH)
    names = start_names(entry)
    if names:
        digests = lineage.get("digests") if lineage.get("init") == "merge" else [lineage.get("digest")]
        current = {e.name: weights_digest(e) for e in shards}
        lineage["start_current"] = all(current.get(n) == d for n, d in zip(names, digests or []))
    return lineage


def _lora_shape(config: dict) -> dict:
    layers = config.get("layers_to_transform")
    return {"rank": config.get("r"), "target modules": sorted(config.get("target_modules") or []),
            "layers": sorted([layers] if isinstance(layers, int) else layers) if layers else None}


def _recipe_shape(cfg) -> dict:
    return {"rank": cfg.rank, "target modules": sorted(cfg.target_modules),
            "layers": sorted(cfg.layers_to_transform) if cfg.layers_to_transform else None}


def start_problem(name: str, directory: Path, entry, cfg, base_name: str) -> tuple[str | None, int | None]:
    """(why shard ``name`` cannot be a start for a shard of recipe ``cfg``, or None; its LoRA rank). Its files must
    be whole and readable, its adapter trained on this bank's base, on the recipe's target modules and layers.
    The rank may differ: such a start is cut to the recipe's rank by SVD (:class:`MergedStart`)."""
    from skillbank.memory.execution import peft_base_name
    problems = shard_file_problems(name, directory, getattr(entry, "digests", None) or {})
    if problems:
        return problems[0], None
    try:
        config = json.loads((directory / "adapter_config.json").read_text())
        from safetensors.torch import load_file
        load_file(str(directory / WEIGHTS))
    except Exception as exc:  # noqa: BLE001 - any unreadable file is this one error, naming the shard
        return f"its adapter in {directory} is unreadable ({exc.__class__.__name__}: {exc})", None
    theirs = config.get("base_model_name_or_path")
    if theirs not in (peft_base_name(base_name), base_name):
        return f"its adapter was trained on base model {theirs!r}, this bank's base is {base_name!r}", None
    mine, start = _recipe_shape(cfg), _lora_shape(config)
    differ = [k for k in ("target modules", "layers") if mine[k] != start[k]]
    if differ:
        return ("its LoRA adapts other weights than the new shard's recipe ("
                + "; ".join(f"{k} {start[k]} there, {mine[k]} here" for k in differ) + ")"), start["rank"]
    return None, start["rank"]


def resolve_start(bank, family: str, init: str, requests: Sequence[str], cfg, *, replacing: bool = False,
                  exclude: Sequence[str] = (), progress: bool = True) -> tuple[str | Path | MergedStart | None, dict]:
    """Where ``family``'s new executor starts in ``bank``: (the start shard's name, the neutral start's adapter
    directory, a :class:`MergedStart`, or None; its lineage record).

    fresh: a new LoRA. neutral: the family-neutral start for the bank's base and the recipe ``cfg`` (trained
    now if this machine has not built it: :func:`~skillbank.memory.neutral.ensure_neutral_start`). previous: the last shard in the manifest's order (the most recently added family).
    nearest: the shard whose family the Address Memory routes most of ``requests`` (the new family's own
    training requests; ties go to the larger summed probability, then the earlier shard) to - no other
    family's requests are needed. merge: the :data:`MERGE_K` shards to which the Address Memory gives most of
    ``requests``' probability, weighted by it (a :class:`MergedStart`; with one candidate, a start from that
    shard). shard:NAME: that shard. previous, nearest and merge in a bank with no other shard start fresh.

    A bank's shards may have been trained with other recipes (the demo's are rank 64, `learn`'s recipe rank 16).
    The rules that choose (previous, nearest, merge) choose only among shards the recipe can build on
    (:func:`start_problem`; the others are named in the lineage's ``skipped``), and start fresh where none is
    left; a start of another rank is cut to the recipe's by SVD (``"cut"`` in the lineage). An explicit
    shard:NAME that cannot be a start is an error naming the shards that can.
    replacing: ``family`` is being relearned, so its own current shard is no candidate. exclude: shards
    forgotten in the same publish (no candidates either)."""
    rule, name = parse_init(init)
    if rule == "neutral":
        from skillbank.memory.neutral import ensure_neutral_start
        return ensure_neutral_start(bank.execution, bank.manifest.base["digest"], cfg, progress=progress)
    candidates = [e for e in bank.manifest.shards
                  if not (replacing and e.name == family) and e.name not in exclude]
    if rule == "fresh" or (rule in EARLIER_SHARD_RULES and not candidates):
        return None, fresh()
    base_name = bank.manifest.base["name"]
    entries = {e.name: e for e in candidates}
    checked: dict[str, tuple[str | None, int | None]] = {}

    def problem(n: str) -> str | None:  # read lazily: a bank of a thousand shards checks the few it considers
        if n not in checked:
            checked[n] = start_problem(n, bank.root / entries[n].dir, entries[n], cfg, base_name)
        return checked[n][0]

    if rule == "shard":
        if name == family:
            raise BankError(f"{family!r} cannot start from its own shard; name another (init='shard:NAME'), "
                            "or start fresh")
        if name in exclude:
            raise BankError(f"cannot start from shard {name!r}: it descends from {family!r} and is forgotten "
                            "with its old version")
        why = "the bank has no such shard" if name not in entries else problem(name)
        if why is not None:
            usable = [n for n in entries if n != name and problem(n) is None]
            raise BankError(f"cannot start from shard {name!r}: {why} ("
                            + (f"shards it can start from: {usable}" if usable else "no shard of this bank fits the "
                               "recipe") + "; or init 'fresh' or 'neutral')")
        ranked = [name]
    elif rule == "merge":
        ranked, mass = _by_mass(bank, requests, list(entries))
    elif rule == "previous":
        ranked = list(entries)[::-1]
    else:  # nearest
        ranked, share = _by_votes(bank, requests, list(entries))
    usable = [n for n in ranked if problem(n) is None][:MERGE_K if rule == "merge" else 1]
    skipped = {n: checked[n][0] for n in ranked if n in checked and checked[n][0] is not None}
    extra: dict = {"skipped": skipped} if skipped else {}
    if not usable:
        return None, {**fresh(), **extra}
    if rule == "merge" and len(usable) > 1:
        return _merged(usable, mass, entries, checked, cfg, extra)
    name = usable[0]
    if rule == "nearest":
        extra["share"] = share[name]
    lineage = {"init": "shard", "from": name, "digest": weights_digest(entries[name]),
               "by": "name" if rule == "shard" else rule, **extra}
    rank = checked[name][1]
    if rank != cfg.rank:  # copied through the SVD cut that merged starts use, a sum of one
        lineage["cut"] = f"rank {rank} -> {cfg.rank}"
        return MergedStart((name,), (1.0,)), lineage
    return name, lineage


def _routing(bank, requests: Sequence[str], candidates: list[str]):
    """How the Address Memory, reduced to ``candidates``, routes ``requests``: (candidate names in its column
    order, votes per candidate, summed probability per candidate)."""
    import numpy as np
    address, _ = bank._address_copy()
    for other in [c for c in address.classes_ if c not in candidates]:
        address.forget(other)  # route as the bank would without the version replaced and what goes with it
    classes = list(address.classes_)
    cols = [classes.index(c) for c in candidates if c in classes]
    if not cols:
        raise BankError(f"cannot choose the nearest shard: the Address Memory knows none of {candidates}")
    proba = np.asarray(address.predict_proba(list(requests)))[:, cols]  # [n requests, candidates]
    return [classes[c] for c in cols], np.bincount(np.argmax(proba, axis=1), minlength=len(cols)), proba.sum(axis=0)


def _by_votes(bank, requests: Sequence[str], candidates: list[str]) -> tuple[list[str], dict[str, float]]:
    """``candidates`` from the one the Address Memory routes most of ``requests`` to (ties: the larger summed
    probability, then the earlier shard), and each one's share of the requests."""
    names, votes, mass = _routing(bank, requests, candidates)
    order = sorted(range(len(names)), key=lambda j: (-votes[j], -mass[j], j))
    return [names[j] for j in order], {names[j]: round(float(votes[j]) / len(requests), 4) for j in order}


def _by_mass(bank, requests: Sequence[str], candidates: list[str]) -> tuple[list[str], dict[str, float]]:
    """``candidates`` by the summed probability the Address Memory gives ``requests`` (replay-free, as nearest),
    and each one's sum."""
    names, _, mass = _routing(bank, requests, candidates)
    return [names[j] for j in sorted(range(len(names)), key=lambda j: -mass[j])], dict(zip(names, map(float, mass)))


def _merged(picked: list[str], mass: dict[str, float], entries: dict, checked: dict, cfg,
            extra: dict) -> tuple[MergedStart, dict]:
    """The merged start of the ``picked`` shards (checked already), weighted by their shares of the summed
    probability the Address Memory gives the new family's requests (``mass``), and its lineage record."""
    total = sum(mass[n] for n in picked) or 1.0
    weights = {n: round(mass[n] / total, 4) for n in picked}
    lineage = {"init": "merge", "from": list(picked), "digests": [weights_digest(entries[n]) for n in picked],
               "weights": [weights[n] for n in picked], "by": "merge", **extra}
    ranks = sorted({checked[n][1] for n in picked})
    if ranks != [cfg.rank]:
        lineage["cut"] = f"rank {'/'.join(map(str, ranks))} -> {cfg.rank}"
    return MergedStart(tuple(picked), tuple(weights[n] for n in picked)), lineage


def start_text(lineage: dict) -> str:
    """A shard's starting point in words: 'fresh', 'from the neutral start' or 'from NAME (previous)'."""
    if lineage.get("init", "fresh") == "fresh":
        return "fresh" + (f" (no shard to build on{_skipped_text(lineage)})" if lineage.get("skipped") else "")
    if lineage.get("init") == "neutral":
        return f"from the family-neutral start ({str(lineage.get('digest', ''))[:19]}...)"
    stale = " - since replaced" if lineage.get("start_current") is False else ""
    cut = f", its LoRA cut from {lineage['cut']} by SVD" if lineage.get("cut") else ""
    if lineage.get("init") == "merge":
        parts = ", ".join(f"{n} {w:.2f}" for n, w in zip(lineage.get("from", []), lineage.get("weights", [])))
        return f"from a merge of {parts}{cut}{stale}{_skipped_text(lineage)}"
    return f"from {lineage.get('from')} ({lineage.get('by', 'name')}{stale}){cut}{_skipped_text(lineage)}"


def _skipped_text(lineage: dict) -> str:
    skipped = lineage.get("skipped") or {}
    if not skipped:
        return ""
    first = next(iter(skipped.values()))
    return f"; {len(skipped)} shard(s) skipped ({', '.join(skipped)}: {first})"
