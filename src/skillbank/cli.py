"""The ``skillbank`` command: a thin layer over the Python API.

Example usage::

    skillbank stream build --source builtin --out streams/builtin
    skillbank route-eval --stream streams/builtin --order O1 --order O2
    skillbank score --gold test.jsonl --pred predictions.jsonl

Progress and status go to stderr; ``--json`` prints machine-readable results on stdout. Library errors
(:class:`skillbank.errors.SkillbankError`) become one-line messages and exit code 2, no traceback.
"""
from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Callable, List, Optional

import typer
from rich.console import Console
from rich.table import Table

from skillbank.errors import SkillbankError

app = typer.Typer(help="Continual skill internalization: Factorized Skill Memory banks, benchmarks and metrics.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
stream_app = typer.Typer(help="Build and inspect benchmark streams.", no_args_is_help=True)
app.add_typer(stream_app, name="stream")

out = Console()
err = Console(stderr=True)


def friendly_errors(fn: Callable) -> Callable:
    """Turn library errors into a one-line message on stderr and exit code 2."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except SkillbankError as exc:
            err.print(f"[bold red]error:[/] {exc}", highlight=False)
            raise typer.Exit(2)
    return wrapper


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}"


# -- streams ------------------------------------------------------------------------------------
@stream_app.command("build")
@friendly_errors
def stream_build(
    out_dir: Path = typer.Option(..., "--out", help="Directory to write the stream to."),
    source: str = typer.Option("builtin", help="'builtin' (offline default) or 'taskbench'."),
    taskbench_root: Optional[Path] = typer.Option(None, help="TaskBench folder (data_<domain>/ or <domain>/ + sample/)."),
    hub: bool = typer.Option(False, help="Load TaskBench from the Hugging Face hub (microsoft/Taskbench)."),
    seed: int = typer.Option(0, help="Seed for generation and splits."),
    train_per_family: int = typer.Option(1000, help="Training requests per family (at most)."),
    test_per_family: Optional[int] = typer.Option(None, help="Held-out requests per family (builtin default 300; TaskBench: all the rest)."),
):
    """Build a benchmark stream directory (catalog, per-family train/test JSONL, orders)."""
    stream = build_stream(source, taskbench_root, hub, seed, train_per_family, test_per_family)
    stream.save(out_dir)
    print_stream_summary(stream)
    err.print(f"wrote {out_dir}")


def build_stream(source: str, taskbench_root: Optional[Path], hub: bool, seed: int,
                 train_per_family: int, test_per_family: Optional[int]):
    if source == "builtin":
        from skillbank.data.builtin import build_builtin_stream
        return build_builtin_stream(seed=seed, train_per_family=train_per_family,
                                    test_per_family=test_per_family or 300)
    if source == "taskbench":
        from skillbank.data import taskbench
        if hub:
            return taskbench.load_taskbench_hub(seed=seed, train_per_family=train_per_family,
                                                test_per_family=test_per_family)
        if taskbench_root is None:
            raise typer.BadParameter("--source taskbench needs --taskbench-root (or --hub)")
        return taskbench.load_taskbench(taskbench_root, seed=seed, train_per_family=train_per_family,
                                        test_per_family=test_per_family)
    raise typer.BadParameter(f"unknown source {source!r}: use 'builtin' or 'taskbench'")


def print_stream_summary(stream) -> None:
    table = Table(title=f"stream {stream.name} ({stream.source})")
    for col in ("task", "family", "title", "skills", "train", "test"):
        table.add_column(col)
    for key, s in stream.summary().items():
        table.add_row(s["task"], key, s["title"], str(s["skills"]), str(s["train"]), str(s["test"]))
    err.print(table)


@stream_app.command("info")
@friendly_errors
def stream_info(stream_dir: Path = typer.Argument(..., help="A stream directory.")):
    """Show a stream's families, sizes and what was dropped while building it."""
    from skillbank.data.stream import Stream
    stream = Stream.load(stream_dir)
    print_stream_summary(stream)
    if stream.report:
        out.print_json(json.dumps(stream.report))


# -- scoring ------------------------------------------------------------------------------------
@app.command()
@friendly_errors
def score(
    gold: Path = typer.Option(..., help="Gold records (JSONL, skillbank record format)."),
    pred: Path = typer.Option(..., help="Predictions (JSONL: id + output text, or id + graph)."),
    catalog: Optional[Path] = typer.Option(None, help="catalog.json: check gold skills; TaskBench node F1 ignores unknown predicted ids as TaskBench does."),
    as_json: bool = typer.Option(False, "--json", help="Print the scores as JSON."),
):
    """Score predicted task graphs against gold: EM, tool choice, argument F1, TaskBench node/edge F1."""
    from skillbank.data.catalog import Catalog
    from skillbank.data.records import read_records
    from skillbank.scoring import read_predictions, score_records
    cat = Catalog.load(catalog) if catalog else None
    golds = read_records(gold, cat).records
    report = score_records(golds, read_predictions(pred), set(cat.skills) if cat else None)
    if as_json:
        print(json.dumps({"overall": report.overall, "per_family": report.per_family,
                          "task_macro_em": report.task_macro_em, "missing": report.missing,
                          "invalid_reasons": report.invalid_reasons}, indent=1))
        return
    cols = ("graph_em", "tool_choice", "arg_f1", "node_set_exact", "arg_value_exact", "edge_exact",
            "valid")
    table = Table(title=f"{gold.name} vs {pred.name} (percent)")
    table.add_column("family")
    table.add_column("n", justify="right")
    for c in cols:
        table.add_column(c, justify="right")
    for fam, m in sorted(report.per_family.items()):
        table.add_row(fam, str(int(m["n"])), *(pct(m[c]) for c in cols))
    o = report.overall
    table.add_row("[bold]all[/]", str(int(o["n"])), *(pct(o[c]) for c in cols))
    out.print(table)
    out.print(f"task-macro EM {pct(report.task_macro_em)}   TaskBench node F1 {pct(o['node_f1'])}   "
              f"edge F1 {pct(o['edge_f1'])}   missing predictions {report.missing}")
    if report.invalid_reasons:
        out.print("invalid outputs: " + ", ".join(f"{k} x{v}" for k, v in report.invalid_reasons.items()))


# -- routing ------------------------------------------------------------------------------------
@app.command("route-eval")
@friendly_errors
def route_eval_cmd(
    stream_dir: Path = typer.Option(..., "--stream", help="A stream directory (skillbank stream build)."),
    orders: List[str] = typer.Option(["O1"], "--order", help="Task order(s): O1, O2 or e.g. T2,T1,T3."),
    n_features: int = typer.Option(2**18, help="Hashing space of the Address Memory."),
    alpha: float = typer.Option(0.01, help="Naive Bayes smoothing of the Address Memory."),
    as_json: bool = typer.Option(False, "--json", help="Print results as JSON."),
):
    """Route accuracy after every prefix: replay-free Address Memory vs the offline TF-IDF+LR reference."""
    from skillbank.data.stream import Stream
    stream = Stream.load(stream_dir)
    results = run_route_eval(stream, orders, n_features, alpha)
    if as_json:
        print(json.dumps([r.to_dict() for r in results], indent=1))
    else:
        for r in results:
            print_route_table(stream, r)


def run_route_eval(stream, orders, n_features=2**18, alpha=0.01):
    from skillbank.continual.routing import route_eval
    from skillbank.memory.address import HashingNBAddress, TfidfLogRegAddress
    selectors = {
        "address (hashing+NB, replay-free)": lambda: HashingNBAddress(n_features=n_features, alpha=alpha),
        "offline TF-IDF+LR (keeps requests)": TfidfLogRegAddress,
    }
    with err.status("routing...") as status:
        return [route_eval(stream, o, selectors, progress=status.update) for o in orders]


def print_route_table(stream, result, console: Console | None = None) -> None:
    console = console or out
    labels = [stream.task_label(k) for k in result.order]
    table = Table(title=f"route accuracy (percent), order {result.order_name}: {' -> '.join(labels)}")
    table.add_column("selector")
    table.add_column("prefix")
    table.add_column("overall", justify="right")
    table.add_column("macro", justify="right")
    for k in stream.family_keys:
        table.add_column(stream.task_label(k), justify="right")
    for name, rows in result.selectors.items():
        for row in rows:
            table.add_row(name if row.stage == 1 else "", f"n={row.stage}", pct(row.micro), pct(row.macro),
                          *(pct(row.per_family.get(k)) for k in stream.family_keys))
    console.print(table)


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
