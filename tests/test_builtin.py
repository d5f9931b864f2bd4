"""The built-in benchmark: catalog, determinism, record validity, structure mix, routing difficulty."""
from __future__ import annotations

import re
import time
from collections import Counter

import pytest

from skillbank.data.builtin import build_builtin_catalog, build_builtin_stream, tool_graph
from skillbank.data.builtin_catalog import FAMILIES, POOLS
from skillbank.data.catalog import Catalog
from skillbank.data.records import structure_of
from skillbank.data.stream import Stream
from skillbank.graph import NODE_REF, TaskGraph

FAMILY_SIZES = {"t1_daily_life": 40, "t2_language_speech": 11, "t3_retrieval_understanding": 21,
                "t4_vision_document": 9, "t5_generation_editing": 19}


@pytest.fixture(scope="module")
def built():
    start = time.perf_counter()
    stream = build_builtin_stream()
    return stream, time.perf_counter() - start


@pytest.fixture(scope="module")
def stream(built):
    return built[0]


def all_records(stream):
    for key in stream.family_keys:
        for split in (stream.train, stream.test):
            yield from split[key]


# -- catalog -----------------------------------------------------------------------------------
def test_catalog_is_a_partition_of_100_skills_in_five_families():
    catalog = build_builtin_catalog()
    assert isinstance(catalog, Catalog)  # the constructor checks the partition
    assert len(catalog) == 100
    assert {f.key: len(f.skills) for f in catalog.families} == FAMILY_SIZES
    assert catalog.family_keys == list(FAMILY_SIZES)  # T1..T5 order
    for fam in catalog.families:
        for sid in fam.skills:
            assert sid.startswith(f"Builtin::{fam.key}::")
            name = sid.rsplit("::", 1)[1]
            assert re.fullmatch(r"[a-z][a-z0-9_]*", name) and len(name) <= 20, sid
            assert catalog.skills[sid].arguments, f"{sid} has no arguments"
            assert catalog.family_map[sid] == fam.key
    assert len(catalog.family_map) == 100
    with pytest.raises(TypeError):  # a view, so a caller cannot re-file a skill behind the catalog's back
        catalog.family_map["Builtin::T1::x"] = "T2"
    # a round trip through JSON keeps the partition
    assert Catalog.from_dict(catalog.to_dict()).to_dict() == catalog.to_dict()


def test_skill_definitions_are_consistent_and_unambiguous():
    for fam in FAMILIES:
        nouns = [sk.noun for sk in fam.skills if sk.output]
        assert len(nouns) == len(set(nouns)), f"{fam.key}: two skills share an output noun"
        clause_shapes = {}
        for sk in fam.skills:
            assert len(sk.templates) >= 3, sk.name
            assert not sk.output or sk.noun, f"{sk.name} has an output but no noun"
            for template in sk.templates:
                assert set(re.findall(r"\{(\w+)\}", template)) == {a.name for a in sk.args}, (sk.name, template)
                shape = re.sub(r"\{\w+\}", "X", template)
                assert clause_shapes.setdefault(shape, sk.name) == sk.name, f"{fam.key}: {template!r} is ambiguous"
            for a in sk.args:
                assert a.pool in POOLS, (sk.name, a.name)
        assert tool_graph(fam.key), f"{fam.key} has an empty tool graph"


def test_shared_vocabulary_in_templates():
    words_by_family = {fam.key: set(re.findall(r"[a-z]+", " ".join(t for sk in fam.skills for t in sk.templates)))
                       for fam in FAMILIES}
    for word in ("image", "send", "summary", "text", "audio", "video"):
        assert sum(word in w for w in words_by_family.values()) >= 2, word


# -- the stream --------------------------------------------------------------------------------
def test_default_sizes_speed_and_metadata(built):
    stream, seconds = built
    assert seconds < 5
    assert stream.name == "builtin" and stream.source == "skillbank-builtin" and stream.seed == 0
    for key in FAMILY_SIZES:
        assert len(stream.train[key]) == 1000 and len(stream.test[key]) == 300
        rep = stream.report["families"][key]
        assert rep["train"]["records"] == 1000 and rep["test"]["records"] == 300
        assert sum(rep["train"]["structure"].values()) == 1000
    assert stream.report["train_per_family"] == 1000 and stream.report["test_per_family"] == 300


def test_custom_sizes_and_bad_sizes():
    small = build_builtin_stream(seed=4, train_per_family=25, test_per_family=7)
    assert all(len(small.train[k]) == 25 and len(small.test[k]) == 7 for k in small.family_keys)
    with pytest.raises(ValueError, match="must be >= 0"):
        build_builtin_stream(train_per_family=-1)


def test_deterministic_by_seed(tmp_path):
    a = build_builtin_stream(seed=7, train_per_family=60, test_per_family=20)
    b = build_builtin_stream(seed=7, train_per_family=60, test_per_family=20)
    c = build_builtin_stream(seed=8, train_per_family=60, test_per_family=20)
    a.save(tmp_path / "a")
    b.save(tmp_path / "b")
    c.save(tmp_path / "c")
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert len(files) == 2 + 2 * 5
    for rel in files:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel
    assert (tmp_path / "a" / "train" / "t1_daily_life.jsonl").read_bytes() != \
        (tmp_path / "c" / "train" / "t1_daily_life.jsonl").read_bytes()
    assert [r.request for r in a.test["t4_vision_document"]] != [r.request for r in c.test["t4_vision_document"]]


