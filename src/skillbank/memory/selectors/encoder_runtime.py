"""The sentence encoder without torch: its ONNX form, run by ONNX Runtime, tokenized by ``tokenizers``.

Why: the scope gate and the embedding router embed every request with a small sentence encoder
(all-MiniLM-L6-v2, 22M parameters). Through torch + transformers, a fresh process pays ~5 s before the first
embedding (importing torch, importing transformers' BERT, loading), which is most of a cold ``skillbank plan``
- and all of it for a request the gate refuses, which loads no base model. ONNX Runtime loads the same
weights in ~0.2 s and embeds a short request in a few milliseconds.

The ONNX file is made once per encoder from its transformers weights (``torch.onnx.export``, which needs torch
and the ``onnx`` package, both installed with skillbank) and cached under the skillbank cache root
(``$SKILLBANK_CACHE`` or ``~/.cache/skillbank``) in ``encoders/<key>/``. The key names the source weights
file by path, size and modification time, and the folder's ``encoder.json`` - written last - records them
again with the cache format, so a stale, partial or foreign folder is rebuilt, never used. ``encoder.json``
also keeps the digest of the torch weights (what scope statistics are checked against), so the ONNX path
reports the same digest as the torch path without loading torch.

Embeddings equal the torch path's to ~1e-7 (mean pooling over the attention mask and L2 normalisation, as
there; checked in tests/test_encoder_runtime.py).

``quantize="int8"`` caches a second form beside it: the same export with its matrix products' weights stored
as 8-bit integers, one scale per output channel (ONNX Runtime's dynamic quantization; activations are
quantized per call). On two CPU cores it embeds a request about twice as fast, and its embeddings keep a
cosine of ~0.99 to the float ones - close, but not the same vectors, so statistics made with one form must
never be scored with the other: its digest carries the suffix :data:`INT8_SUFFIX`. Its activations are
quantized with one scale per call, taken over the whole batch, so it embeds one text per call (see
``SentenceEncoder``): a request's embedding must not depend on the requests beside it.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np

from skillbank.cache import cache_root, written_aside

CACHE_FORMAT = 1
WEIGHTS = "model.safetensors"
INT8_SUFFIX = "+int8"  # appended to the weights' digest by the int8 form


def available() -> bool:
    """ONNX Runtime and tokenizers are importable (both are skillbank dependencies; a trimmed install may lack
    them, and then the torch path is used)."""
    return all(importlib.util.find_spec(m) is not None for m in ("onnxruntime", "tokenizers"))


def source_identity(where: Path, quantize: str | None = None) -> dict | None:
    """What names a local encoder's weights cheaply (no hashing): path, size, modification time, and the
    form (``quantize``; the float form's identity has no such key, as before it existed). None when ``where``
    is not a local directory with safetensors weights and a fast tokenizer file."""
    weights, tok = where / WEIGHTS, where / "tokenizer.json"
    if not (weights.is_file() and tok.is_file()):
        return None
    st = weights.stat()
    identity = {"format": CACHE_FORMAT, "source": str(weights.resolve()), "size": st.st_size,
                "mtime_ns": st.st_mtime_ns}
    return {**identity, "quantize": quantize} if quantize else identity


def cache_folder(identity: dict) -> Path:
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / "encoders" / key


def cached(where: Path, quantize: str | None = None) -> Path | None:
    """The cache folder of ``where``'s ONNX form (``quantize``: which one) when it is complete and made from
    these very weights."""
    identity = source_identity(where, quantize)
    if identity is None:
        return None
    folder = cache_folder(identity)
    try:
        meta = json.loads((folder / "encoder.json").read_text())
    except (OSError, ValueError):
        return None
    if {k: meta.get(k) for k in identity} != identity or not (folder / "model.onnx").is_file():
        return None
    return folder


def export(where: Path, model, digest: str, quantize: str | None = None) -> Path | None:
    """Write ``where``'s ONNX form into the cache from its loaded transformers ``model``; returns the folder,
    or None when the source is not cacheable. Written to a temporary folder and moved into place whole.
    digest: what the form reports (the int8 form's carries :data:`INT8_SUFFIX`)."""
    import torch

    identity = source_identity(where, quantize)
    if identity is None:
        return None
    folder = cache_folder(identity)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".export-", dir=folder.parent))
    try:
        class LastHidden(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, input_ids, attention_mask):
                return self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

        ids = torch.ones(2, 8, dtype=torch.long)
        axes = {0: "batch", 1: "tokens"}
        with warnings.catch_warnings():  # the exporter's notes on operators it rewrites; the test checks outputs
            warnings.simplefilter("ignore")
            torch.onnx.export(LastHidden(model).eval(), (ids, torch.ones_like(ids)), str(tmp / "model.onnx"),
                              input_names=["input_ids", "attention_mask"], output_names=["hidden"],
                              dynamic_axes={"input_ids": axes, "attention_mask": axes, "hidden": axes},
                              opset_version=17, dynamo=False)
        if quantize == "int8":
            _quantize_int8(tmp / "model.onnx")
        (tmp / "encoder.json").write_text(json.dumps({**identity, "digest": digest}, indent=1) + "\n")
        if folder.exists() and cached(where, quantize) is None:
            shutil.rmtree(folder, ignore_errors=True)  # a stale or partial folder under the same key
        try:
            os.replace(tmp, folder)
        except OSError:  # another process published the same export first
            if cached(where, quantize) is None:
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def _quantize_int8(path: Path) -> None:
    """Replace the float ONNX model at ``path`` by its int8 form: the MatMul weights quantized per output
    channel (quantizing every operator per tensor lost more: cosine ~0.96 to the float embeddings on
    hand-written requests, against ~0.99), their input activations quantized at run time, one scale per call;
    the embedding tables and layer norms stay float."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out = path.with_name("model-int8.onnx")
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # it logs advice (shape inference first) on every call; nothing to act on here
    try:
        quantize_dynamic(str(path), str(out), weight_type=QuantType.QInt8, per_channel=True,
                         op_types_to_quantize=["MatMul"])
    finally:
        root.setLevel(level)
    os.replace(out, path)


def _session(ort, model: Path, options):
    """An ONNX Runtime session of ``model`` with its graph optimized once per machine and ONNX Runtime version:
    the optimized graph is saved beside it and later sessions load that with optimization off (~0.08 s instead
    of ~0.18 s, a tenth of a cold out-of-scope ``skillbank plan``; the same outputs to the bit). Saved at the
    "extended" level: the "all" level adds layout changes tied to this CPU, and a cache folder may be shared by
    machines. A saved graph that does not load is made again; a folder that cannot be written is only read."""
    saved = model.with_name(f"{model.stem}.opt-{ort.__version__}.onnx")
    if saved.is_file():
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            return ort.InferenceSession(str(saved), options, providers=["CPUExecutionProvider"]), "saved"
        except Exception:  # noqa: BLE001 - damaged or partial: optimized again below
            saved.unlink(missing_ok=True)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    if not os.access(model.parent, os.W_OK):
        return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"]), "optimized"
    with written_aside(saved) as tmp:
        options.optimized_model_filepath = tmp
        session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        os.chmod(tmp, 0o644)  # as readable as the model beside it (mkstemp makes it private)
    return session, "optimized"


class OnnxEncoder:
    """``encode(texts) -> (n, d)`` float32, L2-normalised mean-pooled last hidden states, from a cache folder."""

    def __init__(self, folder: Path, where: Path, max_length: int, batch_size: int):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        meta = json.loads((folder / "encoder.json").read_text())
        self.digest = meta["digest"]
        options = ort.SessionOptions()
        from skillbank.model.threads import told_threads

        told = told_threads()  # --threads / $SKILLBANK_THREADS / $OMP_NUM_THREADS; else onnxruntime's own choice
        if told is not None:
            options.intra_op_num_threads = told[0]
        #: "saved": the graph optimized by an earlier session was loaded; "optimized": this one optimized it
        self.session, self.graph = _session(ort, folder / "model.onnx", options)
        self.tokenizer = Tokenizer.from_file(str(where / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length)
        pad_id = self.tokenizer.token_to_id("[PAD]")
        self.tokenizer.enable_padding(pad_id=pad_id if pad_id is not None else 0,
                                      pad_token="[PAD]" if pad_id is not None else "<pad>")
        self.batch_size = batch_size
        self.dim = int(self.session.get_outputs()[0].shape[-1])

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # similar lengths share a batch
        for s in range(0, len(order), self.batch_size):
            idx = order[s:s + self.batch_size]
            enc = self.tokenizer.encode_batch([texts[i] for i in idx])
            ids = np.array([e.ids for e in enc], dtype=np.int64)  # (b, L)
            mask = np.array([e.attention_mask for e in enc], dtype=np.int64)  # (b, L)
            hidden = self.session.run(None, {"input_ids": ids, "attention_mask": mask})[0]  # (b, L, d)
            m = mask[..., None].astype(np.float32)
            pooled = (hidden * m).sum(1) / np.maximum(m.sum(1), 1.0)
            norms = np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
            out[idx] = pooled / norms
        return out
