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
from skillbank.experiments.provenance import write_provenance
from skillbank.experiments.routing import route_prefixes, score_prefix
from skillbank.memory.selector import Selector
from skillbank.report.route_scale import plot, render_markdown


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
        selector, points, spent = factory(), [], 0.0
        for prefix in route_prefixes(selector, stream, order, marks=marks[-1:] if name in final_only else marks,
                                     progress=progress, label=name):
            spent += prefix.fit_seconds
            if not prefix.records:
                continue
            learned = set(prefix.families)
            batched_ms = prefix.route_seconds * 1000 / len(prefix.records)
            sample = [prefix.records[i].request
                      for i in rng.choice(len(prefix.records), min(latency_sample, len(prefix.records)), replace=False)]
            singles = []
            for q in sample:
                t0 = time.perf_counter()
                selector.predict([q])
                singles.append((time.perf_counter() - t0) * 1000)
            scored = score_prefix(prefix)
            point = ScalePoint(prefix.k, scored.micro, scored.macro, len(prefix.records), float(np.median(singles)),
                               batched_ms, spent)
            for set_name, (pairs, _) in labelled.items():
                scorable = [(q, g) for q, g in pairs if g in learned]
                if pairs and len(scorable) == len(pairs):  # only once every family it needs is learned
                    pred = selector.predict([q for q, _ in scorable])
                    point.records_accuracy[set_name] = float(np.mean([p == g for p, (_, g) in zip(pred, scorable)]))
                    point.records_n[set_name] = len(scorable)
            points.append(point)
        result["selectors"][name] = [asdict(p) for p in points]
    return result



def write(results: Sequence[dict], out_dir: Path) -> None:
    """routing_scale.json, .md and .png, and provenance.json (the command and the commit), into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "routing_scale.json").write_text(json.dumps(list(results), indent=1) + "\n")
    (out_dir / "routing_scale.md").write_text(render_markdown(results) + "\n")
    plot(results, out_dir / "routing_scale.png")
    write_provenance(out_dir)
