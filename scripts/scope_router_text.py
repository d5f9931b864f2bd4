"""Probe: could the scope gate's encoder read the router's text (payloads of 6+ words masked, everything else
verbatim) instead of the value-masked prose, so that one encoder pass serves the gate and the router? AUC and
kept / refused at the gate's own threshold, both ways.

    .venv/bin/python scripts/scope_router_text.py 5,50

Measured 2026-12-04 (docs/scope.md): the same separation, but the threshold drawn from restyled training
requests refuses 17-20% at K = 50; not adopted."""
import sys, numpy as np
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "bench"))
from scope import rows, DEV_IN, DEV_OFF, TEST_IN, TEST_OFF
from skillbank.data.builtin import build_builtin_stream
from skillbank.experiments.scope import detector_for_stream
from skillbank.memory import scope as scope_mod
from skillbank.memory.values import mask_payloads
from sklearn.metrics import roc_auc_score
orig = scope_mod.ScopeDetector._texts
def shared(self, masked):
    words, _ = orig(self, masked)
    return words, [mask_payloads(m.request, 6) for m in masked]
def auc(i, o):
    i = np.nan_to_num(i, neginf=-1e9); o = np.nan_to_num(o, neginf=-1e9)
    return roc_auc_score(np.r_[np.ones(len(i)), np.zeros(len(o))], np.r_[i, o])
for k in [int(x) for x in sys.argv[1].split(",")]:
    stream = build_builtin_stream(seed=0, train_per_family=200, test_per_family=50, families=k)
    cats = np.array([r["category"] for r in rows(TEST_OFF[0])])
    for name, fn in (("values (now)", orig), ("values, encoder reads router text", shared)):
        scope_mod.ScopeDetector._texts = fn
        det = detector_for_stream(stream, reader="values", outliers=None)
        S = {n: det.score([r["request"] for r in rows(n)]).max(1) for n in DEV_IN + DEV_OFF + TEST_IN + TEST_OFF}
        thr = det.threshold_
        di = np.concatenate([S[n] for n in DEV_IN]); do = np.concatenate([S[n] for n in DEV_OFF]); ti, to = S[TEST_IN[0]], S[TEST_OFF[0]]
        print(f"K={k} {name:36s} AUC dev {auc(di,do):.3f} test {auc(ti,to):.3f} | own thr dev {np.mean(di>=thr):.1%}/{np.mean(do<thr):.1%} test {np.mean(ti>=thr):.1%}/{np.mean(to<thr):.1%} nm {np.mean(to[cats=='near_miss']<thr):.0%}", flush=True)
