import json

import pytest

from skillbank.data.catalog import ArgSpec, Catalog, Family, Skill, skill_id, snake_name
from skillbank.data.records import Record, read_records, structure_of, write_records
from skillbank.errors import CatalogError, RecordError, UnknownSkillError
from skillbank.graph import TaskGraph

PAY = "S::f1::pay"
SEND = "S::f1::send"
OTHER = "S::f2::other"


def catalog():
    skills = [Skill(PAY, "f1", "pay", arguments=(ArgSpec("bill"),)), Skill(SEND, "f1", "send", arguments=(ArgSpec("content"),)),
              Skill(OTHER, "f2", "other")]
    return Catalog(skills, [Family("f1", "F1", (PAY, SEND)), Family("f2", "F2", (OTHER,))])


def line(rid="1", family="f1", request="pay the gas bill", nodes=((PAY, (("bill", "gas"),)),), links=()):
    return json.dumps({"id": rid, "family": family, "request": request, "graph": {
        "task_nodes": [{"task": t, "arguments": [{"name": n, "value": v} for n, v in a]} for t, a in nodes],
        "task_links": [{"source": s, "target": t} for s, t in links]}})


def write(tmp_path, *lines):
    p = tmp_path / "stage.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_round_trip(tmp_path):
    p = write(tmp_path, line("1"), "", line("2", request="pay gas then send it",
                                             nodes=((PAY, (("bill", "gas"),)), (SEND, (("content", "<node-0>"),)))))
    rs = read_records(p, catalog())
    assert [r.id for r in rs.records] == ["1", "2"] and rs.skipped == []
    assert rs.records[1].structure == "chain"
    out = tmp_path / "out.jsonl"
    write_records(out, rs.records)
    assert read_records(out).records == rs.records


@pytest.mark.parametrize("bad, reason", [
    ("{not json", "malformed JSON"),
    (line(request="   "), "empty request"),
    (json.dumps({"id": "1", "family": "f1", "request": "x"}), "missing field 'graph'"),
    (line(nodes=((PAY, (("bill", "<node-2>"),)),)), "does not exist"),
    (line(nodes=((PAY, ()), (SEND, ())), links=((PAY, SEND), (SEND, PAY))), "cycle"),
    (line(nodes=(("S::f1::nope", ()),)), "unknown skill"),
    ('["a list"]', "expected a JSON object"),
])
def test_bad_lines_name_file_and_line(tmp_path, bad, reason):
    p = write(tmp_path, line("0"), bad)
    with pytest.raises(RecordError, match=reason) as info:
        read_records(p, catalog())
    assert info.value.line == 2 and info.value.path == str(p)
    assert f"{p}:2:" in str(info.value)


def test_unknown_skill_is_typed(tmp_path):
    with pytest.raises(UnknownSkillError):
        read_records(write(tmp_path, line(nodes=(("S::x::y", ()),))), catalog())


def test_duplicate_ids_and_wrong_family(tmp_path):
    with pytest.raises(RecordError, match="duplicate record id '1' \\(first on line 1\\)"):
        read_records(write(tmp_path, line("1"), line("1")))
    with pytest.raises(RecordError, match="expected 'f2'"):
        read_records(write(tmp_path, line("1")), family="f2")


def test_skip_mode_counts_every_bad_line(tmp_path):
    p = write(tmp_path, line("1"), "{oops", line("2", request=""), line("3"), line("3"))
    rs = read_records(p, catalog(), skip_invalid=True)
    assert [r.id for r in rs.records] == ["1", "3"]
    assert [e.line for e in rs.skipped] == [2, 3, 5]


def test_files_from_other_editors(tmp_path):
    """A byte-order mark and CRLF line ends (Windows editors) read as plain UTF-8 JSONL; a line in another
    encoding is named like a malformed one, and skipping it keeps the rest."""
    p = tmp_path / "stage.jsonl"
    p.write_bytes(("\r\n".join([line("1"), line("2", request="pay the café bill").replace("\\u00e9", "é")])
                   + "\r\n").encode("utf-8-sig"))
    rs = read_records(p, catalog())
    assert [r.id for r in rs.records] == ["1", "2"] and rs.records[1].request == "pay the café bill"
    cafe = line("2", request="pay the café bill").replace("\\u00e9", "é")  # as an editor writes it
    p.write_bytes((line("1") + "\n").encode() + cafe.encode("latin-1") + b"\n"
                  + (line("3") + "\n").encode())
    with pytest.raises(RecordError, match=r"stage\.jsonl:2: not UTF-8 text \(byte 0xe9"):
        read_records(p, catalog())
    rs = read_records(p, catalog(), skip_invalid=True)
    assert [r.id for r in rs.records] == ["1", "3"] and [e.line for e in rs.skipped] == [2]


