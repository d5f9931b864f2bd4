"""The HTTP service: ``create_app(bank, config)`` returns a FastAPI app over one skill bank.

    POST /v1/plan               one request or a list -> shard, routing probabilities, canonical graph, timings
    POST /v1/chat/completions   OpenAI-compatible; model "skillbank" routes by content, "<shard>" forces it
    GET  /v1/models             the router and the shards, as OpenAI model cards
    GET  /v1/shards             shards with their skills (and specs when the bank has them)
    POST /v1/families           learn a new family in the background (bearer token)
    GET  /v1/families[/{job}]   learn jobs and their progress (bearer token); DELETE cancels one
    POST /v1/reload             pick up families learned into the bank by another process (bearer token)
    GET  /healthz, /metrics     liveness and Prometheus metrics
    GET  /                      the playground page

Every error is ``{"error": {"message", "type", "param"}}`` with a fitting status; no traceback ever leaves
the process (unexpected errors are logged and answered with a generic 500).
"""
from __future__ import annotations

import asyncio
import hmac
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
from skillbank.model.generate import DEFAULT_MAX_NEW_TOKENS
from skillbank.model.prompts import USER_TEMPLATE
from skillbank.serve import schemas as S
from skillbank.serve.batcher import Batcher, QueueFull
from skillbank.serve.config import ADMIN_TOKEN_ENV, ServeConfig
from skillbank.serve.engine import Job, LocalEngine, Output, UpstreamEngine, UpstreamError
from skillbank.serve.learn import LearnManager, LearnRefused
from skillbank.serve.metrics import Metrics, MetricsMiddleware
from skillbank.serve.state import Snapshot, newer_snapshot, open_snapshot

log = logging.getLogger("skillbank.serve")

ROUTER_MODEL = "skillbank"
ERROR_TYPES = {400: "invalid_request_error", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               405: "invalid_request_error", 409: "conflict", 413: "too_large", 415: "invalid_request_error",
               422: "invalid_request_error", 429: "rate_limited", 502: "upstream_error", 503: "unavailable",
               504: "timeout"}
ERRORS = {code: {"model": S.ErrorResponse} for code in (400, 413, 422, 429, 504)}
ADMIN_ERRORS = {code: {"model": S.ErrorResponse} for code in (401, 403, 404, 409, 413, 422)}
JSONL_TYPES = ("application/x-ndjson", "application/jsonl", "application/jsonlines", "text/plain")


