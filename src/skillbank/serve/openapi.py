"""The OpenAPI schema as this service enforces it: FastAPI's, plus what FastAPI cannot know.

- The limits that come from the config (request length, list length) are written into the request schemas,
  so a client (or a fuzzer) reads the rules of the service it talks to.
- The admin operations declare the bearer token they check.
- Every error answer has the one error shape (``{"error": {...}}``, not FastAPI's ``{"detail": ...}``), and
  each operation lists the statuses it can answer with - those that any request may get too: 400 for a
  Host header the service does not answer to (or malformed JSON), 413 for a body over the limit, 429 for a
  full queue, 500 for an unexpected error.
- Text answers (/metrics, /v1/load_lora_adapter) are documented as text.
"""
from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from skillbank.serve.config import ServeConfig

ADMIN = {("/v1/families", "post"), ("/v1/families", "get"), ("/v1/families/{job_id}", "get"),
         ("/v1/families/{job_id}", "delete"), ("/v1/families/{job_id}/cancel", "post"), ("/v1/reload", "post"),
         ("/v1/load_lora_adapter", "post")}
TEXT_ANSWERS = {("/metrics", "get"): "Prometheus text exposition format",
                ("/v1/load_lora_adapter", "post"): "vLLM's success line"}
ERROR_REF = {"$ref": "#/components/schemas/ErrorResponse"}
ANY_REQUEST = {"400": "Bad Request: malformed JSON, or a Host header this service does not answer to",
               "500": "Internal error (logged; no detail leaves the service)"}
WITH_BODY = {"408": "The request body did not arrive in time (a live server closes the connection after it)",
             "413": "The body is over the limit"}


def install(app: FastAPI, config: ServeConfig, *, lora_targets: list[str] | None = None,
            num_layers: int | None = None) -> None:
    """Make ``app.openapi()`` return the schema described above (built once, on first request).
    ``lora_targets``, ``num_layers``: what a learn call's LoRA may target in the served base (local mode)."""

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                 routes=app.routes)
            app.openapi_schema = state_rules(schema, config, lora_targets, num_layers)
        return app.openapi_schema

    app.openapi = openapi


def state_rules(schema: dict, config: ServeConfig, lora_targets: list[str] | None = None,
                num_layers: int | None = None) -> dict:
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    request = schemas["PlanRequest"]["properties"]["request"]
    for branch in request["anyOf"]:
        text = branch["items"] if branch["type"] == "array" else branch
        text["maxLength"] = config.max_request_chars
        if branch["type"] == "array":
            branch["maxItems"] = config.max_list
    learn = schema["paths"]["/v1/families"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    train = learn["properties"]["train"]["properties"]
    if lora_targets:
        train["target_modules"]["items"] = {"enum": lora_targets}
    if num_layers:
        train["layers_to_transform"]["anyOf"][0]["items"]["maximum"] = num_layers - 1
    components.setdefault("securitySchemes", {})["bearer"] = {
        "type": "http", "scheme": "bearer",
        "description": "the admin token ($SKILLBANK_ADMIN_TOKEN); without one set, these operations answer 403"}
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            responses = op.setdefault("responses", {})
            for code, why in {**ANY_REQUEST, **(WITH_BODY if "requestBody" in op else {})}.items():
                responses.setdefault(code, {"description": why})
            if (path, method) in ADMIN:
                op["security"] = [{"bearer": []}]
                responses.setdefault("401", {"description": "Missing or wrong bearer token"})
                responses.setdefault("403", {"description": "Learning over HTTP is disabled (no admin token)"})
            for code, response in responses.items():
                documented = response.get("content", {}).get("application/json", {}).get("schema", {})
                if code[0] in "45" and (not documented or "HTTPValidationError" in documented.get("$ref", "")):
                    response["content"] = {"application/json": {"schema": ERROR_REF}}
            if (path, method) in TEXT_ANSWERS:
                ok = next(c for c in responses if c.startswith("2"))
                responses[ok]["content"] = {"text/plain": {"schema": {
                    "type": "string", "description": TEXT_ANSWERS[(path, method)]}}}
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    return schema
