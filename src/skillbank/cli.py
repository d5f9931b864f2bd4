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
            err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
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


def run_route_eval(stream, orders, n_features=2**18, alpha=0.01, prior="uniform", extra=()):
    from skillbank.continual.routing import route_eval
    from skillbank.memory.address import HashingNBAddress, TfidfLogRegAddress, make_selector
    from skillbank.memory.selectors import TEXT_KINDS
    selectors = {
        "address (hashing+NB)": lambda: HashingNBAddress(n_features=n_features, alpha=alpha, prior=prior),
        "offline TF-IDF+LR": TfidfLogRegAddress,
    }
    for kind in extra:
        if kind not in TEXT_KINDS:
            from skillbank.errors import SelectorError
            raise SelectorError(f"--selector {kind!r}: route-eval takes text-only kinds {list(TEXT_KINDS)}; "
                                "model-based selectors need a bank: use `skillbank selectors`")
        selectors.setdefault(kind, functools.partial(make_selector, kind))
    if extra:
        from skillbank.memory.selectors.embedding import memoize_encoders
        memoize_encoders()  # every prefix re-routes the same held-out requests: embed each once
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
                                    "hashing-nb, tfidf-logreg, embed-lda-nb, epi, adaptercl, self-route."),
    test_per_family: Optional[int] = typer.Option(None, help="Evaluate only the first N held-out requests per task."),
    max_new_tokens: int = typer.Option(256, help="Generation cap (outputs cached under another cap are not reused)."),
    batch_size: int = typer.Option(16, help="Requests generated / scored together."),
    as_json: bool = typer.Option(False, "--json", help="Print selectors.json on stdout."),
    constrain: bool = typer.Option(True, "--constrain/--no-constrain",
                                   help="Decode with each shard's grammar (only its skills and arguments)."),
):
    """Every selector over one frozen bank: route accuracy and EM after every prefix; resumable (outputs.jsonl).

    Example usage::

        skillbank selectors --bank runs/demo/methods/fsm/bank --stream streams/demo --order O1 --order O2 --out runs/selectors
    """
    from skillbank.continual.selectors import ALL_SELECTORS, evaluate_selectors
    from skillbank.data.stream import Stream
    from skillbank.memory.bank import SkillBank
    stream = Stream.load(stream_dir)
    sb = SkillBank.open(bank)
    record = evaluate_selectors(sb, stream, orders, kinds or ALL_SELECTORS, out_dir=out_dir, batch_size=batch_size,
                                max_new_tokens=max_new_tokens, test_per_family=test_per_family,
                                say=lambda m: err.print(m, highlight=False), constrain=constrain)
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
    err.print(f"wrote {out_dir}/selectors.json and selectors.md")


# -- FSM: banks, learning, planning --------------------------------------------------------------
def _train_config(config: Optional[Path], epochs: Optional[int], target_format: Optional[str], recipe: str = "paper"):
    from skillbank.config import RunConfig
    from skillbank.train.executor import TrainConfig
    if recipe not in ("paper", "small-cpu"):
        raise typer.BadParameter(f"--recipe must be 'paper' or 'small-cpu', got {recipe!r}")
    train = TrainConfig.for_small_cpu().to_dict() if recipe == "small-cpu" else {}
    if config:
        train.update(RunConfig.from_toml(config).train)
    if epochs is not None:
        train["epochs"] = epochs
    if target_format is not None:
        train["target_format"] = target_format
    return TrainConfig.from_dict(train)


@app.command()
@friendly_errors
def create(bank: Path = typer.Argument(..., help="Directory of the new bank."),
           base: str = typer.Option("embedded", help="'embedded' (SmolLM2-135M-Instruct), a Hugging Face id or a local model dir."),
           threads: Optional[int] = typer.Option(None, help="Torch CPU threads.")):
    """Create an empty skill bank for a base model."""
    from skillbank.memory.bank import SkillBank
    from skillbank.model.base import BaseModelConfig
    SkillBank.create(bank, base_config=BaseModelConfig(name=base, threads=threads))
    err.print(f"created {bank} on base {base}")


