"""Fair baselines: every method's own hyperparameters screened the same way, on validation data only.

A sweep config (``configs/sweep.toml``) is a run config (the shared recipe: stream, base, [train], ...) plus
``[sweep]`` (:class:`skillbank.config.SweepSettings`): the orders whose first ``stages`` families make one
*screen* each (default: the first transition of O1 and of O2, i.e. ``T1,T2`` and ``T3,T1``) and a grid of
points per method. A grid point sets some of the method's parameters and, under ``train.``, some [train]
fields (the learning rate).

Every screen is evaluated on the **validation split** (``[stream] validation_per_family``, carved out of the
training requests, never a held-out request): the sweep forces ``[eval] split = "validation"`` and refuses a
config without a split. The selection rule is fixed before anything runs (:data:`SELECTION_RULE`) and
printed with the plan.

On disk (``SWEEP_DIR``)::

    points/<method>/<point>/    one ordinary run directory per grid point (skillbank.continual.runner), its
                                orders the screens: resumable stage by stage like any run
    sweep.json                  every point: its settings, per-screen accuracy matrices, diagonal EM, the
                                first family's EM after the last stage, the score, which one was selected
    sweep.md, sweep-curves.png  the report (skillbank.report.sweep)
    shared-stages/              stages trained once for every point that trains them the same way (the
                                first stage of SFT, Replay, LwF and EWC at one learning rate:
                                skillbank.continual.stage_cache)

A killed sweep continues where it stopped when run again: finished points are read back, not rerun, and an
unfinished point resumes from its last finished stage. Several processes may run one sweep directory at once
(e.g. one per core with one torch thread each): a process holds a point's claim while it runs it, and the
others skip that point, so they split the grid between them whatever methods they were given.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from skillbank.config import ConfigError, RunConfig, SweepConfig
from skillbank.errors import StreamError
from skillbank.metrics import AccuracyMatrix, task_macro

Say = Callable[[str], None]

SELECTION_RULE = ("score = validation graph EM averaged over the families seen after the last stage of a screen "
                  "(task macro), then over the screens; each method's selected point is the one with the highest "
                  "score as printed (percent, 2 decimals); ties: the first in grid order")
#: CPU cost of one training request for one epoch, evaluation included: the five-family demo (1,000 requests x
#: 3 epochs, constrained evaluation of its 50 held-out requests per seen family) took ~35 min on the 2-core CPU.
SECONDS_PER_REQUEST_EPOCH = 0.7


@dataclass(frozen=True)
class GridPoint:
    """One setting of one method: ``params`` (its own parameters set by the grid) and ``train`` ([train]
    overrides). ``index`` is its position in the method's grid (ties go to the lower)."""
    method: str
    index: int
    params: dict
    train: dict

    @property
    def settings(self) -> dict:
        return {**self.params, **{f"train.{k}": v for k, v in self.train.items()}}

    @property
    def ident(self) -> str:
        return f"{self.method}/{self.key}"

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={_show(v)}" for k, v in self.settings.items()) or "defaults"

    @property
    def key(self) -> str:
        """Its directory name: readable settings plus a digest of them (unique, stable across grid edits)."""
        digest = hashlib.sha1(json.dumps([self.params, self.train], sort_keys=True).encode()).hexdigest()[:8]
        slug = ",".join(f"{k.removeprefix('train.')}={_show(v)}" for k, v in self.settings.items()) or "defaults"
        slug = re.sub(r"[^A-Za-z0-9._=,+-]", "_", slug)[:80]
        return f"{slug}-{digest}"


def _show(v) -> str:
    if isinstance(v, (list, tuple)):
        return "+".join(_show(x) for x in v)
    if isinstance(v, float):
        return f"{v:g}"
    return str(v).lower() if isinstance(v, bool) else str(v)


# -- the grid ------------------------------------------------------------------------------------------
def _list_valued_params(cls) -> set[str]:
    out = set()
    for name, f in cls.Params.model_fields.items():
        if "list" in str(f.annotation).lower() or "tuple" in str(f.annotation).lower():
            out.add(name)
    return out


