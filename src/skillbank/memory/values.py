"""Argument values in a request: the spans that the scope gate and the Address Memory must not read.

A request mixes two things: what the user wants done (the intent: "translate ... into", "set an alarm",
"colorize") and the values the plan will carry (a passage to translate, "06:40", "grandpa.jpg", "Lyon").
The values say nothing about which family can serve the request - a passage about cooking does not make a
translation request a cooking one - but word statistics read them as evidence all the same: every payload
word a family never saw pushes its score down, and a long quoted message drowns the three words of intent.
So the scope gate and the router read the request with its values replaced by typed placeholders
(``xtext``, ``ximage``, ``xdate``...), while the executor still sees the whole request.

At learning time the values are known: a gold graph's literal argument values occur in its request, and
:func:`mask_record` replaces exactly those occurrences (and whatever :func:`find_values` finds besides).
At plan time only the request is there: :func:`find_values` finds quoted text, URLs, e-mail addresses,
file names and paths, phone numbers, money, times, dates, codes, numbers, capitalised names inside a
sentence, and free-text payloads after a colon or on lines of their own when the words before them
introduce a value. Two things it learns from the training records (through :class:`ValueVocabulary`, one
row of counts per family, so it stays replay-free and forgets exactly): the words that occur far more
often inside gold values than outside them ("sofa" in "sell my sofa", "gas" in "pay my gas bill"), and
the words that introduce a value ("saying", "translate", "about").

Written by hand (regular expressions) because no maintained library tags argument values of tool
requests; the shapes are the usual ones (RFC-ish URLs and e-mail addresses, common file extensions).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

# kind -> (token the word statistics see, phrase the sentence encoder sees)
PLACEHOLDERS: dict[str, tuple[str, str]] = {
    "text": ("xtext", "some text"),
    "url": ("xurl", "a link"),
    "email": ("xemail", "an email address"),
    "image": ("ximage", "an image file"),
    "audio": ("xaudio", "an audio file"),
    "video": ("xvideo", "a video file"),
    "document": ("xdocument", "a document"),
    "file": ("xfile", "a file"),
    "phone": ("xphone", "a phone number"),
    "money": ("xmoney", "an amount"),
    "time": ("xtime", "a time"),
    "date": ("xdate", "a date"),
    "code": ("xcode", "a code"),
    "number": ("xnumber", "a number"),
    "name": ("xname", "something"),
}
PLACEHOLDER_TOKENS = frozenset(t for t, _ in PLACEHOLDERS.values())

_EXTENSIONS = {
    "image": "jpg jpeg png gif bmp tif tiff webp heic heif svg raw cr2 nef ico psd",
    "audio": "mp3 wav flac m4a aac ogg oga opus wma aiff aif mid midi amr",
    "video": "mp4 mov avi mkv webm wmv flv m4v mpg mpeg 3gp",
    "document": "pdf doc docx txt rtf odt md csv tsv xls xlsx ods ppt pptx odp json xml html htm epub tex log",
    "file": "zip tar gz 7z rar py js ts java c cpp h go rs rb sh ipynb yaml yml toml ini cfg sql db dat bin exe",
}
EXTENSION_KIND = {ext: kind for kind, exts in _EXTENSIONS.items() for ext in exts.split()}

_MONTHS = ("january|february|march|april|may|june|july|august|september|october|november|december|"
           "jan|feb|mar|apr|jun|jul|aug|sep|sept|oct|nov|dec")
_WEEKDAYS = "monday|tuesday|wednesday|thursday|friday|saturday|sunday|mon|tue|tues|wed|thu|thur|thurs|fri|sat|sun"
_RELATIVE_DAYS = r"today|tonight|tomorrow|tmrw|tmr|yesterday|this (?:morning|afternoon|evening|weekend)"
_ORDINAL = r"\d{1,2}(?:st|nd|rd|th)?"

# Quoted text: straight and typographic quotes; a single quote only where it is no apostrophe (don't, Bob's).
QUOTED = r"\"[^\"\n]+\"|“[^”\n]+”|„[^“”\n]+[“”]|«[^»\n]+»|‘[^’\n]+’|`[^`\n]+`|(?<![\w'])'[^'\n]+'(?![\w'])"

# (kind, pattern), tried in this order; an earlier kind's span wins an overlap.
_RULES: list[tuple[str, re.Pattern]] = [(k, re.compile(p, re.IGNORECASE | re.UNICODE)) for k, p in [
    ("text", QUOTED),
    ("email", r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b"),
    ("url", r"\b(?:https?://|www\.)[^\s<>\"']+[^\s<>\"'.,;:!?)\]]|"
            r"\b[a-z0-9-]+(?:\.[a-z0-9-]+)*\.(?:com|org|net|io|dev|ai|edu|gov|co|uk|de|fr|es|it|app|me|info)"
            r"(?:/[^\s<>\"']*[^\s<>\"'.,;:!?)\]])?(?![\w.])"),
    ("path", r"(?:~|\.{1,2}|[a-z]:)?(?:[/\\][\w.\-]+)+[/\\]?"),
    ("file", r"\b[\w\-()]+(?:\.[\w\-()]+)*?\.(?:" + "|".join(sorted(EXTENSION_KIND, key=len, reverse=True)) + r")\b"),
    ("phone", r"(?<![\w+])\+?\(?\d{1,4}\)?(?:[\s.-]?\(?\d{2,4}\)?){2,5}(?!\w)"),
    ("money", r"[$€£¥]\s?\d[\d,]*(?:\.\d+)?(?:\s?[km]\b)?|\b\d[\d,]*(?:\.\d+)?\s?(?:usd|eur|gbp|dollars?|euros?|pounds|bucks)\b"),
    ("time", r"\b\d{1,2}(?::\d{2})?\s?(?:a\.?m\.?|p\.?m\.?)(?!\w)|\b\d{1,2}[:.h]\d{2}\b|\b(?:noon|midnight)\b"),
    ("date", r"\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}/\d{1,2}(?:/\d{2,4})?\b|"
             rf"\b(?:(?:next|this|last|on)\s+)?(?:{_MONTHS})\.?\s+{_ORDINAL}(?:,?\s+\d{{4}})?\b|"
             rf"\b(?:the\s+)?{_ORDINAL}\s+(?:of\s+)?(?:{_MONTHS})\b(?:,?\s+\d{{4}})?|"
             rf"\b(?:(?:next|this|last|on|every)\s+)?(?:{_WEEKDAYS})\b(?:\s+(?:morning|afternoon|evening|night))?|"
             rf"\b(?:{_RELATIVE_DAYS})\b|\bnext\s+(?:week|month|year)\b|\bin\s+\d+\s+(?:days|weeks|hours|minutes)\b"),
    ("code", r"#\w+|\b(?=[a-z\-]*\d)(?=\d*[a-z])[a-z0-9]+(?:-[a-z0-9]+)*\b"),
    ("number", r"\b\d+(?:[.,]\d+)*(?:%|st|nd|rd|th)?(?!\w)"),
]]

_WORD = re.compile(r"[^\W\d_][\w'’\-]*", re.UNICODE)
_SENTENCE_OPENERS = '.!?:;"“(['  # a word after one of these (and spaces), or after a line break, opens a sentence


def _starts_sentence(request: str, pos: int) -> bool:
    """Whether the word at ``pos`` opens the request, a line or a sentence. Read backwards over the spaces before
    it: a regular expression anchored at the end of ``request[:pos]`` would scan the whole prefix for every
    word, quadratic in a long request (a 10,000-word one took seconds per reading)."""
    i = pos
    while i > 0 and request[i - 1].isspace():
        if request[i - 1] == "\n":
            return True
        i -= 1
    if i == 0:
        return pos == 0
    return request[i - 1] in _SENTENCE_OPENERS


# Function words that a capitalised word inside a sentence rarely is the name of.
_NOT_NAMES = frozenset("i i'm i'll i'd i've ok okay hi hey hello please thanks thank".split())


@dataclass(frozen=True)
class ValueSpan:
    start: int
    end: int
    kind: str
    text: str


@dataclass(frozen=True)
class MaskedRequest:
    """A request with its value spans; ``words`` is what word statistics read, ``prose`` what an encoder reads."""

    request: str
    spans: tuple[ValueSpan, ...]

    def _render(self, slot: int) -> str:
        out, at = [], 0
        for s in self.spans:
            out.append(self.request[at:s.start])
            out.append(f" {PLACEHOLDERS[s.kind][slot]} ")
            at = s.end
        out.append(self.request[at:])
        return re.sub(r"[ \t]{2,}", " ", "".join(out)).strip()

    @property
    def words(self) -> str:
        return self._render(0)

    @property
    def intent(self) -> str:
        """The request without its values: the words that say what is wanted."""
        out, at = [], 0
        for s in self.spans:
            out += [self.request[at:s.start], " "]
            at = s.end
        out.append(self.request[at:])
        return re.sub(r"[ \t]{2,}", " ", "".join(out)).strip()

    @property
    def prose(self) -> str:
        return self._render(1)

    @property
    def values(self) -> list[tuple[str, str]]:
        """(kind, text) of each span, in order."""
        return [(s.kind, s.text) for s in self.spans]


def _file_kind(text: str) -> str:
    ext = text.rsplit(".", 1)[-1].lower() if "." in text else ""
    return EXTENSION_KIND.get(ext, "file")


def _add(spans: list[ValueSpan], taken: np.ndarray, start: int, end: int, kind: str, text: str) -> None:
    # strip what the patterns may take at a span's edges
    while end > start and text[end - 1 - start] in " \t,.;:!?":
        end -= 1
    if end <= start or taken[start:end].any():
        return
    taken[start:end] = True
    spans.append(ValueSpan(start, end, kind, text[: end - start]))


def find_values(request: str, vocabulary: "ValueVocabulary | None" = None) -> list[ValueSpan]:
    """The value spans of ``request``, from the request alone (and, given one, the learned vocabulary)."""
    taken = np.zeros(len(request) + 1, dtype=bool)
    spans: list[ValueSpan] = []
    for kind, pattern in _RULES:
        for m in pattern.finditer(request):
            k = kind
            if kind in ("path", "file"):
                k = _file_kind(m.group())
            _add(spans, taken, m.start(), m.end(), k, request[m.start():m.end()])
    _payloads(request, spans, taken, vocabulary)
    words = list(_WORD.finditer(request))
    title_case = sum(w.group()[0].isupper() for w in words) > 0.6 * max(len(words), 1) and len(words) > 3
    for w in words:
        if taken[w.start():w.end()].any():
            continue
        token = w.group()
        low = token.lower()
        at_start = _starts_sentence(request, w.start())
        is_name = (not title_case and not at_start and token[0].isupper() and not token.isupper()
                   and low not in _NOT_NAMES and not (vocabulary is not None and vocabulary.is_intent_word(low)))
        if is_name or (vocabulary is not None and vocabulary.is_value_word(low)):
            _add(spans, taken, w.start(), w.end(), "name", token)
    spans = _merge_names(request, sorted(spans, key=lambda s: s.start))
    return spans


def _merge_names(request: str, spans: list[ValueSpan]) -> list[ValueSpan]:
    """Adjacent name words form one value ("Casa Lola", "Hotel Aurora")."""
    out: list[ValueSpan] = []
    for s in spans:
        if out and out[-1].kind == s.kind == "name" and not request[out[-1].end:s.start].strip():
            p = out.pop()
            s = ValueSpan(p.start, s.end, "name", request[p.start:s.end])
        out.append(s)
    return out


_CLAUSE_BREAK = re.compile(r"\n\s*\n|[.!?](?:\s|$)")


def _payloads(request: str, spans: list[ValueSpan], taken: np.ndarray, vocabulary) -> None:
    """Free text after a colon or a line break, when the words just before introduce a value ("translate this
    into German:", "send Anna this message:", "summarize\\n<passage>"). The payload runs to the end of its
    paragraph; only payloads of three words or more count (shorter ones the other rules see)."""
    for m in re.finditer(r":[ \t]*\n?|\n", request):
        head = request[:m.start()]
        before = [w.lower() for w in _WORD.findall(head[-80:])][-6:]
        if not before:
            continue
        if not (m.group().startswith(":") or len(before) <= 12):
            continue
        introduced = any(_introduces(w, vocabulary) for w in before)
        if not introduced:
            continue
        start = m.end()
        while start < len(request) and request[start].isspace():
            start += 1
        if taken[m.start()] or (spans and any(s.start <= m.start() < s.end for s in spans)):
            continue
        rest = request[start:]
        stop = re.search(r"\n\s*\n", rest)
        end = start + (stop.start() if stop else len(rest))
        if len(_WORD.findall(request[start:end])) >= 3 and not taken[start:end].all():
            # a payload may contain values the rules found (a date in a message): it swallows them
            taken[start:end] = False
            spans[:] = [s for s in spans if not (start <= s.start and s.end <= end)]
            _add(spans, taken, start, end, "text", request[start:end])


# Words that introduce a value in any family's requests; the vocabulary adds the ones its families use.
_INTRODUCERS = frozenset("""saying says say message text reply write post tweet caption translate translation
summarize summarise summary paraphrase simplify correct proofread fix read aloud speak pronounce answer question
context passage about prompt generate draw paint describe following below this these content note remind
reminder email mail subject body lyrics poem story title""".split())


def _introduces(word: str, vocabulary) -> bool:
    return word in _INTRODUCERS or (vocabulary is not None and vocabulary.is_introducer(word))


def mask(request: str, vocabulary: "ValueVocabulary | None" = None) -> MaskedRequest:
    """``request`` with the values found in it alone (plan time)."""
    return MaskedRequest(request, tuple(find_values(request, vocabulary)))


def mask_payloads(request: str, min_words: int) -> str:
    """``request`` with each free-text payload (quoted text, a passage after "summarize this:") of at least
    ``min_words`` words replaced by the ``xtext`` placeholder, everything else verbatim: what a router reads.
    Found from the request alone, so it is the same at learning and at plan time. A router keeps shorter
    values (a file name, a city, "reverb") because they say which family serves the request; a long
    payload's words say what the payload is about, not what is to be done with it."""
    spans = tuple(s for s in find_values(request) if s.kind == "text" and len(_WORD.findall(s.text)) >= min_words)
    return MaskedRequest(request, spans).words if spans else request


def mask_record(request: str, values: Iterable[str], vocabulary: "ValueVocabulary | None" = None) -> MaskedRequest:
    """``request`` with its known values (a gold graph's literal argument values) masked first, then
    whatever :func:`find_values` finds besides (learning time)."""
    taken = np.zeros(len(request) + 1, dtype=bool)
    spans: list[ValueSpan] = []
    low = request.lower()
    for v in sorted({str(v) for v in values if str(v).strip()}, key=len, reverse=True):
        at = 0
        while (i := low.find(v.lower(), at)) >= 0:
            # a value found by shape keeps its shape's kind; free text is text; a single word a name
            found = find_values(request[i:i + len(v)])
            kind = (found[0].kind if len(found) == 1 and found[0].end - found[0].start >= len(v.strip()) - 1
                    else "text" if len(_WORD.findall(v)) >= 3 else "name")
            # quotes around a value belong to it
            s, e = i, i + len(v)
            if s > 0 and e < len(request) and request[s - 1] in "\"“'«‘`" and request[e] in "\"”'»’`":
                s, e = s - 1, e + 1
            _add(spans, taken, s, e, kind, request[s:e])
            at = i + max(len(v), 1)
    for s in find_values(request, vocabulary):
        _add(spans, taken, s.start, s.end, s.kind, s.text)
    return MaskedRequest(request, tuple(_merge_names(request, sorted(spans, key=lambda s: s.start))))


def graph_values(graph) -> list[str]:
    """The literal (non-reference) argument values of a task graph (a dict or a :class:`TaskGraph`)."""
    from skillbank.graph import ANY_NODE_REF
    nodes = graph["task_nodes"] if isinstance(graph, dict) else [
        {"arguments": [{"value": a.value} for a in n.arguments]} for n in graph.nodes]
    out = []
    for n in nodes:
        for a in n.get("arguments", ()):
            v = a.get("value")
            if isinstance(v, str) and v.strip() and not ANY_NODE_REF.search(v):
                out.append(v)
    return out


class ValueVocabulary:
    """Per family, how often each word occurs inside a gold value and outside one, and which words come
    just before a value: statistics of the training records, never the records (additive per family, so a
    family is forgotten by dropping its row). Words are kept as strings: a family's requests use a few
    thousand, and a readable vocabulary is what ``--explain`` shows."""

    #: a word is a value word when it occurs inside values at least this many times as outside them, ...
    VALUE_RATIO = 3.0
    #: ... and at least this often inside values
    MIN_VALUE_COUNT = 3
    #: an introducer precedes a value in at least this share of its occurrences, at least this often
    INTRODUCER_SHARE, MIN_INTRODUCER_COUNT = 0.3, 3

    def __init__(self):
        self.classes_: list[str] = []
        self.inside_: list[dict[str, int]] = []
        self.outside_: list[dict[str, int]] = []
        self.before_: list[dict[str, int]] = []
        self._summary = None

    def partial_fit(self, masked: Sequence[MaskedRequest], label: str) -> "ValueVocabulary":
        if label not in self.classes_:
            self.classes_.append(label)
            self.inside_.append({}), self.outside_.append({}), self.before_.append({})
        i = self.classes_.index(label)
        inside, outside, before = self.inside_[i], self.outside_[i], self.before_[i]
        for m in masked:
            at = 0
            for s in m.spans:
                gap = m.request[at:s.start]
                words = [w.lower() for w in _WORD.findall(gap)]
                for w in words:
                    outside[w] = outside.get(w, 0) + 1
                if words and s.kind == "text":
                    before[words[-1]] = before.get(words[-1], 0) + 1
                if s.kind == "name":  # short values; a payload's words are any words
                    for w in _WORD.findall(s.text):
                        inside[w.lower()] = inside.get(w.lower(), 0) + 1
                at = s.end
            for w in _WORD.findall(m.request[at:]):
                outside[w.lower()] = outside.get(w.lower(), 0) + 1
        self._summary = None
        return self

    def forget(self, label: str) -> "ValueVocabulary":
        i = self.classes_.index(label)
        for rows in (self.classes_, self.inside_, self.outside_, self.before_):
            rows.pop(i)
        self._summary = None
        return self

    def family(self, label: str) -> "ValueVocabulary":
        one = ValueVocabulary()
        i = self.classes_.index(label)
        one.classes_, one.inside_, one.outside_, one.before_ = [label], [self.inside_[i]], [self.outside_[i]], [self.before_[i]]
        return one

    def add_family(self, other: "ValueVocabulary", source: str, label: str) -> "ValueVocabulary":
        j = other.classes_.index(source)
        self.classes_.append(label)
        self.inside_.append(dict(other.inside_[j])), self.outside_.append(dict(other.outside_[j]))
        self.before_.append(dict(other.before_[j]))
        self._summary = None
        return self

    def _totals(self):
        if self._summary is None:
            def total(rows):
                out: dict[str, int] = {}
                for r in rows:
                    for w, c in r.items():
                        out[w] = out.get(w, 0) + c
                return out
            self._summary = (total(self.inside_), total(self.outside_), total(self.before_))
        return self._summary

    def is_value_word(self, word: str) -> bool:
        inside, outside, _ = self._totals()
        n = inside.get(word, 0)
        return n >= self.MIN_VALUE_COUNT and n >= self.VALUE_RATIO * outside.get(word, 0)

    def is_intent_word(self, word: str) -> bool:
        """A word the families' requests use outside values more often than inside them."""
        inside, outside, _ = self._totals()
        return outside.get(word, 0) > max(inside.get(word, 0), 0) and outside.get(word, 0) >= self.MIN_VALUE_COUNT

    def is_introducer(self, word: str) -> bool:
        _, outside, before = self._totals()
        n = before.get(word, 0)
        return n >= self.MIN_INTRODUCER_COUNT and n >= self.INTRODUCER_SHARE * max(outside.get(word, 0), 1)

    def to_state(self) -> dict:
        return {"classes": self.classes_, "inside": self.inside_, "outside": self.outside_, "before": self.before_}

    @classmethod
    def from_state(cls, state: dict) -> "ValueVocabulary":
        v = cls()
        v.classes_ = list(state["classes"])
        v.inside_, v.outside_, v.before_ = ([dict(r) for r in state[k]] for k in ("inside", "outside", "before"))
        if not len(v.inside_) == len(v.outside_) == len(v.before_) == len(v.classes_):
            raise ValueError("value vocabulary rows do not match its families")
        return v
