"""``skillbank exp decoding | scope``: decoding and out-of-scope studies over a bank (skillbank.experiments)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from skillbank.cli.common import err, friendly_errors, out, scope_encoder_name


@friendly_errors
def decoding(
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
    from skillbank.experiments.decoding import evaluate_decoding, write
    from skillbank.report.decoding import render_markdown
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


@friendly_errors
def scope(
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
                                                "(default: a new bank's, 'minilm-int8'; 'none' for word statistics alone)."),
):
    """Kept in-domain vs refused off-domain requests at the detector's threshold, and the trade-off curve."""
    from skillbank.data.records import iter_jsonl, read_records
    from skillbank.data.stream import Stream
    from skillbank.errors import RecordError
    from skillbank.memory.bank import SkillBank
    from skillbank.experiments.scope import detector_for_stream, evaluate_scope, write
    from skillbank.report.scope import render_markdown
    stream = Stream.load(stream_dir) if stream_dir is not None else None
    if bank is not None and scope_encoder is not None:
        raise typer.BadParameter("--scope-encoder chooses the detector fitted on --stream; a BANK has its own")
    if bank is not None:
        opened = SkillBank.open_offline(bank)
        if opened.scope is None:
            raise typer.BadParameter(f"{bank} has no scope statistics; add them with `skillbank scope fit`")
        det, source = opened.scope, str(bank)
    elif stream is not None:
        params = {} if scope_encoder is None else {"encoder": scope_encoder_name(scope_encoder)}
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
