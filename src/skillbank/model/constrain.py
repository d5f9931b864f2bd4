"""Structured decoding: a shard can only write task graphs over its own skills.

A shard knows its skills exactly (``skills.json``: ids and argument specs). :func:`build_grammar` turns
them and the shard's target format into a context-free grammar of every well-formed output:

* only the shard's skill ids (written as the format writes them: short names in ``compact``, full ids in
  ``json``);
* per skill only its declared argument names, each at most once, in the canonical (sorted) order the
  executors were trained on, every *required* one (a JSON Schema's ``required``) included and the others
  optional; a skill whose specs are unknown takes any argument names;
* argument values are JSON strings, or ``<node-j>`` references to an *earlier* node only (the grammar is
  unrolled over node positions, so a forward or self reference cannot be written);
* at most ``max_nodes`` nodes; in ``compact`` a links line of ``s>t`` pairs between existing nodes;
* nothing after the graph: once the grammar is complete only a stop token is allowed.

What a context-free grammar cannot say is left to the parser and reported as an invalid plan: a cycle
through declared links, and in ``json`` a link naming a skill that is not one of the graph's nodes.
A literal value may not start with ``<n`` (that prefix is reserved for references).

The token masks come from a structured-generation library, not a hand-written filter: **llguidance** (the
default; Lark syntax, lazily computed masks) or **xgrammar** (EBNF, masks precomputed at compile time).
``bench/grammar_backends.py`` measures both; the README says why llguidance is the default. Each backend
compiles a grammar once (:class:`GrammarCache`) and hands every row a cheap copy of the compiled start
state (:class:`RowMatcher`), so rows of different shards in one batch each follow their own grammar.

Copy-constrained values (opt-in, ``copy_from=request``, llguidance only): a literal value must be a
substring of the request, so a misspelt copy (``recept_scan.png``) cannot be written.
"""
from __future__ import annotations

import functools
import hashlib
import json
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np

from skillbank.errors import ModelError

if TYPE_CHECKING:  # torch is imported where a mask is applied: the llama.cpp path never needs it
    import torch

MAX_NODES = 12  # TaskBench graphs have at most 10 nodes; the built-in stream 5
BACKENDS = ("llguidance", "xgrammar")
DEFAULT_BACKEND = "llguidance"

# One JSON string character: anything but a quote, a backslash or a control character, or an escape.
_ESC_LARK = r'\\(["\\\/bfnrt]|u[0-9a-fA-F]{4})'
_CH_LARK = rf'([^"\\\x00-\x1f]|{_ESC_LARK})'
# A literal value: "", "<", or a string not starting with "<n" (reserved for <node-j> references).
_FREE_LARK = (rf'/"([^"\\<\x00-\x1f]|{_ESC_LARK}){_CH_LARK}*"|""|"<"|"<([^n"\\\x00-\x1f]|{_ESC_LARK}){_CH_LARK}*"/')
_FREE_EBNF = {
    "ch": r'[^"\\\x00-\x1f] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])',
    "free": r'"\"" ( ([^"\\<\x00-\x1f] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])) ch* '
            r'| "<" ( ([^n"\\\x00-\x1f] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])) ch* )? )? "\""',
}


# -- the grammar ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SkillSpec:
    """A skill as the grammar sees it: its id, argument names (None: unknown, any names allowed) and the
    names among them every node of the skill must give (``required``; the others may be left out)."""

    id: str
    arguments: tuple[str, ...] | None = None
    required: tuple[str, ...] = ()

    @classmethod
    def of(cls, skill) -> "SkillSpec":
        """A catalog skill (:class:`skillbank.data.catalog.Skill`) as the grammar sees it."""
        return cls(skill.id, skill.argument_names, tuple(a.name for a in skill.arguments if a.required))

    def __post_init__(self):
        object.__setattr__(self, "required", tuple(self.required))
        stray = [r for r in self.required if self.arguments is None or r not in self.arguments]
        if stray:
            raise ModelError(f"skill {self.id!r}: required argument(s) {stray} are not among its arguments "
                             f"{list(self.arguments or [])}")


@dataclass(frozen=True)
class Lit:
    text: str


@dataclass(frozen=True)
class Ref:
    rule: str


