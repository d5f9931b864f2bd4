"""SkillBank: Execution Memory (frozen LoRA shards on one base) + Address Memory, on disk and in memory.

Layout (DESIGN.md)::

    bank/
      bank.json                  manifest: format, base model id + digest, shards in order, address state dir
      address/0003/              Address Memory state after 3 shards (statistics only)
      shards/0001-<family>/      PEFT adapter dir (adapter_config.json + adapter_model.safetensors),
                                 skills.json (the family's skill ids and, when a catalog was given, their specs), training.json (summary, no records)

Write-once and crash-safe: ``learn`` trains the new shard, writes it and the new Address state under
names the manifest does not reference yet, then publishes them by atomically replacing ``bank.json``
(``os.replace``). A crash before that leaves the previous manifest - and so the previous bank - intact;
unreferenced leftovers are reported by ``info`` and removed by the next ``learn``. Opening a bank
checks the format version, the base-model digest and every shard's file digests.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from skillbank.data.records import Record
from skillbank.errors import BankError, RecordError
from skillbank.jsonfile import read_json
from skillbank.memory.address import HashingNBAddress, Selector, load_selector, make_selector

BANK_FORMAT = 1
MANIFEST = "bank.json"
FAMILY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def dir_digests(directory: Path) -> dict[str, str]:
    return {p.name: file_digest(p) for p in sorted(directory.iterdir()) if p.is_file()}


def check_family_name(name: str) -> str:
    """Family names become directory names: refuse anything path-like."""
    if not isinstance(name, str) or not FAMILY_NAME.fullmatch(name):  # match + "$" would let "nl\n" through
        raise BankError(f"invalid family name {name!r}: use 1-64 letters, digits, '_' or '-', starting with a letter or digit")
    return name


@dataclass
class ShardEntry:
    name: str
    dir: str  # relative to the bank root
    skills: list[str]
    family_prefix: str
    target_format: str
    system_prompt: str
    digests: dict[str, str]
    created: str = ""
    training: dict = field(default_factory=dict)


@dataclass
class Manifest:
    base: dict  # {"name": ..., "digest": ...}
    shards: list[ShardEntry] = field(default_factory=list)
    address_kind: str = HashingNBAddress.kind
    address_params: dict = field(default_factory=dict)
    address_dir: str | None = None
    format: int = BANK_FORMAT

    def to_dict(self) -> dict:
        d = asdict(self)
        d["shards"] = [asdict(s) for s in self.shards]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Manifest":
        shards = [ShardEntry(**s) for s in d.get("shards", [])]
        return cls(base=d["base"], shards=shards, address_kind=d.get("address_kind", HashingNBAddress.kind),
                   address_params=d.get("address_params", {}), address_dir=d.get("address_dir"),
                   format=d.get("format"))


def read_manifest(root: Path) -> Manifest:
    path = root / MANIFEST
    if not root.is_dir():
        raise BankError(f"{root} does not exist or is not a directory")
    raw = read_json(path, BankError, expect_format=BANK_FORMAT, what="bank",
                    missing=f"{root} is not a skill bank (no {MANIFEST}); create one with `skillbank create`")
    try:
        return Manifest.from_dict(raw)
    except (KeyError, TypeError) as exc:
        raise BankError(f"{path}: unreadable manifest (missing or bad field {exc})") from None


def write_manifest(root: Path, manifest: Manifest) -> None:
    """Atomic publish: write a temp file, fsync, rename over bank.json."""
    tmp = root / (MANIFEST + ".tmp")
    with open(tmp, "w") as fh:
        fh.write(json.dumps(manifest.to_dict(), indent=1, ensure_ascii=False) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, root / MANIFEST)


@dataclass
class Plan:
    """What ``SkillBank.plan`` returns for one request."""

    request: str
    shard: str
    probabilities: dict[str, float]
    graph: dict | None
    error: str | None
    raw: str
    route_seconds: float = 0.0
    generate_seconds: float = 0.0
    constrained: bool = True
    n_tokens: int = 0
    mean_logprob: float = 0.0  # the executor's mean token log-probability of ``raw`` (unconstrained distribution)

    def to_dict(self) -> dict:
        return asdict(self)


class SkillBank:
    """A bank of frozen executor shards plus the Address Memory that routes to them."""

    def __init__(self, root: Path, manifest: Manifest, execution, address: Selector | None):
        self.root = root
        self.manifest = manifest
        self.execution = execution  # skillbank.memory.execution.ExecutionMemory
        self.address = address

    # -- lifecycle ---------------------------------------------------------------------------
    @classmethod
    def create(cls, path: str | Path, base=None, *, base_config=None, address_kind: str = HashingNBAddress.kind,
               address_params: dict | None = None) -> "SkillBank":
        """Create an empty bank at ``path`` for a base model (a LoadedBase, or a BaseModelConfig to load)."""
        from skillbank.memory.execution import ExecutionMemory
        from skillbank.model.base import load_base
        root = Path(path)
        if (root / MANIFEST).exists():
            raise BankError(f"{root} already holds a skill bank")
        if root.exists() and any(root.iterdir()):
            raise BankError(f"{root} exists and is not empty; choose a new directory")
        probe = make_selector(address_kind, **(address_params or {}))  # validate before touching disk
        if not probe.replay_free:
            raise BankError(f"address kind {address_kind!r} keeps requests; a bank's Address Memory must be replay-free")
        base = base if base is not None else load_base(base_config)
        root.mkdir(parents=True, exist_ok=True)
        (root / "shards").mkdir(exist_ok=True)
        (root / "address").mkdir(exist_ok=True)
        manifest = Manifest(base={"name": base.identity["name"], "digest": base.identity["digest"]},
                            address_kind=address_kind, address_params=address_params or {})
        write_manifest(root, manifest)
        return cls(root, manifest, ExecutionMemory(base), None)

    @classmethod
    def open(cls, path: str | Path, base=None, *, base_config=None) -> "SkillBank":
        """Open a bank, verifying format, base digest and shard digests; load shards frozen."""
        from skillbank.memory.execution import ExecutionMemory
        from skillbank.model.base import BaseModelConfig, load_base
        root = Path(path)
        manifest = read_manifest(root)
        verify_shards(root, manifest)
        if base is None:
            cfg = base_config or BaseModelConfig(name=manifest.base["name"])
            base = load_base(cfg)
        if base.identity["digest"] != manifest.base["digest"]:
            raise BankError(
                f"{root} was built on base model {manifest.base['name']!r} (digest {manifest.base['digest'][:19]}...), "
                f"but the loaded base is {base.identity['name']!r} (digest {base.identity['digest'][:19]}...); "
                "shards only work on the base they were trained on")
        execution = ExecutionMemory(base)
        for shard in manifest.shards:
            execution.attach(shard.name, root / shard.dir, shard)
        address = load_selector(root / manifest.address_dir) if manifest.address_dir else None
        return cls(root, manifest, execution, address)

    @property
    def shard_names(self) -> list[str]:
        return [s.name for s in self.manifest.shards]

    # -- write -------------------------------------------------------------------------------
    def learn(self, family: str, records: Sequence[Record], train_config=None, *, skills: Sequence[str] | None = None,
              catalog=None, progress: bool = True, pretrained: str | Path | None = None) -> ShardEntry:
        """Train a fresh LoRA on ``records`` only, freeze it, append it, update the Address Memory.

        skills: the family's skill ids (default: the family of that name in ``catalog``, else the ids the
            records use). catalog: a :class:`~skillbank.data.catalog.Catalog`; when given, the shard stores
            the full specs (description, typed arguments) of its skills next to the adapter.

        The records are used for this call only: the bank keeps the adapter weights, the family's skill
        list and a training summary - never the requests or graphs.
        pretrained: a directory with this family's adapter already trained on ``records`` with
            ``train_config`` by another process (parallel stages); it is loaded instead of trained, after
            checking that its recorded recipe matches.
        """
        from skillbank.train.executor import TrainConfig, common_prefix
        check_family_name(family)
        if family in self.shard_names:
            raise BankError(f"family {family!r} is already in the bank; shards are write-once - learn it under a new name")
        records = list(records)
        if not records:
            raise RecordError(f"no training records for family {family!r}")
        used = sorted({t for r in records for t in r.graph.tasks})
        if skills is None and catalog is not None and family in catalog.family_keys:
            skills = catalog.family(family).skills
        declared = sorted(set(skills)) if skills is not None else used
        undeclared = sorted(set(used) - set(declared))
        if undeclared:
            raise RecordError(f"records use skill(s) outside the family's catalog: {undeclared[:5]}")
        owned = {s: e.name for e in self.manifest.shards for s in e.skills}
        clash = sorted(s for s in declared if s in owned)
        if clash:
            raise RecordError("skill(s) already learned by another shard (families must be disjoint): "
                              + ", ".join(f"{s} (in {owned[s]})" for s in clash[:5]))
        cfg = train_config or TrainConfig()
        self._remove_orphans()

        index = len(self.manifest.shards) + 1
        shard_rel = f"shards/{index:04d}-{family}"
        staging = self.root / "shards" / f".staging-{index:04d}-{family}"
        if staging.exists():
            shutil.rmtree(staging)
        prefix = common_prefix(declared)
        try:
            if pretrained is not None:
                summary = self.execution.load_trained(family, pretrained)
                if summary.get("config") != cfg.to_dict() or summary.get("family_prefix") != prefix:
                    raise BankError(f"{pretrained} was trained with another recipe or family prefix than this learn "
                                    f"step's; retrain it")
            else:
                summary = self.execution.train_shard(family, records, cfg, family_prefix=prefix, progress=progress)
            self.execution.save_shard(family, staging)
            specs = [catalog.skills[s].to_dict() for s in declared if s in catalog.skills] if catalog else []
            (staging / "skills.json").write_text(
                json.dumps({"family": family, "skills": declared, "specs": specs}, indent=1, ensure_ascii=False) + "\n")
            (staging / "training.json").write_text(json.dumps(summary, indent=1) + "\n")
            digests = dir_digests(staging)
            os.replace(staging, self.root / shard_rel)

            address = self.address or make_selector(self.manifest.address_kind, **self.manifest.address_params)
            address.partial_fit([r.request for r in records], family)
            address_rel = f"address/{index:04d}"
            address.save(self.root / address_rel)
        except BaseException:
            # Nothing is published: drop the in-memory adapter and the half-written files.
            self.execution.detach(family)
            shutil.rmtree(staging, ignore_errors=True)
            shutil.rmtree(self.root / shard_rel, ignore_errors=True)
            if self.address is not None and family in self.address.classes_:
                self.address = load_selector(self.root / self.manifest.address_dir) if self.manifest.address_dir else None
            raise
        entry = ShardEntry(name=family, dir=shard_rel, skills=declared, family_prefix=prefix,
                           target_format=cfg.target_format, system_prompt=cfg.system_prompt, digests=digests,
                           created=time.strftime("%Y-%m-%dT%H:%M:%S"), training=summary)
        new_manifest = Manifest(base=self.manifest.base, shards=self.manifest.shards + [entry],
                                address_kind=self.manifest.address_kind, address_params=self.manifest.address_params,
                                address_dir=address_rel)
        write_manifest(self.root, new_manifest)  # the commit point
        old_address = self.manifest.address_dir
        self.manifest = new_manifest
        if old_address:  # superseded; a crash before this line leaves it as an orphan the next learn removes
            shutil.rmtree(self.root / old_address, ignore_errors=True)
        self.address = address
        self.execution.register(family, self.root / shard_rel, entry)
        return entry

    def _remove_orphans(self) -> None:
        for p in self.orphans():
            shutil.rmtree(p, ignore_errors=True)

    def orphans(self) -> list[Path]:
        """Directories left by an interrupted ``learn`` that no manifest references."""
        referenced = {self.root / s.dir for s in self.manifest.shards}
        if self.manifest.address_dir:
            referenced.add(self.root / self.manifest.address_dir)
        found = []
        for sub in ("shards", "address"):
            d = self.root / sub
            if d.is_dir():
                found += [p for p in sorted(d.iterdir()) if p.is_dir() and p not in referenced]
        return found

    # -- read --------------------------------------------------------------------------------
    def route(self, requests: Sequence[str]) -> tuple[list[str], np.ndarray]:
        if not self.manifest.shards or self.address is None:
            raise BankError(f"{self.root} has no shards yet; learn a family first")
        proba = self.address.predict_proba(requests)
        return [self.address.classes_[i] for i in np.argmax(proba, axis=1)], proba

    def plan(self, requests: Sequence[str] | str, *, shard: str | None = None, batch_size: int = 8,
             max_new_tokens: int | None = None, constrain: bool = True, copy_values: bool = False) -> list[Plan]:
        """Route each request (or force ``shard``) and generate its task graph with that one executor.

        constrain: decode with the shard's grammar (its own skills and declared arguments only; default);
        copy_values: literal argument values must also be substrings of the request."""
        if isinstance(requests, str):
            requests = [requests]
        requests = list(requests)
        for i, r in enumerate(requests):
            if not isinstance(r, str) or not r.strip():
                raise RecordError(f"request {i} is empty")
        self.execution.check_lengths(requests, max_new_tokens)
        t0 = time.perf_counter()
        if shard is not None:
            if shard not in self.shard_names:
                raise BankError(f"unknown shard {shard!r}; this bank has {self.shard_names}")
            chosen, proba = [shard] * len(requests), None
        else:
            chosen, proba = self.route(requests)
        route_s = (time.perf_counter() - t0) / max(1, len(requests))
        t1 = time.perf_counter()
        outputs = self.execution.generate(requests, chosen, batch_size=batch_size, max_new_tokens=max_new_tokens,
                                          constrain=constrain, copy_values=copy_values)
        gen_s = (time.perf_counter() - t1) / max(1, len(requests))
        plans = []
        for i, (req, name, o) in enumerate(zip(requests, chosen, outputs)):
            probs = ({c: float(p) for c, p in zip(self.address.classes_, proba[i])} if proba is not None
                     else {name: 1.0})
            graph = o.parsed.graph.canonical().to_dict() if o.parsed.graph is not None else None
            plans.append(Plan(req, name, probs, graph, o.parsed.error, o.text, route_s, gen_s, o.constrained,
                              o.n_tokens, round(o.mean_logprob, 4)))
        return plans

    def info(self) -> dict:
        return bank_info(self.root)


def bank_info(path: str | Path) -> dict:
    """A bank's manifest summary, read from disk without loading any model."""
    root = Path(path)
    manifest = read_manifest(root)
    orphans = SkillBank(root, manifest, None, None).orphans()
    return {"root": str(root), "format": manifest.format, "base": manifest.base,
            "address": {"kind": manifest.address_kind, "params": manifest.address_params, "dir": manifest.address_dir},
            "shards": [{"name": s.name, "dir": s.dir, "skills": len(s.skills), "family_prefix": s.family_prefix,
                        "target_format": s.target_format, "created": s.created,
                        "train_examples": s.training.get("examples"), "train_seconds": s.training.get("wall_seconds")}
                       for s in manifest.shards],
            "orphans": [str(p.relative_to(root)) for p in orphans]}


def verify_shards(root: Path, manifest: Manifest) -> None:
    for shard in manifest.shards:
        d = root / shard.dir
        if not d.is_dir():
            raise BankError(f"{root}: shard {shard.name!r} is missing its directory {shard.dir}")
        for name, digest in shard.digests.items():
            p = d / name
            if not p.is_file():
                raise BankError(f"{root}: shard {shard.name!r} is missing {shard.dir}/{name}")
            if file_digest(p) != digest:
                raise BankError(f"{root}: shard {shard.name!r} file {shard.dir}/{name} does not match its digest "
                                "(modified or corrupted); shards are write-once")
    if manifest.address_dir and not (root / manifest.address_dir / "selector.json").is_file():
        raise BankError(f"{root}: Address Memory state {manifest.address_dir} is missing")
