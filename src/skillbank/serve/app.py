"""The HTTP service: ``create_app(bank, config)`` returns a FastAPI app over one skill bank.

    POST /v1/plan               one request or a list -> shard, routing probabilities, canonical graph, timings
    POST /v1/chat/completions   OpenAI-compatible; model "skillbank" routes by content, "<shard>" forces it
    GET  /v1/models             the router and the shards, as OpenAI model cards
    GET  /v1/shards             shards with their skills (and specs when the bank has them)
    POST /v1/families           learn a new family in the background (bearer token)
    GET  /v1/families[/{job}]   learn jobs and their progress (bearer token); POST .../{job}/cancel cancels
                                one, DELETE cancels and forgets it
    POST /v1/reload             pick up families learned into the bank by another process (bearer token)
    POST /v1/load_lora_adapter  the same, in vLLM's runtime-LoRA form (what a front in --upstream mode calls)
    GET  /healthz, /metrics     liveness and Prometheus metrics
    GET  /                      the playground page

Every error is ``{"error": {"message", "type", "param"}}`` with a fitting status (on the OpenAI-compatible
endpoint a malformed field is a 400 naming it, as OpenAI answers); no traceback ever leaves the process
(unexpected errors are logged and answered with a generic 500). A request of a list that its shard cannot
serve is answered in its own plan (``failed``, ``error``); the others are generated. The OpenAPI schema states
the rules the service enforces (skillbank.serve.openapi).
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from contextlib import asynccontextmanager
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Literal, Optional

from fastapi import FastAPI
from fastapi import Path as PathParam
from fastapi import Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from skillbank.errors import SkillbankError
from skillbank.memory.bank import FAMILY_NAME, check_family_name
from skillbank.serve import openapi
from skillbank.serve import schemas as S
from skillbank.serve.chat import answer_message, check_settings, grammar_of_chat, request_of_chat, wants_tool_calls
from skillbank.serve.config import ServeConfig
from skillbank.serve.engine import UpstreamError
from skillbank.serve.learn_jobs import RECIPES, LearnRefused
from skillbank.serve.metrics import MetricsMiddleware
from skillbank.serve.middleware import (BodyLimitMiddleware, BodyTooLarge, EarlyAdmissionMiddleware,
                                        HeadAsGetMiddleware, HostCheckMiddleware, InternalErrorMiddleware)
from skillbank.serve.service import (ADMIN_ERRORS, serve_engine, ERRORS, JSONL_TYPES, ROUTER_MODEL, Service, ServiceError,
                                     error_response)
from skillbank.serve.state import Snapshot, open_snapshot

log = logging.getLogger("skillbank.serve")
JOB_ID = r"^[0-9a-f]{12}$"
_request_of_chat = request_of_chat  # the name tests and older callers import


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


def _is_union_branch(loc_item) -> bool:
    return isinstance(loc_item, str) and (loc_item in ("str", "int", "float", "bool", "dict") or "[" in loc_item)


def _epoch(created: str, default: int) -> int:
    try:
        return int(datetime.strptime(created, "%Y-%m-%dT%H:%M:%S").timestamp())
    except (TypeError, ValueError):
        return default


def _allowed_methods(app: FastAPI, path: str) -> list[str]:
    """Every method some route answers on ``path`` (Starlette's 405 names only the first route's: a path with
    a GET route and a DELETE route would say ``Allow: GET``). HEAD wherever GET is (HeadAsGetMiddleware)."""
    methods = {m for r in app.routes if getattr(r, "methods", None) and r.path_regex.match(path) for m in r.methods}
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods)


def _playground_html() -> str:
    return resources.files("skillbank.serve").joinpath("static/playground.html").read_text(encoding="utf-8")


def create_app(bank: str | Path | Snapshot, config: ServeConfig | None = None, *, base=None) -> FastAPI:
    """The FastAPI app serving ``bank`` (a path, or a Snapshot already opened). ``base``: a LoadedBase to
    reuse instead of loading the bank's base model (tests; not used in upstream mode)."""
    config = config or ServeConfig.from_env()
    if isinstance(bank, Snapshot):
        snapshot = bank
        engine = "upstream" if config.upstream else ("llama.cpp" if config.engine == "llama.cpp" else "torch")
    else:
        engine = serve_engine(Path(bank), config, base)
        snapshot = open_snapshot(Path(bank), base, load_model=engine == "torch", threads=config.model_threads,
                                 max_resident=config.max_resident)
    svc = Service(snapshot, config, engine=engine)

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
    openapi.install(app, config, lora_targets=svc.lora_targets, num_layers=svc.num_layers)
    upload_limit = int(config.max_upload_mb * 1024 * 1024)
    # A plan call holds at most max_list requests of max_request_chars (UTF-8: <= 4 bytes each), plus JSON.
    body_limit = config.max_list * config.max_request_chars * 4 + 64 * 1024

    # -- errors --------------------------------------------------------------------------------------
    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError):
        return error_response(exc.status, exc.message, exc.param, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        # OpenAI answers a malformed field of a chat completion with 400 naming it; the rest of the API with 422.
        status = 400 if request.url.path == "/v1/chat/completions" else 422
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
        return error_response(status, "invalid request: " + "; ".join(parts), next(iter(by_field)))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        if isinstance(exc.__cause__, BodyTooLarge):  # FastAPI turns a failed body read into "error parsing the body"
            return await _too_large(request, exc.__cause__)
        message = exc.detail if isinstance(exc.detail, str) else "error"
        headers = getattr(exc, "headers", None)
        if exc.status_code == 404 and message == "Not Found":
            message = f"no such endpoint: {request.method} {request.url.path}"
        if exc.status_code == 405:
            allowed = _allowed_methods(app, request.url.path)
            message = f"Method Not Allowed: {request.method} on {request.url.path}; allowed: {', '.join(allowed)}"
            headers = {**(headers or {}), "Allow": ", ".join(allowed)}
        return error_response(exc.status_code, message, headers=headers)

    @app.exception_handler(BodyTooLarge)
    async def _too_large(request: Request, exc: BodyTooLarge):
        svc.metrics.errors.labels("too_large").inc()
        return error_response(413, str(exc))

    def _unexpected(scope, exc: Exception) -> None:
        log.error("unhandled error on %s %s", scope.get("method"), scope.get("path"), exc_info=exc)
        svc.metrics.errors.labels("internal").inc()

    app.add_middleware(EarlyAdmissionMiddleware, service=svc)
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
                          "`reason`. A request whose shard cannot serve it (its files damaged or missing, its "
                          "adapter failing to load or generate) gets `failed: true` and an `error` naming the shard "
                          "(never a server path); the call's other requests are generated, and the call answers "
                          "200. Every plan carries `confidence` {route, scope_margin, executor_logprob}; with "
                          "`explain: true`, also `explain`: the scope margin, the top families, the words that "
                          "counted for the chosen one and the spans read as argument values.")
    async def plan(body: S.PlanRequest, request: Request):
        arrived = time.perf_counter()
        reqs = [body.request] if isinstance(body.request, str) else list(body.request)
        results = await svc.plan(reqs, shard=body.shard, max_new_tokens=body.max_new_tokens, http=request)
        return {"plans": [svc.plan_result(q, arrived, explain=body.explain) for q in results]}

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
        check_settings(body)
        snap = svc.snapshot
        if body.model == ROUTER_MODEL:
            shard = None
        elif body.model in snap.shard_names:
            shard = body.model
        else:
            raise ServiceError(404, f"unknown model {body.model!r}: use {ROUTER_MODEL!r} (routes by content) or a "
                                    f"shard name: {snap.shard_names}", param="model")
        text = request_of_chat(body)
        grammar = grammar_of_chat(body)
        if grammar is not None:
            svc.metrics.structured.inc()
        [q] = await svc.plan([text], shard=shard, http=request, param="messages",
                             max_new_tokens=body.max_completion_tokens or body.max_tokens, grammar=grammar)
        p = svc.plan_result(q, arrived)
        message, finish = answer_message(p, q.out.text if q.out else "", wants_tool_calls(body))
        prompt_tokens = q.job.prompt_tokens if q.job else 0
        completion_tokens = q.out.n_tokens if q.out else 0
        return {"id": "chatcmpl-" + uuid.uuid4().hex[:24], "created": int(time.time()),
                "model": p["shard"] or ROUTER_MODEL,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens},
                "skillbank": {"shard": p["shard"], "routed": shard is None, "probabilities": p["probabilities"],
                              "valid": p["valid"], "failed": p["failed"], "error": p["error"],
                              "out_of_scope": p["out_of_scope"],
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
        body = {"status": "ok" if ok else "degraded", "mode": svc.mode, "engine": svc.engine_kind,
                "shards": len(svc.snapshot.shard_names),
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
        "application/x-ndjson": {"schema": {"type": "string", "pattern": S.NON_BLANK,
                                            "description": "the records file itself (JSON Lines; also accepted as "
                                                           "application/jsonl or text/plain)"}}}}

    @app.post("/v1/families", status_code=202, response_model=S.LearnJobInfo, responses=ADMIN_ERRORS,
              openapi_extra={"requestBody": {"required": True, **learn_body}},
              summary="Learn a new skill family in the background (bearer token)",
              description="The whole upload is checked before the job starts (202): the family name, the training "
                          "settings, every record - plain Unicode text, no control characters, a valid graph, the "
                          "call's family, skills no other shard has - and, where this service holds the base model, "
                          "every record tokenized as training will. A refused upload is a 409 or 422 naming the "
                          "line; a job fails only for what no upload check can see.")
    async def learn_family(request: Request,
                           family: Optional[str] = Query(None, description="family name (JSON Lines body)",
                                                         json_schema_extra={"pattern": FAMILY_NAME.pattern}),
                           recipe: Literal[RECIPES] = Query("auto", description="'auto' (by the base's size), "
                                                            "'paper' or 'small-cpu' (JSON Lines body)"),
                           epochs: Optional[int] = Query(None, ge=1, description="override (JSON Lines body)")):
        svc.check_admin(request)
        if family is not None:  # checked whatever the body (the schema says what a name may be)
            try:
                check_family_name(family)
            except SkillbankError as exc:
                raise ServiceError(422, str(exc), param="family") from None
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        raw = await request.body()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ServiceError(400, f"the body is not UTF-8 text (byte 0x{raw[exc.start]:02x} at byte {exc.start})") \
                from None
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
            # Off the event loop: checking may tokenize every record of a large upload.
            upload = await asyncio.to_thread(svc.learner.check, name, records, served=served, recipe=rec,
                                             train=train, skills=skills, base_check=svc.learn_base_check)
            job = svc.learner.launch(upload)
        except LearnRefused as exc:
            svc.metrics.errors.labels("learn_refused").inc()
            raise ServiceError(exc.status, str(exc), param="family" if "family" in str(exc) else None) from None
        return JSONResponse(job.to_dict(), status_code=202, headers={"Location": f"/v1/families/{job.id}"})

    @app.get("/v1/families", response_model=S.LearnJobList, responses=ADMIN_ERRORS, summary="Learn jobs")
    async def list_jobs(request: Request):
        svc.check_admin(request)
        return {"jobs": [j.to_dict() for j in svc.learner.listed()]}

    def _job(job_id: str):
        if not svc.learner.visible(job_id):
            raise ServiceError(404, f"no learn job {job_id!r}", param="job")
        return svc.learner.jobs[job_id]

    job_param = PathParam(json_schema_extra={"pattern": JOB_ID}, description="the job id POST /v1/families gave")

    @app.get("/v1/families/{job_id}", response_model=S.LearnJobInfo, responses=ADMIN_ERRORS,
             summary="A learn job's state and progress")
    async def get_job(request: Request, job_id: str = job_param):
        svc.check_admin(request)
        return _job(job_id).to_dict()

    @app.post("/v1/families/{job_id}/cancel", response_model=S.LearnJobInfo, responses=ADMIN_ERRORS,
              summary="Cancel a learn job (the bank stays as it was); the job stays listed, as cancelled")
    async def cancel_job(request: Request, job_id: str = job_param):
        svc.check_admin(request)
        _job(job_id)
        return svc.learner.cancel(job_id).to_dict()

    @app.delete("/v1/families/{job_id}", response_model=S.LearnJobInfo, responses=ADMIN_ERRORS,
                summary="Delete a learn job: cancel it if it runs (the bank stays as it was) and forget it",
                description="Answers the job as it was left; from then on the job is 404 and no longer listed. "
                            "To cancel and keep the record, POST /v1/families/{job_id}/cancel.")
    async def delete_job(request: Request, job_id: str = job_param):
        svc.check_admin(request)
        _job(job_id)
        return svc.learner.delete(job_id).to_dict()

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
