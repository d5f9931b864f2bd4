"""Shards load on first use, at most ``max_resident`` stay loaded, and a reloaded shard decodes the same."""
import shutil

import pytest

from skillbank.errors import BankError
from skillbank.memory.bank import SkillBank
from skillbank.model.base import BaseModelConfig, load_base
from skillbank.train.executor import TrainConfig

CFG = TrainConfig(epochs=1, batch_size=3, target_format="compact", seed=0)
MAX_NEW = 8


@pytest.fixture()
def three_shard_bank(tmp_path, tiny_model_dir, small_stream):
    base = load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False)
    bank = SkillBank.create(tmp_path / "bank", base=base)
    for k in small_stream.family_keys[:3]:
        bank.learn(k, small_stream.train[k], CFG, catalog=small_stream.catalog, progress=False)
    return tmp_path / "bank"


def fresh(tiny_model_dir):
    return load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False)


def test_open_loads_nothing_and_lru_keeps_outputs(three_shard_bank, tiny_model_dir, small_stream):
    keys = small_stream.family_keys[:3]
    requests = [r.request for k in keys for r in small_stream.test[k]][:6]
    unbounded = SkillBank.open(three_shard_bank, base=fresh(tiny_model_dir))
    assert unbounded.execution.resident == {} and unbounded.execution.base.adapter_names == []
    want = {k: [p.raw for p in unbounded.plan(requests, shard=k, max_new_tokens=MAX_NEW)] for k in keys}
    assert list(unbounded.execution.resident) == keys and unbounded.execution.loads == 3

    bounded = SkillBank.open(three_shard_bank, base=fresh(tiny_model_dir), max_resident=1)
    # two rounds over the three shards: every use after the first evicts, so every shard is reloaded
    for _ in range(2):
        for k in keys:
            got = [p.raw for p in bounded.plan(requests, shard=k, max_new_tokens=MAX_NEW)]
            assert got == want[k]
            assert list(bounded.execution.resident) == [k] and bounded.execution.base.adapter_names == [k]
    assert bounded.execution.loads == 6
    # routed plans (several shards in one call) decode group by group within the bound
    routed = bounded.plan(requests, max_new_tokens=MAX_NEW, scope=False)
    assert len(bounded.execution.resident) == 1
    assert [p.raw for p in routed] == [p.raw for p in unbounded.plan(requests, max_new_tokens=MAX_NEW, scope=False)]


def test_a_shard_broken_after_open_fails_alone(three_shard_bank, tiny_model_dir, small_stream):
    k1, k2, k3 = small_stream.family_keys[:3]
    bank = SkillBank.open(three_shard_bank, base=fresh(tiny_model_dir))
    shutil.rmtree(three_shard_bank / bank._entry(k2).dir)
    weights = three_shard_bank / bank._entry(k3).dir / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(BankError, match=f"shard '{k2}' is missing"):
        bank.plan(["x"], shard=k2, max_new_tokens=MAX_NEW)
    with pytest.raises(BankError, match=f"shard '{k3}'.*does not match its digest"):
        bank.plan(["x"], shard=k3, max_new_tokens=MAX_NEW)
    assert bank.plan(["x"], shard=k1, max_new_tokens=MAX_NEW)[0].shard == k1  # the others keep working


def test_max_resident_bad_values(three_shard_bank, tiny_model_dir):
    for bad in (0, -1):
        with pytest.raises(BankError, match="max_resident must be"):
            SkillBank.open(three_shard_bank, base=fresh(tiny_model_dir), max_resident=bad)
    with pytest.raises(BankError, match="larger than the bank's 3 shard"):
        SkillBank.open(three_shard_bank, base=fresh(tiny_model_dir), max_resident=4)


def test_grammar_caches_are_bounded(three_shard_bank, tiny_model_dir, small_stream, monkeypatch):
    """A long-running service decodes with ever more shards: the grammars it keeps built (per shard, and
    compiled per tokenizer) stay bounded, and one rebuilt after eviction is the same grammar."""
    import skillbank.memory.execution as execution
    import skillbank.serve.state as state
    from skillbank.model.constrain import grammar_cache

    keys = small_stream.family_keys[:3]
    monkeypatch.setattr(execution, "GRAMMARS_KEPT", 2)
    monkeypatch.setattr(state, "GRAMMARS_KEPT", 2)
    bank = SkillBank.open(three_shard_bank, base=fresh(tiny_model_dir))
    first = bank.execution.grammar(keys[0]).digest
    for k in keys[1:]:
        bank.execution.grammar(k)
    assert len(bank.execution._grammars) == 2 and (keys[0], None) not in bank.execution._grammars
    assert bank.execution.grammar(keys[0]).digest == first

    snapshot = state.Snapshot(bank=bank)
    for k in keys:
        snapshot.grammar(k)
    assert list(snapshot.grammars) == keys[1:]

    cache = grammar_cache(bank.execution.base.peft, bank.execution.base.tokenizer)
    monkeypatch.setattr(cache, "max_compiled", 2)
    for k in keys:
        cache.compile(bank.execution.grammar(k))
    assert len(cache._compiled) == 2 and set(cache.compile_seconds) == set(cache._compiled)
    cache.matcher(bank.execution.grammar(keys[0]))  # an evicted grammar compiles again on demand


def test_grammar_bounds_follow_max_resident(three_shard_bank, tiny_model_dir, small_stream, monkeypatch):
    """Under max_resident the kept and compiled grammars are sized from it, not from the bank, so a process
    cycling through every shard of a large bank keeps flat grammar memory (decoding still works)."""
    import skillbank.memory.execution as execution
    from skillbank.serve.state import open_snapshot

    keys = small_stream.family_keys[:3]
    monkeypatch.setattr(execution, "MIN_GRAMMARS_KEPT", 1)
    monkeypatch.setattr(execution, "COMPILED_PER_SHARD", 2)
    bank = SkillBank.open(three_shard_bank, base=fresh(tiny_model_dir), max_resident=1)
    for k in keys:
        out = bank.execution.generate([small_stream.test[k][0].request], [k], max_new_tokens=MAX_NEW)
        assert out[0].constrained
        assert len(bank.execution._grammars) == 1 and list(bank.execution.resident) == [k]
        cache = bank.execution.grammar_cache()
        assert cache.max_compiled == 2 and len(cache._compiled) <= 2
    cache.limit(100)  # the bound is never raised by a looser caller
    assert cache.max_compiled == 2
    with pytest.raises(Exception, match="max_compiled"):
        cache.limit(0)
    snapshot = open_snapshot(three_shard_bank, base=fresh(tiny_model_dir), max_resident=1)
    assert snapshot.grammars.maxsize == 1
    assert open_snapshot(three_shard_bank, base=fresh(tiny_model_dir)).grammars.maxsize == execution.GRAMMARS_KEPT