@dataclass
class GraphGrammar:
    """The grammar of one shard's outputs, kept as rules that render to either library's syntax.

    ``rules`` maps a rule name to its alternatives, each a sequence of :class:`Lit` and :class:`Ref`;
    ``terminals`` maps a terminal (a whole JSON string value) to its (Lark regex, EBNF body)."""

    fmt: str
    skills: tuple[SkillSpec, ...]
    max_nodes: int
    rules: dict[str, list[tuple]] = field(default_factory=dict)
    terminals: dict[str, tuple[str, str]] = field(default_factory=dict)
    copy_from: str | None = None
    prefix: str = ""
    prior: tuple[str, ...] | None = None
    _variants: dict = field(default_factory=dict, repr=False, compare=False)
    _digest: str | None = field(default=None, repr=False, compare=False)

    def variant(self, prior: tuple[str, ...]) -> "GraphGrammar":
        """The prefix grammar after the nodes ``prior`` (see :func:`build_grammar`), built once."""
        if prior not in self._variants:
            self._variants[prior] = build_grammar(self.skills, self.fmt, self.prefix, max_nodes=self.max_nodes,
                                                  copy_from=self.copy_from, prior=prior)
        return self._variants[prior]

    @property
    def node_end(self) -> str:
        """The character that completes a node's skill name: compact ``name{``, JSON ``"task":"name"``."""
        return "{" if self.fmt == "compact" else '"'

    def plan_nodes(self, text: str) -> list[str] | None:
        """The skill ids of the nodes whose skill is complete in ``text`` (a partial output), in order; None
        when a name is not one of the grammar's skills."""
        if self.fmt == "compact":
            names = [line[:line.index("{")] for line in text.split("\n") if "{" in line]
        else:
            names = [json.loads(m) for m in re.findall(r'\{"task":("(?:[^"\\]|\\.)*")', text)]
        out = [self._ids.get(n) for n in names]
        return None if None in out else out

    @functools.cached_property
    def _ids(self) -> dict[str, str]:
        """Written name -> skill id."""
        return {written_name(s.id, self.fmt, self.prefix): s.id for s in self.skills}

    @property
    def digest(self) -> str:
        if self._digest is None:
            self._digest = hashlib.sha256(self.lark().encode()).hexdigest()[:16]
        return self._digest

    def lark(self) -> str:
        """Lark syntax (llguidance, and vLLM's ``guidance`` structured-output backend)."""
        lines = ["start: g0"]
        for name, alts in self.rules.items():
            lines.append(f"{name}: " + _render_alts(alts, upper_terminals=True))
        for name, (regex, _) in self.terminals.items():
            lines.append(f"{name.upper()}: {regex}")
        return "\n".join(lines) + "\n"

    def ebnf(self) -> str:
        """GBNF/EBNF syntax (xgrammar)."""
        if self.copy_from is not None:
            raise ModelError("copy-constrained values need the llguidance backend")
        lines = ["root ::= g0"]
        for name, alts in self.rules.items():
            lines.append(f"{name} ::= " + _render_alts(alts, upper_terminals=False))
        for name, (_, body) in self.terminals.items():
            lines.append(f"{name} ::= {body}")
        for name, body in _FREE_EBNF.items():
            lines.append(f"{name} ::= {body}")
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class LarkGrammar:
    """A grammar given as Lark text (a client's ``structured_outputs.grammar``), for the llguidance backend."""

    text: str

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()[:16]

    def lark(self) -> str:
        return self.text

    def ebnf(self) -> str:
        raise ModelError("a Lark grammar needs the llguidance backend")


def check_lark(text: str) -> str | None:
    """Why a Lark grammar does not compile (None when it does), without a tokenizer."""
    import llguidance
    try:
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text)
    except Exception as exc:  # noqa: BLE001 - the library's own message is the answer
        return str(exc)
    return ("; ".join(str(m).strip() for m in messages)[:500] or "invalid grammar") if is_error else None


def _lit(text: str) -> str:
    return json.dumps(text, ensure_ascii=True)


def _render_alts(alts: list[tuple], upper_terminals: bool) -> str:
    """Alternatives joined by ``|``; an empty alternative becomes ``( ... )?`` (an empty literal would be a
    zero-length lexeme, which llguidance's lexer handles badly at token boundaries)."""
    body = " | ".join(_render(alt, upper_terminals) for alt in alts if alt)
    return f"({body})?" if () in alts else body


def _render(alt: tuple, upper_terminals: bool) -> str:
    parts = []
    for item in alt:
        if isinstance(item, Lit):
            if item.text:
                parts.append(_lit(item.text))
        elif upper_terminals and item.rule.startswith("t_"):
            parts.append(item.rule.upper())
        else:
            parts.append(item.rule)
    return " ".join(parts) or '""'


def written_name(skill: str, fmt: str, prefix: str) -> str:
    """How a skill id is written in ``fmt`` (compact strips the shard's family prefix)."""
    from skillbank.model.serialization import short_name
    return short_name(skill, prefix) if fmt == "compact" else skill


