"""The report of one or more runs: ``results.json`` -> ``report.md`` + a self-contained ``report.html``.

Sections: the main comparison table (per order: tool choice, argument F1, per-task final EM, task-macro
EM, BWT), EM on sets written elsewhere (``[eval] extra_sets``), the paper's findings checked, why final predictions fail, one accuracy-matrix heatmap per
method variant and order, per-stage trajectories of macro EM, training cost, and any extra sections a run carries (selectors, diagnostics) when their files exist.
The HTML page embeds its figures (base64), so it can be mailed or attached as one file.
"""
from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Sequence

from skillbank.metrics import FAILURE_KINDS, FAILURE_TITLES, AccuracyMatrix
from skillbank.report.failures import failures_markdown
from skillbank.report.findings import findings_markdown
from skillbank.report.plots import access_heatmap, matrix_heatmap, trajectories

# Display order and names: the paper's table reads baselines first, then FSM and its Oracle bound.
VARIANT_TITLES = {
    "sft": "Sequential SFT", "replay": "Replay (not replay-free)", "lwf": "LwF", "ewc": "EWC",
    "olora": "O-LoRA", "stacked": "Stacked-LoRA (summed, unrouted)",
    "progressive": "Stacked-LoRA (summed, unrouted; run as 'progressive')",
    "progressive-routed": "Progressive-LoRA (routed: Address Memory)",
    "progressive-oracle": "Progressive-LoRA (routed: Oracle)", "fsm": "FSM (Address-routed)",
    "oracle": "FSM executors + Oracle address", "base-skill": "Base + Skill (catalog in prompt)",
    "base-oracle-fields": "Base + Oracle Address+Fields",
}


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _rows(results: Sequence[dict]) -> list[tuple[str, str, dict]]:
    """(run name, variant, {order: variant result}) for every variant of every run, in display order."""
    rows = []
    for res in results:
        by_variant: dict[str, dict] = {}
        for method, orders in res["methods"].items():
            for order, r in orders.items():
                for v, vr in r["variants"].items():
                    by_variant.setdefault(v, {})[order] = vr
        rank = {v: i for i, v in enumerate(VARIANT_TITLES)}
        # "+address" variants are diagnostics (not closed-book): a delta row under their method (the paper's
        # "w/ correct skill address") and, when probed after every stage, the access heatmap.
        for v in sorted((v for v in by_variant if not v.endswith("+address")), key=lambda v: rank.get(v, 99)):
            per_order = {o: {**vr, "address": by_variant.get(f"{v}+address", {}).get(o)} for o, vr in by_variant[v].items()}
            rows.append((res.get("name", ""), v, per_order))
    return rows


def _delta(probed, closed) -> str:
    return "-" if probed is None or closed is None else f"{100 * (probed - closed):+.1f}"


def comparison_table(results: Sequence[dict]) -> list[str]:
    labels = results[0]["task_labels"]
    keys = sorted(labels, key=lambda k: labels[k])
    orders = sorted({o for res in results for m in res["methods"].values() for o in m})
    multi = len({r.get("name", "") for r in results}) > 1
    lines = []
    for order in orders:
        lines += [f"### Order {order}", "",
                  "| method | tool choice | arg F1 | " + " | ".join(labels[k] for k in keys) + " | macro EM | BWT |",
                  "|---|" + "---:|" * (len(keys) + 4)]
        for run, v, per_order in _rows(results):
            if order not in per_order:
                continue
            s = per_order[order]["summary"]
            name = VARIANT_TITLES.get(v, v) + (f" [{run}]" if multi else "")
            done = len(per_order[order]["macro_per_stage"])
            if done < len(per_order[order]["em"]["order"]):
                name += f" (stopped after stage {done})"
            bwt = s["bwt"]
            lines.append(f"| {name} | {_pct(s['tool_choice'])} | {_pct(s['arg_f1'])} | "
                         + " | ".join(_pct(s["final_em"].get(k)) for k in keys)
                         + f" | **{_pct(s['macro_em'])}** | {100 * bwt:+.1f} |")
            probe = per_order[order].get("address")
            if probe is not None:
                a = probe["summary"]
                lines.append("| ↳ w/ correct skill address (diagnostic) | "
                             + " | ".join(_delta(a[m], s[m]) for m in ("tool_choice", "arg_f1"))
                             + " | " + " | ".join(_delta(a["final_em"].get(k), s["final_em"].get(k)) for k in keys)
                             + f" | {_delta(a['macro_em'], s['macro_em'])} | - |")
        lines.append("")
    return lines


