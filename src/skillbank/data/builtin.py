"""The built-in benchmark: an offline, deterministic stream of five skill families.

It mirrors TaskBench's themes with the project's own catalog of 100 skills (40 / 11 / 21 / 9 / 19 in
Daily Life, Language & Speech, Retrieval & Understanding, Vision & Document, Generation & Editing;
skill definitions, templates and value pools live in :mod:`skillbank.data.builtin_catalog`) and
samples TaskBench-like workflows: single nodes, chains and DAGs of 1 to 5 nodes, each rendered as one
natural request. Records have exactly the TaskBench stream's format.

How a request encodes its graph (so the mapping is learnable, one intent -> one graph):

* Clauses appear in node order; nodes are topologically ordered.
* Literal argument values are copied verbatim into the request (free text in double quotes).
* An argument that consumes node *j* is written as a reference: "it" or "the result" for the clause
  just before, otherwise the producer's noun ("the transcript"), unique within the family.
* A *sequential* connective ("then", "after that", ...) before clause *k* means the link (k-1) -> k;
  an *independent* one ("and also", "separately", ...) means no link from k-1. In media families a
  link always comes with a reference; in Daily Life "then" may order two unrelated tasks (a task link
  without a ``<node-i>`` value, as in TaskBench's daily-life graphs).
* Gold ``task_links`` list every link (declared order links and those implied by references), so
  the gold graph is already in canonical link form.

Routing is deliberately not trivial: file names, free text and verbs are shared across families and
a request may open with a context sentence that mentions other families' words.
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

from skillbank.data.builtin_catalog import (CLOSERS, CONTEXTS, FAMILIES, INDEPENDENT, POOLS, SEQUENTIAL, WRAPPERS,
                                            FamilyDef, SkillDef)
from skillbank.data.catalog import ArgSpec, Catalog, Family, Skill, skill_id
from skillbank.data.records import Record, structure_of
from skillbank.data.stream import Stream
from skillbank.errors import StreamError
from skillbank.graph import Argument, Link, Node, TaskGraph

SOURCE = "Builtin"
GENERATOR_VERSION = 1
STRUCTURE_WEIGHTS = {"single": 35, "chain": 40, "dag": 25}
NODE_COUNT_WEIGHTS = {"chain": {2: 50, 3: 30, 4: 15, 5: 5}, "dag": {2: 10, 3: 45, 4: 33, 5: 12}}
# A context sentence / closing phrase is likelier on short requests, so most requests stay 12-45 words.
CONTEXT_P = {1: 0.8, 2: 0.55, 3: 0.4}  # by node count; 0.2 beyond
CLOSER_P = {1: 0.35, 2: 0.25, 3: 0.2}  # 0.1 beyond
MAX_TRIES_PER_RECORD = 200


# -- catalog -----------------------------------------------------------------------------------
def builtin_skill_id(family: FamilyDef, skill: SkillDef) -> str:
    return skill_id(SOURCE, family.key, skill.name)


def build_builtin_catalog() -> Catalog:
    """The built-in catalog: 100 skills partitioned into the five families (T1..T5 order)."""
    skills, families = [], []
    for fam in FAMILIES:
        ids = []
        for sk in fam.skills:
            desc = sk.desc + (f" Output: {sk.output}." if sk.output else "")
            args = tuple(ArgSpec(a.name, a.type, a.desc) for a in sk.args)
            sid = builtin_skill_id(fam, sk)
            skills.append(Skill(sid, fam.key, sk.name, desc, args))
            ids.append(sid)
        families.append(Family(fam.key, fam.title, tuple(ids)))
    return Catalog(skills, families)


def tool_graph(family_key: str) -> list[tuple[str, str]]:
    """Data-flow edges (producer id, consumer id) of one family: the producer's output type is
    accepted by one of the consumer's arguments. Daily-life order links (a "then" between unrelated
    tasks) may join any two skills and are not listed."""
    fam = _family_def(family_key)
    return [(builtin_skill_id(fam, p), builtin_skill_id(fam, c))
            for p in fam.skills for c in fam.skills
            if p is not c and p.output and any(p.output in a.accepts for a in c.args)]


def _family_def(key: str) -> FamilyDef:
    for fam in FAMILIES:
        if fam.key == key:
            return fam
    raise KeyError(f"unknown built-in family {key!r}; known: {[f.key for f in FAMILIES]}")


# -- sampling a plan (the graph before it is rendered) --------------------------------------------
@dataclass
class _Step:
    skill: SkillDef
    refs: dict[str, int]  # argument name -> index of the producer node
    after_prev: bool  # a sequential connective: link from the node just before


class _Planner:
    """Samples workflow plans over one family's skills."""

    def __init__(self, fam: FamilyDef):
        self.fam = fam
        self.daily = fam.short == "t1"
        self.skills = fam.skills

    def slots(self, consumer: SkillDef, producer: SkillDef) -> list[str]:
        """Arguments of ``consumer`` that can take ``producer``'s output."""
        if not producer.output:
            return []
        return [a.name for a in consumer.args if producer.output in a.accepts]

    def consumers(self, producer: SkillDef, used: set[str]) -> list[SkillDef]:
        return [c for c in self.skills if c.name not in used and self.slots(c, producer)]

    def plan(self, rng: random.Random, structure: str, n: int) -> list[_Step] | None:
        """One plan of ``n`` steps, or None when this attempt ran into a dead end."""
        if structure == "single":
            return [_Step(rng.choice(self.skills), {}, False)]
        if structure == "chain":
            return self._chain(rng, n)
        return self._dag(rng, n)

    def _chain(self, rng: random.Random, n: int) -> list[_Step] | None:
        if self.daily:
            steps = [_Step(rng.choice(self.skills), {}, False)]
        else:
            starts = [s for s in self.skills if self.consumers(s, {s.name})]
            steps = [_Step(rng.choice(starts), {}, False)]
        used = {steps[0].skill.name}
        while len(steps) < n:
            prev = steps[-1].skill
            options = self.consumers(prev, used)
            if options and (not self.daily or rng.random() < 0.6):
                nxt = rng.choice(options)
                steps.append(_Step(nxt, {rng.choice(self.slots(nxt, prev)): len(steps) - 1}, True))
            elif self.daily:  # an order link between unrelated tasks
                nxt = rng.choice([s for s in self.skills if s.name not in used])
                steps.append(_Step(nxt, {}, True))
            else:
                return None
            used.add(steps[-1].skill.name)
        return steps

    def _dag(self, rng: random.Random, n: int) -> list[_Step] | None:
        steps = [_Step(rng.choice(self.skills), {}, False)]
        used = {steps[0].skill.name}
        while len(steps) < n:
            k = len(steps)
            mode = rng.choices(["ref", "independent", "order"], weights=[50, 20, 30] if self.daily else [70, 30, 0])[0]
            step = None
            if mode == "ref":
                step = self._ref_step(rng, steps, used)
            if step is None:
                nxt = rng.choice([s for s in self.skills if s.name not in used])
                step = _Step(nxt, {}, mode == "order")
            elif self.daily and (k - 1) not in step.refs.values():
                step.after_prev = rng.random() < 0.3  # "then" also orders after the previous task
            steps.append(step)
            used.add(step.skill.name)
        return steps

    def _ref_step(self, rng: random.Random, steps: list[_Step], used: set[str]) -> _Step | None:
        """A step that consumes one (sometimes two) earlier outputs."""
        k = len(steps)
        pairs = [(j, c) for j in range(k) for c in self.consumers(steps[j].skill, used)]
        if not pairs:
            return None
        j, consumer = rng.choice(pairs)
        refs = {rng.choice(self.slots(consumer, steps[j].skill)): j}
        if rng.random() < 0.5:  # a merge: fill a second slot from another earlier node
            extra = [(slot, i) for i in range(k) if i != j
                     for slot in self.slots(consumer, steps[i].skill) if slot not in refs]
            if extra:
                slot, i = rng.choice(extra)
                refs[slot] = i
        return _Step(consumer, refs, (k - 1) in refs.values())


