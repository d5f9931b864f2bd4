"""The service's pure ASGI middleware (Starlette's BaseHTTPMiddleware would stand between the endpoints and the
client's disconnect message): body limits, the Host check, HEAD on GET routes, early refusal of a client over
its share of the queue, and the last line against unexpected errors. Each answers in the service's JSON error
shape."""
from __future__ import annotations

import asyncio

from starlette.requests import ClientDisconnect

from skillbank.serve.batcher import QueueFull
from skillbank.serve.metrics import Metrics
from skillbank.serve.service import error_response


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
        except ClientDisconnect:  # the client left (or its body timed out) while its body was read: nobody to answer
            return
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


class EarlyAdmissionMiddleware:
    """Refuse a planning call (429 with Retry-After) before its body is read when its client already holds its
    whole share of the queue, or the queue is full: a flooding client's retries then cost the service a
    header parse and a short answer each, not a JSON parse, a validation and a route - on a small machine the
    event loop shares the CPU with generation. The handler checks again with the call's real length.

    A client over its own share gets its 429 only after ``TARPIT_S`` (at most its Retry-After): one that honours
    Retry-After would not have sent anything sooner, and one that retries at once is slowed to a request per
    second per connection instead of hundreds - their cost, not their share of the queue, is what took the
    CPU from the others' generation (bench/serve.py --flood)."""

    PATHS = ("/v1/plan", "/v1/chat/completions")
    TARPIT_S = 1.0

    def __init__(self, app, *, service):
        self.app, self.service = app, service

    async def __call__(self, scope, receive, send):
        batcher = self.service.batcher
        if scope["type"] == "http" and batcher is not None and scope.get("method") == "POST" \
                and scope.get("path") in self.PATHS:
            client = (scope.get("client") or ("",))[0] or "unknown"
            try:
                batcher.check_room(1, client)
            except QueueFull as exc:
                self.service.metrics.errors.labels("client_queue_full" if exc.client else "queue_full").inc()
                if exc.client:
                    await asyncio.sleep(min(self.TARPIT_S, exc.retry_after_s))
                await error_response(429, str(exc), headers={"Retry-After": str(exc.retry_after_s)})(
                    scope, receive, send)
                return
        await self.app(scope, receive, send)