def extra_sets_table(results: Sequence[dict]) -> list[str]:
    """Graph EM on the ``[eval] extra_sets`` (requests written elsewhere) after the last stage, per method
    variant and order: EM over every request of the set, with route accuracy where the variant routes."""
    found: dict[tuple[str, str], dict[str, dict]] = {}  # (variant, order) -> set -> figures
    names: list[str] = []
    for res in results:
        for orders in res["methods"].values():
            for order, r in orders.items():
                for name, entry in r.get("extra", {}).items():
                    names += [name] if name not in names else []
                    for v, figures in entry["variants"].items():
                        if v.endswith("+address"):  # a diagnostic, not what the method answers
                            continue
                        found.setdefault((v, order), {})[name] = figures
    if not found:
        return []
    rank = {v: i for i, v in enumerate(VARIANT_TITLES)}
    rows = sorted(found.items(), key=lambda kv: (rank.get(kv[0][0], 99), kv[0][1]))
    lines = ["## Requests written elsewhere", "",
             "Graph EM (%) after the last stage on each `[eval] extra_sets` file, over all its requests (route "
             "accuracy in brackets where the variant routes); the held-out requests above are the stream's own "
             "templates, these are phrased as people phrase them.", "",
             "| method | order | " + " | ".join(f"{n} (n={_extra_n(found, n)})" for n in names) + " |",
             "|---|---|" + "---:|" * len(names)]
    for (v, order), sets in rows:
        cells = []
        for n in names:
            f = sets.get(n)
            cells.append("-" if f is None else _pct(f["em"]) + (f" ({_pct(f['route_accuracy'])})"
                                                                 if f.get("route_accuracy") is not None else ""))
        lines.append(f"| {VARIANT_TITLES.get(v, v)} | {order} | " + " | ".join(cells) + " |")
    kinds = [k for k in FAILURE_KINDS if any(f.get("failures", {}).get(k) for sets in found.values()
                                             for f in sets.values())]
    if kinds:
        lines += ["", "How the requests of every set together end (`metrics.failure_kind`, counts):", "",
                  "| method | order | " + " | ".join(FAILURE_TITLES[k] for k in kinds) + " |",
                  "|---|---|" + "---:|" * len(kinds)]
        for (v, order), sets in rows:
            counts = [sum(f.get("failures", {}).get(k, 0) for f in sets.values()) for k in kinds]
            lines.append(f"| {VARIANT_TITLES.get(v, v)} | {order} | " + " | ".join(map(str, counts)) + " |")
    return lines + [""]


def _extra_n(found: dict, name: str) -> int:
    return next(sets[name]["n"] for sets in found.values() if name in sets)


def _figures(results: Sequence[dict], out: Path) -> list[tuple[str, Path]]:
    """Per order: one trajectory plot of every variant, a heatmap per variant, access heatmaps."""
    figs = []
    labels = results[0]["task_labels"]
    names = sorted({r.get("name", "") for r in results})
    orders = sorted({o for res in results for m in res["methods"].values() for o in m})
    for order in orders:
        series, xl, order_figs = {}, None, []
        for run, v, per_order in _rows(results):
            if order not in per_order:
                continue
            tag = f"{run}_" if len(names) > 1 else ""
            title = VARIANT_TITLES.get(v, v) + (f" [{run}]" if len(names) > 1 else "")
            vr = per_order[order]
            m = AccuracyMatrix.from_dict(vr["em"])
            xl = [labels[k] for k in m.order]
            series[title] = vr["macro_per_stage"]
            png = matrix_heatmap(m, xl, out / f"matrix_{tag}{v}_{order}.png", f"{title}: graph EM a[t][k] (%), order {order}")
            order_figs.append((f"{title}, order {order}", png))
        for res in results:
            for method, per_order in res["methods"].items():
                vr = per_order.get(order, {}).get("variants", {})
                if method in vr and "em" in vr.get(f"{method}+address", {}):  # probed after every stage
                    closed = AccuracyMatrix.from_dict(vr[method]["em"])
                    address = AccuracyMatrix.from_dict(vr[f"{method}+address"]["em"])
                    png = access_heatmap(closed, address, [labels[k] for k in closed.order],
                                         out / f"access_{method}_{order}.png",
                                         f"{VARIANT_TITLES.get(method, method)}, order {order}: "
                                         "closed-book / +correct address EM (%)")
                    order_figs.insert(0, (f"Access vs execution: {VARIANT_TITLES.get(method, method)}, order {order} "
                                          "(green retained, amber addressing-forgotten, red execution-forgotten)", png))
        if series:
            png = trajectories(series, out / f"trajectory_{order}.png",
                               f"task-macro EM over seen tasks after each stage, order {order}",
                               ylabel="macro EM (%)", xlabels=xl)
            order_figs.insert(0, (f"Trajectories, order {order}", png))
        figs += order_figs
    return figs