def _train_fields() -> tuple[set[str], set[str]]:
    from skillbank.train.executor import TrainConfig
    fields = set(TrainConfig.__dataclass_fields__)
    default = TrainConfig()
    return fields, {f for f in fields if isinstance(getattr(default, f), (list, tuple))}


def _axes(block: dict, list_valued: set[str], where: str) -> list[tuple[str, list]]:
    axes = []
    for name, value in block.items():
        if isinstance(value, list) and (name not in list_valued or (value and all(isinstance(x, list) for x in value))):
            if not value:
                raise ConfigError(f"{where} {name}: an empty list of values")
            axes.append((name, value))
        else:
            axes.append((name, [value]))  # one fixed value
    return axes


def expand_grid(cfg: SweepConfig) -> list[GridPoint]:
    """Every grid point, methods in the grid's order, each method's points in grid order. Unknown methods,
    unknown parameter or [train] names, bad values and duplicate points are :class:`ConfigError`s naming the
    grid entry: all checked here, before anything trains."""
    from skillbank.method_registry import UnknownMethodError, method_class
    train_fields, train_lists = _train_fields()
    points: list[GridPoint] = []
    for method, blocks in cfg.sweep.grid.items():
        where = f"[sweep.grid.{method}]"
        try:
            cls = method_class(method)
        except UnknownMethodError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        known = set(cls.Params.model_fields)
        list_valued = _list_valued_params(cls)
        seen: dict[str, int] = {}
        index = 0
        for block in blocks:
            if not isinstance(block, dict) or not block:
                raise ConfigError(f"{where}: a grid block must be a non-empty table of parameter = values")
            block = dict(block)
            train_block = block.pop("train", {})
            if not isinstance(train_block, dict):
                raise ConfigError(f"{where} train: must be a table of [train] fields (train.lr = [...])")
            unknown = sorted(set(block) - known)
            if unknown:
                raise ConfigError(f"{where}: unknown parameter(s) {unknown} of method {method!r} "
                                  f"(its parameters: {sorted(known) or 'none'}; [train] fields go under train., "
                                  f"e.g. train.lr = [2e-3, 5e-4])")
            unknown = sorted(set(train_block) - train_fields)
            if unknown:
                raise ConfigError(f"{where}: unknown [train] field(s) {['train.' + u for u in unknown]}")
            p_axes = _axes(block, list_valued, where)
            t_axes = _axes(train_block, train_lists, f"{where} train.")
            names = [n for n, _ in p_axes] + [("train", n) for n, _ in t_axes]
            for combo in itertools.product(*[vals for _, vals in p_axes + t_axes]):
                params, train = {}, {}
                for name, value in zip(names, combo):
                    if isinstance(name, tuple):
                        train[name[1]] = value
                    else:
                        params[name] = value
                point = GridPoint(method, index, params, train)
                if point.key in seen:
                    raise ConfigError(f"{where}: the point {point.label} is listed twice")
                seen[point.key] = index
                point_config(cfg, point, ["O1"])  # every value checked now, not hours later
                points.append(point)
                index += 1
        if not index:
            raise ConfigError(f"{where}: no grid points")
    return points


def point_config(cfg: SweepConfig, point: GridPoint, orders: list[str]) -> RunConfig:
    """The run configuration of one grid point: the sweep's recipe with the point's settings, its screens as
    orders, evaluated on the validation split."""
    base = cfg.run
    raw = base.model_dump()
    raw["name"] = f"sweep-{point.method}-{point.key}"
    raw["methods"] = [point.method]
    raw["method_params"] = {point.method: {**base.method_params.get(point.method, {}), **point.params}}
    raw["train"] = {**base.train, **point.train}
    raw["eval"] = {**raw["eval"], "orders": list(orders), "split": "validation"}
    try:
        return RunConfig.from_dict(raw, where=f"[sweep.grid.{point.method}] point {point.label}")
    except ConfigError as exc:
        raise ConfigError(str(exc)) from None


