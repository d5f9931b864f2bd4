"""The llama.cpp engine: a shard's PEFT adapter converted to llama.cpp's LoRA GGUF gives the reference path's
logits, the torch-free tokenizer gives transformers' prompt ids, banks pick their engine, and caches that are
stale or damaged are rebuilt."""
import json
import sys
import threading

from pathlib import Path

import numpy as np
import pytest

from skillbank.errors import BankError, ModelError
from skillbank.memory.bank import SkillBank
from skillbank.model.llamacpp import UnsupportedAdapter, adapter_problems, convert_lora, merge_lora

llama_cpp = pytest.importorskip("llama_cpp", reason='llama-cpp-python is not installed (pip install -e ".[fast]")')

REQUESTS = ["what's the weather in Lyon right now?", "  Translate 'où est la gare' into German\n\nthen read it aloud",
            "Resize receipt_scan.png to 800x600 and e-mail it to ana@example.com", "日本語のテキスト 😀", "x" * 80]


@pytest.fixture(scope="module")
def real_base():
    from skillbank.model.base import load_base
    return load_base(progress=False)


@pytest.fixture(scope="module")
def random_shard(real_base, tmp_path_factory):
    """A PEFT adapter on every attention projection of the real base, A and B random (a trained shard's shape)."""
    import torch
    from peft import LoraConfig

    real_base.add_adapter("rand", LoraConfig(r=8, lora_alpha=32, bias="none", task_type="CAUSAL_LM",
                                             target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for module in real_base.peft.modules():
            if hasattr(module, "lora_A") and "rand" in module.lora_A:
                for lin in (module.lora_A["rand"], module.lora_B["rand"]):
                    lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) * 0.08)
    return real_base.save_adapter("rand", tmp_path_factory.mktemp("shard") / "rand")


def _torch_logits(base, ids, adapter):
    import torch
    model = base.activate(adapter) if adapter else base.model
    with torch.inference_mode():
        if adapter:
            return model(torch.tensor([ids])).logits[0, -1].float().numpy()
        with base.peft.disable_adapter():
            return base.peft(torch.tensor([ids])).logits[0, -1].float().numpy()


@pytest.mark.real_model
def test_a_converted_adapter_gives_the_reference_logits(real_base, random_shard, tmp_path, monkeypatch):
    """llama.cpp (Q4_1 weights, 8-bit activations) with the converted LoRA lands where PEFT on the float32
    weights does: close to it next to how far the adapter moves the logits, and a conversion that leaves the
    q/k rows in PEFT's order (the classic mistake) lands several times farther."""
    import skillbank.model.llamacpp as engine
    from skillbank.model.embedded import embedded_gguf_path
    from skillbank.model.prompts import prompt_ids

    decoder = engine.LlamaCppDecoder(embedded_gguf_path(), threads=1, n_ctx=512)
    decoder.load_adapter("rand", convert_lora(random_shard, tmp_path / "rand.gguf", decoder.shape()))
    with monkeypatch.context() as m:
        m.setattr(engine, "_permute_rows", lambda w, n_head: w)
        decoder.load_adapter("unpermuted", convert_lora(random_shard, tmp_path / "unpermuted.gguf", decoder.shape()))

    def logits(adapter, ids):
        decoder._use(adapter)
        decoder._clear()
        return decoder._prefill(ids, 0, 0)

    for request in REQUESTS[:3]:
        ids = prompt_ids(real_base.tokenizer, request)
        ref, bare = _torch_logits(real_base, ids, "rand"), _torch_logits(real_base, ids, None)
        moved = np.abs(ref - bare).mean()  # what the adapter does to the logits (~11 here)
        off = np.abs(logits("rand", ids) - ref).mean()  # measured ~0.07x of it
        assert off < 0.12 * moved
        assert np.abs(logits("unpermuted", ids) - ref).mean() > 2 * off  # measured ~3x
        assert np.abs(logits(None, ids) - bare).mean() < 0.05 * moved  # the base alone: ~0.15 apart


