"""Negative examples: requests a family must refuse, given by its owner or synthesized from its catalog.

A negative is a record whose graph is ``null``::

    {"id": "he-neg-001", "family": "home_energy", "request": "Cancel the dishwasher I scheduled for 2 am.",
     "graph": null, "kind": "near_miss_action"}

It can sit in the family's records file beside its positive records, or in a file of its own given with
``--negatives``. ``kind`` says why no skill serves it (what ``explain`` names when a request is refused
for looking like one):

- ``near_miss_action``: the family's own objects, an action none of its skills performs ("cancel the
  dishwasher start", "pay the gas bill");
- ``near_miss_object``: an action the family performs, on something no skill handles ("set the oven to
  200 degrees" for a thermostat family);
- ``domain_question``: a question about the domain rather than a request to act ("is it cheaper to run
  the dryer at night?");
- ``other_domain``: another service's request ("book a table for two").

When a family has few or none, :func:`synthesize_negatives` writes them deterministically from what its
catalog says it does: common actions that no skill's name or description mentions, applied to the
family's objects; the family's own actions applied to objects its catalog and records never mention;
questions about its objects; and other services' requests from the shipped outlier corpus. A synthesized
negative is kept only where no skill's words cover its action, so a family that *can* cancel is never
taught to refuse "cancel". ``skillbank scope negatives BANK FAMILY`` lists what a family was given and
synthesized.

Negatives are statistics for the scope gate (:mod:`skillbank.memory.scope`), never training targets of
another family, and the bank keeps no request.
"""
from __future__ import annotations

import random
import re
import zlib
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Sequence

from skillbank.errors import RecordError

KINDS = ("near_miss_action", "near_miss_object", "domain_question", "other_domain")
#: What a negative without a "kind" is taken for.
DEFAULT_KIND = "near_miss_action"


@dataclass(frozen=True)
class Negative:
    id: str
    family: str
    request: str
    kind: str = DEFAULT_KIND
    source: str = "given"  # "given" (the family's owner wrote it) or "synthesized"

    def to_dict(self) -> dict:
        return {"id": self.id, "family": self.family, "request": self.request, "graph": None, "kind": self.kind,
                **({"source": self.source} if self.source != "given" else {})}

    @classmethod
    def from_dict(cls, obj: Any) -> "Negative":
        """Validate and build; raises :class:`RecordError` (without location) on bad input."""
        rid, family, request = request_fields(obj, "negative")
        if obj.get("graph") is not None:
            raise RecordError(f"negative {rid}: a negative has \"graph\": null (this one has a graph; a request "
                              "with a graph is a training record: put it in the records file)")
        kind = obj.get("kind", DEFAULT_KIND)
        if kind not in KINDS:
            raise RecordError(f"negative {rid}: unknown kind {kind!r} (one of {', '.join(KINDS)})")
        source = obj.get("source", "given")
        if source not in ("given", "synthesized"):
            raise RecordError(f"negative {rid}: source must be 'given' or 'synthesized', got {source!r}")
        return cls(str(rid), family.strip(), request.strip(), kind, source)


def request_fields(obj: Any, what: str, extra: Sequence[str] = ()) -> tuple[str | int, str, str]:
    """(id, family, request) of a JSONL line of a records or negatives file, checked (``what``: "record" or
    "negative", for the messages; ``extra``: more fields that must be present); :class:`RecordError` without
    location on bad input."""
    if not isinstance(obj, dict):
        raise RecordError(f"expected a JSON object, got {type(obj).__name__}")
    for key in ("id", "family", "request", *extra):
        if key not in obj:
            raise RecordError(f"missing field {key!r}")
    rid, family, request = obj["id"], obj["family"], obj["request"]
    if not isinstance(rid, (str, int)) or str(rid).strip() == "":
        raise RecordError(f"'id' must be a non-empty string, got {rid!r}")
    if not isinstance(family, str) or not family.strip():
        raise RecordError(f"{what} {rid}: 'family' must be a non-empty string, got {family!r}")
    if not isinstance(request, str) or not request.strip():
        raise RecordError(f"{what} {rid}: empty request")
    return rid, family, request


