"""Style augmentation of training requests: the same plan, asked the way people type it.

An executor trained on template requests answers hand-written requests much worse even when the gold family's
executor is chosen (README, "Selectors over one frozen bank"). :func:`augment_records` rewrites the surface of a
record's request - case, punctuation, politeness, filler words, connectors between steps, shorthand, a typo -
and keeps **every argument value verbatim**, so the gold graph stays the right target: executors copy values
from the request, and a rewrite that changed a value would teach them to invent one.

Each request is cut into protected spans (every occurrence, in any case, of an argument value of its graph;
``<node-j>`` references are not text) and free text between them; the rewrites touch free text only, and
:func:`restyle` checks afterwards that every value the request contained is still there, character for
character. The rewrites are generic English chat habits, not the built-in generator's phrasings, so they apply
to any family's records (the built-in stream, TaskBench, your own).

Measured (README, "Requests in other styles than your records"; ``scripts/style_augment.sh``): with half of
each built-in family's training requests restyled, the embedded base's executors got no better on hand-written
requests and slightly worse on template ones. Hand-written requests fail mostly on which skill a word means,
which no surface rewrite teaches; this stays a tool for that experiment on other bases and data.

Written by hand: text-augmentation libraries (nlpaug, textattack) perturb words at random and cannot be told to
leave given character spans alone; here the protected spans are the point.
"""
from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from skillbank.data.records import Record
from skillbank.errors import SkillbankError
from skillbank.graph import ANY_NODE_REF, TaskGraph

__all__ = ["StyleAugment", "AugmentReport", "augment_records", "restyle", "protected_values", "STYLES",
           "STYLED_SUFFIX"]

#: Appended to a styled record's id (``-1``, ``-2`` ... for extra copies) so outputs can be traced back.
STYLED_SUFFIX = "~style"


class AugmentError(SkillbankError, ValueError):
    """Bad augmentation settings."""


# -- the rewrites -------------------------------------------------------------------------------------------
# Each works on the free text of one request. ``first``/``last`` say whether the piece opens or closes the
# request (openers and closers are anchored there).
_POLITE_FRAME = (
    r"(?:(?:hey|hi|hello|ok|okay|so)[,!.]?\s+)?"
    r"(?:(?:could|can|would|will) you(?: please| kindly| maybe)?(?: help me(?: to)?)?"
    r"|please|kindly|i(?:'d| would) like (?:you )?to|i need (?:you )?to|i want (?:you )?to"
    r"|help me(?: to)?|go ahead and|make sure to|be sure to)[,\s]+")
_OPENER = re.compile(r"^\s*" + _POLITE_FRAME, re.IGNORECASE)
_SENTENCE_OPENER = re.compile(r"(?<=[.!?])\s+" + _POLITE_FRAME, re.IGNORECASE)
_CLOSER = re.compile(
    r"[\s,;.!]*(?:please|thanks|thank you|thx|cheers|if you can|if possible|for me|much appreciated|no rush"
    r"|(?:i'd |i would |i )?appreciate it|(?:thanks|thank you)(?: so much| a lot| in advance)"
    r"|that would help(?: a lot)?)[\s.!?]*$",
    re.IGNORECASE)
_CONNECTOR = re.compile(
    r"(?:[,;.]\s*|\s+)(?:and\s+)?(?:then|after that|afterwards|next"
    r"|(?:once|when) (?:that|it)(?:'s| is) (?:done|finished|ready))[,]?\s+"
    r"|,?\s+and also\s+|,?\s+and on top of that,?\s+|[,.;]\s+also,\s+",  # "also" mid-clause is no connector
    re.IGNORECASE)
#: what a request's steps are joined with instead; one per request. _AS_LIST turns the steps into a bulleted list.
_AS_LIST = "\n- "
_CONNECTOR_STYLES = (" then ", " -> ", " \u2192 ", "; ", ", ", " + ", " and ", ". ", _AS_LIST)
_LIST_HEADERS = ("", "", "todo:\n", "can you:\n", "need:\n", "steps:\n")
_FILLER = re.compile(r"\b(?:the|a|an|some|my|me|for me|just|really|kindly|please)\b\s*", re.IGNORECASE)
_SHORTHAND = {"you": "u", "your": "ur", "please": "pls", "thanks": "thx", "and": "&", "with": "w/",
              "without": "w/o", "are": "r", "because": "bc", "tonight": "tonite"}
_SHORTHAND_RE = re.compile(r"\b(" + "|".join(_SHORTHAND) + r")\b", re.IGNORECASE)
_CASUAL_OPENERS = ("hey ", "hey, ", "pls ", "quick one: ", "need this: ", "ok so ", "hi - ", "yo ", "can u ",
                   "todo: ", "asap: ", "")
_WORD = re.compile(r"\b[A-Za-z]{5,}\b")


def _lowercase(text: str, rng: random.Random, first: bool, last: bool) -> str:
    return text.lower()


def _no_punctuation(text: str, rng: random.Random, first: bool, last: bool) -> str:
    text = text.replace(",", "")
    return re.sub(r"[?!.]+\s*$", "", text) if last else text


