"""Streams with many families: the built-in split (K = 5..100), the synthetic generator (up to 1,050
families), seeded random orders, and the bad inputs refused before any work starts."""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from skillbank.cli import app
from skillbank.data import builtin
from skillbank.data.builtin import (MAX_FAMILIES, build_builtin_catalog, build_builtin_stream, split_families)
from skillbank.data.builtin_catalog import FAMILIES
from skillbank.data.records import Record, validate_records
from skillbank.data.stream import ORDERS, Stream, random_order
from skillbank.data.synthetic import DOMAINS, build_synthetic_stream, synthetic_families
from skillbank.data.synthetic import MAX_FAMILIES as SYNTHETIC_MAX
from skillbank.errors import StreamError
from skillbank.memory.bank import FAMILY_NAME

# Digests of streams written by the code before the split existed (2026-11-30, `skillbank stream build`):
# K = 5 must stay today's stream byte for byte.
DEFAULT_DIGEST = "a860b5cf9566819584dcf72f2108c4900cf53b84db925cb2237c9a69293ac2e2"  # --out only
SMALL_DIGEST = "55b81e062c5f8afe36695951b125e560afdfddccdcf3415b85b7bea2dc2804a8"  # --seed 3, 20 train, 5 test
SPLIT_KS = (10, 20, 50, 100)


def tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(x for x in root.rglob("*") if x.is_file()):
        h.update(str(p.relative_to(root)).encode() + b"\0" + hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def records(stream):
    for key in stream.family_keys:
        for split in (stream.train, stream.test):
            yield from split[key]


# -- K = 5 is today's stream ------------------------------------------------------------------------
def test_default_build_is_byte_identical_to_before(tmp_path):
    res = cli("exp", "stream", "build", "--out", tmp_path / "default")
    assert res.exit_code == 0, res.output
    assert tree_digest(tmp_path / "default") == DEFAULT_DIGEST


def test_families_5_is_the_same_stream(tmp_path):
    res = cli("exp", "stream", "build", "--out", tmp_path / "cli", "--families", 5, "--seed", 3,
              "--train-per-family", 20, "--test-per-family", 5)
    assert res.exit_code == 0, res.output
    assert tree_digest(tmp_path / "cli") == SMALL_DIGEST
    build_builtin_stream(seed=3, train_per_family=20, test_per_family=5, families=5).save(tmp_path / "api")
    assert tree_digest(tmp_path / "api") == SMALL_DIGEST
    assert split_families(5) == FAMILIES


# -- the built-in split -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def split_streams():
    return {k: build_builtin_stream(seed=1, train_per_family=8, test_per_family=3, families=k) for k in SPLIT_KS}


@pytest.mark.parametrize("k", SPLIT_KS)
def test_split_records_stay_in_their_family(split_streams, k):
    stream = split_streams[k]
    assert len(stream.family_keys) == k and stream.name == f"builtin-k{k}"
    for key in stream.family_keys:
        assert len(stream.train[key]) == 8 and len(stream.test[key]) == 3, key
    family_of = stream.catalog.family_map
    for rec in records(stream):
        assert {family_of[t] for t in rec.graph.tasks} == {rec.family}, rec.id
    for key in stream.family_keys:  # the same checks `skillbank validate` and `learn` run
        assert validate_records(stream.train[key] + stream.test[key], stream.catalog, family=key).ok


@pytest.mark.parametrize("k", SPLIT_KS)
def test_split_partitions_the_builtin_skills(split_streams, k):
    five = build_builtin_catalog()
    catalog = split_streams[k].catalog  # its constructor checks that the families partition its skills
    by_name = {s.name: s for s in catalog.skills.values()}
    assert sorted(by_name) == sorted(s.name for s in five.skills.values()) and len(catalog) == MAX_FAMILIES
    for skill in five.skills.values():
        assert by_name[skill.name].arguments == skill.arguments and by_name[skill.name].description == skill.description
    for fam in catalog.families:
        assert fam.skills, fam.key
        parent = fam.key.rsplit("-", 1)[0]
        assert {five.family_of(s.replace(fam.key, parent)) for s in fam.skills} == {parent}, fam.key
        assert all(s.startswith(f"Builtin::{fam.key}::") for s in fam.skills)


@pytest.mark.parametrize("k", SPLIT_KS)
def test_split_family_keys_are_valid_and_readable(split_streams, k):
    keys = split_streams[k].family_keys
    for key in keys:
        assert FAMILY_NAME.fullmatch(key), key
        assert re.fullmatch(r"t[1-5]_[a-z_]+-\d\d", key), key
    assert keys == sorted(keys)  # built-in families in T1..T5 order, their parts in order
    titles = [split_streams[k].catalog.family(key).title for key in keys]
    assert len(set(titles)) == len(titles)


def test_split_groups_related_skills():
    fams = {f.key: {s.name for s in f.skills} for f in split_families(20)}
    # Language & Speech splits into its audio and its text tools.
    assert {"transcribe", "denoise_audio", "change_voice", "splice_audio"} <= fams["t2_language_speech-01"]
    assert {"translate", "paraphrase", "correct_grammar", "simplify_text"} <= fams["t2_language_speech-02"]
    # Calls, payments: skills sharing argument pools end up together.
    together = [{"video_call", "voice_call"}, {"bank_transfer", "pay_bill", "pay_credit_card"},
                {"book_hotel", "book_restaurant", "rent_car"}]
    for group in together:
        assert any(group <= names for names in fams.values()), group
    sizes = [len(n) for n in fams.values()]
    assert max(sizes) <= 6 and min(sizes) >= 3  # balanced: 100 skills in 20 families
    assert split_families(20) == split_families(20)


def test_split_report_says_what_was_regenerated(split_streams):
    report = split_streams[50].report
    split = report["split"]
    assert split["families"] == 50 and sum(split["per_builtin_family"].values()) == 50
    assert split["cross_family_requests"].startswith("regenerated")
    # 1-skill families can form single requests only; the report counts and names them.
    single_only = [k for k, f in report["families"].items() if f["structures_formable"] == ["single"]]
    assert split["families_without"]["chain"] >= len(single_only) > 0
    for key in single_only:
        assert report["families"][key]["skills"] == 1
        assert report["families"][key]["train"]["structure"]["single"] == 8
    assert isinstance(split["redrawn_plans"], int)
    k100 = split_streams[100].report
    assert all(f["structures_formable"] == ["single"] for f in k100["families"].values())


def test_split_stream_round_trips(split_streams, tmp_path):
    stream = split_streams[20]
    stream.save(tmp_path / "k20")
    loaded = Stream.load(tmp_path / "k20")
    assert loaded.family_keys == stream.family_keys and loaded.name == "builtin-k20"
    assert [r.to_dict() for r in records(loaded)] == [r.to_dict() for r in records(stream)]
    meta = json.loads((tmp_path / "k20" / "stream.json").read_text())
    assert list(meta["orders"]) == ["O1"] and meta["orders"]["O1"] == stream.family_keys


# -- the synthetic generator ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def synthetic_1000():
    return build_synthetic_stream(1000, seed=5, train_per_family=3, test_per_family=1)


def test_synthetic_k1000_is_valid_and_labelled(synthetic_1000):
    stream = synthetic_1000
    assert stream.name == "synthetic-k1000" and "synthetic" in stream.source and stream.report["synthetic"] is True
    assert len(stream.family_keys) == 1000 and len(set(stream.family_keys)) == 1000
    for fam in stream.catalog.families:
        assert FAMILY_NAME.fullmatch(fam.key) and re.fullmatch(r"syn\d{4}_[a-z]+_[a-z]+", fam.key), fam.key
        assert fam.title.startswith("Synthetic:") and 3 <= len(fam.skills) <= 8
        assert all(s.startswith(f"Synthetic::{fam.key}::") for s in fam.skills)
    for skill in stream.catalog.skills.values():
        assert "synthetic" in skill.description
    structures = set()
    for rec in records(stream):
        assert Record.from_dict(rec.to_dict()) == rec
        assert {stream.catalog.family_of(t) for t in rec.graph.tasks} == {rec.family}
        structures.add(rec.structure)
    assert structures == {"single", "chain", "dag"}
    for key in stream.family_keys:
        assert len(stream.train[key]) == 3 and len(stream.test[key]) == 1
        assert validate_records(stream.train[key] + stream.test[key], stream.catalog, family=key).ok
    requests = [r.request for r in records(stream)]
    assert len(set(requests)) == len(requests)


def test_synthetic_families_are_disjoint(synthetic_1000):
    catalog = synthetic_1000.catalog  # a partition: every skill id in exactly one family
    per_domain: dict[str, set[str]] = {}
    for fam in catalog.families:
        domain = fam.key.rsplit("_", 1)[1]
        names = {s.rsplit("::", 1)[1] for s in fam.skills}
        assert not names & per_domain.get(domain, set()), fam.key  # a skill name never repeats within a domain
        per_domain.setdefault(domain, set()).update(names)
    assert set(per_domain) == set(DOMAINS)


def test_synthetic_is_deterministic_by_seed(tmp_path):
    a = build_synthetic_stream(40, seed=11, train_per_family=4, test_per_family=2)
    b = build_synthetic_stream(40, seed=11, train_per_family=4, test_per_family=2)
    c = build_synthetic_stream(40, seed=12, train_per_family=4, test_per_family=2)
    a.save(tmp_path / "a")
    b.save(tmp_path / "b")
    assert tree_digest(tmp_path / "a") == tree_digest(tmp_path / "b")
    assert a.catalog.to_dict() != c.catalog.to_dict()
    assert [r.request for r in records(a)] != [r.request for r in records(c)]
    loaded = Stream.load(tmp_path / "a")
    assert [r.to_dict() for r in records(loaded)] == [r.to_dict() for r in records(a)]
    assert [f.key for f in synthetic_families(40, seed=11)] == a.family_keys


def test_synthetic_cli(tmp_path):
    res = cli("exp", "stream", "build", "--source", "synthetic", "--families", 60, "--train-per-family", 2,
              "--test-per-family", 1, "--out", tmp_path / "syn")
    assert res.exit_code == 0, res.output
    stream = Stream.load(tmp_path / "syn")
    assert stream.name == "synthetic-k60" and len(stream.family_keys) == 60


# -- orders -----------------------------------------------------------------------------------------
def test_named_orders_unchanged_for_five(split_streams):
    stream = build_builtin_stream(train_per_family=1, test_per_family=1)
    keys = stream.family_keys
    assert stream.order("O1") == keys
    assert stream.order("O2") == [keys[2], keys[0], keys[4], keys[1], keys[3]]
    assert ORDERS == {"O1": (1, 2, 3, 4, 5), "O2": (3, 1, 5, 2, 4)}
    big = split_streams[20]
    assert big.order("O1") == big.family_keys  # every family, in list order
    with pytest.raises(StreamError, match="O2 is the paper's order of five families"):
        big.order("O2")


@pytest.mark.parametrize("k", [5, 20, 100])
def test_random_orders_are_seeded_permutations(split_streams, k):
    stream = split_streams[k] if k in split_streams else build_builtin_stream(train_per_family=1, test_per_family=1)
    orders = {seed: stream.order(f"R{seed}") for seed in range(6)}
    for order in orders.values():
        assert sorted(order) == sorted(stream.family_keys) and len(order) == k
    assert stream.order("R3") == orders[3]  # the same seed, the same order
    assert len({tuple(o) for o in orders.values()}) == 6  # different seeds, different orders


def test_random_orders_are_stable():
    # Pinned: a run resumed with another Python (or another stream of the same K) sees the same order.
    assert random_order(10, 7) == (7, 10, 3, 5, 2, 6, 9, 8, 4, 1)
    assert sorted(random_order(1000, 1)) == list(range(1, 1001))
    stream = build_synthetic_stream(12, seed=0, train_per_family=1, test_per_family=1)
    other = build_synthetic_stream(12, seed=9, train_per_family=1, test_per_family=1)
    positions = [stream.family_keys.index(k) + 1 for k in stream.order("R42")]
    assert positions == [other.family_keys.index(k) + 1 for k in other.order("R42")] == list(random_order(12, 42))


@pytest.mark.parametrize("name", ["R", "Rx", "R-1", "r7", "random:7"])
def test_bad_order_names(name):
    stream = build_builtin_stream(train_per_family=1, test_per_family=1)
    with pytest.raises(StreamError, match="unknown order"):
        stream.order(name)


# -- bad input: refused before any work -------------------------------------------------------------
@pytest.fixture
def no_sampling(monkeypatch):
    def fail(*a, **k):
        raise AssertionError("sampling started before the input was checked")
    monkeypatch.setattr(builtin, "sample_families", fail)
    import skillbank.data.synthetic as synthetic
    monkeypatch.setattr(synthetic, "sample_families", fail)


@pytest.mark.parametrize("k, message", [(101, "at most 100 families, since it has 100 skills"),
                                        (1000, "at most 100 families"), (4, "never merges"), (0, "never merges"),
                                        (True, "must be an integer"), ("10", "must be an integer")])
def test_builtin_family_count_errors(no_sampling, k, message):
    with pytest.raises(StreamError, match=message):
        build_builtin_stream(families=k)


def test_too_few_skills_for_the_requested_structures(no_sampling):
    with pytest.raises(StreamError, match=r"100 of 100 families have too few skills .* cannot form chain or dag"):
        build_builtin_stream(families=100, structures=("single", "chain", "dag"))
    with pytest.raises(StreamError, match=r"5 of 50 families have too few skills"):
        build_builtin_stream(families=50, structures=("single", "dag"))
    with pytest.raises(StreamError, match="non-empty subset"):
        build_builtin_stream(families=10, structures=("single", "loop"))
    with pytest.raises(StreamError, match=f"1..{SYNTHETIC_MAX}"):
        build_synthetic_stream(SYNTHETIC_MAX + 1)
    with pytest.raises(StreamError, match=f"1..{SYNTHETIC_MAX}"):
        build_synthetic_stream(0)


def test_requested_structures_are_the_only_ones_drawn():
    stream = build_builtin_stream(families=100, structures=("single",), train_per_family=2, test_per_family=1)
    assert {r.structure for r in records(stream)} == {"single"}
    stream = build_builtin_stream(families=20, structures=("single", "chain"), train_per_family=20, test_per_family=1)
    assert {r.structure for r in records(stream)} == {"single", "chain"}
    five = build_builtin_stream(structures=("single", "dag"), train_per_family=10, test_per_family=1)
    assert {r.structure for r in records(five)} == {"single", "dag"}
    assert five.report["structures_requested"] == ["single", "dag"]


def test_cli_bad_input_writes_nothing(tmp_path):
    for args, message in [(("--families", 101), "at most 100"),
                          (("--families", 100, "--structures", "single,chain"), "too few skills"),
                          (("--source", "synthetic"), "needs --families"),
                          (("--source", "synthetic", "--families", 5000), "1..1050"),
                          (("--source", "taskbench", "--families", 10), "apply to --source builtin or synthetic")]:
        out = tmp_path / "never"
        res = cli("exp", "stream", "build", "--out", out, *args)
        assert res.exit_code == 2, (args, res.output)
        # rich draws usage errors in a box: compare the words only
        assert message in " ".join(res.output.replace("│", " ").split()), (args, res.output)
        assert not out.exists()
