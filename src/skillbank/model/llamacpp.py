"""Executors on llama.cpp: the embedded base's GGUF file with each shard's LoRA merged in or applied as an adapter.

The reference decoder (:mod:`skillbank.model.decode`) runs the base through transformers and PEFT on the
dequantized weights. On a small CPU that path pays for Python around every layer and for importing torch,
transformers and PEFT (~7 s before the first plan). llama.cpp runs the very GGUF file the embedded base ships
as, with the shard's update merged into its weights (or applied as a low-rank product per layer), so a shard's
plan comes out of a C++ loop.

What this module does:

- :func:`convert_lora` writes a shard's PEFT adapter (``adapter_model.safetensors`` + ``adapter_config.json``)
  as a llama.cpp LoRA GGUF. Written by hand: llama.cpp's own ``convert_lora_to_gguf.py`` is a script of its
  source tree (not in any wheel) and needs the base's Hugging Face directory. The mapping is the one llama.cpp's
  converter applies to a llama-architecture model: ``q_proj`` -> ``attn_q`` ... , and the rows of q and k
  permuted the way the GGUF stores them (rotary halves interleaved; checked against the GGUF's own tensors in
  tests). PEFT's scaling (``lora_alpha / r``, rsLoRA, per-module patterns) is folded into B, and the file says
  alpha 0, which llama.cpp reads as "scale 1".
- :func:`merge_lora` writes the base GGUF again with the same update merged into each adapted weight and
  every quantized matrix stored as Q8_0 or BF16 (:data:`ENCODINGS`), a whole model per shard that decodes at
  least at the bare base's speed (what the engine plans with by default): llama.cpp multiplies batches by Q8_0
  weights with tiled kernels, by the shipped Q4_1 ones row by row, and by BF16 ones with the CPU's BF16 dot
  products where it has them; which encoding serves which batch width is timed on each machine
  (:func:`encoding_for`).
- :class:`LlamaCppDecoder` holds the model, one context and the loaded adapters, and decodes greedily - one
  request (reusing the KV cache of the head its prompt shares with the previous one) or a shard's requests
  together (rows advancing in one forward pass, their common head shared) -, each step's logits masked by
  the row's grammar matcher (the same llguidance matchers as the reference path) and the arg-max picked, the
  log-probability read before masking - the arithmetic of :class:`~skillbank.model.decode.RowBatch`, row by row.
  Each forward pass also checks the tokens the row's grammar forces next (a skill name's rest, a key): one is
  kept only where the greedy pick from the logits of the pass equals it, so the output is the greedy one, in
  fewer passes (speculative decoding whose drafts cost no model).

Numerics: llama.cpp multiplies the Q4_1 weights with 8-bit-quantized activations, the reference path with the
float32 dequantized weights, so logits differ in the last digits and a near-tie may pick differently.
``bench/engine_parity.py`` measures how often whole plans differ and the EM on each path.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from skillbank.cache import written_aside
from skillbank.errors import ModelError

# Part of every converted adapter's cache key: a change here rebuilds them all. 2: merged models store every
# quantized matrix as Q8_0, not only the adapted ones.
CONVERTER_VERSION = 2
# How a merged model stores its matrices (each encoding is part of the merged file's name). Q8_0: half BF16's
# bytes, the faster one where a pass reads every weight for one row; BF16: llama.cpp's fastest batched kernels on
# CPUs with BF16 dot products (which one a pass uses, and the measurements: encoding_for). "f16" (merge_lora) is
# the tests' exact-arithmetic form, not an engine's.
ENCODINGS = ("q8_0", "bf16")
# PEFT module name -> llama.cpp tensor name (llama architecture)
MODULES = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
           "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.[\w-]+)?\.weight$")


class UnsupportedAdapter(ModelError):
    """A shard adapter that llama.cpp cannot apply exactly (the reference path serves it instead)."""


def available() -> str | None:
    """None when llama.cpp can be used here, else why not (shown once, where the reference path is used)."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return 'llama-cpp-python is not installed (pip install -e ".[fast]")'
    except OSError as exc:  # the wheel is there but its shared library does not load
        return f"llama-cpp-python does not load: {exc}"
    return None


def cpu_features() -> str:
    """llama.cpp's account of what its CPU kernels use here ("AVX2 = 1 | AVX512_BF16 = 1 | ..."): what it was
    built for and found, not only what /proc/cpuinfo lists."""
    return _library().llama_print_system_info().decode(errors="replace")


def encoding_for(rows: int, threads: int | None = None) -> str:
    """The encoding of the merged model that decodes ``rows`` rows of a shard in each pass, as timed on this
    machine (:mod:`skillbank.model.encoding_choice`: once per CPU, llama.cpp version and thread count, cached).
    ``$SKILLBANK_LLAMACPP_ENCODING`` (``q8_0`` or ``bf16``; ``auto`` or unset: the measured choice) fixes one
    encoding for every width, with a warning where this CPU measured another one clearly faster."""
    from skillbank.model.encoding_choice import forced_encoding, measured_choice, warn_if_slower
    from skillbank.model.threads import default_threads

    threads = threads or default_threads()
    forced = forced_encoding()
    if forced is not None:
        warn_if_slower(forced, threads)
        return forced
    return measured_choice(threads).for_rows(rows)


def base_problem(base_name: str) -> str | None:
    """Why llama.cpp cannot run base ``base_name`` (a run's ``[base] name``) here (None: it can): it runs the
    embedded GGUF model only, and only where llama-cpp-python loads."""
    from skillbank.model.embedded import EMBEDDED

    if base_name != EMBEDDED:
        return f"the base is {base_name!r}; llama.cpp runs the embedded GGUF model only"
    return available()


# -- conversion ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BaseShape:
    """What converting an adapter needs to know of the GGUF base."""

    arch: str
    n_head: int
    n_head_kv: int
    n_layer: int
    n_ctx_train: int