def _no_quotes(text: str, rng: random.Random, first: bool, last: bool) -> str:
    return re.sub(r'["\u201c\u201d]', "", text)


def _no_politeness(text: str, rng: random.Random, first: bool, last: bool) -> str:
    # an opener at the start of the request or of any later sentence; a closer only at its end
    text = _SENTENCE_OPENER.sub(" ", text)
    if first:
        text = _OPENER.sub("", text, count=1)
    if last:
        text = _CLOSER.sub("", text, count=1)
    return text


def _terse(text: str, rng: random.Random, first: bool, last: bool) -> str:
    return _FILLER.sub("", text)


def _shorthand(text: str, rng: random.Random, first: bool, last: bool) -> str:
    return _SHORTHAND_RE.sub(lambda m: _SHORTHAND[m.group(1).lower()], text)


def _connectors(style: str):
    def rewrite(text: str, rng: random.Random, first: bool, last: bool) -> str:
        return _CONNECTOR.sub(style, text)
    return rewrite


def _typo(text: str, rng: random.Random) -> str:
    """One letter swapped, dropped or doubled inside one word of five letters or more."""
    words = list(_WORD.finditer(text))
    if not words:
        return text
    m = rng.choice(words)
    w = m.group(0)
    i = rng.randrange(1, len(w) - 2)
    kind = rng.choice(("swap", "drop", "double"))
    if kind == "swap":
        w = w[:i] + w[i + 1] + w[i] + w[i + 2:]
    elif kind == "drop":
        w = w[:i] + w[i + 1:]
    else:
        w = w[:i] + w[i] + w[i:]
    return text[:m.start()] + w + text[m.end():]


#: name -> (rewrite of one free piece, probability that a styled request uses it), applied in this order
#: (connectors before shorthand turns "and" into "&", politeness before terse eats the "a" of "thanks a lot").
#: The probabilities give a styled request three to four rewrites on average; which ones is drawn per request.
#: ``connectors`` draws one joining style per request; ``typo`` changes one word of one free piece;
#: ``casual_opener`` prepends a phrase (all three handled in restyle).
STYLES: dict[str, tuple[Callable[[str, random.Random, bool, bool], str] | None, float]] = {
    "connectors": (None, 0.5),
    "no_politeness": (_no_politeness, 0.6),
    "terse": (_terse, 0.35),
    "shorthand": (_shorthand, 0.25),
    "lowercase": (_lowercase, 0.5),
    "no_punctuation": (_no_punctuation, 0.5),
    "no_quotes": (_no_quotes, 0.25),
    "typo": (None, 0.2),
    "casual_opener": (None, 0.3),
}


# -- one request ----------------------------------------------------------------------------------------------
def protected_values(graph: TaskGraph) -> list[str]:
    """The argument values of ``graph`` that are text (not ``<node-j>`` references), longest first."""
    values = {a.value for n in graph.nodes for a in n.arguments
              if isinstance(a.value, str) and a.value.strip() and not ANY_NODE_REF.search(a.value)}
    return sorted(values, key=lambda v: (-len(v), v))


def _pieces(request: str, values: Sequence[str]) -> list[tuple[str, bool]]:
    """``request`` as (text, protected) pieces: every case-insensitive occurrence of a value is protected."""
    mask = [False] * len(request)
    low = request.lower()
    for v in values:
        lv, start = v.lower(), 0
        while (i := low.find(lv, start)) >= 0:
            mask[i:i + len(lv)] = [True] * len(lv)
            start = i + 1
    pieces: list[tuple[str, bool]] = []
    for ch, p in zip(request, mask):
        if pieces and pieces[-1][1] == p:
            pieces[-1] = (pieces[-1][0] + ch, p)
        else:
            pieces.append((ch, p))
    return pieces


def _tidy(text: str, first: bool, last: bool, between_values: bool) -> str:
    text = re.sub(r"\s{2,}", " ", text)
    text = re.sub(r"\s+([,;.?!])", r"\1", text)
    text = re.sub(r"([,;])\s*\1+", r"\1", text)
    text = re.sub(r"[,;]+([.?!])", r"\1", text)  # "..., please." with "please" dropped
    text = re.sub(r"([.?!])\s*[,;]+", r"\1", text)
    if first:
        text = re.sub(r"^[\s,;.:-]+", "", text)
    if last:
        text = re.sub(r"[\s,;:-]+$", "", text)
    if between_values and not text:
        text = " "  # never glue two values together
    return text