def is_negative(obj: Any) -> bool:
    """Whether a decoded JSONL line is a negative (an object with ``"graph": null``)."""
    return isinstance(obj, dict) and "graph" in obj and obj["graph"] is None


def normalized(request: str) -> str:
    """A request as two people typing it differently would still agree on (case, spacing, final stop)."""
    return " ".join(re.findall(r"\w+", request.casefold()))


def read_negatives(path: str | Path, *, family: str | None = None) -> list[Negative]:
    """A ``--negatives`` file: every line a negative (``"graph": null``, or no graph); every bad line named at once.
    A file's lines are the user's, so they count as given whatever their ``source`` says (a list printed by
    ``scope negatives --json``, edited and handed back, is kept as it is)."""
    from skillbank.data.records import iter_jsonl
    path = Path(path)
    out, errors, seen = [], [], {}
    for lineno, obj in iter_jsonl(path, errors="yield"):
        if isinstance(obj, RecordError):
            errors.append(obj)
            continue
        try:
            neg = replace(Negative.from_dict(obj), source="given")  # a line without "graph" is a negative too
        except RecordError as exc:
            errors.append(RecordError(exc.reason, path, lineno))
            continue
        if family is not None and neg.family != family:
            errors.append(RecordError(f"negative {neg.id}: family {neg.family!r}, expected {family!r}", path, lineno))
        elif neg.id in seen:
            errors.append(RecordError(f"duplicate negative id {neg.id!r} (first on line {seen[neg.id]})", path, lineno))
        else:
            seen[neg.id] = lineno
            out.append(neg)
    if errors:
        shown = "\n  ".join(str(e) for e in errors[:20])
        raise RecordError(f"{path}: {len(errors)} bad line(s):\n  {shown}")
    if not out:
        raise RecordError("no negatives in the file", path)
    return out


# -- synthesis -------------------------------------------------------------------------------------
# Common actions people ask assistants for, each with the words that, found in a skill's name or description,
# mean some skill may perform it (then it is never synthesized as a near miss).
ACTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("cancel", ("cancel", "cancellation", "abort")),
    ("delete", ("delete", "remove", "erase", "clear")),
    ("undo", ("undo", "revert", "restore", "rollback")),
    ("pay for", ("pay", "payment", "bill", "purchase")),
    ("buy", ("buy", "purchase", "order", "shop")),
    ("sell", ("sell", "sale", "list")),
    ("turn off", ("off", "stop", "disable", "switch", "turn", "power")),
    ("stop", ("stop", "halt", "end", "off")),
    ("pause", ("pause", "suspend", "hold")),
    ("refund", ("refund", "reimburse", "return")),
    ("rename", ("rename", "name")),
    ("share", ("share", "send", "post", "publish")),
    ("print", ("print",)),
    ("repair", ("repair", "fix", "service")),
    ("reset", ("reset", "restart", "reboot", "restore")),
    ("uninstall", ("uninstall", "install", "software")),
    ("unsubscribe from", ("unsubscribe", "subscribe", "subscription")),
    ("move", ("move", "reschedule", "transfer", "relocate")),
    ("rate", ("rate", "rating", "review", "score", "grade")),
    ("lock", ("lock", "secure")),
    ("export", ("export", "download", "save")),
    ("archive", ("archive",)),
    ("forward", ("forward", "send")),
    ("complain about", ("complain", "complaint", "feedback", "report")),
    ("insure", ("insure", "insurance")),
    ("clean", ("clean", "wash", "chore")),
    ("track", ("track", "status", "where")),
)
# Things outside most catalogs, for the family's actions applied to what it does not handle.
FOREIGN_OBJECTS = ("the car's oil", "my dog", "the garden hose", "my passport photo", "the office printer",
                   "my gym membership", "the fridge door", "my library card", "the neighbour's wifi",
                   "my tax return", "the bathroom mirror", "my bicycle", "the microwave clock", "my cat's food",
                   "the kids' homework", "my dentist appointment", "the city's bus schedule", "my phone case")
