"""``skillbank exp route-eval | route-scale | selectors``: the routing studies (skillbank.experiments)."""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from skillbank.cli.common import err, friendly_errors, out, pct


# -- routing ------------------------------------------------------------------------------------
@friendly_errors
def route_eval(
    stream_dir: Path = typer.Option(..., "--stream", help="A stream directory (skillbank exp stream build)."),
    orders: List[str] = typer.Option(["O1"], "--order", help="Task order(s): O1, O2 or e.g. T2,T1,T3."),
    n_features: int = typer.Option(2**18, help="Hashing space of the Address Memory."),
    alpha: float = typer.Option(0.01, help="Naive Bayes smoothing of the Address Memory."),
    prior: str = typer.Option("uniform", help="Address Memory class prior: 'uniform' or 'empirical'."),
    extra: List[str] = typer.Option([], "--selector", help="Also evaluate this text-only selector kind, e.g. "
                                    "embed-lda-nb (MiniLM LDA + hashing NB, replay-free). Repeatable."),
    as_json: bool = typer.Option(False, "--json", help="Print results as JSON."),
):
    """Route accuracy after every prefix: replay-free Address Memory vs the offline TF-IDF+LR reference."""
    from skillbank.data.stream import Stream
    stream = Stream.load(stream_dir)
    results = run_route_eval(stream, orders, n_features, alpha, prior, extra)
    if as_json:
        print(json.dumps([r.to_dict() for r in results], indent=1))
    else:
        for r in results:
            print_route_table(stream, r)


@friendly_errors
def route_scale(
    streams: List[Path] = typer.Option(..., "--stream", help="Stream directories (repeatable), e.g. built-in "
                                       "splits of K = 5..100 families and a synthetic K = 1000 one."),
    order: Optional[str] = typer.Option(None, help="Task order (default: the stream's family order)."),
    records: List[Path] = typer.Option([], "--records", help="Hand-written records to route too (repeatable), e.g. "
                                       "tests/fixtures/paraphrase_builtin.jsonl."),
    extra: List[str] = typer.Option([], "--selector", help="Also evaluate this text-only selector kind, e.g. "
                                    "embed-lda-nb. Repeatable."),
    reference_up_to: int = typer.Option(200, help="On streams with more families than this, fit the offline "
                                        "TF-IDF+LR reference once, on every family, and score it at the final "
                                        "prefix only (it refits on every kept request at each checkpoint)."),
    out_dir: Path = typer.Option(..., "--out", help="Output directory: routing_scale.json, .md, .png."),
):
    """Route accuracy and routing latency as the number of learned families grows, per stream."""
    from skillbank.data.records import read_records
    from skillbank.data.stream import Stream
    from skillbank.experiments import route_scale as study
    from skillbank.memory.selectors.embedding import encoder_memo
    from skillbank.report.route_scale import render_markdown
    text_selectors(extra)  # refuses a kind that is not text-only before any stream is read
    hand = {p.stem: read_records(p).records for p in records}
    results = []
    for path in streams:
        stream = Stream.load(path)
        selectors = text_selectors(extra)
        final_only = ["offline TF-IDF+LR"] if len(stream.family_keys) > reference_up_to else []
        # every prefix re-routes the same held-out requests: embed each once (in this block only)
        with encoder_memo(), err.status(f"routing {stream.name}...") as status:
            results.append(study.route_scale(stream, stream.order(order) if order else stream.family_keys, selectors,
                                       records=hand, final_only=final_only, progress=status.update))
    study.write(results, out_dir)
    out.print(render_markdown(results))


def text_selectors(extra=(), *, reference: bool = True, n_features=2**18, alpha=0.01, prior="uniform") -> dict:
    """name -> factory of the routers route-eval and route-scale compare: the Address Memory, the offline
    reference (``reference``) and any ``extra`` text-only kinds."""
    from skillbank.memory.address import HashingNBAddress, TfidfLogRegAddress, make_selector
    from skillbank.memory.selectors import TEXT_KINDS
    selectors = {"address (hashing+NB)": lambda: HashingNBAddress(n_features=n_features, alpha=alpha, prior=prior)}
    if reference:
        selectors["offline TF-IDF+LR"] = TfidfLogRegAddress
    for kind in extra:
        if kind not in TEXT_KINDS:
            from skillbank.errors import SelectorError
            raise SelectorError(f"--selector {kind!r}: routing evaluations take text-only kinds {list(TEXT_KINDS)}; "
                                "model-based selectors need a bank: use `skillbank exp selectors`")
        selectors.setdefault(kind, functools.partial(make_selector, kind))
    return selectors


