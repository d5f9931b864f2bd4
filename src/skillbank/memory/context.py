"""Context sentences: the parts of a request that set the scene and ask for nothing.

People open a request with its circumstances: "I'm editing some footage for my channel. When you get a
chance, print contract_8.docx." The first sentence is about video; the request is about a printer. A router
that sums evidence over every word weighs eight words of scene against three of intent, and sends the
request to the video family. A router that reads the sentences asking for something (an imperative, a
question, a sentence addressed to "you" or saying "please", "I need", "I'd like") and leaves out the
declarative sentences around them reads the intent. When every sentence asks for something, or none does,
the request is read whole: nothing is dropped on a guess.

The rule is a few lines of English syntax, not learned: a declarative sentence opens with its subject (a
pronoun, a possessive, an article), an imperative with its verb. Quoted text is never split into sentences
(a passage to translate is one value, whatever punctuation it holds), list items ("- trim the intro",
"2) colour it") are steps of the request, and abbreviations such as "Dr." do not end a sentence. Written by
hand because no maintained library classifies request sentences; sentence splitters (nltk's punkt, spaCy)
would bring a model download or a large dependency for the one part that is easy.

The executor still reads the whole request: the context may hold values ("My mom is flying into Athens").
"""
from __future__ import annotations

import re

from skillbank.memory.values import QUOTED

_QUOTED = re.compile(QUOTED, re.IGNORECASE | re.UNICODE)  # what the value reader takes for quoted text
_BREAK = re.compile(r"(?<=[.!?])\s+(?=\S)|\n+")
_ABBREVIATION = re.compile(r"\b(?:dr|mr|mrs|ms|st|prof|mt|vs|etc|e\.g|i\.e|no)\.$", re.I)
_HOLE = re.compile("\x00(\\d+)\x00")
# Words a declarative sentence opens with (its subject). An imperative opens with its verb instead.
_SUBJECTS = frozenset("""i i'm im i've ive i'd i'll we we're we've we'd our my the a an it it's its this that these
those there there's here here's someone somebody he she they his her their one""".split())
# Discourse openers skipped before the first word is read ("so my neighbour is...", "ok, text him").
_OPENERS = frozenset("so ok okay well and also but then now oh ugh hey hi hello just anyway".split())
_ASKS = re.compile(r"\?|\b(?:you|u|ya|pls|plz|please|kindly)\b|\bi(?:'d| would)? (?:need|want|like|wanna)\b"
                   r"|\bi'?m looking for\b|\blet'?s\b", re.I)
_LIST_ITEM = re.compile(r"\s*(?:[-*•→]|\d+[.)])\s")


def sentences(request: str) -> list[str]:
    """``request`` cut into sentences and lines, quoted text kept whole."""
    quoted: list[str] = []

    def hide(m: re.Match) -> str:
        quoted.append(m.group(0))
        return f"\x00{len(quoted) - 1}\x00"

    text = _QUOTED.sub(hide, request)
    parts, pending = [], ""
    for piece in _BREAK.split(text):
        pending = f"{pending} {piece}" if pending else piece
        if not _ABBREVIATION.search(pending.rstrip()):
            parts.append(pending)
            pending = ""
    if pending:
        parts.append(pending)
    return [_HOLE.sub(lambda m: quoted[int(m.group(1))], p).strip() for p in parts if p.strip()]


def _asks(sentence: str) -> bool:
    bare = _QUOTED.sub(" ", sentence)  # "you" inside a quoted message does not address the assistant
    if _ASKS.search(bare) or _LIST_ITEM.match(bare):
        return True
    words = [w.strip(",:;!.\"'()").lower().replace("\u2019", "'") for w in bare.split()]
    words = [w for w in words if w]
    while words and words[0] in _OPENERS:
        words = words[1:]
    return bool(words) and words[0] not in _SUBJECTS


def _read(request: str) -> list[tuple[str, bool]]:
    """Each sentence of ``request`` and whether the router reads it (all of them when nothing or everything asks)."""
    parts = sentences(request)
    asks = [_asks(s) for s in parts]
    if all(asks) or not any(asks):
        return [(s, True) for s in parts]
    return list(zip(parts, asks))


def scene_sentences(request: str) -> list[str]:
    """The sentences of ``request`` that only set the scene and are left out (none when it is read whole)."""
    return [s for s, read in _read(request) if not read]


def split_context(request: str) -> tuple[str, str]:
    """``(directive, context)``: the sentences that ask for something and those that only set the scene, each
    joined by spaces. ``(request, "")`` when every sentence asks for something or none does."""
    read = _read(request)
    if all(r for _, r in read):
        return request, ""
    return " ".join(s for s, r in read if r), " ".join(s for s, r in read if not r)


def directive(request: str) -> str:
    """The sentences of ``request`` that ask for something (the whole request when that cannot be told)."""
    return split_context(request)[0]