def test_requests_are_unique_and_held_out_is_disjoint(stream):
    requests = [r.request for r in all_records(stream)]
    assert len(requests) == len(set(requests))
    for key in stream.family_keys:
        assert not {r.request for r in stream.train[key]} & {r.request for r in stream.test[key]}
    ids = [r.id for r in all_records(stream)]
    assert len(ids) == len(set(ids))
    assert all(re.fullmatch(r"builtin-t[1-5]-\d{6}", i) for i in ids)
    assert stream.train["t3_retrieval_understanding"][123].id == "builtin-t3-000123"


def test_every_graph_is_valid_and_copyable_from_its_request(stream):
    for rec in all_records(stream):
        TaskGraph.from_dict(rec.graph.to_dict())  # validates: references point to earlier nodes, no cycles
        family_skills = set(stream.catalog.family(rec.family).skills)
        assert set(rec.graph.tasks) <= family_skills, rec.id
        assert len(set(rec.graph.tasks)) == len(rec.graph.tasks), f"{rec.id} repeats a skill"
        assert rec.structure == structure_of(rec.graph)
        # gold links are already canonical (every implied link is declared)
        assert set(rec.graph.links) == set(rec.graph.canonical_links()), rec.id
        for node in rec.graph.nodes:
            spec = stream.catalog.skills[node.task]
            assert {a.name for a in node.arguments} == set(spec.argument_names), rec.id
            for arg in node.arguments:
                if not NODE_REF.match(arg.value):
                    assert arg.value and arg.value in rec.request, (rec.id, arg.value, rec.request)


def test_structure_mix(stream):
    for key in stream.family_keys:
        for split in (stream.train, stream.test):
            recs = split[key]
            structures = Counter(r.structure for r in recs)
            assert set(structures) == {"single", "chain", "dag"}, (key, structures)
            assert max(len(r.graph.nodes) for r in recs) >= 4
            assert all(1 <= len(r.graph.nodes) <= 5 for r in recs)
        train = stream.train[key]
        share = {s: n / len(train) for s, n in Counter(r.structure for r in train).items()}
        assert abs(share["single"] - 0.35) < 0.06 and abs(share["chain"] - 0.40) < 0.06 \
            and abs(share["dag"] - 0.25) < 0.06, (key, share)
        # references and links both occur: data flows (<node-i>) and, in Daily Life, plain order links
        assert any(n.references() for r in train for n in r.graph.nodes)


def test_requests_are_mostly_short(stream):
    words = [len(r.request.split()) for r in all_records(stream)]
    assert sum(12 <= w <= 45 for w in words) / len(words) > 0.75
    assert 20 < sum(words) / len(words) < 35


def test_not_trivially_routable(stream):
    pytest.importorskip("sklearn")
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.naive_bayes import MultinomialNB

    train_x, train_y, test_x, test_y = [], [], [], []
    for key in stream.family_keys:
        for rec in stream.train[key][:200]:
            train_x.append(rec.request)
            train_y.append(key)
        for rec in stream.test[key]:
            test_x.append(rec.request)
            test_y.append(key)
    vectorizer = CountVectorizer()
    nb = MultinomialNB().fit(vectorizer.fit_transform(train_x), train_y)
    predicted = nb.predict(vectorizer.transform(test_x))
    accuracy = sum(p == y for p, y in zip(predicted, test_y)) / len(test_y)
    assert 0.8 < accuracy < 0.995, accuracy

    tokens = {key: set() for key in stream.family_keys}
    for rec in all_records(stream):
        tokens[rec.family].update(re.findall(r"[a-z]+", rec.request.lower()))
    for word in ("image", "send", "summary", "text", "audio", "file"):
        assert sum(word in t for t in tokens.values()) >= 2, word


def test_save_load_round_trip(stream, tmp_path):
    stream.save(tmp_path / "s")
    loaded = Stream.load(tmp_path / "s")
    assert loaded.name == "builtin" and loaded.source == "skillbank-builtin" and loaded.seed == 0
    assert loaded.catalog.to_dict() == stream.catalog.to_dict()
    assert loaded.report == stream.report
    for key in stream.family_keys:
        assert [r.to_dict() for r in loaded.train[key]] == [r.to_dict() for r in stream.train[key]]
        assert [r.to_dict() for r in loaded.test[key]] == [r.to_dict() for r in stream.test[key]]


def test_more_held_out_requests_leave_the_training_and_earlier_held_out_records_as_they_were():
    """scripts/more_heldout.py and exp run --extra-set rely on it: a finished run is measured again on the stream's
    next held-out requests, which must be new to it (not trained on, not among the ones it was measured on)."""
    own = build_builtin_stream(seed=0, train_per_family=20, test_per_family=5)
    more = build_builtin_stream(seed=0, train_per_family=20, test_per_family=25)
    for key in own.family_keys:
        assert [r.request for r in more.train[key]] == [r.request for r in own.train[key]]
        assert [r.request for r in more.test[key][:5]] == [r.request for r in own.test[key]]
        seen = {r.request for r in own.train[key]} | {r.request for r in own.test[key]}
        assert not seen & {r.request for r in more.test[key][5:]}