def build_grammar(skills: Sequence[SkillSpec], fmt: str, prefix: str = "", *, max_nodes: int = MAX_NODES,
                  copy_from: str | None = None, prior: tuple[str, ...] | None = None) -> GraphGrammar:
    """The grammar of every output a shard with ``skills`` may write in target format ``fmt``.

    prior: None for the whole grammar (what an upstream server or xgrammar gets). A tuple of skill ids gives
        the *prefix grammar* the local decoder switches to as a plan grows (:class:`_PlanRow`): those nodes,
        exactly as written, then optionally one more node of a skill not among them, or the links between
        them and the end. It makes what a context-free grammar over the whole plan cannot: no skill twice
        (links join skill ids, so a repeated skill would be a self-loop) and, in ``json``, links only
        between the plan's own nodes, earlier to later."""
    from skillbank.model.serialization import check_format

    check_format(fmt)
    if not skills:
        raise ModelError("a grammar needs at least one skill")
    if max_nodes < 1:
        raise ModelError(f"max_nodes must be >= 1, got {max_nodes}")
    skills = tuple(sorted(skills, key=lambda s: s.id))
    g = GraphGrammar(fmt, skills, max_nodes, copy_from=copy_from, prefix=prefix, prior=prior)
    g.terminals["t_free"] = (_FREE_LARK if copy_from is None else _copy_lark(copy_from), "free")
    for i in range(1, max_nodes):
        refs = "|".join(str(j) for j in range(i))
        g.terminals[f"t_ref{i}"] = (f'/"<node-({refs})>"/', '"\\"<node-" (' + " | ".join(_lit(str(j)) for j in range(i)) + ') ">\\""')
    for i in range(max_nodes):
        g.rules[f"v{i}"] = [(Ref("t_free"),)] + ([(Ref(f"t_ref{i}"),)] if i else [])
    if prior is None:
        for i in range(max_nodes):
            g.rules[f"n{i}"] = [_node(g, skill, i, f"a{i}_{k}") for k, skill in enumerate(skills)]
        _compact_body(g) if fmt == "compact" else _json_body(g)
    else:
        _prefix_body(g, prior)
    return g


def _node(g: GraphGrammar, skill: SkillSpec, i: int, obj: str) -> tuple:
    """One node of ``skill`` at position ``i`` (its arguments in rule ``obj``)."""
    _arguments(g, obj, skill, i, g.fmt == "compact")
    if g.fmt == "compact":
        return (Lit(written_name(skill.id, g.fmt, g.prefix)), Ref(obj))
    return (Lit('{"task":' + json.dumps(skill.id, ensure_ascii=False) + ',"arguments":['), Ref(obj), Lit("]}"))


def _prefix_body(g: GraphGrammar, prior: tuple[str, ...]) -> None:
    by_id = {s.id: s for s in g.skills}
    unknown = [sid for sid in prior if sid not in by_id]
    if unknown or len(set(prior)) != len(prior) or len(prior) > g.max_nodes:
        raise ModelError(f"not a plan prefix of this grammar: {list(prior)}")
    p, compact = len(prior), g.fmt == "compact"
    fixed = [_node(g, by_id[sid], i, f"f{i}") for i, sid in enumerate(prior)]
    more = [_node(g, s, p, f"c{k}") for k, s in enumerate(g.skills) if s.id not in prior] if p < g.max_nodes else []
    g.terminals["t_any"] = (r"/(.|\n)+/", "")  # past the next node: the decoder has switched grammars by then
    if more:
        g.rules["next"] = more
    sep = Lit("\n") if compact else Lit(",")
    body: list = []
    for i, node in enumerate(fixed):
        body += ([sep] if i else []) + list(node)
    endings = []
    if compact:
        if p >= 1:
            endings.append(())
        if p >= 2:
            g.rules["lp"] = [(Lit(f"{s}>{t}"),) for s in range(p) for t in range(s + 1, p)]
            endings.append((Lit("\n"), _repeat(g, "links", (Ref("lp"),), " ")))
        if more:
            endings.append(((sep,) if p else ()) + (Ref("next"), Ref("tail")))
        g.rules["tail"] = [(), (Lit("\n"), Ref("t_any"))]
        g.rules["g0"] = [tuple(body) + e for e in endings]
    else:
        if p >= 1:
            pairs = [(a, b) for i, a in enumerate(prior) for b in prior[i + 1:]]
            g.rules["links"] = [()]
            if pairs:
                g.rules["link"] = [(Lit('{"source":' + json.dumps(a, ensure_ascii=False) + ',"target":'
                                        + json.dumps(b, ensure_ascii=False) + "}"),) for a, b in pairs]
                g.rules["links"].append((_repeat(g, "linklist", (Ref("link"),), ","),))
            endings.append((Lit('],"task_links":['), Ref("links"), Lit("]}")))
        if more:
            endings.append(((sep,) if p else ()) + (Ref("next"), Ref("tail")))
        g.rules["tail"] = [(), (Ref("t_any"),)]
        g.rules["g0"] = [(Lit('{"task_nodes":['),) + tuple(body) + e for e in endings]


