"""TaskBench as a continual stream of five skill families (T1..T5).

Sources. :func:`load_taskbench` reads a local folder; per domain (``dailylifeapis``, ``huggingface``,
``multimedia``) it takes the first file that exists: gold records from ``data_<domain>/data.json``
(TaskBench's layout), ``<domain>/data.json`` or ``sample/<domain>.jsonl`` (all JSON Lines); the
tool catalog from ``data_<domain>/tool_desc.json`` or ``<domain>/tool_desc.json``.
:func:`load_taskbench_hub` reads the Hugging Face dataset ``microsoft/Taskbench`` (one config per
domain, split ``test``) and sends its rows through the same normalisation.

Catalog. Skill ids are ``TaskBench::<family_key>::<snake_name(tool)>``. The 40 daily-life APIs keep
their named parameters. The 23 Hugging Face and 40 multimedia tools are merged by name into 60 skills
(Text-to-Image, Text-to-Video, Image-to-Text are declared identically by both); their arguments are
named from the declared ``input-type`` list: the first input of a type is named by the type
(``image``), later ones get a suffix (``image_2``, ``image_3``). ``resources/taskbench_families.json``
holds the partition (40 / 11 / 21 / 9 / 19 skills).

Normalising a gold record (every repair is counted under ``fixes``, every drop has a reason):

* Tool names: exact, else the unique tool equal up to case/spaces/punctuation (``AudioNoiseReduction``);
  otherwise ``unknown_tool``. Hugging Face and multimedia records resolve against the merged 60 tools.
* ``n_tools`` is ignored (it often disagrees with the nodes), and so are extra node fields (``output``).
  ``arguments`` given as a string or number is one bare value; a node without ``arguments`` takes its
  other fields' values (``{"input_file": "example.wav"}``) as bare values.
* Placeholders: ``<nodeI>``, ``<node_i>``, ``<output from node-i>``, ``<GENERATED>-i`` become
  ``<node-i>``; ``<output_of_Tool>`` / ``<output-from-Tool>`` becomes a reference to the latest earlier
  node running that tool (none: ``unresolved_placeholder``). Other whole-value placeholders
  (``<content of example.txt>``) and references inside longer text are literal values, kept verbatim.
* ``{name, value}`` arguments (daily life): a name equal to a declared parameter up to case/punctuation
  is mapped to it; any other name (``bill_type`` for ``bill``) drops the record as
  ``unknown_argument_name`` -- a guess would put names in the gold that the catalog does not declare.
* Bare values (Hugging Face / multimedia) are named by giving each value, in order, the first free slot
  of its inferred type: a ``<node-j>`` reference has node j's declared output type; ``http(s)://...`` is
  ``url``; a file name ending .jpg/.jpeg/.png/.gif/.bmp/.webp is ``image``, .wav/.mp3/.flac/.ogg/.m4a
  ``audio``, .mp4/.avi/.mov/.mkv/.webm ``video``; anything else (numbers too) is ``text``. Values left
  over take the remaining slots in declaration order. More values than slots, or a list/object/null
  value, is ``bad_argument``.
* Self or forward references occur in two forms: nodes listed out of dependency order (0-based), and
  1-based references. Each reading whose references are in range and acyclic is scored by how many of
  them are declared links; the best positive one wins (0-based on a tie), and the nodes are put in
  dependency order (``nodes_reordered`` / ``references_one_based``). Otherwise ``invalid_graph``.
* Links resolve to skill ids by tool name, or by node index when given as numbers. skillbank's canonical
  links are the union of declared links and those implied by ``<node-j>`` references (see
  :mod:`skillbank.graph`; TaskBench's evaluator derives its Hugging Face / multimedia links from the
  references). A cycle or a link to a missing node is ``invalid_graph``.
* Skills from two families: ``cross_family``. ``structure`` is TaskBench's ``type`` unless missing or
  contradicting the node count (then derived). Ids are prefixed by the domain (``multimedia-45760948``)
  so two domains feeding one family never collide. Graphs are stored in canonical form.

Split. In a family, a request equal (up to white space) to an earlier one -- domains in the order
above, then file order -- is dropped as ``duplicate_request``, so no held-out request is also trained
on. The rest is sorted by id and shuffled by ``random.Random(f"{seed}:{family}")`` (one generator per
family, so one family's data never moves another's split): the first ``train_per_family`` records
train, the rest are held out (at most ``test_per_family`` when given).

Report (``Stream.report``): per domain the source, ``records`` read, ``loaded``, ``dropped`` per reason
(``records == loaded + sum(dropped)``), up to three ``examples`` per reason and the ``fixes`` counts of
loaded records; per family the record/train/test counts; ``warnings``, one line per family left without
held-out records (``skillbank exp stream build`` prints them, with the drop reasons). The default
``train_per_family`` of 1000 puts a small sample entirely into training.
"""
from __future__ import annotations

