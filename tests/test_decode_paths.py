"""The decoder's fast paths write exactly what the reference path writes.

The reference is PEFT's own LoRA forward, transformers' concatenating ``DynamicCache`` and a prompt prefix
prefilled by every call; the fast paths are the one-shard LoRA forward (``decode._lean_forward``), the cache
that appends in place (``decode.growing_cache``) and a prefix store kept across calls (``prefixes=``).
"""
from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import torch

from skillbank.model.base import BaseModelConfig, load_base
from skillbank.model.generate import generate
from skillbank.model.prompts import render_prompt

decode = importlib.import_module("skillbank.model.decode")  # the package exports a function named decode

PARAPHRASES = Path(__file__).parent / "fixtures" / "paraphrase_builtin.jsonl"
RAW = ["book a flight to Paris", "translate this letter into German", "9 9 9 hello", "zebra",
       "what is the weather in Lisbon tomorrow", "Ana"]


def _add(base, name: str, seed: int, std: float, **kw) -> None:
    """A LoRA adapter with random A and B (PEFT starts B at zero: no update at all)."""
    from peft import LoraConfig

    base.add_adapter(name, LoraConfig(bias="none", task_type="CAUSAL_LM", **kw))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in base.peft.modules():
            if hasattr(module, "lora_A") and name in module.lora_A:
                for lin in (module.lora_A[name], module.lora_B[name]):
                    lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) * std)


@pytest.fixture(scope="module")
def loud(tiny_model_dir):
    """Two shards whose updates change the tiny random model's greedy picks."""
    base = load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False)
    _add(base, "north", 0, 0.5, r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    _add(base, "south", 1, 0.5, r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.1)
    base.activate("north")
    return base


def _reference(monkeypatch) -> None:
    """Switch the fast paths off: PEFT's forward, transformers' own cache, a whole mask for every constrained pick."""
    from transformers import DynamicCache

    monkeypatch.setattr(decode, "_lean_layers", lambda *a: [])
    monkeypatch.setattr(decode, "growing_cache", DynamicCache)
    monkeypatch.setattr(decode, "_allows", lambda *a: False)


def _grammar():
    from skillbank.model.constrain import SkillSpec, build_grammar

    specs = [SkillSpec("Demo::get_weather", ("city", "date")), SkillSpec("Demo::send_sms", ("content", "phone_number")),
             SkillSpec("Demo::set_alarm", ("time",))]
    return build_grammar(specs, "compact", "Demo::")


def _outputs(model, tok, prompts, **kw) -> list[tuple]:
    return [(g.text, g.n_tokens, g.stopped, g.mean_logprob) for g in generate(model, tok, prompts, **kw)]


def _alone(model, tok, prompts, **kw) -> list[tuple]:
    return [_outputs(model, tok, [p], batch_size=1, **kw)[0] for p in prompts]


@pytest.mark.parametrize("shard", ["north", "south"])
def test_fast_paths_decode_exactly_as_the_reference(loud, monkeypatch, shard):
    tok = loud.tokenizer
    model = loud.activate(shard)
    prompts = [render_prompt(tok, r) for r in RAW[:4]] + RAW[4:]
    assert decode._lean_layers(model, shard)  # the fast forward is taken for these adapters
    store = decode.PrefixKV()
    fast_alone = _alone(model, tok, prompts, max_new_tokens=12, prefixes=store)
    assert store.entries  # the store was seeded, and the later calls read it
    fast_batch = _outputs(model, tok, prompts, batch_size=4, max_new_tokens=12, prefixes=store)
    with monkeypatch.context() as m:
        _reference(m)
        ref_alone = _alone(model, tok, prompts, max_new_tokens=12)
        ref_batch = _outputs(model, tok, prompts, batch_size=4, max_new_tokens=12)
    # The same text, token count and stop. Log-probabilities agree to float32 rounding: a prefix kept from an
    # earlier call is cut to what the prompts share, so the rest of a prompt is prefilled in another split.
    for fast, ref in ((fast_alone, ref_alone), (fast_batch, ref_batch)):
        assert [o[:3] for o in fast] == [o[:3] for o in ref]
        assert [o[3] for o in fast] == pytest.approx([o[3] for o in ref], abs=1e-5)
    assert len({o[0] for o in fast_alone}) > 1


def test_constrained_picks_are_those_of_the_whole_mask(loud, monkeypatch):
    """A constrained row keeps its free pick when its grammar allows that token (asked for that one token) and
    takes the masked arg-max otherwise: the same outputs as masking every step."""
    tok = loud.tokenizer
    model = loud.activate("north")
    prompts = [render_prompt(tok, r) for r in RAW]
    grammar = _grammar()
    asked = []
    real = decode._allows
    monkeypatch.setattr(decode, "_allows", lambda m, t: asked.append(real(m, t)) or asked[-1])
    fast = _outputs(model, tok, prompts, batch_size=3, max_new_tokens=16, grammars=[grammar] * len(prompts))
    monkeypatch.undo()
    with monkeypatch.context() as m:
        _reference(m)
        ref = _outputs(model, tok, prompts, batch_size=3, max_new_tokens=16, grammars=[grammar] * len(prompts))
    assert [o[:3] for o in fast] == [o[:3] for o in ref]
    assert [o[3] for o in fast] == pytest.approx([o[3] for o in ref], abs=1e-5)
    assert True in asked and False in asked  # both ways were taken


def test_fast_paths_match_transformers_generate(loud):
    """Each prompt alone, by the fast paths, writes the tokens of transformers' greedy ``generate``."""
    from skillbank.model.prompts import stop_token_ids

    tok = loud.tokenizer
    model = loud.activate("north")
    stops = stop_token_ids(tok, model)
    for raw in RAW:
        ids = torch.tensor([tok(raw, add_special_tokens=False)["input_ids"]])
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=10,
                                 eos_token_id=stops, pad_token_id=stops[0])
        new = out[0, ids.shape[1]:].tolist()
        stop_at = next((k for k, t in enumerate(new) if t in stops), None)
        text = tok.decode(new[:stop_at] if stop_at is not None else new, skip_special_tokens=True).strip()
        mine = generate(model, tok, [raw], max_new_tokens=10)[0]
        assert (mine.text, mine.n_tokens) == (text, stop_at + 1 if stop_at is not None else len(new))


