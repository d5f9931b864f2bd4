"""Which encoding llama.cpp's merged models use at each batch width, chosen by timing them on this machine.

A merged model stores its matrices as Q8_0 or BF16 (:data:`~skillbank.model.llamacpp.ENCODINGS`). Which one
decodes faster depends on the CPU, not on a rule: with AVX512-BF16 dot products BF16 won batches 1.4-1.7x while
Q8_0 won one row; on an AVX2 CPU BF16 is converted to float32 in the inner loop and Q8_0 wins everywhere. So
the engine times each encoding once per machine: the shipped base re-encoded in each (a temporary copy), the
same synthetic rows decoded at widths 1, 2, 4 and 16 for a fixed number of forward passes, the encodings
alternated round by round so that a machine whose speed drifts slows them alike. A few seconds, once; the
result is cached in ``<cache root>/machine/llamacpp-encodings.json`` with the CPU's identity, llama.cpp's version and
the thread count, and remade when any of them changes.

If the timing fails (or is interrupted), the engine uses Q8_0 at every width and says so once.
``$SKILLBANK_LLAMACPP_ENCODING`` (``q8_0`` or ``bf16``) is honoured, with a warning where this CPU measured the
other one clearly faster (by :data:`CLEAR_WIN`). `skillbank doctor` shows the choice, its figures and why.
"""
from __future__ import annotations

import functools
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from skillbank.cache import cache_root, written_aside
from skillbank.errors import ModelError

ENV = "SKILLBANK_LLAMACPP_ENCODING"
WIDTHS = (1, 2, 4, 16)  # rows a forward pass decodes: one request, and the batches the engine forms
PASSES = 5  # timed forward passes per width, encoding and round
ROUNDS = 2
PROMPT_TOKENS = 16  # each row's prefilled context (a 135M model's pass costs about the same over 16 or 48 tokens)
# Another encoding replaces Q8_0 (half BF16's bytes: less memory, a smaller cache) only where it is clearly faster:
# two timings of the same encoding here differed by up to 8% at 16 rows.
CLEAR_WIN = 1.10
FORMAT = 1  # of the cache file: a change makes every machine measure again
_lock = threading.Lock()
_said: set[str] = set()  # warnings already given by this process
_memo: dict[int, "EncodingChoice"] = {}  # the choice per thread count, once read or measured by this process


@dataclass
class EncodingChoice:
    """The measured choice for one thread count: ``chosen`` maps each measured width to an encoding, and
    ``tokens_per_s`` holds each encoding's median tokens/s at each width (empty where the timing failed)."""

    threads: int
    chosen: dict[int, str]
    tokens_per_s: dict[str, dict[int, float]] = field(default_factory=dict)
    cpu: str = ""
    llama_cpp: str = ""
    measured_at: str = ""
    seconds: float = 0.0
    failed: str | None = None  # why the timing failed: then Q8_0 everywhere

    def for_rows(self, rows: int) -> str:
        """The encoding for a pass of ``rows`` rows: the choice at the largest measured width not above it."""
        widths = sorted(self.chosen)
        at = max((w for w in widths if w <= rows), default=widths[0])
        return self.chosen[at]

    def why(self) -> str:
        """One line per measured width: what won and by how much (or why the timing was not used)."""
        if self.failed:
            return f"Q8_0 at every width: timing the encodings failed ({self.failed})"
        lines = []
        for w in sorted(self.chosen):
            rates = {e: r[w] for e, r in self.tokens_per_s.items() if w in r}
            figures = ", ".join(f"{e} {rates[e]:.0f}" for e in sorted(rates))
            lines.append(f"{w:>2} row(s) a pass: {self.chosen[w]} ({figures} tokens/s)")
        return "\n".join(lines)

    def to_json(self) -> dict:
        d = asdict(self)
        d["chosen"] = {str(k): v for k, v in self.chosen.items()}
        d["tokens_per_s"] = {e: {str(k): v for k, v in r.items()} for e, r in self.tokens_per_s.items()}
        return d

    @classmethod
    def from_json(cls, d: dict) -> "EncodingChoice":
        d = dict(d)
        d["chosen"] = {int(k): v for k, v in d["chosen"].items()}
        d["tokens_per_s"] = {e: {int(k): float(v) for k, v in r.items()} for e, r in d.get("tokens_per_s", {}).items()}
        return cls(**d)


