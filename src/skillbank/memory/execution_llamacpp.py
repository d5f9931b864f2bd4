"""The Execution Memory's plans on llama.cpp: the same shards, decoded by the embedded base's GGUF in llama.cpp.

The bank's format of record stays the PEFT directory of each shard. This engine converts a shard's adapter to
llama.cpp's LoRA GGUF the first time a plan needs it (:func:`skillbank.model.llamacpp.convert_lora`) and keeps
the result under ``<cache root>/llamacpp/lora/<key>.gguf``, the key a hash of the shard's recorded adapter file
digests, the base digest and the converter version - so a relearned shard, another base or a newer converter never reads a stale
file, and a partial file never exists under that name (written aside, then renamed). A cached file llama.cpp
cannot load is converted again once.

It answers :meth:`generate` and :meth:`check_lengths` like :class:`~skillbank.memory.execution.ExecutionMemory`,
so the planner does not know which engine it has. Requests are grouped by shard (llama.cpp applies one set of
adapters per forward pass), each decoded under its shard's grammar: a group's rows advance together, a lone
request reuses the KV cache of the prompt head it shares with the shard's previous one. A shard whose adapter llama.cpp cannot apply exactly (a DoRA, a
LoRA bias, a module it does not map) is served by the reference engine, with a warning naming the shard.

It applies only to banks on the embedded base: other bases have no GGUF here (``SkillBank.open`` picks the
reference engine for them).
"""
from __future__ import annotations

import sys
import time
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from cachetools import LRUCache

from skillbank.cache import cache_root
from skillbank.errors import BankError, ModelError
from skillbank.memory.execution import ShardOutput, check_prompt_lengths, grammars_kept, kept_grammar
from skillbank.memory.shard_files import shard_file_problems
from skillbank.model.embedded import EMBEDDED, embedded_gguf_path, embedded_identity, embedded_tokenizer_dir
from skillbank.model.generate import DEFAULT_MAX_NEW_TOKENS, GenerationStats
from skillbank.model.llamacpp import LlamaCppDecoder, UnsupportedAdapter, adapter_key, available, \
    convert_lora
from skillbank.model.prompts import prompt_ids, stop_token_ids
from skillbank.model.serialization import decode_output

ENGINES = ("auto", "llama.cpp", "torch")


class EngineUnavailable(BankError):
    """The llama.cpp engine cannot serve this bank here (the reason says why)."""


def llamacpp_problem(manifest) -> str | None:
    """Why the llama.cpp engine cannot serve a bank with this manifest on this machine (None: it can)."""
    if manifest.base.get("name") != EMBEDDED:
        return f"the bank's base is {manifest.base.get('name')!r}, not the embedded GGUF model"
    missing = available()
    if missing:
        return missing
    identity = embedded_identity()
    if identity is None:
        return "the embedded model has not been converted on this machine yet (the reference engine does it once)"
    if identity.get("digest") != manifest.base.get("digest"):
        return (f"the bank was built on base digest {manifest.base.get('digest', '')[:19]}..., the embedded model "
                f"here is {identity.get('digest', '')[:19]}...")
    return None


