"""The scope gate and the router on requests as people write them: every figure of the scope issue, in one run.

For each split (K = 5 built-in families, and the 20- and 50-family splits of the same catalog) it fits the
statistics a bank learning the stream would hold (training requests, gold values, catalog; no shard is
trained) with four gates: ``raw`` (the request whole, what banks made before the value reader hold),
``values`` (argument values masked, threshold calibrated on restyled training requests), ``outliers-one``
(``values`` plus one discriminant against the shipped outlier corpus, threshold set on that corpus) and
``outliers`` (a new bank's: one discriminant per category of the corpus, a request scored by the likest).
Then it prints, on the hand-written sets:

- in-domain kept and off-domain refused at the detector's own threshold (development sets: the older
  ``paraphrase_builtin*`` / ``offdomain*`` fixtures; frozen test sets: ``users_indomain`` /
  ``users_offdomain``, written blind to the design, on which nothing was chosen), refusal per off-domain
  category (near misses among them);
- route accuracy on the held-out template requests and on the hand-written in-domain requests
  (development and frozen test apart) of a new bank's router (``embed-lda-nb`` reading past payloads of 6+
  words) and of FSM's lexical Address Memory (``hashing-nb``, the paper's and the harness's);
- the time of scope plus routing per request with a new bank's router, encoder included (one request at a
  time);
- the trade-off curve (in-domain kept vs off-domain refused, the operating point marked), drawn to
  ``--out``/scope-K.png with the numbers in ``--out``/scope.json.

    .venv/bin/python bench/scope.py --out results/scope            # K = 5, 20, 50 (a few minutes)
    .venv/bin/python bench/scope.py --families 5 --readers values  # one split, one reader
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from skillbank.data.builtin import build_builtin_stream
from skillbank.experiments.routing import fit_stages
from skillbank.experiments.scope import detector_for_stream
from skillbank.memory.address import HashingNBAddress, make_selector
from skillbank.memory.bank import DEFAULT_ENCODER, default_address

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
DEV_IN = ["paraphrase_builtin", "paraphrase_builtin_holdout", "paraphrase_builtin_short"]
DEV_OFF = ["offdomain", "offdomain_holdout", "offdomain_short", "offdomain_injection"]
TEST_IN, TEST_OFF = ["users_indomain"], ["users_offdomain"]
#: The gates compared, by name: ScopeDetector settings.
GATES = {"raw": {"reader": "raw"}, "values": {"reader": "values", "outliers": None},
         "outliers-one": {"reader": "values", "outliers": "builtin", "outlier_categories": False},
         "outliers": {"reader": "values", "outliers": "builtin"}}


def rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / f"{name}.jsonl").read_text().splitlines() if line.strip()]


def family_of(record: dict, skill_family: dict[str, str]) -> str | None:
    """The split family that holds every skill of a hand-written record (None when its skills span several)."""
    fams = {skill_family.get(n["task"].split("::")[-1]) for n in record["graph"]["task_nodes"]}
    return fams.pop() if len(fams) == 1 else None


def gate_figures(det) -> str:
    """One line of a scope detector's figures on the hand-written sets, for the probes in scripts/ that vary
    the gate: ROC AUC (development / frozen test), kept / refused at its own threshold on the development sets
    (the short ones apart), then on the frozen test sets with the near misses apart."""
    def auc(i, o):
        return curve_points(i, o)["auc"]

    thr = det.threshold_
    score = {n: det.score([r["request"] for r in rows(n)]).max(axis=1) for n in DEV_IN + DEV_OFF + TEST_IN + TEST_OFF}
    di, do = np.concatenate([score[n] for n in DEV_IN]), np.concatenate([score[n] for n in DEV_OFF])
    ti, to = score[TEST_IN[0]], score[TEST_OFF[0]]
    near = np.array([r["category"] == "near_miss" for r in rows(TEST_OFF[0])])
    return (f"AUC dev {auc(di, do):.3f} test {auc(ti, to):.3f} | dev kept {np.mean(di >= thr):.1%} refused "
            f"{np.mean(do < thr):.1%} (short kept {np.mean(score['paraphrase_builtin_short'] >= thr):.0%}) | TEST kept "
            f"{np.mean(ti >= thr):.1%} refused {np.mean(to < thr):.1%} near misses {np.mean(to[near] < thr):.0%}")


def curve_points(s_in: np.ndarray, s_off: np.ndarray) -> dict:
    """Two points of the trade-off curve, at thresholds read off the evaluation set itself (what a threshold
    could reach, not what the gate's own does): in-domain kept where at least 95% of off-domain is refused,
    off-domain refused where at least 97% of in-domain is kept; and the ROC AUC."""
    from sklearn.metrics import roc_auc_score
    s_in, s_off = np.nan_to_num(s_in, neginf=-1e9), np.nan_to_num(s_off, neginf=-1e9)
    auc = roc_auc_score(np.r_[np.ones(len(s_in)), np.zeros(len(s_off))], np.r_[s_in, s_off])
    refuse_95 = np.quantile(s_off, 0.95, method="higher")
    keep_97 = np.quantile(s_in, 0.03, method="lower")
    return {"auc": float(auc), "kept_at_95_refused": float(np.mean(s_in > refuse_95)),
            "refused_at_97_kept": float(np.mean(s_off < keep_97))}


def rates(scores: np.ndarray, threshold: float) -> float:
    return float((scores >= threshold).mean()) if len(scores) else float("nan")


def refused_by_category(records: list[dict], scores: np.ndarray, threshold: float) -> dict[str, float]:
    """Share of each category's off-domain requests the threshold refuses."""
    cats = np.array([r["category"] for r in records])
    return {c: 1 - rates(np.asarray(scores)[cats == c], threshold) for c in sorted(set(cats))}


def time_per_request(det, router, requests: list[str]) -> tuple[float, float]:
    """Milliseconds a request of the scope check and of routing, one request at a time, scope then routing, as
    a plan does (after five untimed ones: ONNX Runtime's first calls allocate)."""
    for q in requests[:5]:
        det.decision_function([q])
        router.predict_proba([q])
    scope_s = route_s = 0.0
    for q in requests:
        t0 = time.perf_counter()
        det.decision_function([q])
        t1 = time.perf_counter()
        router.predict_proba([q])
        scope_s, route_s = scope_s + t1 - t0, route_s + time.perf_counter() - t1
    return scope_s * 1000 / len(requests), route_s * 1000 / len(requests)


def run_split(k: int, readers: list[str], out: Path | None, encoder: str = DEFAULT_ENCODER) -> dict:
    stream = build_builtin_stream(seed=0, train_per_family=200, test_per_family=50, families=k)
    # hand-written records name the five big families; a split's family is the one holding their skills
    skill_family = {}
    for key in stream.family_keys:
        for sid in stream.catalog.family(key).skills:
            skill_family[sid.split("::")[-1]] = key
    ins = {n: [r for r in rows(n)] for n in DEV_IN + TEST_IN}
    offs = {n: rows(n) for n in DEV_OFF + TEST_OFF}
    held = [(r.request, key) for key in stream.family_keys for r in stream.test[key]]

    def hand_written(names):
        pairs = [(r["request"], family_of(r, skill_family)) for n in names for r in ins[n]]
        return [(q, f) for q, f in pairs if f is not None]

    sets = {"heldout": held, "dev": hand_written(DEV_IN), "test": hand_written(TEST_IN)}
    kind, params = default_address(encoder)
    routers = {"hashing-nb": fit_stages(HashingNBAddress(), stream, stream.family_keys),
               "default": fit_stages(make_selector(kind, **params), stream, stream.family_keys)}
    result = {"families": k, "encoder": encoder, "route": {}, "readers": {}}
    print(f"\n## K = {k}: route accuracy, held-out templates (n={len(held)}) / hand-written development "
          f"(n={len(sets['dev'])}) / hand-written frozen test (n={len(sets['test'])})")
    for name, sel in routers.items():
        acc = {part: float(np.mean([p == f for p, (_, f) in zip(sel.predict([q for q, _ in pairs]), pairs)]))
               for part, pairs in sets.items()}
        result["route"][name] = {**acc, **{f"n_{part}": len(pairs) for part, pairs in sets.items()}}
        label = "FSM's Address Memory (hashing-nb)" if name == "hashing-nb" else f"a new bank's router ({kind} {params})"
        print(f"- {label}: {acc['heldout']:.1%} / {acc['dev']:.1%} / {acc['test']:.1%}")
    router = routers["default"]

    for reader in readers:
        t0 = time.perf_counter()
        det = detector_for_stream(stream, encoder=encoder, **GATES[reader])
        fit_s = time.perf_counter() - t0
        thr = det.threshold_
        score = {n: det.score([r["request"] for r in rs]).max(axis=1) for n, rs in {**ins, **offs}.items()}
        held_scores = det.score([r for r, _ in held[::5]]).max(axis=1)
        per_request_ms = sum(time_per_request(det, router, [r["request"] for r in ins["users_indomain"][:40]]))
        entry = {"threshold": thr, "fit_seconds": fit_s, "ms_per_request": per_request_ms,
                 "heldout_kept": rates(held_scores, thr), "kept": {}, "refused": {}, "refused_by_category": {}}
        for n in DEV_IN + TEST_IN:
            entry["kept"][n] = rates(score[n], thr)
        for n in DEV_OFF + TEST_OFF:
            entry["refused"][n] = 1 - rates(score[n], thr)
            entry["refused_by_category"][n] = refused_by_category(offs[n], score[n], thr)
        dev_in = np.concatenate([score[n] for n in DEV_IN])
        dev_off = np.concatenate([score[n] for n in DEV_OFF])
        test_in, test_off = score["users_indomain"], score["users_offdomain"]
        entry["dev"] = {"kept": rates(dev_in, thr), "refused": 1 - rates(dev_off, thr)}
        entry["test"] = {"kept": rates(test_in, thr), "refused": 1 - rates(test_off, thr)}
        every = np.concatenate([dev_in, dev_off, test_in, test_off])
        # a request with no evidence at all scores -inf (refused at any threshold): no grid point between two
        grid = np.quantile(every[np.isfinite(every)], np.linspace(0.01, 0.99, 99))
        entry["curve"] = {"thresholds": grid.tolist(),
                          "test_kept": [rates(test_in, t) for t in grid],
                          "test_refused": [1 - rates(test_off, t) for t in grid],
                          "dev_kept": [rates(dev_in, t) for t in grid],
                          "dev_refused": [1 - rates(dev_off, t) for t in grid]}
        entry["test_curve_points"] = curve_points(test_in, test_off)
        entry["dev_curve_points"] = curve_points(dev_in, dev_off)
        result["readers"][reader] = entry
        print(f"### reader {reader}: threshold {thr:.2f}, fit {fit_s:.1f} s, scope + routing "
              f"{per_request_ms:.1f} ms / request")
        print(f"- held-out templates kept {entry['heldout_kept']:.1%}")
        for part in ("dev", "test"):
            p = entry[f"{part}_curve_points"]
            print(f"- {part} curve: AUC {p['auc']:.3f}, kept {p['kept_at_95_refused']:.1%} where 95% is refused, "
                  f"refused {p['refused_at_97_kept']:.1%} where 97% is kept")
        entry["dev"]["refused_by_category"] = refused_by_category([r for n in DEV_OFF for r in offs[n]], dev_off, thr)
        print(f"- development: in-domain kept {entry['dev']['kept']:.1%}, off-domain refused {entry['dev']['refused']:.1%}"
              "; by category: " + ", ".join(f"{c} {v:.0%}" for c, v in entry["dev"]["refused_by_category"].items()))
        print(f"- FROZEN TEST: in-domain kept {entry['test']['kept']:.1%}, off-domain refused "
              f"{entry['test']['refused']:.1%}; by category: " + ", ".join(
                  f"{c} {v:.0%}" for c, v in entry["refused_by_category"]["users_offdomain"].items()))
    if out is not None:
        plot(result, out / f"scope-k{k}.png")
    return result


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    for reader, e in result["readers"].items():
        c = e["curve"]
        for part, ls in (("test", "-"), ("dev", ":")):
            line, = ax.plot(c[f"{part}_refused"], c[f"{part}_kept"], ls, label=f"{reader}, {part}")
            ax.plot([e[part]["refused"]], [e[part]["kept"]], "o", color=line.get_color())
    ax.axhline(0.97, color="grey", lw=0.6, ls="--")
    ax.axvline(0.95, color="grey", lw=0.6, ls="--")
    ax.set_xlabel("off-domain refused")
    ax.set_ylabel("in-domain kept")
    ax.set_xlim(0, 1.01)
    ax.set_ylim(0, 1.01)
    ax.set_title(f"Scope gate, K = {result['families']} (dot: operating point; dashed: the goal)")
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default="5,20,50", help="comma-separated splits of the built-in catalog")
    ap.add_argument("--readers", default=",".join(GATES), help="comma-separated: " + ", ".join(GATES))
    ap.add_argument("--out", type=Path, help="write scope.json and one plot per split here")
    ap.add_argument("--encoder", default=DEFAULT_ENCODER, help="sentence encoder of the gate and the router: "
                    f"{DEFAULT_ENCODER} (a new bank's), minilm, or a local encoder directory")
    args = ap.parse_args()
    import torch
    print(f"torch threads {torch.get_num_threads()}; figures on this machine, in this run")
    results = [run_split(int(k), args.readers.split(","), args.out, args.encoder) for k in args.families.split(",")]
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "scope.json").write_text(json.dumps(results, indent=1) + "\n")
        print(f"\nwrote {args.out}/scope.json and the plots")


if __name__ == "__main__":
    main()