# x86 flags and ARM features that select llama.cpp's and torch's kernels (AVX-512 and AMX ones by prefix)
_KERNEL_FLAGS = {"avx", "avx2", "fma", "f16c", "avx_vnni", "asimd", "asimdhp", "asimddp", "fphp", "sve", "sve2", "i8mm",
                 "bf16", "sme", "sme2"}


def cpu_identity() -> str:
    """The CPU as the kernels see it: its model name and the SIMD extensions that decide llama.cpp's kernels
    (x86 flags or ARM features from /proc/cpuinfo; elsewhere platform's processor string)."""
    name, flags = platform.processor() or platform.machine(), ""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "Hardware", "CPU part") and not name.startswith(value.strip()):
            name = value.strip() if key == "model name" else f"{name} {key} {value.strip()}"
        if key in ("flags", "Features") and not flags:
            flags = " ".join(sorted(f for f in value.split() if f in _KERNEL_FLAGS or f.startswith(("avx512", "amx"))))
    return f"{name.strip()} [{platform.machine()}: {flags}]"


def llama_cpp_version() -> str:
    try:
        import llama_cpp

        return str(getattr(llama_cpp, "__version__", "?"))
    except ImportError:
        return "absent"


def cache_path() -> Path:
    """Where the choice is cached: beside the other facts measured of this machine, not among llama.cpp's model
    files (a cache of merged models may be cleared or budgeted; this file is a few hundred bytes)."""
    return cache_root() / "machine" / "llamacpp-encodings.json"


def _say_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        print(f"skillbank: {message}", file=sys.stderr)


# -- timing ----------------------------------------------------------------------------------------
def _time_widths(decoder, widths, passes: int) -> dict[int, float]:
    """Tokens/s of ``decoder`` at each width: rows with a prefilled prompt each, then ``passes`` timed passes of
    one token a row (every row's logits wanted, as in greedy decoding)."""
    rates = {}
    vocab = decoder.n_vocab
    for width in widths:
        decoder._clear()
        prompt = [(17 * k + 5) % vocab for k in range(PROMPT_TOKENS)]
        decoder._run([(t, pos, seq, False) for seq in range(width) for pos, t in enumerate(prompt)])
        pos = PROMPT_TOKENS
        decoder._run([((pos + seq) % vocab, pos, seq, True) for seq in range(width)])  # warm-up pass
        t0 = time.perf_counter()
        for step in range(1, passes + 1):
            decoder._run([((pos + step * 7 + seq) % vocab, pos + step, seq, True) for seq in range(width)])
        rates[width] = width * passes / (time.perf_counter() - t0)
    decoder._clear()
    return rates


def measure(gguf: Path, threads: int, *, widths=WIDTHS, passes: int = PASSES, rounds: int = ROUNDS,
            candidates: tuple[str, ...] | None = None, reencode: Callable[[Path, Path, str], Path] | None = None,
            ) -> EncodingChoice:
    """Time each candidate encoding of the base ``gguf`` at each width (see the module docstring)."""
    from skillbank.model.llamacpp import ENCODINGS, LlamaCppDecoder, reencode_base

    candidates = candidates or ENCODINGS
    reencode = reencode or reencode_base
    t0 = time.perf_counter()
    samples: dict[str, dict[int, list[float]]] = {e: {w: [] for w in widths} for e in candidates}
    n_ctx = max(widths) * (PROMPT_TOKENS + passes + 2) + 64
    with tempfile.TemporaryDirectory(prefix="skillbank-encodings-") as tmp:
        decoders = {e: LlamaCppDecoder(reencode(gguf, Path(tmp) / f"{e}.gguf", e), threads=threads, n_ctx=n_ctx,
                                       n_batch=max(512, max(widths) * PROMPT_TOKENS), width=max(widths))
                    for e in candidates}
        try:
            for r in range(rounds):
                order = candidates if r % 2 == 0 else candidates[::-1]
                for e in order:
                    for w, rate in _time_widths(decoders[e], widths, passes).items():
                        samples[e][w].append(rate)
        finally:
            for d in decoders.values():
                d.close()
    rates = {e: {w: round(statistics.median(v), 1) for w, v in by_w.items()} for e, by_w in samples.items()}
    chosen = {}
    for w in widths:
        best = max(candidates, key=lambda e: rates[e][w])
        keep_q8 = "q8_0" in rates and rates[best][w] < CLEAR_WIN * rates["q8_0"][w]
        chosen[w] = "q8_0" if keep_q8 else best
    return EncodingChoice(threads=threads, chosen=chosen, tokens_per_s=rates, cpu=cpu_identity(),
                          llama_cpp=llama_cpp_version(), measured_at=time.strftime("%Y-%m-%d %H:%M:%S"),
                          seconds=round(time.perf_counter() - t0, 1))


