"""What the service serves: an immutable snapshot of a bank, and how a newer one is picked up without a restart.

A :class:`Snapshot` is one published state of the bank (manifest, Address Memory, shard catalogs). Every
request is routed and decoded against the snapshot that was current when it arrived, so a family published
mid-flight never changes the answer to a request already accepted. Swapping in a newer snapshot is one
assignment on the event loop.

Reloading keeps the one base model in memory: the shards the served bank already has stay loaded, only the
new ones are attached (on the engine's thread, between batches) - a second copy of the base is never opened.
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from cachetools import LRUCache

from skillbank.errors import BankError, SkillbankError
from skillbank.memory.address import load_selector
from skillbank.memory.execution import GRAMMARS_KEPT, copies_values, grammars_kept, with_copied_values
from skillbank.memory.bank import Manifest, ShardEntry, SkillBank, load_scope, read_manifest, verify_shards
from skillbank.memory.shard_files import shard_file_problems


@dataclass(frozen=True)
class Snapshot:
    """One published state of a bank. ``bank.execution`` is None in upstream mode (no model loaded here)."""

    bank: SkillBank
    catalogs: dict[str, dict] = field(default_factory=dict)  # shard name -> its skills.json
    version: int = 1
    # shard name -> its grammar, built on first use; bounded (a bank may hold thousands of shards) and
    # shared by request threads, hence the lock
    grammars: LRUCache = field(default_factory=lambda: LRUCache(GRAMMARS_KEPT), compare=False)
    _grammar_lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)
    # Upstream mode: shards whose files were hashed and found as published (the upstream reads them). Checked
    # on a shard's first routed request, not at startup, so opening does not grow with the number of shards.
    verified: set[str] = field(default_factory=set, compare=False)

    def verify(self, name: str) -> None:
        """Check a shard's files against its digests once (upstream mode; a local bank checks as it loads).
        A shard deleted or corrupted after startup fails here, naming the shard; the others keep serving."""
        if self.bank.execution is not None or name in self.verified:
            return
        entry = self.entry(name)
        problems = shard_file_problems(name, self.bank.root / entry.dir, entry.digests)
        if problems:
            raise BankError(problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
        self.verified.add(name)  # set.add is atomic under the GIL; a race only hashes a shard twice

    def grammar(self, name: str, request: str | None = None):
        """The shard's grammar (constrained decoding), built from its skills.json and kept while recently used;
        for ``request``, values copy-constrained to it where the shard's training graphs copied theirs
        (``ShardEntry.values_copied``, as ``SkillBank.plan`` does by default)."""
        with self._grammar_lock:
            grammar = self.grammars.get(name)
        if grammar is None:
            from skillbank.memory.execution import shard_grammar
            entry = self.entry(name)
            grammar = shard_grammar(entry, self.catalogs.get(name), str(self.bank.root / entry.dir / "skills.json"))
            with self._grammar_lock:
                self.grammars[name] = grammar
        if request is not None and copies_values(self.entry(name), None):
            return with_copied_values(grammar, request)
        return grammar

    @property
    def shard_names(self) -> list[str]:
        return self.bank.shard_names

    @property
    def manifest(self) -> Manifest:
        return self.bank.manifest

    def entry(self, name: str) -> ShardEntry:
        for s in self.bank.manifest.shards:
            if s.name == name:
                return s
        raise BankError(f"unknown shard {name!r}; this bank has {self.shard_names}")

    def route(self, requests: list[str]) -> tuple[list[str], np.ndarray]:
        return self.bank.route(requests)


def read_catalog(root: Path, entry: ShardEntry) -> dict:
    """A shard's skills.json (skill ids and, when learned with a catalog, their specs); ids only if unreadable."""
    path = root / entry.dir / "skills.json"
    try:
        data = json.loads(path.read_text())
        if isinstance(data, dict) and isinstance(data.get("skills"), list):
            return data
    except (OSError, ValueError):
        pass
    return {"family": entry.name, "skills": list(entry.skills), "specs": []}


def open_snapshot(root: Path, base=None, *, load_model: bool = True, threads: int | None = None,
                  max_resident: int | None = None) -> Snapshot:
    """Open the bank for serving: the full bank (model, shards) or, with ``load_model=False`` (upstream mode),
    only what routing and decoding need: manifest, Address Memory, each shard's skills.json. Either way no
    shard is hashed or loaded here: its files are checked against their digests the first time a request is
    routed to it (``skillbank info --verify`` checks them all)."""
    if load_model:
        config = None
        if base is None:
            from skillbank.model.base import BaseModelConfig
            config = BaseModelConfig(name=read_manifest(root).base["name"], threads=threads)
        bank = SkillBank.open(root, base=base, base_config=config, max_resident=max_resident)
    else:
        manifest = read_manifest(root)
        address = load_selector(root / manifest.address_dir) if manifest.address_dir else None
        bank = SkillBank(root, manifest, None, address, load_scope(root, manifest))
    return Snapshot(bank, {s.name: read_catalog(root, s) for s in bank.manifest.shards},
                    grammars=LRUCache(grammars_kept(max_resident if load_model else None)))


def newer_snapshot(current: Snapshot) -> Snapshot | None:
    """The bank as published on disk now, if it has more shards than ``current``; None if unchanged.

    Runs on the engine's thread (it attaches adapters to the shared base). Refuses a bank that was changed
    other than by appending shards: shards are write-once, so a served shard must be on disk unchanged.
    """
    root = current.bank.root
    manifest = read_manifest(root)
    served = {s.name: s for s in current.manifest.shards}
    if manifest.base != current.manifest.base:
        raise BankError(f"{root}: the base model in bank.json changed under the running service; restart it")
    for s in manifest.shards[:len(served)]:
        if s.name not in served or served[s.name].digests != s.digests:
            raise BankError(f"{root}: served shard {s.name!r} changed on disk; shards are write-once - restart the service")
    added = manifest.shards[len(served):]
    if len(manifest.shards) < len(served):
        raise BankError(f"{root}: bank.json lists fewer shards than are served; restart the service")
    if not added:
        return None
    verify_shards(root, Manifest(base=manifest.base, shards=added, address_dir=manifest.address_dir))
    address = load_selector(root / manifest.address_dir)
    execution = current.bank.execution
    if execution is not None:
        for s in added:
            if s.name not in execution.shards:  # a failed earlier reload may have added it already
                execution.add(s.name, root / s.dir, s)  # loaded when a request first needs it
    catalogs = dict(current.catalogs)
    catalogs.update({s.name: read_catalog(root, s) for s in added})
    return Snapshot(SkillBank(root, manifest, execution, address, load_scope(root, manifest)), catalogs,
                    current.version + 1, grammars=LRUCache(current.grammars.maxsize),
                    verified=set(current.verified) | {s.name for s in added})


__all__ = ["Snapshot", "open_snapshot", "newer_snapshot", "read_catalog", "SkillbankError"]