def test_json_and_toml_files_with_a_byte_order_mark_or_another_encoding(tmp_path):
    from skillbank.config import ConfigError, RunConfig
    (tmp_path / "cat.json").write_bytes(json.dumps(catalog().to_dict()).encode("utf-8-sig"))
    assert Catalog.load(tmp_path / "cat.json").family_keys == ["f1", "f2"]
    (tmp_path / "cat.json").write_bytes(json.dumps(catalog().to_dict(), ensure_ascii=False).replace(
        '"pay"', '"payé"').encode("latin-1"))
    with pytest.raises(CatalogError, match=r"cat\.json: not UTF-8 text \(byte 0xe9"):
        Catalog.load(tmp_path / "cat.json")
    (tmp_path / "run.toml").write_bytes('name = "café"\nmethods = ["sft"]\n'.encode("utf-8-sig"))
    assert RunConfig.from_toml(tmp_path / "run.toml").name == "café"
    (tmp_path / "run.toml").write_bytes('name = "café"\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match=r"run\.toml: not UTF-8 text"):
        RunConfig.from_toml(tmp_path / "run.toml")


def test_missing_file():
    with pytest.raises(RecordError, match="no such file"):
        read_records("/nonexistent/x.jsonl")


def test_structure_of():
    def gr(nodes, links=()):
        return TaskGraph.from_dict({"task_nodes": [{"task": t, "arguments": list(a)} for t, a in nodes],
                                    "task_links": [{"source": s, "target": t} for s, t in links]})
    assert structure_of(gr([(PAY, [])])) == "single"
    assert structure_of(gr([(PAY, []), (SEND, [])], [(PAY, SEND)])) == "chain"
    assert structure_of(gr([(PAY, []), (SEND, [])])) == "dag"  # two independent nodes


def test_catalog_partition_checks():
    s = [Skill("a", "f", "a"), Skill("b", "f", "b")]
    with pytest.raises(CatalogError, match="belong to no family"):
        Catalog(s, [Family("f", "F", ("a",))])
    with pytest.raises(CatalogError, match="in two families"):
        Catalog(s, [Family("f", "F", ("a", "b")), Family("g", "G", ("a",))])
    with pytest.raises(CatalogError, match="unknown skill"):
        Catalog(s, [Family("f", "F", ("a", "b", "c"))])
    with pytest.raises(CatalogError, match="appears twice"):
        Catalog(s + [Skill("a", "f", "a")], [Family("f", "F", ("a", "b"))])
    assert snake_name("Image Search (by Image)") == "image_search_by_image"
    assert skill_id("TaskBench", "t2_language_speech", "Text-to-Speech") == "TaskBench::t2_language_speech::text_to_speech"


def test_catalog_load_errors_name_the_file(tmp_path):
    with pytest.raises(CatalogError, match="no such file"):
        Catalog.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{oops")
    with pytest.raises(CatalogError, match="bad.json: not valid JSON"):
        Catalog.load(tmp_path / "bad.json")
    catalog().save(tmp_path / "ok.json")
    assert Catalog.load(tmp_path / "ok.json").family_keys == ["f1", "f2"]


# -- validate_records: every bad line at once (skillbank validate, learn) ---------------------------
def test_validate_reports_every_bad_line_with_all_reasons(tmp_path):
    from skillbank.data.records import validate_records
    cat = Catalog([Skill(PAY, "f1", "pay", arguments=(ArgSpec("bill", required=True),)),
                   Skill(SEND, "f1", "send", arguments=(ArgSpec("content"),)), Skill(OTHER, "f2", "other")],
                  [Family("f1", "F1", (PAY, SEND)), Family("f2", "F2", (OTHER,))])
    p = write(tmp_path,
              line("1"),                                                  # fine
              "{oops",                                                    # 2 malformed JSON
              line("2", request=" "),                                     # 3 empty request
              json.dumps({"id": "3", "family": "f1", "request": "x"}),     # 4 missing field
              line("4", nodes=((PAY, (("bill", "<node-3>"),)),)),         # 5 invalid graph
              line("5", nodes=(("S::f1::nope", ()),)),                    # 6 unknown skill
              line("6", nodes=((PAY, (("bill", "x"), ("amount", "3"))),)),  # 7 undeclared argument
              line("7", nodes=((PAY, ()),)),                              # 8 required argument missing
              line("8", family="f2"),                                     # 9 wrong family
              line("1"),                                                  # 10 duplicate id
              line("9", nodes=((OTHER, (("x", "1"),)),)),                 # 11 other family's skill + no args declared
              line("10", nodes=((SEND, (("content", "hi"),)),)))          # fine
    v = validate_records(p, cat, family="f1")
    assert [r.id for r in v.records] == ["1", "10"] and v.lines == 12 and not v.ok
    by_line = {e.line: e.reason for e in v.errors}
    assert sorted(by_line) == list(range(2, 12))
    assert "malformed JSON" in by_line[2] and "empty request" in by_line[3]
    assert "missing field 'graph'" in by_line[4] and "does not exist" in by_line[5]
    assert "unknown skill(s) ['S::f1::nope']" in by_line[6]
    assert "undeclared argument(s) ['amount'] (declared: ['bill'])" in by_line[7]
    assert "lacks required argument(s) ['bill']" in by_line[8]
    assert "family 'f2', expected 'f1'" in by_line[9]
    assert "duplicate record id '1' (first on line 1)" in by_line[10]
    assert "another family than 'f1'" in by_line[11] and "declares no arguments" in by_line[11]
    assert all(str(e).startswith(f"{p}:{e.line}: ") for e in v.errors)
    assert v.summary() == f"{p}: 10 bad line(s) of 12, 2 valid"
    with pytest.raises(RecordError, match="10 bad line") as info:
        v.raise_if_bad(limit=3)
    assert "and 7 more" in str(info.value)


def test_validate_in_memory_records_and_dicts():
    from skillbank.data.records import validate_records
    good = json.loads(line("1"))
    v = validate_records([good, Record.from_dict(json.loads(line("2"))), {"id": "3"}], catalog(), family="f1")
    assert [r.id for r in v.records] == ["1", "2"]
    assert len(v.errors) == 1 and v.errors[0].line == 3 and str(v.errors[0]).startswith("item 3: missing field")
    assert validate_records([good], catalog(), family="f1").raise_if_bad().ok
    assert validate_records([], catalog()).summary() == "records: 0 record(s), all valid"