def _arguments(g: GraphGrammar, name: str, skill: SkillSpec, i: int, compact: bool) -> None:
    """Rule ``name``: the arguments of ``skill`` at node position ``i`` - each declared name at most once, in
    sorted order, every required one present (compact: a JSON object's members; json: a list of {name, value}
    objects)."""
    def pair(arg_rule: Ref | Lit) -> tuple:
        if compact:
            return (arg_rule, Lit(":"), Ref(f"v{i}"))
        return (Lit('{"name":'), arg_rule, Lit(',"value":'), Ref(f"v{i}"), Lit("}"))

    open_, close = ("{", "}") if compact else ("", "")
    if skill.arguments is None:  # specs unknown: any names, as many as the model writes
        g.rules[name] = [(Lit(open_ + close),), (Lit(open_), _repeat(g, name + "s", pair(Ref("t_free")), ","), Lit(close))]
        return
    names = sorted(dict.fromkeys(skill.arguments))
    if not names:
        g.rules[name] = [(Lit(open_ + close),)]
        return
    required = set(skill.required)
    # r_j: a non-empty, ordered selection from names[j:] holding every required name among them; linear in the
    # number of arguments. names[j] may end the selection only when no required name follows it, and may be
    # skipped only when it is not required itself.
    for j in range(len(names) - 1, -1, -1):
        p = pair(Lit(json.dumps(names[j], ensure_ascii=False)))
        alts = [p] if not required & set(names[j + 1:]) else []
        if j + 1 < len(names):
            alts.append(p + (Lit(","), Ref(f"{name}r{j + 1}")))
            if names[j] not in required:
                alts.append((Ref(f"{name}r{j + 1}"),))
        g.rules[f"{name}r{j}"] = alts
    g.rules[name] = ([(Lit(open_ + close),)] if not required else []) + [(Lit(open_), Ref(f"{name}r0"), Lit(close))]


def _repeat(g: GraphGrammar, name: str, item: tuple, sep: str) -> Ref:
    """Rule ``name``: one or more ``item`` separated by ``sep``."""
    g.rules[name] = [item, item + (Lit(sep), Ref(name))]
    return Ref(name)


def _compact_body(g: GraphGrammar) -> None:
    """Node lines, then at most one line of ``s>t`` links between nodes that exist (no self-loops)."""
    last = g.max_nodes - 1
    for i in range(g.max_nodes):
        alts = [(Ref(f"n{i}"),)]
        if i < last:
            alts.append((Ref(f"n{i}"), Lit("\n"), Ref(f"g{i + 1}")))
        if i >= 1:
            pairs = [(s, t) for s in range(i + 1) for t in range(s + 1, i + 1)]  # nodes are in execution order
            g.rules[f"l{i}p"] = [(Lit(f"{s}>{t}"),) for s, t in pairs]
            alts.append((Ref(f"n{i}"), Lit("\n"), _repeat(g, f"l{i}", (Ref(f"l{i}p"),), " ")))
        g.rules[f"g{i}"] = alts


def _json_body(g: GraphGrammar) -> None:
    """The canonical JSON object: nodes, then links between the shard's skills."""
    last = g.max_nodes - 1
    for i in range(g.max_nodes):
        alts = [(Ref(f"n{i}"),)]
        if i < last:
            alts.append((Ref(f"n{i}"), Lit(","), Ref(f"ns{i + 1}")))
        g.rules[f"ns{i}"] = alts
    g.rules["g0"] = [(Lit('{"task_nodes":['), Ref("ns0"), Lit('],"task_links":['), Ref("links"), Lit("]}"))]
    g.rules["sk"] = [(Lit(json.dumps(s.id, ensure_ascii=False)),) for s in g.skills]
    g.rules["link"] = [(Lit('{"source":'), Ref("sk"), Lit(',"target":'), Ref("sk"), Lit("}"))]
    g.rules["links"] = [(), (_repeat(g, "linklist", (Ref("link"),), ","),)]


def _copy_lark(request: str) -> str:
    """A literal value that is a substring of ``request`` (JSON-escaped), or a lone "<"-free empty string."""
    chunks = [json.dumps(c, ensure_ascii=False)[1:-1] for c in request]  # an escape is one chunk, never cut
    return '"\\"" %regex ' + json.dumps({"substring_chunks": chunks}, ensure_ascii=False) + ' "\\""'


