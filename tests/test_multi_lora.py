"""The gathered multi-LoRA path (skillbank.model.multi_lora) gives what PEFT's per-adapter path gives."""
from __future__ import annotations

import logging

import pytest
import torch

from skillbank.errors import ModelError
from skillbank.model.base import BaseModelConfig, load_base
from skillbank.model.decode import RowBatch, left_pad
from skillbank.model.generate import generate
from skillbank.model.multi_lora import BASE, StackedLoRA, UnsupportedLoRA
from skillbank.model.prompts import encode_text, render_prompt

ATTN = ["q_proj", "k_proj", "v_proj", "o_proj"]
# Shards unlike each other in every way the stack has to absorb: rank (padded to the largest), scale (rsLoRA),
# target modules, layers, dropout (off at inference).
SHARDS = {
    "north": dict(r=4, lora_alpha=8, target_modules=ATTN),
    "south": dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], use_rslora=True, lora_dropout=0.1),
    "east": dict(r=16, lora_alpha=32, target_modules=ATTN, layers_to_transform=[1]),
    "west": dict(r=2, lora_alpha=4, target_modules=ATTN + ["gate_proj", "up_proj", "down_proj"]),
}
REQUESTS = ["book a flight to Paris", "translate this letter into German", "what is the weather in Lisbon",
            "summarise the report", "find a cheap hotel near the station", "9 9 9 hello", "convert 3 miles to km"]