# -- the plan ------------------------------------------------------------------------------------------
@dataclass
class SweepPlan:
    points: list[GridPoint]
    screens: list[str]                 # order names of the screens, e.g. ["T1,T2", "T3,T1"]
    screen_of: dict[str, str]          # the configured order each screen comes from
    request_epochs: dict[str, float]   # method/point key -> training request-epochs over its screens
    stages: int = 2
    families: dict[str, dict] = field(default_factory=dict)  # label -> train/validation sizes

    @property
    def seconds(self) -> float:
        return SECONDS_PER_REQUEST_EPOCH * sum(self.request_epochs.values())

    def describe(self, measured: dict | None = None) -> str:
        """The plan and its cost; with ``measured`` (:func:`measured_cost` of a sweep directory) also the cost at
        the rate this sweep's own finished stages ran at, which depends on the machine and dtype (bfloat16 on
        an AVX-512 CPU is ~2x faster per request than float32 on an AVX2 one)."""
        n = len(self.points)
        text = (f"{n} grid points x {len(self.screens)} screens ({', '.join(self.screens)}) = {n * len(self.screens)} "
                f"{self.stages}-stage runs, {sum(self.request_epochs.values()):,.0f} training request-epochs: "
                f"about {self.seconds / 3600:.1f} CPU hours at {SECONDS_PER_REQUEST_EPOCH} s per request-epoch")
        rate = (measured or {}).get("seconds_per_request_epoch")
        if rate:
            text += (f"; about {rate * sum(self.request_epochs.values()) / 3600:.1f} process hours at the {rate} s per "
                     f"request-epoch measured on this sweep's {measured['trainings']} finished trainings")
        return text


def plan_sweep(cfg: SweepConfig, stream=None) -> SweepPlan:
    """Check the whole sweep (grid, validation split, orders) and work out what it will train."""
    from skillbank.run_dir import build_run_stream
    if not cfg.run.stream.has_validation:
        raise ConfigError("a sweep selects on validation data: set [stream] validation_per_family (or "
                          "validation_fraction) so a validation split is carved out of the training requests")
    points = expand_grid(cfg)
    stream = stream if stream is not None else build_run_stream(cfg.run)
    screens, screen_of = [], {}
    for name in cfg.sweep.orders:
        try:
            keys = stream.order(name)
        except StreamError as exc:
            raise ConfigError(f"[sweep] orders: {exc}") from None
        if len(keys) < cfg.sweep.stages:
            raise ConfigError(f"[sweep] order {name} has {len(keys)} families, fewer than stages = {cfg.sweep.stages}")
        screen = ",".join(stream.task_label(k) for k in keys[:cfg.sweep.stages])
        if screen not in screen_of:
            screens.append(screen)
            screen_of[screen] = name
    from skillbank.method_registry import method_class
    epochs = {}
    shared_first: set[tuple] = set()  # first stages trained once for a group of methods (stage_cache)
    for p in points:
        pcfg = point_config(cfg, p, screens)
        tc, params = pcfg.train_config(), pcfg.method_params_for(p.method)
        cls = method_class(p.method)
        first = cls.first_stage_recipe(tc, params)
        total = 0.0
        for screen in screens:
            keys = stream.order(screen)
            for t, fam in enumerate(keys):
                if t == 0 and first is not None:
                    shared = (cls.first_stage_group, screen, json.dumps(first.to_dict(), sort_keys=True, default=str))
                    if shared in shared_first:
                        continue
                    shared_first.add(shared)
                n = len(stream.train[fam]) + _replay_extra(p.method, params, [len(stream.train[k]) for k in keys[:t]])
                total += n * tc.epochs
        epochs[p.ident] = total
    fams = {stream.task_label(k): {"train": len(stream.train[k]), "validation": len(stream.validation.get(k, []))}
            for k in stream.family_keys}
    return SweepPlan(points, screens, screen_of, epochs, cfg.sweep.stages, fams)


