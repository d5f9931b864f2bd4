"""Probe: route by skill, then take the skill's family. A new bank's router (embed-lda-nb) keeps one Gaussian
class and one word-count row per family; a family of many skills is several clusters in embedding space, which
one shared-covariance class per family blurs. Here the same router is fitted with one class per (family, skill):
each training request counted for every skill of its gold graph, each skill's catalog text counted for its
class. A request goes to the family of its best skill class ("max") or of the largest summed probability
("sum"). Route accuracy on template held-out, hand-written development and frozen test requests, next to the
default router, at each split.

    .venv/bin/python scripts/route_skill_classes.py 5,20,50
"""
from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from scope import DEV_IN, TEST_IN, family_of, rows  # noqa: E402

from skillbank.data.builtin import build_builtin_stream  # noqa: E402
from skillbank.experiments.routing import fit_stages  # noqa: E402
from skillbank.memory.address import make_selector  # noqa: E402
from skillbank.memory.bank import DEFAULT_ENCODER, default_address  # noqa: E402
from skillbank.memory.scope import catalog_text  # noqa: E402
from skillbank.memory.selectors.embedding import memoize_encoders  # noqa: E402

SEP = "||"


def fit_skill_router(stream, kind, params):
    sel = make_selector(kind, **params)
    for fam in stream.family_keys:
        by_skill = defaultdict(list)
        for r in stream.train[fam]:
            for skill in dict.fromkeys(r.graph.tasks):
                by_skill[skill].append(r.request)
        for skill, reqs in by_skill.items():
            sel.partial_fit(reqs, f"{fam}{SEP}{skill}")
            spec = stream.catalog.skills[skill].to_dict() if skill in stream.catalog.skills else None
            if spec is not None:
                sel.partial_fit_catalog(catalog_text([spec]), f"{fam}{SEP}{skill}")
    return sel


def main() -> None:
    memoize_encoders(True)
    kind, params = default_address(DEFAULT_ENCODER)
    for k in [int(x) for x in sys.argv[1].split(",")]:
        stream = build_builtin_stream(seed=0, train_per_family=200, test_per_family=50, families=k)
        skill_family = {}
        for key in stream.family_keys:
            for sid in stream.catalog.family(key).skills:
                skill_family[sid.split("::")[-1]] = key

        def hand(names):
            pairs = [(r["request"], family_of(r, skill_family)) for n in names for r in rows(n)]
            return [(q, f) for q, f in pairs if f is not None]

        sets = {"heldout": [(r.request, key) for key in stream.family_keys for r in stream.test[key]],
                "dev": hand(DEV_IN), "test": hand(TEST_IN)}
        default = fit_stages(make_selector(kind, **params), stream, stream.family_keys)
        skills = fit_skill_router(stream, kind, params)
        fams = [c.split(SEP)[0] for c in skills.classes_]
        owner = {f: [j for j, g in enumerate(fams) if g == f] for f in dict.fromkeys(fams)}
        line = []
        for part, pairs in sets.items():
            qs, gold = [q for q, _ in pairs], [f for _, f in pairs]
            d = np.mean([p == g for p, g in zip(default.predict(qs), gold)])
            P = skills.predict_proba(qs)
            by_max = [fams[int(np.argmax(p))] for p in P]
            by_sum = [max(owner, key=lambda f: p[owner[f]].sum()) for p in P]
            m = np.mean([p == g for p, g in zip(by_max, gold)])
            s = np.mean([p == g for p, g in zip(by_sum, gold)])
            line.append(f"{part} (n={len(pairs)}) default {d:.1%} skill-max {m:.1%} skill-sum {s:.1%}")
        print(f"K={k}: " + " | ".join(line), flush=True)


if __name__ == "__main__":
    main()
