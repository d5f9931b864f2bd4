"""Serving a bank: the HTTP service, and the vLLM command that serves its shards upstream."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from skillbank.cli.common import err, friendly_errors


# -- service ------------------------------------------------------------------------------------
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
    engine: str = typer.Option("auto", help="What generates: llama.cpp (each shard's merged GGUF; the embedded "
                               "base only), torch (rows of all shards in one batch), or auto (llama.cpp where it "
                               "can serve the bank)."),
    threads: Optional[int] = typer.Option(None, help="Threads of the served model (default: cores - 1, max 8)."),
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
                                   max_new_tokens=max_new_tokens, upstream=upstream, engine=engine, threads=threads,
                                   learn_threads=learn_threads, learn_checkpoint_minutes=learn_checkpoint_minutes,
                                   header_timeout_s=header_timeout_s, body_timeout_s=body_timeout_s,
                                   body_min_rate=body_min_rate, keep_alive_s=keep_alive_s,
                                   fair_admission=fair_admission, client_queue=client_queue,
                                   fair_slowdown=fair_slowdown,
                                   max_resident=max_resident)
    except ValidationError as exc:
        raise typer.BadParameter("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()))
    application = create_app(bank, cfg)
    service = getattr(getattr(application, "state", None), "service", None)
    engine_kind = getattr(service, "engine_kind", engine)
    err.print(f"serving {bank} on http://{host}:{port} ({'upstream ' + upstream if upstream else engine_kind + ' engine'}, "
              f"{'batching up to ' + str(max_batch) if not no_batching else 'no batching'}; "
              f"learning over HTTP {'on' if cfg.admin_token else 'off'})", highlight=False)
    from skillbank.serve import registry
    # `skillbank plan` in another shell asks this service instead of loading the model itself
    registry.register(bank, f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}")
    try:
        uvicorn.run(application, host=host, port=port, log_level=log_level, **cfg.uvicorn_options())
    finally:
        registry.unregister(bank)


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