def _training_table(results: Sequence[dict]) -> list[str]:
    lines = ["| method | order | train s | eval s | examples/s (mean) | final loss (last stage) | extra terms (last stage) |",
             "|---|---|---:|---:|---:|---:|---|"]
    for res in results:
        for method, orders in res["methods"].items():
            for order, r in orders.items():
                stages = [s for s in r["training"].values() if s]
                eps = [s.get("examples_per_second") for s in stages if s.get("examples_per_second")]
                last = stages[-1] if stages else {}
                terms = ", ".join(f"{k} {v:.4g}" for k, v in (last.get("terms") or {}).items()) or "-"
                loss = last.get("final_loss")
                lines.append(f"| {method} | {order} | {r['timing']['train_seconds']:.0f} | {r['timing']['eval_seconds']:.0f} | "
                             f"{(sum(eps) / len(eps)) if eps else 0:.2f} | {'-' if loss is None else f'{loss:.3f}'} | {terms} |")
    return lines + [""]


def _compute_lines(results: Sequence[dict]) -> list[str]:
    """Total compute from the stage files, which a resumed or stopped process still leaves (a process's
    own wall time is recorded only when it finishes, so a run spread over several sittings has none)."""
    lines = []
    for r in results:
        train = sum(po["timing"]["train_seconds"] for m in r["methods"].values() for po in m.values())
        ev = sum(po["timing"]["eval_seconds"] for m in r["methods"].values() for po in m.values())
        who = f" ({r.get('name', '')})" if len(results) > 1 else ""
        lines.append(f"Sum over methods and orders{who}: training {train / 3600:.2f} h, evaluation {ev / 3600:.2f} h "
                     "of process time (processes running side by side overlap in wall time).")
    return lines + [""]


def _route_lines(results: Sequence[dict]) -> list[str]:
    lines = []
    for run, v, per_order in _rows(results):
        for order, vr in sorted(per_order.items()):
            s = vr["summary"]
            if s.get("route_accuracy") is not None and v == "fsm":
                lines.append(f"- {VARIANT_TITLES.get(v, v)} order {order}: route accuracy after each stage "
                             + ", ".join(_pct(x) for x in s["route_per_stage"]))
    return lines + ([""] if lines else [])


