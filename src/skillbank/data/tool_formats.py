"""Skill catalogs in the formats agent builders already have.

Three shapes are read, told apart by their content (never by the file name):

* ``skillbank`` -- the project's own ``catalog.json``: ``{"families": [...], "skills": [...]}``
  (:meth:`skillbank.data.catalog.Catalog.to_dict`).
* ``openai`` -- an OpenAI function-calling ``tools`` list,
  ``[{"type": "function", "function": {"name", "description", "parameters": <JSON Schema>}}]``, also the
  older bare-function form ``[{"name", "description", "parameters"}]`` and either list under a
  ``"tools"`` / ``"functions"`` key (a chat request body).
* ``mcp`` -- an MCP ``tools/list`` result, ``{"tools": [{"name", "description", "inputSchema": <JSON Schema>}]}``,
  also inside its JSON-RPC envelope ``{"jsonrpc": "2.0", "id": 1, "result": {"tools": [...]}}``.

A tools list has no families: every tool of it belongs to the one family it is learned as (``learn
--family``). A tool's name is kept as its skill id, since it is what the agent calls; it is checked to
survive generation unchanged (:func:`skill_id_problem`). Each property of the tool's JSON Schema becomes
an :class:`~skillbank.data.catalog.ArgSpec` (name, type, description; ``required`` from the schema).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from skillbank.data.catalog import ArgSpec, Catalog, Family, Skill
from skillbank.errors import CatalogError
from skillbank.jsonfile import read_json

FORMATS = ("skillbank", "openai", "mcp")
EXPECTED = ("a skillbank catalog ({\"families\": [...], \"skills\": [...]}), an OpenAI tools list "
            "([{\"type\": \"function\", \"function\": {\"name\", \"description\", \"parameters\"}}]) or an MCP "
            "tools/list result ({\"tools\": [{\"name\", \"description\", \"inputSchema\"}]}, or {\"result\": {\"tools\": [...]}})")
MAX_ID = 128  # MCP's limit on tool names; OpenAI's is 64
_PART = r"[A-Za-z0-9_.\-/]+"
_SKILL_ID = re.compile(rf"{_PART}(?:::{_PART})*")


def skill_id_problem(name: Any) -> str | None:
    """Why ``name`` cannot be a skill id, or None.

    A skill id is written verbatim into every target and read back from generated text: the compact
    format puts it at the start of a node line, right before ``{``, strips the shard's ``::`` prefix and
    restores it on decode, and both the parser and the decoder's grammar trim whitespace. So an id may
    hold letters, digits, ``_ - . /`` and ``::`` between non-empty parts - the OpenAI function-name
    alphabet plus MCP's ``.`` and ``/`` and the project's own ``Source::family::name`` form."""
    if not isinstance(name, str) or not name:
        return "a tool needs a non-empty string name"
    if len(name) > MAX_ID:
        return f"longer than {MAX_ID} characters"
    if _SKILL_ID.fullmatch(name):
        return None
    if any(c.isspace() for c in name):
        return "contains whitespace (generated names are read up to '{' and trimmed, so it would not come back intact)"
    if "{" in name or "}" in name:
        return "contains a brace ('{' starts a node's arguments in the compact target format)"
    if ":" in name:
        return ("uses ':' other than '::' between non-empty parts ('::' separates the id's family prefix, "
                "which the compact format strips and restores)")
    bad = sorted({c for c in name if not re.fullmatch(r"[A-Za-z0-9_.\-/]", c)})
    return f"contains {''.join(bad)!r}: use letters, digits, '_', '-', '.', '/' and '::'"


def detect_format(data: Any) -> str | None:
    """``"skillbank"``, ``"openai"``, ``"mcp"``, or None when ``data`` is none of them."""
    if isinstance(data, dict):
        if "families" in data and "skills" in data:
            return "skillbank"
        if isinstance(data.get("result"), dict) and "tools" in data["result"]:
            return "mcp"
        for key in ("tools", "functions"):
            if isinstance(data.get(key), list):
                return _list_format(data[key])
        return None
    if isinstance(data, list):
        return _list_format(data)
    return None


def _tool_shape(tool: Any) -> str | None:
    if not isinstance(tool, dict):
        return None
    if tool.get("type") == "function" and isinstance(tool.get("function"), dict):
        return "openai"
    if "inputSchema" in tool:
        return "mcp"
    if "name" in tool and ("parameters" in tool or set(tool) <= {"name", "description", "strict"}):
        return "openai"  # the bare function object of the older ``functions`` API
    return None


def _list_format(items: list) -> str | None:
    shapes = {_tool_shape(t) for t in items}
    if len(shapes) == 1 and None not in shapes:
        return shapes.pop()
    if not items:
        return "openai"  # an empty list is refused later with its own reason
    return None


def tools_of(data: Any, fmt: str, where: str) -> list[dict]:
    """The tool objects of an ``openai`` or ``mcp`` catalog, each as ``{name, description, schema}``."""
    if isinstance(data, dict):
        if isinstance(data.get("result"), dict):
            data = data["result"]
        data = data.get("tools", data.get("functions"))
    if not isinstance(data, list):
        raise CatalogError(f"{where}: 'tools' must be a list, got {type(data).__name__}")
    if not data:
        raise CatalogError(f"{where}: the tools list is empty; a family needs at least one skill")
    out = []
    for i, tool in enumerate(data):
        shape = _tool_shape(tool)
        if shape != fmt:
            raise CatalogError(f"{where}: tool {i} is not an {fmt.upper() if fmt == 'mcp' else 'OpenAI'} tool "
                               f"(got {_describe(tool)}); every tool of one file must have the same form")
        if fmt == "openai":
            fn = tool["function"] if "function" in tool else tool
            schema, schema_key = fn.get("parameters"), "parameters"
        else:
            fn, schema, schema_key = tool, tool.get("inputSchema"), "inputSchema"
        name = fn.get("name")
        description = fn.get("description") or ""
        if not isinstance(description, str):
            raise CatalogError(f"{where}: tool {i} ({name!r}): 'description' must be a string")
        out.append({"name": name, "description": description.strip(), "schema": schema, "schema_key": schema_key})
    return out


def _describe(obj: Any) -> str:
    if isinstance(obj, dict):
        return "an object with keys " + ", ".join(repr(k) for k in list(obj)[:6])
    return f"a {type(obj).__name__}"


def _schema_type(prop: dict) -> str:
    """A JSON Schema property's type as one word ('string', 'integer|null', 'any')."""
    t = prop.get("type")
    if isinstance(t, str):
        return t
    if isinstance(t, list) and all(isinstance(x, str) for x in t):
        return "|".join(t)
    for key in ("anyOf", "oneOf"):
        if isinstance(prop.get(key), list):
            parts = [_schema_type(p) for p in prop[key] if isinstance(p, dict)]
            return "|".join(dict.fromkeys(parts)) or "any"
    if "enum" in prop:
        return "string" if all(isinstance(v, str) for v in prop["enum"]) else "any"
    return "any"


def arguments_from_schema(schema: Any, where: str) -> tuple[ArgSpec, ...]:
    """ArgSpecs from a tool's JSON Schema (``properties`` in their order, ``required`` kept)."""
    if schema is None:
        return ()
    if not isinstance(schema, dict):
        raise CatalogError(f"{where}: the schema must be a JSON Schema object, got {type(schema).__name__}")
    if schema.get("type", "object") != "object":
        raise CatalogError(f"{where}: the schema's type must be 'object' (arguments are named), got {schema['type']!r}")
    props = schema.get("properties", {})
    if not isinstance(props, dict):
        raise CatalogError(f"{where}: 'properties' must be an object mapping argument names to schemas")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise CatalogError(f"{where}: 'required' must be a list of argument names")
    unknown = [r for r in required if r not in props]
    if unknown:
        raise CatalogError(f"{where}: 'required' names {unknown}, which are not in 'properties'")
    args = []
    for name, prop in props.items():
        if not name or name != name.strip():
            # The graph parser trims argument names: such a name would not come back as declared.
            raise CatalogError(f"{where}: argument name {name!r} is empty or has leading/trailing whitespace")
        if not isinstance(prop, dict):
            raise CatalogError(f"{where}: the schema of argument {name!r} must be an object")
        desc = prop.get("description") or prop.get("title") or ""
        args.append(ArgSpec(name, _schema_type(prop), str(desc).strip(), name in required))
    return tuple(args)


def catalog_from_tools(data: Any, family: str, *, fmt: str | None = None, where: str = "catalog") -> Catalog:
    """A one-family :class:`Catalog` from an OpenAI tools list or an MCP tools/list result."""
    fmt = fmt or detect_format(data)
    if fmt not in ("openai", "mcp"):
        raise CatalogError(f"{where}: not an OpenAI tools list or MCP tools/list result; expected {EXPECTED}")
    if not isinstance(family, str) or not family.strip():
        raise CatalogError(f"{where}: an {fmt} tools catalog has no families; name the family its tools form "
                           "(learn --family NAME)")
    skills, seen = [], set()
    for i, tool in enumerate(tools_of(data, fmt, where)):
        name = tool["name"]
        problem = skill_id_problem(name)
        if problem:
            raise CatalogError(f"{where}: tool {i} name {name!r} cannot be a skill id: {problem}")
        if name in seen:
            raise CatalogError(f"{where}: tool name {name!r} appears twice")
        seen.add(name)
        if fmt == "mcp" and tool["schema"] is None:
            raise CatalogError(f"{where}: MCP tool {name!r} has no 'inputSchema' (required by MCP; "
                               "use {\"type\": \"object\"} for a tool without arguments)")
        args = arguments_from_schema(tool["schema"], f"{where}: tool {name!r} {tool['schema_key']}")
        skills.append(Skill(id=name, family=family, name=name, description=tool["description"], arguments=args))
    return Catalog(skills, [Family(family, family, tuple(s.id for s in skills))])


def parse_catalog(data: Any, family: str | None = None, *, where: str = "catalog") -> Catalog:
    """A Catalog from any of the three formats, already decoded from JSON."""
    fmt = detect_format(data)
    if fmt is None and isinstance(data, dict) and "error" in data and "jsonrpc" in data:
        raise CatalogError(f"{where}: a JSON-RPC error response, not a tools/list result: {data['error']!r}")
    if fmt is None:
        raise CatalogError(f"{where}: not a skill catalog (got {_describe(data)}); expected {EXPECTED}")
    if fmt == "skillbank":
        try:
            return Catalog.from_dict(data)
        except CatalogError as exc:
            raise CatalogError(f"{where}: {exc}") from None
    if family is None:
        raise CatalogError(f"{where} is an {'MCP tools/list result' if fmt == 'mcp' else 'OpenAI tools list'}, "
                           "which has no families: give the family its tools form (learn --family NAME)")
    return catalog_from_tools(data, family, fmt=fmt, where=where)


def load_catalog(path: str | Path, family: str | None = None) -> Catalog:
    """Read a catalog file in any of the three formats (``family`` names a tools list's one family)."""
    path = Path(path)
    return parse_catalog(read_json(path, CatalogError, what="catalog"), family, where=str(path))


def to_openai_tools(catalog: Catalog, family: str | None = None) -> list[dict]:
    """The catalog (or one family of it) as an OpenAI ``tools`` list."""
    return [{"type": "function", "function": {"name": s.id, "description": s.description,
                                              "parameters": _schema(s)}} for s in _skills(catalog, family)]


def to_mcp_tools(catalog: Catalog, family: str | None = None) -> dict:
    """The catalog (or one family of it) as an MCP ``tools/list`` result."""
    return {"tools": [{"name": s.id, "description": s.description, "inputSchema": _schema(s)}
                      for s in _skills(catalog, family)]}


def _skills(catalog: Catalog, family: str | None) -> list[Skill]:
    return catalog.subset(family) if family is not None else list(catalog.skills.values())


def _schema(skill: Skill) -> dict:
    props = {}
    for a in skill.arguments:
        # 'string|null' and the like go back as a list of types; 'any' as no type at all.
        t = a.type.split("|") if "|" in a.type else a.type
        props[a.name] = ({"type": t} if t != "any" else {}) | ({"description": a.description} if a.description else {})
    schema: dict = {"type": "object", "properties": props}
    required = [a.name for a in skill.arguments if a.required]
    if required:
        schema["required"] = required
    return schema
