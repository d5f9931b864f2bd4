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

**Many families** (``build_builtin_stream(families=K)``, K = 5..100): the five families are split into K
finer families of related skills (:func:`split_families`), keyed ``<built-in key>-NN``
(``t1_daily_life-03``). Every finer family samples its own requests from its own skills, so no request
spans two families: a multi-step request is *regenerated* within the family, never drawn from the parent
and filtered. A structure or node count the family's skills cannot form is not drawn, and the stream's
report says which (``report["split"]``) and how many sampled plans were redrawn. K = 5 is today's
stream, byte for byte.
"""
from __future__ import annotations

import functools
import math
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from skillbank.data.builtin_catalog import (CLOSERS, CONTEXTS, FAMILIES, INDEPENDENT, POOLS, SEQUENTIAL, WRAPPERS,
                                            FamilyDef, Pool, SkillDef)
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
STRUCTURES = tuple(STRUCTURE_WEIGHTS)
MAX_NODES = 5
# A family key becomes a shard directory and a route label (skillbank.memory.bank.FAMILY_NAME).
FAMILY_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
MIN_FAMILIES = len(FAMILIES)
MAX_FAMILIES = sum(len(f.skills) for f in FAMILIES)  # a family needs at least one skill


# -- catalog -----------------------------------------------------------------------------------
def builtin_skill_id(family: FamilyDef, skill: SkillDef, source: str = SOURCE) -> str:
    return _skill_id(source, family.key, skill.name)


@functools.lru_cache(maxsize=None)
def _skill_id(source: str, family_key: str, name: str) -> str:
    # Cached: every rendered node needs its id, and a thousand-family stream renders ~150,000 nodes.
    return skill_id(source, family_key, name)


def build_builtin_catalog(families: int = MIN_FAMILIES) -> Catalog:
    """The built-in catalog: 100 skills partitioned into the five families (T1..T5 order), or into
    ``families`` finer families (:func:`split_families`)."""
    return catalog_of(FAMILIES if families == MIN_FAMILIES else split_families(families))


def catalog_of(fam_defs: Sequence[FamilyDef], source: str = SOURCE) -> Catalog:
    """The catalog of some family definitions (skill ids ``<source>::<family key>::<name>``)."""
    skills, families = [], []
    for fam in fam_defs:
        ids = []
        for sk in fam.skills:
            desc = sk.desc + (f" Output: {sk.output}." if sk.output else "")
            args = tuple(ArgSpec(a.name, a.type, a.desc) for a in sk.args)
            sid = builtin_skill_id(fam, sk, source)
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


def data_flow_edges(fam: FamilyDef) -> int:
    return sum(1 for p in fam.skills for c in fam.skills
               if p is not c and p.output and any(p.output in a.accepts for a in c.args))


# -- many families: splitting the five into K ----------------------------------------------------
_STOP = frozenset("a an the of to in on for from and or with by into as at is it its that this one two "
                  "each every their your my new text".split())


def _features(sk: SkillDef) -> frozenset[str]:
    """Words a skill is known by: name parts, description words, argument names, pools and types, and
    its output type (what decides whether chains are possible inside a group)."""
    words = set(sk.name.split("_")) | set(re.findall(r"[a-z]+", sk.desc.lower()))
    for a in sk.args:
        words |= set(a.name.split("_")) | {f"pool:{a.pool}", f"type:{a.type}"} | {f"in:{t}" for t in a.accepts}
    if sk.output:
        words |= {f"out:{sk.output}", f"in:{sk.output}"}  # a producer is close to its consumers
    return frozenset(words - _STOP)


def _similarity(a: SkillDef, b: SkillDef, fa: frozenset[str], fb: frozenset[str]) -> float:
    sim = len(fa & fb) / len(fa | fb)
    # A data-flow edge keeps producer and consumer together, so a finer family can still form chains.
    if (a.output and any(a.output in x.accepts for x in b.args)) or \
            (b.output and any(b.output in x.accepts for x in a.args)):
        sim += 0.5
    return sim


def _group(skills: Sequence[SkillDef], k: int) -> list[list[int]]:
    """Indices of ``skills`` in ``k`` groups of related skills (average-linkage agglomerative clustering
    on :func:`_similarity`), sizes kept near ``len(skills) / k`` so no group swallows the family."""
    n = len(skills)
    feats = [_features(s) for s in skills]
    sim = [[_similarity(skills[i], skills[j], feats[i], feats[j]) for j in range(n)] for i in range(n)]
    groups = [[i] for i in range(n)]
    cap = math.ceil(n / k)
    while len(groups) > k:
        best, best_pair = -1.0, None
        for x in range(len(groups)):
            for y in range(x + 1, len(groups)):
                if len(groups[x]) + len(groups[y]) > cap:
                    continue
                link = sum(sim[i][j] for i in groups[x] for j in groups[y]) / (len(groups[x]) * len(groups[y]))
                if link > best:  # strict: ties go to the earliest pair, so the split is deterministic
                    best, best_pair = link, (x, y)
        if best_pair is None:  # every merge would exceed the cap: allow one more skill per group
            cap += 1
            continue
        x, y = best_pair
        groups[x] = sorted(groups[x] + groups[y])
        del groups[y]
    return sorted(groups, key=lambda g: g[0])


def _apportion(k: int) -> list[int]:
    """How many finer families each built-in family gets: proportional to its skill count (largest
    remainder), at least one and at most one per skill."""
    sizes = [len(f.skills) for f in FAMILIES]
    quota = [k * n / MAX_FAMILIES for n in sizes]
    counts = [min(n, max(1, math.floor(q))) for n, q in zip(sizes, quota)]
    while sum(counts) < k:
        i = max((i for i in range(len(sizes)) if counts[i] < sizes[i]), key=lambda i: (quota[i] - counts[i], -i))
        counts[i] += 1
    while sum(counts) > k:
        i = min((i for i in range(len(sizes)) if counts[i] > 1), key=lambda i: (quota[i] - counts[i], i))
        counts[i] -= 1
    return counts


def check_family_count(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int):
        raise StreamError(f"the number of families must be an integer, got {k!r}")
    if k < MIN_FAMILIES:
        raise StreamError(f"families={k}: the built-in stream has {MIN_FAMILIES} families and the split only refines "
                          f"them (it never merges two); use {MIN_FAMILIES}..{MAX_FAMILIES}")
    if k > MAX_FAMILIES:
        raise StreamError(f"families={k}: the built-in catalog allows at most {MAX_FAMILIES} families, since it has "
                          f"{MAX_FAMILIES} skills and a family needs at least one; for more families use the "
                          f"synthetic generator (source 'synthetic', skillbank.data.synthetic)")


def split_families(k: int) -> tuple[FamilyDef, ...]:
    """The built-in families split into ``k`` finer families of related skills (``k = 5`` is the five).

    Each built-in family gets a share of ``k`` proportional to its skill count (:func:`_apportion`) and
    its skills are clustered into that many groups by shared words (names, descriptions, argument names,
    value pools) and data flow (:func:`_group`), so neighbouring families share vocabulary. The result
    depends on ``k`` only. Keys are ``<built-in key>-NN`` (``t1_daily_life-03``), titles say the part.
    """
    check_family_count(k)
    if k == MIN_FAMILIES:
        return FAMILIES
    out = []
    for parent, count in zip(FAMILIES, _apportion(k)):
        for n, group in enumerate(_group(parent.skills, count), start=1):
            skills = tuple(parent.skills[i] for i in group)
            names = ", ".join(s.name for s in skills[:3]) + (f" +{len(skills) - 3}" if len(skills) > 3 else "")
            key = f"{parent.key}-{n:02d}"
            out.append(FamilyDef(key, f"{parent.short}-{n:02d}", f"{parent.title} {n}/{count} ({names})", skills))
    return tuple(out)


def _parent_key(fam: FamilyDef) -> str:
    return fam.key.rsplit("-", 1)[0]


# -- sampling a plan (the graph before it is rendered) --------------------------------------------
@dataclass
class _Step:
    skill: SkillDef
    refs: dict[str, int]  # argument name -> index of the producer node
    after_prev: bool  # a sequential connective: link from the node just before


class _Planner:
    """Samples workflow plans over one family's skills.

    ``guided`` (finer and synthetic families): a chain only steps to skills from which the rest of the
    chain can still be completed, so a small family never runs into dead ends it cannot escape. The five
    built-in families sample unguided, as they always have (the stream must not change).
    """

    def __init__(self, fam: FamilyDef, *, daily: bool | None = None, guided: bool = False,
                 structures: Sequence[str] | None = None):
        self.fam = fam
        self.daily = fam.short == "t1" if daily is None else daily
        self.skills = fam.skills
        # Consumers of each producer in skill order (what a chain may step to), computed once: a thousand
        # synthetic families sample 60,000 plans.
        self._consumers = {p.name: [c for c in self.skills if self.slots(c, p)] for p in self.skills}
        self.guided = guided
        self.chain_max = self._longest_chain()
        self.dag_max = min(MAX_NODES, len(self.skills)) if len(self.skills) >= 2 else 0
        wanted = STRUCTURES if structures is None else tuple(structures)
        self.node_weights = {
            "chain": {n: w for n, w in NODE_COUNT_WEIGHTS["chain"].items() if n <= self.chain_max},
            "dag": {n: w for n, w in NODE_COUNT_WEIGHTS["dag"].items() if n <= self.dag_max},
        }
        self.structure_weights = {s: w for s, w in STRUCTURE_WEIGHTS.items()
                                  if s in wanted and (s == "single" or self.node_weights[s])}

    def formable(self) -> tuple[str, ...]:
        """The structures this family's skills can form at all."""
        return tuple(s for s in STRUCTURES if s == "single" or self.node_weights[s])

    def _longest_chain(self) -> int:
        """Nodes of the longest chain of distinct skills (at most MAX_NODES; 0 when none has two)."""
        if len(self.skills) < 2:
            return 0
        if self.daily:  # an order link may join any two daily-life tasks
            return min(MAX_NODES, len(self.skills))
        return max((self._depth(s, {s.name}, MAX_NODES) for s in self.skills), default=1) if \
            any(self.consumers(s, {s.name}) for s in self.skills) else 0

    def _depth(self, skill: SkillDef, used: set[str], limit: int) -> int:
        """Nodes of the longest data-flow path from ``skill`` avoiding ``used`` (``skill`` counted), up to
        ``limit``: stops searching once it is reached."""
        best = 1
        if limit <= 1:
            return best
        for c in self.consumers(skill, used):
            best = max(best, 1 + self._depth(c, used | {c.name}, limit - 1))
            if best >= limit:
                break
        return best

    def _can_finish(self, skill: SkillDef, used: set[str], need: int) -> bool:
        return need <= 1 or (self.daily and len(self.skills) - len(used) >= need - 1) or \
            self._depth(skill, used, need) >= need

    def slots(self, consumer: SkillDef, producer: SkillDef) -> list[str]:
        """Arguments of ``consumer`` that can take ``producer``'s output."""
        if not producer.output:
            return []
        return [a.name for a in consumer.args if producer.output in a.accepts]

    def consumers(self, producer: SkillDef, used: set[str]) -> list[SkillDef]:
        return [c for c in self._consumers[producer.name] if c.name not in used]

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
            if self.guided:
                starts = [s for s in starts if self._can_finish(s, {s.name}, n)]
            steps = [_Step(rng.choice(starts), {}, False)]
        used = {steps[0].skill.name}
        while len(steps) < n:
            prev = steps[-1].skill
            options = self.consumers(prev, used)
            if self.guided and not self.daily:
                options = [c for c in options if self._can_finish(c, used | {c.name}, n - len(steps))]
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


