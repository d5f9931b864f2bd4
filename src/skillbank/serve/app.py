"""The HTTP service: ``create_app(bank, config)`` returns a FastAPI app over one skill bank.

    POST /v1/plan               one request or a list -> shard, routing probabilities, canonical graph, timings
    POST /v1/chat/completions   OpenAI-compatible; model "skillbank" routes by content, "<shard>" forces it
    GET  /v1/models             the router and the shards, as OpenAI model cards
    GET  /v1/shards             shards with their skills (and specs when the bank has them)
    POST /v1/families           learn a new family in the background (bearer token)
    GET  /v1/families[/{job}]   learn jobs and their progress (bearer token); DELETE cancels one
    POST /v1/reload             pick up families learned into the bank by another process (bearer token)
    POST /v1/load_lora_adapter  the same, in vLLM's runtime-LoRA form (what a front in --upstream mode calls)
    GET  /healthz, /metrics     liveness and Prometheus metrics
    GET  /                      the playground page

Every error is ``{"error": {"message", "type", "param"}}`` with a fitting status; no traceback ever leaves
the process (unexpected errors are logged and answered with a generic 500).
"""
from __future__ import annotations

import json
import logging
import time
import uuid
from contextlib import asynccontextmanager
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Optional

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from skillbank.errors import SkillbankError
from skillbank.model.prompts import USER_TEMPLATE
from skillbank.serve import schemas as S
from skillbank.serve.config import ServeConfig
from skillbank.serve.engine import UpstreamError
from skillbank.serve.learn import LearnRefused
from skillbank.serve.metrics import Metrics, MetricsMiddleware
from skillbank.serve.service import (ADMIN_ERRORS, ERRORS, JSONL_TYPES, ROUTER_MODEL, Service, ServiceError,
                                     error_response)
from skillbank.serve.state import Snapshot, open_snapshot

log = logging.getLogger("skillbank.serve")


class BodyTooLarge(Exception):
    """A body sent without Content-Length (chunked) grew past the limit while being read."""


class BodyLimitMiddleware:
    """Refuse a body over the limit (413): by its Content-Length before reading it, and - for a body sent
    without one (``Transfer-Encoding: chunked``) - as soon as the bytes read pass the limit. Pure ASGI, like
    MetricsMiddleware: Starlette's BaseHTTPMiddleware would stand between the endpoints and the client's
    disconnect message."""

    def __init__(self, app, *, limit: int, upload_limit: int, metrics: Metrics):
        self.app, self.limit, self.upload_limit, self.metrics = app, limit, upload_limit, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            limit = self.upload_limit if scope.get("path") == "/v1/families" else self.limit
            length = dict(scope.get("headers") or []).get(b"content-length", b"")
            if length.isdigit() and int(length) > limit:
                self.metrics.errors.labels("too_large").inc()
                response = error_response(413, f"request body of {int(length)} bytes is over the limit of {limit} bytes")
                await response(scope, receive, send)
                return
            receive = _counted(receive, limit)
        await self.app(scope, receive, send)


class HostCheckMiddleware:
    """Answer only requests whose Host header names one of ``allowed`` (DNS rebinding: a page on another site
    resolving its name to 127.0.0.1 must not reach a service bound to loopback). Starlette's
    TrustedHostMiddleware does the same but answers in plain text; this keeps the service's error format."""

    def __init__(self, app, *, allowed: list[str]):
        self.app, self.allowed = app, {h.lower().strip("[]") for h in allowed}

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            host = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1").lower()
            name = host[1:host.index("]")] if host.startswith("[") and "]" in host else host.rsplit(":", 1)[0]
            if name not in self.allowed:
                await error_response(400, f"Host header {host!r} is not one this service answers to; "
                                          f"use one of {sorted(self.allowed)}")(scope, receive, send)
                return
        await self.app(scope, receive, send)


class InternalErrorMiddleware:
    """Answer an unexpected exception with the service's JSON 500 and keep the connection open. (Starlette's
    ServerErrorMiddleware re-raises after answering, and the server then drops the client's keep-alive
    connection.)"""

    def __init__(self, app, *, on_error):
        self.app, self.on_error = app, on_error

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)
        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:  # noqa: BLE001 - answered here, logged by on_error
            self.on_error(scope, exc)
            if started:  # half an answer is out: nothing sane can follow it on this connection
                raise
            await error_response(500, "internal error; the service log has the details")(scope, receive, send)


