import random

import numpy as np
import pytest

from skillbank.errors import SelectorError
from skillbank.memory.address import HashingNBAddress, TfidfLogRegAddress, load_selector, make_selector

WORDS = {
    "life": "pay bill book flight hotel dinner taxi alarm email sms friend bank tax doctor".split(),
    "speech": "transcribe audio speech voice recording translate spoken podcast accent noise".split(),
    "vision": "image photo detect objects segment depth picture scan document chart".split(),
}
SHARED = "please send summary text file quickly today my the a".split()


def corpus(seed, n=60):
    rng = random.Random(seed)
    out = {}
    for fam, words in WORDS.items():
        out[fam] = [" ".join(rng.choice(words) for _ in range(4)) + " " + " ".join(rng.choice(SHARED) for _ in range(3))
                    for _ in range(n)]
    return out


def test_stagewise_partial_fit_equals_joint_fit():
    data = corpus(0)
    staged = HashingNBAddress()
    for fam, reqs in data.items():
        staged.partial_fit(reqs, fam)
    joint = HashingNBAddress()
    all_reqs = [r for reqs in data.values() for r in reqs]
    all_labels = [f for f, reqs in data.items() for _ in reqs]
    joint.fit(all_reqs, all_labels)
    assert staged.classes_ == joint.classes_ == list(WORDS)
    assert (staged.feature_count_ != joint.feature_count_).nnz == 0
    np.testing.assert_array_equal(staged.class_count_, joint.class_count_)
    test = corpus(1, 20)["speech"]
    np.testing.assert_allclose(staged.predict_proba(test), joint.predict_proba(test))


def test_routes_well_and_only_to_learned_families():
    data, test = corpus(0), corpus(1, 30)
    sel = HashingNBAddress().partial_fit(data["life"], "life")
    # one family learned: everything goes there, never to a family it has not seen
    assert set(sel.predict(test["vision"])) == {"life"}
    assert sel.predict_proba(test["vision"]).shape == (30, 1)
    sel.partial_fit(data["speech"], "speech").partial_fit(data["vision"], "vision")
    for fam, reqs in test.items():
        assert np.mean([p == fam for p in sel.predict(reqs)]) > 0.9
    proba = sel.predict_proba(test["life"])
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)


def test_save_load_is_exact_and_small(tmp_path):
    data, test = corpus(0), corpus(1, 10)
    sel = HashingNBAddress(n_features=2**20, alpha=0.05, ngram_range=(1, 1), prior="empirical")
    for fam, reqs in data.items():
        sel.partial_fit(reqs, fam)
    sel.save(tmp_path / "addr")
    size = sum(p.stat().st_size for p in (tmp_path / "addr").iterdir())
    assert size < 50_000  # counts are stored sparsely, not as (classes x 2**20)
    back = load_selector(tmp_path / "addr")
    assert isinstance(back, HashingNBAddress) and back.get_params() == sel.get_params()
    for reqs in test.values():
        np.testing.assert_array_equal(back.predict_proba(reqs), sel.predict_proba(reqs))
    # learning continues after a reload exactly as without one
    more = corpus(2, 5)["speech"]
    sel.partial_fit(more, "speech"); back.partial_fit(more, "speech")
    np.testing.assert_array_equal(back.predict_proba(test["life"]), sel.predict_proba(test["life"]))


def test_large_hash_space_needs_small_alpha():
    """The documented trap: alpha=1 with 2**20 features drowns the real counts."""
    data = corpus(0)
    rng = random.Random(3)
    # test requests dominated by words every family shares, as real requests are
    test = {f: [" ".join(rng.sample(w, 2) + rng.sample(SHARED, 5)) for _ in range(30)] for f, w in WORDS.items()}
    imbalanced = {"life": data["life"] * 5, "speech": data["speech"], "vision": data["vision"]}

    def acc(alpha):
        sel = HashingNBAddress(n_features=2**20, alpha=alpha)
        for fam, reqs in imbalanced.items():
            sel.partial_fit(reqs, fam)
        return np.mean([p == f for f, reqs in test.items() for p in sel.predict(reqs)])

    assert acc(0.01) > 0.9
    assert acc(1.0) < 0.5  # most requests pulled to the family with the most tokens


