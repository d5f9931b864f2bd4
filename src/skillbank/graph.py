"""Task graphs: the output contract, parsing of raw model text, and the canonical form.

The contract: one JSON object with keys ``task_nodes`` then ``task_links``.

* ``task_nodes`` is a non-empty, topologically ordered list; each node has exactly ``task`` (a canonical
  skill id such as ``TaskBench::t1_daily_life::daily_bill_payment``) and ``arguments`` (a list of
  ``{"name", "value"}`` objects). An argument that consumes the output of node *i* has the value
  ``<node-i>`` (0-based, and *i* must be an earlier node).
* ``task_links`` is a list of ``{"source", "target"}`` producer -> consumer dependencies between the
  skill ids of nodes in the graph.

Canonical form (the one place it is defined; Graph EM compares :meth:`TaskGraph.canonical_dag` forms):

1. Node order. :meth:`TaskGraph.canonical` keeps the listed order: it is the execution order the plan
   states and ``<node-i>`` references point into it (stored records and training targets use it).
   :meth:`TaskGraph.canonical_dag` -- what Graph EM compares -- puts the nodes in the *canonical DAG
   order*, so that two plans listing independent nodes in a different order (``<node-i>`` references
   renumbered to match) are one graph. A node depends on the nodes its ``<node-j>`` references name (a
   reference inside a longer value counts too) and, for every canonical link ``s -> t``, a node running
   ``t`` depends on every node running ``s``. Among the nodes whose dependencies are all placed, the next
   one is the smallest by (skill id, its sorted arguments with references rewritten to the canonical
   positions already given). Nodes equal under that key (the same skill and arguments, fed by the same
   nodes) are tried in each order and the order giving the lexicographically smallest node list wins, so
   the result does not depend on the listing (short of a search budget that only many identical nodes
   feeding different consumers exhaust; past it they keep their listed order). A chain or a single node keeps its order. A graph
   whose references or links do not form a DAG in listing order (only possible for an unvalidated graph,
   or a reference inside a longer value pointing forward) keeps its listed order.
2. Argument values are strings. JSON numbers and booleans are written as their JSON text (``3``,
   ``2.5``, ``true``) and surrounding white space is stripped; ``null``, lists and objects are
   off-contract.
3. Arguments within a node are sorted by (name, value); an argument name may appear once per node.
4. Links are a set: duplicates are dropped and the rest sorted by (source, target).
5. Every ``<node-j>`` reference in node *i* implies the link (task of j) -> (task of i); canonical
   links are the union of the declared links and these implied ones. This is how TaskBench's own
   evaluator treats its Hugging Face and multimedia domains (links derived from references), and it
   makes a graph that states a dependency in only one of the two places equal to one that states it
   in both.

Anything unparseable or off-contract becomes a :class:`ParseResult` with ``graph=None`` and the reason;
:func:`parse_graph` never raises.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from skillbank.errors import GraphError

NODE_REF = re.compile(r"^<node-(\d+)>$")
ANY_NODE_REF = re.compile(r"<node-(\d+)>")  # a reference anywhere in a value (canonical DAG order renumbers these)
_ORDER_BUDGET = 2000  # tie-break searches per graph; beyond it equal nodes keep their listed order
GRAPH_KEYS = ("task_nodes", "task_links")


@dataclass(frozen=True, order=True)
class Argument:
    name: str
    value: str


@dataclass(frozen=True)
class Node:
    task: str
    arguments: tuple[Argument, ...] = ()

    def references(self) -> list[int]:
        """Indices of the earlier nodes whose outputs this node consumes."""
        refs = []
        for arg in self.arguments:
            m = NODE_REF.match(arg.value)
            if m:
                refs.append(int(m.group(1)))
        return refs


@dataclass(frozen=True, order=True)
class Link:
    source: str
    target: str


@dataclass(frozen=True)
class TaskGraph:
    nodes: tuple[Node, ...]
    links: tuple[Link, ...] = ()

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, obj: Any) -> "TaskGraph":
        """Build and validate a graph from decoded JSON. Raises :class:`GraphError` with the reason."""
        if not isinstance(obj, Mapping):
            raise GraphError(f"expected a JSON object with keys {list(GRAPH_KEYS)}, got {type(obj).__name__}")
        extra = sorted(set(obj) - set(GRAPH_KEYS))
        if extra:
            raise GraphError(f"unexpected key(s) {extra}; a task graph has exactly {list(GRAPH_KEYS)}")
        for key in GRAPH_KEYS:
            if key not in obj:
                raise GraphError(f"missing key {key!r}")
        raw_nodes, raw_links = obj["task_nodes"], obj["task_links"]
        if not isinstance(raw_nodes, list) or not raw_nodes:
            raise GraphError("task_nodes must be a non-empty list")
        if not isinstance(raw_links, list):
            raise GraphError("task_links must be a list")
        nodes = tuple(_node_from_dict(i, n) for i, n in enumerate(raw_nodes))
        links = tuple(_link_from_dict(i, link) for i, link in enumerate(raw_links))
        graph = cls(nodes, links)
        graph.validate()
        return graph

    @classmethod
    def from_json(cls, text: str) -> "TaskGraph":
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise GraphError(f"not valid JSON: {exc.msg} at character {exc.pos}") from None
        return cls.from_dict(obj)

    # -- checks ------------------------------------------------------------------------------
    def validate(self) -> None:
        """Check references and links; raise :class:`GraphError` naming the first problem."""
        if not self.nodes:
            raise GraphError("task_nodes must be a non-empty list")
        for i, node in enumerate(self.nodes):
            names = [a.name for a in node.arguments]
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise GraphError(f"node {i} ({node.task}) repeats argument name(s) {dup}")
            for j in node.references():
                if j >= len(self.nodes):
                    raise GraphError(f"node {i} ({node.task}) references <node-{j}>, which does not exist")
                if j >= i:
                    raise GraphError(
                        f"node {i} ({node.task}) references <node-{j}>, which is not an earlier node "
                        "(nodes must be topologically ordered; a self or forward reference is a cycle)"
                    )
        tasks = {n.task for n in self.nodes}
        for link in self.links:
            for end in (link.source, link.target):
                if end not in tasks:
                    raise GraphError(f"link {link.source} -> {link.target} names {end!r}, which is not a node task")
            if link.source == link.target:
                raise GraphError(f"link {link.source} -> {link.target} is a self-loop")
        cycle = _find_cycle(self.canonical_links())
        if cycle:
            raise GraphError("task_links contain a cycle: " + " -> ".join(cycle))

    # -- canonical form ----------------------------------------------------------------------
    def implied_links(self) -> list[Link]:
        """Links implied by ``<node-j>`` references (producer task -> consumer task)."""
        out = []
        for node in self.nodes:
            for j in node.references():
                if 0 <= j < len(self.nodes):
                    out.append(Link(self.nodes[j].task, node.task))
        return out

    def canonical_links(self) -> tuple[Link, ...]:
        return tuple(sorted(set(self.links) | set(self.implied_links())))

    def canonical(self) -> "TaskGraph":
        """Canonical values, argument order and links; the listed node order is kept (rule 1)."""
        nodes = tuple(Node(n.task, tuple(sorted(n.arguments))) for n in self.nodes)
        return TaskGraph(nodes, self.canonical_links())

    def canonical_order(self) -> list[int]:
        """Indices of the nodes in canonical DAG order (rule 1 of the module docstring)."""
        n = len(self.nodes)
        deps: list[set[int]] = []
        for i, node in enumerate(self.nodes):
            refs = {int(m.group(1)) for a in node.arguments for m in ANY_NODE_REF.finditer(a.value)}
            if any(j >= i for j in refs):
                return list(range(n))  # a forward, self or dangling reference: no DAG to reorder
            deps.append(refs)
        links = {(link.source, link.target) for link in self.canonical_links()}
        for i, consumer in enumerate(self.nodes):
            deps[i].update(j for j, producer in enumerate(self.nodes)
                           if j != i and (producer.task, consumer.task) in links)
        found = _least_order(self.nodes, deps, [_ORDER_BUDGET])
        return found[1] if found is not None else list(range(n))

    def canonical_dag(self) -> "TaskGraph":
        """The canonical form with the nodes in canonical DAG order and references renumbered to match."""
        order = self.canonical_order()
        pos = {old: new for new, old in enumerate(order)}
        nodes = tuple(Node(self.nodes[old].task, _node_key(self.nodes[old], pos)[1]) for old in order)
        return TaskGraph(nodes, self.canonical_links())

    def canonical_key(self) -> str:
        """A string that two graphs share exactly when they are the same graph: equal :meth:`canonical_dag`."""
        return self.canonical_dag().to_json()

    # -- views used by metrics ---------------------------------------------------------------
    @property
    def tasks(self) -> tuple[str, ...]:
        return tuple(n.task for n in self.nodes)

    def argument_tuples(self) -> list[tuple[str, str, str]]:
        return [(n.task, a.name, a.value) for n in self.nodes for a in n.arguments]

    # -- serialisation -----------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "task_nodes": [
                {"task": n.task, "arguments": [{"name": a.name, "value": a.value} for a in n.arguments]}
                for n in self.nodes
            ],
            "task_links": [{"source": link.source, "target": link.target} for link in self.links],
        }

    def to_json(self, indent: int | None = None) -> str:
        separators = (",", ":") if indent is None else (",", ": ")
        return json.dumps(self.to_dict(), ensure_ascii=False, separators=separators, indent=indent)


def canonical_value(value: Any) -> str:
    """The canonical string of an argument value (rule 2 of the module docstring)."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, bool) or isinstance(value, (int, float)):
        return json.dumps(value)
    raise GraphError(f"argument value must be a string or number, got {type(value).__name__}: {value!r}")


