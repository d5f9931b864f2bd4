"""Prometheus metrics of one app. Each app has its own registry, so several apps (tests) never share counters."""
from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

# The "_created" timestamp series double the output and no dashboard of ours reads them.
disable_created_metrics()

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
ROUTE_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2)
BATCH_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 128)

# Route templates: metrics are labelled by these, never by raw paths (a job id would make a new series each).
ENDPOINTS = ("/v1/plan", "/v1/chat/completions", "/v1/models", "/v1/shards", "/v1/families", "/v1/families/{job}",
             "/healthz", "/metrics", "/", "/openapi.json", "/docs")


def endpoint_label(path: str) -> str:
    if path in ENDPOINTS:
        return path
    if path.startswith("/v1/families/"):
        return "/v1/families/{job}"
    return "other"


class Metrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("skillbank_http_requests", "HTTP requests answered", ["endpoint", "method", "status"],
                                registry=r)
        self.latency = Histogram("skillbank_http_request_seconds", "HTTP request latency", ["endpoint"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.structured = Counter("skillbank_structured_output_requests",
                                  "Chat completions that brought their own grammar (structured_outputs)", registry=r)
        self.errors = Counter("skillbank_errors", "Requests answered with an error, by kind", ["kind"], registry=r)
        self.plans = Counter("skillbank_plans", "Plans generated, by shard and validity", ["shard", "valid"],
                             registry=r)
        # Labelled by the family that explained the request best: a family whose near-misses pile up here is
        # one whose users ask for skills it lacks.
        self.out_of_scope = Counter("skillbank_out_of_scope", "Routed requests refused as out of scope (not "
                                    "generated), by the closest family", ["closest"], registry=r)
        self.route_seconds = Histogram("skillbank_route_seconds", "Address Memory routing time per request",
                                       buckets=ROUTE_BUCKETS, registry=r)
        self.queue_seconds = Histogram("skillbank_queue_seconds", "Time a request waited before its batch started",
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.generate_seconds = Histogram("skillbank_generate_seconds", "Generation time of the batch a request was in",
                                          buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram("skillbank_batch_size", "Requests generated together", buckets=BATCH_BUCKETS,
                                    registry=r)
        self.queue_depth = Gauge("skillbank_queue_depth", "Requests queued or generating", registry=r)
        self.batch_limit = Gauge("skillbank_batch_limit", "Rows the batch may hold now (fair admission caps it "
                                 "while several clients are active)", registry=r)
        self.active_clients = Gauge("skillbank_active_clients", "Clients holding requests or answered in the last "
                                    "2 s", registry=r)
        self.shards = Gauge("skillbank_shards", "Shards in the served bank", registry=r)
        self.learn_jobs = Counter("skillbank_learn_jobs", "Background learn jobs finished, by outcome", ["state"],
                                  registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MetricsMiddleware:
    """Pure ASGI middleware (no BaseHTTPMiddleware: it would hide client disconnects from the endpoints):
    counts every HTTP answer by endpoint, method and status, and observes its latency."""

    def __init__(self, app, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = {"code": 500}
        t0 = time.perf_counter()

        async def send_wrapper(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            label = endpoint_label(scope.get("path", ""))
            self.metrics.requests.labels(label, scope.get("method", ""), str(status["code"])).inc()
            self.metrics.latency.labels(label).observe(time.perf_counter() - t0)