class LlamaCppExecution:
    """Plans of a bank's shards on llama.cpp (see the module docstring).

    ``manifest_of`` returns the bank's current manifest (shards learned or forgotten in this process are seen);
    ``reference`` returns the reference Execution Memory, loaded only if a shard needs it."""

    def __init__(self, root: Path, manifest_of: Callable[[], object], *, reference: Callable[[], object],
                 threads: int | None = None, max_resident: int | None = None):
        from skillbank.model.constrain import GrammarCache
        from skillbank.model.light_tokenizer import LightTokenizer
        from skillbank.model.threads import default_threads

        manifest = manifest_of()
        problem = llamacpp_problem(manifest)
        if problem:
            raise EngineUnavailable(f"the llama.cpp engine cannot serve {root}: {problem}")
        self.root, self.manifest_of, self._reference = Path(root), manifest_of, reference
        self.base_digest = manifest.base["digest"]
        self.threads = threads or default_threads()
        self.tokenizer = LightTokenizer(embedded_tokenizer_dir())
        self.decoder = LlamaCppDecoder(embedded_gguf_path(), threads=self.threads, n_ctx=8192, width=16)
        self.shape = self.decoder.shape()
        self.stops = set(stop_token_ids(self.tokenizer))
        self.grammars_compiled = GrammarCache(self.tokenizer, self.stops, self.decoder.n_vocab)
        self.max_resident = max_resident
        self.loaded: OrderedDict[str, str] = OrderedDict()  # shard -> key of its loaded adapter, LRU first
        self.reference_shards: dict[str, str] = {}  # shard -> why the reference engine serves it
        self._grammars: LRUCache = LRUCache(grammars_kept(max_resident))
        self._bitmask = np.full((1, (self.decoder.n_vocab + 31) // 32), -1, dtype=np.int32)
        self.stats = GenerationStats()
        self.conversions = 0

    # -- shards ------------------------------------------------------------------------------
    def _entries(self) -> dict:
        return {s.name: s for s in self.manifest_of().shards}

    @staticmethod
    def adapter_cache() -> Path:
        return cache_root() / "llamacpp" / "lora"

    def _ensure(self, name: str, entry) -> bool:
        """Load shard ``name``'s converted adapter (converting it first if needed); False when the reference
        engine must serve it."""
        if name in self.reference_shards:
            return False
        directory, digests = self.root / entry.dir, getattr(entry, "digests", None) or {}
        try:
            key = adapter_key(digests, self.base_digest)
        except ModelError as exc:  # a bank made before shards had digests: nothing to key a conversion by
            return self._by_reference(name, f"{exc}; no converted adapter can be checked against it")
        if self.loaded.get(name) == key:
            self.loaded.move_to_end(name)
            return True
        # Checked as the shard loads (as the reference engine does): files changed after the bank was opened
        # fail here, naming the shard.
        problems = shard_file_problems(name, directory, digests)
        if problems:
            raise BankError(problems[0] + " (checked as the shard was loaded)")
        path = self.adapter_cache() / f"{key}.gguf"
        try:
            for attempt in (0, 1):
                if attempt or not path.is_file():
                    convert_lora(directory, path, self.shape)
                    self.conversions += 1
                try:
                    self.decoder.load_adapter(name, path)
                    break
                except ModelError:
                    if attempt:
                        raise
                    path.unlink(missing_ok=True)  # a stale or damaged cached conversion: made again, once
        except UnsupportedAdapter as exc:
            return self._by_reference(name, str(exc))
        except ModelError as exc:
            raise BankError(f"shard {name!r}: its llama.cpp adapter does not load ({exc})") from exc
        self.loaded[name] = key
        self.loaded.move_to_end(name)
        while self.max_resident is not None and len(self.loaded) > self.max_resident:
            victim, _ = self.loaded.popitem(last=False)
            self.decoder.drop_adapter(victim)
        return True

    def _by_reference(self, name: str, why: str) -> bool:
        """From now on the reference engine plans shard ``name`` (said once, with why); False for ``_ensure``."""
        self.reference_shards[name] = why
        print(f"skillbank: warning: shard {name!r} is planned with the reference engine: {why}", file=sys.stderr)
        return False

    def _forget_removed(self, entries: dict) -> None:
        for name in [n for n in self.loaded if n not in entries]:
            self.decoder.drop_adapter(name)
            del self.loaded[name]
        for key in [k for k in self._grammars if k[0] not in entries]:
            del self._grammars[key]

    def grammar(self, name: str, entry, copy_from: str | None = None):
        return kept_grammar(self._grammars, (name, entry.dir), entry, self.root / entry.dir / "skills.json", copy_from)

    # -- read --------------------------------------------------------------------------------
    def context_limit(self) -> int:
        return self.decoder.n_ctx

    def check_lengths(self, requests: Sequence[str], max_new_tokens: int | None = None,
                      system_prompt: str | None = None) -> None:
        """Refuse a request whose prompt plus the generation budget exceeds the context."""
        check_prompt_lengths(self.tokenizer, self.context_limit(), self.manifest_of().shards, requests,
                             max_new_tokens, system_prompt)

    def generate(self, requests: Sequence[str], shards: Sequence[str], *, batch_size: int = 8,
                 max_new_tokens: int | None = None, progress: bool = False, constrain: bool = True,
                 copy_values: bool = False) -> list[ShardOutput]:
        """Generate request ``i`` with shard ``shards[i]``; outputs in input order. Requests are grouped by shard
        (llama.cpp applies one set of adapters per forward pass); a group decodes up to ``batch_size`` rows per
        pass (:meth:`~skillbank.model.llamacpp.LlamaCppDecoder.decode_many`), a lone request alone, reusing the
        cached prompt head of the shard's previous request."""
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
        t0, tokens, done = time.perf_counter(), 0, 0
        for name, idx in groups.items():
            entry = entries[name]
            if not self._ensure(name, entry):
                by_reference += idx
                continue
            matchers = [None] * len(idx)
            if constrain:
                matchers = [self.grammars_compiled.matcher(self.grammar(name, entry, requests[i] if copy_values else None))
                            for i in idx]
            prompts = [prompt_ids(self.tokenizer, requests[i], entry.system_prompt) for i in idx]
            if len(idx) == 1 or batch_size == 1:
                steps = [self.decoder.decode(p, name, cap, self.stops, m, self._bitmask) for p, m in zip(prompts, matchers)]
            else:
                steps = self.decoder.decode_many(prompts, name, cap, self.stops, matchers, self._bitmask,
                                                 width=batch_size)
            for i, step in zip(idx, steps):
                body = step.tokens[:-1] if step.stopped else step.tokens
                text = self.tokenizer.decode(body, skip_special_tokens=True).strip()
                parsed = decode_output(text, entry.target_format, entry.family_prefix, stopped=step.stopped,
                                       reason=step.reason)
                n = len(step.tokens)
                results[i] = ShardOutput(name, text, parsed, n, step.logprob / max(1, n), step.stopped, constrain)
                tokens += n
            done += len(idx)
            if progress:
                elapsed = time.perf_counter() - t0
                print(f"\rgenerate {done}/{len(requests)}  {tokens / elapsed:.1f} tok/s  {elapsed:.0f}s elapsed",
                      end="", file=sys.stderr, flush=True)
        if progress:
            print(file=sys.stderr)
        self.stats.prompts += len(requests) - len(by_reference)
        self.stats.generated_tokens += tokens
        self.stats.seconds += time.perf_counter() - t0
        if by_reference:
            outs = self._reference().generate([requests[i] for i in by_reference], [shards[i] for i in by_reference],
                                              batch_size=batch_size, max_new_tokens=cap, progress=progress,
                                              constrain=constrain, copy_values=copy_values)
            for i, o in zip(by_reference, outs):
                results[i] = o
        return results  # type: ignore[return-value]


__all__ = ["ENGINES", "EngineUnavailable", "LlamaCppExecution", "llamacpp_problem"]