def _node_from_dict(i: int, obj: Any) -> Node:
    if not isinstance(obj, Mapping):
        raise GraphError(f"node {i} must be an object with keys task, arguments; got {type(obj).__name__}")
    extra = sorted(set(obj) - {"task", "arguments"})
    if extra:
        raise GraphError(f"node {i} has unexpected key(s) {extra}; a node has exactly task and arguments")
    task = obj.get("task")
    if not isinstance(task, str) or not task.strip():
        raise GraphError(f"node {i} needs a non-empty string 'task', got {task!r}")
    if "arguments" not in obj:
        raise GraphError(f"node {i} ({task}) is missing 'arguments'")
    raw_args = obj["arguments"]
    if not isinstance(raw_args, list):
        raise GraphError(f"node {i} ({task}) arguments must be a list, got {type(raw_args).__name__}")
    args = []
    for k, a in enumerate(raw_args):
        if not isinstance(a, Mapping) or set(a) != {"name", "value"}:
            raise GraphError(f"node {i} ({task}) argument {k} must be an object with exactly name and value, got {a!r}")
        name = a["name"]
        if not isinstance(name, str) or not name.strip():
            raise GraphError(f"node {i} ({task}) argument {k} needs a non-empty string name, got {name!r}")
        try:
            value = canonical_value(a["value"])
        except GraphError as exc:
            raise GraphError(f"node {i} ({task}) argument {name!r}: {exc}") from None
        args.append(Argument(name.strip(), value))
    return Node(task.strip(), tuple(args))


