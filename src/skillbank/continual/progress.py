"""Where a run directory stands: stages finished per method and order, and what the rest should cost.

A comparison on a CPU runs for hours as several processes (``scripts/compare.sh``), each with its own
progress bar for the stage it is on. This reads only the run directory, so it answers at any time and
from another shell: how many stages each method and order finished, and an estimate of the remaining
process time from the stages already measured.

The estimate, per unfinished stage: training costs the median training time of this method's finished
stages (either order; else of every trained method's), and evaluating ``t`` tasks costs ``t`` times the
median per-task evaluation time measured the same way. Medians, because a stage slowed by other load
(or paused) should not move the estimate much. A run continued on another machine (sittings land on different
CPUs, 2.5-3x apart on this project's) is estimated from the stages measured on the machine asking, when it has
finished any: each stage file records the machine it ran on (:func:`machine_label`); stages written before
that count as another machine. References on a frozen base only evaluate; FSM trains its
executors once for all orders. Its evaluation is mostly cached across orders too, so the estimate of its
second order (evaluation only) is an upper bound.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from skillbank.errors import SkillbankError


@lru_cache(maxsize=None)
def _cpu() -> str:
    name, flags = "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not name:
                name = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:  # not Linux
        pass
    name = name or platform.processor() or platform.machine() or "unknown CPU"
    simd = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else ""
    return f"{name}{', ' + simd if simd else ''}, {os.cpu_count()} cores"


def machine_label(device: str = "cpu") -> str:
    """The machine a stage ran on, as the stage files record it: the CPU model, its widest vector
    instructions and core count (what sets a CPU training's speed), or the GPU's name."""
    if device.startswith("cuda"):
        try:
            import torch
            return f"GPU {torch.cuda.get_device_name(torch.device(device))}"
        except Exception:  # noqa: BLE001 - a label, never worth failing a stage for
            return "GPU"
    return _cpu()


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
    train_machines: list[str | None] = field(default_factory=list)   # per train_seconds entry (None: unrecorded)
    eval_machines: list[str | None] = field(default_factory=list)
    estimated_here: bool = False             # the estimate used stages measured on the machine asking

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
    evaluated, train_s, eval_s, train_m, eval_m = 0, [], [], [], []
    while (odir / f"stage-{evaluated + 1:02d}" / "eval.json").is_file():
        evaluated += 1
        sdir = odir / f"stage-{evaluated:02d}"
        ev = _read(sdir / "eval.json")
        if ev.get("eval_seconds"):
            eval_s.append(float(ev["eval_seconds"]) / evaluated)  # stage t evaluates t tasks
            eval_m.append(ev.get("machine"))
        if (sdir / "train.json").is_file():
            tr = _read(sdir / "train.json")
            if tr.get("wall_seconds"):
                train_s.append(float(tr["wall_seconds"]))
                train_m.append(tr.get("machine"))
    nxt = odir / f"stage-{evaluated + 1:02d}"
    pending = evaluated < stages and (nxt / "train.json").is_file()
    return OrderProgress(method, order, stages, evaluated, pending, train_s, eval_s,
                         train_machines=train_m, eval_machines=eval_m)


def _estimate(samples: list[tuple[float, str | None]], here: str) -> tuple[float | None, bool]:
    """Median of the samples measured on ``here`` when there are any (True), else of all of them (False)."""
    local = [s for s, m in samples if m == here]
    return (_median(local), True) if local else (_median([s for s, _ in samples]), False)


def run_progress(run_dir: str | Path, methods: list[str] | None = None, orders: list[str] | None = None,
                 machine: str | None = None) -> list[OrderProgress]:
    """Every (method, order) of the run with its finished stages and remaining estimate. A run filled by
    one process per method (``--method``) records only the methods started so far, so the planned ones
    can be given (``methods``, ``orders``: e.g. from the comparison's config). ``machine``: the machine to
    estimate for (default: this one, :func:`machine_label`)."""
    from skillbank.continual.methods import METHODS

    out = Path(run_dir)
    if not (out / "config.json").is_file() or not (out / "run.json").is_file():
        raise SkillbankError(f"{out} is not a run directory (no config.json/run.json; start one with `skillbank exp run`)")
    cfg = _read(out / "config.json")
    stages = len(_read(out / "run.json")["task_labels"])
    methods = list(dict.fromkeys((methods or []) + cfg["methods"]))
    orders = list(dict.fromkeys((orders or []) + cfg["eval"]["orders"]))
    rows = [_order_progress(out / "methods" / m / o, m, o, stages) for m in methods for o in orders]

    here = machine or machine_label()

    def trains_of(rs):
        return [x for r in rs for x in zip(r.train_seconds, r.train_machines)]

    def evals_of(rs):
        return [x for r in rs for x in zip(r.eval_seconds_per_task, r.eval_machines)]

    every_train, every_train_here = _estimate(trains_of(rows), here)
    every_eval, every_eval_here = _estimate(evals_of(rows), here)
    first_order = {}
    for r in rows:
        first_order.setdefault(r.method, r.order)
        cls = METHODS.get(r.method)
        # an order-independent method (FSM) trains its executors once, in whichever order comes first
        saved = {**getattr(cls, "legacy_params", {}), **cfg.get("method_params", {}).get(r.method, {})}
        shared = cls is not None and cls.independent_of_order(saved)
        trains = getattr(cls, "trains", True) and not (shared and r.order != first_order[r.method])
        same = [q for q in rows if q.method == r.method]
        # this method's own stages when it has some on this machine (or none anywhere else to prefer over them)
        train, train_here = _estimate(trains_of(same), here)
        if train is None or (not train_here and every_train_here):
            train, train_here = every_train, every_train_here
        per_task, eval_here = _estimate(evals_of(same), here)
        if per_task is None or (not eval_here and every_eval_here):
            per_task, eval_here = every_eval, every_eval_here
        if not trains:
            train, train_here = 0.0, True
        r.estimated_here = train_here and eval_here
        if train is None or per_task is None:
            continue  # nothing measured yet to estimate from
        todo = range(r.evaluated + 1, r.stages + 1)
        r.remaining_seconds = sum(per_task * t for t in todo) + train * (len(todo) - (1 if r.trained_pending else 0))
    return rows
