"""Style augmentation: the request's surface moves, the argument values and the graph do not."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from skillbank.cli import app
from skillbank.data.augment import (STYLED_SUFFIX, STYLES, AugmentError, StyleAugment, augment_records,
                                    protected_values, restyle)
from skillbank.data.records import Record, read_records, write_records
from skillbank.graph import TaskGraph

from conftest import TASKBENCH_FIXTURE

TASKBENCH_SAMPLE = TASKBENCH_FIXTURE / "sample"


def graph(*nodes):
    return TaskGraph.from_dict({"task_nodes": [{"task": t, "arguments": [{"name": n, "value": v} for n, v in args]}
                                               for t, args in nodes], "task_links": []})


def values_in(record: Record) -> list[str]:
    return [v for v in protected_values(record.graph) if v in record.request]


@pytest.fixture(scope="module")
def builtin_records():
    from skillbank.data.builtin import build_builtin_stream
    stream = build_builtin_stream(seed=3, train_per_family=60, test_per_family=0)
    return [r for k in stream.family_keys for r in stream.train[k]]


def test_every_value_survives_every_rewrite_on_the_builtin_stream(builtin_records):
    for r in builtin_records:
        for k, name in enumerate(STYLES):  # each rewrite alone, then all of them at once
            for styles in ([name], list(STYLES)):
                text, used = restyle(r.request, r.graph, random.Random(k), styles)
                for v in values_in(r):
                    assert v in text, (name, r.request, text, v)


def test_values_survive_on_real_taskbench_requests():
    from skillbank.data.taskbench import load_taskbench
    stream = load_taskbench(TASKBENCH_SAMPLE.parent, train_per_family=1000)
    records = [r for k in stream.family_keys for r in [*stream.train[k], *stream.test[k]]]
    assert len(records) >= 50
    for n, rec in enumerate(records):
        text, _ = restyle(rec.request, rec.graph, random.Random(n), list(STYLES))
        assert all(v in text for v in values_in(rec)), (rec.request, text)


def test_a_value_inside_a_polite_frame_is_not_stripped():
    g = graph(("S::f::play", [("title", "Can you feel the love tonight")]))
    text, used = restyle("Can you feel the love tonight, please.", g, random.Random(0), ["no_politeness"])
    assert text.startswith("Can you feel the love tonight") and "please" not in text and used == ["no_politeness"]
    # the same frame as an opener goes, in the first sentence and in a later one
    g2 = graph(("S::f::call", [("number", "555-0100")]))
    assert restyle("Could you please call 555-0100?", g2, random.Random(0), ["no_politeness"])[0] == "call 555-0100?"
    assert restyle("I'm late. Can you call 555-0100?", g2, random.Random(0), ["no_politeness"])[0] == \
        "I'm late. call 555-0100?"


def test_case_and_quotes_move_but_values_keep_their_case():
    g = graph(("S::f::weather", [("city", "New York")]), ("S::f::sms", [("content", "<node-0>")]))
    text, _ = restyle('Get the weather in New York, then TEXT it to me.', g, random.Random(0),
                      ["lowercase", "no_punctuation", "connectors"])
    rest = text.replace("New York", "")
    assert "New York" in text and rest == rest.lower()
    assert "TEXT" not in text and not text.endswith(".")
    assert protected_values(g) == ["New York"]  # <node-0> is a reference, not text


def test_two_values_are_never_glued_together():
    g = graph(("S::f::merge", [("a", "a.png"), ("b", "b.png")]))
    for seed in range(50):
        text, _ = restyle("Merge a.png and b.png", g, random.Random(seed), ["terse", "shorthand", "connectors"])
        assert "a.pngb.png" not in text and "a.png" in text and "b.png" in text


def test_a_request_that_is_all_values_stays_as_it_is():
    g = graph(("S::f::alarm", [("time", "06:40")]))
    assert restyle("06:40", g, random.Random(0), ["lowercase", "terse"]) == ("06:40", [])
    out, report = augment_records([Record("1", "f", "06:40", g)], StyleAugment(fraction=1.0))
    assert out[0].request == "06:40" and out[0].id == "1" and report.unchanged == 1 and report.replaced == 0


def test_fraction_replaces_that_share_and_keeps_count_graphs_and_order(builtin_records):
    recs = builtin_records[:40]
    out, report = augment_records(recs, StyleAugment(fraction=0.5, seed=1))
    assert len(out) == len(recs) == report.records_out
    styled = [o for o in out if o.id.endswith(STYLED_SUFFIX)]
    assert len(styled) == report.replaced and report.replaced + report.unchanged == 20 and report.replaced >= 18
    for before, after in zip(recs, out):
        assert after.graph == before.graph and after.family == before.family
        assert after.id in (before.id, before.id + STYLED_SUFFIX)
        assert (after.request != before.request) == after.id.endswith(STYLED_SUFFIX)


def test_copies_add_styled_records_after_the_originals(builtin_records):
    recs = builtin_records[:10]
    out, report = augment_records(recs, StyleAugment(fraction=0.0, copies=2, seed=0))
    assert out[:10] == recs and report.added == len(out) - 10 >= 18
    assert {o.id for o in out[10:]} <= {f"{r.id}{STYLED_SUFFIX}-{c}" for r in recs for c in (1, 2)}


def test_same_seed_same_output_other_seed_other_output(builtin_records):
    recs = builtin_records[:30]
    a, _ = augment_records(recs, StyleAugment(fraction=1.0, seed=5))
    b, _ = augment_records(recs, StyleAugment(fraction=1.0, seed=5))
    c, _ = augment_records(recs, StyleAugment(fraction=1.0, seed=6))
    assert a == b and [r.request for r in a] != [r.request for r in c]
    # a record is styled the same way whatever else is in the set
    d, _ = augment_records(recs[3:4], StyleAugment(fraction=1.0, seed=5))
    assert d[0] == a[3]


@pytest.mark.parametrize("kwargs", [{"fraction": 1.5}, {"fraction": -0.1}, {"copies": -1}, {"copies": 1.5},
                                    {"fraction": 0, "copies": 0}])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(AugmentError):
        StyleAugment(**kwargs)


def test_unknown_style_is_refused():
    with pytest.raises(AugmentError, match="unknown style"):
        restyle("call 555", graph(("S::f::call", [("n", "555")])), random.Random(0), ["shouting"])


def test_cli_writes_valid_records_and_names_a_bad_line(tmp_path, builtin_records):
    src = tmp_path / "train.jsonl"
    write_records(src, builtin_records[:12])
    out = tmp_path / "styled.jsonl"
    res = CliRunner().invoke(app, ["augment", str(src), "--out", str(out), "--fraction", "0.5"])
    assert res.exit_code == 0, res.output
    got = read_records(out).records
    assert len(got) == 12 and sum(r.id.endswith(STYLED_SUFFIX) for r in got) >= 5
    assert "replaced by a styled version" in res.output

    bad = tmp_path / "bad.jsonl"
    bad.write_text(src.read_text() + "{not json\n")
    res = CliRunner().invoke(app, ["augment", str(bad), "--out", str(tmp_path / "x.jsonl")])
    assert res.exit_code != 0 and "bad.jsonl" in res.output and ":13" in res.output
    assert not (tmp_path / "x.jsonl").exists()

    res = CliRunner().invoke(app, ["augment", str(src), "--out", str(src)])
    assert res.exit_code != 0 and len(read_records(src).records) == 12


def test_one_joining_style_per_request_and_lists_get_a_bullet_on_every_step():
    g = graph(("S::f::denoise", [("audio", "a.wav")]), ("S::f::transcribe", [("audio", "<node-0>")]),
              ("S::f::translate", [("text", "<node-1>"), ("language", "German")]))
    request = "Clean up a.wav, then transcribe it, and after that translate the transcript into German."
    seen_list = False
    for seed in range(60):
        text, used = restyle(request, g, random.Random(seed), ["connectors"])
        assert "a.wav" in text and "German" in text
        if "\n- " in text:
            seen_list = True
            lines = text.splitlines()
            items = [line for line in lines if line.startswith("- ")]
            assert items[0] == "- Clean up a.wav" and len(items) == 3 and len(lines) - len(items) <= 1  # a header
        else:  # the two joints of one request are written the same way
            joints = [j for j in (" then ", " -> ", " \u2192 ", "; ", " + ", " and ", ". ") if j in text]
            assert text.count(joints[0]) >= 2 if joints else ", " in text
    assert seen_list
