"""The sweep report: every grid point's learning vs retention, the fixed selection rule and what it selected.

``write_sweep_report(record, out)`` writes ``sweep.md`` and ``sweep-curves.png`` (one panel per method: each
setting's diagonal EM, i.e. how well a stage learns its own family, against the first family's EM after the
last stage, i.e. what it retained; the selected setting starred). ``sweep_table`` is the same grid as a rich
table (the CLI prints it).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers
import matplotlib.pyplot as plt  # noqa: E402

from skillbank.report.findings import LEARNS  # noqa: E402 - a baseline learns at >= this share of SFT's diagonal


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _se(e: dict) -> str:
    return "-" if e.get("score_se") is None else f"{e['score_se']:.2f}"


def separation(e: dict, chosen: dict) -> float | None:
    """How many standard errors of the difference separate a point's score from the selected one's (None
    without standard errors). Below ~2 a screen of this size does not tell the two apart."""
    if e.get("score_se") is None or chosen.get("score_se") is None:
        return None
    se = math.hypot(e["score_se"], chosen["score_se"])
    return (chosen["score"] - e["score"]) / se if se > 0 else None


def _rows(record: dict):
    """(method, point) for every point, in grid order."""
    for method, info in record["methods"].items():
        for e in info["points"]:
            yield method, e


def sweep_table(record: dict):
    from rich.table import Table
    table = Table(title=f"sweep on validation data, screens {', '.join(record['screens'])} (EM percent)",
                  caption=f"selection rule: {record['rule']}")
    for col in ("method", "#", "setting", "diagonal EM", "first family after last stage", "score", "± SE", "selected"):
        table.add_column(col, justify="left" if col in ("method", "setting") else "right")
    for method, e in _rows(record):
        if not e["finished"]:
            table.add_row(method, str(e["index"]), e["label"], "-", "-", "unfinished", "", "")
            continue
        table.add_row(method, str(e["index"]), e["label"], _pct(e["diagonal_em"]), _pct(e["retained_first_em"]),
                      f"{e['score']:.2f}", _se(e), "<- selected" if e["selected"] else "")
    return table


def learning_check(record: dict) -> tuple[float | None, list[dict]]:
    """SFT's selected diagonal EM and, per other method, whether its selected setting learns new families
    (diagonal >= LEARNS x SFT's) and whether any setting of its grid does."""
    sft = record["methods"].get("sft", {})
    reference = sft["points"][sft["selected"]]["diagonal_em"] if sft.get("selected") is not None else None
    rows = []
    for method, info in record["methods"].items():
        if method == "sft" or reference is None or info.get("selected") is None:
            continue
        finished = [e for e in info["points"] if e["finished"]]
        chosen = info["points"][info["selected"]]
        best = max(finished, key=lambda e: e["diagonal_em"])
        rows.append({"method": method, "selected": chosen["label"], "diagonal": chosen["diagonal_em"],
                     "ratio": chosen["diagonal_em"] / reference if reference else None,
                     "learns": chosen["diagonal_em"] >= LEARNS * reference,
                     "best": best["label"], "best_diagonal": best["diagonal_em"],
                     "any_learns": best["diagonal_em"] >= LEARNS * reference})
    return reference, rows


def sweep_curves(record: dict, path: str | Path) -> Path | None:
    """Learning vs retention per method (one panel each); None when no point finished."""
    methods = [(m, [e for e in info["points"] if e["finished"]]) for m, info in record["methods"].items()]
    methods = [(m, pts) for m, pts in methods if pts]
    if not methods:
        return None
    reference, _ = learning_check(record)
    ncols = min(3, len(methods))
    nrows = math.ceil(len(methods) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.8 * nrows), dpi=120, squeeze=False)
    for ax, (method, pts) in zip(axes.flat, methods):
        xs = [100 * e["retained_first_em"] for e in pts]
        ys = [100 * e["diagonal_em"] for e in pts]
        ax.scatter(xs, ys, s=28, color="#4477aa", zorder=2)
        for e, x, y in zip(pts, xs, ys):
            ax.annotate(e["label"], (x, y), textcoords="offset points", xytext=(4, 3), fontsize=6.5, color="#333333")
            if e["selected"]:
                ax.scatter([x], [y], s=160, marker="*", color="#cc3311", zorder=3, label="selected")
        ax.set_xlim(-3, 103)
        ax.set_ylim(-3, 103)
        ax.plot([0, 100], [0, 100], color="#bbbbbb", lw=0.8, ls="--", zorder=1)
        if reference is not None and method != "sft":
            ax.axhline(100 * LEARNS * reference, color="#ee7733", lw=0.8, ls=":", zorder=1,
                       label=f"{LEARNS:g} x SFT's diagonal")
        ax.set_xlabel("first family's EM after the last stage (%)", fontsize=8)
        ax.set_ylabel("diagonal EM (%)", fontsize=8)
        ax.set_title(f"{method} ({len(pts)} settings)", fontsize=10)
        if any(e["selected"] for e in pts) or (reference is not None and method != "sft"):
            ax.legend(fontsize=7, loc="lower right")
    for ax in list(axes.flat)[len(methods):]:
        ax.axis("off")
    fig.suptitle("learning (diagonal) vs retention, validation split, mean over screens", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def write_sweep_report(record: dict, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    fig = sweep_curves(record, out / "sweep-curves.png")
    est = record.get("estimate", {})
    screens = ", ".join(f"{s} (from {record['screen_of'].get(s, s)})" for s in record["screens"])
    lines = ["# Hyperparameter sweep (validation data only)", "",
             f"Screens: {screens}, "
             f"{record['stages']} stages each, evaluated on the validation split carved out of each family's "
             f"training requests (never the held-out set).", "",
             "Families (train / validation requests): " + ", ".join(
                 f"{k} {v['train']}/{v['validation']}" for k, v in record.get("families", {}).items()), "",
             f"**Selection rule (fixed before running):** {record['rule']}.", ""]
    if est:
        lines += [f"Estimated cost: {est['request_epochs']:,.0f} training request-epochs, about "
                  f"{est['cpu_seconds'] / 3600:.1f} CPU hours at {est['seconds_per_request_epoch']} s per request-epoch.", ""]
    cost = record.get("measured")
    if cost:
        lines += [f"Measured cost of the stages finished so far ({cost['stages']} stages, {cost['trainings']} trainings; "
                  f"a stage loaded from the stage cache costs no training): {cost['cpu_hours']:.2f} machine hours, "
                  f"{cost['train_seconds'] / 3600:.2f} h training + {cost['eval_seconds'] / 3600:.2f} h evaluation "
                  f"(from the stages' train.json and eval.json)"
                  + (f"; {cost['seconds_per_request_epoch']} s per training request-epoch, evaluation included."
                     if cost.get("seconds_per_request_epoch") else "."), ""]
    lines += ["A score's standard error (± SE) follows from the validation set's size: each family's EM is a share "
              "of its validation requests (binomial variance), averaged like the score; the cells are treated as "
              "independent. *SEs from selected*: the selected score minus this one, in standard errors of the "
              "difference; below 2 the screen does not tell the two settings apart, whatever the rule picked.", ""]
    for method, info in record["methods"].items():
        chosen = info["points"][info["selected"]] if info.get("selected") is not None else None
        lines += [f"## {method}", "",
                  "| # | setting | diagonal EM | first family after last stage | score | ± SE | SEs from selected | selected |",
                  "|---:|---|---:|---:|---:|---:|---:|:---:|"]
        for e in info["points"]:
            if e["finished"]:
                z = separation(e, chosen) if chosen is not None and not e["selected"] else None
                lines.append(f"| {e['index']} | {e['label']} | {_pct(e['diagonal_em'])} | {_pct(e['retained_first_em'])} "
                             f"| {e['score']:.2f} | {_se(e)} | {'-' if z is None else f'{z:.1f}'} "
                             f"| {'**yes**' if e['selected'] else ''} |")
            else:
                lines.append(f"| {e['index']} | {e['label']} | - | - | unfinished | | | |")
        if not info["complete"]:
            lines += ["", "_Not selected yet: some points are unfinished (rerun the sweep to continue)._"]
        lines.append("")
    reference, checks = learning_check(record)
    if checks:
        lines += ["## Does every method learn its families?", "",
                  f"A method learns when its diagonal EM (each family's EM right after it is learned) is at least "
                  f"{LEARNS:g} x sequential SFT's selected diagonal ({_pct(reference)}).", "",
                  "| method | selected setting | diagonal EM | x SFT | learns | best diagonal in its grid | any setting learns |",
                  "|---|---|---:|---:|:---:|---|:---:|"]
        for c in checks:
            ratio = "-" if c["ratio"] is None else f"{c['ratio']:.2f}"
            lines.append(f"| {c['method']} | {c['selected']} | {_pct(c['diagonal'])} | {ratio} | "
                         f"{'yes' if c['learns'] else '**no**'} | {c['best']} ({_pct(c['best_diagonal'])}) | "
                         f"{'yes' if c['any_learns'] else '**no**'} |")
        lines.append("")
    if fig is not None:
        lines += ["## Learning vs retention", "", f"![learning vs retention]({fig.name})", ""]
    lines += ["## Selected values", "", "Paste into configs/compare.toml:", "", "```toml", selected_toml(record).rstrip(),
              "```", ""]
    md = out / "sweep.md"
    md.write_text("\n".join(lines))
    return md


# -- the selected values as config text ---------------------------------------------------------------
def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if v is None:
        raise ValueError("TOML has no null")
    raise TypeError(f"cannot write {v!r} as TOML")


def selected_toml(record: dict) -> str:
    """The selected settings as ``[method_params.<m>]`` / ``[method_train.<m>]`` blocks to paste into
    configs/compare.toml: a method's own parameters, and the [train] fields the grid tuned for it (its
    learning rate), which override the shared [train] for that method only."""
    lines = [f"# Selected by `skillbank exp sweep` on validation data (screens {', '.join(record['screens'])}).",
             f"# Rule: {record['rule']}."]
    for method, info in record["methods"].items():
        best = info.get("selected")
        if best is None:
            lines.append(f"# {method}: not selected (its grid has unfinished points)")
            continue
        e = info["points"][best]
        lines.append("")
        if not e["params"]:
            lines.append(f"# [method_params.{method}]: none of its own tuned (score {e['score']:.2f}, point {e['label']})")
        else:
            lines.append(f"[method_params.{method}]   # score {e['score']:.2f} (point {e['label']})")
        for k, v in e["params"].items():  # what the grid chose; the sweep's fixed base settings are not carried
            if v is not None:
                lines.append(f"{k} = {_toml_value(v)}")
        if e["train"]:
            lines.append(f"[method_train.{method}]")
            lines += [f"{k} = {_toml_value(v)}" for k, v in e["train"].items()]
    return "\n".join(lines) + "\n"