# -- from a shard's files ------------------------------------------------------------------------------
def specs_from_skills_json(data: dict, where: str) -> tuple[list[SkillSpec], bool]:
    """Skill specs from a shard's ``skills.json``; the flag is False when argument specs are missing
    (a bank made before catalogs were stored): those skills take any argument names."""
    if not isinstance(data, dict) or not isinstance(data.get("skills"), list) or \
            not all(isinstance(s, str) and s for s in data["skills"]):
        raise ModelError(f"{where}: malformed skills.json (expected {{\"skills\": [skill ids], \"specs\": [...]}})")
    specs = data.get("specs") or []
    if not isinstance(specs, list):
        raise ModelError(f"{where}: malformed skills.json ('specs' must be a list)")
    by_id, required = {}, {}
    for k, s in enumerate(specs):
        try:
            args = s["arguments"]
            by_id[s["id"]] = tuple(a["name"] for a in args)
            required[s["id"]] = tuple(a["name"] for a in args if a.get("required") is True)
        except (KeyError, TypeError, AttributeError):
            raise ModelError(f"{where}: malformed skills.json (spec {k} needs 'id' and 'arguments' with names)") from None
    complete = all(sid in by_id for sid in data["skills"])
    return [SkillSpec(sid, by_id.get(sid), required.get(sid, ())) for sid in data["skills"]], complete


# -- backends ------------------------------------------------------------------------------------------
class RowMatcher:
    """One row's position in its grammar: fills the row's allowed-token bitmask, consumes its tokens."""

    def fill(self, bitmask: torch.Tensor, row: int) -> None: ...
    def consume(self, token: int) -> bool: ...
    @property
    def error(self) -> str: ...

    def allows(self, token: int) -> bool | None:
        """Whether the grammar allows ``token`` next, where a backend can tell without a whole mask; None: ask
        :meth:`fill`."""
        return None

    def forced(self) -> list[int]:
        """Tokens the grammar admits as the only way on from here (a skill name's rest, a key, punctuation), as
        a draft for the decoder to check; [] where there are none or the backend cannot tell."""
        return []

    def active(self) -> bool:
        """Whether the next pick is weighed by a prior (:class:`SkillPrior`): then the decoder scores every
        allowed token with :meth:`bias` added instead of keeping a free pick the grammar allows."""
        return False

    def bias(self, tokens: np.ndarray) -> np.ndarray:
        """What the prior adds to each of ``tokens`` (ids the grammar allows next)."""
        return np.zeros(len(tokens), dtype=np.float32)


class _LLGuidanceRow(RowMatcher):
    def __init__(self, matcher):
        self.m = matcher

    def fill(self, bitmask, row):
        v = bitmask[row]  # a torch tensor (reference path) or a numpy array (llama.cpp path)
        if isinstance(v, np.ndarray):
            self.m.unsafe_compute_mask_ptr(v.ctypes.data, v.nbytes)
        else:
            self.m.unsafe_compute_mask_ptr(v.data_ptr(), v.numel() * v.element_size())

    def consume(self, token):
        return self.m.consume_token(token)

    def allows(self, token):
        return self.m.validate_tokens([token]) == 1  # ~2 us; a whole mask takes ~70 us

    def forced(self):
        return self.m.compute_ff_tokens()

    @property
    def error(self):
        return self.m.get_error()


class _WrappingRow(RowMatcher):
    """A row that asks another row (``inner``) for its masks, forced tokens and errors, and adds bookkeeping of
    its own in ``consume``."""

    inner: RowMatcher

    def fill(self, bitmask, row):
        self.inner.fill(bitmask, row)

    def allows(self, token):
        return self.inner.allows(token)

    def forced(self):
        return self.inner.forced()

    @property
    def error(self):
        return self.inner.error


class _PlanRow(_WrappingRow):
    """A row that follows a plan's prefix grammars (llguidance): each time a node's skill is complete in the
    text so far, the row switches to the grammar after those nodes (:meth:`GraphGrammar.variant`) and replays
    its tokens into it. So a skill cannot be written twice and JSON links join only the plan's own nodes,
    earlier to later - every output that stops is a valid graph."""

    def __init__(self, cache: "GrammarCache", grammar: GraphGrammar):
        self.cache, self.grammar = cache, grammar
        self.tokens: list[int] = []
        self.text = bytearray()  # the tokens' bytes so far, appended token by token (a byte-level vocabulary's
        # decode is the concatenation of its tokens' bytes): decoding every token again at each node end made a
        # row's bookkeeping quadratic in its length (in json, where every '"' may end a node's skill)
        self.nodes: tuple[str, ...] = ()
        self.inner = _LLGuidanceRow(cache.compile(grammar.variant(())).deep_copy())
        self._error = ""

    def consume(self, token):
        if not self.inner.consume(token):
            return False
        self.tokens.append(token)
        piece = self.cache.decode([token])
        self.text += piece
        if self.grammar.node_end.encode() not in piece:
            return True  # no skill name was completed by this token
        nodes = self.grammar.plan_nodes(self.text.decode("utf-8", errors="replace"))
        if nodes is None:
            self._error = "a node names a skill outside the grammar"
            return False
        if len(nodes) > len(self.nodes):
            self.nodes = tuple(nodes)
            try:
                row = _LLGuidanceRow(self.cache.compile(self.grammar.variant(self.nodes)).deep_copy())
            except ModelError as exc:
                self._error = str(exc)
                return False
            if not all(row.consume(t) for t in self.tokens):
                self._error = f"the plan so far does not fit its next grammar ({row.error[:120]})"
                return False
            self.inner = row
        return True

    @property
    def error(self):
        return self._error or self.inner.error