def _randomize(base, name: str, seed: int, std: float) -> None:
    """PEFT starts B at zero (no update at all): give the adapter's A and B random weights."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in base.peft.modules():
            if hasattr(module, "lora_A") and name in module.lora_A:
                for lin in (module.lora_A[name], module.lora_B[name]):
                    lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) * std)


def _add(base, name: str, seed: int, std: float = 0.08, **kw) -> None:
    from peft import LoraConfig

    base.add_adapter(name, LoraConfig(bias="none", task_type="CAUSAL_LM", **kw))
    _randomize(base, name, seed, std)


def _with_shards(tiny_model_dir, std: float):
    base = load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False)
    for seed, (name, kw) in enumerate(SHARDS.items()):
        _add(base, name, seed, std, **kw)
    base.activate("north")
    return base


@pytest.fixture(scope="module")
def shards(tiny_model_dir):
    """Small updates: logits move by ~1 but stay in float32 reach of each other across the two paths."""
    return _with_shards(tiny_model_dir, 0.08)


@pytest.fixture(scope="module")
def loud(tiny_model_dir):
    """Updates big enough to change the tiny random model's greedy picks (it writes one token over and over
    otherwise); its logits then differ across the two paths by float32 rounding of ~1e-3, not by more."""
    return _with_shards(tiny_model_dir, 0.5)


def _batch(base, n: int):
    tok = base.tokenizer
    ids, mask = left_pad([encode_text(tok, render_prompt(tok, r)) for r in REQUESTS[:n]], tok.pad_token_id)
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


@torch.inference_mode()
def _logits(base, ids, mask, pos, names, path: str) -> torch.Tensor:
    """Logits of every position of a padded batch whose rows use ``names``, by ``path``."""
    if path == "peft":
        return base.peft(input_ids=ids, attention_mask=mask, position_ids=pos, adapter_names=names).logits
    with base.stacked_lora().applied(names):
        return base.peft(input_ids=ids, attention_mask=mask, position_ids=pos).logits


def test_gathered_logits_equal_the_per_adapter_path(shards):
    names = ["north", "south", "east", "west", BASE, "south", "north"]
    ids, mask, pos = _batch(shards, len(names))
    peft = _logits(shards, ids, mask, pos, names, "peft")
    gathered = _logits(shards, ids, mask, pos, names, "gathered")
    real = mask.bool()
    # The tiny random model's logits are ~75 in size, where one float32 step is 7.6e-6: PEFT multiplies each
    # shard's rows as a smaller matrix, which the CPU kernel sums in another order, so allow a few such steps.
    torch.testing.assert_close(gathered[real], peft[real], rtol=1e-6, atol=1e-5)
    # every shard changes its rows (the comparison above is not between two bare bases), and only its rows
    with torch.inference_mode(), shards.peft.disable_adapter():
        bare = shards.peft(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    for i, name in enumerate(names):
        moved = (gathered[i][real[i]] - bare[i][real[i]]).abs().max().item()
        assert (moved == 0) if name == BASE else (moved > 1e-2), (name, moved)
    # a row alone with its shard active (the plain one-adapter forward) agrees too
    for i, name in enumerate(names[:4]):
        n = int(mask[i].sum())
        with torch.inference_mode():
            shards.activate(name)
            alone = shards.peft(input_ids=ids[i:i + 1, -n:]).logits[0]
        torch.testing.assert_close(gathered[i, -n:], alone, rtol=0, atol=1e-4)


def test_gathered_is_exact_in_float64(tiny_model_dir):
    """In float64 the rounding of the kernels vanishes: the two paths compute the same numbers."""
    base = _with_shards(tiny_model_dir, 0.5)
    base.peft.double()
    names = ["west", "east", BASE, "north", "south"]
    ids, mask, pos = _batch(base, len(names))
    torch.testing.assert_close(_logits(base, ids, mask, pos, names, "gathered"),
                               _logits(base, ids, mask, pos, names, "peft"), rtol=0, atol=1e-10)


def _decode(base, prompts, names, path: str, cap: int = 12) -> dict:
    """Greedy tokens per row through a RowBatch, half the rows joining after two steps (slots refill)."""
    batch = RowBatch(base.peft, base.tokenizer, base, lora=path)
    half = len(prompts) // 2
    batch.add(prompts[:half], list(range(half)), names[:half], [cap] * half)
    done = {}
    for _ in range(2):
        done.update((row.key, (row.tokens, d.text)) for row, d in batch.step())
    batch.add(prompts[half:], list(range(half, len(prompts))), names[half:], [cap] * (len(prompts) - half))
    while batch.rows:
        done.update((row.key, (row.tokens, d.text)) for row, d in batch.step())
    return done


def test_row_batch_greedy_decodes_are_identical(loud):
    shards, tok = loud, loud.tokenizer
    prompts = [render_prompt(tok, r) for r in REQUESTS] * 2
    names = [list(SHARDS)[i % len(SHARDS)] for i in range(len(prompts))]
    names[3] = BASE
    peft, gathered = (_decode(shards, prompts, names, path) for path in ("peft", "gathered"))
    assert gathered == peft
    assert len({tuple(gathered[i][0]) for i in range(4)}) == 4  # the shards write different things
    # generate() passes the option through, and each row equals its shard decoding alone
    outs = generate(shards.peft, tok, prompts[:5], batch_size=5, max_new_tokens=12, adapter_names=names[:5],
                    base=shards, lora="gathered")
    for i in range(5):
        alone = generate(shards.peft, tok, [prompts[i]], batch_size=1, max_new_tokens=12, adapter_names=[names[i]],
                         base=shards)[0]
        assert (alone.text, alone.n_tokens) == (outs[i].text, outs[i].n_tokens)
        assert alone.mean_logprob == pytest.approx(outs[i].mean_logprob, abs=1e-5)


def test_unnamed_rows_run_the_active_adapter(shards):
    ids, mask, pos = _batch(shards, 3)
    shards.activate("east")
    with torch.inference_mode():
        batch = RowBatch(shards.peft, shards.tokenizer, shards)
        got = batch._forward(None, ids, mask, pos, [None, "north", None])
    want = _logits(shards, ids, mask, pos, ["east", "north", "east"], "peft")[:, -1]
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
    with torch.inference_mode():  # without a LoadedBase the batch stacks the PeftModel's shards itself
        alone = RowBatch(shards.peft, shards.tokenizer, lora="gathered")
        torch.testing.assert_close(alone._forward(None, ids, mask, pos, ["east", "north", "east"]), want,
                                   rtol=1e-6, atol=1e-5)
    assert alone._stacked is not None and alone._stacked is not shards._stacked
    shards.activate(["north", "south"])
    try:
        with pytest.raises(ModelError, match="name every row's adapter"), torch.inference_mode():
            batch._forward(None, ids, mask, pos, [None, "north", None])
    finally:
        shards.activate("north")


def test_the_stack_follows_weight_and_adapter_changes(shards):
    names = ["north", "west", "south"]
    ids, mask, pos = _batch(shards, 3)
    stack = shards.stacked_lora()
    assert shards.stacked_lora() is stack and stack.names == tuple(SHARDS)
    before = _logits(shards, ids, mask, pos, names, "gathered")
    with torch.no_grad():  # an in-place edit (what an optimizer step does) of one shard's weights
        for module in shards.peft.modules():
            if hasattr(module, "lora_B") and "west" in module.lora_B:
                module.lora_B["west"].weight.mul_(-2)
    after = _logits(shards, ids, mask, pos, names, "gathered")
    assert shards.stacked_lora() is stack  # refreshed in place, not rebuilt
    assert not torch.allclose(after[1], before[1]) and torch.equal(after[0], before[0])
    torch.testing.assert_close(after, _logits(shards, ids, mask, pos, names, "peft"), rtol=1e-6, atol=1e-5)

    # An adapter that fits the stacks (its layers stacked, its rank within theirs) is copied into a slot; the
    # others are not copied again. One that does not fit (rank 6 where the stacks hold 4) rebuilds them.
    copies = stack.copies
    _add(shards, "fifth", 9, r=2, lora_alpha=6, target_modules=["k_proj", "o_proj"])
    try:
        names = ["fifth", "north", "fifth"]
        torch.testing.assert_close(_logits(shards, ids, mask, pos, names, "gathered"),
                                   _logits(shards, ids, mask, pos, names, "peft"), rtol=1e-6, atol=1e-5)
        assert shards.stacked_lora() is stack and stack.copies == copies + 1
        assert stack.names == tuple(SHARDS) + ("fifth",) and stack.capacity == 8  # grown by doubling
        _add(shards, "sixth", 10, r=6, lora_alpha=6, target_modules=["k_proj", "o_proj"])
        try:
            names = ["sixth", "fifth", "west"]
            torch.testing.assert_close(_logits(shards, ids, mask, pos, names, "gathered"),
                                       _logits(shards, ids, mask, pos, names, "peft"), rtol=1e-6, atol=1e-5)
            assert shards.stacked_lora() is not stack
        finally:
            shards.activate("north")
            shards.remove_adapter("sixth")
    finally:
        shards.activate("north")
        shards.remove_adapter("fifth")
    stack = shards.stacked_lora()
    assert stack.names == tuple(SHARDS) and stack.current()
    with pytest.raises(ModelError, match="no adapter named 'fifth'"):
        stack.slots(["north", "fifth"])


def test_evict_and_load_reuses_a_slot_and_decodes_the_same(tiny_model_dir):
    """A bank with max_resident shards evicts one and loads another: the freed slot takes the new adapter,
    zeroed first (the old one had a larger rank and more layers), nothing else is copied, and a batch mixing
    the new adapter with the others gives PEFT's logits."""
    base = _with_shards(tiny_model_dir, 0.08)
    ids, mask, pos = _batch(base, 4)
    stack = base.stacked_lora()
    copies, nbytes = stack.copies, stack.nbytes
    base.remove_adapter("east")  # rank 16: its slot's columns past the new adapter's rank must not linger
    _add(base, "late", 11, r=4, lora_alpha=8, target_modules=ATTN)
    names = ["late", "north", "south", "west"]
    torch.testing.assert_close(_logits(base, ids, mask, pos, names, "gathered"),
                               _logits(base, ids, mask, pos, names, "peft"), rtol=1e-6, atol=1e-5)
    assert base.stacked_lora() is stack and stack.copies == copies + 1 and stack.nbytes == nbytes
    assert stack.slot["late"] == 3 and set(stack.names) == {"north", "south", "west", "late"}


