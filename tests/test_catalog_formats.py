"""Catalogs in the formats agent builders already have: OpenAI tools, MCP tools/list, and the project's own."""
import json

import pytest

from skillbank.data.catalog import ArgSpec, Catalog, Family, Skill
from skillbank.data.tool_formats import (detect_format, load_catalog, parse_catalog, skill_id_problem,
                                         to_mcp_tools, to_openai_tools)
from skillbank.errors import CatalogError, GraphError
from skillbank.graph import TaskGraph
from skillbank.model import serialization

THERMO_SCHEMA = {"type": "object", "properties": {
    "room": {"type": "string", "description": "The room."},
    "temperature": {"type": "number", "description": "Degrees Celsius."},
    "mode": {"type": ["string", "null"], "enum": ["heat", "cool", None]}},
    "required": ["room", "temperature"]}
OPENAI = [{"type": "function", "function": {"name": "set_thermostat", "description": " Set a room's temperature. ",
                                            "parameters": THERMO_SCHEMA}},
          {"type": "function", "function": {"name": "get_battery_level", "description": "Battery state."}}]
MCP = {"tools": [{"name": "set_thermostat", "description": "Set a room's temperature.", "inputSchema": THERMO_SCHEMA},
                 {"name": "get_battery_level", "description": "Battery state.", "inputSchema": {"type": "object"}}]}


def check_thermo(cat: Catalog, family: str = "home"):
    assert cat.family_keys == [family] and cat.family(family).skills == ("set_thermostat", "get_battery_level")
    s = cat.skills["set_thermostat"]
    assert (s.id, s.name, s.family, s.description) == ("set_thermostat", "set_thermostat", family, "Set a room's temperature.")
    assert s.arguments == (ArgSpec("room", "string", "The room.", True), ArgSpec("temperature", "number", "Degrees Celsius.", True),
                           ArgSpec("mode", "string|null", "", False))
    assert cat.skills["get_battery_level"].arguments == ()


def test_openai_tools_list_and_its_other_shapes():
    check_thermo(parse_catalog(OPENAI, "home"))
    assert detect_format(OPENAI) == "openai"
    bare = [t["function"] for t in OPENAI]  # the older `functions` form
    check_thermo(parse_catalog(bare, "home"))
    check_thermo(parse_catalog({"tools": OPENAI}, "home"))  # a chat request body
    check_thermo(parse_catalog({"functions": bare}, "home"))


def test_mcp_result_and_jsonrpc_envelope():
    assert detect_format(MCP) == "mcp"
    check_thermo(parse_catalog(MCP, "home"))
    check_thermo(parse_catalog({"jsonrpc": "2.0", "id": 3, "result": MCP}, "home"))
    with pytest.raises(CatalogError, match="JSON-RPC error response"):
        parse_catalog({"jsonrpc": "2.0", "id": 3, "error": {"code": -32601, "message": "no"}}, "home")


def test_files_in_every_format_load_by_content(tmp_path):
    (tmp_path / "openai.json").write_text(json.dumps(OPENAI))
    (tmp_path / "mcp.txt").write_text(json.dumps(MCP))  # the suffix plays no part
    check_thermo(load_catalog(tmp_path / "openai.json", "home"))
    check_thermo(load_catalog(tmp_path / "mcp.txt", "home"))
    project = parse_catalog(OPENAI, "home")
    project.save(tmp_path / "catalog.json")
    check_thermo(load_catalog(tmp_path / "catalog.json"))  # the family comes from the file
    check_thermo(load_catalog(tmp_path / "catalog.json", "ignored"))
    check_thermo(Catalog.load(tmp_path / "catalog.json"))  # the project's own format alone
    with pytest.raises(CatalogError, match=r"openai\.json: expected an object.*tool_formats\.load_catalog"):
        Catalog.load(tmp_path / "openai.json")


def test_round_trip_through_openai_and_mcp():
    cat = parse_catalog(OPENAI, "home")
    check_thermo(parse_catalog(to_openai_tools(cat), "home"))
    check_thermo(parse_catalog(to_mcp_tools(cat), "home"))
    assert to_mcp_tools(cat)["tools"][0]["inputSchema"]["required"] == ["room", "temperature"]


def test_old_saved_catalogs_still_load_and_save_unchanged(tmp_path):
    old = {"families": [{"key": "f", "title": "F", "skills": ["S::f::a"]}],
           "skills": [{"id": "S::f::a", "family": "f", "name": "a", "description": "",
                       "arguments": [{"name": "x", "type": "string", "description": "an x"}]}]}
    (tmp_path / "old.json").write_text(json.dumps(old))
    cat = Catalog.load(tmp_path / "old.json")
    assert cat.skills["S::f::a"].arguments == (ArgSpec("x", "string", "an x"),)
    assert cat.to_dict() == old  # no "required": false added to files that never had it
    req = Catalog([Skill("a", "f", "a", arguments=(ArgSpec("x", required=True),))], [Family("f", "F", ("a",))])
    assert Catalog.from_dict(req.to_dict()).skills["a"].arguments[0].required


