"""Variants of a new bank's router on requests as people write them: what each changes, and on which sets.

A new bank routes with ``embed-lda-nb`` (sentence-embedding statistics plus a hashed word n-gram Naive Bayes,
long payloads masked) and counts each skill's catalog text once in the lexical statistics. This fits that
router and its variants on the built-in stream's training requests (K = 5, 20, 50 families, 200 requests a
family, as ``bench/scope.py`` does; the catalog text through ``partial_fit_catalog``, as ``SkillBank.learn``
adds it) and prints route accuracy on the held-out template requests, the hand-written development requests
(the sets settings are chosen on), the frozen hand-written test requests (reported, never chosen on) and,
with ``--taskbench``, the held-out requests of a TaskBench stream (real catalogs and requests, 20 training
requests a family). Variants:

- ``whole``: every sentence read, the scene-setting ones too (banks made before 2026-12-05; the default drops
  them when a request has a sentence that asks for something: ``skillbank.memory.context``);
- ``lexical`` / ``lexical-asking``: FSM's Address Memory (hashing Naive Bayes, the paper's), reading whole requests
  or only their asking sentences (why ``drop_context`` is an option of the embedding router alone);
- ``catalog-0`` / ``catalog-3`` / ``catalog-10``: the catalog text counted 0 (banks made before 2026-12-05),
  3 or 10 times instead of once;
- ``alpha-0.1`` / ``alpha-0.3``: more Naive Bayes smoothing (0.01 by default);
- ``unigrams``: words only, no word pairs;
- ``char-0.1``: character 3-5-grams within words (scikit-learn's ``char_wb``), weighted 0.1, added to the words
  (for typos);
- ``style-1``: each training request also counted in one restyled form (``skillbank.data.augment.restyle``:
  case, punctuation, politeness, shorthand, typos; values kept).

    .venv/bin/python scripts/route_variants.py --taskbench PATH/TO/taskbench --json results/route-variants/variants.json
    .venv/bin/python scripts/route_variants.py --flips whole --families 5,20   # the hand-written requests that
                                                             # the default and a variant route differently
    .venv/bin/python scripts/route_variants.py --misroutes [--bank BANK]   # the lexical router's template misroutes explained,
                                                             # and each router routing by its surest sentence
"""
from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from scope import DEV_IN, TEST_IN, family_of, rows  # noqa: E402  (the hand-written sets, as bench/scope.py reads them)

VARIANTS = ["default", "whole", "lexical", "lexical-asking", "catalog-0", "catalog-3", "catalog-10", "alpha-0.1", "alpha-0.3", "unigrams", "char-0.1",
            "style-1"]


class CharAndWords:
    """Word n-grams (the router's own hasher) next to weighted character n-grams, in one feature space."""

    def __init__(self, words, weight: float):
        from sklearn.feature_extraction.text import HashingVectorizer
        self.words, self.weight = words, weight
        self.chars = HashingVectorizer(analyzer="char_wb", ngram_range=(3, 5), n_features=words.n_features,
                                       alternate_sign=False, norm=None)

    def transform(self, texts):
        import scipy.sparse as sp
        return sp.hstack([self.words.transform(texts), self.chars.transform(texts) * self.weight]).tocsr()


class AskingSentences:
    """A router's hasher reading only the sentences of a request that ask for something."""

    def __init__(self, words):
        self.words = words

    def __getattr__(self, name):
        return getattr(self.words, name)

    def transform(self, texts):
        from skillbank.memory.context import directive
        return self.words.transform([directive(t) for t in texts])


def make_router(variant: str):
    from skillbank.memory.address import HashingNBAddress, make_selector
    from skillbank.memory.bank import default_address
    from skillbank.memory.hashing import WordHasher

    if variant.startswith("lexical"):
        router = HashingNBAddress()
        if variant == "lexical-asking":
            router._vectorizer = AskingSentences(router._vectorizer)
        return router

    kind, params = default_address()
    nb = dict(params.get("nb_params") or {})
    if variant == "whole":
        params = {**params, "drop_context": False}
    elif variant.startswith("catalog-"):
        params = {**params, "catalog_weight": int(variant.split("-")[1])}
    elif variant.startswith("alpha-"):
        params = {**params, "nb_params": {**nb, "alpha": float(variant.split("-")[1])}}
    elif variant == "unigrams":
        params = {**params, "nb_params": {**nb, "ngram_range": [1, 1]}}
    router = make_selector(kind, **params)
    if variant.startswith("char-"):
        n = HashingNBAddress().n_features
        router.nb_ = HashingNBAddress(n_features=2 * n)
        router.nb_._vectorizer = CharAndWords(WordHasher(n, (1, 2)), float(variant.split("-")[1]))
    return router