def test_what_the_gathered_path_cannot_do_is_refused(tiny_model_dir, caplog):
    base = load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False)
    _add(base, "plain", 0, r=4, lora_alpha=8, target_modules=ATTN, lora_dropout=0.1)
    _add(base, "dora", 1, r=4, lora_alpha=8, target_modules=ATTN, use_dora=True)
    with pytest.raises(UnsupportedLoRA, match="LoRA variant"):
        StackedLoRA(base.peft)
    ids, mask, pos = _batch(base, 2)
    with torch.inference_mode():
        strict = RowBatch(base.peft, base.tokenizer, base, lora="gathered")
        with pytest.raises(UnsupportedLoRA, match="DoRA"):
            strict._forward(None, ids, mask, pos, ["plain", "dora"])
        # "auto" says why and takes PEFT's path, which refuses DoRA in a mixed batch by itself
        auto = RowBatch(base.peft, base.tokenizer, base)
        with caplog.at_level(logging.WARNING, logger="skillbank.model"), pytest.raises(ValueError, match="DoRA"):
            auto._forward(None, ids, mask, pos, ["plain", "dora"])
    assert "per-adapter path" in caplog.text and "LoRA variant" in caplog.text

    base.activate("plain")
    base.remove_adapter("dora")
    stack = base.stacked_lora()
    base.peft.train()  # dropout on the LoRA input is random per row in training: only PEFT's path applies it
    try:
        with pytest.raises(UnsupportedLoRA, match="training mode"), stack.applied(["plain", BASE]):
            pass
    finally:
        base.peft.eval()
    with pytest.raises(ModelError, match="lora must be one of"):
        RowBatch(base.peft, base.tokenizer, base, lora="fast")
