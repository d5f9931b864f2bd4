"""Target serialisation: how a task graph is written as the executor's training target, and read back.

Two lossless formats (both decode to the same canonical graph that was encoded):

``json`` -- the output contract itself: ``graph.canonical().to_json()`` (compact JSON, full skill ids,
arguments as ``{name, value}`` objects, canonical links). What the paper trains on.

``compact`` -- one line per node, then at most one line of links::

    set_alarm{"time":"07:00"}
    borrow_book_online{"book":"Pride and Prejudice","library":"City Library"}
    0>1 1>2

* A node line is the skill id without the shard's family prefix (``TaskBench::t1_daily_life::``, the
  same for every skill of a shard; the executor's shard knows it and restores it on decode), followed by
  the node's arguments as one JSON object ``{name: value}`` in canonical (sorted) order. A skill id that
  does not start with the prefix is written in full; it is recognised on decode by its ``::``.
* The links line lists ``source>target`` node-index pairs, separated by single spaces, for the canonical
  links that ``<node-i>`` references do *not* already imply (those are restored by the canonical form).
  A link names skills, so when a skill occurs twice its first node index stands for it. No links, no line.

Mean target length with the SmolLM2 tokenizer, on a 203-record sample of TaskBench's three domains
(official TaskBench layout): 119 tokens for ``json``, 38 for ``compact`` (T1 daily life: 199 vs 60);
bench/train_probe.py measures synthetic records. Every target token costs a forward and a backward pass
in training and a decoding step in generation.

:func:`decode` never raises: a malformed text is an invalid :class:`~skillbank.graph.ParseResult`
with a reason naming the line.
"""
from __future__ import annotations

import json
import re
from typing import Any

from skillbank.errors import GraphError
from skillbank.graph import ParseResult, TaskGraph, parse_graph

FORMATS = ("json", "compact")
_LINK = re.compile(r"^(\d+)>(\d+)$")
_DECODER = json.JSONDecoder()


def check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise GraphError(f"target format must be one of {list(FORMATS)}, got {fmt!r}")
    return fmt


def encode(graph: TaskGraph, fmt: str = "json", family_prefix: str | None = None) -> str:
    """The training target text of ``graph`` in ``fmt`` (``family_prefix`` is used by ``compact`` only)."""
    check_format(fmt)
    canon = graph.canonical()
    if fmt == "json":
        return canon.to_json()
    return _encode_compact(canon, family_prefix or "")


def decode(text: str | None, fmt: str = "json", family_prefix: str | None = None) -> ParseResult:
    """Parse generated text written in ``fmt`` back into a task graph; never raises."""
    if fmt not in FORMATS:
        return ParseResult(None, f"unknown target format {fmt!r}; expected one of {list(FORMATS)}")
    if fmt == "json":
        return parse_graph(text)
    if text is None or not str(text).strip():
        return ParseResult(None, "empty output")
    try:
        return ParseResult(TaskGraph.from_dict(_decode_compact(str(text), family_prefix or "")))
    except GraphError as exc:
        return ParseResult(None, str(exc))


def decode_output(text: str | None, fmt: str = "json", family_prefix: str | None = None, *, stopped: bool = True,
                  reason: str | None = None) -> ParseResult:
    """:func:`decode` for a generation: one that did not stop (token cap, grammar dead end) is invalid with
    that reason, never read as a graph - a compact output cut after its second line would parse as a
    plausible, shorter plan."""
    if not stopped:
        return ParseResult(None, reason or "the output hit the token cap before the graph ended")
    return decode(text, fmt, family_prefix)


# -- compact -------------------------------------------------------------------------------------
def short_name(task: str, prefix: str) -> str:
    """How ``compact`` writes a skill id: without the shard's family prefix when it has it."""
    if prefix and task.startswith(prefix) and "::" not in task[len(prefix):]:
        return task[len(prefix):]
    if prefix and "::" not in task:
        # A bare name would be read back with the prefix added: refuse rather than lose information.
        raise GraphError(f"skill id {task!r} has no '::' and does not start with the family prefix {prefix!r}; "
                         "the compact format cannot write it losslessly (use target format 'json')")
    return task


def _encode_compact(canon: TaskGraph, prefix: str) -> str:
    lines = []
    for node in canon.nodes:
        name = short_name(node.task, prefix)
        if "{" in name or "\n" in name:
            raise GraphError(f"skill id {node.task!r} contains '{{' or a newline; use target format 'json'")
        args = {a.name: a.value for a in node.arguments}  # canonical order: sorted by name
        lines.append(name + json.dumps(args, ensure_ascii=False, separators=(",", ":")))
    first = {}
    for i, node in enumerate(canon.nodes):
        first.setdefault(node.task, i)
    implied = set(canon.implied_links())
    pairs = sorted((first[link.source], first[link.target]) for link in canon.links if link not in implied)
    if pairs:
        lines.append(" ".join(f"{s}>{t}" for s, t in pairs))
    return "\n".join(lines)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise GraphError(f"repeats argument name {key!r}")
        seen[key] = value
    return seen


def _decode_compact(text: str, prefix: str) -> dict:
    """Compact text -> the contract's dict form (validated afterwards by ``TaskGraph.from_dict``)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    nodes: list[dict] = []
    links: list[dict] = []
    decoder = json.JSONDecoder(object_pairs_hook=_no_duplicate_keys)
    for k, line in enumerate(lines, start=1):
        brace = line.find("{")
        if brace < 0:
            if k != len(lines) or not nodes:
                raise GraphError(f"line {k}: expected a node line 'skill{{...}}', got {line[:60]!r}")
            links = _decode_links(line, nodes, k)
            continue
        name = line[:brace].strip()
        if not name:
            raise GraphError(f"line {k}: missing skill name before the arguments")
        try:
            args, end = decoder.raw_decode(line, brace)
        except json.JSONDecodeError as exc:
            raise GraphError(f"line {k} ({name}): arguments are not a JSON object ({exc.msg})") from None
        except GraphError as exc:
            raise GraphError(f"line {k} ({name}): {exc}") from None
        if not isinstance(args, dict):
            raise GraphError(f"line {k} ({name}): arguments must be a JSON object")
        if line[end:].strip():
            raise GraphError(f"line {k} ({name}): unexpected text after the arguments: {line[end:][:40]!r}")
        task = name if "::" in name else prefix + name
        nodes.append({"task": task, "arguments": [{"name": n, "value": v} for n, v in args.items()]})
    if not nodes:
        raise GraphError("no node lines")
    return {"task_nodes": nodes, "task_links": links}


def _decode_links(line: str, nodes: list[dict], k: int) -> list[dict]:
    links = []
    for item in line.split():
        m = _LINK.match(item)
        if not m:
            raise GraphError(f"line {k}: expected links like '0>1 1>2', got {item!r}")
        s, t = int(m.group(1)), int(m.group(2))
        for end in (s, t):
            if end >= len(nodes):
                raise GraphError(f"line {k}: link {item} names node {end}, but there are {len(nodes)} nodes")
        links.append({"source": nodes[s]["task"], "target": nodes[t]["task"]})
    return links
