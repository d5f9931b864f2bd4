"""The hand-written off-domain sets (tests/fixtures/offdomain*.jsonl).

``offdomain.jsonl``: 120 requests that no skill of the built-in catalog covers, used to measure whether the system declines
to plan them ("no skill applies"). Four categories of about 30 each: ``general_question`` (facts,
history, math, definitions), ``chit_chat`` (greetings, small talk, meta questions, keyboard mashing,
emoji), ``missing_tool`` (concrete tasks for tools the catalog lacks, some sharing the in-domain
vocabulary: file names, cities, flight numbers, banks, phone numbers) and ``advice_opinion`` (advice,
opinions and reasoning help that need no tool). A few are not in English.

``offdomain_holdout.jsonl``: 60 more in the same four categories (15 each), written later on other
topics, before the out-of-scope detector's word normalisation was designed, and kept out of that design.

``offdomain_short.jsonl``: 40 short ones (at most six words), 16 of them acknowledgements, politeness and
reactions ("thx", "sounds good", "well done") and 8 per other category. Written when a probe of short
messages found "thanks!" and "awesome" passing the scope check, before any change to it was measured on them.

``offdomain_injection.jsonl``: 60 prompt-injection requests (``prompt_injection``: overrides, jailbreak personas,
fake system messages, prompt and key exfiltration, overrides bundled with a tool action, obfuscated and
non-English ones; about a third name the built-in skills' objects), written by a helper shown only the skill list,
not the other sets or the shipped outlier corpus, before the corpus's prompt-injection part was measured on them.

These checks keep the fixtures well formed and disjoint from the built-in generator's own requests.
"""
from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from skillbank.data.builtin import build_builtin_stream

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CATEGORIES = {"general_question", "chit_chat", "missing_tool", "advice_opinion"}
# file -> (requests, fewest per category, id prefix, categories)
SETS = {"offdomain.jsonl": (120, 25, "off", CATEGORIES), "offdomain_holdout.jsonl": (60, 15, "hoff", CATEGORIES),
        "offdomain_short.jsonl": (40, 8, "soff", CATEGORIES),
        "offdomain_injection.jsonl": (60, 60, "inj", {"prompt_injection"})}


def read_rows(path: Path) -> list[dict]:
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        assert line.strip(), f"line {n} is blank"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:  # pragma: no cover - only on a broken fixture
            pytest.fail(f"line {n} is not valid JSON: {exc}")
        assert isinstance(row, dict), f"line {n} is not a JSON object"
        out.append(row)
    return out


@pytest.fixture(scope="module", params=sorted(SETS))
def fixture_file(request):
    return request.param


@pytest.fixture(scope="module")
def rows(fixture_file) -> list[dict]:
    return read_rows(FIXTURES / fixture_file)


def test_every_line_has_exactly_the_three_string_fields(rows):
    for row in rows:
        assert set(row) == {"id", "category", "request"}, row
        assert all(isinstance(v, str) for v in row.values()), row


def test_total_and_ids(rows, fixture_file):
    total, _, prefix, _ = SETS[fixture_file]
    assert len(rows) == total
    ids = [row["id"] for row in rows]
    assert len(ids) == len(set(ids)), [i for i, c in Counter(ids).items() if c > 1]
    for rid in ids:
        assert re.fullmatch(rf"{prefix}-\d{{3}}", rid), rid


def test_the_sets_share_no_request():
    texts = [{row["request"].strip().casefold() for row in read_rows(FIXTURES / f)} for f in sorted(SETS)]
    for a, b in itertools.combinations(texts, 2):
        assert not a & b


def test_exactly_the_categories_with_enough_each(rows, fixture_file):
    _, MIN_PER_CATEGORY, _, categories = SETS[fixture_file]
    counts = Counter(row["category"] for row in rows)
    assert set(counts) == categories, counts
    for cat, n in counts.items():
        assert n >= MIN_PER_CATEGORY, (cat, n)


def test_requests_are_non_empty_and_distinct(rows):
    keys = []
    for row in rows:
        assert row["request"].strip(), row["id"]
        keys.append(row["request"].strip().casefold())
    dups = [k for k, c in Counter(keys).items() if c > 1]
    assert not dups, dups


def test_no_request_occurs_in_the_builtin_stream(rows):
    stream = build_builtin_stream(seed=0, train_per_family=200, test_per_family=50)
    generated = {r.request.strip().casefold() for key in stream.family_keys
                 for split in (stream.train, stream.test) for r in split[key]}
    clash = [row["id"] for row in rows if row["request"].strip().casefold() in generated]
    assert not clash, clash
