"""The Execution Memory's plans on llama.cpp: the same shards, decoded by the embedded base's GGUF in llama.cpp.

The bank's format of record stays the PEFT directory of each shard. The first time a plan needs a shard on a
machine, this engine writes the base GGUF with the shard's update merged into its weights
(:func:`skillbank.model.llamacpp.merge_lora`; ~0.5 s once the base is re-encoded) under
``<cache root>/llamacpp/merged/<key>-<encoding>.gguf``, and plans with it as its own llama.cpp model. The encoding
follows the rows a pass decodes, as timed on this machine (:func:`~skillbank.model.llamacpp.encoding_for`): every
matrix Q8_0 (~145 MB for the embedded base) or BF16 (~270 MB; on CPUs with BF16 dot products its kernels batched
~1.4-1.7x faster, on AVX2 ones slower); a shard planned both ways is loaded twice. A merged model decodes
at about the bare base's speed, where llama.cpp's runtime LoRA adds two products per adapted weight and token
(16-24% of a decode step here: ``scripts/llamacpp_lora_overhead.py``). The key hashes the shard's recorded adapter file digests, the base digest and the
converter version - so a relearned shard, another base or a newer converter never reads a stale file, and a
partial file never exists under that name (written aside, then renamed). A cached file llama.cpp cannot load is
made again once. The cache keeps the most recently used merged models within a disk budget
(``$SKILLBANK_MERGED_CACHE_MB``, default 4096: ten shards in both encodings; the oldest are deleted and made again when needed), and at most
``MERGED_RESIDENT`` of them stay loaded (``merged_resident``: the service keeps more). ``merge=False`` takes the runtime-LoRA route instead: one base model
(the shipped file re-encoded in Q8_0 once, ``<cache root>/llamacpp/base/``),
each shard's adapter converted to llama.cpp's LoRA GGUF (:func:`~skillbank.model.llamacpp.convert_lora`, ~15 MB,
``<cache root>/llamacpp/lora/<key>.gguf``) and switched per request.

It answers :meth:`generate` and :meth:`length_problems` like :class:`~skillbank.memory.execution.ExecutionMemory`,
so the planner does not know which engine it has. Requests are grouped by shard (llama.cpp applies one set of
adapters per forward pass), each decoded under its shard's grammar: a group's rows advance together, a lone
request reuses the KV cache of the prompt head it shares with the shard's previous one, and the groups of a
batch that spans several shards decode side by side, one lane per core (:meth:`LlamaCppExecution.lanes`). A
shard whose adapter llama.cpp cannot apply exactly (a DoRA, a LoRA bias, a module it does not map) is served by
the reference engine, with a warning naming the shard.

It applies only to banks on the embedded base: other bases have no GGUF here (``SkillBank.open`` picks the
reference engine for them).
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from cachetools import LRUCache

from skillbank.cache import cache_root
from skillbank.errors import BankError, ModelError
from skillbank.memory.execution import (ShardOutput, copies_values, grammars_kept, kept_grammar,
                                       prompt_length_problems)
from skillbank.memory.shard_files import shard_file_problems
from skillbank.model.embedded import EMBEDDED, embedded_gguf_path, embedded_identity, embedded_tokenizer_dir
from skillbank.model.generate import DEFAULT_MAX_NEW_TOKENS, GenerationStats, report_progress
from skillbank.model.llamacpp import CONVERTER_VERSION, DRAFT_FED, LlamaCppDecoder, UnsupportedAdapter, adapter_key, \
    available, convert_lora, encoding_for, gguf_spans, merge_lora, read_shape, reencode_base
from skillbank.model.prompts import prompt_ids, stop_token_ids
from skillbank.model.serialization import decode_output

ENGINES = ("auto", "llama.cpp", "torch")
log = logging.getLogger("skillbank")
MERGED_RESIDENT = 6  # merged models kept loaded (~350-480 MB each: 145-270 MB of weights, an 8,192-token KV cache)
CONTEXT_TOKENS = 8192  # the embedded base's training context: 16 batched rows of a few hundred tokens each


class EngineUnavailable(BankError):
    """The llama.cpp engine cannot serve this bank here (the reason says why)."""


def llamacpp_problem(manifest) -> str | None:
    """Why the llama.cpp engine cannot serve a bank with this manifest on this machine (None: it can)."""
    if manifest.base.get("name") != EMBEDDED:
        return f"the bank's base is {manifest.base.get('name')!r}, not the embedded GGUF model"
    missing = available()
    if missing:
        return missing
    return embedded_digest_problem(manifest.base.get("digest"), "the bank")


def embedded_digest_problem(digest: str | None, subject: str) -> str | None:
    """Why weights built on base ``digest`` (``subject``'s: "the bank", "the run") are not the embedded model
    llama.cpp runs here (None: they are)."""
    identity = embedded_identity()
    if identity is None:
        return "the embedded model has not been converted on this machine yet (the reference engine does it once)"
    if identity.get("digest") != digest:
        return (f"{subject} was built on base digest {str(digest or '')[:19]}..., the embedded model here is "
                f"{identity.get('digest', '')[:19]}...")
    return None


def pick_engine(choice: str, manifest, root, *, model_in_hand: bool) -> str:
    """Which engine generates a bank's plans: "llama.cpp" or "torch", for ``choice`` ("auto", "llama.cpp" or
    "torch"). "auto" takes llama.cpp where it can serve the bank, unless a model is in hand (then that model
    plans); an explicit "llama.cpp" that cannot serve the bank is :class:`EngineUnavailable`, naming why.
    ``SkillBank.engine`` and ``skillbank serve`` both decide by it."""
    if choice == "torch" or (choice == "auto" and model_in_hand):
        return "torch"
    problem = llamacpp_problem(manifest)
    if problem is None:
        return "llama.cpp"
    if choice == "llama.cpp":
        raise EngineUnavailable(f"the llama.cpp engine cannot serve {root}: {problem}")
    log.info("%s: the torch engine generates: %s", root, problem)
    return "torch"


class LlamaCppExecution:
    """Plans of a bank's shards on llama.cpp (see the module docstring).

    ``manifest_of`` returns the bank's current manifest (shards learned or forgotten in this process are seen);
    ``reference`` returns the reference Execution Memory, loaded only if a shard needs it."""

    def __init__(self, root: Path, manifest_of: Callable[[], object], *, reference: Callable[[], object],
                 threads: int | None = None, max_resident: int | None = None, merge: bool = True,
                 merged_resident: int = MERGED_RESIDENT):
        from skillbank.model.constrain import GrammarCache
        from skillbank.model.light_tokenizer import LightTokenizer
        from skillbank.model.encoding_choice import forced_encoding
        from skillbank.model.threads import default_threads

        manifest = manifest_of()
        problem = llamacpp_problem(manifest)
        if problem:
            raise EngineUnavailable(f"the llama.cpp engine cannot serve {root}: {problem}")
        self.root, self.manifest_of, self._reference = Path(root), manifest_of, reference
        self.base_digest = manifest.base["digest"]
        self.tokenizer = LightTokenizer(embedded_tokenizer_dir())
        self.gguf = embedded_gguf_path()
        self.shape, self.n_vocab = read_shape(self.gguf)
        self.merge = merge
        self.threads = threads or default_threads()
        forced_encoding()  # a bad $SKILLBANK_LLAMACPP_ENCODING fails the open, not a plan
        self._base: LlamaCppDecoder | None = None  # the base with runtime adapters (merge=False)
        self.stops = set(stop_token_ids(self.tokenizer))
        self.grammars_compiled = GrammarCache(self.tokenizer, self.stops, self.n_vocab)
        self.max_resident = max_resident
        self.merged_resident = merged_resident  # a service with many hot shards keeps more loaded
        # (shard, encoding) -> the file stem of what serves it, least recently used first. A shard may be loaded
        # twice where this machine's timing chose another encoding for batches (model.llamacpp.encoding_for).
        self.loaded: OrderedDict[tuple[str, str], str] = OrderedDict()
        self.merged: dict[tuple[str, str], LlamaCppDecoder] = {}  # its loaded merged models (merge=True)
        self.reference_shards: dict[str, str] = {}  # shard -> why the reference engine serves it
        self._grammars: LRUCache = LRUCache(grammars_kept(max_resident))
        self._bitmask = np.full((1, (self.n_vocab + 31) // 32), -1, dtype=np.int32)
        self.stats = GenerationStats()
        self.conversions = 0
        self.draft_fed = DRAFT_FED  # tokens a pass may feed with grammar drafts (1: none; LlamaCppDecoder._draft)
        self._lock = threading.RLock()  # lanes load and unload shards one at a time
        self._in_use: Counter[tuple[str, str]] = Counter()  # (shard, encoding) -> lanes decoding with it now

    # -- shards ------------------------------------------------------------------------------
    def _entries(self) -> dict:
        return {s.name: s for s in self.manifest_of().shards}

    @staticmethod
    def adapter_cache() -> Path:
        return cache_root() / "llamacpp" / "lora"

    @staticmethod
    def merged_cache() -> Path:
        return cache_root() / "llamacpp" / "merged"

    @staticmethod
    def base_cache() -> Path:
        return cache_root() / "llamacpp" / "base"

    @property
    def base(self) -> LlamaCppDecoder:
        """The model the runtime-adapter route (``merge=False``) applies each shard's adapter to: the shipped GGUF
        re-encoded as one-row merged models are (every matrix Q8_0, which llama.cpp batches with tiled kernels),
        made once per machine and base under :meth:`base_cache`, keyed by the base's digest and the converter
        version."""
        if self._base is None:
            self._base = self._cached(self.base_file(), lambda p: reencode_base(self.gguf, p),
                                      lambda p: LlamaCppDecoder(p, threads=self.threads, n_ctx=CONTEXT_TOKENS,
                                                                width=16))
        return self._base

    def base_file(self, make: bool = False, encoding: str = "q8_0") -> Path:
        """Where the base re-encoded as ``encoding`` lies (:attr:`base`); with ``make``, made first where it is
        missing or is not a whole GGUF. A shard's merged model is this file with its adapted tensors patched in
        (``merge_lora``'s ``reencoded``): ~0.5 s a new shard instead of ~4."""
        if not make:
            return reencoded_base_path(self.base_digest, encoding)
        path, made = reencoded_base(self.base_digest, self.gguf, encoding)
        self.conversions += made
        return path

    def encoding(self, rows: int) -> str:
        """The encoding of the model that decodes ``rows`` rows of a shard a pass (:func:`encoding_for`); the
        runtime-adapter route has one base model, Q8_0."""
        return encoding_for(rows, self.threads) if self.merge else "q8_0"

    def _stem(self, key: str, encoding: str) -> str:
        """The cached file's name (less ``.gguf``) of a shard whose adapter key is ``key``, in ``encoding``."""
        return f"{key}-{encoding}" if self.merge else key

    def _ensure(self, name: str, entry, encoding: str) -> tuple[LlamaCppDecoder, str | None] | None:
        """The decoder that plans shard ``name`` in ``encoding`` (:meth:`encoding`) and the adapter to apply
        (None: merged into its weights), making the shard's converted form first if needed; None when the
        reference engine must serve it."""
        if name in self.reference_shards:
            return None
        directory, digests = self.root / entry.dir, getattr(entry, "digests", None) or {}
        try:
            key = adapter_key(digests, self.base_digest)
        except ModelError as exc:  # a bank made before shards had digests: nothing to key a conversion by
            return self._by_reference(name, f"{exc}; no converted adapter can be checked against it")
        slot, stem = (name, encoding), self._stem(key, encoding)
        if self.loaded.get(slot) == stem:
            self.loaded.move_to_end(slot)
            return (self.merged[slot], None) if self.merge else (self.base, name)
        for old in [s for s, loaded in self.loaded.items() if s[0] == name and loaded != self._stem(key, s[1])]:
            self._drop(old)  # an older version of the shard (relearned in this process)
        # Checked as the shard loads (as the reference engine does): files changed after the bank was opened
        # fail here, naming the shard.
        problems = shard_file_problems(name, directory, digests)
        if problems:
            raise BankError(problems[0] + " (checked as the shard was loaded)")
        try:
            if self.merge:
                path = self.merged_cache() / f"{stem}.gguf"
                decoder = self._cached(path, lambda p: merge_lora(directory, self.gguf, p, self.shape, encoding,
                                                                  reencoded=self.base_file(True, encoding)),
                                       lambda p: LlamaCppDecoder(p, threads=self.threads, n_ctx=CONTEXT_TOKENS,
                                                                 width=16))
                self.merged[slot] = decoder
                _trim_cache(self.merged_cache(), _cache_budget(), keep=path)
            else:
                self._cached(self.adapter_cache() / f"{key}.gguf", lambda p: convert_lora(directory, p, self.shape),
                             lambda p: self.base.load_adapter(name, p))
        except UnsupportedAdapter as exc:
            return self._by_reference(name, str(exc))
        except ModelError as exc:
            raise BankError(f"shard {name!r}: its llama.cpp form does not load ({exc})") from exc
        self.loaded[slot] = stem
        self._trim_loaded()
        return (self.merged[slot], None) if self.merge else (self.base, name)

    def _trim_loaded(self) -> None:
        """Unload the least recently used shards beyond the resident limit, never one a lane is decoding with
        (the limit is then exceeded until that lane is done: :meth:`_release` trims again)."""
        limit = self.max_resident
        if self.merge:  # a loaded merged model is a whole model and its cache, not an adapter's few MB
            limit = self.merged_resident if limit is None else min(limit, self.merged_resident)
        while limit is not None and len(self.loaded) > limit:
            newest = next(reversed(self.loaded))
            victim = next((n for n in self.loaded if n != newest and not self._in_use[n]), None)
            if victim is None:
                break
            self._drop(victim)

    # -- lanes: several shards' groups decoded side by side ----------------------------------------------
    def lanes(self, groups: int) -> int:
        """How many shard groups decode side by side: one per thread, at most one per group. llama.cpp spreads a
        forward pass of this small model over two threads poorly (two one-thread decoders side by side fed 174 /
        192 / 261 / 291 tokens/s at 1 / 4 / 8 / 16 rows against 115 / 171 / 215 / 245 for one two-thread decoder,
        Q8_0 merged models; BF16 ones 152 / 339 / 387 / 500 against 111 / 267 / 346 / 427,
        ``bench/llamacpp_batches.py``), so the groups of a mixed batch run one per core. One
        decoder with runtime adapters (``merge=False``) is one lane. ``$SKILLBANK_LANES`` caps the count (1: one
        group after another)."""
        if not self.merge or groups < 2:
            return 1
        cap = os.environ.get("SKILLBANK_LANES", "").strip()
        try:
            most = int(cap) if cap else self.threads
        except ValueError:
            raise BankError(f"SKILLBANK_LANES={cap!r} is not a whole number") from None
        return max(1, min(groups, self.threads, most))

    def _acquire(self, name: str, entry, threads: Callable[[], int] | None, encoding: str):
        """:meth:`_ensure` for a lane: the decoder stays loaded until :meth:`_release`, computing with
        ``threads()`` threads (None: all of the engine's)."""
        with self._lock:
            serving = self._ensure(name, entry, encoding)
            if serving is not None:
                self._in_use[(name, encoding)] += 1
                decoder = serving[0]
                decoder.draft_fed = self.draft_fed
                decoder.threads_now = threads
                decoder.set_threads(threads() if threads is not None else self.threads)
            return serving

    def _release(self, name: str, decoder: LlamaCppDecoder, encoding: str) -> None:
        with self._lock:
            decoder.threads_now = None
            decoder.set_threads(self.threads)  # a lone plan after the lanes computes with every thread
            slot = (name, encoding)
            self._in_use[slot] -= 1
            if self._in_use[slot] <= 0:
                del self._in_use[slot]
            self._trim_loaded()

    def _parallel(self, order: list[tuple[str, list[int]]], lanes: int, run: Callable) -> None:
        """Decode ``order``'s shard groups on ``lanes`` threads, each taking the next group when done. The
        engine's threads are shared among the lanes still decoding, re-read before every forward pass, so the
        last lane computes with all of them."""
        pending, errors, active = list(order), [], [lanes]
        lock = threading.Lock()

        def share(lane: int) -> int:
            n = max(1, active[0])
            return self.threads // n + (1 if lane < self.threads % n else 0)

        def lane_loop(lane: int) -> None:
            bitmask = np.full_like(self._bitmask, -1)  # each lane fills its own grammar mask
            try:
                while True:
                    with lock:
                        if not pending or errors:
                            return
                        name, idx = pending.pop(0)
                    run(name, idx, bitmask, lambda: share(lane))
            except BaseException as exc:  # raised again in the calling thread
                errors.append(exc)
            finally:
                with lock:
                    active[0] -= 1

        workers = [threading.Thread(target=lane_loop, args=(k,), name=f"skillbank-lane-{k}", daemon=True)
                   for k in range(lanes)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        if errors:
            raise errors[0]

    def decoder_for(self, name: str, rows: int = 1) -> tuple[LlamaCppDecoder, str | None] | None:
        """What decodes shard ``name`` ``rows`` rows a pass now: (its decoder, the adapter to apply or None when
        merged); None when the reference engine serves it (:attr:`reference_shards` says why). Loads it first if
        needed; a shard whose files changed since they were recorded raises :class:`~skillbank.errors.BankError`
        naming it."""
        entries = self._entries()
        if name not in entries:
            raise BankError(f"unknown shard {name!r}; this bank has {sorted(entries)}")
        self._forget_removed(entries)
        return self._ensure(name, entries[name], self.encoding(rows))

    def reference(self):
        """The reference Execution Memory (torch), loaded now if it was not: what serves :attr:`reference_shards`."""
        return self._reference()

    def step_output(self, name: str, entry, step, constrained: bool) -> ShardOutput:
        """A decoded :class:`~skillbank.model.llamacpp.Step` as the planner reads it: text without the stop
        token, parsed in the shard's target format."""
        text = step.text(self.tokenizer)
        parsed = decode_output(text, entry.target_format, entry.family_prefix, stopped=step.stopped, reason=step.reason)
        return ShardOutput(name, text, parsed, len(step.tokens), step.mean_logprob, step.stopped, constrained)

    def _cached(self, path: Path, make: Callable[[Path], object], load: Callable[[Path], object]):
        """:func:`cached_file`, counting the conversions it makes."""
        loaded, made = cached_file(path, make, load)
        self.conversions += made
        return loaded

    def _drop(self, slot: tuple[str, str]) -> None:
        """Unload what serves (shard, encoding) ``slot`` (its merged model or the shard's runtime adapter)."""
        if self.loaded.pop(slot, None) is None:
            return
        decoder = self.merged.pop(slot, None)
        if decoder is not None:
            decoder.close()
        elif self._base is not None:
            self._base.drop_adapter(slot[0])

    def _by_reference(self, name: str, why: str) -> None:
        """From now on the reference engine plans shard ``name`` (said once, with why); None for ``_ensure``."""
        self.reference_shards[name] = why
        print(f"skillbank: warning: shard {name!r} is planned with the reference engine: {why}", file=sys.stderr)
        return None

    def _forget_removed(self, entries: dict) -> None:
        for slot in [s for s in self.loaded if s[0] not in entries]:
            self._drop(slot)
        for key in [k for k in self._grammars if k[0] not in entries]:
            del self._grammars[key]

    def grammar(self, name: str, entry, copy_from: str | None = None):
        return kept_grammar(self._grammars, (name, entry.dir), entry, self.root / entry.dir / "skills.json", copy_from)

    # -- read --------------------------------------------------------------------------------
    def context_limit(self) -> int:
        return CONTEXT_TOKENS

    def length_problems(self, requests: Sequence[str], max_new_tokens: int | None = None,
                        system_prompt: str | None = None) -> list[str | None]:
        """Per request, why its prompt plus the generation budget does not fit the context (None: it fits)."""
        return prompt_length_problems(self.tokenizer, self.context_limit(), self.manifest_of().shards, requests,
                                      max_new_tokens, system_prompt)

    def generate(self, requests: Sequence[str], shards: Sequence[str], *, batch_size: int = 8,
                 max_new_tokens: int | None = None, progress: bool = False, constrain: bool = True,
                 copy_values: bool | None = None, priors: Sequence | None = None) -> list[ShardOutput]:
        """Generate request ``i`` with shard ``shards[i]``; outputs in input order (``priors`` as
        :meth:`ExecutionMemory.generate <skillbank.memory.execution.ExecutionMemory.generate>`). Requests are grouped by shard
        (llama.cpp applies one set of adapters per forward pass); a group decodes up to ``batch_size`` rows per
        pass (:meth:`~skillbank.model.llamacpp.LlamaCppDecoder.decode_many`), a lone request alone, reusing the
        cached prompt head of the shard's previous request; the groups decode side by side in :meth:`lanes`."""
        if len(requests) != len(shards):
            raise BankError(f"got {len(requests)} requests but {len(shards)} shard names")
        entries = self._entries()
        for name in shards:
            if name not in entries:
                raise BankError(f"unknown shard {name!r}; this bank has {sorted(entries)}")
        self._forget_removed(entries)
        cap = max_new_tokens or DEFAULT_MAX_NEW_TOKENS
        results: list[ShardOutput | None] = [None] * len(requests)
        groups: dict[str, list[int]] = {}
        for i, name in enumerate(shards):
            groups.setdefault(name, []).append(i)
        by_reference: list[int] = []
        t0, done = time.perf_counter(), [0, 0]  # requests, tokens
        report = threading.Lock()

        def run(name: str, idx: list[int], bitmask: np.ndarray, threads: Callable[[], int] | None = None) -> None:
            entry = entries[name]
            # rows a pass pick the encoding, resolved once for the group
            encoding = self.encoding(1 if batch_size == 1 else min(len(idx), batch_size))
            serving = self._acquire(name, entry, threads, encoding)
            if serving is None:
                with report:
                    by_reference.extend(idx)
                return
            decoder, adapter = serving
            try:
                matchers = [None] * len(idx)
                if constrain:
                    copy = copies_values(entry, copy_values)
                    with self._lock:  # the grammar caches are shared by the lanes
                        matchers = [self.grammars_compiled.matcher(
                            self.grammar(name, entry, requests[i] if copy else None),
                            prior=priors[i] if priors is not None else None) for i in idx]
                prompts = [prompt_ids(self.tokenizer, requests[i], entry.system_prompt) for i in idx]
                if len(idx) == 1 or batch_size == 1:
                    steps = [decoder.decode(p, adapter, cap, self.stops, m, bitmask) for p, m in zip(prompts, matchers)]
                else:
                    steps = decoder.decode_many(prompts, adapter, cap, self.stops, matchers, bitmask, width=batch_size)
            finally:
                self._release(name, decoder, encoding)
            with report:
                for i, step in zip(idx, steps):
                    results[i] = self.step_output(name, entry, step, constrain)
                    done[1] += results[i].n_tokens
                done[0] += len(idx)
                if progress:
                    report_progress(done[0], len(requests), done[1], t0)

        # The largest groups first: with lanes side by side, the last lane to finish then has the least left.
        order = sorted(groups.items(), key=lambda kv: -len(kv[1]))
        lanes = self.lanes(len(order))
        if lanes == 1:
            for name, idx in order:
                run(name, idx, self._bitmask)
        else:
            self._parallel(order, lanes, run)
        if progress:
            print(file=sys.stderr)
        self.stats.prompts += len(requests) - len(by_reference)
        self.stats.generated_tokens += done[1]
        self.stats.seconds += time.perf_counter() - t0
        if by_reference:
            outs = self.reference().generate([requests[i] for i in by_reference], [shards[i] for i in by_reference],
                                              batch_size=batch_size, max_new_tokens=cap, progress=progress,
                                              constrain=constrain, copy_values=copy_values,
                                              priors=[priors[i] for i in by_reference] if priors is not None else None)
            for i, o in zip(by_reference, outs):
                results[i] = o
        return results  # type: ignore[return-value]


def cached_file(path: Path, make: Callable[[Path], object], load: Callable[[Path], object]) -> tuple[object, int]:
    """``load(path)`` and how many times the file was made (0-2): made first when it is missing; a file that does
    not load (damaged, or written by another version) is made again, once."""
    made = 0
    for attempt in (0, 1):
        if attempt or not path.is_file():
            make(path)
            made += 1
        try:
            loaded = load(path)
        except ModelError:
            if attempt:
                raise
            path.unlink(missing_ok=True)
            continue
        os.utime(path)  # the cache's least recently used file is the first to go
        return loaded, made
    raise AssertionError("unreachable")  # pragma: no cover


def reencoded_base_path(base_digest: str, encoding: str = "q8_0") -> Path:
    """Where the embedded base re-encoded as merged models are (:func:`~skillbank.model.llamacpp.reencode_base`,
    ``encoding`` Q8_0 or BF16) lies on this machine: one file per base, encoding and converter version, shared by
    every bank and the harness."""
    return LlamaCppExecution.base_cache() / f"{base_digest[:32]}-v{CONVERTER_VERSION}-{encoding}.gguf"


def reencoded_base(base_digest: str, gguf: Path, encoding: str = "q8_0") -> tuple[Path, int]:
    """:func:`reencoded_base_path`, the file made from the shipped ``gguf`` first where it is missing or is not a
    whole GGUF; and how many times it was made (:func:`cached_file`)."""
    path = reencoded_base_path(base_digest, encoding)
    _, made = cached_file(path, lambda p: reencode_base(gguf, p, encoding), gguf_spans)
    return path, made


def _cache_budget() -> int:
    """Bytes the merged-model cache may hold ($SKILLBANK_MERGED_CACHE_MB, default 4096)."""
    raw = os.environ.get("SKILLBANK_MERGED_CACHE_MB", "4096")
    try:
        return int(float(raw) * 2**20)
    except ValueError:
        raise BankError(f"SKILLBANK_MERGED_CACHE_MB={raw!r} is not a number of megabytes") from None


def _trim_cache(directory: Path, budget: int, keep: Path) -> None:
    """Delete the least recently used files of ``directory`` until it holds at most ``budget`` bytes (``keep``,
    the file just made, stays whatever its size). A deleted file a process still has loaded stays readable to
    it (the mapping holds it); it is made again when next needed."""
    files = []
    for path in directory.glob("*.gguf"):
        try:
            st = path.stat()
        except FileNotFoundError:  # another process trimmed it
            continue
        files.append((st.st_mtime, st.st_size, path))
    total = sum(size for _, size, _ in files)
    for _, size, path in sorted(files):
        if total <= budget:
            break
        if path != keep:
            path.unlink(missing_ok=True)
            total -= size


__all__ = ["ENGINES", "EngineUnavailable", "LlamaCppExecution", "llamacpp_problem", "pick_engine"]
