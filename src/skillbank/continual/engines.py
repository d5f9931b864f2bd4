"""Which engine writes the harness's outputs: torch (the reference decoder) or llama.cpp (what a bank plans with).

Every method hands the runner its state's model (``Method.model_for``); the engine generates the held-out
requests' outputs from it. :class:`TorchOutputs` decodes with that model itself. :class:`LlamaCppOutputs` reads the
update the model computes with (every active LoRA adapter, summed: ``model.llamacpp.peft_updates``), patches it
into the embedded base re-encoded for llama.cpp (the merge a bank's shard gets, ~0.6 s) and decodes with
llama.cpp under the same grammar - the product's path, so an evaluation measures what a user's plans are, at the
product's speed. Its outputs can differ from the reference path's where a near-tie is rounded the other way
(``bench/engine_parity.py`` measures it on a bank), so the engine is part of a run's identity and of every cached
output's key.

``[eval] engine = "auto"`` takes llama.cpp where it can run the base (the embedded GGUF model, llama-cpp-python
installed) and torch elsewhere (another base, e.g. the paper's Qwen3-8B); the choice is resolved when the run is
configured and saved with it (``RunConfig.eval_engine``), so a run is never resumed on the other engine.
"""
from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from skillbank.config import ConfigError


class TorchOutputs:
    """The reference decoder: the method's model generates (``skillbank.model.generate``)."""

    name = "torch"
    key = ""  # outputs cached before engines existed were all torch's: their keys stay valid

    def generate(self, model, tokenizer, prompts: Sequence[str], *, grammars: Sequence, batch_size: int,
                 max_new_tokens: int, progress: bool = False) -> list:
        from skillbank.model.generate import generate

        return generate(model, tokenizer, prompts, batch_size=batch_size, max_new_tokens=max_new_tokens,
                        progress=progress, grammars=grammars)

    def close(self) -> None:
        pass