@pytest.mark.parametrize("data, family, match", [
    ({"hello": 1}, "home", "not a skill catalog .*expected a skillbank catalog"),
    ("just text", "home", "not a skill catalog"),
    ([{"name": "a", "inputSchema": {}}, {"type": "function", "function": {"name": "b"}}], "home", "not a skill catalog"),
    (OPENAI, None, "OpenAI tools list, which has no families: give the family"),
    (MCP, None, "MCP tools/list result"),
    ([], "home", "empty"),
    ({"tools": []}, "home", "empty"),
    ([{"type": "function", "function": {"name": "set thermostat"}}], "home", "whitespace"),
    ([{"type": "function", "function": {"name": "a{b"}}], "home", "brace"),
    ([{"type": "function", "function": {"name": "home:set"}}], "home", "':' other than '::'"),
    ([{"type": "function", "function": {"name": "a::::b"}}], "home", "':' other than '::'"),
    ([{"type": "function", "function": {"name": "caf\u00e9"}}], "home", "contains 'é'"),
    ([{"type": "function", "function": {"name": ""}}], "home", "non-empty string name"),
    ([{"type": "function", "function": {"name": "x" * 129}}], "home", "longer than 128"),
    ([{"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "a"}}], "home",
     "'a' appears twice"),
    ([{"type": "function", "function": {"name": "a", "parameters": {"type": "array"}}}], "home", "type must be 'object'"),
    ([{"type": "function", "function": {"name": "a", "parameters": {"type": "object", "properties": {"x": {}},
                                                                     "required": ["y"]}}}], "home", "not in 'properties'"),
    ([{"type": "function", "function": {"name": "a", "parameters": {"type": "object", "properties": {" x": {}}}}}],
     "home", "leading/trailing whitespace"),
    ({"tools": [{"name": "a", "description": "no schema", "inputSchema": None}]}, "home", "no 'inputSchema'"),
    ({"families": [], "skills": [{"id": "a", "family": "f", "arguments": [{"nme": "x"}]}]}, None, "needs a non-empty string 'name'"),
])
def test_bad_catalogs_say_what_was_expected(data, family, match):
    with pytest.raises(CatalogError, match=match):
        parse_catalog(data, family, where="cat.json")


def test_errors_name_the_file(tmp_path):
    (tmp_path / "tools.json").write_text('[{"type": "function", "function": {"name": "bad name"}}]')
    with pytest.raises(CatalogError, match=r"tools\.json: tool 0 name 'bad name' cannot be a skill id"):
        load_catalog(tmp_path / "tools.json", "home")
    (tmp_path / "other.json").write_text('{"rows": []}')
    with pytest.raises(CatalogError, match=r"other\.json: not a skill catalog"):
        load_catalog(tmp_path / "other.json", "home")


@pytest.mark.parametrize("names", [
    ["set_thermostat", "get-battery", "v2.meter", "energy/solar"],   # bare names: no prefix to strip
    ["home::set", "home::get"],                                        # a shared '::' prefix, stripped in compact
    ["home::set", "other::get", "plain"],                              # mixed: written in full
    ["Src::home::set", "Src::home::sub::get"],
])
def test_allowed_ids_round_trip_through_both_target_formats(names):
    """What the id check lets through must come back from generated text unchanged, with the family prefix
    a shard computes (train.executor.common_prefix)."""
    from skillbank.train.executor import common_prefix
    assert all(skill_id_problem(n) is None for n in names)
    prefix = common_prefix(names)
    graph = TaskGraph.from_dict({"task_nodes": [{"task": n, "arguments": [{"name": "x", "value": str(i)}]}
                                                for i, n in enumerate(names)], "task_links": []})
    for fmt in ("compact", "json"):
        back = serialization.decode(serialization.encode(graph, fmt, prefix), fmt, prefix)
        assert back.graph is not None and back.graph.canonical() == graph.canonical(), (fmt, back.error)


def test_refused_ids_would_not_round_trip():
    """The reasons are real: such names break the compact format or are trimmed."""
    for name in ("a b", " a"):
        assert skill_id_problem(name)
    g = TaskGraph.from_dict({"task_nodes": [{"task": "a{b", "arguments": []}], "task_links": []})
    with pytest.raises(GraphError):
        serialization.encode(g, "compact", "")


def test_example_family_catalogs_agree():
    from pathlib import Path
    root = Path(__file__).resolve().parents[1] / "examples" / "home_energy"
    a, b = load_catalog(root / "tools.json", "home_energy"), load_catalog(root / "tools.mcp.json", "home_energy")
    assert a.to_dict() == b.to_dict() and len(a) == 8