@pytest.mark.real_model
def test_a_merged_model_gives_the_reference_logits(real_base, random_shard, tmp_path, monkeypatch):
    """The base GGUF with the update merged into its weights lands where PEFT on the float32 weights does, judged
    against two controls measured here, on this CPU's kernels, not against one CPU's figure: the runtime adapter
    (llama.cpp applying the same update as two extra products) and a merge that leaves the q/k rows in PEFT's order
    (the classic mistake). In float16 the merge lands closer to the reference than the runtime adapter does (its
    arithmetic - permutation, scaling - is right) and several times closer than the wrong merge. How far both land
    depends on the CPU: the Q4_1 matrices the update does not touch multiply 8-bit activations, and with this
    random, oversized update (it moves the logits by 8-13) that noise grows through the layers (an AVX-512 CPU
    measured the float16 merge 0.27-0.42 off, an AVX2 one 0.57). In Q8_0, what plans use, llama.cpp also rounds
    the activations the update multiplies to 8 bits: it lands within a quarter of what the update moves (measured
    up to 0.17 of it) and still closer than the wrong merge; trained shards move the logits far less and plan as the
    reference does (bench/engine_parity.py). The Q4_1 matrices the update does not touch are re-encoded as Q8_0
    (tiled batched kernels) within a twentieth of a Q4_1 step; the rest keep the base's bytes; the float16 form
    re-encodes nothing."""
    from gguf import GGUFReader

    import skillbank.model.llamacpp as engine
    from skillbank.model.embedded import embedded_gguf_path
    from skillbank.model.prompts import prompt_ids

    shape, _ = engine.read_shape(embedded_gguf_path())
    path = merge_lora(random_shard, embedded_gguf_path(), tmp_path / "merged.gguf", shape)
    merged = engine.LlamaCppDecoder(path, threads=1, n_ctx=512)
    hits = engine._read_gguf.cache_info().hits
    f16 = engine.LlamaCppDecoder(merge_lora(random_shard, embedded_gguf_path(), tmp_path / "f16.gguf", shape,
                                            weights="f16"), threads=1, n_ctx=512)
    assert engine._read_gguf.cache_info().hits == hits + 1  # the base's metadata parsed once per process (~2 s)
    with monkeypatch.context() as m:
        m.setattr(engine, "_permute_rows", lambda w, n_head: w)
        wrong = engine.LlamaCppDecoder(merge_lora(random_shard, embedded_gguf_path(), tmp_path / "wrong.gguf", shape,
                                                  weights="f16"), threads=1, n_ctx=512)
    runtime = engine.LlamaCppDecoder(embedded_gguf_path(), threads=1, n_ctx=512)
    runtime.load_adapter("rand", convert_lora(random_shard, tmp_path / "rand.gguf", shape))
    runtime._use("rand")

    def off(decoder, ids, ref):
        decoder._clear()
        return np.abs(decoder._prefill(ids, 0, 0) - ref).mean()

    total = {"runtime": 0.0, "f16": 0.0}
    for request in REQUESTS[:3]:
        ids = prompt_ids(real_base.tokenizer, request)
        ref, bare = _torch_logits(real_base, ids, "rand"), _torch_logits(real_base, ids, None)
        moved = np.abs(ref - bare).mean()
        errors = {name: off(d, ids, ref) for name, d in (("runtime", runtime), ("f16", f16), ("q8_0", merged),
                                                          ("wrong", wrong))}
        print(f"adapter moves the logits {moved:.2f}; off by", {k: round(float(v), 3) for k, v in errors.items()})
        assert errors["f16"] < errors["wrong"] / 3 and errors["q8_0"] < errors["wrong"] / 2
        assert errors["q8_0"] < 0.25 * moved
        total["runtime"] += errors["runtime"]
        total["f16"] += errors["f16"]
    assert total["f16"] < total["runtime"]
    from gguf.quants import dequantize

    base, out = GGUFReader(str(embedded_gguf_path())), GGUFReader(str(path))
    theirs = {t.name: t for t in out.tensors}
    kept = {"F32", "Q8_0"}
    for tensor in base.tensors:
        mine = theirs[tensor.name]
        if tensor.tensor_type.name in kept and not ("attn_" in tensor.name and "norm" not in tensor.name):
            assert np.array_equal(mine.data, tensor.data)  # norms, the Q8_0 embedding: the base's bytes
            continue
        assert mine.tensor_type.name == "Q8_0"  # adapted, or a Q4_1 matrix re-encoded for the tiled kernels
        if "ffn_" in tensor.name and tensor.name.startswith(("blk.0.", "blk.29.")):
            was = dequantize(tensor.data, tensor.tensor_type).reshape(-1, 32)
            now = dequantize(mine.data, mine.tensor_type).reshape(-1, 32)
            step = (was.max(1) - was.min(1)) / 15  # a Q4_1 block's step
            assert np.all(np.abs(now - was).max(1) <= 0.06 * step + 1e-7)  # measured <= 0.054
    f16_file = GGUFReader(str(tmp_path / "f16.gguf"))
    assert {t.name: t.tensor_type.name for t in f16_file.tensors}["blk.0.ffn_up.weight"] == "Q4_1"


@pytest.mark.real_model
@pytest.mark.parametrize("encoding", ["q8_0", "bf16"])
def test_the_base_re_encoded_computes_what_the_shipped_file_does(real_base, tmp_path, encoding):
    """``reencode_base`` (the latency bench's second llama.cpp reference, and what a merged model does to the
    matrices no update touches): every Q4_1 matrix becomes Q8_0 (in BF16: every quantized matrix, the Q8_0
    embedding too), the logits stay within rounding of the shipped file's (Q8_0 measured 0.13-0.39 mean where an
    adapter moves them by 8-13), the top pick the same up to a near tie."""
    from gguf import GGUFReader

    import skillbank.model.llamacpp as engine
    from skillbank.model.embedded import embedded_gguf_path
    from skillbank.model.prompts import prompt_ids

    path = engine.reencode_base(embedded_gguf_path(), tmp_path / "re.gguf", encoding)
    types = {t.name: t.tensor_type.name for t in GGUFReader(str(path)).tensors}
    assert types["blk.0.ffn_up.weight"] == types["blk.29.attn_q.weight"] == encoding.upper()
    assert types["token_embd.weight"] == encoding.upper()  # shipped as Q8_0
    assert types["blk.0.attn_norm.weight"] == "F32"
    with pytest.raises(ModelError, match="not 'f16'"):
        engine.reencode_base(embedded_gguf_path(), tmp_path / "f16.gguf", "f16")
    for request in REQUESTS[:3]:
        ids = prompt_ids(real_base.tokenizer, request)
        shipped = engine.LlamaCppDecoder(embedded_gguf_path(), threads=1, n_ctx=512)
        q8 = engine.LlamaCppDecoder(path, threads=1, n_ctx=512)
        a, b = shipped._prefill(ids, 0, 0), q8._prefill(ids, 0, 0)
        shipped.close(), q8.close()
        print(f"mean |logit difference| {np.abs(a - b).mean():.3f}")
        assert np.abs(a - b).mean() < 0.6  # measured 0.13-0.39
        # the same choice up to a near-tie (the bare base's top logits here lie within 0.04-0.4 of each other)
        assert b[int(np.argmax(a))] >= b.max() - 0.5 and a[int(np.argmax(b))] >= a.max() - 0.5


