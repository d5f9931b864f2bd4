"""Routing at scale: route accuracy and routing latency as the number of learned families K grows.

For one stream and one order, every selector learns the families stage by stage (statistics selectors
add, the offline reference refits on everything it kept), and at checkpoint prefixes (every prefix for a
small K; a geometric ladder up to K for a large one) it is scored on the held-out requests of every family
learned so far, and timed routing single requests and a batch. Stages between two checkpoints are given
to ``partial_fit`` together: for additive statistics and for refit-from-scratch references this is the
same state as stage by stage, and it keeps the offline reference from refitting K times.

Hand-written requests (e.g. the paraphrase fixture) are scored at the checkpoints where every family
their gold graphs use has been learned: a record's label is the family that owns its skills in this
stream's catalog (a record whose skills span two families of a finer split is left out, and counted).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from skillbank.data.stream import Stream
from skillbank.memory.selector import Selector


def checkpoints(k: int, every_prefix_up_to: int = 20) -> list[int]:
    """Every prefix for small K; else 1, 2, 5, 10, 20, 50, ... and K itself."""
    if k <= every_prefix_up_to:
        return list(range(1, k + 1))
    ladder, step = [], 1
    while step < k:
        ladder += [m * step for m in (1, 2, 5) if m * step < k]
        step *= 10
    return sorted(set(ladder + [k]))


@dataclass
class ScalePoint:
    k: int  # families learned so far
    accuracy: float  # held-out requests of those families, each counted once
    macro: float
    n_requests: int
    ms_per_request: float  # routing one request at a time (the service's case), median over a sample
    ms_per_request_batched: float  # routing the whole held-out set in one call, per request
    fit_seconds: float  # cumulative partial_fit time up to this point
    records_accuracy: dict[str, float] = field(default_factory=dict)  # hand-written sets, where scorable
    records_n: dict[str, int] = field(default_factory=dict)


def label_records(stream: Stream, records) -> tuple[list[tuple[str, str]], int]:
    """(request, family) for records whose skills all belong to one family of this stream; and how many
    records were left out (skills outside the catalog or across families)."""
    fam_of = stream.catalog.family_map
    # A finer split of a catalog renames its skills' family part (Builtin::t1_daily_life::get_weather becomes
    # Builtin::t1_daily_life-03::get_weather) and keeps their names: records written against the coarse
    # catalog are read through the name when it is unique.
    by_name: dict[str, list[str]] = {}
    for sid in fam_of:
        by_name.setdefault(sid.rsplit("::", 1)[-1], []).append(sid)

    def family(task: str) -> str | None:
        if task in fam_of:
            return fam_of[task]
        same = by_name.get(task.rsplit("::", 1)[-1], [])
        return fam_of[same[0]] if len(same) == 1 else None

    labelled, left_out = [], 0
    for r in records:
        fams = {family(t) for t in r.graph.tasks}
        if len(fams) == 1 and None not in fams:
            labelled.append((r.request, fams.pop()))
        else:
            left_out += 1
    return labelled, left_out


def route_scale(stream: Stream, order: Sequence[str], selectors: dict[str, Callable[[], Selector]], *,
                records: dict[str, list] | None = None, latency_sample: int = 200,
                every_prefix_up_to: int = 20, final_only: Sequence[str] = (),
                progress: Callable[[str], None] | None = None) -> dict:
    """``final_only``: selectors fitted once, on every family, and scored at the last checkpoint only (an
    offline reference that refits on every kept request is too slow to refit at every checkpoint of a
    thousand families)."""
    order = list(order)
    marks = checkpoints(len(order), every_prefix_up_to)
    labelled = {name: label_records(stream, recs) for name, recs in (records or {}).items()}
    rng = np.random.default_rng(0)
    result = {"stream": stream.name, "families": len(order), "order": order, "checkpoints": marks,
              "records_left_out": {n: lo for n, (_, lo) in labelled.items()}, "selectors": {}}
    for name, factory in selectors.items():
        selector, points, spent, done = factory(), [], 0.0, 0
        for k in (marks[-1:] if name in final_only else marks):
            chunk = order[done:k]
            requests = [r.request for fam in chunk for r in stream.train[fam]]
            labels = [fam for fam in chunk for _ in stream.train[fam]]
            if progress:
                progress(f"{name}: learning families {done + 1}-{k} of {len(order)}")
            t0 = time.perf_counter()
            selector.partial_fit(requests, labels)
            spent += time.perf_counter() - t0
            done = k
            learned = set(order[:k])
            test = [(r.request, fam) for fam in order[:k] for r in stream.test[fam]]
            if not test:
                continue
            t0 = time.perf_counter()
            predicted = selector.predict([q for q, _ in test])
            batched_ms = (time.perf_counter() - t0) * 1000 / len(test)
            sample = [test[i][0] for i in rng.choice(len(test), min(latency_sample, len(test)), replace=False)]
            singles = []
            for q in sample:
                t0 = time.perf_counter()
                selector.predict([q])
                singles.append((time.perf_counter() - t0) * 1000)
            hits = np.array([p == g for p, (_, g) in zip(predicted, test)])
            golds = np.array([g for _, g in test])
            macro = float(np.mean([hits[golds == fam].mean() for fam in order[:k] if (golds == fam).any()]))
            point = ScalePoint(k, float(hits.mean()), macro, len(test), float(np.median(singles)), batched_ms, spent)
            for set_name, (pairs, _) in labelled.items():
                scorable = [(q, g) for q, g in pairs if g in learned]
                if pairs and len(scorable) == len(pairs):  # only once every family it needs is learned
                    pred = selector.predict([q for q, _ in scorable])
                    point.records_accuracy[set_name] = float(np.mean([p == g for p, (_, g) in zip(pred, scorable)]))
                    point.records_n[set_name] = len(scorable)
            points.append(point)
        result["selectors"][name] = [asdict(p) for p in points]
    return result


def render_markdown(results: Sequence[dict]) -> str:
    lines = ["# Routing at scale", ""]
    for res in results:
        lines += [f"## {res['stream']}: K = {res['families']}", "",
                  "| selector | K learned | held-out accuracy | macro | ms / request (single) | ms / request (batch) "
                  "| fit s (cumulative) | hand-written accuracy |", "|---|---|---|---|---|---|---|---|"]
        for name, points in res["selectors"].items():
            for p in points:
                hand = ", ".join(f"{n} {a:.1%} (n={p['records_n'][n]})" for n, a in p["records_accuracy"].items())
                lines.append(f"| {name} | {p['k']} | {p['accuracy']:.1%} | {p['macro']:.1%} | "
                             f"{p['ms_per_request']:.3f} | {p['ms_per_request_batched']:.4f} | {p['fit_seconds']:.2f} | "
                             f"{hand} |")
        if any(res["records_left_out"].values()):
            lines += ["", "Hand-written records left out (skills outside the catalog or across families): "
                      + ", ".join(f"{n}: {c}" for n, c in res["records_left_out"].items())]
        lines.append("")
    return "\n".join(lines)


def plot(results: Sequence[dict], path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc_ax, lat_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for res in results:
        for name, points in res["selectors"].items():
            ks = [p["k"] for p in points]
            label = f"{name} ({res['stream']})"
            acc_ax.plot(ks, [p["accuracy"] for p in points], marker="o", ms=3, label=label)
            lat_ax.plot(ks, [p["ms_per_request"] for p in points], marker="o", ms=3, label=label)
    for ax in (acc_ax, lat_ax):
        ax.set_xscale("log")
        ax.set_xlabel("families learned (K)")
    acc_ax.set_ylabel("route accuracy (held-out)")
    acc_ax.set_ylim(0, 1.02)
    lat_ax.set_ylabel("ms per request (one at a time)")
    lat_ax.set_yscale("log")
    lat_ax.axhline(1.0, color="grey", lw=0.6, ls=":")
    acc_ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write(results: Sequence[dict], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "routing_scale.json").write_text(json.dumps(list(results), indent=1) + "\n")
    (out_dir / "routing_scale.md").write_text(render_markdown(results) + "\n")
    plot(results, out_dir / "routing_scale.png")