def restyle(request: str, graph: TaskGraph, rng: random.Random, styles: Sequence[str] | None = None
            ) -> tuple[str, list[str]]:
    """``request`` rewritten in another surface style, and the rewrites used (empty: nothing changed).

    ``styles``: the rewrites to apply (default: each of :data:`STYLES` drawn with its probability, at least two).
    Every argument value of ``graph`` that occurs in ``request`` occurs in the result exactly as before."""
    values = protected_values(graph)
    if styles is None:
        styles = [name for name, (_, p) in STYLES.items() if rng.random() < p]
        while len(styles) < 2:
            extra = rng.choice(list(STYLES))
            if extra not in styles:
                styles.append(extra)
    unknown = sorted(set(styles) - set(STYLES))
    if unknown:
        raise AugmentError(f"unknown style(s) {unknown}; known: {sorted(STYLES)}")
    pieces = _pieces(request, values)
    n = len(pieces)
    original = [t for t, _ in pieces]
    texts = list(original)
    joined_by = _connectors(rng.choice(_CONNECTOR_STYLES)) if "connectors" in styles else None
    for name in (s for s in STYLES if s in styles):
        fn = joined_by if name == "connectors" else STYLES[name][0]
        if fn is not None:
            for k, (_, protected) in enumerate(pieces):
                if not protected:
                    texts[k] = fn(texts[k], rng, k == 0, k == n - 1)
        elif name == "typo":
            wordy = [k for k, (_, protected) in enumerate(pieces) if not protected and _WORD.search(texts[k])]
            if wordy:
                k = rng.choice(wordy)
                texts[k] = _typo(texts[k], rng)
    texts = [t if protected else _tidy(t, k == 0, k == n - 1, 0 < k < n - 1 and bool(original[k]))
             for k, (t, (_, protected)) in enumerate(zip(texts, pieces))]
    out = "".join(texts).strip()
    if _AS_LIST in out:  # the steps became a list: its first item gets a bullet too, under an optional header
        out = rng.choice(_LIST_HEADERS) + "- " + out
    elif "casual_opener" in styles:
        out = rng.choice(_CASUAL_OPENERS) + out
    kept = [v for v in values if v in request]
    lost = [v for v in kept if v not in out]
    if lost:  # an invariant of the piece cutting; a broken one must not silently teach invented values
        raise AssertionError(f"restyle changed argument value(s) {lost} of request {request!r} -> {out!r}")
    if not out or out == request:
        return request, []
    return out, list(styles)


# -- a record set ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StyleAugment:
    """How to augment a family's training records.

    fraction: the share of records replaced by a styled version of themselves (same number of records, so the
        same training compute as without augmentation). copies: styled copies added per record on top (more
        compute). seed: which records, which rewrites; the same seed gives the same output."""

    fraction: float = 0.5
    copies: int = 0
    seed: int = 0

    def __post_init__(self):
        if isinstance(self.fraction, bool) or not isinstance(self.fraction, (int, float)) or not 0 <= self.fraction <= 1:
            raise AugmentError(f"fraction must be in [0, 1], got {self.fraction!r}")
        if isinstance(self.copies, bool) or not isinstance(self.copies, int) or self.copies < 0:
            raise AugmentError(f"copies must be an integer >= 0, got {self.copies!r}")
        if self.fraction == 0 and self.copies == 0:
            raise AugmentError("fraction = 0 and copies = 0 would change nothing")


@dataclass
class AugmentReport:
    """What :func:`augment_records` did: counts, how often each rewrite was used, and a few examples."""

    records_in: int
    records_out: int
    replaced: int
    added: int
    unchanged: int  # chosen for styling but no rewrite changed them (e.g. the request is all values)
    styles: Counter = field(default_factory=Counter)
    examples: list[tuple[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"records_in": self.records_in, "records_out": self.records_out, "replaced": self.replaced,
                "added": self.added, "unchanged": self.unchanged, "styles": dict(self.styles.most_common()),
                "examples": [list(e) for e in self.examples]}


def augment_records(records: Sequence[Record], settings: StyleAugment = StyleAugment(), *, examples: int = 3
                    ) -> tuple[list[Record], AugmentReport]:
    """Records with ``settings.fraction`` of them replaced by styled versions and ``settings.copies`` styled
    copies of each added after them; graphs, families and order are kept. A styled record's id gets
    :data:`STYLED_SUFFIX`. Each record's rewrites are drawn from a generator seeded by the seed and its id, so
    a record is styled the same way whatever else is in the set."""
    records = list(records)
    chosen = set(random.Random(settings.seed).sample(range(len(records)), round(settings.fraction * len(records))))
    report = AugmentReport(len(records), 0, 0, 0, 0)
    out: list[Record] = []

    def styled(r: Record, copy: int) -> Record | None:
        rng = random.Random(f"{settings.seed}:{r.id}:{copy}")
        text, used = restyle(r.request, r.graph, rng)
        if not used:
            report.unchanged += 1
            return None
        report.styles.update(used)
        if len(report.examples) < examples:
            report.examples.append((r.request, text))
        suffix = STYLED_SUFFIX if copy == 0 else f"{STYLED_SUFFIX}-{copy}"
        return replace(r, id=f"{r.id}{suffix}", request=text)

    for k, r in enumerate(records):
        s = styled(r, 0) if k in chosen else None
        out.append(s or r)
        report.replaced += s is not None
    for r in records:
        for c in range(1, settings.copies + 1):
            s = styled(r, c)
            if s is not None:
                out.append(s)
                report.added += 1
    report.records_out = len(out)
    return out, report
