"""The sentence encoder's ONNX Runtime form (skillbank.memory.selectors.encoder_runtime): same embeddings and
digest as the torch path, made once and cached, a stale or partial cache rebuilt, never used."""
import json

import numpy as np
import pytest

from skillbank.memory.selectors import encoder_runtime as rt
from skillbank.errors import SelectorError
from skillbank.memory.selectors.embedding import SentenceEncoder, minilm_dir

TEXTS = ["write a haiku about autumn leaves", "what's the weather in Lyon right now?",
         'translate "the meeting moved to 3 pm, bring the Q3 report" into German', "x"]

pytestmark = pytest.mark.skipif(not rt.available(), reason="onnxruntime / tokenizers not installed")


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SKILLBANK_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_onnx_path_embeds_as_the_torch_path_and_reports_the_same_digest(cache):
    torch_enc = SentenceEncoder("minilm", backend="torch")
    first = SentenceEncoder("minilm")  # exports the ONNX form (torch loaded for it), then runs it
    assert first.backend == "onnx" and rt.cached(minilm_dir()) is not None
    again = SentenceEncoder("minilm")  # from the cache: no torch model is loaded
    assert again.backend == "onnx" and again.model is None
    want = torch_enc.encode(TEXTS)
    for enc in (first, again):
        got = enc.encode(TEXTS)
        assert got.shape == want.shape and got.dtype == np.float32
        np.testing.assert_allclose(got, want, atol=1e-5)
        assert enc.digest == torch_enc.digest


def test_stale_or_partial_cache_is_rebuilt_not_used(cache):
    SentenceEncoder("minilm")
    folder = rt.cached(minilm_dir())
    meta = json.loads((folder / "encoder.json").read_text())
    (folder / "encoder.json").write_text(json.dumps({**meta, "size": meta["size"] + 1}))  # other weights
    assert rt.cached(minilm_dir()) is None
    enc = SentenceEncoder("minilm")
    assert enc.backend == "onnx" and rt.cached(minilm_dir()) == folder
    (folder / "encoder.json").unlink()  # an export cut short before its last write
    assert rt.cached(minilm_dir()) is None
    np.testing.assert_allclose(SentenceEncoder("minilm").encode(TEXTS[:1]), enc.encode(TEXTS[:1]), atol=1e-6)


def test_int8_form_is_cached_apart_embeds_close_and_reports_its_own_digest(cache):
    float_enc = SentenceEncoder("minilm")
    int8 = SentenceEncoder("minilm-int8")
    assert int8.backend == "onnx"
    folder = rt.cached(minilm_dir(), "int8")
    assert folder is not None and folder != rt.cached(minilm_dir())
    # The int8 file is the float export with 8-bit matrix weights: smaller, and not the same vectors.
    assert (folder / "model.onnx").stat().st_size < 0.8 * (rt.cached(minilm_dir()) / "model.onnx").stat().st_size
    want, got = float_enc.encode(TEXTS), int8.encode(TEXTS)
    cos = (want * got).sum(1)
    assert cos.min() > 0.97 and not np.allclose(got, want, atol=1e-3)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    # Statistics made with one form must not be scored with the other: the digests differ, by a suffix.
    assert int8.digest == float_enc.digest + rt.INT8_SUFFIX
    again = SentenceEncoder("minilm-int8")  # from its cache, with the digest it was made with
    assert again.model is None and again.digest == int8.digest
    np.testing.assert_array_equal(again.encode(TEXTS), got)
    # one scale per call over the whole batch: a text's embedding must not depend on the texts beside it
    for i, text in enumerate(TEXTS):
        np.testing.assert_array_equal(int8.encode([text])[0], got[i])
    meta = json.loads((folder / "encoder.json").read_text())
    (folder / "encoder.json").write_text(json.dumps({**meta, "quantize": None}))  # not the int8 form's record
    assert rt.cached(minilm_dir(), "int8") is None
    with pytest.raises(SelectorError, match="ONNX Runtime only"):
        SentenceEncoder("minilm-int8", backend="torch")


def test_the_optimized_graph_is_saved_once_and_gives_the_same_embeddings(cache):
    """A session optimizes the graph (~0.1 s of a cold start); the first saves the result beside the model and
    later ones load it with optimization off - the same vectors to the bit. A damaged saved graph is made again."""
    import onnxruntime as ort

    first = SentenceEncoder("minilm")
    folder = rt.cached(minilm_dir())
    saved = folder / f"model.opt-{ort.__version__}.onnx"
    assert first._onnx.graph == "optimized" and saved.is_file() and not list(folder.glob(".model.opt-*"))  # no temporary file left behind
    want = first.encode(TEXTS)
    again = SentenceEncoder("minilm")
    assert again._onnx.graph == "saved"
    np.testing.assert_array_equal(again.encode(TEXTS), want)
    saved.write_bytes(saved.read_bytes()[:1000])  # cut short
    remade = SentenceEncoder("minilm")
    assert remade._onnx.graph == "optimized" and saved.stat().st_size > 1000
    np.testing.assert_array_equal(remade.encode(TEXTS), want)
