"""Executors that start from a shard the bank holds (``learn(init=...)``), the lineage the manifest records, and
forgetting, relearning and importing that stay exact with it. Tiny random model: these test the mechanics (the
copy, the bookkeeping), not whether a warm start learns better."""
import json

import numpy as np
import pytest
import torch

from skillbank.errors import BankError, ModelError
from skillbank.memory.bank import SkillBank, bank_info
from skillbank.memory.shard_files import dir_digests
from skillbank.model.base import BaseModelConfig, load_base
from skillbank.train import executor
from skillbank.train.executor import TrainConfig, add_lora, copy_lora, lora_tensors

CFG = TrainConfig(epochs=1, batch_size=3, target_format="compact", seed=0)
OFF_DOMAIN = ["what is the capital of France?", "tell me a joke about penguins"]


@pytest.fixture()
def base(tiny_model_dir):
    return load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False)


@pytest.fixture()
def other_base(tiny_model_dir):
    return load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False)


def learn(bank, stream, key, cfg=CFG, **kw):
    kw.setdefault("init", "fresh")  # each test names the start it is about
    return bank.learn(key, stream.train[key], cfg, catalog=stream.catalog, progress=False, **kw)


def weights(bank, name):
    return {k: v.detach().clone() for k, v in lora_tensors(bank.execution.base.peft, name).items()}


def address_state(bank, requests):
    return (bank.address.classes_, bank.address.predict_proba(requests), bank.scope.score(requests),
            bank.scope.threshold_)


def assert_same_address(a, b, requests):
    for got, want in zip(address_state(a, requests), address_state(b, requests)):
        if isinstance(got, list):
            assert got == want
        else:
            np.testing.assert_allclose(got, want)


@pytest.fixture()
def spy_fit(monkeypatch):
    """Records the trained adapter's LoRA tensors as each training starts."""
    starts = {}
    real_fit = executor.fit

    def fit(base, examples, cfg, *, adapter, **kw):
        starts[adapter] = {k: v.detach().clone() for k, v in lora_tensors(base.peft, adapter).items()}
        return real_fit(base, examples, cfg, adapter=adapter, **kw)

    monkeypatch.setattr(executor, "fit", fit)
    return starts


def test_a_new_shard_starts_from_the_named_shards_weights(tmp_path, base, small_stream, spy_fit):
    k1, k2, k3 = small_stream.family_keys[:3]
    bank = SkillBank.create(tmp_path / "bank", base=base)
    first = learn(bank, small_stream, k1)
    source = weights(bank, k1)
    entry = learn(bank, small_stream, k2, init=f"shard:{k1}")
    # before training the new adapter's LoRA A and B are the start's, after they are not
    assert spy_fit[k2].keys() == source.keys() and any(".lora_B." in k for k in source)
    assert all(torch.equal(spy_fit[k2][k], source[k]) for k in source)
    trained = weights(bank, k2)
    assert any(not torch.equal(trained[k], source[k]) for k in source)
    assert all(torch.equal(weights(bank, k1)[k], source[k]) for k in source)  # the start itself is untouched
    assert first.lineage == {"init": "fresh"}
    assert entry.lineage == {"init": "shard", "from": k1, "digest": first.digests["adapter_model.safetensors"],
                             "by": "name"}
    # a fresh start is not the start shard's weights (what banks did before)
    learn(bank, small_stream, k3)
    assert not all(torch.equal(spy_fit[k3][k], source[k]) for k in source)
    # recorded on disk and shown
    shards = {s["name"]: s for s in bank_info(tmp_path / "bank")["shards"]}
    assert shards[k1]["lineage"] == {"init": "fresh"} and shards[k3]["lineage"] == {"init": "fresh"}
    assert shards[k2]["lineage"]["from"] == k1 and shards[k2]["lineage"]["start_current"] is True
    assert SkillBank.open_offline(tmp_path / "bank")._entry(k2).lineage == entry.lineage


