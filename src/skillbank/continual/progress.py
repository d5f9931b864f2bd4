"""Where a run directory stands: stages finished per method and order, and what the rest should cost.

A comparison on a CPU runs for hours as several processes (``scripts/compare.sh``), each with its own
progress bar for the stage it is on. This reads only the run directory, so it answers at any time and
from another shell: how many stages each method and order finished, and an estimate of the remaining
process time from the stages already measured.

The estimate, per unfinished stage: training costs the median training time of this method's finished
stages (either order; else of every trained method's), and evaluating ``t`` tasks costs ``t`` times the
median per-task evaluation time measured the same way. Medians, because a stage slowed by other load
(or paused) should not move the estimate much. References on a frozen base only evaluate; FSM trains its
executors once for all orders. Its evaluation is mostly cached across orders too, so the estimate of its
second order (evaluation only) is an upper bound.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from skillbank.errors import SkillbankError


@dataclass
class OrderProgress:
    method: str
    order: str
    stages: int               # in the order
    evaluated: int            # stages with eval.json: finished
    trained_pending: bool     # the next stage is trained, its evaluation is not written yet
    train_seconds: list[float]
    eval_seconds_per_task: list[float]
    remaining_seconds: float | None = None   # filled by run_progress

    @property
    def done(self) -> bool:
        return self.evaluated == self.stages

    @property
    def train_median(self) -> float | None:
        return _median(self.train_seconds)

    @property
    def eval_median(self) -> float | None:
        return _median(self.eval_seconds_per_task)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise SkillbankError(f"{path}: not valid JSON ({exc})") from None


def _order_progress(odir: Path, method: str, order: str, stages: int) -> OrderProgress:
    evaluated, train_s, eval_s = 0, [], []
    while (odir / f"stage-{evaluated + 1:02d}" / "eval.json").is_file():
        evaluated += 1
        sdir = odir / f"stage-{evaluated:02d}"
        ev = _read(sdir / "eval.json")
        if ev.get("eval_seconds"):
            eval_s.append(float(ev["eval_seconds"]) / evaluated)  # stage t evaluates t tasks
        if (sdir / "train.json").is_file():
            wall = _read(sdir / "train.json").get("wall_seconds")
            if wall:
                train_s.append(float(wall))
    nxt = odir / f"stage-{evaluated + 1:02d}"
    pending = evaluated < stages and (nxt / "train.json").is_file()
    return OrderProgress(method, order, stages, evaluated, pending, train_s, eval_s)


def run_progress(run_dir: str | Path, methods: list[str] | None = None, orders: list[str] | None = None) -> list[OrderProgress]:
    """Every (method, order) of the run with its finished stages and remaining estimate. A run filled by
    one process per method (``--method``) records only the methods started so far, so the planned ones
    can be given (``methods``, ``orders``: e.g. from the comparison's config)."""
    from skillbank.continual.methods import METHODS

    out = Path(run_dir)
    if not (out / "config.json").is_file() or not (out / "run.json").is_file():
        raise SkillbankError(f"{out} is not a run directory (no config.json/run.json; start one with `skillbank run`)")
    cfg = _read(out / "config.json")
    stages = len(_read(out / "run.json")["task_labels"])
    methods = list(dict.fromkeys((methods or []) + cfg["methods"]))
    orders = list(dict.fromkeys((orders or []) + cfg["eval"]["orders"]))
    rows = [_order_progress(out / "methods" / m / o, m, o, stages) for m in methods for o in orders]

    every_train = _median([s for r in rows for s in r.train_seconds])
    every_eval = _median([s for r in rows for s in r.eval_seconds_per_task])
    first_order = {}
    for r in rows:
        first_order.setdefault(r.method, r.order)
        cls = METHODS.get(r.method)
        # an order-independent method (FSM) trains its executors once, in whichever order comes first
        trains = getattr(cls, "trains", True) and not (getattr(cls, "order_independent", False)
                                                       and r.order != first_order[r.method])
        mine = [x for q in rows if q.method == r.method for x in q.train_seconds]
        train = (_median(mine) or every_train) if trains else 0.0
        per_task = _median([x for q in rows if q.method == r.method for x in q.eval_seconds_per_task]) or every_eval
        if train is None or per_task is None:
            continue  # nothing measured yet to estimate from
        todo = range(r.evaluated + 1, r.stages + 1)
        r.remaining_seconds = sum(per_task * t for t in todo) + train * (len(todo) - (1 if r.trained_pending else 0))
    return rows
