"""``skillbank exp stream``: build and inspect benchmark streams."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from skillbank.cli.common import err, friendly_errors, out


# -- streams ------------------------------------------------------------------------------------
@friendly_errors
def build(
    out_dir: Path = typer.Option(..., "--out", help="Directory to write the stream to."),
    source: str = typer.Option("builtin", help="'builtin' (offline default), 'synthetic' (procedural, many "
                                               "families) or 'taskbench'."),
    taskbench_root: Optional[Path] = typer.Option(None, help="TaskBench folder (data_<domain>/ or <domain>/ + sample/)."),
    hub: bool = typer.Option(False, help="Load TaskBench from the Hugging Face hub (microsoft/Taskbench)."),
    seed: int = typer.Option(0, help="Seed for generation and splits."),
    train_per_family: int = typer.Option(1000, help="Training requests per family (at most)."),
    test_per_family: Optional[int] = typer.Option(None, help="Held-out requests per family (builtin default 300; TaskBench: all the rest)."),
    families: Optional[int] = typer.Option(None, "--families", help="builtin: split the five families into K "
                                           "finer ones (5..100, default 5); synthetic: K families (1..1050, required)."),
    structures: Optional[str] = typer.Option(None, help="Comma list of structures to draw (single,chain,dag); every "
                                             "family must be able to form each. Default: all a family can form."),
):
    """Build a benchmark stream directory (catalog, per-family train/test JSONL, orders)."""
    stream = build_stream(source, taskbench_root, hub, seed, train_per_family, test_per_family, families, structures)
    stream.save(out_dir)
    print_stream_summary(stream)
    for domain, rep in (stream.report or {}).get("domains", {}).items():  # TaskBench: what loading dropped
        dropped = rep.get("dropped") or {}
        if dropped:
            err.print(f"{domain}: dropped {sum(dropped.values())} of {rep.get('records')} records: "
                      + ", ".join(f"{reason} x{n}" for reason, n in dropped.items()), markup=False, highlight=False, soft_wrap=True)
            for reason, examples in (rep.get("examples") or {}).items():
                for ex in examples:
                    err.print(f"  {reason}: {ex['id']}: {ex['detail']}", markup=False, highlight=False, soft_wrap=True)
    warnings = (stream.report or {}).get("warnings")
    if warnings is None:  # sources whose report does not list them: same check on the split itself
        warnings = [f"family {key}: no held-out records ({s['train']} in training)"
                    for key, s in stream.summary().items() if not s["test"]]
    for line in warnings:
        err.print(f"warning: {line}", style="bold yellow", markup=False, highlight=False, soft_wrap=True)
    err.print(f"wrote {out_dir}")


def build_stream(source: str, taskbench_root: Optional[Path], hub: bool, seed: int,
                 train_per_family: int, test_per_family: Optional[int], families: Optional[int] = None,
                 structures: Optional[str] = None):
    wanted = None if structures is None else tuple(s.strip() for s in structures.split(",") if s.strip())
    if source != "builtin" and source != "synthetic" and (families is not None or wanted is not None):
        raise typer.BadParameter("--families and --structures apply to --source builtin or synthetic")
    if source == "builtin":
        from skillbank.data.builtin import MIN_FAMILIES, build_builtin_stream
        return build_builtin_stream(seed=seed, train_per_family=train_per_family,
                                    test_per_family=test_per_family or 300,
                                    families=MIN_FAMILIES if families is None else families, structures=wanted)
    if source == "synthetic":
        from skillbank.data.synthetic import build_synthetic_stream
        if families is None:
            raise typer.BadParameter("--source synthetic needs --families K (1..1050)")
        return build_synthetic_stream(families, seed=seed, train_per_family=train_per_family,
                                      test_per_family=300 if test_per_family is None else test_per_family,
                                      structures=wanted)
    if source == "taskbench":
        from skillbank.data import taskbench
        if hub:
            return taskbench.load_taskbench_hub(seed=seed, train_per_family=train_per_family,
                                                test_per_family=test_per_family)
        if taskbench_root is None:
            raise typer.BadParameter("--source taskbench needs --taskbench-root (or --hub)")
        return taskbench.load_taskbench(taskbench_root, seed=seed, train_per_family=train_per_family,
                                        test_per_family=test_per_family)
    raise typer.BadParameter(f"unknown source {source!r}: use 'builtin', 'synthetic' or 'taskbench'")


SUMMARY_ROWS = 30  # a stream of a thousand families is summarised, not printed row by row


def print_stream_summary(stream) -> None:
    table = Table(title=f"stream {stream.name} ({stream.source})")
    for col in ("task", "family", "title", "skills", "train", "test"):
        table.add_column(col)
    rows = list(stream.summary().items())
    shown = rows if len(rows) <= SUMMARY_ROWS else rows[:SUMMARY_ROWS - 5] + [None] + rows[-4:]
    for row in shown:
        if row is None:
            table.add_row("...", f"{len(rows) - SUMMARY_ROWS + 1} more", "", "", "", "")
            continue
        key, s = row
        table.add_row(s["task"], key, s["title"], str(s["skills"]), str(s["train"]), str(s["test"]))
    if len(rows) > SUMMARY_ROWS:
        table.add_row("all", f"{len(rows)} families", "", str(sum(s["skills"] for _, s in rows)),
                      str(sum(s["train"] for _, s in rows)), str(sum(s["test"] for _, s in rows)))
    err.print(table)


@friendly_errors
def info(stream_dir: Path = typer.Argument(..., help="A stream directory.")):
    """Show a stream's families, sizes and what was dropped while building it."""
    from skillbank.data.stream import Stream
    stream = Stream.load(stream_dir)
    print_stream_summary(stream)
    if stream.report:
        out.print_json(json.dumps(stream.report))
