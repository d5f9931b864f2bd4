"""Using a bank: plan requests, and score predictions against gold records."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from skillbank.cli.common import err, friendly_errors, out, pct, threads_option, use_threads


# -- scoring ------------------------------------------------------------------------------------
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
    from skillbank.predictions import family_prefixes, read_predictions, score_groups
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
        if not obj["request"].strip():
            raise RecordError("the request is empty", where, n)
        ids.append(obj.get("id", n))
        requests.append(obj["request"])
    return ids, requests


@friendly_errors
def plan(
    bank: Path = typer.Argument(..., help="The bank."),
    request: Optional[list[str]] = typer.Argument(None, help="One or more raw requests, each one argument (or use "
                                                  "--file)."),
    file: Optional[Path] = typer.Option(None, "--file", help="Requests to plan, '-' for stdin. JSONL ({\"id\", "
                                        "\"request\"} per line) when the first non-blank line starts with '{', "
                                        "else plain text: one request per non-blank line, its id the line number."),
    shard: Optional[str] = typer.Option(None, help="Force this shard instead of routing."),
    max_new_tokens: Optional[int] = typer.Option(None, help="Generation cap; default: twice the longest plan the "
                                                "shards were trained on (at most 768)."),
    batch_size: int = typer.Option(8, help="Requests generated together."),
    constrain: bool = typer.Option(True, "--constrain/--no-constrain",
                                   help="Decode with each shard's grammar (only its skills and arguments)."),
    copy_values: Optional[bool] = typer.Option(None, "--copy-values/--no-copy-values",
                                               help="Literal argument values must be substrings of the request. "
                                               "Default: for the shards whose training records all copied their "
                                               "values from the request (`skillbank info` says which)."),
    scope: bool = typer.Option(True, "--scope/--no-scope",
                               help="A request no learned family covers gets no plan (out_of_scope, reason)."),
    explain: bool = typer.Option(False, "--explain", help="Add \"explain\": the scope margin, the top families "
                                 "with their probabilities, the words that counted, the spans read as values and the "
                                 "sentences routing left out as scene-setting."),
    server: Optional[str] = typer.Option(None, "--server", help="Plan through this running `skillbank serve` (URL) "
                                         "of the same bank. Default: the service `skillbank serve` recorded for "
                                         "this bank, if one is running; else in this process."),
    local: bool = typer.Option(False, "--local", help="Plan in this process even when a service serves the bank."),
    engine: Optional[str] = typer.Option(None, "--engine", envvar="SKILLBANK_ENGINE",
                                         help="In this process: 'auto' (llama.cpp on the embedded GGUF where it "
                                         "can serve the bank, else torch), 'llama.cpp' or 'torch'."),
    threads: Optional[int] = threads_option("Threads to plan with in this process (default: $SKILLBANK_THREADS, "
                                            "else the physical cores, at most 8)."),
):
    """Plan requests: route each to one shard, generate its task graph; prints one JSON object per request
    (a request no family covers: "shard": null, "out_of_scope": true and the reason). Exit status 1 when a
    request failed (its line says "failed": true and why: a damaged shard, a request too long for the model),
    after every line is printed; a refusal as out of scope is an answer, not a failure."""
    from skillbank.memory.bank import SkillBank
    use_threads(threads)
    if (not request) == (file is None):
        raise typer.BadParameter("give requests as arguments or in a file (--file), one of the two")
    ids, requests = read_requests(file) if file is not None else ([None] * len(request), list(request))
    plans = None
    if not local:
        plans = _plan_by_service(bank, server, requests, shard=shard, max_new_tokens=max_new_tokens, explain=explain,
                                 settings_default=constrain and scope and copy_values is None)
    if plans is None:
        sb = SkillBank.open(bank, engine=engine)
        plans = [p.to_dict() for p in sb.plan(requests, shard=shard, batch_size=batch_size,
                                              max_new_tokens=max_new_tokens, constrain=constrain,
                                              copy_values=copy_values, scope=scope, explain=explain)]
    for rid, d in zip(ids, plans):
        if rid is not None:
            d = {"id": rid, **d}
        print(json.dumps(d, ensure_ascii=False))
    failed = sum(1 for d in plans if d.get("failed"))
    if failed:  # a script reading the lines can stop on the status instead of parsing every one
        err.print(f"skillbank: {failed} of {len(plans)} requests failed (see their \"error\")", highlight=False)
        raise typer.Exit(1)


def _plan_by_service(bank: Path, server: str | None, requests: list[str], *, shard, max_new_tokens, explain,
                     settings_default: bool) -> list[dict] | None:
    """The plans from a running service of this bank (skillbank.serve.registry), or None to plan here. An
    explicit ``--server`` that cannot serve is an error; a recorded one is reported on stderr and skipped."""
    from skillbank.memory.bank import read_manifest
    from skillbank.serve import registry
    explicit = server is not None
    if not explicit:
        found = registry.lookup(bank)
        if found is None:
            return None
        server = found["url"]
    if not settings_default:  # the service decodes with its own settings
        if explicit:
            raise typer.BadParameter("--no-constrain, --copy-values and --no-scope apply in this process only; "
                                     "drop --server or add --local")
        return None
    shards = sorted(s.name for s in read_manifest(bank).shards)
    try:
        served = registry.served_shards(server)
        if served != shards:
            raise registry.RemoteError(f"the service at {server} serves shards {served}, not this bank's {shards}")
        plans = registry.plan_remote(server, requests, shard=shard, max_new_tokens=max_new_tokens, explain=explain)
    except registry.RemoteError as exc:
        if explicit:
            raise
        err.print(f"skillbank: {exc}; planning in this process", highlight=False)
        return None
    err.print(f"skillbank: planned by the service at {server}", highlight=False)
    return plans