def _link_from_dict(i: int, obj: Any) -> Link:
    if not isinstance(obj, Mapping) or set(obj) != {"source", "target"}:
        raise GraphError(f"link {i} must be an object with exactly source and target, got {obj!r}")
    src, dst = obj["source"], obj["target"]
    if not isinstance(src, str) or not isinstance(dst, str):
        raise GraphError(f"link {i} source and target must be strings, got {obj!r}")
    return Link(src.strip(), dst.strip())


def _node_key(node: Node, pos: Mapping[int, int]) -> tuple[str, tuple[Argument, ...]]:
    """(task, sorted arguments) with every ``<node-j>`` rewritten to ``<node-pos[j]>``; a reference to no node
    of the graph (a generated graph may hold one) is kept as written."""
    def renumber(m: re.Match) -> str:
        j = int(m.group(1))
        return f"<node-{pos[j]}>" if j in pos else m.group(0)

    return node.task, tuple(sorted(Argument(a.name, ANY_NODE_REF.sub(renumber, a.value)) for a in node.arguments))


def _least_order(nodes: tuple[Node, ...], deps: list[set[int]], budget: list[int],
                 placed: tuple[int, ...] = ()) -> tuple[list, list[int]] | None:
    """The topological order, continuing ``placed``, whose sequence of node keys is smallest: (the keys of
    the nodes placed here, all node indices in order); None when the dependencies have a cycle. Only ties
    between equal keys branch."""
    order, keys = list(placed), []
    pos = {i: k for k, i in enumerate(order)}
    while len(order) < len(nodes):
        ready = [i for i in range(len(nodes)) if i not in pos and deps[i] <= pos.keys()]
        if not ready:
            return None
        keyed = [(_node_key(nodes[i], pos), i) for i in ready]
        low = min(k for k, _ in keyed)
        ties = [i for k, i in keyed if k == low]
        if len(ties) > 1 and budget[0] > 0:
            budget[0] -= len(ties)
            found = [f for t in ties if (f := _least_order(nodes, deps, budget, (*order, t))) is not None]
            if not found:
                return None
            rest_keys, best = min(found)  # every tie has key ``low``: the rest decides
            return keys + [low] + rest_keys, best
        pos[ties[0]] = len(order)
        order.append(ties[0])
        keys.append(low)
    return keys, order