def fit(router, stream, variant: str):
    from skillbank.data.augment import restyle
    from skillbank.memory.scope import family_catalog_text

    for family in stream.family_keys:
        requests = [r.request for r in stream.train[family]]
        if variant == "style-1":
            rng = random.Random(family)
            requests += [restyle(r.request, r.graph, rng)[0] for r in stream.train[family]]
        router.partial_fit(requests, family)
        router.partial_fit_catalog(family_catalog_text(stream.catalog, family), family)
    return router


def builtin_sets(stream) -> dict[str, list[tuple[str, str]]]:
    """(request, family) pairs: the stream's held-out templates, the hand-written development and frozen test
    requests whose skills one family of the split holds."""
    skill_family = {sid.split("::")[-1]: key for key in stream.family_keys for sid in stream.catalog.family(key).skills}

    def hand_written(names):
        pairs = [(r["request"], family_of(r, skill_family)) for n in names for r in rows(n)]
        return [(q, f) for q, f in pairs if f is not None]

    return {"templates": [(r.request, key) for key in stream.family_keys for r in stream.test[key]],
            "dev": hand_written(DEV_IN), "test": hand_written(TEST_IN)}


def accuracy(router, pairs) -> float:
    predicted = router.predict([q for q, _ in pairs])
    return float(np.mean([p == f for p, (_, f) in zip(predicted, pairs)]))


def explain_misroutes(k: int = 5, bank_dir: Path | None = None) -> None:
    """Each held-out template request FSM's Address Memory (the harness's and the paper's router) sends to
    another family, with the word n-grams that pull hardest toward that family (log-likelihood ratio of the
    two families, nats): why its routing stops at ~98% on templates. With ``bank_dir`` (a bank of the stream's
    families) each one is also planned by its own family's shard and by the shard it was routed to, scored
    against its gold graph: what the misroute costs in graph EM."""
    from skillbank.data.builtin import build_builtin_stream
    from skillbank.experiments.routing import fit_stages
    from skillbank.memory.address import HashingNBAddress

    stream = build_builtin_stream(seed=0, train_per_family=200, test_per_family=50, families=k)
    nb = fit_stages(HashingNBAddress(), stream, stream.family_keys)
    weights, norm = nb._weights()
    pairs = [(r.request, key) for key in stream.family_keys for r in stream.test[key]]
    graphs = {r.request: r.graph for key in stream.family_keys for r in stream.test[key]}
    bank = None
    if bank_dir is not None:
        from skillbank.memory.bank import SkillBank
        bank = SkillBank.open(bank_dir)
    print(f"\n## FSM's Address Memory, K = {k}: misrouted held-out template requests")
    for (request, gold), routed in zip(pairs, nb.predict([q for q, _ in pairs])):
        if routed == gold:
            continue
        g, r = nb.classes_.index(gold), nb.classes_.index(routed)
        pulls = []
        for gram in nb._vectorizer.ngrams(request):
            w = weights[nb._vectorizer.index(gram)].toarray().ravel() + norm
            pulls.append((w[r] - w[g], gram))
        pulls.sort(reverse=True)
        print(f"- {gold} -> {routed}: {request}\n  toward {routed}: "
              + ", ".join(f"{gram!r} {v:+.1f}" for v, gram in pulls[:5])
              + f"; toward {gold}: " + ", ".join(f"{gram!r} {v:+.1f}" for v, gram in pulls[::-1][:3]))
        if bank is not None:
            from skillbank.graph import TaskGraph
            from skillbank.metrics import score_example
            em = {}
            for shard in (gold, routed):
                plan = bank.plan([request], shard=shard)[0]
                pred = TaskGraph.from_dict(plan.graph) if plan.graph is not None else None
                em[shard] = score_example(graphs[request], pred).graph_em
            print(f"  graph EM planned by {gold}'s shard: {em[gold]:.0f}, by {routed}'s: {em[routed]:.0f}")


SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def sentences(request: str) -> list[str]:
    """The request cut after ., ! or ? before a capital, never inside double quotes (a probe's splitter)."""
    out, current = [], ""
    for part in SENTENCE_END.split(request):
        current = f"{current} {part}" if current else part
        if current.count('"') % 2 == 0:
            out.append(current)
            current = ""
    return out + [current] if current else out or [request]


def route_by_surest_sentence(router, requests: list[str], *, with_whole: bool = False) -> list[str]:
    """Each request of several sentences routed by the one sentence whose routing probability is highest
    (``with_whole``: by the sum of that sentence's and the whole request's log-probabilities)."""
    routed = []
    for request in requests:
        parts = sentences(request)
        proba = router.predict_proba(parts if len(parts) > 1 else [request])
        score = np.log(np.maximum(proba[np.argmax(proba.max(axis=1))], 1e-300))
        if with_whole and len(parts) > 1:
            score = score + np.log(np.maximum(router.predict_proba([request])[0], 1e-300))
        routed.append(router.classes_[int(np.argmax(score))])
    return routed