def test_a_warm_start_trains_warm_epochs_and_keeps_the_whole_recipe(tmp_path, base, small_stream):
    """warm_epochs counts the passes of a shard that starts from earlier learning; a fresh shard keeps epochs,
    and a relearn from scratch reads the recorded recipe, not the warm one."""
    k1, k2, k3 = small_stream.family_keys[:3]
    cfg = TrainConfig(epochs=2, warm_epochs=1, batch_size=3, target_format="compact", seed=0)
    bank = SkillBank.create(tmp_path / "bank", base=base)
    fresh = learn(bank, small_stream, k1, cfg).training
    warm = learn(bank, small_stream, k2, cfg, init="previous").training
    per_epoch = -(-len(small_stream.train[k2]) // cfg.batch_size)
    assert (fresh["epochs"], warm["epochs"]) == (2, 1)
    assert warm["steps"] == per_epoch and fresh["steps"] == 2 * -(-len(small_stream.train[k1]) // cfg.batch_size)
    assert warm["config"]["epochs"] == 2 and warm["config"]["warm_epochs"] == 1
    again = bank.relearn(k2, small_stream.train[k2], catalog=small_stream.catalog, progress=False, init="fresh")
    assert again.training["epochs"] == 2  # fresh: the recorded recipe's epochs, not the warm ones it trained
    default = bank.learn(k3, small_stream.train[k3], cfg, catalog=small_stream.catalog, progress=False)
    assert default.lineage["init"] == "merge" and default.training["epochs"] == 1  # the default start is warm
    with pytest.raises(ModelError, match="warm_epochs"):
        TrainConfig(warm_epochs=0)


def test_previous_and_nearest_choose_their_start(tmp_path, base, small_stream, spy_fit):
    k1, k2, k3, k4 = small_stream.family_keys[:4]
    bank = SkillBank.create(tmp_path / "bank", base=base)
    assert learn(bank, small_stream, k1, init="previous").lineage == {"init": "fresh"}  # nothing to start from
    learn(bank, small_stream, k2)
    prev = learn(bank, small_stream, k3, init="previous")
    assert prev.lineage["from"] == k2 and prev.lineage["by"] == "previous"
    assert all(torch.equal(spy_fit[k3][k], v) for k, v in weights(bank, k2).items())
    # nearest: the shard the Address Memory sends most of the new family's own requests to
    routed, _ = bank.route([r.request for r in small_stream.train[k4]])
    votes = {name: routed.count(name) for name in bank.shard_names}
    near = learn(bank, small_stream, k4, init="nearest")
    assert near.lineage["by"] == "nearest" and votes[near.lineage["from"]] == max(votes.values())
    assert near.lineage["share"] == pytest.approx(max(votes.values()) / len(routed), abs=1e-4)


def test_the_neutral_start_teaches_the_shards_target_format():
    """The start's targets are what a one-family shard writes (bare skill names); trained with one prefix over
    twenty families (its first version) they spelled out each synthetic family instead."""
    from skillbank.memory import neutral
    from skillbank.model.serialization import encode
    from skillbank.predictions import family_prefixes
    from skillbank.train.executor import common_prefix

    records = neutral.neutral_records()
    prefixes = family_prefixes(records)
    assert len(prefixes) == neutral.NEUTRAL_FAMILIES
    assert all(p.startswith("Synthetic::syn") and p.endswith("::") for p in prefixes.values())
    targets = [encode(r.graph, "compact", prefixes[r.family]) for r in records]
    assert not any("::" in t for t in targets)
    one_prefix = common_prefix(sorted({t for r in records for t in r.graph.tasks}))
    assert all("::" in encode(r.graph, "compact", one_prefix) for r in records)  # what version 1 trained


def test_the_neutral_start_is_built_once_and_ties_no_shard(tmp_path, base, tiny_model_dir, small_stream, spy_fit,
                                                           monkeypatch):
    """init="neutral": an adapter trained on invented (synthetic) families, built on first use into the cache
    and reused; shards start from its weights, their lineage names its digest, and no shard descends from
    another (forget takes one family alone); an exported shard imports into a bank that never built it."""
    from skillbank.memory import neutral
    from skillbank.memory.lineage import start_text
    from skillbank.memory.shard_files import file_digest
    from skillbank.predictions import family_prefixes

    monkeypatch.setenv("SKILLBANK_CACHE", str(tmp_path / "cache"))
    records = neutral.neutral_records()
    assert len(records) == neutral.NEUTRAL_FAMILIES * neutral.PER_FAMILY
    assert all(t.startswith("Synthetic::") for r in records for t in r.graph.tasks)  # no user's skill
    k1, k2 = small_stream.family_keys[:2]
    bank = SkillBank.create(tmp_path / "bank", base=base)
    first = learn(bank, small_stream, k1, init="neutral")
    start_dir = neutral.neutral_dir(bank.manifest.base["digest"], CFG)
    assert first.lineage == {"init": "neutral", "digest": file_digest(start_dir / "adapter_model.safetensors"),
                             "key": start_dir.name}
    assert neutral.ADAPTER not in base.adapter_names and "__start__" not in base.adapter_names
    from safetensors.torch import load_file
    saved = load_file(str(start_dir / "adapter_model.safetensors"))
    assert any(torch.equal(v, spy_fit[k1][k]) for k, v in saved.items() if k in spy_fit[k1])
    # it was trained on the format its shards write: bare skill names, no synthetic family spelled out
    trained = json.loads((start_dir / "neutral.json").read_text())["training"]["family_prefix"]
    assert trained == family_prefixes(records) and len(trained) == neutral.NEUTRAL_FAMILIES
    built = (start_dir / "adapter_model.safetensors").stat().st_mtime_ns
    second = learn(bank, small_stream, k2, init="neutral")
    assert second.lineage == first.lineage and (start_dir / "adapter_model.safetensors").stat().st_mtime_ns == built
    assert "neutral" in start_text(second.lineage)
    bank.forget(k1)  # no descendants: nothing to refuse, k2 stays
    assert bank.shard_names == [k2]
    bank.export_family(k2, tmp_path / "k2")
    # a bank on the same base that never built the start takes the shard: planning never needs the start
    monkeypatch.setenv("SKILLBANK_CACHE", str(tmp_path / "elsewhere"))
    receiving = SkillBank.create(tmp_path / "receiving", base=load_base(BaseModelConfig(name=str(tiny_model_dir)),
                                                                        progress=False))
    entry = receiving.import_family(tmp_path / "k2")
    assert entry.lineage == second.lineage


def test_a_merged_start_is_the_weighted_update_of_the_nearest_shards(tmp_path, base, other_base, small_stream,
                                                                     spy_fit):
    k1, k2, k3, k4, k5 = small_stream.family_keys[:5]
    bank = SkillBank.create(tmp_path / "bank", base=base)
    assert learn(bank, small_stream, k1, init="merge").lineage == {"init": "fresh"}  # nothing to merge
    one = learn(bank, small_stream, k2, init="merge")  # one candidate: a plain start from it
    assert one.lineage == {"init": "shard", "from": k1, "digest": bank._entry(k1).digests["adapter_model.safetensors"],
                           "by": "merge"}
    learn(bank, small_stream, k3)
    learn(bank, small_stream, k4)
    requests = [r.request for r in small_stream.train[k5]]
    proba = np.asarray(bank.address.predict_proba(requests)).sum(axis=0)
    mass = dict(zip(bank.address.classes_, proba))
    nearest = sorted(mass, key=lambda n: -mass[n])[:3]
    entry = learn(bank, small_stream, k5, init="merge")
    lineage = entry.lineage
    assert lineage["init"] == "merge" and lineage["from"] == nearest and lineage["by"] == "merge"
    assert lineage["weights"] == pytest.approx([mass[n] / sum(mass[m] for m in nearest) for n in nearest], abs=1e-4)
    assert lineage["digests"] == [bank._entry(n).digests["adapter_model.safetensors"] for n in nearest]
    # the start applies the weighted sum of the three updates (rank 3 x r >= the module's size here, so the SVD
    # cuts nothing), read at the new adapter's scaling
    scale = CFG.alpha / CFG.rank
    start = spy_fit[k5]
    for key in [k for k in start if ".lora_A." in k]:
        b_key = key.replace(".lora_A.", ".lora_B.")
        got = scale * start[b_key].float() @ start[key].float()
        want = sum(w * scale * weights(bank, n)[b_key].float() @ weights(bank, n)[key].float()
                   for n, w in zip(lineage["from"], lineage["weights"]))
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-3)
    assert "__start__" not in bank.execution.base.adapter_names  # dropped after the copy
    # a descendant of each of them: forgetting any one asks first
    for name in nearest:
        assert k5 in bank.descendants(name)
    with pytest.raises(BankError, match=rf"cannot forget '{nearest[0]}'"):
        bank.forget(nearest[0])
    info = {s["name"]: s["lineage"] for s in bank_info(tmp_path / "bank")["shards"]}
    assert info[k5]["start_current"] is True
    # exported alone, it needs every start in the receiving bank
    out = bank.export_family(k5, tmp_path / "k5.family")
    dst = SkillBank.create(tmp_path / "dst", base=other_base)
    with pytest.raises(BankError, match="which this bank does not hold"):
        dst.import_family(out)
    needed = [k for k in (k1, k2, k3, k4) if k in nearest or (k == k1 and k2 in nearest)]  # k2 started from k1
    for name in needed:
        dst.import_family(bank.export_family(name, tmp_path / f"{name}.family"), name=f"{name}-here")
    got = dst.import_family(out)
    assert got.lineage["from"] == [f"{n}-here" for n in nearest]


def test_forget_refuses_a_family_with_descendants_then_forgets_them_exactly(tmp_path, base, other_base,
                                                                            small_stream):
    k1, k2, k3, k4 = small_stream.family_keys[:4]
    a = SkillBank.create(tmp_path / "a", base=base)
    learn(a, small_stream, k1)
    learn(a, small_stream, k2, init=f"shard:{k1}")
    learn(a, small_stream, k3)
    learn(a, small_stream, k4, init=f"shard:{k2}")  # descends from k1 through k2
    assert a.descendants(k1) == [k2, k4] and a.descendants(k2) == [k4] and a.descendants(k3) == []
    before = (tmp_path / "a" / "bank.json").read_text()
    with pytest.raises(BankError, match=rf"cannot forget '{k1}': shard\(s\) \['{k2}', '{k4}'\] started from its"):
        a.forget(k1)
    with pytest.raises(BankError, match="keep_files keeps one shard"):
        a.forget(k1, keep_files=tmp_path / "kept", descendants="forget")
    with pytest.raises(BankError, match="descendants must be one of"):
        a.forget(k1, descendants="keep")
    assert (tmp_path / "a" / "bank.json").read_text() == before and a.shard_names == [k1, k2, k3, k4]
    dirs = [a._entry(k).dir for k in (k1, k2, k4)]
    a.forget(k1, descendants="forget")
    assert a.shard_names == [k3] and not any((tmp_path / "a" / d).exists() for d in dirs)
    assert set(a.execution.shards) == {k3} and bank_info(tmp_path / "a")["orphans"] == []
    # the Address Memory is exactly that of a bank that only ever learned k3
    b = SkillBank.create(tmp_path / "b", base=other_base)
    learn(b, small_stream, k3)
    probe = [r.request for k in (k1, k2, k3, k4) for r in small_stream.test[k]] + OFF_DOMAIN
    assert_same_address(a, b, probe)
    assert_same_address(SkillBank.open_offline(tmp_path / "a"), b, probe)
    # a leaf has no descendants: forgotten as before
    learn(a, small_stream, k1, init=f"shard:{k3}")
    a.forget(k1)
    assert a.shard_names == [k3]


def test_relearn_of_a_family_with_descendants(tmp_path, base, other_base, small_stream):
    k1, k2, k3 = small_stream.family_keys[:3]
    bank = SkillBank.create(tmp_path / "bank", base=base)
    learn(bank, small_stream, k1)
    learn(bank, small_stream, k2, init=f"shard:{k1}")
    learn(bank, small_stream, k3)
    fewer = small_stream.train[k1][:3]
    with pytest.raises(BankError, match=rf"cannot relearn '{k1}'.*\['{k2}'\].*--descendants keep\|forget"):
        bank.relearn(k1, fewer, CFG, progress=False)
    with pytest.raises(BankError, match="cannot start from its own shard"):
        bank.relearn(k1, fewer, CFG, progress=False, init=f"shard:{k1}", descendants="keep")
    with pytest.raises(BankError, match="is forgotten with its old version"):
        bank.relearn(k1, fewer, CFG, progress=False, init=f"shard:{k2}", descendants="forget")
    # keep: the descendant stays, its lineage names a start whose recorded weights are gone
    bank.relearn(k1, fewer, CFG, progress=False, descendants="keep", init=f"shard:{k3}")
    info = {s["name"]: s["lineage"] for s in bank_info(tmp_path / "bank")["shards"]}
    assert info[k2]["from"] == k1 and info[k2]["start_current"] is False
    assert info[k1]["from"] == k3 and info[k1]["start_current"] is True
    assert bank.descendants(k3) == [k1, k2]  # k2 still carries what the old k1 learned
    # forget: the descendants go in the same publish, exactly
    bank.relearn(k1, fewer, CFG, progress=False, descendants="forget", init="fresh")
    assert bank.shard_names == [k1, k3] and bank._entry(k1).lineage == {"init": "fresh"}
    # as if k2 had never been learned: the same history without it (scope statistics fitted after another
    # family's depend on that family's, so the reference relearns k1 as the bank did)
    ref = SkillBank.create(tmp_path / "ref", base=other_base)
    learn(ref, small_stream, k1)
    learn(ref, small_stream, k3)
    ref.relearn(k1, fewer, CFG, progress=False, init="fresh")
    probe = [r.request for k in (k1, k2, k3) for r in small_stream.test[k]]
    assert_same_address(bank, ref, probe)
    assert bank_info(tmp_path / "bank")["orphans"] == []


def test_import_needs_the_start_shard(tmp_path, base, other_base, small_stream):
    k1, k2, k3 = small_stream.family_keys[:3]
    src = SkillBank.create(tmp_path / "src", base=base)
    learn(src, small_stream, k1)
    entry = learn(src, small_stream, k2, init=f"shard:{k1}")
    out = src.export_family(k2, tmp_path / "k2.family")
    assert json.loads((out / "family.json").read_text())["entry"]["lineage"] == entry.lineage
    dst = SkillBank.create(tmp_path / "dst", base=other_base)
    learn(dst, small_stream, k3)
    with pytest.raises(BankError, match=rf"started from the weights of shard '{k1}'.*which this bank does not hold"):
        dst.import_family(out)
    assert dst.shard_names == [k3]
    # once the bank holds the start (found by its digest, under any name), the import is accepted
    dst.import_family(src.export_family(k1, tmp_path / "k1.family"), name="renamed")
    got = dst.import_family(out)
    assert got.lineage == {**entry.lineage, "from": "renamed"} and dst.descendants("renamed") == [k2]
    with pytest.raises(BankError, match=rf"\['{k2}'\] started from its weights"):
        dst.forget("renamed")
    # an export from before lineage existed imports as fresh
    old = src.export_family(k1, tmp_path / "old.family")
    meta = json.loads((old / "family.json").read_text())
    del meta["entry"]["lineage"]
    (old / "family.json").write_text(json.dumps(meta))
    assert SkillBank.create(tmp_path / "third", base=other_base).import_family(old).lineage == {"init": "fresh"}


def test_a_bad_start_is_refused_before_training(tmp_path, base, small_stream, monkeypatch):
    k1, k2 = small_stream.family_keys[:2]
    bank = SkillBank.create(tmp_path / "bank", base=base)
    start = learn(bank, small_stream, k1)
    shard = tmp_path / "bank" / start.dir

    def no_training(*a, **kw):
        raise AssertionError("training started")

    monkeypatch.setattr(executor, "fit", no_training)

    def refused(match, cfg=CFG, init=f"shard:{k1}"):
        with pytest.raises(BankError, match=match):
            learn(bank, small_stream, k2, cfg, init=init)
        assert bank.shard_names == [k1] and bank_info(tmp_path / "bank")["orphans"] == []

    refused(r"init must be one of fresh, neutral, previous, nearest, merge, shard:NAME, got 'warm'", init="warm")
    refused(r"cannot start from shard 'nope': the bank has no such shard \(shards it can start from: \["
            rf"'{k1}'\]; or init 'fresh' or 'neutral'\)", init="shard:nope")
    refused(rf"cannot start from shard '{k1}': its LoRA adapts other weights .*target modules .* \(no shard of "
            "this bank fits the recipe; or init",
            TrainConfig(**{**CFG.to_dict(), "rank": 8, "target_modules": ("q_proj", "v_proj")}))
    refused(rf"cannot start from shard '{k1}': its LoRA adapts other weights .*layers None there, \[0\] here",
            TrainConfig(**{**CFG.to_dict(), "layers_to_transform": (0,)}))
    config = json.loads((shard / "adapter_config.json").read_text())
    weights_file = (shard / "adapter_model.safetensors").read_bytes()
    # corrupted: the files no longer match their digests
    (shard / "adapter_model.safetensors").write_bytes(weights_file[:-7] + b"garbage")
    refused(rf"cannot start from shard '{k1}': shard '{k1}': .*does not match its digest")
    # unreadable weights even where the digests were made to match
    (shard / "adapter_model.safetensors").write_bytes(b"not safetensors")
    start.digests = dir_digests(shard)
    refused(rf"cannot start from shard '{k1}': its adapter in .* is unreadable")
    # another base model
    (shard / "adapter_model.safetensors").write_bytes(weights_file)
    (shard / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": "other/model"}))
    start.digests = dir_digests(shard)
    refused(rf"cannot start from shard '{k1}': its adapter was trained on base model 'other/model'")
    # missing
    import shutil
    shutil.rmtree(shard)
    refused(rf"cannot start from shard '{k1}': shard '{k1}' is missing its directory")


def test_learning_into_a_bank_of_other_recipes_builds_on_what_fits(tmp_path, base, other_base, small_stream,
                                                                   spy_fit):
    """A bank's shards may have been trained with another recipe (the demo's: rank 64; `learn`'s: rank 16). The
    choosing starts build on the shards whose LoRA adapts the same weights, cut to the recipe's rank by SVD, skip
    the others and say so, and start fresh where none fits; an explicit start that cannot be names the ones
    that can."""
    from skillbank.memory.lineage import start_text

    k1, k2, k3, k4, k5 = small_stream.family_keys[:5]
    bank = SkillBank.create(tmp_path / "bank", base=base)
    wide = TrainConfig(**{**CFG.to_dict(), "rank": 8})
    qv = TrainConfig(**{**CFG.to_dict(), "target_modules": ("q_proj", "v_proj")})
    learn(bank, small_stream, k1, wide)
    learn(bank, small_stream, k2, wide)
    learn(bank, small_stream, k3, qv)
    entry = learn(bank, small_stream, k4, CFG, init="merge")  # the recipe: rank 16 on q, k, v, o
    assert entry.lineage["init"] == "merge" and sorted(entry.lineage["from"]) == sorted([k1, k2])
    assert entry.lineage["cut"] == "rank 8 -> 16" and list(entry.lineage["skipped"]) == [k3]
    assert "its LoRA adapts other weights" in entry.lineage["skipped"][k3]
    text = start_text(entry.lineage)
    assert "cut from rank 8 -> 16 by SVD" in text and f"1 shard(s) skipped ({k3}: its LoRA adapts" in text
    assert spy_fit[k4] and any(float(v.abs().sum()) > 0 for k, v in spy_fit[k4].items() if ".lora_B." in k)
    one = learn(bank, small_stream, k5, CFG, init=f"shard:{k1}")  # a single start of another rank: cut too
    assert one.lineage["from"] == k1 and one.lineage["cut"] == "rank 8 -> 16" and one.lineage["by"] == "name"
    # the components a rank-8 start leaves empty start as a fresh LoRA's (A initialised, B zero): all can learn
    assert all(float(v.abs().sum(dim=1).min()) > 0 for k, v in spy_fit[k5].items() if ".lora_A." in k)
    assert bank.descendants(k1) == [k4, k5]
    # nothing fits: fresh, and why
    alone = SkillBank.create(tmp_path / "alone", base=other_base)
    learn(alone, small_stream, k3, qv)
    first = learn(alone, small_stream, k1, CFG, init="merge")
    assert first.lineage["init"] == "fresh" and k3 in first.lineage["skipped"]
    assert start_text(first.lineage).startswith(f"fresh (no shard to build on; 1 shard(s) skipped ({k3}:")


def test_copy_lora_needs_the_same_shape(base):
    add_lora(base, "r16", CFG)
    add_lora(base, "r8", TrainConfig(**{**CFG.to_dict(), "rank": 8}))
    add_lora(base, "qv", TrainConfig(**{**CFG.to_dict(), "target_modules": ("q_proj", "v_proj")}))
    with pytest.raises(ModelError, match=r"adapter 'r8' cannot start from 'r16': .* is \(16, \d+\) in 'r16', \(8, "):
        copy_lora(base, "r16", "r8")
    with pytest.raises(ModelError, match="'r16' adapts modules it does not"):
        copy_lora(base, "r16", "qv")
    with pytest.raises(ModelError, match="have no counterpart in 'qv'"):
        copy_lora(base, "qv", "r16")
    add_lora(base, "copy", CFG)
    copy_lora(base, "r16", "copy")
    src, dst = lora_tensors(base.peft, "r16"), lora_tensors(base.peft, "copy")
    assert src.keys() == dst.keys() and all(torch.equal(src[k], dst[k]) for k in src)


def test_a_bank_from_before_lineage_works_as_before(tmp_path, base, tiny_model_dir, small_stream):
    k1, k2, k3 = small_stream.family_keys[:3]
    bank = SkillBank.create(tmp_path / "bank", base=base)
    learn(bank, small_stream, k1)
    learn(bank, small_stream, k2)
    manifest = json.loads((tmp_path / "bank" / "bank.json").read_text())
    for s in manifest["shards"]:
        del s["lineage"]
    (tmp_path / "bank" / "bank.json").write_text(json.dumps(manifest))
    old = SkillBank.open(tmp_path / "bank", base=load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False))
    assert [e.lineage for e in old.manifest.shards] == [{"init": "fresh"}] * 2
    assert all(s["lineage"] == {"init": "fresh"} for s in bank_info(tmp_path / "bank")["shards"])
    assert old.plan([small_stream.test[k1][0].request], max_new_tokens=4, scope=False)[0].shard in (k1, k2)
    assert learn(old, small_stream, k3).lineage == {"init": "fresh"}
    old.forget(k1)
    assert old.shard_names == [k2, k3]


def test_lineage_through_the_cli(tmp_path, base, small_stream):
    from typer.testing import CliRunner

    from skillbank.cli import app
    from skillbank.data.records import write_records

    def invoke(*args, input=None):
        return CliRunner().invoke(app, [str(a) for a in args], input=input, catch_exceptions=False)

    k1, k2 = small_stream.family_keys[:2]
    bank = SkillBank.create(tmp_path / "bank", base=base)
    learn(bank, small_stream, k1)
    write_records(tmp_path / "k2.jsonl", small_stream.train[k2])
    r = invoke("learn", tmp_path / "bank", "--family", k2, "--data", tmp_path / "k2.jsonl", "--init", "warm")
    assert r.exit_code == 2 and "init must be one of" in r.output
    r = invoke("learn", tmp_path / "bank", "--family", k2, "--data", tmp_path / "k2.jsonl", "--init", "previous",
               "--epochs", 1, "--recipe", "small-cpu", "--checkpoint-minutes", 0)
    assert r.exit_code == 0, r.output
    assert f"started from {k1} (previous)" in " ".join(r.output.split())
    r = invoke("info", tmp_path / "bank")
    assert r.exit_code == 0 and f"{k2} started from {k1} (previous)" in " ".join(r.output.split())
    r = invoke("info", tmp_path / "bank", "--json")
    assert json.loads(r.stdout)["shards"][1]["lineage"]["from"] == k1
    r = invoke("forget", tmp_path / "bank", k1, "--yes")
    assert r.exit_code == 2 and f"cannot forget '{k1}'" in r.output and "--with-descendants" in r.output
    assert SkillBank.open_offline(tmp_path / "bank").shard_names == [k1, k2]
    r = invoke("forget", tmp_path / "bank", k1, "--with-descendants", input="n\n")
    assert r.exit_code == 1 and f"descend from it ({k2})" in " ".join(r.output.split())
    r = invoke("forget", tmp_path / "bank", k1, "--with-descendants", "--yes")
    assert r.exit_code == 0 and f"forgot {k1} and its descendants {k2}" in r.output
    assert SkillBank.open_offline(tmp_path / "bank").shard_names == []