def test_offline_reference_keeps_requests_and_refits(tmp_path):
    data, test = corpus(0), corpus(1, 20)
    sel = TfidfLogRegAddress()
    assert not sel.replay_free and HashingNBAddress.replay_free
    sel.partial_fit(data["life"], "life")
    assert sel.predict(test["speech"][:3]) == ["life"] * 3
    for fam in ("speech", "vision"):
        sel.partial_fit(data[fam], fam)
    assert len(sel.requests_) == 180
    for fam, reqs in test.items():
        assert np.mean([p == fam for p in sel.predict(reqs)]) > 0.9
    sel.save(tmp_path / "ref")
    back = load_selector(tmp_path / "ref")
    np.testing.assert_allclose(back.predict_proba(test["life"]), sel.predict_proba(test["life"]))


def test_offline_reference_switches_to_saga_when_lbfgs_would_not_fit(monkeypatch):
    """Past LBFGS_MAX_PARAMS weights the reference fits with SAGA (L-BFGS-B segfaults at 10^8 weights):
    checked here with the bound lowered, on the small corpus, where both must route alike."""
    data, test = corpus(0), corpus(1, 20)
    fitted = {}
    for bound in (10**9, 1):
        monkeypatch.setattr(TfidfLogRegAddress, "LBFGS_MAX_PARAMS", bound)
        sel = TfidfLogRegAddress()
        for fam in ("life", "speech", "vision"):
            sel.partial_fit(data[fam], fam)
        fitted[sel.solver_] = sel
    assert set(fitted) == {"lbfgs", "saga"}
    for fam, reqs in test.items():
        assert fitted["saga"].predict(reqs) == fitted["lbfgs"].predict(reqs), fam
    with pytest.raises(SelectorError, match="solver must be"):
        TfidfLogRegAddress(solver="newton")


@pytest.mark.parametrize("call, reason", [
    (lambda s: s.predict(["x"]), "has not learned any shard"),
    (lambda s: s.partial_fit([], "a"), "at least one request"),
    (lambda s: s.partial_fit(["ok", " "], "a"), r"requests\[1\] is empty"),
    (lambda s: s.partial_fit("one string", "a"), "single string"),
    (lambda s: s.partial_fit(["a", "b"], ["x"]), "2 requests but 1 labels"),
])
def test_bad_input(call, reason):
    with pytest.raises(SelectorError, match=reason):
        call(HashingNBAddress())


@pytest.mark.parametrize("params, reason", [
    ({"alpha": 0}, "alpha must be > 0"),
    ({"n_features": 3}, "n_features"),
    ({"prior": "weird"}, "prior"),
    ({"ngram_range": (2, 1)}, "ngram_range"),
])
def test_bad_params(params, reason):
    with pytest.raises(SelectorError, match=reason):
        HashingNBAddress(**params)


def test_load_errors(tmp_path):
    with pytest.raises(SelectorError, match="missing selector.json"):
        load_selector(tmp_path)
    (tmp_path / "selector.json").write_text('{"format": 1, "kind": "nope"}')
    with pytest.raises(SelectorError, match="unknown selector kind"):
        load_selector(tmp_path)
    with pytest.raises(SelectorError, match="unknown selector kind"):
        make_selector("nope")
    HashingNBAddress().partial_fit(["a b"], "x").save(tmp_path / "nb")
    with pytest.raises(SelectorError, match="not 'tfidf-logreg'"):
        TfidfLogRegAddress.load(tmp_path / "nb")


