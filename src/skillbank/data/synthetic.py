"""A procedural, **synthetic** catalog and stream generator for many families (up to 1,050).

It exists to exercise mechanics and routing at a scale no hand-written catalog reaches (hundreds to a
thousand shards); its skills are invented, so a number measured on it says how the machinery scales,
not how well an agent does real work. Everything it produces says so: the stream is named
``synthetic-k<K>``, its source is ``skillbank-synthetic (procedural)``, every family title starts with
``Synthetic:`` and skill ids with ``Synthetic::``.

How a catalog is composed (word lists below, deterministic by ``seed``, no network):

* A family is a (domain, area) pair - ``syn0042_north_harbor`` is the north area of a harbor; domains
  have their own objects ("vessel", "berth", "cargo", ...). Families of one domain share its objects and
  value pools, families of one area share the area word, so neighbouring families share vocabulary.
* A skill is a verb and one of its domain's objects (``inspect_vessel``); within a domain no two
  families share a (verb, object) pair, so every skill is learnable and its family is well defined.
* Arguments come from typed kinds (a date, a reference code, a count, a person, a site, a level, a
  note in quotes) with their own value pools; a skill may also take an earlier skill's output (its
  ``report``, ``list``, ... argument), which is what chains and DAGs are made of.
* Requests are sampled and rendered exactly as the built-in benchmark's (:mod:`skillbank.data.builtin`:
  single / chain / DAG structures, values copied verbatim, references "it" / "the vessel log"), so the
  records and the stream directory have the same format.
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from skillbank.data.builtin import (FAMILY_KEY, NODE_COUNT_WEIGHTS, STRUCTURE_WEIGHTS, Phrasing, _Planner,
                                    catalog_of, check_sizes, check_structures, data_flow_edges, family_split_report,
                                    sample_families, split_report, split_totals)
from skillbank.data.builtin_catalog import ArgDef, FamilyDef, Pool, SkillDef
from skillbank.data.stream import Stream
from skillbank.errors import StreamError

SOURCE = "Synthetic"
GENERATOR_VERSION = 1

# -- word lists -----------------------------------------------------------------------------------
# Each domain: its objects (one word each; skill names are verb_object).
DOMAINS: dict[str, tuple[str, ...]] = {
    "garden": ("seedbed", "hedge", "compost", "greenhouse", "sprinkler", "orchard"),
    "fleet": ("truck", "route", "driver", "depot", "trailer", "tyre"),
    "clinic": ("patient", "appointment", "prescription", "ward", "referral", "vaccine"),
    "library": ("book", "loan", "shelf", "reader", "archive", "periodical"),
    "kitchen": ("recipe", "pantry", "oven", "menu", "supplier", "allergen"),
    "studio": ("track", "mix", "session", "microphone", "sample", "playlist"),
    "warehouse": ("pallet", "shipment", "bin", "forklift", "inventory", "dock"),
    "school": ("lesson", "pupil", "grade", "timetable", "classroom", "exam"),
    "farm": ("herd", "field", "harvest", "tractor", "silo", "barn"),
    "hotel": ("room", "guest", "booking", "minibar", "laundry", "lobby"),
    "airport": ("gate", "baggage", "runway", "crew", "lounge", "checkin"),
    "museum": ("exhibit", "gallery", "artifact", "tour", "visitor", "catalogue"),
    "lab": ("specimen", "assay", "reagent", "instrument", "protocol", "batch"),
    "theater": ("show", "seat", "rehearsal", "script", "stage", "costume"),
    "gym": ("member", "class", "locker", "trainer", "workout", "treadmill"),
    "harbor": ("vessel", "berth", "cargo", "pilot", "crane", "tide"),
    "factory": ("machine", "shift", "part", "assembly", "conveyor", "defect"),
    "council": ("permit", "street", "parking", "park", "streetlight", "complaint"),
    "grid": ("meter", "panel", "battery", "substation", "tariff", "outage"),
    "forest": ("trail", "ranger", "campsite", "firebreak", "tree", "cabin"),
    "store": ("product", "basket", "coupon", "receipt", "aisle", "customer"),
    "newsroom": ("story", "editor", "headline", "source", "column", "photo"),
    "courier": ("parcel", "van", "label", "pickup", "locker", "manifest"),
    "vet": ("pet", "kennel", "diet", "owner", "checkup", "microchip"),
    "zoo": ("enclosure", "keeper", "feeding", "animal", "habitat", "aviary"),
    "railway": ("train", "platform", "carriage", "signal", "timetable", "ticket"),
    "bakery": ("dough", "loaf", "proofer", "order", "flour", "pastry"),
    "winery": ("barrel", "vineyard", "bottle", "tasting", "cellar", "cork"),
    "observatory": ("telescope", "star", "exposure", "dome", "mirror", "comet"),
    "pharmacy": ("refill", "stock", "dosage", "label", "counter", "supplier"),
    "insurer": ("policy", "claim", "adjuster", "premium", "payout", "quote"),
    "realty": ("listing", "viewing", "tenant", "lease", "property", "offer"),
    "stadium": ("match", "turnstile", "vendor", "pitch", "broadcast", "steward"),
    "ferry": ("crossing", "deck", "vehicle", "captain", "manifest", "lifeboat"),
    "datacenter": ("server", "rack", "backup", "cable", "cooling", "firewall"),
}
# Each area: the word that distinguishes families of one domain (and joins families of one area).
AREAS = ("north", "south", "east", "west", "central", "coastal", "alpine", "urban", "rural", "harbourside",
         "downtown", "uptown", "riverside", "hillside", "lakeside", "airside", "night", "weekend", "premium",
         "budget", "junior", "senior", "express", "legacy", "pilot", "regional", "mobile", "annex", "summit",
         "valley")
VERBS = ("inspect", "schedule", "cancel", "update", "audit", "register", "archive", "restock", "count",
         "assign", "approve", "review", "reserve", "track", "flag", "clean", "repair", "price", "tag",
         "forecast", "measure", "export", "verify", "rotate", "photograph", "insure", "close", "open",
         "relocate", "sort", "compare", "rank", "locate", "monitor", "survey", "certify", "refund", "stage",
         "dispatch", "catalog")
# Output kinds: what a skill's result is called ("the vessel log") and the argument that takes it.
OUTPUTS = ("report", "list", "log", "plan", "estimate", "summary")
MAX_FAMILIES = len(DOMAINS) * len(AREAS)

NAMES = ("Ailsa Bram Cato Dessa Emrys Fenna Gideon Hollis Ines Joro Kestrel Liora Mabon Nerys Orrin Pella "
         "Quill Rowan Saffi Teodor Ulla Vesper Wren Xanthe Yorick Zelda Arlo Brina Corin Dagny").split()
SITES = ("Bay", "Dock", "Hall", "Wing", "Yard", "Block", "Gate", "Unit", "Zone", "Pier")
LEVELS = ("low", "medium", "high", "urgent", "routine", "critical")
NOTE_WORDS = ("check the seals before noon|keep the east door closed|call ahead if it is late|"
              "use the spare key from the office|leave a copy at the front desk|mark anything damaged in red|"
              "ask for a signature on arrival|the lift is out of order today|bring the blue folder|"
              "count twice before signing|photos are needed for the file|the supervisor wants an update|"
              "only the morning crew is available|double check the totals|skip the usual inspection step|"
              "the old readings were wrong|send the invoice separately|label everything clearly").split("|")
CONTEXTS = ("I'm covering for a colleague today.", "The audit is due at the end of the week.",
            "We are short on staff this morning.", "The new system went live yesterday.",
            "I'm working through the backlog.", "The inspector is coming on Thursday.",
            "Our manager asked for this first thing.", "We had a busy weekend.",
            "I'm setting up the new site.", "The numbers looked off last month.")
CLOSERS = ("Thanks!", "Thank you.", "No rush.", "Much appreciated.", "It's for the audit.")
WRAPPERS = ("Please {s}.", "Could you {s}?", "Can you {s}?", "I need you to {s}.", "{S}.", "{S}, please.",
            "Go ahead and {s}.", "When you get a chance, {s}.", "I'd like you to {s}.")


def _date(rng: random.Random) -> str:
    return f"20{rng.randint(30, 39)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _code(rng: random.Random) -> str:
    letters = "ABCDEFGHJKLMNPRSTUVWXYZ"
    return f"{rng.choice(letters)}{rng.choice(letters)}-{rng.randint(100, 9999)}"


def _site(rng: random.Random) -> str:
    return f"{rng.choice(SITES)} {rng.randint(1, 40)}"


def _count(rng: random.Random) -> str:
    return str(rng.randint(2, 500))


# An argument kind: pool, catalog type, description and the phrases that carry it in a clause.
@dataclass(frozen=True)
class _Kind:
    names: tuple[str, ...]  # argument names this kind may take (one per skill)
    type: str
    desc: str
    phrases: tuple[str, ...]  # "{x}" is the slot


KINDS: dict[str, _Kind] = {
    "date": _Kind(("date", "deadline", "start_date"), "date", "When", ("on {x}", "for {x}", "by {x}")),
    "code": _Kind(("ref_code", "ticket_id", "batch_code"), "string", "A reference code",
                  ("under reference {x}", "with code {x}", "tagged {x}")),
    "count": _Kind(("quantity", "units", "amount"), "number", "How many", ("for {x} units", "in a batch of {x}")),
    "person": _Kind(("owner", "assignee", "contact"), "string", "Who is responsible",
                    ("for {x}", "assigned to {x}", "on behalf of {x}")),
    "site": _Kind(("site", "location", "bay"), "string", "Where", ("at {x}", "in {x}")),
    "level": _Kind(("priority", "level", "severity"), "string", "How urgent", ("with {x} priority", "marked {x}")),
    "note": _Kind(("note", "comment", "instructions"), "string", "Free text to attach",
                  ("with the note {x}", "adding {x}")),
}
POOLS: dict[str, Pool] = {
    "date": Pool(make=_date), "code": Pool(make=_code), "count": Pool(make=_count),
    "person": Pool(values=tuple(NAMES)), "site": Pool(make=_site), "level": Pool(values=LEVELS),
    "note": Pool(values=tuple(NOTE_WORDS), quote=True),
    **{f"file_{o}": Pool(make=(lambda o: lambda rng: f"{o}_{rng.randint(1, 999)}.csv")(o)) for o in OUTPUTS},
}
PHRASING = Phrasing(pools=POOLS, source=SOURCE, contexts=CONTEXTS, closers=CLOSERS, wrappers=WRAPPERS)
SKILLS_PER_FAMILY = (3, 8)  # inclusive range; capped so one domain's families never share a skill


def check_family_count(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int):
        raise StreamError(f"the number of families must be an integer, got {k!r}")
    if not 1 <= k <= MAX_FAMILIES:
        raise StreamError(f"families={k}: the synthetic generator makes 1..{MAX_FAMILIES} families "
                          f"({len(DOMAINS)} domains x {len(AREAS)} areas, each pair one family)")


# -- the catalog ----------------------------------------------------------------------------------
def synthetic_families(k: int, seed: int = 0) -> tuple[FamilyDef, ...]:
    """``k`` synthetic family definitions, deterministic by ``seed``.

    Family i is area ``i // D`` of domain ``i % D`` (D domains in a seeded order), so the first D
    families cover every domain once and later ones add areas; skills are dealt from a seeded shuffle of
    the domain's verb x object pairs, so no two families of a domain share one.
    """
    check_family_count(k)
    rng = random.Random(f"skillbank-synthetic:{seed}:catalog")
    domains = list(DOMAINS)
    rng.shuffle(domains)
    areas = list(AREAS)
    rng.shuffle(areas)
    per_domain = Counter(domains[i % len(domains)] for i in range(k))
    decks = {}
    for d in domains:
        pairs = [(v, o) for o in DOMAINS[d] for v in VERBS]
        rng.shuffle(pairs)
        decks[d] = pairs
    out = []
    for i in range(k):
        domain, area = domains[i % len(domains)], areas[i // len(domains)]
        most = min(SKILLS_PER_FAMILY[1], len(DOMAINS[domain]) * len(VERBS) // per_domain[domain])
        n = rng.randint(min(SKILLS_PER_FAMILY[0], most), most)
        pairs, decks[domain] = decks[domain][:n], decks[domain][n:]
        key = f"syn{i:04d}_{area}_{domain}"
        if not FAMILY_KEY.fullmatch(key):  # pragma: no cover - the word lists are checked by the tests
            raise StreamError(f"synthetic family key {key!r} is not a valid family name")
        skills = _skills(rng, area, domain, pairs)
        title = f"Synthetic: {area} {domain} ({', '.join(s.name for s in skills[:3])}{' ...' if n > 3 else ''})"
        out.append(FamilyDef(key, f"{i:04d}", title, skills))
    return tuple(out)


def _skills(rng: random.Random, area: str, domain: str, pairs: list[tuple[str, str]]) -> tuple[SkillDef, ...]:
    """One family's skills: each a verb and an object, 1-3 typed arguments, perhaps an output, and
    perhaps an argument that takes an earlier skill's output (so chains can form)."""
    produced: list[str] = []  # output kinds made by skills so far
    nouns: set[str] = set()
    skills = []
    for verb, obj in pairs:
        kinds = rng.sample(list(KINDS), rng.randint(1, 2 if rng.random() < 0.6 else 3))
        args, phrases = [], []
        for kind in kinds:
            spec = KINDS[kind]
            args.append(ArgDef(rng.choice(spec.names), spec.type, f"{spec.desc}.", kind))
            phrases.append(spec.phrases)
        # A consumer of an earlier output (or of a file given by name): what chains and DAGs are made of.
        if produced and rng.random() < 0.7:
            kind = rng.choice(produced)
            args.insert(0, ArgDef(kind, "string", f"The {kind} to work from (or one made by an earlier step).",
                                  f"file_{kind}", accepts=(kind,)))
            phrases.insert(0, ("from {x}", "using {x}", "based on {x}"))
        output, noun = None, ""
        if rng.random() < 0.75:
            free = [o for o in OUTPUTS if f"the {obj} {o}" not in nouns]
            if free:
                output = rng.choice(free)
                noun = f"the {obj} {output}"
                nouns.add(noun)
                produced.append(output)
        templates = []
        for t, lead in enumerate((f"{verb} the {obj}", f"{verb} the {area} {obj}", f"{verb} the {domain} {obj}")):
            order = list(range(len(args)))
            if t:
                rng.shuffle(order)
            slots = " ".join(rng.choice(phrases[j]).replace("{x}", "{" + args[j].name + "}") for j in order)
            templates.append(f"{lead} {slots}")
        desc = (f"{verb.capitalize()} a {obj} of the {area} {domain} (synthetic skill)." +
                (f" Output: {noun[4:]}." if output else ""))
        skills.append(SkillDef(f"{verb}_{obj}", desc, tuple(args), tuple(templates), output, noun))
    return tuple(skills)