@app.command()
@friendly_errors
def learn(
    bank: Path = typer.Argument(..., help="The bank (created on first use)."),
    family: str = typer.Option(..., help="Name of the new skill family (becomes the shard name)."),
    data: Path = typer.Option(..., help="Stage records (JSONL): request + gold task graph."),
    catalog: Optional[Path] = typer.Option(None, help="catalog.json: skills of the family (default: those the records use)."),
    config: Optional[Path] = typer.Option(None, help="TOML with a [train] section (the LoRA recipe)."),
    epochs: Optional[int] = typer.Option(None, help="Override the number of epochs."),
    target_format: Optional[str] = typer.Option(None, help="'json' or 'compact' training targets."),
    recipe: str = typer.Option("paper", help="'paper' (r16, lr 4e-4, 6 epochs, JSON targets) or 'small-cpu' "
                               "(compact targets, lr 2e-3, 3 epochs: what a ~135M base on a CPU needs)."),
    base: str = typer.Option("embedded", help="Base model when the bank does not exist yet."),
    skip_invalid: bool = typer.Option(False, help="Skip bad record lines (and report them) instead of stopping."),
):
    """Learn a new skill family: train a fresh LoRA on its records only, freeze it, update the Address Memory."""
    from skillbank.data.catalog import Catalog
    from skillbank.data.records import read_records
    from skillbank.memory.bank import SkillBank
    from skillbank.model.base import BaseModelConfig
    cat = Catalog.load(catalog) if catalog else None
    rs = read_records(data, cat, skip_invalid=skip_invalid)
    for e in rs.skipped:
        err.print(f"skipped {e}", highlight=False)
    if rs.skipped:
        err.print(f"skipped {len(rs.skipped)} bad line(s) of {data}")
    cfg = _train_config(config, epochs, target_format, recipe)
    sb = SkillBank.open(bank) if (bank / "bank.json").exists() else SkillBank.create(bank, base_config=BaseModelConfig(name=base))
    entry = sb.learn(family, rs.records, cfg, catalog=cat)
    t = entry.training
    err.print(f"learned {family}: shard {entry.dir}, {len(entry.skills)} skills, {t['examples']} examples, "
              f"{t['wall_seconds']:.0f} s, {t['tokens_per_second']:.0f} tokens/s, final loss {t['final_loss']:.3f}")


