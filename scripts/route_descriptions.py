"""Probe: the catalog's skill descriptions as a routing expert of their own, alone (zero-shot: each family's best
cosine between the request, long payloads masked, and one of its skills' catalog text) and added to a new bank's
router (log p_router + w log softmax(cos / tau)). Route accuracy on template held-out / hand-written development /
hand-written frozen test requests (bench/scope.py's sets) at K = 5, 20, 50.

    .venv/bin/python scripts/route_descriptions.py 5,20,50

Measured 2026-12-05 (docs/routing.md, results/route-variants/descriptions.txt): the descriptions alone route
72.0 / 65.5 / 58.5% of the frozen set; added to the router they leave the development sets unchanged or one
request down at every tau and w tried. Not adopted (nothing is chosen on the frozen set)."""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from route_variants import builtin_sets  # noqa: E402  (bench/scope.py's sets, as the other router probes read them)
from skillbank.data.builtin import build_builtin_stream
from skillbank.experiments.routing import fit_stages
from skillbank.memory.address import make_selector
from skillbank.memory.bank import default_address
from skillbank.memory.scope import family_catalog_text
from skillbank.memory.selectors.embedding import get_encoder, memoize_encoders
from skillbank.memory.values import mask_payloads
memoize_encoders(True)
enc = get_encoder("minilm-int8")
for k in [int(x) for x in sys.argv[1].split(",")]:
    stream = build_builtin_stream(seed=0, train_per_family=200, test_per_family=50, families=k)
    keys = stream.family_keys
    sets = builtin_sets(stream)
    kind, params = default_address("minilm-int8")
    router = fit_stages(make_selector(kind, **params), stream, keys)
    docs, owner = [], []
    for i, key in enumerate(keys):
        d = family_catalog_text(stream.catalog, key); docs += d; owner += [i] * len(d)
    D = enc.encode(docs); D = D / np.linalg.norm(D, axis=1, keepdims=True); owner = np.array(owner)
    classes = list(router.classes_) if hasattr(router, "classes_") else keys
    perm = [keys.index(c) for c in classes]
    print(f"K={k} router classes == keys order: {classes == keys}")
    res = {}
    for part, pairs in sets.items():
        qs = [q for q, _ in pairs]; y = np.array([classes.index(f) for _, f in pairs])
        P = router.predict_proba(qs)
        E = enc.encode([mask_payloads(q, 6) for q in qs]); E = E / np.linalg.norm(E, axis=1, keepdims=True)
        S = E @ D.T
        fam = np.full((len(qs), len(keys)), -1.0)
        for i in range(len(keys)):
            fam[:, i] = S[:, owner == i].max(1)
        fam = fam[:, perm]
        res[part] = (P, fam, y)
        print(f"  {part}: router {np.mean(P.argmax(1)==y):.1%}  desc-only {np.mean(fam.argmax(1)==y):.1%}")
    for tau in (0.02, 0.05, 0.1):
        for w in (0.25, 0.5, 1.0):
            acc = {}
            for part, (P, fam, y) in res.items():
                L = np.log(np.clip(P, 1e-12, 1)) + w * (fam / tau - np.log(np.exp(fam / tau).sum(1, keepdims=True)))
                acc[part] = np.mean(L.argmax(1) == y)
            print(f"  tau {tau} w {w}: " + " / ".join(f"{acc[p]:.1%}" for p in ("templates", "dev", "test")))