def test_lean_forward_steps_aside_where_it_would_not_be_exact(loud):
    model = loud.activate("south")
    model.train()  # live dropout: PEFT's own forward must run
    try:
        layer, forward, _ = decode._lean_layers(model, "south")[0]
        x = torch.randn(2, 3, layer.in_features)
        torch.manual_seed(0)
        a = forward(x)
        torch.manual_seed(0)
        assert torch.equal(a, type(layer).forward(layer, x))
    finally:
        loud.activate("north")
    with loud.peft.disable_adapter():  # adapters off: the bare base layer
        layer, forward, _ = decode._lean_layers(loud.peft, "north")[0]
        x = torch.randn(1, 2, layer.in_features)
        assert torch.equal(forward(x), layer.base_layer(x))
    loud.activate(["north", "south"])  # two adapters active at once: not lean
    assert decode._lean_layers(loud.peft, "north") == []
    loud.activate("north")


def test_growing_cache_holds_what_concatenation_holds():
    from transformers import DynamicCache

    cache, plain = decode.growing_cache(), DynamicCache()
    rows = 3
    for step in range(40):
        k, v = torch.randn(rows, 2, 1 if step else 5, 4), torch.randn(rows, 2, 1 if step else 5, 4)
        keys, values = cache.update(k, v, 0)
        assert all(torch.equal(a, b) for a, b in zip((keys, values), plain.update(k, v, 0)))
        if step == 10:  # rows selected, as RowBatch does when one stops
            for c in (cache, plain):
                c.batch_select_indices(torch.tensor([0, 2, 1]))
        if step == 20:  # rows selected and columns trimmed from outside
            for layer in (cache.layers[0], plain.layers[0]):
                layer.keys, layer.values = layer.keys[[0, 2], :, 2:], layer.values[[0, 2], :, 2:]
            rows = 2
        if step == 30:
            for c in (cache, plain):
                c.batch_select_indices(torch.tensor([1]))
            rows = 1
    assert cache.get_seq_length() == plain.get_seq_length() == 5 + 39 - 2
    assert torch.equal(cache.layers[0].keys, plain.layers[0].keys)