import json
import random
import re
from collections import Counter
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Mapping

from skillbank.data.catalog import ArgSpec, Catalog, Family, Skill, skill_id
from skillbank.data.records import Record, iter_jsonl, structure_of
from skillbank.data.stream import Stream
from skillbank.errors import CatalogError, GraphError, RecordError, StreamError
from skillbank.graph import NODE_REF, Argument, Link, Node, TaskGraph, canonical_value

SOURCE = "TaskBench"
DOMAINS = ("dailylifeapis", "huggingface", "multimedia")
HUB_REPO = "microsoft/Taskbench"
HUB_SPLIT = "test"
REASONS = ("malformed", "empty_request", "unknown_tool", "unknown_argument_name", "bad_argument",
           "unresolved_placeholder", "invalid_graph", "cross_family", "duplicate_id", "duplicate_request")
EXAMPLES_PER_REASON = 3

# Hugging Face and multimedia tools share one merged namespace; the daily-life APIs have their own.
_NAMESPACE = {"dailylifeapis": "daily", "huggingface": "media", "multimedia": "media"}
_STRUCTURES = {"single": "single", "node": "single", "chain": "chain", "dag": "dag"}
_EXT_TYPES = {**dict.fromkeys(("jpg", "jpeg", "png", "gif", "bmp", "webp"), "image"),
              **dict.fromkeys(("wav", "mp3", "flac", "ogg", "m4a"), "audio"),
              **dict.fromkeys(("mp4", "avi", "mov", "mkv", "webm"), "video")}
_NODE_FORMS = re.compile(r"<\s*(?:output[\s_-]*(?:from|of)[\s_-]*)?node[\s_-]?(\d+)\s*>|<GENERATED>-(\d+)", re.I)
_OUTPUT_OF = re.compile(r"<\s*output[\s_-]*(?:from|of)[\s_-]*(.+?)\s*>", re.I)


def _loose(name: Any) -> str:
    """Name key ignoring case, spaces and punctuation: ``AudioNoiseReduction`` ~ ``Audio Noise Reduction``."""
    return re.sub(r"[^0-9a-z]", "", str(name).lower())


# -- catalog -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Tool:
    name: str  # TaskBench's name
    skill: str  # canonical skill id
    slots: tuple[ArgSpec, ...]
    output: str | None  # declared output type (media tools), used to type <node-j> references


class _Namespace:
    """Tools one domain's records may name, looked up exactly or by :func:`_loose` key."""

    def __init__(self, tools: Iterable[_Tool]):
        self.tools = {t.name: t for t in tools}
        keys = Counter(_loose(n) for n in self.tools)
        self.loose = {_loose(n): t for n, t in self.tools.items() if keys[_loose(n)] == 1}

    def resolve(self, name: Any) -> tuple[_Tool | None, bool]:
        """(tool, matched_only_loosely); (None, False) when no tool has this name."""
        name = str(name).strip()
        if name in self.tools:
            return self.tools[name], False
        tool = self.loose.get(_loose(name))
        return tool, tool is not None


def read_tool_desc(path: str | Path) -> list[dict]:
    """The tool list of a TaskBench ``tool_desc.json`` (``{"nodes": [...]}`` or a bare list)."""
    path = Path(path)
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise CatalogError(f"{path}: cannot read a tool catalog ({exc})") from None
    nodes = obj.get("nodes") if isinstance(obj, dict) else obj
    if not isinstance(nodes, list) or not all(isinstance(t, dict) and "id" in t for t in nodes):
        raise CatalogError(f"{path}: expected {{'nodes': [{{'id': ...}}, ...]}}")
    return nodes