def _replay_extra(method: str, params, earlier: list[int]) -> int:
    """Replay's buffer trains along with the stage: its size from the earlier stages (estimate only)."""
    if method != "replay":
        return 0
    from skillbank.continual.methods.sequential import DEFAULT_PER_STAGE, ReplayBuffer
    per_stage, fraction = getattr(params, "per_stage", None), getattr(params, "fraction", None)
    buffer = ReplayBuffer(None if fraction is not None else (per_stage or DEFAULT_PER_STAGE), fraction=fraction)
    return sum(buffer.quota(n) for n in earlier)  # the buffer's own rounding, so the estimate matches the run


# -- running ---------------------------------------------------------------------------------------
def point_dir(out: Path, point: GridPoint) -> Path:
    return out / "points" / point.method / point.key


def point_finished(out: Path, point: GridPoint, screens: list[str], stages: int) -> bool:
    d = point_dir(out, point) / "methods" / point.method
    return all((d / s / f"stage-{stages:02d}" / "eval.json").is_file() for s in screens)


def run_sweep(cfg: SweepConfig, out_dir: str | Path, *, say: Say | None = None, progress: bool = True,
              methods: list[str] | None = None) -> dict:
    """Run (or resume) every grid point's screens, then score, select and write sweep.json and the report.

    ``methods``: run only these methods' points, in this order (the others are read back where finished).
    Several processes can share one sweep directory, e.g. two one-thread processes on a 2-core CPU: each
    skips the points another holds (:func:`point_claim`) and comes back to them at the end, so processes
    given the same methods split those methods' points. sweep.json and the report always cover every
    finished point."""
    from skillbank.continual import runner
    out = Path(out_dir)
    plan = plan_sweep(cfg)
    todo = plan.points
    if methods:
        grid_methods = {p.method for p in plan.points}
        unknown = sorted(set(methods) - grid_methods)
        if unknown:
            raise ConfigError(f"--method {', '.join(unknown)}: not in this sweep's grid "
                              f"({', '.join(sorted(grid_methods))})")
        todo = [p for m in dict.fromkeys(methods) for p in plan.points if p.method == m]
    if say:
        say(f"sweep: {plan.describe(measured_cost(out, plan, cfg.sweep.stages))}")
        say(f"selection rule (fixed before running): {SELECTION_RULE}")
        if methods:
            say(f"this process runs the points of {', '.join(dict.fromkeys(methods))} ({len(todo)} of {len(plan.points)})")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    def run_point(i: int, p: GridPoint) -> None:
        pdir = point_dir(out, p)
        if point_finished(out, p, plan.screens, cfg.sweep.stages):
            try:  # read back only what this configuration would have produced
                runner.check_same_config(pdir, json.loads((pdir / "config.json").read_text()),
                                         point_config(cfg, p, plan.screens).resolved())
            except ConfigError as exc:
                raise ConfigError(f"{exc} (sweep: use another --out, or delete {pdir} to redo this point)") from None
            if say:
                say(f"[{i}/{len(todo)}] {p.method} {p.label}: finished earlier, read back")
            return
        if say:  # at the rate the sweep's finished trainings ran, as of now
            rate = measured_cost(out, plan, cfg.sweep.stages)["seconds_per_request_epoch"] or SECONDS_PER_REQUEST_EPOCH
            left = sum(plan.request_epochs[q.ident] for q in todo
                       if not point_finished(out, q, plan.screens, cfg.sweep.stages)) * rate
            say(f"[{i}/{len(todo)}] {p.method} {p.label}: running (by the estimate about {left / 3600:.1f} process "
                f"hours left in this process's unfinished points, at {rate:.3g} s per request-epoch; processes "
                f"sharing the directory split them)")
        try:
            runner.run(point_config(cfg, p, plan.screens), pdir, say=say, progress=progress, report=False,
                       stage_cache=out / "shared-stages")
        except ConfigError as exc:
            raise ConfigError(f"{exc} (sweep: use another --out, or delete {pdir} to redo this point)") from None
        write_sweep_json(out, collect_sweep(cfg, out, plan))  # a killed sweep still leaves what it finished

    # Processes sharing the directory split the points between them: each runs the points no other process
    # holds, then waits for the ones it skipped and runs any whose process died before finishing them.
    skipped = []
    for i, p in enumerate(todo, 1):
        with point_claim(point_dir(out, p), wait=False) as mine:
            if mine:
                run_point(i, p)
                continue
        if say:
            say(f"[{i}/{len(todo)}] {p.method} {p.label}: another process is running it; back to it at the end")
        skipped.append((i, p))
    for i, p in skipped:
        with point_claim(point_dir(out, p), wait=True):
            run_point(i, p)
    record = collect_sweep(cfg, out, plan)
    record["timing"] = {"wall_seconds_this_run": round(time.perf_counter() - t0, 1)}
    write_sweep_json(out, record)
    from skillbank.report.sweep import write_sweep_report
    write_sweep_report(record, out)
    return record