def surest_sentence_table(families: list[int]) -> None:
    """Whole request vs surest sentence, for FSM's Address Memory and a new bank's router."""
    from skillbank.data.builtin import build_builtin_stream
    from skillbank.experiments.routing import fit_stages
    from skillbank.memory.address import HashingNBAddress

    print("\n## Routing by the whole request | the sentence the router is surest of | both summed: held-out "
          "templates / hand-written development / frozen test (not chosen on)")
    for k in families:
        stream = build_builtin_stream(seed=0, train_per_family=200, test_per_family=50, families=k)
        sets = builtin_sets(stream)
        for name, router in (("FSM's Address Memory", HashingNBAddress()), ("a new bank's router", make_router("default"))):
            fit_stages(router, stream, stream.family_keys)
            whole = [accuracy(router, pairs) for pairs in sets.values()]
            rows_ = [whole]
            for with_whole in (False, True):
                rows_.append([float(np.mean([p == f for p, (_, f) in zip(
                    route_by_surest_sentence(router, [q for q, _ in pairs], with_whole=with_whole), pairs)]))
                    for pairs in sets.values()])
            print(f"- K = {k}, {name}: " + "  |  ".join(" / ".join(f"{a:.1%}" for a in r) for r in rows_), flush=True)


def print_flips(variant: str, families: list[int]) -> None:
    """Each hand-written request that the default router and ``variant`` route differently: which one is right,
    and the sentences the default leaves out as scene-setting (most flips have none: they come from statistics
    learned another way, not from reading the request another way)."""
    from skillbank.data.builtin import build_builtin_stream
    from skillbank.memory.context import scene_sentences

    for k in families:
        stream = build_builtin_stream(seed=0, train_per_family=200, test_per_family=50, families=k)
        sets = builtin_sets(stream)
        default, other = fit(make_router("default"), stream, "default"), fit(make_router(variant), stream, variant)
        tally = {"default": 0, variant: 0}
        print(f"\n## K = {k}: hand-written requests routed differently by the default and {variant!r}")
        for part in ("dev", "test"):
            requests = [q for q, _ in sets[part]]
            for (q, gold), a, b in zip(sets[part], default.predict(requests), other.predict(requests)):
                if (a == gold) != (b == gold):
                    right = "default" if a == gold else variant
                    tally[right] += 1
                    print(f"- {part}, {right} right ({gold}; default {a}, {variant} {b}); scene left out: "
                          f"{scene_sentences(q)}; {q[:100]!r}")
        print(f"right only with the default: {tally['default']}, only with {variant}: {tally[variant]}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default="5,20,50", help="comma list of built-in splits")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--taskbench", type=Path, help="a TaskBench root (its three domains' folders) to route too")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--misroutes", action="store_true", help="instead: FSM's Address Memory's template misroutes "
                    "explained, and each router routing by the sentence it is surest of")
    ap.add_argument("--bank", type=Path, help="with --misroutes: a bank of the five built-in families (the demo's "
                    "recipe) that plans each misroute with its own shard and with the routed one")
    ap.add_argument("--flips", metavar="VARIANT", help="instead: the hand-written requests the default and VARIANT "
                    "route differently")
    args = ap.parse_args()
    if args.flips:
        print_flips(args.flips, [int(x) for x in args.families.split(",")])
        return
    if args.misroutes:
        explain_misroutes(bank_dir=args.bank)
        surest_sentence_table([int(x) for x in args.families.split(",")])
        return

    from skillbank.data.builtin import build_builtin_stream
    from skillbank.memory.selectors.embedding import memoize_encoders

    memoize_encoders()  # every variant embeds the same requests
    variants = args.variants.split(",")
    results = []
    for k in (int(x) for x in args.families.split(",")):
        stream = build_builtin_stream(seed=0, train_per_family=200, test_per_family=50, families=k)
        sets = builtin_sets(stream)
        print(f"\n## K = {k}: route accuracy, held-out templates (n={len(sets['templates'])}) / hand-written "
              f"development (n={len(sets['dev'])}) / frozen test (n={len(sets['test'])}, not chosen on)", flush=True)
        for variant in variants:
            router = fit(make_router(variant), stream, variant)
            acc = {part: accuracy(router, pairs) for part, pairs in sets.items()}
            results.append({"split": f"builtin K={k}", "variant": variant, **acc})
            print(f"- {variant:10s} {acc['templates']:.1%} / {acc['dev']:.1%} / {acc['test']:.1%}", flush=True)
    if args.taskbench:
        from skillbank.data.taskbench import load_taskbench
        stream = load_taskbench(args.taskbench, seed=0, train_per_family=20, test_per_family=None)
        pairs = [(r.request, key) for key in stream.family_keys for r in stream.test[key]]
        print(f"\n## TaskBench folder {args.taskbench.name!r} (20 training requests a family): route accuracy on its held-out "
              f"requests (n={len(pairs)})", flush=True)
        for variant in variants:
            acc = accuracy(fit(make_router(variant), stream, variant), pairs)
            results.append({"split": "taskbench", "variant": variant, "heldout": acc, "n": len(pairs)})
            print(f"- {variant:10s} {acc:.1%}", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