def build_synthetic_catalog(families: int, seed: int = 0):
    return catalog_of(synthetic_families(families, seed), SOURCE)


# -- the stream -----------------------------------------------------------------------------------
def build_synthetic_stream(families: int, *, seed: int = 0, train_per_family: int = 50, test_per_family: int = 10,
                           structures: Sequence[str] | None = None) -> Stream:
    """A synthetic stream of ``families`` families (name ``synthetic-k<K>``), deterministic by ``seed``.

    Same format as the built-in stream: per-family train/test records with gold graphs, single /
    chain / DAG structures (``structures`` as in :func:`skillbank.data.builtin.build_builtin_stream`),
    no request text twice. Record ids are ``synthetic-<NNNN>-<6 digits>``.
    """
    check_sizes(train_per_family, test_per_family)
    fam_defs = synthetic_families(families, seed)
    # A "then" always comes with a reference here (no order-only links), as in the built-in media families.
    planners = [_Planner(f, daily=False, guided=True, structures=structures) for f in fam_defs]
    check_structures(planners, structures)
    catalog = catalog_of(fam_defs, SOURCE)
    redrawn: dict[str, Counter] = {}
    train, test = sample_families(fam_defs, planners, rng_prefix="skillbank-synthetic", id_prefix="synthetic",
                                  seed=seed, train_per_family=train_per_family, test_per_family=test_per_family,
                                  phrasing=PHRASING, redrawn=redrawn)
    families_report = {
        fam.key: {"title": fam.title, "skills": len(fam.skills), "tool_graph_edges": data_flow_edges(fam),
                  "train": split_report(train[fam.key]), "test": split_report(test[fam.key]),
                  **family_split_report(planner, redrawn[fam.key])}
        for fam, planner in zip(fam_defs, planners)
    }
    report = {
        "generator": "skillbank.data.synthetic", "version": GENERATOR_VERSION, "synthetic": True,
        "note": "procedurally generated skills and requests, for mechanics and routing at scale; not real tools",
        "seed": seed, "families_requested": families, "train_per_family": train_per_family,
        "test_per_family": test_per_family, "structure_weights": STRUCTURE_WEIGHTS,
        "node_count_weights": {k: {str(n): w for n, w in v.items()} for k, v in NODE_COUNT_WEIGHTS.items()},
        "structures_requested": list(structures) if structures is not None else "every structure a family can form",
        **split_totals(planners, redrawn),
        "families": families_report,
    }
    return Stream(f"synthetic-k{families}", catalog, train, test, source="skillbank-synthetic (procedural)",
                  seed=seed, report=report)