ACTION_TEMPLATES = ("{verb} the {obj}", "can you {verb} my {obj}?", "please {verb} the {obj} for me",
                    "I need you to {verb} the {obj} now", "{verb} {obj} asap")
OBJECT_TEMPLATES = ("{verb} {obj}", "can you {verb} {obj} please", "I want you to {verb} {obj}")
QUESTION_TEMPLATES = ("how does a {obj} work?", "what is a good {obj} to buy?", "why is my {obj} so noisy?",
                      "is it worth getting a new {obj}?", "who invented the {obj}?", "tell me some facts about {obj}s")
# Words of skill names that say what a skill does rather than what it acts on.
_VERB_WORDS = frozenset(("get set add send make create read write list search find check book rent call play take "
                         "join apply see buy sell pay file order ship post borrow print schedule manage start run "
                         "update show query fetch generate edit change detect classify extract compare suggest "
                         "answer recognize download upload convert translate transcribe summarize analyze ask "
                         "estimate segment colorize stitch caption upscale transfer stabilize sync remove expand "
                         "spin denoise splice correct paraphrase simplify consult enroll trade").split())
_ACTION_WORDS = frozenset(w for verb, cover in ACTIONS for w in (*verb.split(), *cover))
_STOP = frozenset(("the a an and or of for to in on at by with from into my your its their this that is are be "
                   "it as via per all any one two more most some other output text info id").split())
_WORDS = re.compile(r"[a-z][a-z]+")


def _words(text: str) -> list[str]:
    return _WORDS.findall(re.sub(r"([a-z])([A-Z])", r"\1 \2", text).replace("_", " ").lower())


def _name_words(spec: dict) -> list[str]:
    """The words of a skill's name ("set_thermostat": set, thermostat)."""
    return _words(str(spec.get("name") or spec.get("id", "")))


def covered(action_words: Sequence[str], catalog_words: set[str]) -> bool:
    """Whether some skill's words mention the action (a word, or a word starting with its first five letters:
    "cancel" covers "cancellation", "pay" covers "payment")."""
    for w in action_words:
        if w in catalog_words or (len(w) >= 5 and any(c.startswith(w[:5]) for c in catalog_words)):
            return True
    return False


def catalog_words(specs: Sequence[dict]) -> set[str]:
    """Every word of the family's skill names, descriptions and argument names and descriptions."""
    out: set[str] = set()
    for s in specs:
        out.update(_name_words(s))
        out.update(_words(str(s.get("description", ""))))
        for a in s.get("arguments", ()):
            out.update(_words(str(a.get("name", ""))))
            out.update(_words(str(a.get("description", ""))))
    return out


def family_objects(specs: Sequence[dict], requests: Sequence[str], values: Sequence[Sequence[str]] = (),
                   limit: int = 12) -> list[str]:
    """What the family acts on, most telling first: nouns of its skill names ("thermostat" of set_thermostat),
    then short values its records use more than once ("dishwasher"), then the words its requests use far more
    than English does."""
    from wordfreq import word_frequency
    found: Counter = Counter()
    for s in specs:
        for w in _name_words(s):
            if w not in _VERB_WORDS and w not in _ACTION_WORDS and w not in _STOP and len(w) > 2:
                found[w] += 100
    value_counts = Counter(v.strip().lower() for vs in values for v in vs
                           if isinstance(v, str) and 1 <= len(_words(v)) <= 2 and _words(v) == v.strip().lower().split())
    for v, n in value_counts.items():
        if n >= 2:
            found[v] += 10 * n
    tokens = Counter(w for r in requests for w in _words(r)
                     if w not in _STOP and w not in _VERB_WORDS and w not in _ACTION_WORDS and len(w) > 3)
    for w, n in tokens.items():
        if n >= 2 and word_frequency(w, "en") < 2e-5:  # rare in English, frequent here: the domain's own nouns
            found[w] += n
    return [w for w, _ in found.most_common(limit)]