# -- rendering ----------------------------------------------------------------------------------
def _reference(rng: random.Random, skill: SkillDef, arg: str, producer: SkillDef, is_prev: bool,
               it_used: bool) -> str:
    override = skill.ref_phrases.get(arg)
    if override:
        return rng.choice(override).format(noun=producer.noun)
    if is_prev and not it_used:
        return rng.choices(["it", "the result", producer.noun], weights=[40, 20, 40])[0]
    return producer.noun


def _render(rng: random.Random, fam: FamilyDef, steps: list[_Step]) -> tuple[str, TaskGraph, str]:
    """The request body and gold graph of a plan, and the first clause's template."""
    ids = [builtin_skill_id(fam, s.skill) for s in steps]
    clauses, nodes, links = [], [], []
    first_template = ""
    for k, step in enumerate(steps):
        sk = step.skill
        template = rng.choice(sk.templates)
        if k == 0:
            first_template = template
        fills, args, it_used = {}, [], False
        for a in sk.args:
            if a.name in step.refs:
                j = step.refs[a.name]
                phrase = _reference(rng, sk, a.name, steps[j].skill, j == k - 1, it_used)
                it_used = it_used or phrase in ("it", "the result")
                fills[a.name] = phrase
                args.append(Argument(a.name, f"<node-{j}>"))
            else:
                pool = POOLS[a.pool]
                value = pool.sample(rng)
                while value in [x.value for x in args]:  # e.g. two different cities for one flight search
                    value = pool.sample(rng)
                fills[a.name] = f'"{value}"' if pool.quote else value
                args.append(Argument(a.name, value))
        clauses.append(template.format(**fills))
        nodes.append(Node(ids[k], tuple(args)))
        # Every link is listed (order links and those implied by references), by consumer then producer.
        sources = sorted(set(step.refs.values()) | ({k - 1} if step.after_prev else set()))
        links.extend(Link(ids[j], ids[k]) for j in sources)
    text = clauses[0]
    for k in range(1, len(steps)):
        text += rng.choice(SEQUENTIAL if steps[k].after_prev else INDEPENDENT) + clauses[k]
    return text, TaskGraph(tuple(nodes), tuple(links)), first_template


