"""Probe: can the action a request asks for tell near misses apart ("cancel my reservation" where a family
can only book)? The scope gate weighs words and a sentence embedding; near misses name a family's objects, so
both call them in scope. Here a second test runs after the gate keeps a request:

- the request's action is its first content word (after fillers such as "hey", "could you", "please";
  values masked as the gate masks them) when lemminflect's lexicon says it can be a verb; a request that
  opens with anything else ("I need...", "what...", a file name) gets no opinion;
- each family's actions are those of its own training requests, read the same way, plus the verbs in its
  skill names (per-family counts: replay-free, as the gate's statistics are);
- an action the routed family never uses is refused unless the sentence encoder finds it close to one of
  the family's actions ("to ring" vs "to call": cosine >= --tau, chosen on the development sets only).

It prints the development sets' trade-off for several tau, then the frozen test sets at the tau given.

    .venv/bin/pip install lemminflect==0.2.3   # not a dependency of skillbank: this probe only
    .venv/bin/python scripts/scope_action_verbs.py --tau 0.5

Measured 2026-12-04 (docs/scope.md, "Other meaning evidence"): at tau 0.5 (dev: in-domain kept 86.1% ->
85.2%, missing-tool requests refused 56.6% -> 67.9%) the frozen test sets give in-domain kept 83.0% -> 80.0%,
near misses refused 34% -> 40%, all off-domain 71.2% -> 74.4%: about one in-domain request lost per near
miss caught; not adopted. Synonyms a family never saw ("ring", "rip", "steady", "dream up") are as far from its
verbs, for this encoder, as real near misses ("cancel", "freeze", "withdraw")."""
from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from scope import DEV_IN, DEV_OFF, TEST_IN, TEST_OFF, rows  # noqa: E402

FILLERS = set("hey hi hello yo ok okay so please pls plz kindly just quickly can could would will you u id i'd "
              "like to want wanna need help me be able mind go ahead and also then now first hmm um dear "
              "assistant there thanks thank let let's lets quick real really gonna try".split())
# Verbs that open a request without naming its action ("have a look", "know", "try").
NOT_ACTIONS = set("be have know need want like wonder think mind try".split())
WORD = re.compile(r"[a-z][a-z'\-]*")


def lexicon():
    """lemminflect (its lexicon says which words can be verbs), or exit saying how to install it."""
    try:
        import lemminflect
    except ImportError:
        sys.exit("this probe needs lemminflect (not a skillbank dependency): .venv/bin/pip install lemminflect==0.2.3")
    return lemminflect


def skill_verbs(lemminflect, skills) -> set[str]:
    """The verbs in skill names ("book_restaurant" -> "book")."""
    return {v[0] for v in (lemminflect.getAllLemmas(p).get("VERB") for s in skills for p in s.split("_")) if v}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tau", type=float, default=0.5, help="least cosine to a family action that counts as one")
    args = ap.parse_args()
    lemminflect = lexicon()
    from skillbank.data.builtin import build_builtin_stream
    from skillbank.experiments.scope import detector_for_stream
    from skillbank.memory.selectors.embedding import get_encoder
    from skillbank.memory.values import PLACEHOLDER_TOKENS

    def action(text: str) -> str | None:
        for word in WORD.findall(text.lower()):
            if word in FILLERS or word in PLACEHOLDER_TOKENS:
                continue
            lemma = lemminflect.getAllLemmas(word).get("VERB")
            return lemma[0] if lemma and lemma[0] not in NOT_ACTIONS else None
        return None

    stream = build_builtin_stream(seed=0, train_per_family=200, test_per_family=50)
    det = detector_for_stream(stream, outliers=None)  # the gate before the outlier corpus
    actions: dict[str, list[str]] = {}
    for family in stream.family_keys:
        seen = collections.Counter(action(m.intent) for m in det.read([r.request for r in stream.train[family]]))
        seen.update(skill_verbs(lemminflect, stream.catalog.family(family).skills))
        seen.pop(None, None)
        actions[family] = sorted(seen)
    encoder, unit = get_encoder(det.encoder), {}

    def embed(words: list[str]) -> np.ndarray:
        new = [w for w in words if w not in unit]
        for w, e in zip(new, encoder.encode([f"to {w}" for w in new]) if new else []):
            unit[w] = e / np.linalg.norm(e)
        return np.stack([unit[w] for w in words])

    def judge(requests: list[str]) -> list[tuple[bool, float | None]]:
        """(the gate keeps it, the closest family action's cosine where the action is not the family's)."""
        scores = det.score(requests)
        out = []
        for request, masked, row in zip(requests, det.read(requests), scores):
            family, verb = det.classes_[int(row.argmax())], action(masked.intent)
            near = None
            if verb is not None and verb not in actions[family]:
                near = float((embed([verb]) @ embed(actions[family]).T).max())
            out.append((row.max() >= det.threshold_, near))
        return out

    def kept(verdicts, tau):
        return float(np.mean([g and (n is None or n >= tau) for g, n in verdicts]))

    report(judge, kept, "tau", (0.45, 0.5, 0.55, 0.6, 0.65, 0.7), args.tau, off=-1.0)


def report(judge, kept, what: str, grid, chosen: float, off: float) -> None:
    """Print the development sets' trade-off at each value of ``grid`` and the frozen test sets at ``chosen``
    (``off``: the value at which the second test refuses nothing, the gate alone). ``judge(requests)`` gives one
    verdict per request; ``kept(verdicts, value)`` the share kept at that value."""
    dev_in = judge([r["request"] for n in DEV_IN for r in rows(n)])
    dev_off = [r for n in DEV_OFF for r in rows(n)]
    dev_off_v = judge([r["request"] for r in dev_off])
    missing = [v for v, r in zip(dev_off_v, dev_off) if r["category"] == "missing_tool"]
    for value in (off, *grid):
        label = "gate alone" if value == off else f"{what} {value:.2f}"
        print(f"development, {label}: in-domain kept {kept(dev_in, value):.1%}, off-domain refused "
              f"{1 - kept(dev_off_v, value):.1%}, missing-tool refused {1 - kept(missing, value):.1%}")
    test_in = judge([r["request"] for n in TEST_IN for r in rows(n)])
    test_off = [r for n in TEST_OFF for r in rows(n)]
    test_off_v = judge([r["request"] for r in test_off])
    near = [v for v, r in zip(test_off_v, test_off) if r["category"] == "near_miss"]
    for name, value in (("gate alone", off), (f"gate + second test at {what} {chosen}", chosen)):
        print(f"FROZEN TEST, {name}: in-domain kept {kept(test_in, value):.1%}, off-domain refused "
              f"{1 - kept(test_off_v, value):.1%}, near misses refused {1 - kept(near, value):.1%}")

if __name__ == "__main__":
    main()
