"""``skillbank exp run | sweep | report | progress | reactivate | diagnose`` and the top-level ``demo``."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from skillbank.cli.common import err, friendly_errors, out, pct, threads_option, use_threads


def _run(config_path: Path, out_dir: Path, methods: list[str] | None = None, orders: list[str] | None = None,
         restart: bool = False, parallel_stages: int | None = None, report: bool = True,
         threads: int | None = None, extra_sets: list[Path] | None = None, estimate: bool = False) -> None:
    from skillbank.config import RunConfig
    from skillbank.continual.runner import run as run_all
    cfg = RunConfig.from_toml(config_path)
    update: dict = {}
    if methods:
        update["methods"] = methods
        # the other methods' settings stay in the config file: one process per method is the usual way to run it
        update["method_params"] = {k: v for k, v in cfg.method_params.items() if k in methods}
        update["method_train"] = {k: v for k, v in cfg.method_train.items() if k in methods}
    if orders or extra_sets:
        evals = {"orders": orders} if orders else {}
        if extra_sets:  # outside a run's identity: a finished run rerun with a set added only evaluates it
            evals["extra_sets"] = list(dict.fromkeys(cfg.eval.extra_sets + [str(p) for p in extra_sets]))
        update["eval"] = cfg.eval.model_copy(update=evals)
    if parallel_stages:
        update["runner"] = cfg.runner.model_copy(update={"parallel_stages": parallel_stages})
    if threads is not None:
        update["base"] = cfg.base.model_copy(update={"threads": threads})
    if update:
        cfg = RunConfig.from_dict({**cfg.model_dump(), **{k: (v.model_dump() if hasattr(v, "model_dump") else v)
                                                           for k, v in update.items()}}, where=str(config_path))
    record = run_all(cfg, out_dir, say=lambda m: err.print(m, highlight=False), restart=restart, report=report,
                     estimate=estimate)
    print_run_summary(record)
    err.print(f"results and report in {out_dir}/ (report.md, report.html)")


def print_run_summary(record: dict) -> None:
    from skillbank.report.run_report import VARIANT_TITLES
    labels = record["task_labels"]
    keys = sorted(labels, key=lambda k: labels[k])
    orders = sorted({o for m in record["methods"].values() for o in m})
    for order in orders:
        table = Table(title=f"order {order}: graph EM after the last stage (percent)")
        for col in ["method", "tool", "arg F1"] + [labels[k] for k in keys] + ["macro", "BWT"]:
            table.add_column(col, justify="right")
        for method, per_order in record["methods"].items():
            if order not in per_order:
                continue
            for v, vr in per_order[order]["variants"].items():
                s = vr["summary"]
                table.add_row(VARIANT_TITLES.get(v, v), pct(s["tool_choice"]), pct(s["arg_f1"]),
                              *[pct(s["final_em"].get(k)) for k in keys], pct(s["macro_em"]), f"{100 * s['bwt']:+.1f}")
        out.print(table)
    out.print(f"wall time {record['timing']['wall_seconds'] / 60:.1f} min")


@friendly_errors
def run(config: Path = typer.Option(..., help="Run configuration (TOML), e.g. configs/compare.toml."),
        out_dir: Path = typer.Option(Path("runs/run"), "--out", help="Output directory (resumed if it exists)."),
        method: Optional[list[str]] = typer.Option(None, "--method", help="Run only these methods (repeatable)."),
        order: Optional[list[str]] = typer.Option(None, "--order", help="Run only these orders (repeatable)."),
        restart: bool = typer.Option(False, help="Discard what the output directory holds and start over."),
        parallel_stages: Optional[int] = typer.Option(None, help="FSM: train this many stages in parallel processes."),
        write_report: bool = typer.Option(True, "--report/--no-report", help="Render the report at the end (off "
                                          "when several processes fill one run directory: run `skillbank exp report` once)."),
        threads: Optional[int] = typer.Option(None, min=1, help="Torch threads for this process (overrides \\[base] "
                                              "threads; not part of a run's identity)."),
        extra_set: Optional[list[Path]] = typer.Option(None, "--extra-set", help="Also evaluate the final state on "
                                                       "this records file (repeatable; added to \\[eval] extra_sets, "
                                                       "outside a run's identity: a finished run only evaluates it).")):
    """Train methods over a benchmark stream, evaluate every prefix, write results and a report.

    An interrupted run continues from its last finished stage when rerun with the same --out. Under
    `accelerate launch -m skillbank exp run ...` training uses every process's GPU."""
    _run(config, out_dir, method, order, restart, parallel_stages, write_report, threads, extra_set)