def _wrap(rng: random.Random, body: str, first_template: str, n_nodes: int) -> str:
    wrappers = WRAPPERS
    if first_template.startswith("{"):  # never capitalise a value: it must stay verbatim
        wrappers = tuple(w for w in WRAPPERS if "{S}" not in w)
    w = rng.choice(wrappers)
    request = w.replace("{s}", body).replace("{S}", body[:1].upper() + body[1:])
    if rng.random() < CONTEXT_P.get(n_nodes, 0.2):
        request = f"{rng.choice(CONTEXTS)} {request}"
    if rng.random() < CLOSER_P.get(n_nodes, 0.1):
        request = f"{request} {rng.choice(CLOSERS)}"
    return request


def _sample_record(rng: random.Random, fam: FamilyDef, planner: _Planner) -> tuple[str, TaskGraph]:
    structure = rng.choices(list(STRUCTURE_WEIGHTS), weights=list(STRUCTURE_WEIGHTS.values()))[0]
    n = 1
    if structure != "single":
        counts = NODE_COUNT_WEIGHTS[structure]
        n = rng.choices(list(counts), weights=list(counts.values()))[0]
    for _ in range(MAX_TRIES_PER_RECORD):
        steps = planner.plan(rng, structure, n)
        if steps is None:
            continue
        body, graph, first = _render(rng, fam, steps)
        if structure_of(graph) != structure:  # e.g. a DAG draw that came out as a chain
            continue
        graph.validate()
        return _wrap(rng, body, first, n), graph
    raise RuntimeError(f"could not sample a {n}-node {structure} for {fam.key}")  # pragma: no cover


# -- the stream ---------------------------------------------------------------------------------
def build_builtin_stream(*, seed: int = 0, train_per_family: int = 1000, test_per_family: int = 300) -> Stream:
    """Generate the built-in benchmark stream (name ``builtin``), deterministically from ``seed``.

    Every family gets ``train_per_family`` training and ``test_per_family`` held-out records; no
    request text occurs twice in the stream (so held-out requests never occur in training). Record
    ids are ``builtin-<t>-<6 digits>``, training first. Takes about a second for the default sizes.
    """
    if train_per_family < 0 or test_per_family < 0:
        raise StreamError(f"train_per_family and test_per_family must be >= 0, got {train_per_family} "
                         f"and {test_per_family}")
    catalog = build_builtin_catalog()
    seen: set[str] = set()
    train: dict[str, list[Record]] = {}
    test: dict[str, list[Record]] = {}
    families_report = {}
    for fam in FAMILIES:
        planner = _Planner(fam)
        splits = {}
        for split, size, offset in (("train", train_per_family, 0), ("test", test_per_family, train_per_family)):
            rng = random.Random(f"skillbank-builtin:{seed}:{fam.key}:{split}")
            records = []
            misses = 0
            while len(records) < size:
                request, graph = _sample_record(rng, fam, planner)
                if request in seen:
                    misses += 1
                    if misses > 50 * max(size, 1):  # pragma: no cover - pools are far larger than this
                        raise StreamError(f"{fam.key}: value pools too small for {size} distinct {split} requests")
                    continue
                seen.add(request)
                rid = f"builtin-{fam.short}-{offset + len(records):06d}"
                records.append(Record(rid, fam.key, request, graph, structure_of(graph)))
            splits[split] = records
        train[fam.key], test[fam.key] = splits["train"], splits["test"]
        families_report[fam.key] = {
            "title": fam.title, "skills": len(fam.skills), "tool_graph_edges": len(tool_graph(fam.key)),
            **{split: split_report(recs) for split, recs in splits.items()},
        }
    report = {
        "generator": "skillbank.data.builtin", "version": GENERATOR_VERSION, "seed": seed,
        "train_per_family": train_per_family, "test_per_family": test_per_family,
        "structure_weights": STRUCTURE_WEIGHTS,
        "node_count_weights": {k: {str(n): w for n, w in v.items()} for k, v in NODE_COUNT_WEIGHTS.items()},
        "families": families_report,
    }
    return Stream("builtin", catalog, train, test, source="skillbank-builtin", seed=seed, report=report)


def split_report(records: list[Record]) -> dict:
    """Record count, structure and node-count distributions and mean request length (words)."""
    structures = Counter(r.structure for r in records)
    nodes = Counter(len(r.graph.nodes) for r in records)
    words = [len(r.request.split()) for r in records]
    return {
        "records": len(records),
        "structure": {s: structures.get(s, 0) for s in ("single", "chain", "dag")},
        "nodes": {str(n): nodes[n] for n in sorted(nodes)},
        "mean_words": round(sum(words) / len(words), 2) if words else 0.0,
    }