def _permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """The row order llama.cpp's converter gives q and k (each head's rotary halves interleaved)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _scales(config: dict, module: str, rank: int) -> float:
    """PEFT's scaling of one module's update: alpha / r (alpha / sqrt(r) with rsLoRA), per-module patterns
    applied (a pattern key matches the module's name)."""
    alpha = float(config.get("lora_alpha", 8))
    for pattern, value in (config.get("alpha_pattern") or {}).items():
        if re.search(pattern, module):
            alpha = float(value)
    return alpha / (rank ** 0.5 if config.get("use_rslora") else rank)


def adapter_problems(config: dict) -> list[str]:
    """Why a PEFT LoRA config cannot be applied exactly by llama.cpp (empty: it can)."""
    out = []
    if config.get("peft_type", "LORA") != "LORA":
        out.append(f"peft_type {config.get('peft_type')!r}")
    for key, bad in (("use_dora", True), ("fan_in_fan_out", True)):
        if config.get(key) == bad:
            out.append(f"{key}={bad}")
    if config.get("bias", "none") != "none" or config.get("lora_bias"):
        out.append("a LoRA bias")
    if config.get("modules_to_save"):
        out.append(f"modules_to_save {config['modules_to_save']}")
    targets = config.get("target_modules") or []
    if isinstance(targets, str):
        out.append(f"target_modules given as a pattern ({targets!r})")
    else:
        stray = sorted(set(targets) - set(MODULES))
        if stray:
            out.append(f"target modules {stray} (llama.cpp's adapter maps {sorted(MODULES)})")
    return out


def adapter_key(digests: dict, base_digest: str) -> str:
    """The cache key of a shard's converted adapter: the digests of its adapter files (as the bank's manifest
    records them and checks them when the shard loads), the base and the converter version."""
    missing = [n for n in ("adapter_config.json", "adapter_model.safetensors") if n not in digests]
    if missing:
        raise ModelError(f"no digest recorded for {missing}")
    text = "\0".join([f"v{CONVERTER_VERSION}", base_digest, digests["adapter_config.json"],
                      digests["adapter_model.safetensors"]])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _lora_updates(shard_dir: Path, shape: BaseShape) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A shard's LoRA as llama.cpp tensor name -> (A [r, in], B [out, r]) with PEFT's scaling folded into B and
    q/k rows in the GGUF's order; :class:`UnsupportedAdapter` for anything llama.cpp cannot apply exactly."""
    from safetensors.numpy import load_file

    try:
        config = json.loads((shard_dir / "adapter_config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelError(f"{shard_dir}/adapter_config.json: {exc}") from None
    problems = adapter_problems(config)
    if problems:
        raise UnsupportedAdapter(f"{shard_dir}: llama.cpp cannot apply this adapter exactly: {'; '.join(problems)}")
    return _updates_from(config, load_file(str(shard_dir / "adapter_model.safetensors")), shape, str(shard_dir))


def _updates_from(config: dict, weights: dict[str, np.ndarray], shape: BaseShape, where: str
                  ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """:func:`_lora_updates` of an adapter's config and tensors (keyed as PEFT saves them), wherever they come from."""
    pairs: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for key, tensor in weights.items():
        m = _KEY.search(key)
        if m is None:
            raise UnsupportedAdapter(f"{where}: tensor {key!r} is not a LoRA A/B of a mapped module")
        layer, module, ab = int(m.group(1)), m.group(2), m.group(3)
        if module not in MODULES or layer >= shape.n_layer:
            raise UnsupportedAdapter(f"{where}: tensor {key!r} has no counterpart in the GGUF base")
        pairs.setdefault((layer, module), {})[ab] = tensor.astype(np.float32)
    if not pairs:
        raise UnsupportedAdapter(f"{where}: the adapter holds no LoRA tensors")
    out = {}
    for (layer, module), ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            raise UnsupportedAdapter(f"{where}: layer {layer} {module} lacks its LoRA {'AB'.strip(''.join(ab))}")
        a, b = ab["A"], ab["B"] * np.float32(_scales(config, module, ab["A"].shape[0]))
        if module == "q_proj":
            b = _permute_rows(b, shape.n_head)
        elif module == "k_proj":
            b = _permute_rows(b, shape.n_head_kv)
        out[f"blk.{layer}.{MODULES[module]}.weight"] = (np.ascontiguousarray(a), np.ascontiguousarray(b))
    return out


def peft_updates(model, shape: BaseShape) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The update a loaded PEFT model computes with now, as :func:`_lora_updates` gives a shard's: every active
    LoRA adapter's (none while ``disable_adapter()`` is on, or for a model without PEFT layers), the updates of
    several adapters on one weight summed - their A stacked and their B side by side, so B·A is the sum of
    theirs (Progressive-LoRA's and O-LoRA's forward). What the harness merges to evaluate any method's state on
    llama.cpp; :class:`UnsupportedAdapter` for an adapter llama.cpp cannot apply exactly."""
    from peft.tuners.lora import LoraLayer
    from peft.utils import get_peft_model_state_dict

    layers = [m for m in model.modules() if isinstance(m, LoraLayer)]
    if not layers or layers[0].disable_adapters:
        return {}
    parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for name in layers[0].active_adapters:
        config = model.peft_config[name].to_dict()
        config["target_modules"] = sorted(config.get("target_modules") or [])  # a set in a live config
        problems = adapter_problems(config)
        if problems:
            raise UnsupportedAdapter(f"adapter {name!r}: llama.cpp cannot apply it exactly: {'; '.join(problems)}")
        weights = {k: v.detach().float().cpu().numpy()
                   # save_embedding_layers=False: "auto" looks the base up on the hub to see if the vocabulary grew
                   for k, v in get_peft_model_state_dict(model, adapter_name=name,
                                                         save_embedding_layers=False).items()}
        for tensor, update in _updates_from(config, weights, shape, f"adapter {name!r}").items():
            parts.setdefault(tensor, []).append(update)
    return {tensor: (np.ascontiguousarray(np.concatenate([a for a, _ in ups], axis=0)),
                     np.ascontiguousarray(np.concatenate([b for _, b in ups], axis=1)))
            for tensor, ups in parts.items()}


def updates_digest(updates: dict[str, tuple[np.ndarray, np.ndarray]]) -> str:
    """A digest of an update's every byte (names, shapes, values): what a merged model made from it is cached by."""
    h = hashlib.sha256()
    for name in sorted(updates):
        for array in updates[name]:
            h.update(f"{name}{array.shape}".encode())
            h.update(np.ascontiguousarray(array, dtype=np.float32).tobytes())
    return h.hexdigest()[:32]


def _write_gguf(out: Path, arch: str, fill) -> Path:
    """Write a GGUF at ``out`` atomically (:func:`written_aside`); ``fill(writer)`` adds its fields and tensors."""
    from gguf import GGUFWriter

    with written_aside(out) as tmp:
        writer = GGUFWriter(tmp, arch)
        fill(writer)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return out


def _with_update(base_gguf, name: str, data: np.ndarray, kind, update: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Base tensor ``name`` (``data`` stored as ``kind``) dequantized, plus the update's B·A, in float32: the
    arithmetic of every merged weight, rewritten or patched; :class:`UnsupportedAdapter` for a type gguf-py cannot
    dequantize."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    try:
        weight = dequantize(data, kind)
    except NotImplementedError as exc:
        raise UnsupportedAdapter(f"{base_gguf}: {name} is {GGMLQuantizationType(kind).name}, which gguf-py "
                                 f"cannot dequantize ({exc})") from None
    a, b = update
    return (weight + b @ a).astype(np.float32)


def convert_lora(shard_dir: str | os.PathLike, out: str | os.PathLike, shape: BaseShape) -> Path:
    """Write the PEFT adapter in ``shard_dir`` as a llama.cpp LoRA GGUF at ``out`` (atomically)."""
    updates = _lora_updates(Path(shard_dir), shape)

    def fill(writer) -> None:
        writer.add_string("general.type", "adapter")
        writer.add_string("adapter.type", "lora")
        writer.add_float32("adapter.lora.alpha", 0.0)  # 0: llama.cpp applies B·A as written (scale folded into B)
        for name, (a, b) in updates.items():
            # numpy [r, in] / [out, r]: the shapes llama.cpp's adapter loader checks against the base tensor
            writer.add_tensor(f"{name}.lora_a", a)
            writer.add_tensor(f"{name}.lora_b", b)

    return _write_gguf(Path(out), shape.arch, fill)


def merge_lora(shard_dir: str | os.PathLike, base_gguf: str | os.PathLike, out: str | os.PathLike,
               shape: BaseShape, weights: str = "q8_0", reencoded: str | os.PathLike | None = None) -> Path:
    """Write the base GGUF with the shard's update merged into each adapted weight, as a whole model at ``out``
    (atomically). llama.cpp applies a LoRA adapter as two extra products per adapted weight and token (16-24% of a
    decode step of the embedded base at rank 64 on four attention projections); a merged model costs about
    what the bare base does (``scripts/llamacpp_lora_overhead.py``). The merged weights are stored as Q8_0,
    rounding ~15x finer than Q4_1's, and so are the base's other quantized matrices (:func:`_reencoded`:
    llama.cpp's batched kernels for Q8_0 run about twice as fast as for Q4_1 here); llama.cpp then also rounds
    the activations the update multiplies to 8 bits, which the runtime adapter does not, so an oversized update
    lands farther from the reference path (the dequantized base plus the exact update) than the adapter route
    does - trained shards plan as the reference does
    (``bench/engine_parity.py``; ``tests/test_llamacpp.py`` bounds both). A base tensor type gguf-py cannot
    dequantize is :class:`UnsupportedAdapter` (the reference engine serves the shard). ``weights="bf16"`` stores
    every quantized matrix as BF16 instead (twice the bytes; llama.cpp's fastest batched kernels on CPUs with BF16
    dot products: :func:`encoding_for`); ``weights="f16"`` stores the merged weights in float16 and re-encodes
    nothing else (larger, slower; what the tests check the merge's arithmetic with).

    ``reencoded``: the base already re-encoded (:func:`reencode_base`, made once per machine by the engine). The
    merged model is then that file with the adapted tensors' bytes replaced (:func:`_patch`): the same tensors as
    a rewrite from the base, in ~0.5 s instead of ~4 (most of it gguf-py parsing the tokenizer's metadata)."""
    return merge_updates(_lora_updates(Path(shard_dir), shape), base_gguf, out, shape, weights, reencoded,
                         note=str(shard_dir))


def merge_updates(updates: dict[str, tuple[np.ndarray, np.ndarray]], base_gguf: str | os.PathLike,
                  out: str | os.PathLike, shape: BaseShape, weights: str = "q8_0",
                  reencoded: str | os.PathLike | None = None, note: str = "merged") -> Path:
    """:func:`merge_lora` of updates already read (:func:`_lora_updates`, :func:`peft_updates`); ``note`` is
    recorded in the file (``skillbank.merged_lora``) where it is rewritten."""
    if weights not in (*ENCODINGS, "f16"):
        raise ModelError(f"merged weights are stored as one of {[*ENCODINGS, 'f16']}, not {weights!r}")
    updates = dict(updates)
    if reencoded is not None and weights in ENCODINGS:
        patched = _patch(base_gguf, reencoded, out, updates, weights)
        if patched is not None:
            return patched
    return _rewrite(base_gguf, out, shape.arch, updates, weights, note=note)


def reencode_base(base_gguf: str | os.PathLike, out: str | os.PathLike, weights: str = "q8_0") -> Path:
    """The base GGUF with no update, its quantized matrices re-encoded as a merged model's are (``weights``, one of
    :data:`ENCODINGS`): what a shard's merge is patched into, and what ``bench/latency.py`` runs llama.cpp on beside
    the shipped file, to tell the encoding's speed from the rest."""
    if weights not in ENCODINGS:
        raise ModelError(f"a re-encoded base is stored as one of {list(ENCODINGS)}, not {weights!r}")
    shape, _ = read_shape(base_gguf)
    return _rewrite(base_gguf, out, shape.arch, {}, weights, note="")


def copy_fields(reader, writer) -> None:
    """Every metadata field of a gguf-py ``reader`` into ``writer``, but those GGUFWriter writes itself."""
    from gguf import GGUFValueType, Keys

    for field in reader.fields.values():
        if field.name == Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        kind = field.types[0]
        writer.add_key_value(field.name, field.contents(), kind,
                             sub_type=field.types[-1] if kind == GGUFValueType.ARRAY else None)


def _rewrite(base_gguf, out, arch: str, updates: dict, weights: str, note: str) -> Path:
    """Write ``base_gguf`` again at ``out`` (atomically): each tensor in ``updates`` with its B·A added, every
    other quantized matrix re-encoded as ``weights`` (:func:`_reencoded`), the rest as they are."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    stat = os.stat(base_gguf)
    reader = _read_gguf(str(base_gguf), stat.st_mtime_ns, stat.st_size)

    def fill(writer) -> None:
        copy_fields(reader, writer)
        if note:
            writer.add_string("skillbank.merged_lora", note)
        for tensor in reader.tensors:
            update = updates.pop(tensor.name, None)
            if update is not None:
                weight = _with_update(base_gguf, tensor.name, tensor.data, tensor.tensor_type, update)
            elif not _reencoded(tensor, weights):
                writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
                continue
            else:
                try:
                    weight = dequantize(tensor.data, tensor.tensor_type)
                except NotImplementedError:  # a matrix the update does not touch keeps its bytes, only slower kernels
                    writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
                    continue
            kind = _stored_as(weights, weight.shape)
            if kind == GGMLQuantizationType.F16:
                writer.add_tensor(tensor.name, weight.astype(np.float16))
            else:
                writer.add_tensor(tensor.name, quantize(weight, kind), raw_dtype=kind)
        if updates:
            raise UnsupportedAdapter(f"{note}: the base has no tensor {sorted(updates)[0]}")

    return _write_gguf(Path(out), arch, fill)


@dataclass(frozen=True)
class _Span:
    """Where a tensor's data lies in a GGUF file, and how it is stored."""
    offset: int  # from the start of the file
    nbytes: int
    kind: int  # GGMLQuantizationType
    dims: tuple[int, ...]  # GGUF order: the row length first


# A GGUF scalar's size in bytes by value type (the format's table; strings and arrays are walked).
_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


@functools.lru_cache(maxsize=4)
def _spans(path: str, mtime_ns: int, size: int) -> dict[str, _Span]:
    """Every tensor's :class:`_Span` in the GGUF at ``path`` (keyed by path, time and size for the process).

    Written by hand: gguf-py's reader builds an array view for each of the tokenizer's ~100,000 metadata strings
    (~2 s); this walks past them with ``struct`` (~0.1 s) and reads only the tensor table. A file that is not a
    whole GGUF (truncated, damaged) is a :class:`ModelError`."""
    import mmap
    import struct

    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    if size < 24:
        raise ModelError(f"{path} is not a GGUF file ({size} bytes)")
    with open(path, "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # only the header's pages are read
    pos = 0

    def take(fmt: str):
        nonlocal pos
        value = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return value[0]

    def string() -> bytes:
        nonlocal pos
        n = take("<Q")
        pos += n
        return data[pos - n:pos]

    def skip(kind: int) -> int | None:
        nonlocal pos
        if kind == 8:
            string()
        elif kind == 9:
            item, count = take("<I"), take("<Q")
            if item in _SCALAR_BYTES:
                pos += count * _SCALAR_BYTES[item]
            else:
                for _ in range(count):
                    skip(item)
        elif kind in _SCALAR_BYTES:
            value = struct.unpack_from({4: "<I", 10: "<Q"}.get(kind, f"<{_SCALAR_BYTES[kind]}x"), data, pos)
            pos += _SCALAR_BYTES[kind]
            return value[0] if value else None
        else:
            raise ModelError(f"{path}: unknown GGUF value type {kind}")
        return None

    try:
        if data[:4] != b"GGUF" or take("<4xI") not in (2, 3):
            raise ModelError(f"{path} is not a GGUF file of version 2 or 3")
        n_tensors, n_kv = take("<Q"), take("<Q")
        alignment = 32
        for _ in range(n_kv):
            key = string()
            value = skip(take("<I"))
            if key == b"general.alignment" and value:
                alignment = int(value)
        table = []
        for _ in range(n_tensors):
            name = string().decode()
            dims = tuple(take("<Q") for _ in range(take("<I")))
            kind, offset = take("<I"), take("<Q")
            table.append((name, dims, kind, offset))
    except struct.error:
        raise ModelError(f"{path} ends inside its GGUF header (a partial file?)") from None
    except UnicodeDecodeError:
        raise ModelError(f"{path}: a tensor name in its GGUF header is not UTF-8 (a damaged file?)") from None
    finally:
        data.close()
    start = -(-pos // alignment) * alignment
    spans = {}
    for name, dims, kind, offset in table:
        try:
            block, type_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        except (ValueError, KeyError):
            raise ModelError(f"{path}: tensor {name} has a type gguf-py does not know ({kind})") from None
        nbytes = int(np.prod(dims, dtype=np.int64)) // block * type_bytes
        spans[name] = _Span(start + offset, nbytes, kind, dims)
        if start + offset + nbytes > size:
            raise ModelError(f"{path} ends inside tensor {name} (a partial file?)")
    return spans


def gguf_spans(path: str | os.PathLike) -> dict[str, _Span]:
    """Every tensor's place in the GGUF at ``path`` (:func:`_spans`); :class:`ModelError` for a partial file."""
    stat = os.stat(path)
    return _spans(str(path), stat.st_mtime_ns, stat.st_size)


def _stored_as(weights: str, shape: tuple[int, ...]):
    """The GGML type a merged or re-encoded matrix of ``shape`` is written as in encoding ``weights``: Q8_0 needs
    rows of whole 32-value blocks (float16 otherwise)."""
    from gguf import GGMLQuantizationType as Q

    if weights == "bf16":
        return Q.BF16
    if weights == "q8_0" and shape[-1] % 32 == 0:
        return Q.Q8_0
    return Q.F16


def _patch(base_gguf, reencoded, out, updates: dict, weights: str) -> Path | None:
    """``reencoded`` (the base as :func:`reencode_base` writes it in encoding ``weights``) copied to ``out``
    (atomically), each tensor in ``updates`` replaced by the base's own tensor plus its B·A in that encoding -
    byte for byte what :func:`_rewrite` writes for it. None where a tensor would change its type or size (a float
    base, a base re-encoded otherwise: rewrite it instead)."""
    import shutil

    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    source, target = gguf_spans(base_gguf), gguf_spans(reencoded)
    for name in updates:
        if name not in source or name not in target:
            raise UnsupportedAdapter(f"the base has no tensor {name}")
        t = target[name]
        if len(t.dims) != 2 or t.kind != _stored_as(weights, t.dims[::-1]) or t.kind == GGMLQuantizationType.F16:
            return None
    out = Path(out)
    with written_aside(out) as tmp:
        shutil.copyfile(reencoded, tmp)
        with open(base_gguf, "rb") as src, open(tmp, "r+b") as dst:
            for name, update in updates.items():
                s, t = source[name], target[name]
                src.seek(s.offset)
                raw = np.frombuffer(src.read(s.nbytes), dtype=np.uint8).reshape(s.dims[1], -1)
                weight = _with_update(base_gguf, name, raw, GGMLQuantizationType(s.kind), update)
                merged = quantize(weight, GGMLQuantizationType(t.kind))
                if merged.nbytes != t.nbytes:
                    raise ModelError(f"{name}: {merged.nbytes} merged bytes for a {t.nbytes}-byte tensor")
                dst.seek(t.offset)
                dst.write(merged.tobytes())
    return out


@functools.lru_cache(maxsize=1)
def _read_gguf(path: str, mtime_ns: int, size: int):
    """gguf-py's reader of the base, kept for the process (keyed by the file's path, time and size): parsing its
    metadata - the tokenizer's ~100,000 strings, one array view each - takes ~2 s of a ~4 s merge here, and a
    process that merges several shards (a service, a batch over new shards) reads the same base each time."""
    from gguf import GGUFReader

    return GGUFReader(path)


def _reencoded(tensor, weights: str) -> bool:
    """Whether a tensor the update does not touch is written again in encoding ``weights``. As BF16: every
    quantized matrix (the embedded base's Q4_1 ones and its Q8_0 embedding, which is also its output head). As
    Q8_0: a quantized matrix of another type (the embedded base's Q4_1). llama.cpp multiplies a batch of rows by
    Q8_0 weights with tiled kernels and by Q4_1 ones row by row: on this 2-core CPU a 480-token prefill runs at
    ~580 tokens/s on the base re-encoded as Q8_0 against ~300 on the shipped Q4_1 file, and one-row decoding at
    86-102 against 72-75 tokens/s (``bench/latency.py``'s reference rows). Q8_0 holds each Q4_1 value to within
    1/18 of its block's Q4_1 step (measured over the embedded base: 0.054 at most, 0.031 on average). Float
    tensors (norms, a float base) keep their bytes, and in Q8_0 the Q8_0 ones; ``weights="f16"`` (the tests'
    exact-arithmetic form) re-encodes nothing."""
    from gguf import GGMLQuantizationType as Q

    if weights == "f16" or len(tensor.shape) < 2:
        return False
    if weights == "bf16":
        return tensor.tensor_type not in (Q.F32, Q.F16, Q.BF16, Q.F64)
    return tensor.shape[0] % 32 == 0 and tensor.tensor_type not in (Q.F32, Q.F16, Q.BF16, Q.F64, Q.Q8_0)


def read_shape(gguf_path: str | os.PathLike) -> tuple[BaseShape, int]:
    """A GGUF base's shape and vocabulary size, read by llama.cpp without loading its weights.

    Kept in the cache per file (path, size, modification time): llama.cpp reads the whole vocabulary to tell
    them, a fifth of a second of every cold ``skillbank plan``."""
    from skillbank.cache import cache_root

    path = Path(gguf_path).resolve()
    stat = path.stat()
    key = f"{path}:{stat.st_size}:{stat.st_mtime_ns}"
    memo_file = cache_root() / "llamacpp" / "shapes.json"
    try:
        memo = json.loads(memo_file.read_text())
    except (OSError, ValueError):
        memo = {}
    memo = memo if isinstance(memo, dict) else {}
    try:
        return BaseShape(**memo[key]["shape"]), int(memo[key]["n_vocab"])
    except (KeyError, TypeError, ValueError):
        pass  # not read yet, or written by another version of BaseShape
    shape, n_vocab = _read_shape(path)
    memo[key] = {"shape": dataclasses.asdict(shape), "n_vocab": n_vocab}
    try:
        with written_aside(memo_file) as tmp:
            Path(tmp).write_text(json.dumps(memo, indent=1) + "\n")
    except OSError:
        pass  # a cache that cannot be written: the next process asks llama.cpp again
    return shape, n_vocab


def _read_shape(gguf_path: Path) -> tuple[BaseShape, int]:
    L = _library()
    params = L.llama_model_default_params()
    params.vocab_only = True
    model = L.llama_model_load_from_file(str(gguf_path).encode(), params)
    if not model:
        raise ModelError(f"llama.cpp cannot read {gguf_path}")
    try:
        return _shape_of(L, model), L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    finally:
        L.llama_model_free(model)


# -- decoding ----------------------------------------------------------------------------------------
@dataclass
class Step:
    """One finished generation (the fields of :class:`~skillbank.model.decode.Decoded`, tokens kept)."""

    tokens: list[int]
    stopped: bool
    logprob: float  # summed, natural log, unconstrained
    reason: str | None = None

    def text(self, tokenizer) -> str:
        """The output as the planner and the harness read it: decoded without special tokens or the stop token."""
        body = self.tokens[:-1] if self.stopped else self.tokens
        return tokenizer.decode(body, skip_special_tokens=True).strip()

    @property
    def mean_logprob(self) -> float:
        """Mean natural-log probability per generated token, the stop token included (as the reference reports)."""
        return self.logprob / max(1, len(self.tokens))


def _shape_of(L, model) -> BaseShape:
    """The shape from the GGUF's metadata (present even when llama.cpp loaded the vocabulary only)."""
    def meta(key: str) -> str:
        buf = ctypes.create_string_buffer(128)
        n = L.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
        return buf.value.decode() if n >= 0 else ""

    arch = meta("general.architecture") or "?"
    if arch != "llama":
        raise UnsupportedAdapter(f"architecture {arch!r}; the LoRA converter knows 'llama' only")
    n_head = int(meta(f"{arch}.attention.head_count"))
    return BaseShape(arch, n_head, int(meta(f"{arch}.attention.head_count_kv") or n_head),
                     int(meta(f"{arch}.block_count")), int(meta(f"{arch}.context_length")))


@ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
def _quiet(level, text, user_data):  # llama.cpp logs every load to stderr; its errors come back as results
    return None


def _library():
    """llama-cpp-python's bindings, its logging silenced and its backend initialised (both idempotent)."""
    import llama_cpp as L

    L.llama_log_set(_quiet, None)
    L.llama_backend_init()
    return L


# Drafts checked in a forward pass. A pass over a few tokens costs less than as many passes over one
# (bench/llamacpp_batches.py, one decoder, two threads, Q8_0 merged model: 8.7 ms for 1 token, 19.3 for 2, 23.1
# for 4, 32.2 for 8; 16 rows of one token 65 ms), so drafts fill a pass up to DRAFT_FED tokens and stop where the
# rows alone fill it (a rejected draft then costs compute; 40 or 64 measured no faster: docs/decoding.md).
DRAFT_FED = 24
DRAFT_MAX = 8  # draft tokens per row and pass
# The cells of a decoder's first context: a lone plan's prompt and generation fit (LlamaCppDecoder._grow).
FIRST_CONTEXT = 2048


class _Row:
    """A prompt being decoded in a batch: its sequence in the KV cache, position, tokens so far."""

    __slots__ = ("index", "seq", "pos", "tokens", "logprob", "matcher", "logits", "need", "cap")

    def __init__(self, index: int, seq: int, pos: int, matcher, logits: np.ndarray):
        self.index, self.seq, self.pos, self.matcher, self.logits = index, seq, pos, matcher, logits
        self.need = 0  # context cells it holds: its own prompt tokens and its generation budget
        self.cap = 0  # the most tokens it may generate
        self.tokens: list[int] = []
        self.logprob = 0.0


class LlamaCppDecoder:
    """A GGUF base in llama.cpp with named LoRA adapters; greedy decoding of one prompt (:meth:`decode`, which
    keeps the previous prompt's KV cache for the next one of the same adapter) or of many prompts of one adapter
    (:meth:`decode_many`: up to ``width`` sequences advance in each forward pass, finished ones replaced by
    waiting ones, the prompts' common head computed once and shared)."""

    def __init__(self, gguf_path: str | os.PathLike, *, threads: int, n_ctx: int = 4096, n_batch: int = 512,
                 width: int = 16):
        self.L = L = _library()
        params = L.llama_model_default_params()
        self.model = L.llama_model_load_from_file(str(gguf_path).encode(), params)
        if not self.model:
            raise ModelError(f"llama.cpp cannot load {gguf_path}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.path, self.n_batch, self.width = gguf_path, n_batch, width
        self.threads = threads  # what the context computes with now (see set_threads)
        self.batch = L.llama_batch_init(max(n_batch, width), 0, 1)
        self.adapters: dict[str, object] = {}
        self.ctx = None
        # A context's cache is allocated whole when it is made (8192 cells: ~0.15 s more than 2048): one sized for
        # a lone prompt comes first, the full one when a prompt or a batch needs it (_grow).
        self.n_ctx_max = n_ctx
        self._make_context(min(n_ctx, FIRST_CONTEXT))
        self.draft_fed = DRAFT_FED  # tokens a pass may feed with drafts (1: no drafts, one token a row and pass)
        #: asked before every forward pass for the threads to use (None: keep ``threads``): several decoders that
        #: run side by side share the cores this way, and one whose neighbours finished takes their threads back
        self.threads_now: Callable[[], int] | None = None

    def _make_context(self, n_ctx: int) -> None:
        L = self.L
        if self.ctx:
            L.llama_free(self.ctx)
            self.ctx = None
        cparams = L.llama_context_default_params()
        cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = n_ctx, self.n_batch, self.n_batch
        cparams.n_threads = cparams.n_threads_batch = self.threads
        cparams.n_seq_max = self.width + 1  # the batch's rows and their shared head
        cparams.kv_unified = True  # one cache for all sequences: a copied head shares its cells
        cparams.no_perf = True
        self.ctx = L.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            raise ModelError(f"llama.cpp cannot make a context for {self.path}")
        self.n_ctx = n_ctx
        self.memory = L.llama_get_memory(self.ctx)
        self._current: str | None = None  # adapter the KV cache below was computed with (none set in a new one)
        self._cached: list[int] = []  # tokens whose keys/values the context holds (sequence 0)

    def _grow(self, cells: int) -> None:
        """Make the context the full size when ``cells`` do not fit the one made first (what was cached is lost)."""
        if cells > self.n_ctx and self.n_ctx < self.n_ctx_max:
            self._make_context(self.n_ctx_max)

    def shape(self) -> BaseShape:
        """The loaded base's shape, read from the model llama.cpp loaded (parsing the GGUF in Python took ~2 s)."""
        return _shape_of(self.L, self.model)

    def close(self) -> None:
        """Free the model, its context and adapters (also done when the decoder is collected)."""
        L = getattr(self, "L", None)
        if L is None:
            return
        for adapter in getattr(self, "adapters", {}).values():
            L.llama_adapter_lora_free(adapter)
        self.adapters = {}
        if getattr(self, "batch", None) is not None:
            L.llama_batch_free(self.batch)
            self.batch = None
        if getattr(self, "ctx", None):
            L.llama_free(self.ctx)
            self.ctx = None
        if getattr(self, "model", None):
            L.llama_model_free(self.model)
            self.model = None

    def __del__(self):
        self.close()

    def load_adapter(self, name: str, path: str | os.PathLike) -> None:
        adapter = self.L.llama_adapter_lora_init(self.model, str(path).encode())
        if not adapter:
            raise ModelError(f"llama.cpp cannot load the converted adapter {path}")
        self.drop_adapter(name)
        self.adapters[name] = adapter

    def drop_adapter(self, name: str) -> None:
        adapter = self.adapters.pop(name, None)
        if adapter is not None:
            if self._current == name:
                self._use(None)
            self.L.llama_adapter_lora_free(adapter)

    def _use(self, name: str | None) -> None:
        if name == self._current:
            return
        L = self.L
        if name is None:
            rc = L.llama_set_adapters_lora(self.ctx, None, 0, None)
        else:
            rc = L.llama_set_adapters_lora(self.ctx, (L.llama_adapter_lora_p_ctypes * 1)(self.adapters[name]), 1,
                                           (ctypes.c_float * 1)(1.0))
        if rc != 0:
            raise ModelError(f"llama.cpp refused adapter {name!r} (code {rc})")
        self._current = name
        self._clear()  # keys and values depend on the adapter

    def _clear(self) -> None:
        self.L.llama_memory_clear(self.memory, True)
        self._cached = []

    def _forget_from(self, pos: int) -> None:
        self.L.llama_memory_seq_rm(self.memory, 0, pos, -1)
        del self._cached[pos:]

    def set_threads(self, n: int) -> None:
        """Compute the next forward passes with ``n`` threads (llama.cpp reads it at each decode call)."""
        n = max(1, int(n))
        if n != self.threads:
            self.L.llama_set_n_threads(self.ctx, n, n)
            self.threads = n

    def _run(self, entries: Sequence[tuple[int, int, int, bool]]) -> None:
        """One forward pass over ``entries`` (token, position, sequence, wants logits)."""
        L, b = self.L, self.batch
        if self.threads_now is not None:
            self.set_threads(self.threads_now())
        for i, (token, pos, seq, wants) in enumerate(entries):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, 1, wants
            b.seq_id[i][0] = seq
        b.n_tokens = len(entries)
        rc = L.llama_decode(self.ctx, b)
        if rc != 0:
            self._clear()
            raise ModelError(f"llama.cpp could not decode ({rc}); context {self.n_ctx} tokens")

    def _logits(self, i: int) -> np.ndarray:
        """The logits of the ``i``-th output of the last pass (a view: valid until the next pass)."""
        return np.ctypeslib.as_array(self.L.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,))

    def _prefill(self, tokens: Sequence[int], start: int, seq: int) -> np.ndarray:
        """Run ``tokens`` at positions ``start``... of sequence ``seq``; a copy of the last token's logits."""
        for lo in range(0, len(tokens), self.n_batch):
            chunk = tokens[lo:lo + self.n_batch]
            last = lo + len(chunk) == len(tokens)
            self._run([(t, start + lo + k, seq, last and k == len(chunk) - 1) for k, t in enumerate(chunk)])
        return self._logits(-1).copy()

    def _prefill_rows(self, rows: Sequence[tuple[_Row, list[int], int]]) -> None:
        """Run each row's ``tokens`` at positions ``start``... of its sequence, the rows packed into passes of up to
        ``n_batch`` tokens (a row's tail may span two); each row's logits are a copy of its last token's."""
        entries = [(t, start + k, row.seq, k == len(tokens) - 1) for row, tokens, start in rows
                   for k, t in enumerate(tokens)]
        owners = iter(row for row, _, _ in rows)
        for lo in range(0, len(entries), self.n_batch):
            chunk = entries[lo:lo + self.n_batch]
            self._run(chunk)
            for k, (_, _, _, last) in enumerate(chunk):
                if last:
                    next(owners).logits = self._logits(k).copy()

    def _pick(self, row: _Row, bitmask: np.ndarray | None, cap: int, stops: set[int]) -> Step | None:
        """Choose ``row``'s next token (greedy; among what its grammar allows); its Step once it has ended."""
        logits = row.logits
        pick = int(np.argmax(logits))
        matcher = row.matcher
        weighed = matcher is not None and matcher.active()  # a skill name chosen under a prior (SkillPrior)
        if matcher is not None and (weighed or not matcher.allows(pick)):
            matcher.fill(bitmask, 0)
            allowed = np.flatnonzero(np.unpackbits(bitmask[0].view(np.uint8), bitorder="little")[:self.n_vocab])
            if not len(allowed):
                return Step(row.tokens, False, row.logprob,
                            f"grammar dead end: no token is allowed ({matcher.error[:200] or 'empty mask'})")
            scores = logits[allowed] + matcher.bias(allowed) if weighed else logits[allowed]
            pick = int(allowed[np.argmax(scores)])  # ascending ids: ties go to the lowest, as before
        # the log-probability under the model itself, before masking (as the reference path reports it)
        top = float(logits.max())
        row.logprob += float(logits[pick]) - top - float(np.log(np.exp(logits - top, dtype=np.float64).sum()))
        row.tokens.append(pick)
        if matcher is not None and not matcher.consume(pick):
            return Step(row.tokens, False, row.logprob, f"grammar dead end: {matcher.error[:200]}")
        if pick in stops:
            return Step(row.tokens, True, row.logprob)
        if len(row.tokens) >= cap:
            return Step(row.tokens, False, row.logprob, f"hit the token cap ({cap}) before the output ended")
        return None

    def _check_room(self, prompt: list[int], cap: int) -> None:
        if len(prompt) + cap > self.n_ctx:
            raise ModelError(f"{len(prompt)} prompt tokens + {cap} to generate exceed the context "
                             f"({self.n_ctx} tokens)")

    def _draft(self, row: _Row, room: int) -> list[int]:
        """Up to ``room`` tokens to check after ``row``'s last pick in the same pass: what its grammar forces next
        (the rest of a skill name, a key, the punctuation around them), never more than the row may still
        generate. Tokens that follow the row's last two where they occur in the request were tried as drafts
        too and cost more than they saved (``scripts/draft_probe.py``; docs/decoding.md)."""
        room = min(room, DRAFT_MAX, row.cap - len(row.tokens) - 1)
        if room <= 0 or row.matcher is None:
            return []
        return list(row.matcher.forced()[:room])

    def _feed(self, row: _Row, draft: list[int]) -> list[tuple[int, int, int, bool]]:
        """The entries of a pass for ``row``: its last pick, then the draft, each wanting logits."""
        return [(t, row.pos + k, row.seq, True) for k, t in enumerate([row.tokens[-1]] + draft)]

    def _verify(self, row: _Row, first: int, draft: list[int], bitmask, stops: set[int]) -> Step | None:
        """After a pass that fed ``row``'s last pick and ``draft`` (outputs ``first``...): pick from each
        output's logits in turn while the pick equals the draft token fed after it; the cells of draft tokens
        not taken are dropped. The row's Step once it has ended."""
        taken = 0
        for k in range(len(draft) + 1):
            row.logits = self._logits(first + k)
            step = self._pick(row, bitmask, row.cap, stops)
            if step is not None:
                return step
            if k == len(draft) or row.tokens[-1] != draft[k]:
                break
            taken += 1
        row.pos += 1 + taken
        if taken < len(draft):
            self.L.llama_memory_seq_rm(self.memory, row.seq, row.pos, -1)
        return None

    def decode(self, prompt: list[int], adapter: str | None, cap: int, stops: set[int], matcher=None,
               bitmask: np.ndarray | None = None) -> Step:
        """Greedy-decode ``prompt`` with ``adapter`` (None: the bare base) for at most ``cap`` tokens, reusing the
        KV cache of the head it shares with the previous prompt."""
        self._grow(len(prompt) + cap)
        self._check_room(prompt, cap)
        self._use(adapter)
        same = 0  # the head this prompt shares with what the cache holds (at least one token is fed again)
        for a, b in zip(self._cached, prompt[:-1]):
            if a != b:
                break
            same += 1
        self._forget_from(same)
        row = _Row(0, 0, len(prompt), matcher, self._prefill(prompt[same:], same, 0))
        row.cap = cap
        self._cached = list(prompt)
        step = self._pick(row, bitmask, cap, stops)
        while step is None:
            draft = self._draft(row, self.draft_fed - 1)
            self._run(self._feed(row, draft))
            step = self._verify(row, 0, draft, bitmask, stops)
        self._cached += row.tokens[:-1]  # the last pick was never fed
        self.L.llama_memory_seq_rm(self.memory, 0, len(self._cached), -1)  # nor the drafts after it
        return step

    def decode_many(self, prompts: Sequence[list[int]], adapter: str | None, cap: int | Sequence[int],
                    stops: set[int], matchers: Sequence | None = None, bitmask: np.ndarray | None = None,
                    width: int | None = None, *,
                    feed: Callable[[], Sequence[tuple[list[int], object, int]]] | None = None,
                    on_done: Callable[[int, Step], None] | None = None, on_step: Callable[[int], None] | None = None,
                    head_hint: list[int] | None = None) -> list[Step]:
        """Greedy-decode every prompt with ``adapter``: ``width`` rows advance together, one forward pass per
        step; a finished row's sequence is freed and the next prompt takes it. The tails of the rows that join at
        the same moment are prefilled together, in passes of up to ``n_batch`` tokens (llama.cpp's tiled Q8_0
        kernels compute a long pass at about half the cost per token of a 20-token one). The prompts' common head is prefilled once in a
        sequence of its own and shared by every row (copied cache cells, no recomputation). A row joins only
        while the context has room for its prompt and ``cap`` new tokens beside the rows decoding.

        ``cap``: the most tokens to generate, one for all prompts or one per prompt.

        Continuous batching (the service): ``feed()`` is asked before every step for more ``(prompt, matcher,
        cap)`` to decode with the same adapter - they join as rows free up, numbered after ``prompts``;
        ``on_done(index, step)`` hears of each prompt the moment its row ends; ``on_step(rows)`` after each
        forward pass of the decode loop. ``head_hint``: a prompt of the same shard (e.g. rendered for another
        request), so that a lone prompt's head - the shard's instruction, which later prompts share - is kept
        apart for them too."""
        prompts, matchers = list(prompts), list(matchers) if matchers is not None else [None] * len(prompts)
        caps = [cap] * len(prompts) if isinstance(cap, int) else list(cap)
        self._grow(self.n_ctx_max)  # rows side by side, and rows fed later, share one cache
        for p, c in zip(prompts, caps):
            self._check_room(p, c)
        self._use(adapter)
        self._clear()
        head = _common_head(prompts + ([head_hint] if head_hint is not None else []))
        head_tokens = prompts[0][:head] if prompts else []
        shared = self.width  # the head's own sequence id
        if head:
            self._prefill(head_tokens, 0, shared)
        queue = list(range(len(prompts)))[::-1]
        free = list(range(min(width or self.width, self.width)))[::-1]
        live: list[_Row] = []
        results: list[Step | None] = [None] * len(prompts)
        held = head  # context cells in use: the shared head and each live row's own tail and budget

        def own(i: int) -> int:  # where prompt i's own tokens start: after the head it shares, if it does
            p = prompts[i]
            return head if head and len(p) > head and p[:head] == head_tokens else 0

        def finish(row: _Row, step: Step) -> None:
            nonlocal held
            results[row.index] = step
            self.L.llama_memory_seq_rm(self.memory, row.seq, -1, -1)
            free.append(row.seq)
            held -= row.need
            if on_done is not None:
                on_done(row.index, step)

        try:
            while True:
                if feed is not None:
                    for prompt, matcher, its_cap in feed():
                        self._check_room(prompt, its_cap)
                        prompts.append(prompt)
                        matchers.append(matcher)
                        caps.append(its_cap)
                        results.append(None)
                        queue.insert(0, len(prompts) - 1)  # after those already waiting
                if not (queue or live):
                    break
                joining: list[tuple[_Row, int]] = []  # rows taking a free sequence now, and where their tails start
                while queue and free:
                    i = queue[-1]
                    start = own(i)
                    need = len(prompts[i]) - start + caps[i]
                    if (live or joining) and held + need > self.n_ctx:
                        break  # waits for a row to end and give its cells back
                    if head and held + need > self.n_ctx:
                        self.L.llama_memory_seq_rm(self.memory, shared, -1, -1)  # no room for the head as well
                        head, head_tokens, held, start = 0, [], 0, 0
                        need = len(prompts[i]) + caps[i]
                    queue.pop()
                    seq = free.pop()
                    if start:
                        self.L.llama_memory_seq_cp(self.memory, shared, seq, -1, -1)
                    row = _Row(i, seq, len(prompts[i]), matchers[i], None)
                    row.need, row.cap = need, caps[i]
                    held += need
                    joining.append((row, start))
                if joining:
                    self._prefill_rows([(row, prompts[row.index][start:], start) for row, start in joining])
                for row, _ in joining:
                    step = self._pick(row, bitmask, row.cap, stops)
                    if step is None:
                        live.append(row)
                    else:
                        finish(row, step)
                if not live:
                    continue
                entries, drafts, room = [], [], self.draft_fed - len(live)
                for row in live:  # drafts only while the rows' own tokens leave room in the pass
                    draft = self._draft(row, room)
                    room -= len(draft)
                    drafts.append(draft)
                    entries += self._feed(row, draft)
                self._run(entries)
                still, first = [], 0
                for row, draft in zip(live, drafts):
                    step = self._verify(row, first, draft, bitmask, stops)
                    first += 1 + len(draft)
                    if step is None:
                        still.append(row)
                    else:
                        finish(row, step)
                live = still
                if on_step is not None:
                    on_step(len(drafts))  # the rows of this pass
        finally:
            self._clear()  # the single-prompt cache no longer describes sequence 0
        return results  # type: ignore[return-value]


def _common_head(prompts: Sequence[list[int]], min_tokens: int = 8) -> int:
    """How many leading tokens every prompt shares, leaving each at least one of its own (0 if under
    ``min_tokens``: not worth a sequence of its own)."""
    if len(prompts) < 2:
        return 0
    n = min(len(p) for p in prompts) - 1
    first = prompts[0]
    for p in prompts[1:]:
        k = 0
        while k < n and p[k] == first[k]:
            k += 1
        n = k
    return n if n >= min_tokens else 0


__all__ = ["BaseShape", "LlamaCppDecoder", "Step", "UnsupportedAdapter", "adapter_key", "adapter_problems",
           "available", "convert_lora", "gguf_spans", "merge_lora", "read_shape", "reencode_base"]