class LlamaCppOutputs:
    """A state's outputs from llama.cpp: the model's LoRA update merged into the embedded base (in a scratch
    folder, deleted once loaded: llama.cpp maps the file), the prompts decoded greedily ``batch_size`` rows at a
    time, each row under its grammar. ``base_identity``: the run's loaded base (``LoadedBase.identity``), which
    must be the embedded model llama.cpp runs here (the same digest), else :class:`ConfigError`."""

    name = "llama.cpp"

    def __init__(self, base_identity: dict, threads: int | None = None, encoding: str = "auto"):
        import numpy as np

        from skillbank.model.constrain import GrammarCache
        from skillbank.memory.execution_llamacpp import embedded_digest_problem
        from skillbank.model.embedded import embedded_gguf_path, embedded_tokenizer_dir
        from skillbank.model.light_tokenizer import LightTokenizer
        from skillbank.model.llamacpp import CONVERTER_VERSION, ENCODINGS, base_problem, encoding_for, read_shape
        from skillbank.model.prompts import stop_token_ids

        problem = (base_problem(base_identity.get("name", "?"))
                   or embedded_digest_problem(base_identity.get("digest"), "the run"))
        if problem:
            raise ConfigError(f"[eval] engine = \"llama.cpp\" cannot be used: {problem}")
        if threads is None:
            import torch  # the run's base is loaded: torch is imported, its thread count set by [base] threads
            threads = torch.get_num_threads()
        # The harness decodes its prompts in batches: merged in the batched encoding (model.llamacpp.encoding_for)
        # unless the run recorded another ([eval] llamacpp_encoding). Part of the outputs' cache key, but for Q8_0,
        # which keeps the key of the runs before BF16 was an option.
        self.encoding = encoding_for(16, threads) if encoding == "auto" else encoding
        if self.encoding not in ENCODINGS:
            raise ConfigError(f"llama.cpp encoding {encoding!r}: expected auto or one of {list(ENCODINGS)}")
        self.key = f"engine:llama.cpp-v{CONVERTER_VERSION}" + ("" if self.encoding == "q8_0" else f"-{self.encoding}")
        self.base_digest = base_identity["digest"]
        self.threads = threads
        self.gguf = embedded_gguf_path()
        self.shape, self.n_vocab = read_shape(self.gguf)
        self.tokenizer = LightTokenizer(embedded_tokenizer_dir())
        self.stops = set(stop_token_ids(self.tokenizer))
        self.grammars = GrammarCache(self.tokenizer, self.stops, self.n_vocab)
        self.bitmask = np.full((1, (self.n_vocab + 31) // 32), -1, dtype=np.int32)
        self.scratch = Path(tempfile.mkdtemp(prefix="skillbank-eval-"))
        self.merge_seconds = 0.0
        self.merges = 0
        self._loaded: tuple[str, object] | None = None  # (update digest, its decoder)
        self._width = 0

    def _decoder(self, model, width: int):
        """The decoder of the update ``model`` computes with, merged now unless it is the one loaded."""
        from skillbank.memory.execution_llamacpp import CONTEXT_TOKENS, reencoded_base
        from skillbank.model.llamacpp import LlamaCppDecoder, merge_updates, peft_updates, updates_digest

        updates = peft_updates(model, self.shape)
        digest = updates_digest(updates) if updates else "bare"
        if self._loaded is not None and self._loaded[0] == digest and self._width >= width:
            return self._loaded[1]
        self.close_decoder()
        t0 = time.perf_counter()
        base, _ = reencoded_base(self.base_digest, self.gguf, self.encoding)  # once per machine, shared with banks
        path = base
        if updates:
            path = merge_updates(updates, self.gguf, self.scratch / f"{digest}.gguf", self.shape, self.encoding,
                                 reencoded=base, note="an evaluated state")
            self.merges += 1
        decoder = LlamaCppDecoder(path, threads=self.threads, n_ctx=CONTEXT_TOKENS, width=width)
        if path != base:
            path.unlink()  # mapped by llama.cpp; nothing is left behind
        self.merge_seconds += time.perf_counter() - t0
        self._loaded, self._width = (digest, decoder), width
        return decoder

    def generate(self, model, tokenizer, prompts: Sequence[str], *, grammars: Sequence, batch_size: int,
                 max_new_tokens: int, progress: bool = False) -> list:
        """Like :class:`TorchOutputs`: one :class:`~skillbank.model.generate.Generation` per prompt, in order.
        ``tokenizer`` (the torch model's) is not used: the embedded tokenizer encodes the same ids."""
        from skillbank.model.generate import Generation, report_progress
        from skillbank.model.prompts import encode_text

        if not prompts:
            return []
        decoder = self._decoder(model, batch_size)
        ids = [encode_text(self.tokenizer, p) for p in prompts]
        matchers = [self.grammars.matcher(g) if g is not None else None for g in grammars]
        t0, done = time.perf_counter(), [0, 0]

        def tell(index, step) -> None:
            done[0] += 1
            done[1] += len(step.tokens)
            report_progress(done[0], len(prompts), done[1], t0)

        steps = decoder.decode_many(ids, None, max_new_tokens, self.stops, matchers, self.bitmask, width=batch_size,
                                    on_done=tell if progress else None)
        if progress:
            print(file=sys.stderr)
        return [Generation(step.text(self.tokenizer), len(step.tokens), step.mean_logprob, step.stopped, step.reason)
                for step in steps]

    def close_decoder(self) -> None:
        if self._loaded is not None:
            self._loaded[1].close()
            self._loaded = None

    def close(self) -> None:
        self.close_decoder()
        shutil.rmtree(self.scratch, ignore_errors=True)


def outputs_engine(name: str, base_identity: dict, encoding: str = "auto"):
    """The engine that writes a run's outputs, by its resolved name ("torch" or "llama.cpp"); ``encoding``: the
    llama.cpp engine's merged models (``[eval] llamacpp_encoding``)."""
    return LlamaCppOutputs(base_identity, encoding=encoding) if name == "llama.cpp" else TorchOutputs()