class HeadAsGetMiddleware:
    """HEAD on any GET route, as HTTP asks: run the GET handler; the server sends the headers only (uvicorn drops
    a HEAD response's body, from its own copy of the request scope)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope.get("method") == "HEAD":
            scope = dict(scope, method="GET")
        await self.app(scope, receive, send)


def _offline_docs(app: FastAPI) -> None:
    """Swagger UI at /docs from the assets of the swagger-ui-bundle package: FastAPI's default page loads them
    from a CDN, which leaves it blank on a machine without internet."""
    from fastapi.openapi.docs import get_swagger_ui_html
    from fastapi.staticfiles import StaticFiles
    from swagger_ui_bundle import swagger_ui_path

    app.mount("/docs-assets", StaticFiles(directory=swagger_ui_path), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs():
        return get_swagger_ui_html(openapi_url=app.openapi_url, title="skillbank - API",
                                   swagger_js_url="/docs-assets/swagger-ui-bundle.js",
                                   swagger_css_url="/docs-assets/swagger-ui.css",
                                   swagger_favicon_url="/docs-assets/favicon-32x32.png")


def _counted(receive, limit: int):
    """``receive`` that raises :class:`BodyTooLarge` once the body read so far passes ``limit`` bytes."""
    seen = 0

    async def wrapped():
        nonlocal seen
        message = await receive()
        if message.get("type") == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise BodyTooLarge(f"request body is over the limit of {limit} bytes")
        return message
    return wrapped


def _is_union_branch(loc_item) -> bool:
    return isinstance(loc_item, str) and (loc_item in ("str", "int", "float", "bool", "dict") or "[" in loc_item)


def _request_of_chat(body: S.ChatRequest) -> str:
    """The request to plan: the last user message (string or text parts), without the executor's own prompt
    wording if a client (e.g. another skillbank in --upstream mode) already added it. Text parts are joined
    with line breaks, as vLLM joins them: clients split a message at sentence or paragraph ends, and joined
    with nothing "...in Paris" and "tomorrow..." would read "Paristomorrow"."""
    for msg in reversed(body.messages):
        if msg.role != "user":
            continue
        content = msg.content
        if isinstance(content, list):
            texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
            if not all(isinstance(t, str) for t in texts):
                raise ServiceError(400, "a text content part needs a string 'text'", param="messages")
            content = "\n".join(texts)
        if not isinstance(content, str):
            break
        prefix = USER_TEMPLATE.split("{request}")[0]
        return content[len(prefix):] if content.startswith(prefix) else content
    raise ServiceError(400, "no user message with text content: the last user message is the request to plan",
                       param="messages")


def _grammar_of_chat(body: S.ChatRequest):
    """A client's grammar (vLLM's ``structured_outputs: {"grammar": <Lark>}``, or the older ``guided_grammar``),
    checked here so a bad one is a 400, not a failed generation. None when the client sent none."""
    from skillbank.model.constrain import LarkGrammar, check_lark
    extra = body.model_extra or {}
    structured = extra.get("structured_outputs")
    text = structured.get("grammar") if isinstance(structured, dict) else None
    text = text if text is not None else extra.get("guided_grammar")
    if text is None:
        return None
    if not isinstance(text, str) or not text.strip():
        raise ServiceError(400, "structured_outputs.grammar must be a non-empty Lark grammar", param="structured_outputs")
    problem = check_lark(text)
    if problem:
        raise ServiceError(400, f"structured_outputs.grammar does not compile: {problem}", param="structured_outputs")
    return LarkGrammar(text)


def _wants_tool_calls(body: S.ChatRequest) -> bool:
    """Answer in OpenAI tool_calls form? Asked the way function-calling clients ask: a ``tools`` list or a
    ``tool_choice`` ("none" keeps text, as in OpenAI's API); ``skillbank.format`` overrides both."""
    if body.skillbank is not None and body.skillbank.format is not None:
        return body.skillbank.format == "tool_calls"
    if body.tool_choice is not None:
        return body.tool_choice != "none"
    return bool(body.tools)


def _tool_calls(graph: dict) -> list[dict]:
    """One OpenAI tool call per node; ``call_<n>`` is node n, so a "<node-n>" argument value names its output."""
    return [{"id": f"call_{i}", "type": "function",
             "function": {"name": node["task"],
                          "arguments": json.dumps({a["name"]: a["value"] for a in node["arguments"]},
                                                  ensure_ascii=False)}}
            for i, node in enumerate(graph["task_nodes"])]


def _epoch(created: str, default: int) -> int:
    try:
        return int(datetime.strptime(created, "%Y-%m-%dT%H:%M:%S").timestamp())
    except (TypeError, ValueError):
        return default


def _playground_html() -> str:
    return resources.files("skillbank.serve").joinpath("static/playground.html").read_text(encoding="utf-8")


def create_app(bank: str | Path | Snapshot, config: ServeConfig | None = None, *, base=None) -> FastAPI:
    """The FastAPI app serving ``bank`` (a path, or a Snapshot already opened). ``base``: a LoadedBase to
    reuse instead of loading the bank's base model (tests; not used in upstream mode)."""
    config = config or ServeConfig.from_env()
    snapshot = bank if isinstance(bank, Snapshot) else open_snapshot(Path(bank), base, load_model=not config.upstream,
                                                                           threads=config.model_threads,
                                                                           max_resident=config.max_resident)
    svc = Service(snapshot, config)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await svc.start()
        try:
            yield
        finally:
            await svc.stop()

    app = FastAPI(title="skillbank", version="1", lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Content-routed planning over a skill bank: the Address Memory picks the executor "
                              "shard from the request, the shard writes the task graph.")
    app.state.service = svc
    _offline_docs(app)
    upload_limit = int(config.max_upload_mb * 1024 * 1024)
    # A plan call holds at most max_list requests of max_request_chars (UTF-8: <= 4 bytes each), plus JSON.
    body_limit = config.max_list * config.max_request_chars * 4 + 64 * 1024

    # -- errors --------------------------------------------------------------------------------------
    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError):
        return error_response(exc.status, exc.message, exc.param, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        for e in errors:
            if e.get("type") == "json_invalid":
                ctx = e.get("ctx") or {}
                return error_response(400, f"malformed JSON body: {ctx.get('error', e.get('msg'))} "
                                           f"(at character {e.get('loc', ['', '?'])[-1]})")
        # One message per field: pydantic reports each branch of a union (request: str | list[str]) as its own
        # error at "request.str", "request.list[str]"; a person wants "request: ... or ...".
        by_field: dict[str, list[str]] = {}
        for e in errors:
            loc = [str(x) for x in e.get("loc", ()) if x != "body" and not _is_union_branch(x)]
            msgs = by_field.setdefault(".".join(loc) or "body", [])
            if e.get("msg") not in msgs:
                msgs.append(str(e.get("msg")))
        parts = [f"{where}: {' or '.join(msgs)}" for where, msgs in list(by_field.items())[:5]]
        return error_response(422, "invalid request: " + "; ".join(parts), next(iter(by_field)))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        if isinstance(exc.__cause__, BodyTooLarge):  # FastAPI turns a failed body read into "error parsing the body"
            return await _too_large(request, exc.__cause__)
        message = exc.detail if isinstance(exc.detail, str) else "error"
        if exc.status_code == 404 and message == "Not Found":
            message = f"no such endpoint: {request.method} {request.url.path}"
        return error_response(exc.status_code, message, headers=getattr(exc, "headers", None))

    @app.exception_handler(BodyTooLarge)
    async def _too_large(request: Request, exc: BodyTooLarge):
        svc.metrics.errors.labels("too_large").inc()
        return error_response(413, str(exc))

    def _unexpected(scope, exc: Exception) -> None:
        log.error("unhandled error on %s %s", scope.get("method"), scope.get("path"), exc_info=exc)
        svc.metrics.errors.labels("internal").inc()

    app.add_middleware(BodyLimitMiddleware, limit=body_limit, upload_limit=upload_limit, metrics=svc.metrics)
    app.add_middleware(MetricsMiddleware, metrics=svc.metrics)
    app.add_middleware(HeadAsGetMiddleware)
    if config.allowed_hosts is not None:
        app.add_middleware(HostCheckMiddleware, allowed=config.allowed_hosts)
    app.add_middleware(InternalErrorMiddleware, on_error=_unexpected)

    # -- planning -----------------------------------------------------------------------------------
    @app.post("/v1/plan", response_model=S.PlanResponse, responses={**ERRORS, 404: {"model": S.ErrorResponse},
                                                                    409: {"model": S.ErrorResponse}},
              summary="Plan one request or a list: route, generate, parse",
              description="Each request is routed by the Address Memory (or sent to a forced `shard`), checked for "
                          "scope, generated by its shard and parsed. A routed request no learned family covers is "
                          "not generated: its plan has `out_of_scope: true`, `shard: null`, `graph: null` and a "
                          "`reason`. Every plan carries `confidence` {route, scope_margin, executor_logprob}.")
    async def plan(body: S.PlanRequest, request: Request):
        arrived = time.perf_counter()
        reqs = [body.request] if isinstance(body.request, str) else list(body.request)
        results = await svc.plan(reqs, shard=body.shard, max_new_tokens=body.max_new_tokens, http=request)
        return {"plans": [svc.plan_result(q, arrived, body.shard is None) for q in results]}

    @app.post("/v1/chat/completions", response_model=S.ChatResponse,
              responses={**ERRORS, 404: {"model": S.ErrorResponse}, 409: {"model": S.ErrorResponse},
                         502: {"model": S.ErrorResponse}},
              summary="OpenAI-compatible chat completion whose answer is the task graph (as text or tool_calls)",
              description="The last user message is the request. The answer is the canonical task graph as JSON "
                          "text in message.content, or - when the request has `tools` or `tool_choice` (not "
                          '"none"), or `"skillbank": {"format": "tool_calls"}` - OpenAI tool_calls: one call '
                          "`call_<n>` per node n (name: the skill id; arguments: JSON text {name: value}, "
                          '"<node-j>" values kept: the output of call_j), finish_reason "tool_calls", content '
                          "null, and the graph's links in `skillbank.links`. A request no learned family covers "
                          "(out of scope) gets an assistant message with the reason, and `skillbank.out_of_scope`; "
                          "so does an invalid graph in tool_calls form.")
    async def chat(body: S.ChatRequest, request: Request):
        arrived = time.perf_counter()
        if body.stream:
            raise ServiceError(400, "stream=true is not supported: a task graph is returned whole", param="stream")
        if body.n != 1:
            raise ServiceError(400, f"n must be 1 (decoding is greedy), got {body.n}", param="n")
        snap = svc.snapshot
        if body.model == ROUTER_MODEL:
            shard = None
        elif body.model in snap.shard_names:
            shard = body.model
        else:
            raise ServiceError(404, f"unknown model {body.model!r}: use {ROUTER_MODEL!r} (routes by content) or a "
                                    f"shard name: {snap.shard_names}", param="model")
        text = _request_of_chat(body)
        grammar = _grammar_of_chat(body)
        if grammar is not None:
            svc.metrics.structured.inc()
        tool_form = _wants_tool_calls(body)
        [q] = await svc.plan([text], shard=shard, http=request, param="messages",
                             max_new_tokens=body.max_completion_tokens or body.max_tokens, grammar=grammar)
        p = svc.plan_result(q, arrived, shard is None)
        finish = "length" if p["truncated"] else "stop"
        if q.out_of_scope:
            message = {"role": "assistant", "content": f"No skill in this bank covers that request ({p['reason']})."}
        elif tool_form and p["valid"]:
            message, finish = {"role": "assistant", "content": None, "tool_calls": _tool_calls(p["graph"])}, "tool_calls"
        elif tool_form:  # a framework reading tool_calls gets none, and a person reading content gets the reason
            message = {"role": "assistant", "content": f"No plan: the executor's output is not a valid task graph "
                                                       f"({p['error']})."}
        else:
            message = {"role": "assistant",
                       "content": json.dumps(p["graph"], ensure_ascii=False) if p["valid"] else q.out.text}
        prompt_tokens = q.job.prompt_tokens if q.job else 0
        completion_tokens = q.out.n_tokens if q.out else 0
        return {"id": "chatcmpl-" + uuid.uuid4().hex[:24], "created": int(time.time()),
                "model": p["shard"] or ROUTER_MODEL,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens},
                "skillbank": {"shard": p["shard"], "routed": shard is None, "probabilities": p["probabilities"],
                              "valid": p["valid"], "error": p["error"], "out_of_scope": p["out_of_scope"],
                              "reason": p["reason"], "confidence": p["confidence"], "timings": p["timings"],
                              "links": p["graph"]["task_links"] if p["valid"] else None}}

    # -- describing the bank ------------------------------------------------------------------------
    @app.get("/v1/models", response_model=S.ModelList, summary="The router and the shards as OpenAI model cards")
    async def models():
        snap = svc.snapshot
        base = snap.manifest.base.get("name")
        cards = [{"id": ROUTER_MODEL, "created": svc.started, "root": base}]
        cards += [{"id": s.name, "created": _epoch(s.created, svc.started), "root": base, "parent": ROUTER_MODEL,
                   "skills": len(s.skills)} for s in snap.manifest.shards]
        return {"data": cards}

    @app.get("/v1/shards", response_model=S.ShardList, summary="Shards with their skills, a page at a time")
    async def shards(offset: int = Query(0, ge=0, description="first shard (0-based)"),
                     limit: int = Query(100, ge=1, le=1000, description="shards per page")):
        snap = svc.snapshot
        everything = snap.manifest.shards
        out = []
        for i, s in enumerate(everything[offset:offset + limit], offset + 1):
            cat = snap.catalogs.get(s.name, {})
            specs = {d.get("id"): d for d in cat.get("specs") or [] if isinstance(d, dict)}
            skills = [specs.get(k) or {"id": k} for k in s.skills]
            out.append({"name": s.name, "index": i, "skills": skills, "target_format": s.target_format,
                        "created": s.created, "train_examples": s.training.get("examples")})
        following = offset + limit if offset + limit < len(everything) else None
        return {"bank": snap.bank.root.name, "base": snap.manifest.base, "version": snap.version,
                "total": len(everything), "offset": offset, "next_offset": following, "shards": out}

    @app.get("/healthz", response_model=S.Health, responses={503: {"model": S.Health}}, summary="Liveness")
    async def healthz():
        ok = svc.batcher is not None and svc.batcher.alive
        running = svc.learner.running()
        body = {"status": "ok" if ok else "degraded", "mode": svc.mode, "shards": len(svc.snapshot.shard_names),
                "queue_depth": svc.batcher.depth if svc.batcher else 0, "learning": running.id if running else None,
                "version": svc.snapshot.version}
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response)
    async def metrics():
        from prometheus_client import CONTENT_TYPE_LATEST
        return Response(svc.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def playground():
        return HTMLResponse(_playground_html())

    # -- learning while serving ---------------------------------------------------------------------
    learn_body = {"content": {
        "application/json": {"schema": S.LearnRequest.model_json_schema()},
        "application/x-ndjson": {"schema": {"type": "string", "description": "the records file itself (JSON Lines)"}}}}

    @app.post("/v1/families", status_code=202, response_model=S.LearnJobInfo, responses=ADMIN_ERRORS,
              openapi_extra={"requestBody": {"required": True, **learn_body}},
              summary="Learn a new skill family in the background (bearer token)")
    async def learn_family(request: Request,
                           family: Optional[str] = Query(None, description="family name (JSON Lines body)"),
                           recipe: str = Query("auto", description="'auto' (by the base's size), 'paper' or "
                                               "'small-cpu' (JSON Lines body)"),
                           epochs: Optional[int] = Query(None, ge=1, description="override (JSON Lines body)")):
        svc.check_admin(request)
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        raw = await request.body()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ServiceError(400, "the body is not UTF-8 text") from None
        if ctype == "application/json":
            try:
                learn = S.LearnRequest.model_validate_json(raw)
            except ValueError as exc:
                errs = getattr(exc, "errors", lambda: [])()
                if errs and errs[0].get("type") == "json_invalid":
                    raise ServiceError(400, f"malformed JSON body: {errs[0].get('msg')}") from None
                detail = "; ".join(f"{'.'.join(str(x) for x in e['loc']) or 'body'}: {e['msg']}" for e in errs[:5])
                raise ServiceError(422, f"invalid learn request: {detail or exc}") from None
            records = learn.records if isinstance(learn.records, str) else \
                "\n".join(json.dumps(r, ensure_ascii=False) for r in learn.records)
            name, rec, train, skills = learn.family, learn.recipe, dict(learn.train), learn.skills
        elif ctype in JSONL_TYPES:
            if not family:
                raise ServiceError(422, "the family name is missing: POST /v1/families?family=NAME", param="family")
            name, rec, train, skills, records = family, recipe, {}, None, text
            if epochs is not None:
                train["epochs"] = epochs
        else:
            raise ServiceError(415, f"unsupported content type {ctype or '(none)'!r}: send application/json "
                                    "or the records file as application/x-ndjson")
        snap = svc.snapshot
        served = {s.name: list(s.skills) for s in snap.manifest.shards}
        try:
            job = svc.learner.start(name, records, served=served, recipe=rec, train=train, skills=skills)
        except LearnRefused as exc:
            raise ServiceError(exc.status, str(exc), param="family" if "family" in str(exc) else None) from None
        return JSONResponse(job.to_dict(), status_code=202, headers={"Location": f"/v1/families/{job.id}"})

    @app.get("/v1/families", response_model=S.LearnJobList, responses=ADMIN_ERRORS, summary="Learn jobs")
    async def list_jobs(request: Request):
        svc.check_admin(request)
        return {"jobs": [j.to_dict() for j in svc.learner.jobs.values()]}

    def _job(job_id: str):
        if job_id not in svc.learner.jobs:
            raise ServiceError(404, f"no learn job {job_id!r}", param="job")
        return svc.learner.jobs[job_id]

    @app.get("/v1/families/{job_id}", response_model=S.LearnJobInfo, responses=ADMIN_ERRORS,
             summary="A learn job's state and progress")
    async def get_job(job_id: str, request: Request):
        svc.check_admin(request)
        return _job(job_id).to_dict()

    @app.delete("/v1/families/{job_id}", response_model=S.LearnJobInfo, responses=ADMIN_ERRORS,
                summary="Cancel a learn job (the bank stays as it was)")
    async def cancel_job(job_id: str, request: Request):
        svc.check_admin(request)
        _job(job_id)
        return svc.learner.cancel(job_id).to_dict()

    @app.post("/v1/load_lora_adapter", response_class=Response, responses=ADMIN_ERRORS,
              summary="vLLM's runtime LoRA call: serve a shard just published into this bank (bearer token)")
    async def load_lora_adapter(body: S.LoadAdapterRequest, request: Request):
        # A front service in --upstream mode calls this after a learn; only a shard the bank on disk has
        # published is loaded, never an arbitrary path.
        svc.check_admin(request)
        try:
            await svc.reload()
        except SkillbankError as exc:
            raise ServiceError(409, str(exc)) from None
        snap = svc.snapshot
        if body.lora_name not in snap.shard_names:
            raise ServiceError(404, f"{body.lora_name!r} is not a published shard of this bank; shards: "
                                    f"{snap.shard_names}", param="lora_name")
        expected = (snap.bank.root / snap.entry(body.lora_name).dir).resolve()
        if "\x00" in body.lora_path:
            raise ServiceError(422, "lora_path contains a NUL byte", param="lora_path")
        if Path(body.lora_path).resolve() != expected:
            raise ServiceError(409, f"shard {body.lora_name!r} of this bank is at {expected}, not {body.lora_path}",
                               param="lora_path")
        return Response(f"Success: LoRA adapter '{body.lora_name}' added successfully.", media_type="text/plain")

    @app.post("/v1/reload", response_model=S.ShardList, responses=ADMIN_ERRORS,
              summary="Pick up families learned into the bank by another process (bearer token)")
    async def reload(request: Request):
        svc.check_admin(request)
        try:
            await svc.reload()
        except SkillbankError as exc:
            raise ServiceError(409, str(exc)) from None
        except UpstreamError as exc:
            raise ServiceError(502, str(exc)) from None
        return await shards(offset=0, limit=max(1, len(svc.snapshot.shard_names)))  # the whole list

    return app


def service_of(app: FastAPI) -> Service:
    return app.state.service


__all__ = ["create_app", "ServeConfig", "Service", "ServiceError", "service_of"]
