"""Compositional augmentation: more training requests from a family's own records, values kept verbatim.

A family taught from a few dozen records gets few multi-step examples, and each value it sees once: the executor
then drops a last step or writes a value it memorized. :func:`compose_records` adds two kinds of records, built
only from what the family's records show:

- **resampled** - a record with one literal argument value replaced, in its request and in its graph, by another
  value the records give the same argument of the same skill ("January" -> "last month" for ``period``): the
  executor learns to copy values, not to remember them. Single- and multi-step records alike, so the multi-step
  shapes the family has are seen with other values.
- **joined** - two single-step requests joined with a connector the family's own multi-step requests use
  (", then", " and ", " -> " ...), their graphs joined with a link the family's multi-step records show: the
  consumer's argument takes ``<node-0>`` (which argument of which skill takes the output of which skill), and
  only a consumer request that does not state that argument itself is joined. Where the multi-step records show
  two steps with no data between them, such pairs are joined without a link too.

Never a skill, an argument or a value the records do not have; every literal value stays verbatim in its request
(checked on every record made). Deterministic for a seed, capped (:attr:`Compose.max_new`, default: as many as the
records), and it steps aside - saying why in its report - where the records cannot support a kind (one skill
only, no multi-step record, no connector found, multi-step records that disagree about a link).

Composed requests are judged only on hand-written multi-step requests: joining utterances with a few connectors
teaches surface cues, and sets built that way overstate accuracy on natural requests.
"""
from __future__ import annotations

import random
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from typing import Sequence

from skillbank.data.records import Record
from skillbank.errors import SkillbankError
from skillbank.graph import NODE_REF, Argument, TaskGraph, literal_values

#: Connectors looked for in the family's multi-step requests (case-insensitive); only those found are used.
CONNECTORS = (", then ", " then ", " and then ", ", and ", " and ", " -> ", ", afterwards ", " after that ",
              ". Then ", "; ", " once that's done ", ", after which ")
COMPOSED_SUFFIX = "~compose"


class ComposeError(SkillbankError, ValueError):
    """Bad composition settings."""


@dataclass(frozen=True)
class Compose:
    """How many records to compose and of which kinds. max_new: at most this many new records (None: as many as
    the records given). seed: the same seed and records give the same output."""

    max_new: int | None = None
    resample: bool = True
    join: bool = True
    seed: int = 0

    def __post_init__(self):
        if self.max_new is not None and (isinstance(self.max_new, bool) or not isinstance(self.max_new, int)
                                         or self.max_new < 0):
            raise ComposeError(f"max_new must be a whole number >= 0 or None, got {self.max_new!r}")
        if not (self.resample or self.join):
            raise ComposeError("resample = False and join = False would compose nothing")

    def to_dict(self) -> dict:
        return {"max_new": self.max_new, "resample": self.resample, "join": self.join, "seed": self.seed}


@dataclass
class ComposeReport:
    """What :func:`compose_records` made, from what, and what it left out and why."""

    records_in: int
    made: Counter = field(default_factory=Counter)  # kind -> records made
    connectors: list[str] = field(default_factory=list)
    links: list[tuple[str, str, str]] = field(default_factory=list)  # (producer, consumer, argument)
    cap: int = 0
    candidates: int = 0
    notes: list[str] = field(default_factory=list)  # why a kind stepped aside or narrowed
    examples: list[tuple[str, str]] = field(default_factory=list)  # (kind, request)

    def to_dict(self) -> dict:
        return {"records_in": self.records_in, "made": dict(self.made), "connectors": [c.strip() or c for c in
                                                                                       self.connectors],
                "links": [list(link) for link in self.links], "cap": self.cap, "candidates": self.candidates,
                "notes": list(self.notes)}

    def summary(self) -> str:
        return summary_text(self.to_dict())


def summary_text(report: dict) -> str:
    """One line of what a composition made (a :meth:`ComposeReport.to_dict`, as a shard's summary keeps it)."""
    made = report.get("made", {})
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(made.items())) or "none"
    text = (f"composed {sum(made.values())} record(s) from {report.get('records_in')} ({kinds}; cap "
            f"{report.get('cap')}, {report.get('candidates')} candidates)")
    return text + "".join(f"; {n}" for n in report.get("notes", []))


def _literals(graph: TaskGraph) -> list[tuple[int, str, str]]:
    return [(i, a.name, a.value) for i, n in enumerate(graph.nodes) for a in n.arguments if not NODE_REF.match(a.value)]