def family_partition(path: str | Path | None = None) -> list[dict]:
    """The family partition: ``[{"key", "title", "tools": [TaskBench tool names]}, ...]`` in T1..T5 order."""
    res = resources.files("skillbank").joinpath("resources/taskbench_families.json") if path is None else Path(path)
    text = res.read_text(encoding="utf-8")
    return json.loads(text)["families"]


def _tool_spec(tool: dict) -> tuple[str, tuple[ArgSpec, ...], str | None]:
    """(description, argument specs, output type) of one tool_desc entry."""
    desc = str(tool.get("desc", ""))
    if "parameters" in tool:  # daily-life API: named parameters
        args = tuple(ArgSpec(str(p["name"]), str(p.get("type", "string")), str(p.get("desc", "")))
                     for p in tool["parameters"])
        return desc, args, None
    seen: Counter = Counter()
    args = []
    for t in tool.get("input-type", []):
        t = str(t).strip().lower()
        seen[t] += 1
        args.append(ArgSpec(t if seen[t] == 1 else f"{t}_{seen[t]}", t))
    outputs = [str(t).strip().lower() for t in tool.get("output-type", [])]
    return desc, tuple(args), outputs[0] if outputs else None


def _build(tool_descs: Mapping[str, list[dict]], families: list[dict]) -> tuple[Catalog, dict[str, _Namespace]]:
    spaces: dict[str, dict[str, tuple]] = {}
    for domain in DOMAINS:
        if domain not in tool_descs:
            raise CatalogError(f"no tool catalog for TaskBench domain {domain!r}")
        space = spaces.setdefault(_NAMESPACE[domain], {})
        for tool in tool_descs[domain]:
            name, spec = str(tool["id"]).strip(), _tool_spec(tool)
            if name in space and space[name][1:] != spec[1:]:
                raise CatalogError(f"tool {name!r} is declared with different inputs/outputs by two domains")
            space.setdefault(name, spec)  # merged by name; the first declaration's description wins
    owner: dict[tuple[str, str], str] = {}
    for fam in families:
        for name in fam["tools"]:
            hits = [ns for ns, space in spaces.items() if name in space]
            if len(hits) != 1:
                raise CatalogError(f"family {fam['key']!r} lists {name!r}, declared by {len(hits)} tool catalogs (need 1)")
            if (hits[0], name) in owner:
                raise CatalogError(f"tool {name!r} is listed in {owner[hits[0], name]!r} and {fam['key']!r}")
            owner[hits[0], name] = fam["key"]
    missing = sorted(name for ns, space in spaces.items() for name in space if (ns, name) not in owner)
    if missing:
        raise CatalogError(f"{len(missing)} TaskBench tool(s) belong to no family, e.g. {missing[:3]}")
    skills, tools = [], {ns: [] for ns in spaces}
    for (ns, name), key in owner.items():
        desc, args, output = spaces[ns][name]
        sid = skill_id(SOURCE, key, name)
        skills.append(Skill(sid, key, name, desc, args))
        tools[ns].append(_Tool(name, sid, args, output))
    fams = [Family(f["key"], f.get("title", f["key"]), tuple(skill_id(SOURCE, f["key"], n) for n in f["tools"]))
            for f in families]
    return Catalog(skills, fams), {ns: _Namespace(ts) for ns, ts in tools.items()}


def build_catalog(tool_descs: Mapping[str, list[dict]], families: list[dict] | None = None) -> Catalog:
    """The TaskBench catalog from each domain's tool list (see :func:`read_tool_desc`) and the partition."""
    return _build(tool_descs, families if families is not None else family_partition())[0]