class ServiceError(Exception):
    """An answer other than 200, raised anywhere in a handler."""

    def __init__(self, status: int, message: str, *, param: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers or {}


def error_response(status: int, message: str, param: str | None = None, headers: dict | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": ERROR_TYPES.get(status, "internal_error"), "param": param}}
    return JSONResponse(body, status_code=status, headers=headers)


class Service:
    """The state behind the app: the served snapshot, the engine, the batcher, learn jobs, metrics."""

    def __init__(self, snapshot: Snapshot, config: ServeConfig):
        self.snapshot = snapshot
        self.config = config
        self.metrics = Metrics()
        self.metrics.shards.set(len(snapshot.shard_names))
        if config.upstream:
            self.engine = UpstreamEngine(config.upstream, config.upstream_timeout_s)
        else:
            self.engine = LocalEngine(snapshot.bank.execution)
        self.batcher: Batcher | None = None  # made on the event loop, at startup
        self.learner = LearnManager(snapshot.bank.root, threads=config.learn_threads, on_finished=self.reload,
                                    metrics=self.metrics)
        self.started = int(time.time())

    @property
    def mode(self) -> str:
        return "upstream" if self.config.upstream else "local"

    async def start(self) -> None:
        self.batcher = Batcher(self.engine, max_batch=self.config.effective_max_batch,
                               window_s=self.config.effective_window_s, queue_size=self.config.queue_size,
                               metrics=self.metrics)
        self.batcher.start()

    async def stop(self) -> None:
        await self.learner.close()
        if self.batcher is not None:
            await self.batcher.stop()
        if isinstance(self.engine, UpstreamEngine):
            await self.engine.aclose()
        self.engine.close()

    async def reload(self) -> list[str]:
        """Swap in the bank as published on disk, if it gained shards; returns the names added."""
        current = self.snapshot
        new = await self.engine.call(newer_snapshot, current)
        if new is None:
            return []
        self.snapshot = new  # one assignment: requests already accepted keep the snapshot they were routed with
        self.metrics.shards.set(len(new.shard_names))
        added = [s for s in new.shard_names if s not in current.shard_names]
        log.info("serving %d shards (added %s)", len(new.shard_names), ", ".join(added))
        return added

    def default_max_new_tokens(self, snap: Snapshot) -> int:
        if self.config.max_new_tokens:
            return self.config.max_new_tokens
        longest = snap.max_target_tokens()
        return min(DEFAULT_MAX_NEW_TOKENS, 2 * longest) if longest else DEFAULT_MAX_NEW_TOKENS

    # -- the one planning path of /v1/plan and /v1/chat/completions --------------------------------
    async def plan(self, requests: list[str], *, shard: str | None, max_new_tokens: int | None,
                   http: Request | None, param: str = "request") -> list[tuple[Job, Output]]:
        cfg, snap = self.config, self.snapshot
        if not snap.shard_names:
            raise ServiceError(409, f"the bank {snap.bank.root.name} has no shards yet; learn a family first")
        if len(requests) > cfg.max_list:
            raise ServiceError(413, f"too many requests in one call: {len(requests)}, the limit is {cfg.max_list}",
                               param=param)
        if not requests:
            raise ServiceError(422, "no requests given: send a string or a non-empty list", param=param)
        for i, r in enumerate(requests):
            where = param if len(requests) == 1 else f"{param}[{i}]"
            if not r.strip():
                raise ServiceError(422, f"{where} is empty", param=where)
            if len(r) > cfg.max_request_chars:
                raise ServiceError(413, f"{where} is {len(r)} characters long, the limit is {cfg.max_request_chars}",
                                   param=where)
        requests = [r.strip() for r in requests]

        t0 = time.perf_counter()
        if shard is not None:
            if shard not in snap.shard_names:
                raise ServiceError(404, f"unknown shard {shard!r}; this bank has {snap.shard_names}", param="shard")
            names, probs = [shard] * len(requests), [{shard: 1.0}] * len(requests)
        else:
            names, proba = snap.route(requests)
            classes = list(snap.bank.address.classes_)
            probs = [{c: float(p) for c, p in zip(classes, row)} for row in proba]
        route_s = (time.perf_counter() - t0) / len(requests)
        self.metrics.route_seconds.observe(route_s)

        cap = self.default_max_new_tokens(snap)
        mnt = min(max_new_tokens, cap) if max_new_tokens else cap
        limit = self.engine.context_limit()
        loop = asyncio.get_running_loop()
        jobs = []
        for i, (req, name, p) in enumerate(zip(requests, names, probs)):
            entry = snap.entry(name)
            n_prompt = self.engine.prompt_tokens(req, entry)
            if limit and n_prompt + mnt > limit:
                where = param if len(requests) == 1 else f"{param}[{i}]"
                raise ServiceError(413, f"{where} is too long: {n_prompt} prompt tokens + {mnt} generation tokens "
                                        f"exceed the base model's context of {limit} tokens", param=where)
            jobs.append(Job(req, name, entry, p, route_s, mnt, loop.create_future(), prompt_tokens=n_prompt))
        try:
            self.batcher.submit(jobs)
        except QueueFull as exc:
            self.metrics.errors.labels("queue_full").inc()
            raise ServiceError(429, str(exc), headers={"Retry-After": str(exc.retry_after_s)}) from None
        return list(zip(jobs, await self._wait(jobs, http)))

    async def _wait(self, jobs: list[Job], http: Request | None) -> list[Output]:
        """Wait for every job, the deadline, or the client going away - whichever comes first."""
        gathered = asyncio.gather(*(j.future for j in jobs))
        waiters = {gathered}
        watcher = None
        if http is not None:
            watcher = asyncio.ensure_future(_disconnected(http))
            waiters.add(watcher)
        deadline = jobs[0].enqueued + self.config.timeout_s
        try:
            done, _ = await asyncio.wait(waiters, timeout=max(0.0, deadline - time.perf_counter()),
                                         return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the server cancelled this request (shutdown, or the client left)
            self._abandon(jobs, gathered)
            raise
        finally:
            if watcher is not None:
                watcher.cancel()
        if gathered in done:
            try:
                return gathered.result()
            except UpstreamError as exc:
                self.metrics.errors.labels("upstream").inc()
                raise ServiceError(exc.status, str(exc)) from None
            except SkillbankError as exc:
                self.metrics.errors.labels("generation").inc()
                raise ServiceError(500, f"generation failed: {exc}") from None
            except asyncio.CancelledError:
                raise ServiceError(503, "the service is shutting down") from None
        self._abandon(jobs, gathered)
        if watcher is not None and watcher in done:
            self.metrics.errors.labels("client_disconnected").inc()
            # Nobody reads this answer; it only ends the handler (and is counted as 499 in the logs of proxies).
            raise ServiceError(499, "client closed the connection")
        self.metrics.errors.labels("timeout").inc()
        raise ServiceError(504, f"no answer within the {self.config.timeout_s:g} s timeout "
                                f"(queue depth {self.batcher.depth}); try again or raise --timeout-s")

    @staticmethod
    def _abandon(jobs: list[Job], gathered: asyncio.Future) -> None:
        for job in jobs:
            job.cancelled = True  # a queued job is dropped; a generating one finishes for its batch-mates
        gathered.cancel()
        gathered.add_done_callback(lambda f: f.cancelled() or f.exception())  # no "never retrieved" warning

    def plan_result(self, job: Job, out: Output, arrived: float, routed: bool) -> dict:
        valid = out.parsed.graph is not None
        self.metrics.plans.labels(job.shard, str(valid).lower()).inc()
        queue_s = max(0.0, out.started - job.enqueued)
        self.metrics.queue_seconds.observe(queue_s)
        self.metrics.generate_seconds.observe(out.generate_s)
        return {"request": job.request, "shard": job.shard, "routed": routed, "probabilities": job.probabilities, "valid": valid,
                "graph": out.parsed.graph.canonical().to_dict() if valid else None,
                "error": None if valid else out.parsed.error, "raw": out.text, "tokens": out.n_tokens,
                "truncated": not out.stopped, "batch_size": out.batch_size,
                "timings": {"queue_ms": 1000 * queue_s, "route_ms": 1000 * job.route_s,
                            "generate_ms": 1000 * out.generate_s,
                            "total_ms": 1000 * (time.perf_counter() - arrived)}}

    def check_admin(self, request: Request) -> None:
        token = self.config.admin_token
        if not token:
            raise ServiceError(403, f"learning over HTTP is disabled: start the service with ${ADMIN_TOKEN_ENV} set")
        given = request.headers.get("authorization", "")
        scheme, _, value = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), token.encode()):
            self.metrics.errors.labels("unauthorized").inc()
            raise ServiceError(401, "missing or wrong bearer token (Authorization: Bearer <token>)",
                               headers={"WWW-Authenticate": "Bearer"})


class BodyLimitMiddleware:
    """Refuse a body whose Content-Length is over the limit (413) before reading it. Pure ASGI, like
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
        await self.app(scope, receive, send)


async def _disconnected(http: Request) -> None:
    """Return when the client has gone away (the ASGI server delivers ``http.disconnect``)."""
    while True:
        message = await http.receive()
        if message["type"] == "http.disconnect":
            return


def _is_union_branch(loc_item) -> bool:
    return isinstance(loc_item, str) and (loc_item in ("str", "int", "float", "bool", "dict") or "[" in loc_item)


def _request_of_chat(body: S.ChatRequest) -> str:
    """The request to plan: the last user message (string or text parts), without the executor's own prompt
    wording if a client (e.g. another skillbank in --upstream mode) already added it."""
    for msg in reversed(body.messages):
        if msg.role != "user":
            continue
        content = msg.content
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        if not isinstance(content, str):
            break
        prefix = USER_TEMPLATE.split("{request}")[0]
        return content[len(prefix):] if content.startswith(prefix) else content
    raise ServiceError(400, "no user message with text content: the last user message is the request to plan",
                       param="messages")


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
    snapshot = bank if isinstance(bank, Snapshot) else open_snapshot(Path(bank), base, load_model=not config.upstream)
    svc = Service(snapshot, config)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await svc.start()
        try:
            yield
        finally:
            await svc.stop()

    app = FastAPI(title="skillbank", version="1", lifespan=lifespan,
                  description="Content-routed planning over a skill bank: the Address Memory picks the executor "
                              "shard from the request, the shard writes the task graph.")
    app.state.service = svc
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
        message = exc.detail if isinstance(exc.detail, str) else "error"
        if exc.status_code == 404 and message == "Not Found":
            message = f"no such endpoint: {request.method} {request.url.path}"
        return error_response(exc.status_code, message, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        svc.metrics.errors.labels("internal").inc()
        return error_response(500, "internal error; the service log has the details")

    app.add_middleware(BodyLimitMiddleware, limit=body_limit, upload_limit=upload_limit, metrics=svc.metrics)
    app.add_middleware(MetricsMiddleware, metrics=svc.metrics)

    # -- planning -----------------------------------------------------------------------------------
    @app.post("/v1/plan", response_model=S.PlanResponse, responses={**ERRORS, 404: {"model": S.ErrorResponse},
                                                                    409: {"model": S.ErrorResponse}},
              summary="Plan one request or a list: route, generate, parse")
    async def plan(body: S.PlanRequest, request: Request):
        arrived = time.perf_counter()
        reqs = [body.request] if isinstance(body.request, str) else list(body.request)
        results = await svc.plan(reqs, shard=body.shard, max_new_tokens=body.max_new_tokens, http=request)
        return {"plans": [svc.plan_result(job, out, arrived, body.shard is None) for job, out in results]}

    @app.post("/v1/chat/completions", response_model=S.ChatResponse,
              responses={**ERRORS, 404: {"model": S.ErrorResponse}, 409: {"model": S.ErrorResponse},
                         502: {"model": S.ErrorResponse}},
              summary="OpenAI-compatible chat completion whose answer is the task graph")
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
        [(job, out)] = await svc.plan([text], shard=shard, http=request, param="messages",
                                      max_new_tokens=body.max_completion_tokens or body.max_tokens)
        p = svc.plan_result(job, out, arrived, shard is None)
        content = json.dumps(p["graph"], ensure_ascii=False) if p["valid"] else out.text
        return {"id": "chatcmpl-" + uuid.uuid4().hex[:24], "created": int(time.time()), "model": job.shard,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                             "finish_reason": "length" if p["truncated"] else "stop"}],
                "usage": {"prompt_tokens": job.prompt_tokens, "completion_tokens": out.n_tokens,
                          "total_tokens": job.prompt_tokens + out.n_tokens},
                "skillbank": {"shard": job.shard, "routed": shard is None, "probabilities": job.probabilities,
                              "valid": p["valid"], "error": p["error"], "timings": p["timings"]}}

    # -- describing the bank ------------------------------------------------------------------------
    @app.get("/v1/models", response_model=S.ModelList, summary="The router and the shards as OpenAI model cards")
    async def models():
        snap = svc.snapshot
        base = snap.manifest.base.get("name")
        cards = [{"id": ROUTER_MODEL, "created": svc.started, "root": base}]
        cards += [{"id": s.name, "created": _epoch(s.created, svc.started), "root": base, "parent": ROUTER_MODEL,
                   "skills": len(s.skills)} for s in snap.manifest.shards]
        return {"data": cards}

    @app.get("/v1/shards", response_model=S.ShardList, summary="Shards with their skills")
    async def shards():
        snap = svc.snapshot
        out = []
        for i, s in enumerate(snap.manifest.shards, 1):
            cat = snap.catalogs.get(s.name, {})
            specs = {d.get("id"): d for d in cat.get("specs") or [] if isinstance(d, dict)}
            skills = [specs.get(k) or {"id": k} for k in s.skills]
            out.append({"name": s.name, "index": i, "skills": skills, "target_format": s.target_format,
                        "created": s.created, "train_examples": s.training.get("examples")})
        return {"bank": snap.bank.root.name, "base": snap.manifest.base, "version": snap.version, "shards": out}

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
                           recipe: str = Query("paper", description="'paper' or 'small-cpu' (JSON Lines body)"),
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

    @app.post("/v1/reload", response_model=S.ShardList, responses=ADMIN_ERRORS,
              summary="Pick up families learned into the bank by another process (bearer token)")
    async def reload(request: Request):
        svc.check_admin(request)
        try:
            await svc.reload()
        except SkillbankError as exc:
            raise ServiceError(409, str(exc)) from None
        return await shards()

    return app


def service_of(app: FastAPI) -> Service:
    return app.state.service


__all__ = ["create_app", "ServeConfig", "Service", "ServiceError", "service_of"]