def test_selector_modules_import_without_a_cycle():
    """The registry names implementations by module path: the interface module imports none of them, and
    the Address Memory never imports the other selectors (which import it)."""
    import ast
    from pathlib import Path

    import skillbank.memory as memory
    from skillbank.memory.selector import SELECTOR_KINDS, selector_class

    def imports(path: Path) -> set[str]:
        tree = ast.parse(path.read_text())
        return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} | {
            a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}

    root = Path(memory.__file__).parent
    assert not {m for m in imports(root / "selector.py") if m.startswith("skillbank.memory")}
    assert not {m for m in imports(root / "address.py") if m.startswith("skillbank.memory.selectors")}
    for kind in SELECTOR_KINDS:
        assert selector_class(kind).kind == kind


def test_route_scale_report(tmp_path, small_stream):
    from skillbank.data.records import Record
    from skillbank.experiments.route_scale import checkpoints, label_records, route_scale, write
    from skillbank.report.route_scale import render_markdown
    assert checkpoints(5) == [1, 2, 3, 4, 5]
    assert checkpoints(1000) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]
    keys = small_stream.family_keys
    hand = [small_stream.test[k][0] for k in keys]
    cross = small_stream.test[keys[0]][0]  # a record whose skills span two families is left out
    two = Record("x", keys[0], "two families", cross.graph.__class__.from_dict({"task_nodes": [
        {"task": small_stream.catalog.family(keys[0]).skills[0], "arguments": []},
        {"task": small_stream.catalog.family(keys[1]).skills[0], "arguments": []}], "task_links": []}))
    assert label_records(small_stream, hand + [two])[1] == 1
    from skillbank.data.builtin import build_builtin_stream
    finer = build_builtin_stream(seed=0, train_per_family=2, test_per_family=1, families=10)
    labelled, left = label_records(finer, hand)  # coarse skill ids read through their names
    fam_of = finer.catalog.family_map
    by_request = {r.request: r for r in hand}
    assert labelled and len(labelled) + left == len(hand)
    for request, fam in labelled:
        names = {t.rsplit("::", 1)[-1] for t in by_request[request].graph.tasks}
        assert {fam_of[sid] for sid in fam_of if sid.rsplit("::", 1)[-1] in names} == {fam}
    res = route_scale(small_stream, keys, {"nb": HashingNBAddress, "lr": TfidfLogRegAddress},
                      records={"hand": hand + [two]}, latency_sample=5)
    nb = res["selectors"]["nb"]
    assert [p["k"] for p in nb] == [1, 2, 3, 4, 5] and nb[0]["accuracy"] == 1.0
    assert nb[-1]["n_requests"] == sum(len(small_stream.test[k]) for k in keys)
    # hand-written records are scored only once every family they need is learned
    assert "hand" not in nb[0]["records_accuracy"] and nb[-1]["records_n"]["hand"] == len(keys)
    # batching stages between checkpoints gives the same statistics as stage by stage
    stepwise = HashingNBAddress()
    for k in keys:
        stepwise.partial_fit([r.request for r in small_stream.train[k]], k)
    batched = HashingNBAddress().partial_fit([r.request for k in keys for r in small_stream.train[k]],
                                             [k for k in keys for _ in small_stream.train[k]])
    probe = [r.request for k in keys for r in small_stream.test[k]]
    np.testing.assert_allclose(stepwise.predict_proba(probe), batched.predict_proba(probe))
    write([res], tmp_path)
    assert (tmp_path / "routing_scale.png").stat().st_size > 0 and "| nb | 5 |" in render_markdown([res])
    # a reference too slow to refit at every checkpoint: fitted once on every family, scored at the end only,
    # where it gives what the checkpoint-by-checkpoint run gave
    once = route_scale(small_stream, keys, {"nb": HashingNBAddress, "lr": TfidfLogRegAddress}, latency_sample=5,
                       final_only=["lr"])
    assert [p["k"] for p in once["selectors"]["lr"]] == [5] and len(once["selectors"]["nb"]) == 5
    assert once["selectors"]["lr"][0]["accuracy"] == res["selectors"]["lr"][-1]["accuracy"]