def _valid(request: str, graph: TaskGraph) -> bool:
    return all(v in request for v in literal_values(graph))


def _resampled(r: Record, pool: dict, rng: random.Random) -> Record | None:
    """``r`` with one literal value swapped for another of the same skill and argument, or None where no value
    can be swapped cleanly (it must occur once in the request, as the value of one argument only)."""
    literals = _literals(r.graph)
    counts = Counter(v for _, _, v in literals)
    choices = [(i, name, v) for i, name, v in literals
               if counts[v] == 1 and r.request.count(v) == 1
               and not any(v != w and (v in w or w in v) for _, _, w in literals)]
    rng.shuffle(choices)
    for i, name, v in choices:
        others = [w for w in pool[(r.graph.nodes[i].task, name)] if w != v and w not in r.request]
        if not others:
            continue
        new_value = rng.choice(sorted(others))
        request = r.request.replace(v, new_value, 1)
        nodes = list(r.graph.nodes)
        nodes[i] = replace(nodes[i], arguments=tuple(Argument(a.name, new_value if a.name == name else a.value)
                                                      for a in nodes[i].arguments))
        graph = TaskGraph(tuple(nodes), r.graph.links)
        if _valid(request, graph):
            return replace(r, id=f"{r.id}{COMPOSED_SUFFIX}-v", request=request, graph=graph, structure="")
    return None


def _link_patterns(records: Sequence[Record], report: ComposeReport) -> tuple[set, float]:
    """(producer skill, consumer skill, consumer argument) of every data link the multi-step records show, less
    the pairs whose records disagree about which argument takes the output; and the share of multi-step records
    that have two steps with no link between them."""
    by_pair: dict[tuple[str, str], Counter] = defaultdict(Counter)
    unlinked = multi = 0
    for r in records:
        nodes = r.graph.nodes
        if len(nodes) < 2:
            continue
        multi += 1
        linked = set()
        for j, node in enumerate(nodes):
            for a in node.arguments:
                m = NODE_REF.match(a.value)
                if m and int(m.group(1)) < j:
                    by_pair[(nodes[int(m.group(1))].task, node.task)][a.name] += 1
                    linked.add(frozenset((int(m.group(1)), j)))
        explicit = {frozenset((l.source, l.target)) for l in r.graph.links}
        tasks = [n.task for n in nodes]
        if any(frozenset((i, j)) not in linked and frozenset((tasks[i], tasks[j])) not in explicit
               for i in range(len(nodes)) for j in range(i + 1, len(nodes))):
            unlinked += 1
    patterns = set()
    for (producer, consumer), names in sorted(by_pair.items()):
        if len(names) > 1:
            report.notes.append(f"multi-step records disagree about which argument of {consumer} takes the output "
                                f"of {producer} ({', '.join(sorted(names))}): that link is not joined")
            continue
        patterns.add((producer, consumer, next(iter(names))))
    return patterns, unlinked / multi if multi else 0.0


def _connectors_used(multi: Sequence[Record]) -> list[str]:
    """The :data:`CONNECTORS` the multi-step requests use, the longest first where one holds another (", then "
    is found, not also the " then " inside it)."""
    found = set()
    for r in multi:
        text = r.request.lower()
        for c in sorted(CONNECTORS, key=len, reverse=True):
            if c.lower() in text:
                found.add(c)
                text = text.replace(c.lower(), "\0")
    return [c for c in CONNECTORS if c in found]


def _join(first: Record, second: Record, connector: str, argument: str | None) -> tuple[Record, str] | None:
    """The two single-step records as one request and a two-step graph (the second step's ``argument`` taking the
    first's output; None: no link), and its kind; None where a value would not stay verbatim."""
    head = first.request.rstrip().rstrip(".!?")
    tail = second.request.strip()
    if tail[:1].isupper() and not tail[1:2].isupper() and connector.strip() not in (".", ". Then"):
        tail = tail[:1].lower() + tail[1:]
    request = f"{head}{connector}{tail}"
    consumer = second.graph.nodes[0]
    if argument is not None:
        consumer = replace(consumer, arguments=consumer.arguments + (Argument(argument, "<node-0>"),))
    graph = TaskGraph((first.graph.nodes[0], consumer), ())
    if not _valid(request, graph):
        return None
    kind = "joined" if argument is not None else "joined-unlinked"
    return Record(f"{first.id}+{second.id}{COMPOSED_SUFFIX}-j", first.family, request, graph), kind


