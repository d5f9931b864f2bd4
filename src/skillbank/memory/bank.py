"""SkillBank: Execution Memory (frozen LoRA shards on one base) + Address Memory, on disk and in memory.

Layout (docs/ARCHITECTURE.md)::

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

import copy
import json
import logging
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Sequence

import numpy as np
from cachetools import LRUCache

from skillbank.data.catalog import check_disjoint
from skillbank.data.records import Record
from skillbank.errors import BankError, RecordError, SelectorError
from skillbank.graph import values_copied
from skillbank.jsonfile import read_json
from skillbank.memory.address import HashingNBAddress, Selector, load_selector, make_selector
from skillbank.memory.execution import grammars_kept
from skillbank.memory.lineage import descendants as lineage_descendants
from skillbank.memory.lineage import DEFAULT_INIT, MergedStart, fresh, lineage_of, resolve_start, weights_digest
from skillbank.memory.outliers import OUTLIER_CORPUS
from skillbank.memory.scope import SCOPE_NEGATIVES, ScopeDetector, ScopeVerdict, catalog_text, fit_inputs
from skillbank.memory.selector import selector_class
from skillbank.memory.shard_files import dir_digests, shard_file_problems
from skillbank.memory.skill_address import fit_skill_address, save_skill_address
from skillbank.planner import Plan  # noqa: F401 - the result type, re-exported where it used to live

log = logging.getLogger("skillbank.bank")

BANK_FORMAT = 1
MANIFEST = "bank.json"
#: Shards whose skill statistics stay read without ``max_resident`` (~7 MB each in memory; bench/scale.py's planner
#: grew 7.5 MB for every shard it used before they were bounded).
SKILL_STATISTICS_KEPT = 32
FAMILY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


def learn_checkpoint_path(root: str | Path, family: str) -> Path:
    """Where a training of ``family`` into the bank at ``root`` keeps its checkpoint while it runs
    (``skillbank learn`` and the service's learn jobs): outside the published shards, removed when it ends."""
    return Path(root) / "checkpoints" / f"{family}.fit.pt"


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
    #: where the shard's training started (skillbank.memory.lineage): {"init": "fresh"} or {"init": "shard",
    #: "from": NAME, "digest": the start's adapter weights digest then}; manifests without it read as fresh
    lineage: dict = field(default_factory=fresh)
    #: every literal argument value of the training graphs occurs verbatim in its request: plans copy values by
    #: default (copy-constrained grammar, ``plan(copy_values=None)``); False for banks made before it was recorded
    values_copied: bool = False


@dataclass
class Manifest:
    base: dict  # {"name": ..., "digest": ...}
    shards: list[ShardEntry] = field(default_factory=list)
    address_kind: str = HashingNBAddress.kind
    address_params: dict = field(default_factory=dict)
    address_dir: str | None = None
    format: int = BANK_FORMAT
    scope_params: dict = field(default_factory=dict)  # ScopeDetector hyperparameters (skillbank.memory.scope)

    def to_dict(self) -> dict:
        # Shallow: dataclasses.asdict deep-copies every shard's training summary, which at a thousand
        # shards made each publish noticeably slower; json.dumps reads the nested dicts as they are.
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["shards"] = [dict(vars(s)) for s in self.shards]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Manifest":
        shards = [ShardEntry(**s) for s in d.get("shards", [])]
        return cls(base=d["base"], shards=shards, address_kind=d.get("address_kind", HashingNBAddress.kind),
                   address_params=d.get("address_params", {}), address_dir=d.get("address_dir"),
                   format=d.get("format"), scope_params=d.get("scope_params", {}))


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


def _as_catalog(catalog, family: str):
    """``learn``'s catalog argument as a Catalog: a Catalog, a file in any catalog format, or a parsed
    OpenAI tools list / MCP tools/list result (whose tools all form ``family``)."""
    from skillbank.data.catalog import Catalog
    from skillbank.data.tool_formats import load_catalog, parse_catalog
    if catalog is None or isinstance(catalog, Catalog):
        return catalog
    if isinstance(catalog, (str, Path)):
        return load_catalog(catalog, family)
    if isinstance(catalog, (dict, list)):
        return parse_catalog(catalog, family)
    raise TypeError(f"catalog must be a Catalog, a path or a parsed tools object, got {type(catalog).__name__}")


def _as_records(records, catalog, family: str):
    """``learn``'s records argument as (Record objects, the negatives among them); files and dicts go through the
    same checks as ``skillbank validate`` (every bad one reported at once)."""
    from skillbank.data.negatives import Negative
    from skillbank.data.records import validate_records
    if isinstance(records, (str, Path)):
        v = validate_records(records, catalog, family=family).raise_if_bad()
        return v.records, v.negatives
    records = list(records)
    if all(isinstance(r, (Record, Negative)) for r in records):
        return [r for r in records if isinstance(r, Record)], [r for r in records if isinstance(r, Negative)]
    v = validate_records([r.to_dict() if isinstance(r, (Record, Negative)) else r for r in records], catalog,
                         family=family).raise_if_bad()
    return v.records, v.negatives


def _as_negatives(negatives, family: str, records: Sequence[Record] = ()) -> list:
    """``learn``'s negatives argument (a ``--negatives`` file, Negative objects or dicts) as Negative objects of
    ``family``, checked (file and line named); one that repeats the request of one of ``records`` is an error
    naming both, as ``skillbank validate`` reports it."""
    from skillbank.data.negatives import Negative, read_negatives
    from skillbank.data.records import served_and_refused
    if negatives is None:
        return []
    if isinstance(negatives, (str, Path)):
        out = read_negatives(negatives, family=family)
    else:
        out = []
        for i, n in enumerate(negatives, 1):
            try:
                neg = n if isinstance(n, Negative) else Negative.from_dict(n)
            except RecordError as exc:
                raise RecordError(f"negative {i}: {exc.reason}") from None
            if neg.family != family:
                raise RecordError(f"negative {neg.id}: family {neg.family!r}, expected {family!r}")
            out.append(neg)
    clashes = served_and_refused(records, out)
    if clashes:
        shown = "; ".join(f"negative {n} is the request of record {r}" for n, r in clashes[:10])
        raise RecordError(f"{shown} (one request cannot be both served and refused)",
                          negatives if isinstance(negatives, (str, Path)) else None)
    return out


#: A family given fewer negatives than this gets synthesized ones as well (unless told otherwise).
SYNTHESIZE_BELOW = 30


def family_negatives(family: str, specs: Sequence[dict], records: Sequence[Record], given: Sequence,
                     synthesize: bool | None = None) -> list:
    """The negatives a family's scope statistics hold: the ``given`` ones, plus, when ``synthesize`` (None: when
    fewer than ``SYNTHESIZE_BELOW`` are given), those :func:`~skillbank.data.negatives.synthesize_negatives` writes
    from its catalog and records (none that repeats a given one)."""
    from skillbank.data.negatives import normalized, shipped_other_domain, synthesize_negatives
    from skillbank.memory.values import graph_values
    given = list(given)
    if synthesize is None:
        synthesize = len(given) < SYNTHESIZE_BELOW
    if not synthesize:
        return given
    made = synthesize_negatives(family, specs, [r.request for r in records], [graph_values(r.graph) for r in records],
                                other_domain=shipped_other_domain())
    have = {normalized(n.request) for n in given}
    return given + [n for n in made if normalized(n.request) not in have]


def _fit_family_negatives(scope: ScopeDetector, family: str, specs: Sequence[dict], records: Sequence[Record],
                          given: Sequence, synthesize: bool | None) -> None:
    """Give a just-fitted family its negatives (:func:`family_negatives`), where the bank's gate can weigh them (a
    gate without an encoder or the value reader, made with older settings, cannot)."""
    if scope.takes_negatives:
        scope.fit_negatives(family, family_negatives(family, specs, records, given, synthesize))


class SkillBank:
    """A bank of frozen executor shards plus the Address Memory that routes to them."""

    def __init__(self, root: Path, manifest: Manifest, execution, address: Selector | None,
                 scope: ScopeDetector | None = None):
        self.root = root
        self.manifest = manifest
        self._execution = execution  # skillbank.memory.execution.ExecutionMemory, once loaded
        # Set by ``open``, called on first use of ``execution``: routing and the scope check need no model, so
        # a bank opened without a base loads it only when a request is generated or a family trained.
        self._load_execution = None
        self.address = address
        self.scope = scope  # out-of-scope detection; None in banks learned before it existed (see fit_scope)
        self.engine_choice = "torch"  # what writes plans: see ``open`` and :attr:`engine`
        self._engine = None
        self._max_resident: int | None = None
        self._given_base = False
        self._threads: int | None = None
        # shard -> (its digest, skill statistics or None), the least recently used dropped: a shard's statistics
        # take ~7 MB in memory and are read again in milliseconds, so a process meeting many families stays flat
        self._skill_addresses: LRUCache = LRUCache(skill_statistics_kept(None))
        self._refusals: dict[str, tuple] = {}  # family -> (its shard dir, its refusal skill or None)

    @property
    def execution(self):
        """The Execution Memory (base model + shards), loaded on first use; None for a bank opened offline."""
        if self._execution is None and self._load_execution is not None:
            self._execution = self._load_execution()
            self._load_execution = None
        return self._execution

    @property
    def engine(self):
        """What writes this bank's plans: the llama.cpp engine
        (:class:`~skillbank.memory.execution_llamacpp.LlamaCppExecution`) where it can serve the bank, else the
        Execution Memory itself (the reference engine). Resolved on first use from ``engine_choice``: ``"torch"``,
        ``"llama.cpp"`` (an error where it cannot serve the bank) or ``"auto"`` (llama.cpp for a bank on the
        embedded base opened without a model in hand, when llama-cpp-python is installed; else torch)."""
        if self._engine is None:
            self._engine = self._resolve_engine()
        return self._engine

    def _resolve_engine(self):
        choice = self.engine_choice
        if self._load_execution is None:
            return self.execution  # a bank made here with a model in hand plans with that model
        from skillbank.memory.execution_llamacpp import LlamaCppExecution, pick_engine
        if pick_engine(choice, self.manifest, self.root, model_in_hand=self._given_base) == "torch":
            return self.execution
        return LlamaCppExecution(self.root, lambda: self.manifest, reference=lambda: self.execution,
                                 max_resident=self._max_resident, threads=self._threads)

    @property
    def planner(self):
        from skillbank.planner import Planner
        return Planner(self)

    # -- lifecycle ---------------------------------------------------------------------------
    @classmethod
    def create(cls, path: str | Path, base=None, *, base_config=None, address_kind: str | None = None,
               address_params: dict | None = None, scope_params: dict | None = None) -> "SkillBank":
        """Create an empty bank at ``path`` for a base model (a LoadedBase, or a BaseModelConfig to load).
        address_kind / address_params: the router; None: :func:`default_address` (the embedding router reading
        past long payloads, or with ``scope_params={"encoder": None}`` the lexical Address Memory; a kind given
        without parameters gets that kind's defaults).
        scope_params: out-of-scope detection (:class:`~skillbank.memory.scope.ScopeDetector`), e.g.
        ``{"outliers": None}``: no outlier corpus (the threshold is then ``quantile`` of the training requests),
        or ``{"encoder": None}``: word statistics alone, without the sentence encoder (and no corpus). By
        default the gate is also taught the outlier corpus shipped with skillbank."""
        scope_params = default_scope_params(scope_params)
        if address_kind is None or address_params is None:
            address_kind, defaults = default_address(scope_params["encoder"], address_kind)
            address_params = {**defaults, **(address_params or {})}
        from skillbank.memory.execution import ExecutionMemory
        from skillbank.model.base import load_base
        root = Path(path)
        if (root / MANIFEST).exists():
            raise BankError(f"{root} already holds a skill bank")
        if root.exists() and any(root.iterdir()):
            raise BankError(f"{root} exists and is not empty; choose a new directory")
        probe = make_selector(address_kind, **(address_params or {}))  # validate before touching disk
        # Every setting written out: a later default must not change what this bank's detector is.
        scope_probe = ScopeDetector(**(scope_params or {}))
        scope_probe.check_encoder()
        scope_probe.check_outliers()
        probe.check_encoder()
        scope_params = scope_probe.get_params()
        if not probe.replay_free:
            raise BankError(f"address kind {address_kind!r} keeps requests; a bank's Address Memory must be replay-free")
        base = base if base is not None else load_base(base_config)
        root.mkdir(parents=True, exist_ok=True)
        (root / "shards").mkdir(exist_ok=True)
        (root / "address").mkdir(exist_ok=True)
        manifest = Manifest(base={"name": base.identity["name"], "digest": base.identity["digest"]},
                            address_kind=address_kind, address_params=address_params or {},
                            scope_params=scope_params)
        write_manifest(root, manifest)
        return cls(root, manifest, ExecutionMemory(base), None)

    @classmethod
    def open(cls, path: str | Path, base=None, *, base_config=None, max_resident: int | None = None,
             lazy: bool = True, engine: str | None = None, threads: int | None = None) -> "SkillBank":
        """Open a bank: read its manifest and Address Memory. The base model is checked against the manifest's
        digest when it is loaded: here when ``base`` is given or ``lazy`` is False, otherwise on the first
        request that is generated (routing and the scope check need no model, so an out-of-scope request is
        answered without loading it). Shards are loaded - and their files checked against their digests - when a
        request first needs them (``skillbank info --verify`` checks them all); with ``max_resident`` at most
        that many stay loaded (least recently used evicted), so memory does not grow with the number of
        families.

        engine: what writes plans (:attr:`engine`): ``"auto"`` (the default, or ``$SKILLBANK_ENGINE``),
        ``"llama.cpp"`` or ``"torch"``. Learning always trains with torch. threads: the llama.cpp engine's
        threads (None: the cores other processes leave free; the torch engine reads ``base_config.threads``)."""
        engine = engine or os.environ.get("SKILLBANK_ENGINE") or "auto"
        from skillbank.memory.execution_llamacpp import ENGINES
        if engine not in ENGINES:
            raise BankError(f"unknown engine {engine!r}; choose one of {list(ENGINES)}")
        root = Path(path)
        manifest = read_manifest(root)
        if max_resident is not None and isinstance(max_resident, int) and max_resident > max(1, len(manifest.shards)):
            raise BankError(f"max_resident {max_resident} is larger than the bank's {len(manifest.shards)} shard(s); "
                            "leave it unset to keep every shard loaded")
        address = load_selector(root / manifest.address_dir) if manifest.address_dir else None
        bank = cls(root, manifest, None, address, load_scope(root, manifest))
        bank._load_execution = lambda: bank._open_execution(base, base_config, max_resident)
        bank.engine_choice, bank._max_resident, bank._given_base = engine, max_resident, base is not None
        bank._skill_addresses = LRUCache(skill_statistics_kept(max_resident))
        bank._threads = threads
        if base is not None or not lazy:
            bank.execution  # noqa: B018 - load now: the caller asked for the model (or has it already)
        return bank

    def _open_execution(self, base, base_config, max_resident):
        from skillbank.memory.execution import ExecutionMemory
        from skillbank.model.base import BaseModelConfig, load_base
        manifest = self.manifest
        if base is None:
            base = load_base(base_config or BaseModelConfig(name=manifest.base["name"]))
        if base.identity["digest"] != manifest.base["digest"]:
            raise BankError(
                f"{self.root} was built on base model {manifest.base['name']!r} (digest "
                f"{manifest.base['digest'][:19]}...), but the loaded base is {base.identity['name']!r} (digest "
                f"{base.identity['digest'][:19]}...); shards only work on the base they were trained on")
        execution = ExecutionMemory(base, max_resident=max_resident)
        for shard in manifest.shards:
            execution.add(shard.name, self.root / shard.dir, shard)
        return execution

    @classmethod
    def open_offline(cls, path: str | Path) -> "SkillBank":
        """Open a bank's manifest and Address Memory without loading the base model: enough to forget,
        export, import and inspect families (not to learn or plan)."""
        root = Path(path)
        manifest = read_manifest(root)
        address = load_selector(root / manifest.address_dir) if manifest.address_dir else None
        return cls(root, manifest, None, address, load_scope(root, manifest))

    @property
    def shard_names(self) -> list[str]:
        return [s.name for s in self.manifest.shards]

    # -- write -------------------------------------------------------------------------------
    def learn(self, family: str, records: Sequence[Record] | Sequence[dict] | str | Path, train_config=None, *,
              skills: Sequence[str] | None = None, catalog=None, progress: bool = True,
              pretrained: str | Path | None = None, checkpoint=None, init: str = DEFAULT_INIT,
              compose=None, negatives=None, synthesize: bool | None = None,
              executor_refuses: bool = False) -> ShardEntry:
        """Train a LoRA on ``records`` only, freeze it, append it, update the Address Memory.

        records: Record objects (taken as they are: already validated when they were read), or dicts in
            the JSONL record form, or a path to a JSONL file; dicts and files are checked by
            :func:`~skillbank.data.records.validate_records` against ``catalog`` and ``family`` first, and
            every bad record is reported in one :class:`RecordError` before anything is trained.
        skills: the family's skill ids (default: the family of that name in ``catalog``, else the ids the
            records use). catalog: a :class:`~skillbank.data.catalog.Catalog`, a catalog file, or a parsed
            OpenAI tools list / MCP tools/list result (all its tools form ``family``); when given, the shard
            stores the full specs (description, typed arguments) of its skills next to the adapter.

        The records are used for this call only: the bank keeps the adapter weights, the family's skill
        list and a training summary - never the requests or graphs.
        pretrained: a directory with this family's adapter already trained on ``records`` with
            ``train_config`` by another process (parallel stages); it is loaded instead of trained, after
            checking that its recorded recipe matches.
        checkpoint: a :class:`~skillbank.train.checkpoint.FitCheckpoint` kept outside the bank: the training
            writes its state there every few minutes, and a learn of the same family on the same records after
            a kill continues from it.
        train_config: a :class:`~skillbank.train.executor.TrainConfig`; default: the recipe that suits the
            bank's base (:func:`skillbank.train.recipes.recipe_for_base`: small-cpu under 1B parameters).
        init: where the new LoRA starts (:func:`~skillbank.memory.lineage.resolve_start`): "fresh" (default),
            "neutral" (the family-neutral start: :mod:`skillbank.memory.neutral`), "previous" (the last shard
            added), "nearest" (the shard the Address Memory routes most of ``records``' requests to), "merge" (the
            updates of the three shards nearest in that sense, weighted by the probability it gives each:
            :class:`~skillbank.memory.lineage.MergedStart`) or "shard:NAME"; the weights of the start are copied
            (same LoRA shape required), the training is otherwise the same, and the manifest records the start
            (``lineage``).
        compose: a :class:`~skillbank.data.compose.Compose`: the executor also trains on records composed from
            ``records`` (values resampled, single steps joined: :func:`~skillbank.data.compose.compose_records`);
            the router and the scope gate read the given records only. What was composed is recorded in the
            training summary (``augmentation``).
        negatives: requests the family must refuse (:mod:`skillbank.data.negatives`): a ``--negatives`` file, or
            Negative objects / dicts; lines of ``records`` with ``"graph": null`` are negatives too. They go to the
            scope gate (kept with the family's statistics), never to the executor.
        synthesize: also write negatives from the catalog and records
            (:func:`~skillbank.data.negatives.synthesize_negatives`); None (default): when fewer than
            ``SYNTHESIZE_BELOW`` are given.
        executor_refuses: also train the executor on the negatives to write the refusal skill
            (:mod:`skillbank.memory.refusal`): a request the gate lets through but the executor refuses is answered
            ``out_of_scope`` ("the <family> executor has no skill for this"). Needs negatives (given or synthesized).
        """
        check_family_name(family)
        if family in self.shard_names:
            raise BankError(f"family {family!r} is already in the bank; shards are write-once - learn it under a new name")
        catalog, records, declared, inline = self._family_inputs(family, records, catalog, skills)
        negatives = inline + _as_negatives(negatives, family, records)
        cfg = train_config or self.default_train_config()
        from skillbank.memory.selectors.embedding import encoder_memo
        with encoder_memo():  # the start's choice, the router and the skill statistics embed the same requests
            start, lineage = resolve_start(self, family, init, [r.request for r in records], cfg, progress=progress)
            if start is not None and pretrained is not None:
                what = ("the family-neutral start" if isinstance(start, Path) else
                        f"a merge of {list(start.names)}" if isinstance(start, MergedStart) else f"shard {start!r}")
                raise BankError(f"a pretrained adapter ({pretrained}) was trained elsewhere from a fresh LoRA; "
                                f"it cannot start from {what} (init='fresh')")
            specs = [catalog.skills[s].to_dict() for s in declared if s in catalog.skills] if catalog else []
            train_records, augmentation = records, None
            if compose is not None:
                from skillbank.data.compose import compose_records
                train_records, report = compose_records(records, compose)
                augmentation = {"compose": compose.to_dict(), **report.to_dict()}
            refusal = None
            if executor_refuses:
                from skillbank.memory.refusal import refusal_id, refusal_records
                from skillbank.train.executor import common_prefix
                negatives = family_negatives(family, specs, records, negatives, synthesize)
                synthesize = False  # made once, here: the executor and the gate learn the same negatives
                if not negatives:
                    raise RecordError(f"executor_refuses needs negatives for {family!r} (give some, or let them be "
                                      "synthesized)")
                prefix = common_prefix(declared)
                refusals = refusal_records(family, prefix, declared, negatives, len(records))
                train_records = list(train_records) + refusals
                refusal = {"skill": refusal_id(prefix), "records": len(refusals)}
            return self._publish_shard(family, records, cfg, declared, specs, progress=progress,
                                       pretrained=pretrained, checkpoint=checkpoint, start=start, lineage=lineage,
                                       train_records=train_records, augmentation=augmentation,
                                       negatives=negatives, synthesize=synthesize, refusal=refusal)

    def _family_inputs(self, family: str, records, catalog, skills, *, replacing: bool = False):
        """(catalog, records, declared skill ids, the negatives among the records) of a family to learn, checked:
        records as Records (files and dicts validated), skills from ``skills``, else the catalog's family, else those the records use; every
        used skill declared, and none owned by another shard (``replacing``: the family's own old shard aside)."""
        catalog = _as_catalog(catalog, family)
        records, negatives = _as_records(records, catalog, family)
        if not records:
            raise RecordError(f"no training records for family {family!r}")
        used = sorted({t for r in records for t in r.graph.tasks})
        if skills is None and catalog is not None and family in catalog.family_keys:
            skills = catalog.family(family).skills
        declared = sorted(set(skills)) if skills is not None else used
        undeclared = sorted(set(used) - set(declared))
        if undeclared:
            raise RecordError(f"records use skill(s) outside the family's catalog: {undeclared[:5]}")
        owned = {s: e.name for e in self.manifest.shards if not (replacing and e.name == family) for s in e.skills}
        check_disjoint(declared, owned)
        return catalog, records, declared, negatives

    def default_train_config(self):
        """The recipe for this bank's base model when none is given (see :mod:`skillbank.train.recipes`)."""
        from skillbank.train.recipes import train_config_for_base
        return train_config_for_base(self.manifest.base["name"])[0]

    # -- the one write path of learn, relearn and import --------------------------------------------
    def _next_index(self) -> int:
        """Shard directories are numbered; after a forget the count of shards no longer gives a free number."""
        used = [len(self.manifest.shards)]
        for sub in ("shards", "address"):
            d = self.root / sub
            if d.is_dir():
                used += [int(m.group(1)) for p in d.iterdir() if (m := re.match(r"\.?(?:staging-)?(\d{4})", p.name))]
        used += [int(m.group(1)) for e in self.manifest.shards if (m := re.search(r"/(\d{4})-", e.dir))]
        return max(used) + 1

    def _publish_shard(self, family: str, records: Sequence[Record] | None, cfg, declared: list[str], specs: list[dict],
                       *, progress: bool = True, pretrained: str | Path | None = None, replace: bool = False,
                       imported: dict | None = None, checkpoint=None, start: str | Path | None = None,
                       lineage: dict | None = None, drop: Sequence[str] = (),
                       train_records: Sequence[Record] | None = None, augmentation: dict | None = None,
                       negatives: Sequence = (), synthesize: bool | None = None,
                       refusal: dict | None = None) -> ShardEntry:
        """Stage a shard (trained on ``records``, loaded from ``pretrained``, or copied by ``imported``), the
        Address Memory with it, then publish both with one atomic manifest write.

        replace: the family is already in the bank (relearn): its entry keeps its position, its Address
        statistics are subtracted first, and its old directory is removed after the publish.
        imported: {"dir": a shard directory to copy, "address": Address statistics, "scope": ...} (import).
        start, lineage: the shard the training starts from (a Path: the neutral start's adapter directory; None:
        a fresh LoRA) and the record of it.
        drop: families forgotten in the same publish (a relearn's descendants).
        train_records: what the executor trains on (default ``records``; composed records added by ``learn``),
        augmentation: the record of how they were made, kept in the training summary.
        negatives, synthesize: the family's negatives for the scope gate, and whether to synthesize more
        (:func:`family_negatives`).
        refusal: {"skill": the refusal skill id, "records": how many refusal records were trained} for a shard
        trained to say no (:mod:`skillbank.memory.refusal`): named in its skills.json and training summary.
        """
        from skillbank.train.executor import common_prefix
        if imported is None:  # the router's statistics too are made after the training
            (self.address or make_selector(self.manifest.address_kind, **self.manifest.address_params)).check_encoder()
        if imported is None and (self.scope is not None or not self.manifest.address_dir):
            # the scope statistics are made after the training: a missing encoder must stop us before it
            (self.scope or ScopeDetector(**self.manifest.scope_params)).check_encoder()
            if self.scope is not None and self.scope.made_with_other_encoder_weights():
                raise BankError("this bank's scope statistics were made with other weights of the sentence "
                                f"encoder {self.scope.encoder!r} than the installed ones; refit them first "
                                "(`skillbank scope fit BANK --family F --data F.jsonl` for each family)")
        self._remove_orphans()
        index = self._next_index()
        shard_rel = f"shards/{index:04d}-{family}"
        staging = self.root / "shards" / f".staging-{index:04d}-{family}"
        if staging.exists():
            shutil.rmtree(staging)
        prefix = common_prefix(declared)
        old_entry = next((e for e in self.manifest.shards if e.name == family), None) if replace else None
        if old_entry is not None and self._execution is not None:
            self._execution.detach(family)
        try:
            if imported is not None:
                shutil.copytree(imported["dir"], staging)
                summary = json.loads((staging / "training.json").read_text())
                if self._execution is not None:
                    self._execution.attach(family, staging, imported["entry"])
            else:
                if pretrained is not None:
                    summary = self.execution.load_trained(family, pretrained)
                    if summary.get("config") != cfg.to_dict() or summary.get("family_prefix") != prefix:
                        raise BankError(f"{pretrained} was trained with another recipe or family prefix than this "
                                        "learn step's; retrain it")
                else:
                    summary = self.execution.train_shard(family, train_records if train_records is not None else records,
                                                         cfg, family_prefix=prefix, progress=progress,
                                                         checkpoint=checkpoint, init=start)
                    if augmentation is not None:
                        summary["augmentation"] = augmentation
                    if refusal is not None:
                        summary["refusal"] = refusal
                self.execution.save_shard(family, staging)
                (staging / "skills.json").write_text(json.dumps(
                    {"family": family, "skills": declared, "specs": specs,
                     **({"refusal": refusal["skill"]} if refusal is not None else {})},
                    indent=1, ensure_ascii=False) + "\n")
                (staging / "training.json").write_text(json.dumps(summary, indent=1) + "\n")
                save_skill_address(fit_skill_address(records, specs, self.manifest.address_kind,
                                                     self.manifest.address_params), staging)
            digests = dir_digests(staging)
            os.replace(staging, self.root / shard_rel)

            address, scope = self._address_copy()
            if old_entry is not None:
                address.forget(family)
                if scope is not None and family in scope.classes_:
                    scope.forget(family)
            for gone in drop:
                address.forget(gone)
                if scope is not None and gone in scope.classes_:
                    scope.forget(gone)
            if imported is not None:
                _merge_family_stats(address, scope, family, imported)
            else:
                requests, docs = [r.request for r in records], catalog_text(specs)
                address.partial_fit(requests, family)
                address.partial_fit_catalog(docs, family)
                if scope is not None:
                    scope.partial_fit(requests, family, docs, **fit_inputs(records, family))
                    _fit_family_negatives(scope, family, specs, records, negatives, synthesize)
            address_rel = f"address/{index:04d}"
            address.save(self.root / address_rel)
            if scope is not None:
                scope.save(self.root / address_rel)
        except BaseException:
            # Nothing is published: drop the in-memory adapter and the half-written files.
            if self._execution is not None:
                self._execution.detach(family)
            shutil.rmtree(staging, ignore_errors=True)
            shutil.rmtree(self.root / shard_rel, ignore_errors=True)
            if old_entry is not None and self._execution is not None:
                self._execution.attach(family, self.root / old_entry.dir, old_entry)
            raise
        if imported is not None:
            entry = ShardEntry(**{**asdict(imported["entry"]), "dir": shard_rel, "digests": digests})
        else:
            entry = ShardEntry(name=family, dir=shard_rel, skills=declared, family_prefix=prefix,
                               target_format=cfg.target_format, system_prompt=cfg.system_prompt, digests=digests,
                               created=time.strftime("%Y-%m-%dT%H:%M:%S"), training=summary,
                               lineage=lineage or fresh(),
                               values_copied=values_copied((r.request, r.graph) for r in records))
        shards = ([entry if e.name == family else e for e in self.manifest.shards if e.name not in drop]
                  if old_entry is not None else self.manifest.shards + [entry])
        dropped = [e for e in self.manifest.shards if e.name in drop]
        self._commit(shards, address, scope, address_rel)
        if old_entry is not None:  # superseded; a crash before this line leaves an orphan the next write removes
            shutil.rmtree(self.root / old_entry.dir, ignore_errors=True)
        for e in dropped:
            shutil.rmtree(self.root / e.dir, ignore_errors=True)
            if self._execution is not None:
                self._execution.detach(e.name)
        if self._execution is not None:
            self._execution.register(family, self.root / shard_rel, entry)
        return entry

    def _address_copy(self) -> tuple[Selector, "ScopeDetector | None"]:
        """Fresh copies of the published Address Memory to stage a change on (the served one stays as is
        until the manifest names the new state)."""
        if self.manifest.address_dir and self.address is not None:
            # The in-memory state is the published one (set by open and by every commit): copying it costs
            # far less than reading and decompressing it again, and a learn should not grow with the bank.
            address, scope = copy.deepcopy(self.address), copy.deepcopy(self.scope)
        elif self.manifest.address_dir:
            address = load_selector(self.root / self.manifest.address_dir)
            d = self.root / self.manifest.address_dir
            scope = ScopeDetector.load(d) if ScopeDetector.exists(d) else None
        else:
            address = make_selector(self.manifest.address_kind, **self.manifest.address_params)
            scope = ScopeDetector(**self.manifest.scope_params)
        return address, scope

    def _commit(self, shards: list[ShardEntry], address: Selector | None, scope, address_rel: str | None) -> None:
        new_manifest = Manifest(base=self.manifest.base, shards=shards, address_kind=self.manifest.address_kind,
                                address_params=self.manifest.address_params, address_dir=address_rel,
                                scope_params=self.manifest.scope_params)
        write_manifest(self.root, new_manifest)  # the commit point
        old_address = self.manifest.address_dir
        self.manifest = new_manifest
        if old_address and old_address != address_rel:  # superseded; a crash first leaves an orphan
            shutil.rmtree(self.root / old_address, ignore_errors=True)
        self.address, self.scope = address, scope

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

    def check_scope(self, requests: Sequence[str]) -> list[ScopeVerdict]:
        """Is each request covered by some learned family? (see :mod:`skillbank.memory.scope`)"""
        if self.scope is None or set(self.scope.classes_) != set(self.shard_names):
            why = ("this bank has no scope statistics (learned before out-of-scope detection; add them with "
                   "`skillbank scope fit`)" if self.scope is None else
                   f"the scope statistics cover {sorted(self.scope.classes_)}, not every shard")
            return [ScopeVerdict(None, None, None, None, why) for _ in requests]
        masked = self.scope.read(requests)  # once, for the scores and a refusal's words
        _, scores, refused_by = self.scope.verdicts(masked)
        thr = self.scope.threshold_
        verdicts = []
        for request, row, negative in zip(masked, scores, refused_by):
            best = int(np.argmax(row))
            score = float(row[best])
            if negative is not None:
                family = self.scope.classes_[best]
                verdicts.append(ScopeVerdict(False, score, thr, family, (
                    f"{family} has no skill for this: the request is closer to what {family} was told to refuse "
                    f"({negative.kind.replace('_', ' ')}, {negative.source}: {negative.request!r}) than to its own "
                    "requests (see `skillbank scope negatives`)")))
                continue
            if score >= thr:
                verdicts.append(ScopeVerdict(True, score, thr, self.scope.classes_[best], None))
                continue
            why = ("the request has no words the Address Memory can read" if not np.isfinite(score) else
                   f"no learned skill family covers this request: judged by {self.scope.evidence}, its best "
                   f"family ({self.scope.classes_[best]}) scores {score:.2f}, below the threshold {thr:.2f} "
                   f"{self.scope.threshold_source}" + self._unseen_words(request, best))
            verdicts.append(ScopeVerdict(False, score if np.isfinite(score) else None, thr,
                                         self.scope.classes_[best], why))
        return verdicts

    def _unseen_words(self, request, family: int, most: int = 5) -> str:
        """What a refused request asks that its closest family does not know: the words of it (values left out)
        that the family's training requests and catalog never use, as a clause of the refusal's reason."""
        unseen = self.scope.unseen_words(request, self.scope.classes_[family])
        if not unseen:
            return ""
        return (f"; words {self.scope.classes_[family]} never uses: "
                + ", ".join(repr(w) for w in unseen[:most]) + (" ..." if len(unseen) > most else ""))

    def skill_address(self, family: str):
        """Shard ``family``'s skill statistics (:mod:`skillbank.memory.skill_address`), or None where the shard
        was written without them; their files are checked against the shard's digests when first read."""
        from skillbank.memory.skill_address import SKILL_ADDRESS_DIR, load_skill_address
        entry = self._entry(family)
        key = entry.digests.get(f"{SKILL_ADDRESS_DIR}/selector.json", "")
        kept = self._skill_addresses.get(family)
        if kept is not None and kept[0] == key:
            return kept[1]
        selector = None
        if key:
            mine = {f: d for f, d in entry.digests.items() if f.startswith(SKILL_ADDRESS_DIR + "/")}
            problems = shard_file_problems(family, self.root / entry.dir, mine)
            if problems:
                raise BankError(problems[0] + " (checked as its skill statistics were read)")
            selector = load_skill_address(self.root / entry.dir)
        self._skill_addresses[family] = (key, selector)
        return selector

    def refusal_of(self, family: str) -> str | None:
        """The refusal skill of shard ``family`` (:mod:`skillbank.memory.refusal`), or None where it was learned
        without one."""
        entry = self._entry(family)
        kept = self._refusals.get(family)
        if kept is None or kept[0] != entry.dir:  # a shard directory is written once: a new one is a new version
            data = read_json(self.root / entry.dir / "skills.json", BankError, what="shard skills") \
                if (self.root / entry.dir / "skills.json").is_file() else {}
            kept = (entry.dir, data.get("refusal") if isinstance(data, dict) else None)
            self._refusals[family] = kept
        return kept[1]

    def skill_priors(self, requests: Sequence[str], shards: Sequence[str], weight: float | None = None,
                     floor: float | None = None) -> list:
        """Per request the :class:`~skillbank.model.constrain.SkillPrior` its shard's skill statistics give
        (None for a shard without them, or everywhere when ``weight`` is 0; None: the default weight and floor)."""
        from skillbank.memory.skill_address import PRIOR_FLOOR, PRIOR_WEIGHT, skill_log_priors
        from skillbank.model.constrain import SkillPrior
        weight = PRIOR_WEIGHT if weight is None else float(weight)
        out: list = [None] * len(requests)
        if weight <= 0:
            return out
        for name in sorted(set(shards)):
            selector = self.skill_address(name)
            if selector is None:
                continue
            idx = [i for i, s in enumerate(shards) if s == name]
            logps = skill_log_priors(selector, [requests[i] for i in idx], PRIOR_FLOOR if floor is None else floor)
            for i, logp in zip(idx, logps):
                out[i] = SkillPrior(logp, weight)
        return out

    def plan(self, requests: Sequence[str] | str, *, shard: str | None = None, batch_size: int = 8,
             max_new_tokens: int | None = None, constrain: bool = True, copy_values: bool | None = None,
             scope: bool = True, explain: bool = False, skill_prior: float | None = None) -> list["Plan"]:
        """Route each request (or force ``shard``) and generate its task graph with that one executor
        (:class:`~skillbank.planner.Planner`, the one planning path).

        constrain: decode with the shard's grammar (its own skills and declared arguments only; default);
        copy_values: literal argument values must also be substrings of the request; None (default): for the
            shards whose training graphs all copied their values from the request (``ShardEntry.values_copied``,
            recorded by ``learn``), not for the others;
        scope: a request no learned family covers gets no plan (``out_of_scope`` with a ``reason``) and
            is not generated - nor is the base model loaded for it; off when ``shard`` is forced;
        explain: each plan carries ``explain`` (see :class:`~skillbank.planner.Plan`);
        skill_prior: the weight of the shard's skill statistics when the executor chooses a skill name
            (:mod:`skillbank.memory.skill_address`; None: the default, 0: off; constrained decoding only)."""
        return self.planner.plan(requests, shard=shard, batch_size=batch_size, max_new_tokens=max_new_tokens,
                                 constrain=constrain, copy_values=copy_values, scope=scope, explain=explain,
                                 skill_prior=skill_prior)

    # -- a family's life cycle ---------------------------------------------------------------
    def _entry(self, family: str) -> ShardEntry:
        for e in self.manifest.shards:
            if e.name == family:
                return e
        raise BankError(f"{self.root} has no family {family!r}; it has {self.shard_names}")

    def check_exact_forget(self, family: str, action: str) -> None:
        """Refuse ``action`` before anything is trained or written when the Address Memory cannot remove one
        family's statistics exactly (a pooled covariance mixes every family's)."""
        forgettable = (self.address.forgettable if self.address is not None
                       else selector_class(self.manifest.address_kind).can_forget)
        if not forgettable:
            raise BankError(f"cannot {action} {family!r}: this bank's Address Memory ({self.manifest.address_kind}) "
                            "pools its statistics over families, so one family's cannot be removed exactly; "
                            f"a bank created with --address {HashingNBAddress.kind} or since 2026-12-04 can")

    def descendants(self, family: str) -> list[str]:
        """The shards that started from ``family``'s weights, directly or through one another (manifest order)."""
        self._entry(family)
        return lineage_descendants(self.manifest.shards, family)

    def check_descendants(self, family: str, action: str, descendants: str, allowed: Sequence[str]) -> list[str]:
        """``family``'s descendants, after refusing ``action`` when there are some and ``descendants`` is
        "refuse": their weights carry some of what ``family``'s shard learned."""
        if descendants not in allowed:
            raise BankError(f"descendants must be one of {list(allowed)}, got {descendants!r}")
        heirs = self.descendants(family)
        if heirs and descendants == "refuse":
            options = " or ".join(f"descendants={o!r}" for o in allowed if o != "refuse")
            cli = "--with-descendants" if action == "forget" else "--descendants " + "|".join(allowed[1:])
            raise BankError(f"cannot {action} {family!r}: shard(s) {heirs} started from its weights (directly or "
                            f"through one another), so they carry some of what it learned; pass {options} "
                            f"(`skillbank {action} {cli}`)")
        return heirs

    def forget(self, family: str, *, keep_files: str | Path | None = None, descendants: str = "refuse") -> ShardEntry:
        """Remove a family: its shard leaves the manifest and its statistics leave the Address Memory.

        Exact: the Address Memory's state is additive per family (Naive Bayes counts, scope counts), so the
        bank then routes exactly as a bank that never learned the family. keep_files: move the shard's
        directory there (a new directory) instead of deleting it. descendants: shards that started from this
        family's weights (:meth:`descendants`) still carry some of it, so a family with descendants is refused
        ("refuse", default) unless they are forgotten with it, in the same publish ("forget")."""
        entry = self._entry(family)
        heirs = self.check_descendants(family, "forget", descendants, ("refuse", "forget"))
        if keep_files is not None:
            keep_files = Path(keep_files)
            if keep_files.exists():
                raise BankError(f"{keep_files} already exists; give a new directory to keep the shard in")
            if heirs:
                raise BankError(f"keep_files keeps one shard, but forgetting {family!r} forgets {heirs} too; "
                                "export the ones to keep first (`skillbank export family`), then forget without it")
        gone = [family] + heirs
        remaining = [e for e in self.manifest.shards if e.name not in gone]
        if remaining:
            self.check_exact_forget(family, "forget")
        address, scope = self._address_copy()
        address_rel = None
        if remaining:
            for name in gone:
                address.forget(name)
                if scope is not None and name in scope.classes_:
                    scope.forget(name)
            address_rel = f"address/{self._next_index():04d}"
            address.save(self.root / address_rel)
            if scope is not None:
                scope.save(self.root / address_rel)
        else:
            address, scope = None, None
        dropped = [e for e in self.manifest.shards if e.name in heirs]
        self._commit(remaining, address, scope, address_rel)
        if keep_files is not None:
            keep_files.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(self.root / entry.dir), str(keep_files))
        else:
            shutil.rmtree(self.root / entry.dir, ignore_errors=True)
        for e in dropped:
            shutil.rmtree(self.root / e.dir, ignore_errors=True)
        if self._execution is not None:
            for name in gone:
                self._execution.detach(name)
        return entry

    def relearn(self, family: str, records, train_config=None, *, catalog=None,
                skills: Sequence[str] | None = None, progress: bool = True, init: str = DEFAULT_INIT,
                descendants: str = "refuse", negatives=None, synthesize: bool | None = None) -> ShardEntry:
        """A new version of a family's shard, trained on ``records`` only and published atomically in place
        of the old one (the old Address statistics are subtracted, the new ones added). negatives, synthesize:
        as in :meth:`learn` (none given: the old version's given negatives are kept).

        init: where the new version starts (as in :meth:`learn`; never the family's own old shard).
        descendants: shards that started from the old version are refused ("refuse", default), kept as they
        are ("keep": their lineage then names a start whose recorded weights are gone) or forgotten in the
        same publish ("forget")."""
        from skillbank.train.executor import TrainConfig
        old = self._entry(family)
        self.check_exact_forget(family, "relearn")
        heirs = self.check_descendants(family, "relearn", descendants, ("refuse", "keep", "forget"))
        drop = heirs if descendants == "forget" else []
        catalog, records, declared, inline = self._family_inputs(family, records, catalog, skills, replacing=True)
        negatives = inline + _as_negatives(negatives, family, records)
        if not negatives and self.scope is not None:  # none given: the old version's given ones carry over
            negatives = [n for n in self.scope.negatives_.get(family, ()) if n.source == "given"]
        if catalog is not None:
            specs = [catalog.skills[s].to_dict() for s in declared if s in catalog.skills]
        else:  # keep the specs the old version was given
            specs = [sp for sp in read_skills_specs(self.root / old.dir) if sp.get("id") in declared]
        cfg = train_config or TrainConfig.from_dict(old.training.get("config", {}))
        from skillbank.memory.selectors.embedding import encoder_memo
        with encoder_memo():  # as in learn
            start, lineage = resolve_start(self, family, init, [r.request for r in records], cfg, replacing=True,
                                           exclude=drop)
            return self._publish_shard(family, records, cfg, declared, specs, progress=progress, replace=True,
                                       start=start, lineage=lineage, drop=drop, negatives=negatives,
                                       synthesize=synthesize)

    def export_family(self, family: str, out: str | Path) -> Path:
        """Write one family as a directory another bank on the same base can import: the shard, its entry (with
        its lineage: a bank imports a shard only when it holds its start) and its Address statistics (its row of
        counts; no requests)."""
        entry = self._entry(family)
        out = Path(out)
        if out.exists():
            raise BankError(f"{out} already exists; give a new directory")
        address, scope = self._address_copy()
        try:
            family_address = address.family_selector(family)
        except SelectorError as exc:
            raise BankError(f"cannot export {family!r}: {exc}") from None
        tmp = out.with_name(out.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(self.root / entry.dir, tmp / "shard")
        family_address.save(tmp / "address")
        if scope is not None and family in scope.classes_:
            scope.family_detector(family).save(tmp / "address")
        meta = {"format": FAMILY_EXPORT_FORMAT, "base": self.manifest.base, "address_kind": self.manifest.address_kind,
                "address_params": self.manifest.address_params, "entry": asdict(entry)}
        (tmp / "family.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")
        os.replace(tmp, out)
        return out

    def import_family(self, path: str | Path, *, name: str | None = None) -> ShardEntry:
        """Add a family exported by :meth:`export_family` from a bank on the same base."""
        path = Path(path)
        meta = read_json(path / "family.json", BankError, expect_format=FAMILY_EXPORT_FORMAT, what="family export",
                         missing=f"{path} is not a family export (no family.json); make one with `skillbank export family`")
        if meta["base"]["digest"] != self.manifest.base["digest"]:
            raise BankError(f"{path} was exported from a bank on base {meta['base']['name']!r} "
                            f"(digest {meta['base']['digest'][:19]}...); this bank's base is "
                            f"{self.manifest.base['name']!r} (digest {self.manifest.base['digest'][:19]}...)")
        counts_catalog_here = _catalog_counts_missing(meta["address_kind"], meta["address_params"],
                                                      self.manifest.address_kind, self.manifest.address_params)
        if not counts_catalog_here and (meta["address_kind"] != self.manifest.address_kind
                                        or meta["address_params"] != self.manifest.address_params):
            raise BankError(f"{path}: its Address Memory ({meta['address_kind']} {meta['address_params']}) differs "
                            f"from this bank's ({self.manifest.address_kind} {self.manifest.address_params}); "
                            "the statistics cannot be merged. Learn the family again here from its records "
                            "(`skillbank learn`), or import it into a bank made with its router: SkillBank.create("
                            f"PATH, address_kind={meta['address_kind']!r}, address_params={meta['address_params']!r})")
        entry = ShardEntry(**meta["entry"])
        family = check_family_name(name or entry.name)
        if family in self.shard_names:
            raise BankError(f"family {family!r} is already in the bank; import it under another name (--name)")
        shard_dir = path / "shard"
        problems = shard_file_problems(entry.name, shard_dir, entry.digests)
        if problems:
            raise BankError(f"{path} is not an intact family export: " + "; ".join(problems))
        owned = {s: e.name for e in self.manifest.shards for s in e.skills}
        clash = sorted(s for s in entry.skills if s in owned)
        if clash:
            raise BankError("the imported family's skills are already in this bank: "
                            + ", ".join(f"{s} (in {owned[s]})" for s in clash[:5]))
        entry.name = family
        entry.lineage = self._imported_lineage(path, meta["entry"]["name"], entry.lineage)
        address = load_selector(path / "address")
        if counts_catalog_here:  # exported before routers counted the catalog: add its text, as learning here would
            address.catalog_weight = self.manifest.address_params["catalog_weight"]
            address.partial_fit_catalog(catalog_text(read_skills_specs(shard_dir)), meta["entry"]["name"])
        imported = {"dir": shard_dir, "entry": entry, "address": address,
                    "scope": ScopeDetector.load(path / "address") if ScopeDetector.exists(path / "address") else None,
                    "source_name": meta["entry"]["name"]}
        return self._publish_shard(family, None, None, entry.skills, [], imported=imported)

    def _imported_lineage(self, path: Path, name: str, lineage: dict) -> dict:
        """An imported shard's lineage in this bank: its start must be here, found by its weights digest (under
        whatever name this bank gives it); otherwise this bank could not forget that start exactly."""
        if (lineage or {}).get("init", "fresh") == "fresh":
            return fresh()
        if lineage.get("init") == "neutral":  # no shard of the sender's is needed to forget it exactly
            return dict(lineage)
        merged = lineage.get("init") == "merge"
        starts = (list(zip(lineage.get("from", []), lineage.get("digests", []))) if merged
                  else [(lineage.get("from"), lineage.get("digest"))])
        names = []
        for start, digest in starts:
            here = [e for e in self.manifest.shards if weights_digest(e) == digest]
            if not here:
                raise BankError(f"{path}: shard {name!r} started from the weights of shard {start!r} (digest "
                                f"{str(digest)[:19]}...), which this bank does not hold; import that shard first "
                                "(`skillbank export family` it from the same bank), then this one")
            names.append(here[0].name)
        return {**lineage, "from": names if merged else names[0]}

    def set_negatives(self, family: str, negatives=None, *, synthesize: bool | None = None,
                      replace: bool = False) -> list:
        """Give a learned family negatives (a ``--negatives`` file, Negative objects or dicts) without retraining
        anything: they are added to the given ones it holds (``replace``: they replace them), and synthesized ones
        are rewritten from its catalog as :meth:`learn` would (its records are not kept, so from the catalog alone).
        Returns what the family now holds. Banks learned before negatives existed get them this way."""
        entry = self._entry(family)
        if self.scope is None or family not in self.scope.classes_:
            raise BankError(f"{family!r} has no scope statistics to add negatives to; add them first with "
                            f"`skillbank scope fit {self.root} --family {family} --data RECORDS.jsonl`")
        new = _as_negatives(negatives, family)
        kept = [] if replace else [n for n in self.scope.negatives_.get(family, ()) if n.source == "given"]
        have = {n.id for n in kept}
        clash = [n.id for n in new if n.id in have]
        if clash:
            raise RecordError(f"negative id(s) {clash[:5]} already given to {family!r} (pass replace to start over)")
        specs = read_skills_specs(self.root / entry.dir)
        held = family_negatives(family, specs, [], kept + new, synthesize)
        address, scope = self._address_copy()
        scope.fit_negatives(family, held)
        address_rel = f"address/{self._next_index():04d}"
        address.save(self.root / address_rel)
        scope.save(self.root / address_rel)
        self._commit(self.manifest.shards, address, scope, address_rel)
        return held

    def fit_scope(self, family: str, records: Sequence[Record], negatives: Sequence = (),
                  synthesize: bool | None = None) -> None:
        """Add scope statistics for a family of a bank learned before out-of-scope detection existed, or
        refit them (after the sentence encoder changed: the others are then dropped, to be refit in turn).
        Its shard and routing are unchanged. Once every family has them, out-of-scope detection is on.
        negatives, synthesize: as in :meth:`learn`."""
        entry = self._entry(family)
        address, scope = self._address_copy()
        scope = scope or ScopeDetector(**self.manifest.scope_params)
        if scope.made_with_other_encoder_weights():
            # embeddings of two encoders cannot share one scale: start over, family by family
            scope = ScopeDetector(**scope.get_params())
        if family in scope.classes_:
            scope.forget(family)
        specs = read_skills_specs(self.root / entry.dir)
        scope.partial_fit([r.request for r in records], family, catalog_text(specs), **fit_inputs(records, family))
        _fit_family_negatives(scope, family, specs, records, _as_negatives(negatives, family, records), synthesize)
        address_rel = f"address/{self._next_index():04d}"
        address.save(self.root / address_rel)
        scope.save(self.root / address_rel)
        self._commit(self.manifest.shards, address, scope, address_rel)

    def info(self) -> dict:
        return bank_info(self.root)


def skill_statistics_kept(max_resident: int | None) -> int:
    """How many shards' skill statistics a bank keeps read: under ``max_resident`` as many as shard grammars
    (:func:`~skillbank.memory.execution.grammars_kept`: the resident shards, with a small floor), else a fixed
    number."""
    return SKILL_STATISTICS_KEPT if max_resident is None else grammars_kept(max_resident)


def default_scope_params(params: dict | None = None) -> dict:
    """A new bank's scope settings, ``params`` over the defaults: the shipped encoder, short values read as the
    families' objects (the value reader), each family's scores standardised by its own training scores, and, where the gate has an encoder and the value reader, the shipped
    outlier corpus, one discriminant per category of it."""
    params = {"encoder": DEFAULT_ENCODER, **(params or {})}
    if params.get("reader", "values") == "values":
        params.setdefault("objects", True)  # short values that name a family's objects are evidence for it
    # each family's scores on its own scale: a family of 85 varied requests is not judged by 1,000 template ones
    params.setdefault("family_scales", True)
    if params["encoder"] is not None and params.get("reader", "values") == "values":
        params.setdefault("outliers", OUTLIER_CORPUS)
    if params.get("outliers") is not None:
        params.setdefault("outlier_categories", True)
    return params


def bank_info(path: str | Path, *, verify: bool = False) -> dict:
    """A bank's manifest summary, read from disk without loading any model. verify: also hash every file
    against its digest and read the Address Memory; ``problems`` lists what is wrong (empty: healthy)."""
    root = Path(path)
    manifest = read_manifest(root)
    orphans = SkillBank(root, manifest, None, None).orphans()
    scope = None
    if manifest.address_dir and ScopeDetector.exists(root / manifest.address_dir):
        meta = read_json(root / manifest.address_dir / "scope.json", BankError, what="scope detector")
        scope = {"params": meta.get("params"), "families": meta.get("classes")}
        negatives_file = root / manifest.address_dir / SCOPE_NEGATIVES
        held = read_json(negatives_file, BankError, what="scope negatives") if negatives_file.is_file() else {}
        # per family: how many negatives the gate holds, given and synthesized (0 and 0: none, e.g. an older bank)
        scope["negatives"] = {f: {"given": sum(n.get("source", "given") == "given" for n in held.get(f, [])),
                                  "synthesized": sum(n.get("source") == "synthesized" for n in held.get(f, []))}
                              for f in (meta.get("classes") or [])}
    extra = {"verified": True, "problems": shard_problems(root, manifest)} if verify else {}
    return {"root": str(root), "format": manifest.format, "base": manifest.base, **extra,
            "address": {"kind": manifest.address_kind, "params": manifest.address_params, "dir": manifest.address_dir,
                        "scope": scope},
            "shards": [{"name": s.name, "dir": s.dir, "skills": len(s.skills), "family_prefix": s.family_prefix,
                        "target_format": s.target_format, "created": s.created,
                        "train_examples": s.training.get("examples"), "train_seconds": s.training.get("wall_seconds"),
                        "lineage": lineage_of(s, manifest.shards), "values_copied": s.values_copied}
                       for s in manifest.shards],
            "orphans": [str(p.relative_to(root)) for p in orphans]}


FAMILY_EXPORT_FORMAT = 1
# What a bank's router reads: free-text payloads of at least this many words are replaced by a placeholder
# (chosen on the development sets of bench/scope.py among 1, 3, 6 and 10 words; docs/routing.md).
PAYLOAD_MIN_WORDS = 6
# How many times a new bank's router counts each skill's catalog text with its family's requests (lexical
# statistics only): 1, one pseudo-request per skill. On the hand-written development requests it routes 1.7 points
# more at K = 5 and the same at K = 20 and 50, and 3.8 more of the TaskBench sample (20 requests a family); 3 and 10
# gain one or two development requests more at K = 5 only, and 10 loses TaskBench requests (scripts/route_variants.py;
# docs/routing.md).
CATALOG_WEIGHT = 1
# Whether a new bank's router reads only the sentences that ask for something when a request also sets the scene
# ("I'm editing some footage for my channel. Print contract_8.docx."), at learning and plan time alike. Chosen on
# the development requests (+1 at K = 5, equal at 20 and 50); the template held-out requests gain 1.0-1.3 points
# (98.0 -> 99.2, 98.4 -> 99.7, 99.0 -> 100.0% at K = 5 / 20 / 50), the frozen test requests, not chosen on, +1 / -2 / 0
# requests (scripts/route_variants.py --variants default,whole; docs/routing.md). The lexical Address Memory alone
# loses development requests with it (83.1 -> 78.3% at K = 20: --variants lexical,lexical-asking), so it stays this
# router's option.
DROP_CONTEXT = True
# The sentence encoder of a new bank's scope gate and router: all-MiniLM-L6-v2 with int8 matrix weights. Scope
# plus routing reads two texts per request (the gate the request with its values masked, the router with its
# long payloads masked), and on two CPU cores the int8 form makes that 6-10 ms instead of 10-14 ms, with the same
# route accuracy on the development requests (92.2 / 94.0 / 83.6 at K = 5 / 20 / 50) and the gate within 1.8
# points (bench/scope.py --encoder, bench/encoder_speed.py; docs/routing.md). Banks made before keep "minilm".
DEFAULT_ENCODER = "minilm-int8"


def default_address(scope_encoder: str | None = DEFAULT_ENCODER, kind: str | None = None) -> tuple[str, dict]:
    """The router a new bank gets, and its parameters: by default the sentence-embedding router reading past
    long payloads (it routes hand-written requests 13-22 points better than the lexical Address Memory;
    docs/routing.md), with the encoder the scope gate loads anyway; without an encoder (``--scope-encoder
    none``), the lexical one. ``kind``: that router with its defaults."""
    kind = kind or ("embed-lda-nb" if scope_encoder is not None else HashingNBAddress.kind)
    if kind == "embed-lda-nb":
        return kind, {"encoder": scope_encoder or DEFAULT_ENCODER, "payload_min_words": PAYLOAD_MIN_WORDS,
                      "catalog_weight": CATALOG_WEIGHT, "drop_context": DROP_CONTEXT}
    return kind, {}


def load_scope(root: Path, manifest: Manifest) -> ScopeDetector | None:
    d = root / manifest.address_dir if manifest.address_dir else None
    return ScopeDetector.load(d) if d is not None and ScopeDetector.exists(d) else None


def read_skills_specs(shard_dir: Path) -> list[dict]:
    path = shard_dir / "skills.json"
    if not path.is_file():
        return []
    return list(read_json(path, BankError, what="shard skills").get("specs", []))


def _catalog_counts_missing(kind: str, params: dict, here_kind: str, here_params: dict) -> bool:
    """Whether an exported family's router is this bank's but for the catalog text it does not count yet (a
    family exported before 2026-12-05 into a newer bank): its statistics plus that text are what it would hold
    had it been learned here, so it can come in."""
    without = {k: v for k, v in here_params.items() if k != "catalog_weight"}
    return (kind == here_kind == "embed-lda-nb" and not params.get("catalog_weight")
            and bool(here_params.get("catalog_weight")) and params == without)


def _merge_family_stats(address: Selector, scope: ScopeDetector | None, family: str, imported: dict) -> None:
    """Append an exported family's statistics (every statistic is a per-family one, so this equals having
    learned it here)."""
    try:
        address.add_family(imported["address"], imported["source_name"], family)
    except SelectorError as exc:
        raise BankError(f"cannot import the family's Address statistics: {exc}") from None
    fam_scope = imported.get("scope")
    if scope is not None:
        if fam_scope is None:
            raise BankError("the exported family has no scope statistics; add them after importing with "
                            "`skillbank scope fit`")
        try:
            scope.add_family(fam_scope, imported["source_name"], family)
        except SelectorError as exc:
            raise BankError(f"the exported family's scope statistics do not fit this bank's: {exc}; add them "
                            "after importing with `skillbank scope fit`") from None


def shard_problems(root: Path, manifest: Manifest) -> list[str]:
    """Every missing or modified file of every shard and of the Address Memory (reads and hashes them all)."""
    problems = [f"{root}: {problem}" for shard in manifest.shards
                for problem in shard_file_problems(shard.name, root / shard.dir, shard.digests)]
    if manifest.address_dir:
        try:
            load_selector(root / manifest.address_dir)
            load_scope(root, manifest)
        except Exception as exc:  # noqa: BLE001 - any unreadable state is a problem to report, not a crash
            problems.append(f"{root}: Address Memory state {manifest.address_dir} is unreadable: {exc}")
    return problems


def verify_shards(root: Path, manifest: Manifest) -> None:
    problems = shard_problems(root, manifest)
    if problems:
        raise BankError(problems[0] + (f" (and {len(problems) - 1} more problem(s): `skillbank info --verify`)"
                                       if len(problems) > 1 else ""))