@dataclass(frozen=True)
class Phrasing:
    """What a generator renders with: value pools, the skill ids' source part, request wrappers and the
    context sentences that may open a request (the built-in ones, or the synthetic generator's own)."""

    pools: Mapping[str, Pool] = field(default_factory=lambda: POOLS)
    source: str = SOURCE
    contexts: tuple[str, ...] = CONTEXTS
    closers: tuple[str, ...] = CLOSERS
    wrappers: tuple[str, ...] = WRAPPERS


BUILTIN_PHRASING = Phrasing()


def _render(rng: random.Random, fam: FamilyDef, steps: list[_Step],
            phrasing: Phrasing = BUILTIN_PHRASING) -> tuple[str, TaskGraph, str]:
    """The request body and gold graph of a plan, and the first clause's template."""
    ids = [builtin_skill_id(fam, s.skill, phrasing.source) for s in steps]
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
                pool = phrasing.pools[a.pool]
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


def _wrap(rng: random.Random, body: str, first_template: str, n_nodes: int,
          phrasing: Phrasing = BUILTIN_PHRASING) -> str:
    wrappers = phrasing.wrappers
    if first_template.startswith("{"):  # never capitalise a value: it must stay verbatim
        wrappers = tuple(w for w in wrappers if "{S}" not in w)
    w = rng.choice(wrappers)
    request = w.replace("{s}", body).replace("{S}", body[:1].upper() + body[1:])
    if rng.random() < CONTEXT_P.get(n_nodes, 0.2):
        request = f"{rng.choice(phrasing.contexts)} {request}"
    if rng.random() < CLOSER_P.get(n_nodes, 0.1):
        request = f"{request} {rng.choice(phrasing.closers)}"
    return request