@app.command()
@friendly_errors
def plan(
    bank: Path = typer.Argument(..., help="The bank."),
    request: Optional[str] = typer.Argument(None, help="A raw request (or use --file)."),
    file: Optional[Path] = typer.Option(None, "--file", help="JSONL of requests: {\"id\", \"request\"} per line."),
    shard: Optional[str] = typer.Option(None, help="Force this shard instead of routing."),
    max_new_tokens: int = typer.Option(768, help="Generation cap."),
    batch_size: int = typer.Option(8, help="Requests generated together."),
    constrain: bool = typer.Option(True, "--constrain/--no-constrain",
                                   help="Decode with each shard's grammar (only its skills and arguments)."),
    copy_values: bool = typer.Option(False, "--copy-values",
                                     help="Literal argument values must be substrings of the request."),
):
    """Plan requests: route each to one shard, generate its task graph; prints one JSON object per request."""
    from skillbank.data.records import iter_jsonl
    from skillbank.errors import RecordError
    from skillbank.memory.bank import SkillBank
    if (request is None) == (file is None):
        raise typer.BadParameter("give exactly one of: a request argument, or --file")
    ids, requests = [None], [request]
    if file is not None:
        ids, requests = [], []
        for lineno, obj in iter_jsonl(file):
            if not isinstance(obj, dict) or not isinstance(obj.get("request"), str):
                raise RecordError("each line needs a string 'request'", file, lineno)
            ids.append(obj.get("id", lineno))
            requests.append(obj["request"])
    sb = SkillBank.open(bank)
    for rid, p in zip(ids, sb.plan(requests, shard=shard, batch_size=batch_size, max_new_tokens=max_new_tokens,
                                      constrain=constrain, copy_values=copy_values)):
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
def info(bank: Path = typer.Argument(..., help="The bank."), as_json: bool = typer.Option(False, "--json")):
    """Show a bank's base model, shards and Address Memory (no model is loaded)."""
    from skillbank.memory.bank import bank_info
    data = bank_info(bank)
    if as_json:
        print(json.dumps(data, indent=1))
        return
    out.print(f"bank {data['root']} (format {data['format']}), base {data['base']['name']} "
              f"{data['base']['digest'][:19]}..., address {data['address']['kind']}")
    table = Table()
    for col in ("#", "shard", "skills", "format", "examples", "train s", "created"):
        table.add_column(col)
    for i, sh in enumerate(data["shards"], 1):
        table.add_row(str(i), sh["name"], str(sh["skills"]), sh["target_format"], str(sh["train_examples"]),
                      f"{sh['train_seconds'] or 0:.0f}", sh["created"])
    out.print(table)
    if data["orphans"]:
        out.print(f"leftovers of an interrupted learn (removed by the next learn): {data['orphans']}")


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
                                           "`skillbank export vllm`); routing stays here, no model is loaded."),
    threads: Optional[int] = typer.Option(None, help="Torch threads of the served model (default: cores - 1, max 8)."),
    learn_threads: Optional[int] = typer.Option(None, help="Torch threads of a background learn job."),
    log_level: str = typer.Option("info", help="uvicorn log level."),
    constrain: bool = typer.Option(True, "--constrain/--no-constrain",
                                   help="Decode with each shard's grammar (only its skills and arguments)."),
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
                                   reuse_prefixes=not no_prefix_reuse, constrain=constrain,
                                   allowed_hosts=LOOPBACK_NAMES if is_loopback(host) else None,
                                   max_batch=max_batch, queue_size=queue_size, timeout_s=timeout_s,
                                   max_request_chars=max_request_chars, max_list=max_list,
                                   max_new_tokens=max_new_tokens, upstream=upstream, threads=threads,
                                   learn_threads=learn_threads)
    except ValidationError as exc:
        raise typer.BadParameter("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()))
    application = create_app(bank, cfg)
    err.print(f"serving {bank} on http://{host}:{port} ({'upstream ' + upstream if upstream else 'local model'}, "
              f"{'batching up to ' + str(max_batch) if not no_batching else 'no batching'}; "
              f"learning over HTTP {'on' if cfg.admin_token else 'off'})", highlight=False)
    uvicorn.run(application, host=host, port=port, log_level=log_level)


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
    if out_file is not None:
        out_file.write_text(plan_.script())
        out_file.chmod(0o755)
        err.print(f"wrote {out_file}; then: skillbank serve {bank} --upstream http://{host}:{port}")
    elif as_json:
        print(json.dumps(plan_.to_dict(), indent=1))
    else:
        print(plan_.shell())


def _run(config_path: Path, out_dir: Path, methods: list[str] | None = None, orders: list[str] | None = None,
         restart: bool = False, parallel_stages: int | None = None, report: bool = True) -> None:
    from skillbank.config import RunConfig
    from skillbank.continual.runner import run as run_all
    cfg = RunConfig.from_toml(config_path)
    update: dict = {}
    if methods:
        update["methods"] = methods
        update["method_params"] = {k: v for k, v in cfg.method_params.items() if k in methods}
    if orders:
        update["eval"] = cfg.eval.model_copy(update={"orders": orders})
    if parallel_stages:
        update["runner"] = cfg.runner.model_copy(update={"parallel_stages": parallel_stages})
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
                                          "when several processes fill one run directory: run `skillbank report` once).")):
    """Train methods over a benchmark stream, evaluate every prefix, write results and a report.

    An interrupted run continues from its last finished stage when rerun with the same --out. Under
    `accelerate launch -m skillbank run ...` training uses every process's GPU."""
    _run(config, out_dir, method, order, restart, parallel_stages, write_report)


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
    from skillbank.continual.progress import run_progress
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