@contextmanager
def point_claim(pdir: Path, *, wait: bool) -> Iterator[bool]:
    """Hold the grid point's claim (a lock on ``<point>/.claim``, released by the kernel if the process
    dies) while running it. Yields False, without waiting, when another process holds it and ``wait`` is
    False."""
    from skillbank.continual.runner import file_lock
    pdir.mkdir(parents=True, exist_ok=True)
    with file_lock(pdir / ".claim", wait=wait) as held:
        yield held


def write_sweep_json(out: Path, record: dict) -> Path:
    path = out / "sweep.json"
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # processes sharing the directory each write whole files
    tmp.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path


# -- scoring and selection ---------------------------------------------------------------------------
def point_metrics(odirs: dict[str, Path], method: str, stages: int) -> dict | None:
    """Metrics of one point from its screens' stage files; None until every screen finished."""
    from skillbank.run_dir import stage_dir
    per_screen = {}
    for screen, odir in odirs.items():
        evs = []
        for t in range(1, stages + 1):
            path = stage_dir(odir, t) / "eval.json"
            if not path.is_file():
                return None
            evs.append(json.loads(path.read_text()))
        order = evs[0]["order"][:stages]
        variant = method if method in evs[-1]["variants"] else next(iter(evs[-1]["variants"]))
        em = AccuracyMatrix(order)
        for t, ev in enumerate(evs, 1):
            for k, m in ev["variants"][variant]["tasks"].items():
                em.set(t, k, m["graph_em"])
        last = evs[-1]["variants"][variant]["tasks"]
        per_screen[screen] = {"variant": variant, "em": em.to_dict(), "families": order,
                              "diagonal_em": task_macro(em.diagonal().values()),
                              "retained_first_em": em.cells[stages - 1][0],
                              "seen_em": em.macro(stages),
                              "seen_n": {k: last[k].get("n") for k in order if k in last},
                              "split": evs[-1].get("split", "test")}
    if any(s["split"] != "validation" for s in per_screen.values()):
        raise ConfigError("a sweep point was evaluated on the test split; sweeps select on validation data only")
    mean = lambda key: sum(s[key] for s in per_screen.values()) / len(per_screen)  # noqa: E731
    return {"screens": per_screen, "diagonal_em": mean("diagonal_em"), "retained_first_em": mean("retained_first_em"),
            "score": round(100 * mean("seen_em"), 2), "score_se": score_standard_error(per_screen, stages)}


def score_standard_error(per_screen: dict, stages: int) -> float | None:
    """Standard error of the score (percent) from the validation set's size: each cell of the last stage is
    an EM over ``n`` requests (binomial variance p(1-p)/n), averaged over the seen families and then over the
    screens. The cells are treated as independent; they are not quite (the screens share a family's validation
    requests), so this is a guide to which differences a screen this size can resolve, not a test."""
    var = 0.0
    for s in per_screen.values():
        row = s["em"]["cells"][stages - 1]
        ns = [s.get("seen_n", {}).get(k) for k in s["families"]]
        if not ns or any(not n for n in ns):
            return None  # eval files without request counts
        var += sum(p * (1 - p) / n for p, n in zip(row, ns)) / len(ns) ** 2
    return round(100 * math.sqrt(var) / len(per_screen), 2)