def _fallback(threads: int, why: str) -> EncodingChoice:
    return EncodingChoice(threads=threads, chosen={w: "q8_0" for w in WIDTHS}, cpu=cpu_identity(),
                          llama_cpp=llama_cpp_version(), measured_at=time.strftime("%Y-%m-%d %H:%M:%S"), failed=why)


# -- the cached choice -----------------------------------------------------------------------------
def _read_cache(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return {}
    if data.get("cpu") != cpu_identity() or data.get("llama_cpp") != llama_cpp_version():
        return {}  # measured on another CPU or llama.cpp: remade
    return data


def cached_choice(threads: int) -> EncodingChoice | None:
    """The choice cached for this CPU, llama.cpp version and thread count (None: not measured here yet)."""
    entry = _read_cache(cache_path()).get("by_threads", {}).get(str(threads))
    try:
        return EncodingChoice.from_json(entry) if entry else None
    except (TypeError, KeyError, ValueError):
        return None


def _store(choice: EncodingChoice) -> None:
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = _read_cache(path) or {"format": FORMAT, "cpu": choice.cpu, "llama_cpp": choice.llama_cpp, "by_threads": {}}
    data["by_threads"][str(choice.threads)] = choice.to_json()
    with written_aside(path) as tmp:
        Path(tmp).write_text(json.dumps(data, indent=1))


def measured_choice(threads: int, *, remeasure: bool = False) -> EncodingChoice:
    """This machine's choice for ``threads`` threads: from the cache, else measured now (and cached). A timing
    that fails is cached as the Q8_0 fallback (said once; remade with ``remeasure`` or on another CPU / llama.cpp
    version); one that is interrupted falls back for this process only."""
    with _lock:
        if not remeasure:
            choice = _memo.get(threads) or cached_choice(threads)
            if choice is not None:
                _memo[threads] = choice
                return choice
        from skillbank.model.embedded import embedded_gguf_path

        _say_once(f"timing llama.cpp's encodings on this CPU with {threads} thread(s), once (a few seconds)")
        try:
            choice = measure(embedded_gguf_path(), threads)
        except KeyboardInterrupt:
            choice = _fallback(threads, "interrupted")
            _memo[threads] = choice
            _say_once(f"warning: {choice.why()}")
            return choice
        except Exception as exc:  # noqa: BLE001 - any failure of the timing leaves the safe encoding
            choice = _fallback(threads, f"{type(exc).__name__}: {exc}")
            _say_once(f"warning: {choice.why()}")
        try:
            _store(choice)
        except OSError as exc:  # a read-only cache: the choice holds for this process
            _say_once(f"warning: could not cache the encoding choice in {cache_path()}: {exc}")
        _memo[threads] = choice
        return choice



def forced_encoding() -> str | None:
    """``$SKILLBANK_LLAMACPP_ENCODING`` where it names an encoding (None: unset or ``auto``)."""
    from skillbank.model.llamacpp import ENCODINGS

    forced = os.environ.get(ENV, "").strip().lower()
    if forced in ("", "auto"):
        return None
    if forced not in ENCODINGS:
        raise ModelError(f"{ENV}={forced!r}: expected auto or one of {list(ENCODINGS)}")
    return forced


@functools.lru_cache(maxsize=None)
def warn_if_slower(forced: str, threads: int) -> None:
    """Say once where the forced encoding measured clearly slower than this machine's choice at some width."""
    choice = measured_choice(threads)
    for w in sorted(choice.chosen):
        rates = {e: r.get(w) for e, r in choice.tokens_per_s.items()}
        best = choice.chosen[w]
        if best != forced and rates.get(forced) and rates.get(best) and rates[best] > CLEAR_WIN * rates[forced]:
            _say_once(f"warning: {ENV}={forced} is honoured, but on this CPU {best} decoded {rates[best] / rates[forced]:.2f}x "
                      f"as fast at {w} row(s) a pass ({rates[best]:.0f} vs {rates[forced]:.0f} tokens/s): unset it "
                      "to use the measured choice")
            return