@pytest.mark.real_model
@pytest.mark.parametrize("encoding", ["q8_0", "bf16"])
def test_a_merge_patched_into_the_re_encoded_base_holds_the_rewrite_s_tensors(random_shard, tmp_path, encoding):
    """The engine makes a new shard's merged model by copying the base it re-encoded once per machine and
    replacing the adapted tensors' bytes (~0.5 s instead of ~4): every tensor equals the whole rewrite's, byte
    for byte. The tensor table read by hand agrees with gguf-py's reader; a truncated file is refused by name."""
    from gguf import GGUFReader

    import skillbank.model.llamacpp as engine
    from skillbank.model.embedded import embedded_gguf_path

    shipped = embedded_gguf_path()
    shape, _ = engine.read_shape(shipped)
    base = engine.reencode_base(shipped, tmp_path / "base.gguf", encoding)
    patched = merge_lora(random_shard, shipped, tmp_path / "patched.gguf", shape, encoding, reencoded=base)
    whole = {t.name: t for t in GGUFReader(str(merge_lora(random_shard, shipped, tmp_path / "whole.gguf",
                                                            shape, encoding))).tensors}
    assert whole["blk.0.attn_q.weight"].tensor_type.name == encoding.upper()
    other = engine.reencode_base(shipped, tmp_path / "other.gguf", "bf16" if encoding == "q8_0" else "q8_0")
    assert engine._patch(shipped, other, tmp_path / "no.gguf", engine._lora_updates(random_shard, shape),
                         encoding) is None  # a base re-encoded otherwise is not patched: the merge rewrites
    spans = engine.gguf_spans(patched)
    tensors = GGUFReader(str(patched)).tensors
    assert len(tensors) == len(spans) == len(whole)
    for t in tensors:
        assert (spans[t.name].offset, spans[t.name].nbytes) == (t.data_offset, t.n_bytes)
        assert np.array_equal(t.data, whole[t.name].data), t.name
    before = {t.name: t for t in GGUFReader(str(base)).tensors}
    assert not np.array_equal(before["blk.0.attn_q.weight"].data, whole["blk.0.attn_q.weight"].data)

    cut = tmp_path / "cut.gguf"
    cut.write_bytes(Path(base).read_bytes()[:len(Path(base).read_bytes()) // 2])
    with pytest.raises(ModelError, match="cut.gguf ends inside tensor"):
        engine.gguf_spans(cut)
    with pytest.raises(ModelError, match="not a GGUF"):
        engine.gguf_spans(random_shard / "adapter_config.json")


@pytest.mark.real_model
def test_the_update_a_loaded_model_computes_with_is_the_saved_shard_s(real_base, random_shard, tmp_path):
    """What the harness merges to evaluate a method's state on llama.cpp: the active adapters of the live model.
    One adapter: exactly the saved shard's update. Two active (Progressive-LoRA's sum): A stacked, B side by side,
    so B·A is the sum of both. Adapters disabled (a frozen-base reference): no update."""
    import torch
    from peft import LoraConfig

    import skillbank.model.llamacpp as engine
    from skillbank.model.embedded import embedded_gguf_path

    shape, _ = engine.read_shape(embedded_gguf_path())
    saved = engine._lora_updates(random_shard, shape)
    live = engine.peft_updates(real_base.activate("rand"), shape)
    assert sorted(live) == sorted(saved)
    for name in saved:
        assert all(np.array_equal(x, y) for x, y in zip(live[name], saved[name])), name
    assert engine.updates_digest(live) == engine.updates_digest(saved)

    real_base.add_adapter("second", LoraConfig(r=4, lora_alpha=16, bias="none", task_type="CAUSAL_LM",
                                               target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for module in real_base.peft.modules():
            if hasattr(module, "lora_B") and "second" in module.lora_B:
                module.lora_B["second"].weight.normal_(0, 0.05)
    second = engine._lora_updates(real_base.save_adapter("second", tmp_path / "second"), shape)
    both = engine.peft_updates(real_base.activate(["rand", "second"]), shape)
    assert sorted(both) == sorted(saved)
    for name, (a, b) in both.items():
        expected = saved[name][1] @ saved[name][0]
        if name in second:
            expected = expected + second[name][1] @ second[name][0]
        assert np.allclose(b @ a, expected, atol=1e-5), name
    with real_base.peft.disable_adapter():
        assert engine.peft_updates(real_base.peft, shape) == {}
    real_base.remove_adapter("second")


@pytest.mark.real_model
def test_the_harness_llama_cpp_engine_decodes_a_state_as_its_merged_model_does(real_base, random_shard, tmp_path):
    """LlamaCppOutputs (``[eval] engine = "llama.cpp"``) generates a state's outputs from its live model: the
    same tokens as the shard's merged model decoding each prompt alone; under a grammar every output parses; the
    bare base (adapters disabled) decodes with the re-encoded base. Another base is refused by name."""
    from skillbank.config import ConfigError
    from skillbank.continual.engines import LlamaCppOutputs
    from skillbank.data.builtin import build_builtin_catalog
    from skillbank.memory.execution_llamacpp import reencoded_base_path
    from skillbank.model.constrain import SkillSpec, build_grammar
    from skillbank.model.embedded import embedded_gguf_path
    from skillbank.model.llamacpp import LlamaCppDecoder, merge_lora, read_shape
    from skillbank.model.prompts import render_prompt, stop_token_ids
    from skillbank.model.serialization import decode_output

    engine = LlamaCppOutputs(real_base.identity, threads=1)
    prompts = [render_prompt(real_base.tokenizer, r) for r in REQUESTS[:3]]
    outs = engine.generate(real_base.activate("rand"), real_base.tokenizer, prompts, grammars=[None] * 3,
                           batch_size=2, max_new_tokens=12)
    assert engine.merges == 1 and not list(engine.scratch.iterdir())  # merged, loaded, and the file removed
    shape, _ = read_shape(embedded_gguf_path())
    merged = LlamaCppDecoder(merge_lora(random_shard, embedded_gguf_path(), tmp_path / "m.gguf", shape,
                                        engine.encoding,  # the batched one: BF16 on CPUs with BF16 dot products
                                        reencoded=reencoded_base_path(real_base.identity["digest"], engine.encoding)),
                             threads=1, n_ctx=1024)
    stops = set(stop_token_ids(real_base.tokenizer))
    for prompt, out in zip(prompts, outs):
        alone = merged.decode(real_base.tokenizer(prompt, add_special_tokens=False)["input_ids"], None, 12, stops)
        body = alone.tokens[:-1] if alone.stopped else alone.tokens
        assert out.text == real_base.tokenizer.decode(body, skip_special_tokens=True).strip()
        assert out.n_tokens == len(alone.tokens) and out.stopped == alone.stopped

    catalog = build_builtin_catalog()
    skills = list(catalog.skills)[:4]
    grammar = build_grammar([SkillSpec(s, catalog.skills[s].argument_names) for s in skills], "compact", "")
    with real_base.peft.disable_adapter():
        bare = engine.generate(real_base.peft, real_base.tokenizer, prompts, grammars=[grammar] * 3, batch_size=4,
                               max_new_tokens=96)
    assert engine.merges == 1  # the bare base is the re-encoded file itself
    for out in bare:
        if out.stopped:
            assert decode_output(out.text, "compact", "", stopped=True).error is None
    engine.close()
    assert not engine.scratch.exists()
    with pytest.raises(ConfigError, match="embedded GGUF model only"):
        LlamaCppOutputs({"name": "some/other-model", "digest": "sha256:x"})


@pytest.mark.real_model
def test_the_light_tokenizer_is_transformers_tokenizer(real_base):
    from skillbank.model.embedded import embedded_tokenizer_dir
    from skillbank.model.light_tokenizer import LightTokenizer
    from skillbank.model.prompts import prompt_ids, stop_token_ids

    light, hf = LightTokenizer(embedded_tokenizer_dir()), real_base.tokenizer
    for request in REQUESTS:
        for system in ("", "You are a task-automation planner. Reply with the task graph only."):
            assert prompt_ids(light, request, system) == prompt_ids(hf, request, system)
    assert stop_token_ids(light) == stop_token_ids(hf) and len(light) == len(hf)
    ids = prompt_ids(hf, REQUESTS[1]) + [2]
    assert light.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True)


@pytest.mark.real_model
def test_a_batch_decodes_every_prompt_as_alone(real_base):
    """decode_many with 2 rows for 5 prompts (the common head shared): one row stops early, so the next prompt
    joins while the other row is still decoding - and every prompt gets the tokens it gets decoded alone, also
    when the tails of rows joining together are packed into passes too short for one.
    (A joining row's prefill overwrote the live rows' logits once: 2 of 5 matched.)"""
    from skillbank.model.embedded import embedded_gguf_path
    from skillbank.model.llamacpp import LlamaCppDecoder
    from skillbank.model.prompts import prompt_ids, stop_token_ids

    decoder = LlamaCppDecoder(embedded_gguf_path(), threads=1, n_ctx=1024, width=4)
    prompts = [prompt_ids(real_base.tokenizer, r) for r in REQUESTS]
    stops = set(stop_token_ids(real_base.tokenizer))
    stops.add(decoder.decode(prompts[0], None, 16, stops).tokens[2])  # the first prompt now stops at its 3rd token
    alone = [decoder.decode(p, None, 16, stops) for p in prompts]
    assert len(alone[0].tokens) == 3 and all(len(s.tokens) > 3 for s in alone[1:])
    many = decoder.decode_many(prompts, None, 16, stops, width=2)
    assert [s.tokens for s in many] == [s.tokens for s in alone]
    assert [s.stopped for s in many] == [s.stopped for s in alone]
    # Rows joining together are prefilled in shared passes: with passes of 7 tokens, tails span two or three
    # passes and a pass holds the end of one tail and the start of the next.
    packed = LlamaCppDecoder(embedded_gguf_path(), threads=1, n_ctx=1024, n_batch=7, width=4)
    assert [s.tokens for s in packed.decode_many(prompts, None, 16, stops, width=4)] == [s.tokens for s in alone]


@pytest.mark.real_model
def test_a_base_s_shape_is_read_once_and_kept_in_the_cache(tmp_path, monkeypatch):
    """read_shape asks llama.cpp once per file (its whole vocabulary is read); later calls read the cache, and
    an entry written by another version of BaseShape is read again."""
    import skillbank.model.llamacpp as engine
    from skillbank.model.embedded import embedded_gguf_path

    monkeypatch.setenv("SKILLBANK_CACHE", str(tmp_path))
    asked = engine._read_shape(embedded_gguf_path())
    assert engine.read_shape(embedded_gguf_path()) == asked
    monkeypatch.setattr(engine, "_read_shape", lambda path: pytest.fail("llama.cpp asked again"))
    assert engine.read_shape(embedded_gguf_path()) == asked
    memo = tmp_path / "llamacpp" / "shapes.json"
    memo.write_text(json.dumps({k: {"shape": {"arch": "llama"}, "n_vocab": 1}
                                for k in json.loads(memo.read_text())}))
    monkeypatch.setattr(engine, "_read_shape", lambda path: asked)
    assert engine.read_shape(embedded_gguf_path()) == asked


@pytest.mark.real_model
def test_a_decoder_s_context_grows_when_a_prompt_or_a_batch_needs_it(real_base):
    """A decoder first makes a context a lone plan fits (cheaper to allocate), and the full one when a prompt's
    generation budget or a batch needs more: the tokens are those of a context made at the size it grew to."""
    from skillbank.model.embedded import embedded_gguf_path
    from skillbank.model.llamacpp import FIRST_CONTEXT, LlamaCppDecoder
    from skillbank.model.prompts import prompt_ids, stop_token_ids

    prompts = [prompt_ids(real_base.tokenizer, r) for r in REQUESTS[:3]]
    stops = set(stop_token_ids(real_base.tokenizer))
    full = 2 * FIRST_CONTEXT
    decoder = LlamaCppDecoder(embedded_gguf_path(), threads=1, n_ctx=full, width=4)
    assert decoder.n_ctx == FIRST_CONTEXT
    first = decoder.decode(prompts[0], None, 12, stops)
    assert decoder.n_ctx == FIRST_CONTEXT
    budget = FIRST_CONTEXT - len(prompts[0]) + 1  # one token more than the first context holds
    grown = decoder.decode(prompts[0], None, budget, stops)
    assert decoder.n_ctx == full
    assert grown.tokens[:len(first.tokens)] == first.tokens
    with pytest.raises(ModelError, match="exceed the context"):
        decoder.decode(prompts[0], None, full, stops)
    batched = LlamaCppDecoder(embedded_gguf_path(), threads=1, n_ctx=full, width=4)
    many = batched.decode_many(prompts, None, 12, stops, width=4)
    assert batched.n_ctx == full
    small = LlamaCppDecoder(embedded_gguf_path(), threads=1, n_ctx=1024, width=4)  # a context never grown
    assert [s.tokens for s in many] == [s.tokens for s in small.decode_many(prompts, None, 12, stops, width=4)]


@pytest.mark.real_model
def test_rows_that_join_a_running_batch_or_wait_for_room_decode_as_alone(real_base):
    """Continuous batching (the service's llama.cpp engine): prompts fed in while rows decode join them, with
    caps of their own, and are reported the moment they end; in a context too small for every row at once,
    a row waits for another to give its cells back (rows overflowing the context failed the whole batch)."""
    from skillbank.model.embedded import embedded_gguf_path
    from skillbank.model.llamacpp import LlamaCppDecoder
    from skillbank.model.prompts import prompt_ids, stop_token_ids

    stops = set(stop_token_ids(real_base.tokenizer))
    prompts = [prompt_ids(real_base.tokenizer, r) for r in REQUESTS]
    caps = [12, 5, 12, 8, 12]
    decoder = LlamaCppDecoder(embedded_gguf_path(), threads=1, n_ctx=1024, width=4)
    alone = [decoder.decode(p, None, c, stops).tokens for p, c in zip(prompts, caps)]

    pending, done, steps = [(p, None, c) for p, c in zip(prompts[1:], caps[1:])], [], []

    def feed():  # one more prompt every second step
        return [pending.pop(0)] if pending and len(steps) % 2 == 0 else []

    out = decoder.decode_many(prompts[:1], None, caps[:1], stops, width=3, feed=feed,
                              on_done=lambda i, step: done.append(i), on_step=steps.append,
                              head_hint=prompt_ids(real_base.tokenizer, "-"))
    assert [s.tokens for s in out] == alone
    assert sorted(done) == list(range(5)) and max(steps) <= 3 and max(steps) >= 2

    longest = max(len(p) for p in prompts) + 12
    tight = LlamaCppDecoder(embedded_gguf_path(), threads=1, n_ctx=longest + 8, width=4)  # about one row at a time
    assert [s.tokens for s in tight.decode_many(prompts, None, caps, stops)] == alone


@pytest.mark.real_model
def test_drafts_the_grammar_forces_keep_the_greedy_output_in_fewer_passes(real_base):
    """Each pass also checks the tokens the row's grammar forces next (the rest of a skill name, a key): kept
    only where the greedy pick equals them, so a plan is the one decoded a token a pass - alone and in a batch,
    with about the same log-probability - in fewer forward passes."""
    from skillbank.model.constrain import GrammarCache, SkillSpec, build_grammar
    from skillbank.model.embedded import embedded_gguf_path, embedded_tokenizer_dir
    from skillbank.model.light_tokenizer import LightTokenizer
    from skillbank.model.llamacpp import LlamaCppDecoder
    from skillbank.model.prompts import prompt_ids, stop_token_ids

    tokenizer = LightTokenizer(embedded_tokenizer_dir())
    stops = set(stop_token_ids(tokenizer))
    decoder = LlamaCppDecoder(embedded_gguf_path(), threads=1, n_ctx=1024, width=4)
    grammars = GrammarCache(tokenizer, stops, decoder.n_vocab)
    grammar = build_grammar([SkillSpec("Demo::get_weather", ("city", "date")),
                             SkillSpec("Demo::send_sms", ("content", "phone_number")),
                             SkillSpec("Demo::set_alarm", ("time",))], "compact", "Demo::")
    prompts = [prompt_ids(tokenizer, r) for r in REQUESTS]
    bitmask = np.full((1, (decoder.n_vocab + 31) // 32), -1, dtype=np.int32)
    passes = [0]
    real_run = decoder._run

    def counted(entries):
        passes[0] += 1
        return real_run(entries)

    decoder._run = counted

    def run(fed: int, many: bool):
        decoder.draft_fed, passes[0] = fed, 0
        matchers = [grammars.matcher(grammar) for _ in prompts]
        if many:
            steps = decoder.decode_many(prompts, None, 40, stops, matchers, bitmask, width=2)
        else:
            steps = [decoder.decode(p, None, 40, stops, m, bitmask) for p, m in zip(prompts, matchers)]
        return [(s.tokens, s.stopped) for s in steps], [s.logprob for s in steps], passes[0]

    for many in (False, True):
        plain, plain_lp, plain_passes = run(1, many)
        drafted, drafted_lp, drafted_passes = run(24, many)
        # llama.cpp's kernels for a pass of several tokens round differently from one token's: the sums of
        # log-probabilities agree to ~1%, the greedy picks exactly
        assert drafted == plain and drafted_lp == pytest.approx(plain_lp, rel=0.02)
        assert drafted_passes < 0.9 * plain_passes, (drafted_passes, plain_passes)  # prefills counted too
        assert sum(len(t) for t, _ in plain) > 8 * len(prompts)  # plans, not stops at the first token


def test_adapters_llama_cpp_cannot_apply_exactly_are_named(tmp_path):
    assert adapter_problems({"peft_type": "LORA", "target_modules": ["q_proj", "v_proj"]}) == []
    problems = adapter_problems({"use_dora": True, "bias": "all", "target_modules": ["q_proj", "lm_head"]})
    assert any("use_dora" in p for p in problems) and any("bias" in p for p in problems)
    assert any("lm_head" in p for p in problems)
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "use_dora": True,
                                                              "target_modules": ["q_proj"]}))
    with pytest.raises(UnsupportedAdapter, match=f"{tmp_path}.*use_dora"):
        convert_lora(tmp_path, tmp_path / "out.gguf", None)
    assert not (tmp_path / "out.gguf").exists()


def _own_llamacpp_cache(tmp_path, monkeypatch) -> None:
    """llama.cpp's forms made in a cache of the test's own (the embedded model's conversion, the encoder, the
    encodings timed on this machine and the rest shared with the machine's)."""
    from skillbank.cache import cache_root

    cache = tmp_path / "cache"
    cache.mkdir()
    (cache_root() / "machine").mkdir(parents=True, exist_ok=True)  # the encodings timed here: shared, timed once
    if cache_root().is_dir():
        for item in cache_root().iterdir():
            if item.name != "llamacpp":
                (cache / item.name).symlink_to(item)
    monkeypatch.setenv("SKILLBANK_CACHE", str(cache))


@pytest.mark.real_model
def test_a_bank_on_the_embedded_base_plans_with_llama_cpp(real_base, small_stream, tmp_path, monkeypatch):
    """learn with torch, plan with llama.cpp: the base is re-encoded once into the cache and the merged model
    patched from it, both reused by the next process; a damaged cached file (merged model or base) is made again
    instead of used; the runtime-adapter route plans too."""
    from skillbank.memory.execution_llamacpp import LlamaCppExecution
    from skillbank.train.executor import TrainConfig, top_layers

    _own_llamacpp_cache(tmp_path, monkeypatch)

    key = "t4_vision_document"
    bank = SkillBank.create(tmp_path / "bank", base=real_base)
    cfg = TrainConfig(epochs=1, batch_size=2, rank=4, dropout=0.0, target_format="compact",
                      layers_to_transform=top_layers(real_base.num_layers, 2), target_modules=("q_proj", "v_proj"))
    bank.learn(key, small_stream.train[key][:2], cfg, skills=small_stream.catalog.family(key).skills, progress=False)
    request = small_stream.test[key][0].request

    opened = SkillBank.open(tmp_path / "bank", engine="llama.cpp")
    [plan] = opened.plan([request], max_new_tokens=12, scope=False)
    engine = opened.engine
    assert isinstance(engine, LlamaCppExecution) and opened._execution is None  # torch never loaded
    assert plan.shard == key and plan.tokens > 0 and (plan.graph is None) == (plan.error is not None)
    assert engine.conversions == 2  # the base re-encoded (once per machine), then the shard patched into it
    [cached] = [p for p in engine.merged_cache().glob("*.gguf") if p.stem == engine.loaded[(key, "q8_0")]]
    assert cached.name.endswith("-q8_0.gguf")  # one row a pass: the Q8_0 model

    again = SkillBank.open(tmp_path / "bank", engine="llama.cpp")
    assert again.plan([request], max_new_tokens=12, scope=False)[0].raw == plan.raw
    assert again.engine.conversions == 0

    cached.write_bytes(cached.read_bytes()[:1000])  # a cut-off file under the final name
    damaged = SkillBank.open(tmp_path / "bank", engine="llama.cpp")
    assert damaged.plan([request], max_new_tokens=12, scope=False)[0].raw == plan.raw
    assert damaged.engine.conversions == 1 and cached.stat().st_size > 1000
    base = damaged.engine.base_file()
    base.write_bytes(base.read_bytes()[:5000])  # the re-encoded base cut off too
    cached.unlink()
    rebuilt = SkillBank.open(tmp_path / "bank", engine="llama.cpp")
    assert rebuilt.plan([request], max_new_tokens=12, scope=False)[0].raw == plan.raw
    assert rebuilt.engine.conversions == 2 and base.stat().st_size > 5000

    from skillbank.memory.execution_llamacpp import LlamaCppExecution
    runtime = LlamaCppExecution(tmp_path / "bank", lambda: damaged.manifest, reference=lambda: None, merge=False)
    [out] = runtime.generate([request], [key], max_new_tokens=12, constrain=True)
    assert out.shard == key and out.n_tokens > 0 and not runtime.merged
    assert any(p.stem == runtime.loaded[(key, "q8_0")] for p in runtime.adapter_cache().glob("*.gguf"))
    from gguf import GGUFReader  # the runtime route's base: the shipped file re-encoded in Q8_0, cached
    from skillbank.model.llamacpp import CONVERTER_VERSION
    base_file = runtime.base_cache() / f"{runtime.base_digest[:32]}-v{CONVERTER_VERSION}-q8_0.gguf"
    assert {t.name: t.tensor_type.name for t in GGUFReader(str(base_file)).tensors}["blk.0.ffn_up.weight"] == "Q8_0"


@pytest.mark.real_model
def test_a_shard_decodes_one_row_in_q8_0_and_batches_in_the_batched_encoding(small_stream, tmp_path, monkeypatch):
    """A lone request plans with the shard merged as Q8_0, a batch of the shard's requests with the shard merged in
    the batched encoding (BF16 here, forced so that any CPU runs it): two merged models of one shard, each patched
    from the base re-encoded the same way, both loaded (how alike their plans are is measured on the demo bank:
    scripts/llamacpp_encodings.py --parity). A relearned shard drops both."""
    import skillbank.memory.execution_llamacpp as execution
    from gguf import GGUFReader

    from skillbank.model.base import load_base
    from skillbank.train.executor import TrainConfig, top_layers

    real_base = load_base(progress=False)  # its own: it relearns a family the module's shared base holds
    _own_llamacpp_cache(tmp_path, monkeypatch)
    monkeypatch.setattr(execution, "encoding_for", lambda rows, threads=None: "bf16" if rows > 1 else "q8_0")
    key = "t2_language_speech"
    bank = SkillBank.create(tmp_path / "bank", base=real_base)
    cfg = TrainConfig(epochs=1, batch_size=2, rank=4, dropout=0.0, target_format="compact",
                      layers_to_transform=top_layers(real_base.num_layers, 2), target_modules=("q_proj", "v_proj"))
    bank.learn(key, small_stream.train[key][:2], cfg, skills=small_stream.catalog.family(key).skills, progress=False)
    requests = [r.request for r in small_stream.test[key][:3]]

    opened = SkillBank.open(tmp_path / "bank", engine="llama.cpp")
    engine = opened.engine
    alone = engine.generate(requests[:1], [key], max_new_tokens=12)
    together = engine.generate(requests, [key] * 3, max_new_tokens=12, batch_size=4)
    assert sorted(engine.loaded) == [(key, "bf16"), (key, "q8_0")]
    assert engine.conversions == 4  # each encoding's base, then the shard patched into each
    for encoding, kind in (("q8_0", "Q8_0"), ("bf16", "BF16")):
        path = engine.merged_cache() / f"{engine.loaded[(key, encoding)]}.gguf"
        types = {t.name: t.tensor_type.name for t in GGUFReader(str(path)).tensors}
        assert types["blk.29.attn_q.weight"] == types["blk.0.ffn_up.weight"] == kind  # adapted / re-encoded
        assert types["token_embd.weight"] == ("Q8_0" if encoding == "q8_0" else "BF16")
    assert alone[0].n_tokens > 0 and all(o.n_tokens > 0 and o.shard == key for o in together)

    again = engine.generate(requests[:1], [key], max_new_tokens=12)  # the loaded Q8_0 model again
    assert again[0].text == alone[0].text and engine.conversions == 4
    old = engine.loaded[(key, "q8_0")]
    opened.relearn(key, small_stream.train[key][2:4], cfg, progress=False)
    engine.generate(requests[:1], [key], max_new_tokens=12)
    assert list(engine.loaded) == [(key, "q8_0")] and engine.loaded[(key, "q8_0")] != old


@pytest.mark.real_model
def test_shards_of_one_batch_decode_side_by_side_as_one_after_another(real_base, small_stream, tmp_path, monkeypatch):
    """A batch routed to two shards decodes the two groups in two lanes, a thread each: the same plans as one
    group after the other; a lane's model is never unloaded while it decodes, even beyond the resident limit,
    which holds again once the lanes are done."""
    from skillbank.memory.execution_llamacpp import LlamaCppExecution
    from skillbank.train.executor import TrainConfig, top_layers

    bank = SkillBank.create(tmp_path / "bank", base=real_base)
    cfg = TrainConfig(epochs=1, batch_size=2, rank=4, dropout=0.0, target_format="compact",
                      layers_to_transform=top_layers(real_base.num_layers, 2), target_modules=("q_proj", "v_proj"))
    families = ["t3_retrieval_understanding", "t5_generation_editing"]  # not learned into real_base by the others
    for key in families:
        bank.learn(key, small_stream.train[key][:2], cfg, skills=small_stream.catalog.family(key).skills,
                   progress=False)
    requests = [r.request for key in families for r in small_stream.test[key][:2]]
    shards = [key for key in families for _ in range(2)]

    def plans(lanes: str) -> tuple[list[str], int]:
        monkeypatch.setenv("SKILLBANK_LANES", lanes)
        engine = LlamaCppExecution(tmp_path / "bank", lambda: bank.manifest, reference=lambda: None, threads=2,
                                   merged_resident=1)
        most = [0]
        real_acquire = engine._acquire

        def acquire(*args):
            out = real_acquire(*args)
            most[0] = max(most[0], len(engine.loaded))
            return out

        engine._acquire = acquire
        if lanes != "1":  # each lane holds its model until the other has loaded its own
            both, real_release = threading.Barrier(2), engine._release
            engine._release = lambda *args: (both.wait(timeout=120), real_release(*args))
        outs = engine.generate(requests, shards, batch_size=4, max_new_tokens=16)
        assert len(engine.loaded) == 1 and not engine._in_use
        return [o.text for o in outs], most[0]

    one_by_one, most = plans("1")
    assert most == 1
    side_by_side, most = plans("")
    assert side_by_side == one_by_one and most == 2

    monkeypatch.setenv("SKILLBANK_LANES", "two")
    engine = LlamaCppExecution(tmp_path / "bank", lambda: bank.manifest, reference=lambda: None, threads=2)
    with pytest.raises(BankError, match="SKILLBANK_LANES='two'"):
        engine.generate(requests, shards, max_new_tokens=4)


@pytest.mark.real_model
def test_the_service_plans_with_llama_cpp_as_the_bank_does(real_base, small_stream, tmp_path):
    """`skillbank serve` picks the llama.cpp engine for a bank on the embedded base: torch is never loaded for
    it; requests of two shards in one call come back as ``SkillBank.plan`` writes them, and from concurrent
    clients (rows joining running batches, shards taking turns) routed the same and answered."""
    from concurrent.futures import ThreadPoolExecutor

    from fastapi.testclient import TestClient

    from skillbank.serve.app import create_app
    from skillbank.serve.config import ServeConfig
    from skillbank.train.executor import TrainConfig, top_layers

    keys = small_stream.family_keys[:2]
    bank = SkillBank.create(tmp_path / "bank", base=real_base)
    cfg = TrainConfig(epochs=1, batch_size=2, rank=4, dropout=0.0, target_format="compact",
                      layers_to_transform=top_layers(real_base.num_layers, 2), target_modules=("q_proj", "v_proj"))
    for key in keys:
        bank.learn(key, small_stream.train[key][:2], cfg, skills=small_stream.catalog.family(key).skills,
                   progress=False)
    requests = [small_stream.test[k][i].request for i in range(3) for k in keys]
    expected = SkillBank.open(tmp_path / "bank", engine="llama.cpp").plan(requests, max_new_tokens=10, scope=False)
    expected = [(p.shard, p.raw) for p in expected]

    app = create_app(tmp_path / "bank", ServeConfig(max_new_tokens=10, scope=False))
    service = app.state.service
    with TestClient(app) as client:
        assert client.get("/healthz").json()["engine"] == "llama.cpp"
        plans = client.post("/v1/plan", json={"request": requests}).json()["plans"]
        with ThreadPoolExecutor(len(requests)) as pool:
            answers = list(pool.map(lambda r: client.post("/v1/plan", json={"request": r}).json()["plans"][0],
                                    requests))
        # The service lets rows join a running batch one by one where SkillBank.plan prefills a shard's rows
        # together, and concurrent clients change which rows share a step; llama.cpp's kernels are not
        # bit-identical across batch sizes, so a near-tie of these barely trained shards (two records each) may
        # pick another token. The routing and the answering are exact; the text mostly is.
        for got in (plans, answers):
            assert [a["shard"] for a in got] == [shard for shard, _ in expected]
            assert all(a["tokens"] > 0 for a in got)
            assert sum(a["raw"] == raw for a, (_, raw) in zip(got, expected)) >= len(expected) // 2
    assert service.snapshot.bank._execution is None and service._reference is None  # torch never loaded


def test_the_merged_cache_keeps_the_most_recently_used_within_its_budget(tmp_path):
    import os

    from skillbank.memory.execution_llamacpp import _trim_cache
    files = []
    for i in range(5):
        path = tmp_path / f"{i}.gguf"
        path.write_bytes(b"x" * 100)
        os.utime(path, (1000 + i, 1000 + i))
        files.append(path)
    os.utime(files[0], (2000, 2000))  # used last
    _trim_cache(tmp_path, 250, keep=files[1])
    assert sorted(p.name for p in tmp_path.glob("*.gguf")) == ["0.gguf", "1.gguf"]


def test_banks_on_other_bases_plan_with_torch(tmp_path, tiny_model_dir, small_stream):
    from skillbank.memory.execution import ExecutionMemory
    from skillbank.memory.execution_llamacpp import EngineUnavailable
    from skillbank.model.base import BaseModelConfig, load_base
    from skillbank.train.executor import TrainConfig

    key = small_stream.family_keys[0]
    bank = SkillBank.create(tmp_path / "bank", base=load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False))
    bank.learn(key, small_stream.train[key], TrainConfig(epochs=1, batch_size=3, target_format="compact"),
               skills=small_stream.catalog.family(key).skills, progress=False)
    assert isinstance(SkillBank.open(tmp_path / "bank").engine, ExecutionMemory)
    with pytest.raises(EngineUnavailable, match="not the embedded GGUF model"):
        SkillBank.open(tmp_path / "bank", engine="llama.cpp").plan(["a request"], scope=False, max_new_tokens=2)
    with pytest.raises(BankError, match="unknown engine 'vllm'"):
        SkillBank.open(tmp_path / "bank", engine="vllm")
    from skillbank.serve.config import ServeConfig
    from skillbank.serve.service import serve_engine
    assert serve_engine(tmp_path / "bank", ServeConfig()) == "torch"  # auto
    with pytest.raises(EngineUnavailable, match="not the embedded GGUF model"):
        serve_engine(tmp_path / "bank", ServeConfig(engine="llama.cpp"))


def test_planning_with_llama_cpp_imports_no_torch(tmp_path):
    """What a cold `skillbank plan` on the llama.cpp path imports: not torch, transformers or PEFT."""
    import subprocess
    code = ("import sys; import skillbank.cli, skillbank.memory.bank, skillbank.memory.execution_llamacpp, "
            "skillbank.model.light_tokenizer, skillbank.model.constrain, skillbank.planner; "
            "print(sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.real_model
def test_the_harness_evaluates_every_state_with_llama_cpp(tmp_path):
    """A run on the embedded base with ``[eval] engine = "llama.cpp"``: FSM's shards and Progressive-LoRA's summed
    adapters are evaluated through llama.cpp, the run records the engine, its outputs are cached under keys of that
    engine, and resuming it on the other engine is refused before anything loads."""
    from skillbank.config import ConfigError, RunConfig
    from skillbank.continual.runner import run
    from skillbank.model.llamacpp import encoding_for

    raw = {"name": "engine", "methods": ["fsm", "progressive-routed"],
           "stream": {"source": "builtin", "train_per_family": 4, "test_per_family": 2},
           "base": {"name": "embedded"},
           "train": {"epochs": 1, "batch_size": 4, "rank": 4, "alpha": 8, "target_format": "compact", "dropout": 0.0},
           "eval": {"orders": ["T1,T2"], "max_new_tokens": 24, "batch_size": 4, "engine": "llama.cpp"}}
    record = run(RunConfig.from_dict(raw), tmp_path / "run", progress=False, report=False)
    saved = json.loads((tmp_path / "run" / "config.json").read_text())["eval"]
    assert saved["engine"] == "llama.cpp" and saved["llamacpp_encoding"] == encoding_for(16)  # resolved, recorded
    for method in ("fsm", "progressive-routed"):
        result = record["methods"][method]["T1,T2"]
        assert result["timing"]["generated_this_run"] > 0
        rows = [json.loads(line) for line in
                (tmp_path / "run" / "methods" / method / "outputs.jsonl").read_text().splitlines()]
        assert len(rows) == result["timing"]["generated_this_run"]
        assert all(0 < r["n_tokens"] <= 24 for r in rows)
    with pytest.raises(ConfigError, match="differs in: eval"):
        run(RunConfig.from_dict({**raw, "eval": {**raw["eval"], "engine": "torch"}}), tmp_path / "run",
            progress=False, report=False)