@friendly_errors
def sweep(config: Optional[Path] = typer.Option(None, help="Sweep configuration (TOML): a run config plus \\[sweep], "
                                                "e.g. configs/sweep.toml."),
          out_dir: Path = typer.Option(Path("runs/sweep"), "--out", help="Sweep directory (resumed if it exists)."),
          plan_only: bool = typer.Option(False, "--plan", help="Check the grid and print the plan and its cost "
                                         "estimate; train nothing."),
          selected: bool = typer.Option(False, "--selected-toml", help="Print the selected values of the sweep in "
                                        "--out as \\[method_params]/\\[train] blocks for configs/compare.toml; run nothing."),
          methods: Optional[list[str]] = typer.Option(None, "--method", help="Run only this method's points "
                                                      "(repeatable, in the order given); others are read back. "
                                                      "Processes can share one --out: each skips the points "
                                                      "another is running."),
          threads: Optional[int] = typer.Option(None, min=1, help="Torch threads for this process (overrides "
                                                "\\[base] threads; not part of a run's identity).")):
    """Screen each method's own hyperparameters on two-stage runs evaluated on a validation split (never the
    held-out requests); select by a rule fixed in advance; write sweep.json and a report (sweep.md + PNG).

    An interrupted sweep continues from its finished points (and stages) when rerun with the same --out."""
    from skillbank.continual.sweep import SELECTION_RULE, load_sweep, measured_cost, plan_sweep, run_sweep
    from skillbank.report.sweep import selected_toml
    if selected:
        print(selected_toml(load_sweep(out_dir)), end="")
        return
    if config is None:
        raise typer.BadParameter("give --config (to run or plan a sweep) or --selected-toml (to read one)")
    from skillbank.config import SweepConfig
    cfg = SweepConfig.from_toml(config)
    if plan_only:
        plan = plan_sweep(cfg)
        for p in plan.points:
            out.print(f"{p.method:8s} #{p.index:<2d} {p.label}", highlight=False, soft_wrap=True)
        measured = measured_cost(out_dir, plan, cfg.sweep.stages) if out_dir.is_dir() else None
        out.print(plan.describe(measured), highlight=False, soft_wrap=True)
        out.print(f"selection rule: {SELECTION_RULE}", highlight=False, soft_wrap=True)
        return
    if threads is not None:
        cfg = cfg.with_threads(threads)
    record = run_sweep(cfg, out_dir, say=lambda m: err.print(m, highlight=False), methods=methods)
    from skillbank.report.sweep import sweep_table
    out.print(sweep_table(record))
    err.print(f"sweep.json and the report (sweep.md, sweep-curves.png) in {out_dir}/; the selection for "
              f"configs/compare.toml: skillbank exp sweep --out {out_dir} --selected-toml")


@friendly_errors
def report(run_dirs: list[Path] = typer.Argument(..., help="One or more run directories (with results.json)."),
           out_dir: Optional[Path] = typer.Option(None, "--out", help="Where to write report.md/html (default: the first run).")):
    """Render the comparison report (markdown + self-contained HTML + PNG figures) of finished runs."""
    from skillbank.report.run_report import write_report
    md = write_report(run_dirs, out_dir)
    err.print(f"wrote {md} and {md.with_suffix('.html')}")


@friendly_errors
def progress(run_dir: Path = typer.Argument(..., help="A run directory (skillbank exp run --out)."),
             config: Optional[Path] = typer.Option(None, help="The run's planned configuration (TOML): its methods "
                                                   "and orders are listed even before a process started them."),
             jobs: int = typer.Option(1, min=1, help="Processes running side by side (compare.sh's JOBS), to turn "
                                                     "the remaining process time into wall time.")):
    """Stages finished per method and order of a run, and an estimate of the time the rest will take."""
    from rich.table import Table

    from skillbank.config import RunConfig
    from skillbank.continual.progress import machine_label, run_progress
    planned = RunConfig.from_toml(config) if config else None
    rows = run_progress(run_dir, planned.methods if planned else None, planned.eval.orders if planned else None)
    table = Table(title=f"{run_dir}")
    for col in ("method", "order", "stages", "train s/stage", "eval s/task", "remaining"):
        table.add_column(col, justify="left" if col in ("method", "order") else "right")
    for r in rows:
        stages = f"{r.evaluated}/{r.stages}" + (" (+1 trained)" if r.trained_pending else "")
        left = "done" if r.done else ("?" if r.remaining_seconds is None else f"{r.remaining_seconds / 60:.0f} min")
        table.add_row(r.method, r.order, stages,
                      "-" if r.train_median is None else f"{r.train_median:.0f}",
                      "-" if r.eval_median is None else f"{r.eval_median:.0f}", left)
    out.print(table)
    known = [r.remaining_seconds for r in rows if not r.done and r.remaining_seconds is not None]
    unknown = sum(1 for r in rows if not r.done and r.remaining_seconds is None)
    def span(seconds: float) -> str:
        return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{seconds / 60:.0f} min"
    out.print(f"{sum(r.done for r in rows)}/{len(rows)} method-orders finished; remaining about {span(sum(known))} of "
              f"process time, {span(sum(known) / jobs)} at {jobs} process{'es' if jobs > 1 else ''} side by side"
              + (f" ({unknown} not estimable yet)" if unknown else ""))
    elsewhere = sum(1 for r in rows if not r.done and r.remaining_seconds is not None and not r.estimated_here)
    out.print(f"this machine: {machine_label()}; "
              + (f"{elsewhere} estimate(s) from stages measured on other machines (none finished here yet)"
                 if elsewhere else "estimated from stages measured here"), highlight=False)


