"""Why requests fail after the last stage: every final closed-book prediction sorted into a failure kind.

The comparison table says how much a method forgot; this section says what the forgetting looks like.
Each prediction in ``methods/<method>/<order>/predictions.jsonl`` (the final stage's outputs) is compared
with its gold graph and given one kind of :func:`skillbank.metrics.failure_kind`: exact, wrong arguments,
the right skill names under another family's id (the skill survived, its address drifted), the newest
family's skills (the last family learned answering for the older ones), another family's skills, wrong
skills of the request's own family, or unparsable. Earlier families (learned before the last stage) and
the last family are counted apart: the first is forgetting, the second acquisition.

The gold graphs come from rebuilding the run's stream from its ``config.json``. Prediction rows written
before the runner stored the parsed graph are decoded again with the method's target format and prefix
convention (sequential methods strip the catalog-wide prefix, a routed executor its family's); the EM
recomputed from that graph must equal the EM the run recorded, so a wrong re-reading is reported, never
counted.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Sequence

from skillbank.data.records import iter_jsonl
from skillbank.errors import GraphError, SkillbankError
from skillbank.jsonfile import read_json
from skillbank.metrics import FAILURE_KINDS, FAILURE_TITLES, failure_kind, score_example

GROUPS = ("earlier", "last")


def _prediction_graph(row: dict, fmt: str, stream_prefix: str, family_prefixes: dict[str, str]):
    from skillbank.graph import TaskGraph
    from skillbank.model.serialization import decode

    if "graph" in row:
        return TaskGraph.from_dict(row["graph"]) if row["graph"] is not None else None
    prefix = family_prefixes.get(row["route"], "") if row.get("route") else stream_prefix
    return decode(row["output"], fmt, prefix).graph


def count_failures(run_dir: str | Path) -> dict[str, dict[str, dict[str, Counter]]]:
    """``{order: {variant: {"earlier" | "last": Counter(kind -> requests)}}}`` over every method-order
    whose final stage wrote its predictions. Raises :class:`SkillbankError` naming the file and line
    where a prediction cannot be matched to its gold request or re-read to the EM the run recorded."""
    from skillbank.config import RunConfig
    from skillbank.run_dir import build_run_stream
    from skillbank.train.executor import common_prefix

    out = Path(run_dir)
    cfg = RunConfig.from_dict(read_json(out / "config.json", SkillbankError))
    stream = build_run_stream(cfg)
    # The requests the run evaluated: held-out, or the validation split of a tuning run.
    gold = {r.id: r for recs in stream.split(cfg.eval.split).values() for r in recs}
    stream_prefix = common_prefix(sorted(stream.catalog.skills))
    family_prefixes = {f.key: common_prefix(sorted(f.skills)) for f in stream.catalog.families}
    counts: dict[str, dict[str, dict[str, Counter]]] = {}
    families = stream.catalog.family_map
    for path in sorted((out / "methods").glob("*/*/predictions.jsonl")):
        order = read_json(path.parent / "stage-01" / "eval.json", SkillbankError).get("order")
        if not order:
            raise SkillbankError(f"{path.parent / 'stage-01' / 'eval.json'}: no task order")
        per_variant = counts.setdefault(path.parent.name, {})
        fmt = cfg.train_config_for(path.parent.parent.name).target_format
        for n, row in iter_jsonl(path):
            where = f"{path}:{n}"
            try:
                variant, request_id, em = row["variant"], row["id"], row["em"]
                pred = _prediction_graph(row, fmt, stream_prefix, family_prefixes)
            except (KeyError, TypeError, GraphError) as exc:
                raise SkillbankError(f"{where}: not a prediction row ({type(exc).__name__}: {exc})") from None
            if variant.endswith("+address"):
                continue  # a diagnostic with the answer's address in the prompt, not closed-book
            record = gold.get(request_id)
            if record is None:
                raise SkillbankError(f"{where}: request {request_id!r} is not in the run's stream")
            if score_example(record.graph, pred).graph_em != em:
                raise SkillbankError(f"{where}: the output re-read as a graph does not reproduce the recorded "
                                     f"EM {em}; the failure analysis cannot classify it")
            group = "last" if record.family == order[-1] else "earlier"
            per_variant.setdefault(variant, {g: Counter() for g in GROUPS})[group][
                failure_kind(record.graph, pred, newest_family=order[-1], families=families)] += 1
    return counts


def failure_table(counts: dict[str, dict[str, Counter]], group: str, titles: dict[str, str]) -> list[str]:
    """Markdown rows: one per variant, the share of each failure kind (%) among its ``group`` requests."""
    lines = ["| method | requests | " + " | ".join(FAILURE_TITLES[k] for k in FAILURE_KINDS) + " |",
             "|---|" + "---:|" * (len(FAILURE_KINDS) + 1)]
    for variant, groups in counts.items():
        c = groups[group]
        n = sum(c.values())
        if n:
            lines.append(f"| {titles.get(variant, variant)} | {n} | "
                         + " | ".join(f"{100 * c[k] / n:.1f}" for k in FAILURE_KINDS) + " |")
    return lines


def failures_markdown(run_dirs: Sequence[Path], out: Path, titles: dict[str, str]) -> list[str]:
    """The report section: per order, a table and a stacked-bar figure for earlier families and a table
    for the last one."""
    from skillbank.report.plots import failure_bars

    lines = ["## Why requests fail after the last stage", "",
             "Every final closed-book prediction, sorted into one failure kind (first match in this order). "
             "\"Right skill names under another family's id\" means the skill is still executed but written "
             "under a wrong address: forgetting of the address, not of the skill.", ""]
    rank = {v: i for i, v in enumerate(titles)}  # the comparison table's row order
    for run_dir in run_dirs:
        try:
            by_order = count_failures(run_dir)
        except SkillbankError as exc:
            lines += [f"Not analysed for `{run_dir}`: {exc}", ""]
            continue
        for order in sorted(by_order):
            rows = dict(sorted(by_order[order].items(), key=lambda kv: rank.get(kv[0], len(rank))))
            if not rows:
                continue
            tag = f"{Path(run_dir).name}_" if len(run_dirs) > 1 else ""
            earlier = {titles.get(v, v): c["earlier"] for v, c in rows.items() if c["earlier"]}
            png = failure_bars({name: [c[k] / c.total() for k in FAILURE_KINDS] for name, c in earlier.items()},
                               [FAILURE_TITLES[k] for k in FAILURE_KINDS], out / f"failures_{tag}{order}.png",
                               f"Earlier families' requests after the last stage, order {order}")
            lines += [f"### Order {order}: earlier families (forgetting)", ""] + failure_table(rows, "earlier", titles)
            lines += ["", f"![Failure kinds, order {order}]({png.name})", "",
                      f"### Order {order}: the last family (acquisition)", ""] + failure_table(rows, "last", titles)
            lines.append("")
    return lines
