"""The "users" evaluation sets over the built-in catalog (tests/fixtures/users_*.jsonl): the FROZEN TEST PART of
the hand-written evaluation.

Written on 2026-12-03, blind to the scope gate's and the router's design (their code was not read while
writing them), as a user of the product would type requests. No setting of the scope gate or the router is
to be chosen on these sets: they only measure a configuration chosen elsewhere. The older hand-written sets,
``paraphrase_builtin*.jsonl`` and ``offdomain*.jsonl``, are the development part (looked at while designing).

``users_indomain.jsonl``: 100 requests, 20 per family, each with a gold graph in the built-in stream's
conventions. Per family the styles cover terse commands (2-4 words), chatty preambles, requests that carry a
payload (a quoted passage to translate, summarise or proofread, a pasted message to send, a question with its
context, a prompt for a generator, a script to narrate), file names and paths, URLs, e-mail addresses, phone
numbers, typos, non-native phrasing, multi-step requests (chained or independent), polite/formal letters,
all-lowercase chat and emoji.

``users_offdomain.jsonl``: 160 requests no skill of the catalog performs, in six categories:
``general_question`` (20), ``chit_chat`` (20, with short acknowledgements), ``code_math`` (20),
``other_domain_tool`` (25: tools for domains the catalog has no family for: smart home, car, navigation,
fitness, DevOps, phone settings...), ``near_miss`` (50, 10 per family, each with ``closest_family``: the
family's objects with an action none of the catalog's skills performs: cancel, delete, track, undo, trim,
convert, compress...) and ``prompt_injection`` (25: "ignore previous instructions", fake system messages,
prompt extraction, jailbreak role play; none hides a real in-domain task).

These checks keep the sets honest: the gold is valid and canonical, every literal is copyable from its
request, no request reuses the generator's phrasing, and no request repeats one of the older fixtures.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from skillbank.data.builtin import build_builtin_catalog, build_builtin_stream, builtin_skill_id
from skillbank.data.builtin_catalog import CONTEXTS, FAMILIES, POOLS
from skillbank.data.records import validate_records
from skillbank.graph import NODE_REF

from test_paraphrase_fixture import _rendered_clauses, literal  # noqa: E402 (the same template check)

FIXTURES = Path(__file__).resolve().parent / "fixtures"
INDOMAIN = FIXTURES / "users_indomain.jsonl"
OFFDOMAIN = FIXTURES / "users_offdomain.jsonl"
PER_FAMILY = 20
MIN_PAYLOADS = 6  # requests per family with a literal free-text value of at least four words
CATEGORIES = {"general_question": 20, "chit_chat": 20, "code_math": 20, "other_domain_tool": 25,
              "near_miss": 50, "prompt_injection": 25}
NEAR_MISS_PER_FAMILY = 10
OLDER = sorted(FIXTURES.glob("paraphrase_builtin*.jsonl")) + sorted(FIXTURES.glob("offdomain*.jsonl"))
FAMS = {fam.key: fam for fam in FAMILIES}


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _key(text: str) -> str:
    return " ".join(text.casefold().split())


@pytest.fixture(scope="module")
def catalog():
    return build_builtin_catalog()


@pytest.fixture(scope="module")
def records(catalog):
    # JSON, record fields, graph contract, skill ids, declared and required argument names, unique ids
    checked = validate_records(INDOMAIN, catalog)
    assert not checked.errors, [str(e) for e in checked.errors[:5]]
    return checked.records


@pytest.fixture(scope="module")
def off_rows() -> list[dict]:
    return _rows(OFFDOMAIN)


@pytest.fixture(scope="module")
def generated() -> set[str]:
    stream = build_builtin_stream(seed=0, train_per_family=200, test_per_family=50)
    return {_key(r.request) for key in stream.family_keys for split in (stream.train, stream.test)
            for r in split[key]}


@pytest.fixture(scope="module")
def older_requests() -> set[str]:
    return {_key(row["request"]) for path in OLDER for row in _rows(path)}


# -- in-domain ---------------------------------------------------------------------------------
def test_indomain_counts_ids_and_distinct_requests(records, catalog):
    assert Counter(r.family for r in records) == {key: PER_FAMILY for key in catalog.family_keys}
    for rec in records:
        assert re.fullmatch(rf"user-{FAMS[rec.family].short}-\d\d", rec.id), rec.id
    keys = [_key(r.request) for r in records]
    assert len(keys) == len(set(keys)), [k for k, c in Counter(keys).items() if c > 1]


def test_indomain_nodes_use_their_familys_skills(records, catalog):
    for rec in records:
        family_skills = set(catalog.family(rec.family).skills)
        assert len(set(rec.graph.tasks)) == len(rec.graph.tasks), f"{rec.id} repeats a skill"
        for node in rec.graph.nodes:
            assert node.task in family_skills, (rec.id, node.task)
            names = [a.name for a in node.arguments]
            assert len(names) == len(set(names)), (rec.id, node.task, names)
            assert set(names) == set(catalog.skills[node.task].argument_names), (rec.id, node.task, names)


def test_indomain_literals_are_verbatim_and_references_type_check(records):
    for rec in records:
        fam = FAMS[rec.family]
        skills = {builtin_skill_id(fam, sk): sk for sk in fam.skills}
        for i, node in enumerate(rec.graph.nodes):
            args = {a.name: a for a in skills[node.task].args}
            for arg in node.arguments:
                if literal(arg.value):
                    assert arg.value.strip() and arg.value in rec.request, (rec.id, arg.name, arg.value)
                    continue
                j = int(NODE_REF.match(arg.value).group(1))
                assert 0 <= j < i, (rec.id, i, arg.value)
                produced = skills[rec.graph.nodes[j].task].output
                assert produced in args[arg.name].accepts, (rec.id, node.task, arg.name, produced)


def test_indomain_links_are_canonical(records):
    for rec in records:
        assert len(set(rec.graph.links)) == len(rec.graph.links), rec.id
        assert set(rec.graph.links) == set(rec.graph.canonical_links()), rec.id
        extra = set(rec.graph.links) - set(rec.graph.implied_links())
        assert not extra or rec.family == "t1_daily_life", (rec.id, extra)  # only Daily Life has order links


def test_indomain_mix_of_sizes_and_payloads(records, catalog):
    for key in catalog.family_keys:
        mine = [r for r in records if r.family == key]
        sizes = Counter(len(r.graph.nodes) for r in mine)
        assert sizes[1] >= 10 and sizes[2] + sizes[3] >= 4, (key, sizes)
        assert any(n.references() for r in mine for n in r.graph.nodes), key  # a chain
        assert any(len(r.graph.nodes) > 1 and not r.graph.implied_links() for r in mine), key  # independent
        assert sum(len(r.request.split()) <= 4 for r in mine) >= 2, key  # terse
        fam = FAMS[key]
        skills = {builtin_skill_id(fam, sk): sk for sk in fam.skills}

        def payload(rec) -> bool:
            for node in rec.graph.nodes:
                args = {a.name: a for a in skills[node.task].args}
                for arg in node.arguments:
                    spec = args[arg.name]
                    free = spec.type == "text" or POOLS[spec.pool].quote
                    if literal(arg.value) and free and len(arg.value.split()) >= 4:
                        return True
            return False
        assert sum(map(payload, mine)) >= MIN_PAYLOADS, key


def test_indomain_not_the_generators_phrasing(records, generated):
    assert not {_key(r.request) for r in records} & generated
    for rec in records:
        fam = FAMS[rec.family]
        skills = {builtin_skill_id(fam, sk): sk for sk in fam.skills}
        text = rec.request.lower()
        for node in rec.graph.nodes:
            for clause in _rendered_clauses(fam, skills[node.task], node, rec.graph.nodes):
                assert clause.lower() not in text, (rec.id, clause)
        for sentence in CONTEXTS:
            assert sentence.lower() not in text, (rec.id, sentence)


def test_indomain_repeats_no_older_fixture(records, older_requests):
    clash = [r.id for r in records if _key(r.request) in older_requests]
    assert not clash, clash


# -- off-domain --------------------------------------------------------------------------------
def test_offdomain_fields_ids_and_counts(off_rows):
    for row in off_rows:
        fields = {"id", "category", "request"} | ({"closest_family"} if row.get("category") == "near_miss" else set())
        assert set(row) == fields, row
        assert all(isinstance(v, str) and v.strip() for v in row.values()), row
    ids = [row["id"] for row in off_rows]
    assert ids == [f"uoff-{n:03d}" for n in range(1, len(ids) + 1)]
    assert Counter(row["category"] for row in off_rows) == CATEGORIES


def test_near_misses_name_a_family(off_rows):
    near = [row for row in off_rows if row["category"] == "near_miss"]
    assert Counter(row["closest_family"] for row in near) == {key: NEAR_MISS_PER_FAMILY for key in FAMS}


def test_offdomain_requests_are_new(off_rows, records, generated, older_requests):
    keys = [_key(row["request"]) for row in off_rows]
    assert len(keys) == len(set(keys)), [k for k, c in Counter(keys).items() if c > 1]
    assert not set(keys) & older_requests, sorted(set(keys) & older_requests)
    assert not set(keys) & {_key(r.request) for r in records}
    assert not set(keys) & generated
    for row in off_rows:
        for sentence in CONTEXTS:
            assert sentence.lower() not in row["request"].lower(), (row["id"], sentence)


def test_offdomain_lengths_vary(off_rows):
    words = [len(row["request"].split()) for row in off_rows]
    assert sum(w <= 3 for w in words) >= 15 and sum(w >= 15 for w in words) >= 10