def _find_cycle(links: Iterable[Link]) -> list[str] | None:
    adj: dict[str, list[str]] = {}
    for link in links:
        adj.setdefault(link.source, []).append(link.target)
    state: dict[str, int] = {}  # 1 = on the DFS stack, 2 = done
    stack: list[str] = []

    def visit(u: str) -> list[str] | None:
        state[u] = 1
        stack.append(u)
        for v in adj.get(u, ()):
            if state.get(v) == 1:
                return stack[stack.index(v):] + [v]
            if v not in state:
                found = visit(v)
                if found:
                    return found
        stack.pop()
        state[u] = 2
        return None

    for u in sorted(adj):
        if u not in state:
            found = visit(u)
            if found:
                return found
    return None


# -- parsing raw model output -------------------------------------------------------------------
@dataclass(frozen=True)
class ParseResult:
    """Outcome of parsing model text: a valid graph, or ``graph=None`` with the reason."""

    graph: TaskGraph | None
    error: str | None = None

    @property
    def valid(self) -> bool:
        return self.graph is not None


def first_json_object(text: str) -> tuple[Any, str | None]:
    """Decode the first complete JSON object in ``text``.

    Models wrap JSON in prose or markdown fences; we take the first ``{`` that starts a decodable
    object (``json.JSONDecoder.raw_decode`` does the scanning, so nested braces and strings are right).
    Returns (object, None) or (None, reason).
    """
    decoder = json.JSONDecoder()
    start = text.find("{")
    first_error = None
    while start != -1:
        try:
            obj, _ = decoder.raw_decode(text, start)
            if isinstance(obj, dict):
                if first_error and "task_nodes" not in obj:
                    # An inner fragment of a truncated graph: report the truncation, not the fragment.
                    break
                return obj, None
        except json.JSONDecodeError as exc:
            first_error = first_error or f"{exc.msg} at character {exc.pos}"
        start = text.find("{", start + 1)
    if first_error:
        return None, f"no complete JSON object in the output ({first_error})"
    return None, "no JSON object in the output"


def parse_graph(text: str | None) -> ParseResult:
    """Parse raw model text into a graph; never raises (an invalid result carries the reason)."""
    if text is None or not str(text).strip():
        return ParseResult(None, "empty output")
    obj, err = first_json_object(str(text))
    if err:
        return ParseResult(None, err)
    try:
        return ParseResult(TaskGraph.from_dict(obj))
    except GraphError as exc:
        return ParseResult(None, str(exc))


def literal_values(graph: TaskGraph) -> list[str]:
    """The graph's argument values that are not ``<node-j>`` references, in node order."""
    return [a.value for n in graph.nodes for a in n.arguments if not NODE_REF.match(a.value)]


def values_copied(pairs) -> bool:
    """True when every literal value of every (request, graph) pair occurs verbatim in its request: records of a
    family written this way can be planned with copy-constrained values (a misspelt copy cannot be written)."""
    return all(v in request for request, graph in pairs for v in literal_values(graph))