def _sample_record(rng: random.Random, fam: FamilyDef, planner: _Planner, phrasing: Phrasing = BUILTIN_PHRASING,
                   redrawn: Counter | None = None) -> tuple[str, TaskGraph, str]:
    weights = planner.structure_weights
    structure = rng.choices(list(weights), weights=list(weights.values()))[0]
    n = 1
    if structure != "single":
        counts = planner.node_weights[structure]
        n = rng.choices(list(counts), weights=list(counts.values()))[0]
    for _ in range(MAX_TRIES_PER_RECORD):
        steps = planner.plan(rng, structure, n)
        if steps is None:
            if redrawn is not None:
                redrawn["dead_end"] += 1
            continue
        body, graph, first = _render(rng, fam, steps, phrasing)
        if structure_of(graph) != structure:  # e.g. a DAG draw that came out as a chain
            if redrawn is not None:
                redrawn["other_structure"] += 1
            continue
        graph.validate()
        return _wrap(rng, body, first, n, phrasing), graph, structure
    raise RuntimeError(f"could not sample a {n}-node {structure} for {fam.key}")  # pragma: no cover


# -- the stream ---------------------------------------------------------------------------------
def check_sizes(train_per_family: int, test_per_family: int) -> None:
    if train_per_family < 0 or test_per_family < 0:
        raise StreamError(f"train_per_family and test_per_family must be >= 0, got {train_per_family} "
                         f"and {test_per_family}")