def synthesize_negatives(family: str, specs: Sequence[dict], requests: Sequence[str],
                         values: Sequence[Sequence[str]] = (), *, per_kind: int = 24,
                         other_domain: Sequence[str] = ()) -> list[Negative]:
    """Negatives written from the family's catalog and records (deterministic: seeded by the family name).

    specs: the family's skill specs (name, description, arguments); requests and values: its training requests and
    their gold values (what it acts on); other_domain: other services' requests to draw from (the shipped outlier
    corpus's tool requests, by default of the caller). At most ``per_kind`` of each kind; a near miss whose action
    some skill's words cover is never made, and none repeats one of ``requests``."""
    rng = random.Random(zlib.crc32(f"negatives:{family}".encode()))
    words = catalog_words(specs)
    objects = family_objects(specs, requests, values)
    seen = {normalized(r) for r in requests}
    out: list[Negative] = []

    def add(kind: str, text: str) -> None:
        key = normalized(text)
        if key and key not in seen:
            seen.add(key)
            out.append(Negative(f"synth-{family}-{kind}-{sum(n.kind == kind for n in out) + 1:03d}", family, text,
                                kind, "synthesized"))

    missing = [verb for verb, cover in ACTIONS if not covered(cover, words) and not covered(_words(verb), words)]
    pairs = [(v, o) for v in missing for o in objects]
    rng.shuffle(pairs)
    for i, (verb, obj) in enumerate(pairs[:per_kind]):
        add("near_miss_action", ACTION_TEMPLATES[i % len(ACTION_TEMPLATES)].format(verb=verb, obj=obj))
    own_verbs = sorted({w for s in specs for w in _name_words(s) if w in _VERB_WORDS})
    foreign = [o for o in FOREIGN_OBJECTS if not any(w in words for w in _words(o) if w not in _STOP)]
    pairs = [(v, o) for v in own_verbs for o in foreign]
    rng.shuffle(pairs)
    for i, (verb, obj) in enumerate(pairs[:per_kind]):
        add("near_miss_object", OBJECT_TEMPLATES[i % len(OBJECT_TEMPLATES)].format(verb=verb, obj=obj))
    pairs = [(t, o) for t in QUESTION_TEMPLATES for o in objects]
    rng.shuffle(pairs)
    for template, obj in pairs[:per_kind]:
        add("domain_question", template.format(obj=obj))
    # another service's request that names one of the family's objects may well be the family's own
    others = [t for t in other_domain if not set(_words(t)) & set(objects)]
    rng.shuffle(others)
    for text in others[:per_kind]:
        add("other_domain", text)
    return out


def shipped_other_domain() -> list[str]:
    """Other services' tool requests of the shipped outlier corpus (its ``other_tools`` category)."""
    from skillbank.memory.outliers import read_corpus
    requests, categories = read_corpus()
    return [r for r, c in zip(requests, categories) if c == "other_tools"]


def kinds_count(negatives: Iterable[Negative]) -> dict[str, int]:
    c = Counter(n.kind for n in negatives)
    return {k: c[k] for k in KINDS if c[k]}


def summary_text(negatives: Sequence[Negative]) -> str:
    """"N given, M synthesized (kind n, ...)": what `learn` and `scope negatives` say a family holds."""
    given = sum(n.source == "given" for n in negatives)
    return (f"{given} given, {len(negatives) - given} synthesized ("
            + ", ".join(f"{k} {v}" for k, v in kinds_count(negatives).items()) + ")")