@dataclass(frozen=True)
class SkillPrior:
    """A prior over the skills a row may name: ``log p(skill | request)`` per skill id (floored; from the
    shard's skill statistics, :mod:`skillbank.memory.skill_address`) and the weight it gets against the
    executor's own log-probabilities. Only the choice among skill names is moved: at a token that starts or
    continues a name, each allowed token gains ``weight * log(mass of the names it leads to / mass of the names
    still open)``; a token that leads to no name (a links line, the end of the plan) gains nothing, so whether a
    plan goes on or stops is still the executor's alone."""

    logp: dict
    weight: float

    def row(self, matcher: RowMatcher, grammar: "GraphGrammar", decode) -> "_PriorRow":
        return _PriorRow(matcher, grammar, self, decode)


class _PriorRow(_WrappingRow):
    """A row matcher with a :class:`SkillPrior`: delegates the grammar to ``inner`` and keeps the text so far to
    tell when the next token is part of a skill name. Hand-written: the structured-generation libraries give
    masks, not a way to weigh the alternatives they allow."""

    def __init__(self, inner: RowMatcher, grammar: "GraphGrammar", prior: SkillPrior, decode):
        self.inner, self.grammar, self.decode = inner, grammar, decode
        self.end = grammar.node_end
        self.compact = grammar.fmt == "compact"
        written = {s.id: written_name(s.id, grammar.fmt, grammar.prefix) for s in grammar.skills}
        # name as written, followed by the character that ends it -> prior probability mass
        self.mass = {written[sid] + self.end: float(np.exp(lp)) for sid, lp in prior.logp.items() if sid in written}
        for sid, name in written.items():  # a skill the statistics never saw: the smallest mass they give
            self.mass.setdefault(name + self.end, min(self.mass.values(), default=1.0))
        self.weight = float(prior.weight)
        self.text = ""
        self.used: set[str] = set()
        self._piece: dict[int, str] = {}

    def consume(self, token):
        if not self.inner.consume(token):
            return False
        piece = self.piece(token)
        self.text += piece
        if self.end in piece:  # a name may have just finished: it cannot be chosen again
            done = self._last_name()
            if done is not None:
                self.used.add(done + self.end)
        return True

    def piece(self, token: int) -> str:
        text = self._piece.get(token)
        if text is None:
            text = self._piece[token] = self.decode([token]).decode("utf-8", errors="replace")
        return text

    def _partial_text(self) -> str | None:
        """The skill name being written (possibly ""), or None when the next token is not part of a name."""
        if self.compact:
            line = self.text.rsplit("\n", 1)[-1]
            if self.end in line or (line and not (line[0].isalpha() or line[0] == "_")):
                return None
            return line
        at = self.text.rfind('"task":"')
        if at < 0:
            return None
        rest = self.text[at + len('"task":"'):]
        return None if '"' in rest else rest

    def _last_name(self) -> str | None:
        if self.compact:
            line = [ln for ln in self.text.split("\n") if self.end in ln]
            return line[-1][:line[-1].index(self.end)] if line else None
        at = self.text.rfind('"task":"')
        rest = self.text[at + len('"task":"'):]
        return rest[:rest.index('"')] if at >= 0 and '"' in rest else None

    def open_names(self) -> tuple[str, dict[str, float]] | None:
        """The part of a name written so far and the names (with their end character) it may still become, with
        their masses; None when the next token is not part of a name or there is no choice left to weigh."""
        if self.weight <= 0:
            return None
        partial = self._partial_text()
        if partial is None:
            return None
        names = {n: m for n, m in self.mass.items() if n not in self.used and n.startswith(partial)}
        return (partial, names) if len(names) > 1 else None

    def active(self) -> bool:
        return self.open_names() is not None

    def bias(self, tokens: np.ndarray) -> np.ndarray:
        out = np.zeros(len(tokens), dtype=np.float32)
        opened = self.open_names()
        if opened is None:
            return out
        partial, names = opened
        total = sum(names.values())
        for k, token in enumerate(tokens.tolist()):
            text = partial + self.piece(int(token))
            mass = sum(m for n, m in names.items() if n.startswith(text) or text.startswith(n))
            if mass > 0:
                out[k] = self.weight * float(np.log(mass / total))
        return out


class _XGrammarRow(RowMatcher):
    def __init__(self, matcher):
        self.m = matcher

    def fill(self, bitmask, row):
        self.m.fill_next_token_bitmask(bitmask, row)

    def consume(self, token):
        return self.m.accept_token(token)

    @property
    def error(self):
        return "xgrammar rejected the token"