def check_structures(planners: Sequence[_Planner], structures: Sequence[str] | None) -> None:
    """Every family must be able to form every requested structure: said before any sampling."""
    if structures is None:
        return
    unknown = sorted(set(structures) - set(STRUCTURES))
    if unknown or not structures:
        raise StreamError(f"structures must be a non-empty subset of {list(STRUCTURES)}, got {list(structures)}")
    short = [(p, [s for s in structures if s not in p.formable()]) for p in planners]
    short = [(p, missing) for p, missing in short if missing]
    if short:
        shown = "; ".join(f"{p.fam.key} ({len(p.skills)} skill{'s' * (len(p.skills) != 1)}: "
                          f"{', '.join(s.name for s in p.skills[:3])}{' ...' if len(p.skills) > 3 else ''}) "
                          f"cannot form {' or '.join(m)}" for p, m in short[:5])
        more = f"; and {len(short) - 5} more" if len(short) > 5 else ""
        raise StreamError(f"{len(short)} of {len(planners)} families have too few skills for the requested "
                          f"structures {list(structures)}: {shown}{more}. A chain or DAG needs two skills of the "
                          f"family (a chain outside daily life also needs one skill's output to feed another); "
                          f"ask for fewer families or fewer structures (e.g. single only)")


def sample_families(fam_defs: Sequence[FamilyDef], planners: Sequence[_Planner], *, rng_prefix: str,
                    id_prefix: str, seed: int, train_per_family: int, test_per_family: int,
                    phrasing: Phrasing = BUILTIN_PHRASING, redrawn: dict[str, Counter] | None = None,
                    ) -> tuple[dict[str, list[Record]], dict[str, list[Record]]]:
    """Train and held-out records of every family; no request text occurs twice in the stream. Record ids
    are ``<id_prefix>-<family short>-<6 digits>``, training first; each family and split has its own RNG."""
    seen: set[str] = set()
    train: dict[str, list[Record]] = {}
    test: dict[str, list[Record]] = {}
    for fam, planner in zip(fam_defs, planners):
        counter = redrawn.setdefault(fam.key, Counter()) if redrawn is not None else None
        splits = {}
        for split, size, offset in (("train", train_per_family, 0), ("test", test_per_family, train_per_family)):
            rng = random.Random(f"{rng_prefix}:{seed}:{fam.key}:{split}")
            records = []
            misses = 0
            while len(records) < size:
                request, graph, structure = _sample_record(rng, fam, planner, phrasing, counter)
                if request in seen:
                    misses += 1
                    if misses > 50 * max(size, 1):  # pragma: no cover - pools are far larger than this
                        raise StreamError(f"{fam.key}: value pools too small for {size} distinct {split} requests")
                    continue
                seen.add(request)
                rid = f"{id_prefix}-{fam.short}-{offset + len(records):06d}"
                records.append(Record(rid, fam.key, request, graph, structure))
            splits[split] = records
        train[fam.key], test[fam.key] = splits["train"], splits["test"]
    return train, test