def compose_records(records: Sequence[Record], settings: Compose = Compose(), *, examples: int = 3
                    ) -> tuple[list[Record], ComposeReport]:
    """The records given, then up to ``settings.max_new`` composed ones (see the module docstring)."""
    records = list(records)
    report = ComposeReport(len(records))
    report.cap = len(records) if settings.max_new is None else settings.max_new
    rng = random.Random(settings.seed)
    skills = {t for r in records for t in r.graph.tasks}
    pool: dict[tuple[str, str], set[str]] = defaultdict(set)
    for r in records:
        for i, name, v in _literals(r.graph):
            if v in r.request:
                pool[(r.graph.nodes[i].task, name)].add(v)
    candidates: list[tuple[str, Record]] = []
    unlinked_share = 0.0
    if settings.resample:
        for r in records:
            made = _resampled(r, pool, random.Random(f"{settings.seed}:{r.id}"))
            if made is not None:
                candidates.append(("resampled", made))
        if not any(k == "resampled" for k, _ in candidates):
            report.notes.append("no value could be resampled (each argument has one value in the records)")
    if settings.join:
        multi = [r for r in records if len(r.graph.nodes) > 1]
        report.connectors = _connectors_used(multi)
        patterns, unlinked_share = _link_patterns(records, report)
        report.links = sorted(patterns)
        singles: dict[str, list[Record]] = defaultdict(list)
        for r in records:
            if len(r.graph.nodes) == 1:
                singles[r.graph.nodes[0].task].append(r)
        if len(skills) < 2:
            report.notes.append("one skill only: nothing to join")
        elif not multi:
            report.notes.append("no multi-step record shows how this family's steps combine: nothing joined")
        elif not report.connectors:
            report.notes.append("no known connector in the multi-step requests: nothing joined")
        else:
            pairs = [(p, c, a) for p, c, a in sorted(patterns)]
            if unlinked_share:
                pairs += [(p, c, None) for p in sorted(singles) for c in sorted(singles) if p != c]
            for producer, consumer, argument in pairs:
                firsts = singles.get(producer, [])
                seconds = [r for r in singles.get(consumer, [])
                           if argument is None or all(a.name != argument for a in r.graph.nodes[0].arguments)]
                if not firsts or not seconds:
                    continue
                for _ in range(min(len(firsts), len(seconds), 4)):
                    made = _join(rng.choice(firsts), rng.choice(seconds), rng.choice(report.connectors), argument)
                    if made is not None:
                        candidates.append((made[1], made[0]))
            if not any(k.startswith("joined") for k, _ in candidates):
                report.notes.append("no single-step request of a consumer leaves its linked argument unsaid: "
                                    "nothing joined")
    seen = {r.request for r in records}
    unique = []
    for kind, r in candidates:
        if r.request not in seen:
            seen.add(r.request)
            unique.append((kind, r))
    report.candidates = len(unique)
    rng.shuffle(unique)
    # The kinds in the proportions the records support: at most half resampled, every linked join, and joins
    # without a link only in the share of multi-step records that have unlinked steps (so that composed requests
    # do not teach independent steps where this family's steps feed each other).
    by_kind: dict[str, list[Record]] = defaultdict(list)
    for kind, r in unique:
        by_kind[kind].append(r)
    quota = {"resampled": report.cap // 2 if by_kind["joined"] or by_kind["joined-unlinked"] else report.cap}
    quota["joined"] = report.cap - min(quota["resampled"], len(by_kind["resampled"]))
    rest = quota["joined"] - min(quota["joined"], len(by_kind["joined"]))
    quota["joined-unlinked"] = round(rest * unlinked_share)
    taken: Counter = Counter()
    chosen = []
    for kind, r in unique:
        if taken[kind] < quota.get(kind, 0):
            taken[kind] += 1
            chosen.append((kind, r))
    for kind, r in chosen:
        report.made[kind] += 1
        if len(report.examples) < examples:
            report.examples.append((kind, r.request))
    if len(chosen) < len(unique):
        report.notes.append(f"kept {len(chosen)} of {len(unique)} candidates (cap {report.cap}, the kinds in the "
                            "proportions the records support)")
    return records + [r for _, r in chosen], report
