"""Probe: skill prototypes made of clauses instead of whole requests. Two in three built-in training requests
use two to five skills, so a skill's prototype (the mean embedding of the requests that use it) is a blur of
other skills' text. Here each training request is cut into clauses (sentences, then connectors such as ", then",
"and also", "→"), each clause is assigned to the nodes of the gold graph whose literal values it holds, and a
skill's prototype is the mean embedding of its clauses (values masked). A request's meaning score for a family
is its best clause's best cosine ("max") or the mean over its clauses ("mean"). Prints the ROC AUC of the meaning
expert alone (in-domain vs off-domain, development and frozen test sets) next to the gate's.

    .venv/bin/python scripts/scope_clause_prototypes.py 5

Measured 2026-12-05 (docs/scope.md): in-domain cosines rise ("alarm 6:15" 0.71 -> 0.86), off-domain ones as much:
AUC 0.939 -> 0.937 (development), 0.842 -> 0.847 (test). Not adopted."""
import re, sys
from collections import defaultdict
from pathlib import Path
import numpy as np
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from scope import DEV_IN, DEV_OFF, TEST_IN, TEST_OFF, rows
from skillbank.data.builtin import build_builtin_stream
from skillbank.experiments.scope import detector_for_stream
from skillbank.memory.context import sentences
from skillbank.memory.values import mask, mask_record
from sklearn.metrics import roc_auc_score

CONN = re.compile(r"\s*(?:,\s*(?:and\s+)?(?:then|also|after that|afterwards|and|plus|on top of that|separately|when that's finished|once that's done)\b|\b(?:and then|and also|and afterwards|and after that|and on top of that|and separately|and when that's finished)\b|\s(?:→|->|;)\s)\s*", re.I)

def clauses(req):
    out = []
    for s in sentences(req):
        out += [c.strip(" ,.") for c in CONN.split(s) if c and c.strip(" ,.")]
    return out or [req]

def auc(i, o):
    return roc_auc_score(np.r_[np.ones(len(i)), np.zeros(len(o))], np.r_[i, o])

k = int(sys.argv[1])
stream = build_builtin_stream(seed=0, train_per_family=200, test_per_family=50, families=k)
det = detector_for_stream(stream, reader="values", outliers=None)
sums, counts = defaultdict(lambda: 0), defaultdict(int)
n_assigned = n_clauses = 0
for fam in stream.family_keys:
    texts, owners = [], []
    for r in stream.train[fam]:
        nodes = [(n.task, [str(a.value) for a in n.arguments if not str(a.value).startswith("<node-")]) for n in r.graph.nodes]
        allv = [v for _, vs in nodes for v in vs]
        for c in clauses(r.request):
            n_clauses += 1
            hit = [t for t, vs in nodes if any(v.lower() in c.lower() for v in vs if v)]
            if not hit: continue
            n_assigned += 1
            m = mask_record(c, allv)
            texts.append(det._texts([m])[1][0]); owners.append([(fam, t) for t in set(hit)])
    E = det._embed(texts)
    for e, ow in zip(E, owners):
        for key in ow:
            sums[key] = sums[key] + e; counts[key] += 1
print(f"clauses {n_clauses}, assigned {n_assigned}, skills {len(sums)}")
keys = list(sums)
P = np.stack([sums[kk] / np.linalg.norm(sums[kk]) for kk in keys]); owner = np.array([stream.family_keys.index(kk[0]) for kk in keys])
def fam_scores(reqs):
    out_max, out_mean = [], []
    for q in reqs:
        cs = clauses(q)
        X = det._embed(det._texts([mask(c) for c in cs])[1])
        S = X @ P.T
        per = np.stack([S[:, owner == f].max(axis=1) for f in range(len(stream.family_keys))], axis=1)  # clauses x fams
        out_max.append(per.max(axis=0).max()); out_mean.append(per.mean(axis=0).max())
    return np.array(out_max), np.array(out_mean)
sets = {n: [r["request"] for r in rows(n)] for n in DEV_IN + DEV_OFF + TEST_IN + TEST_OFF}
base = {n: det.embedding_scores(q).max(axis=1) for n, q in sets.items()}
cl = {n: fam_scores(q) for n, q in sets.items()}
for part, I, O in (("dev", DEV_IN, DEV_OFF), ("test", TEST_IN, TEST_OFF)):
    bi = np.concatenate([base[n] for n in I]); bo = np.concatenate([base[n] for n in O])
    mi = np.concatenate([cl[n][0] for n in I]); mo = np.concatenate([cl[n][0] for n in O])
    ai = np.concatenate([cl[n][1] for n in I]); ao = np.concatenate([cl[n][1] for n in O])
    print(f"K={k} {part}: meaning AUC now {auc(bi, bo):.3f} | clause prototypes, max over clauses {auc(mi, mo):.3f}, mean {auc(ai, ao):.3f}")
print("examples (dev in): ", [(q, round(float(cl['paraphrase_builtin_short'][0][j]),3), round(float(base['paraphrase_builtin_short'][j]),3)) for j, q in enumerate(sets['paraphrase_builtin_short'][:8])])