def run_route_eval(stream, orders, n_features=2**18, alpha=0.01, prior="uniform", extra=()):
    from skillbank.experiments.routing import route_eval
    selectors = text_selectors(extra, n_features=n_features, alpha=alpha, prior=prior)
    from skillbank.memory.selectors.embedding import encoder_memo
    with encoder_memo(), err.status("routing...") as status:  # each held-out request embedded once
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


@friendly_errors
def selectors(
    bank: Path = typer.Option(..., help="A trained bank (skillbank exp run / learn); opened read-only."),
    stream_dir: Path = typer.Option(..., "--stream", help="The stream the bank was trained on (skillbank exp stream build)."),
    orders: List[str] = typer.Option(["O1"], "--order", help="Task order(s): O1, O2 or e.g. T2,T1,T3."),
    out_dir: Path = typer.Option(..., "--out", help="Output directory: selectors.json, selectors.md, PNGs, outputs.jsonl."),
    kinds: List[str] = typer.Option([], "--selectors", help="Selector kind(s) (repeatable; default all): oracle, "
                                    "hashing-nb, tfidf-logreg, embed-lda-nb, epi, adaptercl, self-route, address-compete."),
    test_per_family: Optional[int] = typer.Option(None, help="Evaluate only the first N held-out requests per task."),
    max_new_tokens: int = typer.Option(256, help="Generation cap (outputs cached under another cap are not reused)."),
    batch_size: int = typer.Option(16, help="Requests generated / scored together."),
    as_json: bool = typer.Option(False, "--json", help="Print selectors.json on stdout."),
    constrain: bool = typer.Option(True, "--constrain/--no-constrain",
                                   help="Decode with each shard's grammar (only its skills and arguments)."),
    compete_k: int = typer.Option(3, help="address-compete: candidates whose executors compete."),
    compete_quantile: float = typer.Option(0.1, help="address-compete: share of training requests (leave-one-out "
                                           "margins) that would have competed; sets the unsure threshold."),
    records: List[Path] = typer.Option([], "--records", help="Records of the stream's families from elsewhere "
                                       "(repeatable), e.g. tests/fixtures/paraphrase_builtin.jsonl: routed by each "
                                       "selector after the last stage and scored the same way."),
):
    """Every selector over one frozen bank: route accuracy and EM after every prefix; resumable (outputs.jsonl).

    Example usage::

        skillbank exp selectors --bank runs/demo/methods/fsm/bank --stream streams/demo --order O1 --order O2 --out runs/selectors
    """
    from skillbank.experiments.selectors import ALL_SELECTORS, evaluate_selectors
    from skillbank.data.records import read_records
    from skillbank.data.stream import Stream
    from skillbank.memory.bank import SkillBank
    stream = Stream.load(stream_dir)
    extra = {str(p): read_records(p, stream.catalog).records for p in records}  # read before any model loads
    sb = SkillBank.open(bank)
    record = evaluate_selectors(sb, stream, orders, kinds or ALL_SELECTORS, out_dir=out_dir, batch_size=batch_size,
                                max_new_tokens=max_new_tokens, test_per_family=test_per_family,
                                say=lambda m: err.print(m, highlight=False), constrain=constrain,
                                compete={"k": compete_k, "quantile": compete_quantile}, extra=extra)
    if as_json:
        print(json.dumps(record, indent=1))
        return
    for o, res in record["orders"].items():
        table = Table(title=f"selectors, order {o}, after the last stage (percent)")
        for col in ("selector", "route acc", "macro EM", "BWT"):
            table.add_column(col, justify="right" if col != "selector" else "left")
        for kind, r in res["selectors"].items():
            table.add_row(record["labels"][kind], pct(r["route_micro"][-1]), pct(r["em_macro"][-1]),
                          f"{100 * r['bwt']:+.1f}")
        out.print(table)
        if res.get("self_route_split"):
            s = res["self_route_split"][-1]
            out.print(f"self-route coverage {pct(s['coverage'])} vs selection {pct(s['selection'])}")
        if res.get("extra"):
            table = Table(title=f"order {o}: requests from other files, route acc / EM (percent)")
            table.add_column("selector")
            for name in res["extra"]:
                table.add_column(f"{Path(name).name} (n={record['extra_sets'][name]['n']})", justify="right")
            for kind in res["selectors"]:
                table.add_row(record["labels"][kind], *(f"{pct(v[kind]['route'])} / {pct(v[kind]['em'])}"
                                                        for v in res["extra"].values()))
            out.print(table)
    err.print(f"wrote {out_dir}/selectors.json and selectors.md")