def test_a_kept_prefix_is_dropped_when_its_adapter_is_loaded_again(loud):
    from skillbank.memory.execution import ExecutionMemory

    memory = ExecutionMemory(loud)
    first, old = memory.prefixes("north"), memory.prefixes("south")
    assert memory.prefixes("north") is first and old is not first
    loud.remove_adapter("south")
    _add(loud, "south", 1, 0.5, r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.1)
    loud.activate("north")
    again = memory.prefixes("south")
    assert again is not old and memory.prefixes("south") is again and memory.prefixes("north") is first


@pytest.mark.real_model
def test_real_model_fast_paths_decode_exactly_as_the_reference(monkeypatch):
    """SmolLM2-135M with a random LoRA on every attention projection, hand-written requests: the same plans."""
    base = load_base(progress=False)
    _add(base, "shard", 0, 0.02, r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    tok = base.tokenizer
    requests = [json.loads(line)["request"] for line in PARAPHRASES.read_text().splitlines()[:3]]
    prompts = [render_prompt(tok, r) for r in requests]
    store = decode.PrefixKV()
    fast = _alone(base.peft, tok, prompts, max_new_tokens=24, prefixes=store)
    fast_batch = _outputs(base.peft, tok, prompts, batch_size=3, max_new_tokens=24, prefixes=store)
    grammars = [_grammar()] * len(prompts)
    constrained = _outputs(base.peft, tok, prompts, batch_size=3, max_new_tokens=24, prefixes=store, grammars=grammars)
    with monkeypatch.context() as m:
        _reference(m)
        ref = _alone(base.peft, tok, prompts, max_new_tokens=24)
        ref_constrained = _outputs(base.peft, tok, prompts, batch_size=3, max_new_tokens=24, grammars=grammars)
    for mine, theirs in ((fast, ref), (fast_batch, ref), (constrained, ref_constrained)):
        assert [o[:3] for o in mine] == [o[:3] for o in theirs]
        assert [o[3] for o in mine] == pytest.approx([o[3] for o in theirs], abs=1e-5)


def test_a_long_lived_batch_follows_an_adapter_loaded_again(loud):
    """A batch kept across requests (the service's) takes an adapter removed and added again under the same
    name as the new one: its one-shard forward is rebuilt, never run on the old weights."""
    tok = loud.tokenizer
    batch = decode.RowBatch(loud.peft, tok, loud, reuse_prefixes=False)

    def run() -> str:
        batch.add([RAW[0]], [0], ["north"], [8])
        done = []
        while batch.rows:
            done += batch.step()
        return done[0][1].text

    before = run()
    old = batch._lean["north"][0][2]
    loud.activate("south")  # not the adapter being removed
    loud.remove_adapter("north")
    _add(loud, "north", 7, 0.5, r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    after = run()
    assert batch._lean["north"][0][2] is not old
    fresh = generate(loud.activate("north"), tok, [RAW[0]], max_new_tokens=8)[0].text
    assert after == fresh and after != before
    loud.activate("south")
    loud.remove_adapter("north")  # leave the fixture's adapter as it was
    _add(loud, "north", 0, 0.5, r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    loud.activate("north")


def test_a_plan_row_keeps_its_text_token_by_token(loud):
    """A constrained row's text grows by each token's bytes (not decoded again whole at every node end), and is
    exactly the decode of its tokens; the nodes it has seen are the plan's."""
    from skillbank.model.constrain import SkillSpec, build_grammar, grammar_cache

    tok = loud.tokenizer
    specs = [SkillSpec("Demo::get_weather", ("city", "date")), SkillSpec("Demo::send_sms", ("content",))]
    grammar = build_grammar(specs, "json", "Demo::")
    text = ('{"task_nodes":[{"task":"Demo::get_weather","arguments":[{"name":"city","value":"Oslo → Bergen"}]},'
            '{"task":"Demo::send_sms","arguments":[{"name":"content","value":"<node-0>"}]}],'
            '"task_links":[{"source":"Demo::get_weather","target":"Demo::send_sms"}]}')
    cache = grammar_cache(loud.peft, tok)
    row = cache.matcher(grammar)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert all(row.consume(t) for t in ids), row.error
    assert bytes(row.text) == cache.decode(ids) == text.encode()
    assert row.nodes == ("Demo::get_weather", "Demo::send_sms")