def busy_seconds(spans: Sequence[tuple[float, float]]) -> float:
    """Length of the union of time intervals: wall time during which at least one of them was running."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def _wall_line(results: Sequence[dict]) -> str:
    """Wall time from the stage files, which every process writes as it goes: right for a run spread over
    several processes and resumed over several sittings, where no single process saw the whole of it."""
    parts = []
    for r in results:
        spans = [s for m in r["methods"].values() for po in m.values() for s in po["timing"].get("stage_spans", [])]
        if not spans:
            continue
        busy = busy_seconds([(s["start"], s["end"]) for s in spans])
        process = sum(s["end"] - s["start"] for s in spans)
        first, last = min(s["start"] for s in spans), max(s["end"] for s in spans)
        text = (f"{r.get('name', '')}: {busy / 3600:.2f} h with at least one stage training or evaluating "
                f"({process / 3600:.2f} h of process time; first stage start to last stage end "
                f"{(last - first) / 3600:.2f} h")
        if any(s["source"] != "recorded" for s in spans):
            text += "; some stage end times are file modification times"
        parts.append(text + ")")
    return ("Wall time " + "; ".join(parts) + ".") if parts else ""


def extra_sections(run_dir: Path) -> list[str]:
    """Sections other tools add to a run directory (``selectors.md``, ``diagnostics.md``), included as-is."""
    lines = []
    for name in ("selectors.md", "diagnostics.md"):
        p = run_dir / name
        if p.is_file():
            lines += [p.read_text().rstrip(), ""]
    return lines


def write_report(run_dirs: Sequence[str | Path], out_dir: str | Path | None = None) -> Path:
    """Render ``report.md`` and ``report.html`` for the given run directories into ``out_dir`` (default:
    the first run directory). Returns the markdown path."""
    from skillbank.errors import SkillbankError

    from skillbank.run_dir import load_run

    dirs = [Path(d) for d in run_dirs]
    results = [load_run(d) for d in dirs]
    if not any(r["methods"] for r in results):
        raise SkillbankError(f"{', '.join(map(str, dirs))}: no finished stage to report yet")
    out = Path(out_dir) if out_dir else dirs[0]
    out.mkdir(parents=True, exist_ok=True)
    first = results[0]
    cfg = first["config"]
    tr = cfg["train"]
    lines = [f"# Continual skill internalization: {', '.join(r.get('name', '') for r in results)}", "",
             f"Stream `{first['stream']['name']}` ({first['stream']['source']}): "
             + ", ".join(f"{v['task']} {v['train']}/{v['test']}" for v in first["stream"]["summary"].values())
             + " train/held-out requests per family. Base `" + cfg["base"]["name"] + f"` ({cfg['base']['dtype']}); "
             f"LoRA r{tr['rank']} (alpha {tr['alpha']}) on {', '.join(tr['target_modules'])}, {tr['epochs']} epoch(s), "
             f"lr {tr['lr']}, batch {tr['batch_size']}, target format `{tr['target_format']}`; greedy decoding, cap "
             f"{cfg['eval']['max_new_tokens']} tokens. " + _wall_line(results), "",
             "Graph exact match (EM, %) on every family's held-out requests after the last stage, closed-book "
             "(only the raw request) except the two frozen-base references; BWT = mean over earlier tasks of "
             "final EM minus EM right after learning it (points; negative = forgetting). Method hyperparameters: "
             + "; ".join(f"{m} {json.dumps(p)}" for m, p in cfg.get("method_params", {}).items() if p) + ".", "",
             "## Method comparison", ""]
    lines += comparison_table(results)
    lines += _route_lines(results)
    lines += extra_sets_table(results)
    lines += findings_markdown(results)
    lines += failures_markdown(dirs, out, VARIANT_TITLES)
    lines += ["## Training and evaluation cost", ""] + _training_table(results) + _compute_lines(results)
    figs = _figures(results, out)
    lines += ["## Figures", ""]
    for caption, png in figs:
        lines += [f"**{caption}**", "", f"![{caption}]({png.name})", ""]
    for d in dirs:
        lines += extra_sections(d)
    md = out / "report.md"
    md.write_text("\n".join(lines) + "\n")
    _write_html(lines, out / "report.html", out)
    return md


def _write_html(md_lines: list[str], path: Path, fig_dir: Path) -> None:
    """A small markdown subset (headings, tables, images, bold, paragraphs) -> one HTML file with inline
    images. Hand-written because the report's markdown is this program's own, limited output and the
    page must not depend on a markdown library or on files beside it."""
    import re

    def inline(text: str) -> str:
        t = html.escape(text)
        t = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", t)
        return re.sub(r"`(.+?)`", r"<code>\1</code>", t)

    body, i = [], 0
    while i < len(md_lines):
        line = md_lines[i]
        if line.startswith("|"):
            rows = []
            while i < len(md_lines) and md_lines[i].startswith("|"):
                rows.append(md_lines[i])
                i += 1
            cells = [[c.strip() for c in r.strip("|").split("|")] for r in rows if not set(r) <= set("|-: ")]
            body.append("<table><thead><tr>" + "".join(f"<th>{inline(c)}</th>" for c in cells[0]) + "</tr></thead><tbody>"
                        + "".join("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in r) + "</tr>" for r in cells[1:])
                        + "</tbody></table>")
            continue
        m = re.match(r"!\[(.*?)\]\((.+?)\)", line)
        if m:
            png = fig_dir / m.group(2)
            data = base64.b64encode(png.read_bytes()).decode() if png.is_file() else ""
            body.append(f'<img alt="{html.escape(m.group(1))}" src="data:image/png;base64,{data}">')
        elif line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            body.append(f"<h{level}>{inline(line[level:].strip())}</h{level}>")
        elif line.startswith("- "):
            body.append(f"<li>{inline(line[2:])}</li>")
        elif line.strip():
            body.append(f"<p>{inline(line)}</p>")
        i += 1
    style = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
             "table{border-collapse:collapse;margin:1em 0;font-size:14px}th,td{border:1px solid #ccc;padding:4px 8px;"
             "text-align:right}th:first-child,td:first-child{text-align:left}img{max-width:100%;margin:0.5em 0}"
             "code{background:#f3f3f3;padding:0 3px}")
    path.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>skillbank report</title>"
                    f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