# -- normalising one gold record ------------------------------------------------------------------
class _Drop(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def _decoded(value: Any) -> Any:
    """Hub rows may carry nested fields as JSON text; decode those."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            raise _Drop("malformed", f"field is neither a list nor JSON text: {value[:60]!r}") from None
    return value


def _raw_values(node: Mapping, fixes: Counter) -> list:
    if "arguments" not in node:
        fixes["node_without_arguments"] += 1
        return [v for k, v in node.items() if k not in ("task", "output")]
    if set(node) - {"task", "arguments"}:
        fixes["node_fields_ignored"] += 1
    args = node["arguments"]
    if args is None:
        return []
    if isinstance(args, (str, int, float)):
        fixes["arguments_scalar_wrapped"] += 1
        return [args]
    if not isinstance(args, list):
        raise _Drop("bad_argument", f"{node.get('task')}: arguments is a {type(args).__name__}")
    return args


def _value(raw: Any, i: int, tools: list[_Tool], fixes: Counter) -> str:
    """Canonical string of one value, with node placeholders rewritten to ``<node-j>``."""
    try:
        v = canonical_value(raw)
    except GraphError as exc:
        raise _Drop("bad_argument", f"{tools[i].name}: {exc}") from None
    if NODE_REF.match(v):
        return v
    m = _NODE_FORMS.fullmatch(v)
    if m:
        fixes["placeholder_rewritten"] += 1
        return f"<node-{m.group(1) or m.group(2)}>"
    m = _OUTPUT_OF.fullmatch(v)
    if m:
        hits = [j for j in range(i) if _loose(tools[j].name) == _loose(m.group(1))]
        if not hits:
            raise _Drop("unresolved_placeholder", f"{tools[i].name}: {v!r} names no earlier node")
        fixes["placeholder_rewritten"] += 1
        return f"<node-{hits[-1]}>"
    if re.fullmatch(r"<[^<>]+>", v):
        fixes["literal_placeholder_kept"] += 1
    elif re.search(r"<node-\d+>", v):
        fixes["embedded_reference_kept"] += 1
    return v


def _value_type(v: str, tools: list[_Tool]) -> str | None:
    m = NODE_REF.match(v)
    if m:
        j = int(m.group(1))
        return tools[j].output if j < len(tools) else None
    if re.match(r"https?://", v, re.I):
        return "url"
    m = re.fullmatch(r"\S+\.([A-Za-z0-9]+)", v)
    return _EXT_TYPES.get(m.group(1).lower(), "text") if m else "text"


def _items(i: int, node: Mapping, tools: list[_Tool], fixes: Counter) -> list[tuple[str | None, str]]:
    """(declared name, or None for a bare value; canonical value) for each argument of node i."""
    tool = tools[i]
    declared = {_loose(a.name): a.name for a in tool.slots}
    items: list[tuple[str | None, str]] = []
    for raw in _raw_values(node, fixes):
        if not isinstance(raw, Mapping):
            items.append((None, _value(raw, i, tools, fixes)))
            continue
        if set(raw) != {"name", "value"}:
            raise _Drop("bad_argument", f"{tool.name}: argument {raw!r} is not {{name, value}}")
        name = declared.get(_loose(raw["name"]))
        if name is None:
            raise _Drop("unknown_argument_name",
                        f"{tool.name} has no argument {raw['name']!r} (declared: {sorted(declared.values())})")
        if name != raw["name"]:
            fixes["argument_name_variant"] += 1
        items.append((name, _value(raw["value"], i, tools, fixes)))
    return items


def _assign(items: list[tuple[str | None, str]], tool: _Tool, tools: list[_Tool], fixes: Counter) -> tuple[Argument, ...]:
    """Name the bare values: by inferred type first, then by position (module docstring)."""
    named = [(n, v) for n, v in items if n is not None]
    free = [a for a in tool.slots if a.name not in {n for n, _ in named}]
    pending = []
    for v in (v for n, v in items if n is None):
        slot = next((a for a in free if a.type == _value_type(v, tools)), None)
        if slot is None:
            pending.append(v)
        else:
            free.remove(slot)
            named.append((slot.name, v))
    for v in pending:
        if not free:
            raise _Drop("bad_argument", f"{tool.name} takes {len(tool.slots)} argument(s), got {len(items)}")
        fixes["argument_by_position"] += 1
        named.append((free.pop(0).name, v))
    return tuple(Argument(n, v) for n, v in named)


def _topological(deps: list[list[int]]) -> list[int] | None:
    """A node order in which every node follows its dependencies (stable: lowest index first), or None."""
    order: list[int] = []
    while len(order) < len(deps):
        ready = [i for i in range(len(deps)) if i not in order and all(j in order for j in deps[i])]
        if not ready:
            return None
        order.append(ready[0])
    return order


def _repair_references(items: list, tools: list[_Tool], links: list[Link], fixes: Counter) -> tuple[list, list]:
    """Make every ``<node-j>`` point to an earlier node when the declared links say how (module docstring)."""
    refs = [[int(m.group(1)) for _, v in node if (m := NODE_REF.match(v))] for node in items]
    if all(j < i for i, rs in enumerate(refs) for j in rs):
        return items, tools
    declared = {(link.source, link.target) for link in links}
    best = None
    for shift in (0, 1):
        deps = [[j - shift for j in rs] for rs in refs]
        if not all(0 <= j < len(tools) and j != i for i, ds in enumerate(deps) for j in ds):
            continue
        order = _topological(deps)
        score = sum((tools[j].skill, tools[i].skill) in declared for i, ds in enumerate(deps) for j in ds)
        if order is not None and score > (best[0] if best else 0):
            best = (score, shift, order)
    if best is None:
        return items, tools
    _, shift, order = best
    new = {old: k for k, old in enumerate(order)}

    def renumber(v: str) -> str:
        m = NODE_REF.match(v)
        return f"<node-{new[int(m.group(1)) - shift]}>" if m else v

    fixes["references_one_based" if shift else "nodes_reordered"] += 1
    return [[(n, renumber(v)) for n, v in items[old]] for old in order], [tools[old] for old in order]


def _link_end(end: Any, tools: list[_Tool], space: _Namespace, fixes: Counter) -> str:
    if isinstance(end, int) and not isinstance(end, bool) or isinstance(end, str) and end.strip().isdigit():
        j = int(end)
        if not 0 <= j < len(tools):
            raise _Drop("invalid_graph", f"a link names node {j}; the graph has {len(tools)} node(s)")
        fixes["link_by_index"] += 1
        return tools[j].skill
    if not isinstance(end, str):
        raise _Drop("malformed", f"link end {end!r} is neither a tool name nor a node index")
    tool, _ = space.resolve(end)
    if tool is None:
        raise _Drop("unknown_tool", f"a link names unknown tool {end!r}")
    return tool.skill


def _normalise(raw: Any, domain: str, space: _Namespace, catalog: Catalog, fixes: Counter) -> Record:
    """One TaskBench gold record -> :class:`Record`; raises :class:`_Drop` with the reason."""
    if not isinstance(raw, Mapping) or raw.get("id") is None or not str(raw["id"]).strip():
        raise _Drop("malformed", "not a JSON object with an id")
    request = raw.get("instruction", raw.get("user_request"))
    if not isinstance(request, str) or not request.strip():
        raise _Drop("empty_request", "no instruction")
    raw_nodes = _decoded(raw.get("task_nodes", raw.get("tool_nodes")))
    raw_links = _decoded(raw.get("task_links", raw.get("tool_links"))) or []
    if not isinstance(raw_nodes, list) or not raw_nodes or not isinstance(raw_links, list):
        raise _Drop("malformed", "task_nodes must be a non-empty list and task_links a list")
    if not all(isinstance(n, Mapping) and isinstance(n.get("task"), str) for n in raw_nodes):
        raise _Drop("malformed", "every node needs a string 'task'")
    if raw.get("n_tools") is not None and raw.get("n_tools") != len(raw_nodes):
        fixes["n_tools_ignored"] += 1
    tools, unknown = [], []
    for n in raw_nodes:
        tool, loose = space.resolve(n["task"])
        if tool is None:
            unknown.append(n["task"])
        elif loose:
            fixes["tool_name_variant"] += 1
        tools.append(tool)
    if unknown:
        raise _Drop("unknown_tool", f"not in the catalog: {unknown}")
    items = [_items(i, n, tools, fixes) for i, n in enumerate(raw_nodes)]
    links = []
    for link in raw_links:
        if not isinstance(link, Mapping) or not {"source", "target"} <= set(link):
            raise _Drop("malformed", f"link {link!r} is not {{source, target}}")
        links.append(Link(*(_link_end(link[k], tools, space, fixes) for k in ("source", "target"))))
    items, tools = _repair_references(items, tools, links, fixes)
    nodes = tuple(Node(t.skill, _assign(its, t, tools, fixes)) for t, its in zip(tools, items))
    graph = TaskGraph(nodes, tuple(links))
    try:
        graph.validate()
    except GraphError as exc:
        raise _Drop("invalid_graph", str(exc)) from None
    families = catalog.families_of_graph(graph)
    if len(families) > 1:
        raise _Drop("cross_family", f"skills span {sorted(families)}")
    structure = _STRUCTURES.get(str(raw.get("type", "")).strip().lower())
    if structure is None or (structure == "single") != (len(nodes) == 1):
        fixes["structure_derived"] += 1
        structure = structure_of(graph)
    return Record(f"{domain}-{str(raw['id']).strip()}", families.pop(), request.strip(), graph.canonical(), structure)


# -- the stream -----------------------------------------------------------------------------------
def split_family(records: list[Record], family: str, *, seed: int = 0, train_per_family: int = 1000,
                 test_per_family: int | None = None) -> tuple[list[Record], list[Record]]:
    """Deterministic (train, held-out) split of one family's records (see the module docstring)."""
    ordered = sorted(records, key=lambda r: r.id)
    random.Random(f"{seed}:{family}").shuffle(ordered)
    train, test = ordered[:train_per_family], ordered[train_per_family:]
    return train, (test if test_per_family is None else test[:test_per_family])


def build_stream(tool_descs: Mapping[str, list[dict]], rows: Mapping[str, tuple[str, Iterable[tuple[int, Any]]]],
                 *, source: str, seed: int = 0, train_per_family: int = 1000, test_per_family: int | None = None,
                 families: list[dict] | None = None) -> Stream:
    """Normalise, dedupe and split TaskBench rows into a :class:`Stream`.

    ``rows[domain] = (where, [(line or row number, decoded row or RecordError), ...])`` for each domain.
    """
    if train_per_family < 0 or (test_per_family is not None and test_per_family < 0):
        raise StreamError("train_per_family and test_per_family must be >= 0")
    catalog, spaces = _build(tool_descs, families if families is not None else family_partition())
    by_family: dict[str, list[Record]] = {k: [] for k in catalog.family_keys}
    first_request: dict[str, dict[str, str]] = {k: {} for k in catalog.family_keys}
    report: dict = {"domains": {}, "families": {},
                    "split": {"seed": seed, "train_per_family": train_per_family, "test_per_family": test_per_family}}
    for domain in DOMAINS:
        if domain not in rows:
            raise StreamError(f"no TaskBench records for domain {domain!r}")
        where, items = rows[domain]
        dropped, examples, fixes, ids = Counter(), {}, Counter(), set()
        counts = {"records": 0, "loaded": 0}

        def drop(reason: str, rid: str, detail: str) -> None:
            dropped[reason] += 1
            if len(examples.setdefault(reason, [])) < EXAMPLES_PER_REASON:
                examples[reason].append({"id": rid, "detail": detail})

        for line, raw in items:
            counts["records"] += 1
            rid = str(raw["id"]) if isinstance(raw, Mapping) and raw.get("id") is not None else f"line {line}"
            if isinstance(raw, RecordError):
                drop("malformed", rid, raw.reason)
                continue
            record_fixes: Counter = Counter()  # merged only when the record loads: fixes count kept records
            try:
                rec = _normalise(raw, domain, spaces[_NAMESPACE[domain]], catalog, record_fixes)
            except _Drop as d:
                drop(d.reason, rid, d.detail)
                continue
            if rec.id in ids:
                drop("duplicate_id", rid, "id seen earlier in this domain")
                continue
            ids.add(rec.id)
            key = " ".join(rec.request.split())
            if key in first_request[rec.family]:
                drop("duplicate_request", rid, f"same request as {first_request[rec.family][key]}")
                continue
            first_request[rec.family][key] = rec.id
            fixes.update(record_fixes)
            by_family[rec.family].append(rec)
            counts["loaded"] += 1
        report["domains"][domain] = {"source": where, **counts, "dropped": dict(sorted(dropped.items())),
                                     "examples": examples, "fixes": dict(sorted(fixes.items()))}
    train, test = {}, {}
    for key, recs in by_family.items():
        train[key], test[key] = split_family(recs, key, seed=seed, train_per_family=train_per_family,
                                             test_per_family=test_per_family)
        report["families"][key] = {"records": len(recs), "train": len(train[key]), "test": len(test[key])}
    report["warnings"] = split_warnings(report["families"], train_per_family)
    return Stream("taskbench", catalog, train, test, source=source, seed=seed, report=report)


def split_warnings(families: Mapping[str, Mapping[str, int]], train_per_family: int) -> list[str]:
    """One line per family left without held-out records (``families``: key -> records/train/test counts)."""
    out = []
    for key, c in families.items():
        if c["test"]:
            continue
        if not c["records"]:
            out.append(f"family {key}: no records loaded, so nothing to train on or hold out")
        elif c["train"] == c["records"]:
            out.append(f"family {key}: no held-out records: all {c['records']} go to training "
                       f"(train_per_family={train_per_family}); lower --train-per-family below {c['records']}")
        else:
            out.append(f"family {key}: no held-out records ({c['records']} records, {c['train']} in training; "
                       f"test_per_family is 0)")
    return out


def domain_of(record_id: str) -> str | None:
    """The TaskBench domain a loaded record's id names (``multimedia-45760948`` -> ``multimedia``), else None."""
    head, sep, _ = str(record_id).partition("-")
    return head if sep and head in DOMAINS else None


def _first_file(root: Path, candidates: list[str], what: str) -> Path:
    for rel in candidates:
        if (root / rel).is_file():
            return root / rel
    raise StreamError(f"{root}: no {what} (looked for {', '.join(candidates)})")


def _tool_desc_path(root: Path, domain: str) -> Path:
    return _first_file(root, [f"data_{domain}/tool_desc.json", f"{domain}/tool_desc.json"], f"{domain} tool catalog")


def load_taskbench(root: str | Path, *, seed: int = 0, train_per_family: int = 1000,
                   test_per_family: int | None = None, families: str | Path | None = None) -> Stream:
    """Build the TaskBench stream from a local TaskBench folder (layouts: module docstring).

    ``families``: a partition file replacing the packaged ``resources/taskbench_families.json``.
    """
    root = Path(root)
    if not root.is_dir():
        raise StreamError(f"{root} is not a directory; point it at a TaskBench folder holding data_<domain>/")
    descs, rows = {}, {}
    for domain in DOMAINS:
        descs[domain] = read_tool_desc(_tool_desc_path(root, domain))
        data = _first_file(root, [f"data_{domain}/data.json", f"{domain}/data.json", f"sample/{domain}.jsonl"],
                           f"{domain} gold records")
        rows[domain] = (str(data), iter_jsonl(data, errors="yield"))
    return build_stream(descs, rows, source=str(root), seed=seed, train_per_family=train_per_family,
                        test_per_family=test_per_family, families=family_partition(families))


def load_taskbench_hub(*, seed: int = 0, train_per_family: int = 1000, test_per_family: int | None = None,
                       repo_id: str = HUB_REPO, revision: str | None = None, tools_root: str | Path | None = None,
                       families: str | Path | None = None) -> Stream:
    """Build the TaskBench stream from the Hugging Face dataset (configs = domains, split ``test``).

    Tool catalogs come from ``tools_root`` (a local TaskBench folder) when given, else from the dataset
    repository's ``data_<domain>/tool_desc.json``. Needs the optional ``datasets`` dependency.
    """
    try:
        import datasets
    except ImportError:
        raise StreamError("loading TaskBench from the Hugging Face hub needs the `datasets` package: "
                          "pip install 'skillbank[hub]'") from None
    descs, rows = {}, {}
    for domain in DOMAINS:
        try:
            ds = datasets.load_dataset(repo_id, domain, split=HUB_SPLIT, revision=revision)
        except Exception as exc:  # network, auth, missing config: all reported the same way
            raise StreamError(f"cannot load {repo_id} config {domain!r} split {HUB_SPLIT!r}: {exc}") from exc
        rows[domain] = (f"hub:{repo_id}/{domain}", ((i, dict(row)) for i, row in enumerate(ds, start=1)))
        if tools_root is not None:
            descs[domain] = read_tool_desc(_tool_desc_path(Path(tools_root), domain))
        else:
            from huggingface_hub import hf_hub_download  # installed with datasets

            descs[domain] = read_tool_desc(hf_hub_download(repo_id, f"data_{domain}/tool_desc.json",
                                                           repo_type="dataset", revision=revision))
    return build_stream(descs, rows, source=f"hub:{repo_id}" + (f"@{revision}" if revision else ""), seed=seed,
                        train_per_family=train_per_family, test_per_family=test_per_family,
                        families=family_partition(families))
