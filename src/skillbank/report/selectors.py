"""The selector section of a report: route accuracy and EM of every selector over one frozen bank.

:func:`selectors_markdown` returns the section as markdown (a run report can include it as is);
:func:`write_selectors_report` writes it to ``selectors.md`` with one PNG per order (route accuracy and
macro EM of each selector after every prefix).
"""
from __future__ import annotations

from pathlib import Path

from skillbank.metrics import AccuracyMatrix
from skillbank.report.plots import trajectories


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def selectors_markdown(record: dict, images: dict[str, str] | None = None, heading: str = "##") -> str:
    """Markdown for a ``selectors.json`` record. ``images``: order name -> PNG file name to embed."""
    labels = record["task_labels"]
    names = record.get("labels", {})
    sizes = record.get("test_per_family", {})
    lines = [f"{heading} Selectors over one frozen bank", "",
             f"Bank `{record['bank']}` (base `{record['base']['name']}`), stream `{record['stream']['name']}`, "
             f"held-out requests per task: " + ", ".join(f"{labels[k]} {n}" for k, n in sizes.items())
             + f". Executors are frozen and shared; only the selector differs. Greedy decoding, cap "
             f"{record['max_new_tokens']} tokens.", ""]
    c = record.get("compete")
    if c and "generations_per_request" in c:
        lines += [f"Address-compete: {c['competed_final']} of {c['routed_final']} requests of the final prefix had a "
                  f"top-2 margin under {c['threshold']:g} (the {c['quantile']:g} quantile of the training requests' "
                  f"leave-one-out margins) and were answered by the best of their top {c['k']} executors: "
                  f"{c['generations_per_request']:.2f} generations per request (1 = the Address Memory alone).", ""]
    for o, res in record["orders"].items():
        order = res["order"]
        sel = res["selectors"]
        lines += [f"{heading}# Order {o}: {' -> '.join(labels[k] for k in order)}", "",
                  "After the last stage (percent): route accuracy per task, overall route accuracy, "
                  "task-macro EM, BWT (EM points).", "",
                  "| selector | " + " | ".join(f"route {labels[k]}" for k in order)
                  + " | route all | macro EM | BWT |",
                  "|---|" + "---:|" * (len(order) + 3)]
        for kind, r in sel.items():
            last = r["route"][-1]
            lines.append(f"| {names.get(kind, kind)} | " + " | ".join(_pct(last.get(k)) for k in order)
                         + f" | {_pct(r['route_micro'][-1])} | {_pct(r['em_macro'][-1])} | {100 * r['bwt']:+.1f} |")
        lines += ["", "Final EM per task (percent):", "",
                  "| selector | " + " | ".join(labels[k] for k in order) + " |", "|---|" + "---:|" * len(order)]
        for kind, r in sel.items():
            m = AccuracyMatrix.from_dict(r["em"])
            row = m.row(m.stages_done)
            lines.append(f"| {names.get(kind, kind)} | " + " | ".join(_pct(row.get(k)) for k in order) + " |")
        lines += ["", "After every prefix n (percent): route accuracy over the tasks seen / task-macro EM.", "",
                  "| selector | " + " | ".join(f"n={t}" for t in range(1, len(order) + 1)) + " |",
                  "|---|" + "---:|" * len(order)]
        for kind, r in sel.items():
            lines.append(f"| {names.get(kind, kind)} | " + " | ".join(
                f"{_pct(a)} / {_pct(e)}" for a, e in zip(r["route_micro"], r["em_macro"])) + " |")
        if res.get("extra"):
            sets = record.get("extra_sets", {})
            lines += ["", "Requests from other files, routed after the last stage (percent; every request routed "
                      "and answered, no scope check): route accuracy / EM of the routed shard's output. The "
                      "Oracle row is what the executors reach when routing is right.", "",
                      "| selector | " + " | ".join(f"{name} (n={sets.get(name, {}).get('n', '?')})" for name in res["extra"])
                      + " |", "|---|" + "---:|" * len(res["extra"])]
            for kind in sel:
                lines.append(f"| {names.get(kind, kind)} | " + " | ".join(
                    f"{_pct(v[kind]['route'])} / {_pct(v[kind]['em'])}" for v in res["extra"].values()) + " |")
        if res.get("self_route_split"):
            lines += ["", "Self-route: *coverage* = some learned executor's output is exactly right; *selection* = "
                      "the executor it picked is (percent of the requests seen).", "",
                      "| prefix | coverage | selection | lost to selection |", "|---|---:|---:|---:|"]
            for t, s in enumerate(res["self_route_split"], 1):
                lines.append(f"| n={t} | {_pct(s['coverage'])} | {_pct(s['selection'])} | "
                             f"{_pct(s['coverage'] - s['selection'])} |")
        if images and o in images:
            lines += ["", f"![selectors {o}]({images[o]})"]
        lines.append("")
    return "\n".join(lines)


def write_selectors_report(record: dict, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    labels = record["task_labels"]
    images = {}
    for o, res in record["orders"].items():
        series = {}
        for kind, r in res["selectors"].items():
            series[f"{kind} route"] = r["route_micro"]
        for kind, r in res["selectors"].items():
            series[f"{kind} EM"] = r["em_macro"]
        png = trajectories(series, out / f"selectors_{o}.png",
                           f"order {o}: route accuracy and task-macro EM per selector",
                           xlabels=[labels[k] for k in res["order"]])
        images[o] = png.name
    path = out / "selectors.md"
    path.write_text(selectors_markdown(record, images, heading="#") + "\n")
    return path