def collect_sweep(cfg: SweepConfig, out: Path, plan: SweepPlan) -> dict:
    """sweep.json's content: every point (finished or not) and, per method whose points all finished, the
    selected one."""
    methods: dict[str, dict] = {}
    for p in plan.points:
        d = point_dir(out, p) / "methods" / p.method
        m = point_metrics({s: d / s for s in plan.screens}, p.method, cfg.sweep.stages)
        entry = {"index": p.index, "label": p.label, "params": p.params, "train": p.train, "dir": str(point_dir(out, p).relative_to(out)),
                 "finished": m is not None, "selected": False, **(m or {})}
        methods.setdefault(p.method, {"points": []})["points"].append(entry)
    for method, info in methods.items():
        pts = info["points"]
        info["complete"] = all(e["finished"] for e in pts)
        best = select(pts) if info["complete"] else None
        info["selected"] = best
        if best is not None:
            pts[best]["selected"] = True
    return {"format": 1, "rule": SELECTION_RULE, "stages": cfg.sweep.stages, "screens": plan.screens,
            "screen_of": plan.screen_of, "families": plan.families, "split": "validation",
            "estimate": {"request_epochs": sum(plan.request_epochs.values()), "cpu_seconds": round(plan.seconds),
                         "seconds_per_request_epoch": SECONDS_PER_REQUEST_EPOCH},
            "measured": measured_cost(out, plan, cfg.sweep.stages),
            "base_method_params": {m: cfg.run.method_params.get(m, {}) for m in methods},
            "base_train": cfg.run.train, "methods": methods}


def measured_cost(out: Path, plan: SweepPlan, stages: int) -> dict:
    """What the finished stages cost, from their own files: training wall seconds plus evaluation seconds.
    A stage loaded from the stage cache (its train.json names the ``shared_stage`` and repeats the training's
    own totals) cost no training; the point that trained it counts it. Stages of unfinished points count
    too, since they were paid for.

    ``seconds_per_request_epoch``: those seconds over the request-epochs the counted trainings ran (their
    examples x epochs; Replay's buffer included): the rate of this machine, dtype and thread count, which the
    remaining points are estimated at. None before any training finished."""
    from skillbank.run_dir import stage_dir
    train_s = eval_s = 0.0
    stages_seen = trainings = request_epochs = 0
    for p in plan.points:
        d = point_dir(out, p) / "methods" / p.method
        for screen in plan.screens:
            for t in range(1, stages + 1):
                sdir = stage_dir(d / screen, t)
                ev, tr = sdir / "eval.json", sdir / "train.json"
                if not ev.is_file():
                    continue
                stages_seen += 1
                eval_s += json.loads(ev.read_text()).get("eval_seconds", 0.0)
                if tr.is_file():
                    fit = json.loads(tr.read_text())
                    if "shared_stage" not in fit:
                        train_s += fit.get("wall_seconds", 0.0)
                        trainings += 1
                        request_epochs += fit.get("examples", 0) * fit.get("epochs", 0)
    rate = round((train_s + eval_s) / request_epochs, 3) if request_epochs else None
    return {"train_seconds": round(train_s, 1), "eval_seconds": round(eval_s, 1), "stages": stages_seen,
            "trainings": trainings, "request_epochs": request_epochs, "seconds_per_request_epoch": rate,
            "cpu_hours": round((train_s + eval_s) / 3600, 2)}


def select(points: list[dict]) -> int | None:
    """Index of the highest printed score (first in grid order on ties); None for no points."""
    best = None
    for i, e in enumerate(points):
        if e.get("score") is not None and (best is None or e["score"] > points[best]["score"]):
            best = i
    return best


def load_sweep(out_dir: str | Path) -> dict:
    from skillbank.errors import SkillbankError
    from skillbank.jsonfile import read_json
    return read_json(Path(out_dir) / "sweep.json", SkillbankError,
                     missing=f"{out_dir} holds no sweep (no sweep.json; run `skillbank exp sweep --config ... --out {out_dir}`)")