def build_builtin_stream(*, seed: int = 0, train_per_family: int = 1000, test_per_family: int = 300,
                         families: int = MIN_FAMILIES, structures: Sequence[str] | None = None) -> Stream:
    """Generate the built-in benchmark stream (name ``builtin``), deterministically from ``seed``.

    Every family gets ``train_per_family`` training and ``test_per_family`` held-out records; no
    request text occurs twice in the stream (so held-out requests never occur in training). Record
    ids are ``builtin-<t>-<6 digits>``, training first. Takes about a second for the default sizes.

    ``families`` (5..100) splits the five families into that many finer ones (:func:`split_families`;
    stream name ``builtin-k<K>``). ``structures`` (a subset of single/chain/dag): only these are drawn,
    and every family must be able to form each of them, else a :class:`StreamError` before any sampling;
    None (the default) draws every structure each family can form and reports what it could not.
    """
    check_sizes(train_per_family, test_per_family)
    fam_defs = split_families(families)
    split = families != MIN_FAMILIES
    planners = [_Planner(f, daily=_parent_key(f) == "t1_daily_life" if split else None, guided=split,
                         structures=structures) for f in fam_defs]
    check_structures(planners, structures)
    catalog = catalog_of(fam_defs)
    redrawn: dict[str, Counter] = {}
    train, test = sample_families(fam_defs, planners, rng_prefix="skillbank-builtin", id_prefix="builtin", seed=seed,
                                  train_per_family=train_per_family, test_per_family=test_per_family,
                                  redrawn=redrawn if split else None)
    families_report = {}
    for fam, planner in zip(fam_defs, planners):
        families_report[fam.key] = {
            "title": fam.title, "skills": len(fam.skills), "tool_graph_edges": data_flow_edges(fam),
            **{name: split_report(recs[fam.key]) for name, recs in (("train", train), ("test", test))},
        }
        if split:
            families_report[fam.key].update(family_split_report(planner, redrawn[fam.key], parent=_parent_key(fam)))
    report = {
        "generator": "skillbank.data.builtin", "version": GENERATOR_VERSION, "seed": seed,
        "train_per_family": train_per_family, "test_per_family": test_per_family,
        "structure_weights": STRUCTURE_WEIGHTS,
        "node_count_weights": {k: {str(n): w for n, w in v.items()} for k, v in NODE_COUNT_WEIGHTS.items()},
        "families": families_report,
    }
    if not split:  # the five families' stream stays byte-identical to what it always was
        if structures is not None:
            report["structures_requested"] = list(structures)
        return Stream("builtin", catalog, train, test, source="skillbank-builtin", seed=seed, report=report)
    report["split"] = {
        "families": families, "from": [f.key for f in FAMILIES], "per_builtin_family": dict(zip(
            (f.key for f in FAMILIES), _apportion(families))),
        "grouping": "each built-in family's skills clustered by shared words (names, descriptions, argument "
                    "names, value pools) and data flow, sizes balanced",
        "cross_family_requests": "regenerated: every family samples from its own skills only, none dropped",
        "structures_requested": list(structures) if structures is not None else "every structure a family can form",
        **split_totals(planners, redrawn),
    }
    return Stream(f"builtin-k{families}", catalog, train, test, source="skillbank-builtin", seed=seed, report=report)


def family_split_report(planner: _Planner, redrawn: Counter, **extra: str) -> dict:
    """What a family of a split or synthetic stream could not form, and how many plans were redrawn."""
    return {**extra, "structures_formable": list(planner.formable()),
            "max_nodes": {"chain": planner.chain_max, "dag": planner.dag_max},
            "redrawn_plans": {"dead_end": redrawn.get("dead_end", 0),
                              "other_structure": redrawn.get("other_structure", 0)}}


def split_totals(planners: Sequence[_Planner], redrawn: Mapping[str, Counter]) -> dict:
    return {
        "families_without": {s: sum(1 for p in planners if s not in p.formable()) for s in ("chain", "dag")},
        "families_short_of_5_nodes": {"chain": sum(1 for p in planners if p.chain_max < MAX_NODES),
                                      "dag": sum(1 for p in planners if p.dag_max < MAX_NODES)},
        "redrawn_plans": sum(sum(c.values()) for c in redrawn.values()),
    }


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