def check_token_bytes(bytes_of, tokenizer, samples: int = 512, library: str = "llguidance") -> None:
    """Refuse a tokenizer that the grammar library reads differently from the tokenizer itself.

    A grammar library derives each token's bytes from the tokenizer file's settings; where those contradict the
    vocabulary (a byte-level BPE converted with SentencePiece settings by some transformers versions:
    :func:`skillbank.model.embedded.repair_byte_level_bpe`; llguidance reads such a file wrong, xgrammar 0.2.9
    right) the masks allow the wrong tokens, and constrained plans come out valid but wrong, without an error.
    ``bytes_of(token_id)`` is the library's reading. Compares ``samples`` tokens spread over the vocabulary
    (special tokens and tokens that are not whole characters on their own left out; a few milliseconds)."""
    special = set(getattr(tokenizer, "all_special_ids", None) or [])
    n = len(tokenizer)
    compared, wrong = 0, []
    for i in range(0, n, max(1, n // samples)):
        if i in special:
            continue
        text = tokenizer.decode([i])
        if "\ufffd" in text:
            continue
        compared += 1
        if bytes_of(i) != text.encode("utf-8"):
            wrong.append(i)
    if compared and len(wrong) > 0.02 * compared:
        i = wrong[0]
        raise ModelError(
            f"the grammar library reads this tokenizer's tokens differently from the tokenizer itself ({len(wrong)} "
            f"of {compared} sampled tokens; token {i} is {tokenizer.decode([i])!r} to the tokenizer and "
            f"{bytes_of(i)!r} to {library}): constrained plans would be wrong. The tokenizer "
            "file's decoder or byte-fallback settings contradict its vocabulary; for the embedded base, delete "
            "the converted model under the cache's models/ folder so that it is converted again")


class GrammarCache:
    """Compiles each grammar once per tokenizer and backend, and hands out fresh row matchers.

    ``stops`` are the ids that end a generation: the grammar allows them exactly when it is complete.
    ``vocab_size`` is the model's logits width (it may exceed the tokenizer's)."""

    # Compiled grammars (whole-plan and plan-prefix ones) cost ~0.3 MB each and recompile in a few ms: keep the
    # recent ones only, so memory stays flat however many shards a long-running service has decoded with.
    max_compiled = 512

    def __init__(self, tokenizer, stops: Iterable[int], vocab_size: int, backend: str = DEFAULT_BACKEND):
        if backend not in BACKENDS:
            raise ModelError(f"unknown grammar backend {backend!r}; choose one of {list(BACKENDS)}")
        self.backend, self.vocab_size = backend, int(vocab_size)
        self.stops = sorted(set(stops))
        self._lock = threading.Lock()
        self._compiled: OrderedDict[str, object] = OrderedDict()  # least recently used first
        self.compile_seconds: dict[str, float] = {}  # grammar digest -> seconds its compilation took
        t0 = time.perf_counter()
        if backend == "llguidance":
            from skillbank.model.light_tokenizer import LightTokenizer
            if isinstance(tokenizer, LightTokenizer):  # the llama.cpp path: no transformers to import
                import llguidance

                backend = tokenizer.backend_tokenizer
                if backend.padding is not None or backend.truncation is not None:  # llguidance reads neither
                    from tokenizers import Tokenizer
                    backend = Tokenizer.from_str(backend.to_str())
                    backend.no_padding()
                    backend.no_truncation()
                self._tok = llguidance.LLTokenizer(backend.to_str(), n_vocab=self.vocab_size, eos_token=self.stops)
            else:
                import llguidance.hf
                try:
                    self._tok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=self.vocab_size, eos_token=self.stops)
                except ValueError as exc:
                    raise ModelError(f"structured decoding needs a fast (Rust) tokenizer: {exc}") from None
            tok = self._tok  # both paths: the llama.cpp one reads the same converted file
            check_token_bytes(lambda i: tok.decode_bytes([i]), tokenizer)
        else:
            import xgrammar
            info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab_size,
                                                           stop_token_ids=self.stops)
            vocab = info.decoded_vocab
            check_token_bytes(lambda i: bytes(vocab[i]), tokenizer, library="xgrammar")
            self._vocab_bytes = vocab
            self._tok = xgrammar.GrammarCompiler(info, cache_enabled=False)
        self.tokenizer_seconds = time.perf_counter() - t0

    def limit(self, max_compiled: int) -> None:
        """Keep at most ``max_compiled`` compiled grammars from now on (never raises the bound: banks sharing
        a tokenizer share this cache, and the tightest bound wins)."""
        if max_compiled < 1:
            raise ModelError(f"max_compiled must be >= 1, got {max_compiled}")
        with self._lock:
            self.max_compiled = min(self.max_compiled, int(max_compiled))
            self._evict()

    def _evict(self) -> None:
        while len(self._compiled) > self.max_compiled:
            evicted, _ = self._compiled.popitem(last=False)
            self.compile_seconds.pop(evicted, None)

    def bitmask(self, rows: int) -> torch.Tensor:
        import torch
        return torch.full((rows, (self.vocab_size + 31) // 32), -1, dtype=torch.int32)

    def compile(self, grammar: GraphGrammar):
        key = grammar.digest
        with self._lock:
            if key not in self._compiled:
                t0 = time.perf_counter()
                self._compiled[key] = self._compile(grammar)
                self.compile_seconds[key] = time.perf_counter() - t0
                self._evict()
            self._compiled.move_to_end(key)
            return self._compiled[key]

    def decode(self, tokens: list[int]) -> bytes:
        if self.backend != "llguidance":
            return b"".join(bytes(self._vocab_bytes[t]) for t in tokens)
        return self._tok.decode_bytes(tokens)

    def _compile(self, grammar: GraphGrammar):
        if self.backend == "llguidance":
            import llguidance
            matcher = llguidance.LLMatcher(self._tok, grammar.lark(), log_level=0)
            if matcher.is_error():
                raise ModelError(f"grammar does not compile: {matcher.get_error()}")
            return matcher
        return self._tok.compile_grammar(grammar.ebnf())

    def matcher(self, grammar: GraphGrammar, *, plan_prefixes: bool = True,
                prior: SkillPrior | None = None) -> RowMatcher:
        """A fresh matcher at the grammar's start (compiled grammars are reused). With llguidance a shard's
        grammar is followed through its plan-prefix grammars (:class:`_PlanRow`) unless ``plan_prefixes`` is
        False (the one whole-plan grammar, as an upstream server gets it). ``prior``: weigh the row's choice of
        skill names by it (:class:`SkillPrior`)."""
        row = self._matcher(grammar, plan_prefixes)
        if prior is not None and prior.weight > 0 and isinstance(grammar, GraphGrammar):
            return prior.row(row, grammar, self.decode)
        return row

    def _matcher(self, grammar: GraphGrammar, plan_prefixes: bool) -> RowMatcher:
        if plan_prefixes and self.backend == "llguidance" and isinstance(grammar, GraphGrammar) \
                and grammar.prior is None:
            return _PlanRow(self, grammar)
        compiled = self.compile(grammar)
        if self.backend == "llguidance":
            return _LLGuidanceRow(compiled.deep_copy())
        import xgrammar
        return _XGrammarRow(xgrammar.GrammarMatcher(compiled))


def grammar_cache(model, tokenizer, backend: str = DEFAULT_BACKEND) -> GrammarCache:
    """The grammar cache of a (model, tokenizer) pair, made once and kept on the tokenizer (converting a
    tokenizer for the library takes ~0.5 s; every shard of a bank shares the base's tokenizer)."""
    from skillbank.model.prompts import stop_token_ids

    caches = getattr(tokenizer, "_skillbank_grammar_caches", None)
    if caches is None:
        caches = {}
        try:
            tokenizer._skillbank_grammar_caches = caches
        except AttributeError:  # a tokenizer that refuses new attributes: no reuse across calls
            pass
    config = getattr(model.get_base_model() if hasattr(model, "get_base_model") else model, "config", None)
    vocab = int(getattr(config, "vocab_size", 0) or len(tokenizer))
    key = (backend, vocab)
    if key not in caches:
        caches[key] = GrammarCache(tokenizer, stop_token_ids(tokenizer, model), vocab, backend)
    return caches[key]


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set every logit whose bit is 0 to -inf, in place ([rows, vocab] logits, [rows, ceil(vocab/32)]
    int32 bitmask, bit k of word w = token 32w+k). Plain torch: the libraries' own helpers use
    torch.compile or CUDA kernels, which a CPU-only install should not need."""
    allowed = _unpack(bitmask, logits.shape[-1])
    logits.masked_fill_(~allowed.to(logits.device), float("-inf"))


def _unpack(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """[rows, ceil(vocab/32)] int32 bitmask -> [rows, vocab] bool."""
    import torch
    as_bytes = bitmask.contiguous().view(torch.uint8)  # little-endian: byte b holds tokens 8b..8b+7
    shifts = torch.arange(8, dtype=torch.uint8)
    return ((as_bytes.unsqueeze(-1) >> shifts) & 1).flatten(1)[:, :vocab].bool()


def allowed_tokens(bitmask_row: torch.Tensor, vocab: int) -> np.ndarray:
    """Ids allowed by one bitmask row (for tests and diagnostics)."""
    return _unpack(bitmask_row.reshape(1, -1), vocab)[0].nonzero().flatten().numpy()