@friendly_errors
def reactivate(run_dir: Path = typer.Argument(..., help="A run directory (skillbank exp run --out)."),
               method: Optional[list[str]] = typer.Option(None, "--method", help="Method to probe (repeatable; "
                                                          "default: the paper's lwf, ewc and olora)."),
               order: Optional[list[str]] = typer.Option(None, "--order", help="Order to probe (repeatable; default: the run's)."),
               no_report: bool = typer.Option(False, "--no-report", help="Do not rewrite the run's report.")):
    """Re-evaluate finished methods' final checkpoints with the correct skill address appended to every
    request (the paper's "w/ correct skill address" rows; a diagnostic, no retraining)."""
    from skillbank.continual.reactivation import PAPER_METHODS
    from skillbank.continual.reactivation import reactivate as probe
    done = probe(run_dir, method or PAPER_METHODS, order, say=lambda m: err.print(m, highlight=False))
    for name, per_order in done.items():
        for o, what in per_order.items():
            out.print(f"{name} {o}: {what}")
    if not no_report:
        from skillbank.report.run_report import write_report
        md = write_report([run_dir], run_dir)
        err.print(f"wrote {md} and {md.with_suffix('.html')}")


@friendly_errors
def diagnose(config: Path = typer.Option(..., help="Run configuration (TOML): stream, base, recipe, eval."),
             out_dir: Path = typer.Option(Path("runs/diagnostics"), "--out", help="Output directory (a run directory "
                                          "is fine: its report then includes the diagnostics)."),
             first: str = typer.Option("T1", help="Task learned first."),
             second: str = typer.Option("T2", help="Task learned second (during which T1 is probed)."),
             eval_requests: int = typer.Option(50, min=1, help="Held-out requests of the first task per probe."),
             steps: Optional[str] = typer.Option(None, help="Comma list of optimizer steps to probe at "
                                                 "(default: dense early, sparse later).")):
    """Access vs execution on sequential SFT: the forgetting trajectory and correct-address reactivation."""
    from skillbank.config import RunConfig
    from skillbank.continual.diagnostics import DEFAULT_SCHEDULE, run_diagnostics
    cfg = RunConfig.from_toml(config)
    try:
        schedule = tuple(int(x) for x in steps.split(",")) if steps else DEFAULT_SCHEDULE
    except ValueError:
        raise typer.BadParameter(f"--steps must be a comma list of integers, got {steps!r}") from None
    record = run_diagnostics(cfg, out_dir, first=first, second=second, eval_requests=eval_requests,
                             schedule=schedule, say=lambda m: err.print(m, highlight=False))
    h = record["hierarchy"]
    out.print(f"closed-book zero at step {h['closed_book_zero_at_step']}, +address then "
              f"{pct(h['address_em_when_closed_book_zero'])}; +address below half at step {h['address_below_half_at_step']}")
    err.print(f"diagnostics in {out_dir}/ (diagnostics.md, diagnostics.json, forgetting_trajectory.png)")


@friendly_errors
def demo(out_dir: Path = typer.Option(Path("runs/demo"), "--out", help="Output directory."),
         config: Optional[Path] = typer.Option(None, help="Another config instead of the packaged demo profile."),
         restart: bool = typer.Option(False, help="Discard what the output directory holds (e.g. a demo run "
                                                  "made by an older version) and start over."),
         threads: Optional[int] = threads_option()):
    """The main job: learn the five built-in families in order O1 with the embedded model and report."""
    from skillbank.config import packaged_config
    use_threads(threads)
    _run(config or packaged_config("demo"), out_dir, restart=restart, threads=threads, estimate=True)
