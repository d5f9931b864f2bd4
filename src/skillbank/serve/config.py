"""The service's one typed configuration: the CLI, the app factory and the benchmark all build a ServeConfig."""
from __future__ import annotations

import os
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

from skillbank.serve.protocol import http_protocol

ADMIN_TOKEN_ENV = "SKILLBANK_ADMIN_TOKEN"


class ServeConfig(BaseModel):
    """How ``skillbank serve`` runs.

    batching: gather concurrent requests into batches (False = every request generated alone: batch size 1,
        no gather window; the baseline ``bench/serve.py`` compares against).
    batch_window_ms: how long the first request reaching an idle engine waits for company. A request arriving
        while the engine is decoding joins the running batch at its next step.
    max_batch: most requests decoded together (rows of several shards share one batch; see skillbank.model.decode).
    reuse_prefixes: prefill only what follows the prompt prefix a shard's requests share (skillbank.model.decode.PrefixKV).
    constrain: decode each request with its shard's grammar (only its skills and their declared arguments;
        skillbank.model.constrain); in upstream mode the grammar is sent as ``structured_outputs``.
    scope: refuse a routed request no learned family covers (the Address Memory's out-of-scope check,
        skillbank.memory.scope): it is answered as out of scope with the reason and never queued or generated.
        A forced shard is not checked; a bank without scope statistics is served without the check (logged).
    queue_size: most requests waiting or running; beyond it a call gets 429 with Retry-After.
    fair_admission: share the queue and the batch between clients (by peer address): each may hold at most
        ``client_queue`` requests waiting or running (beyond it that client, and only it, gets 429 with
        Retry-After, answered before its body is read; a client holding none may send a list of any length),
        and a free batch row goes to the client with the fewest rows generating. A client that floods the
        service then cannot starve one that sends a request at a time. False: one queue in arrival order (the
        baseline ``bench/serve.py --flood`` compares against).
    client_queue: one client's share of the queue; None = a quarter of queue_size.
    fair_slowdown: with fair admission, while more than one client is active the batch grows only while a
        decode step (measured on this machine) stays within this many times a lone row's: another client's
        flood slows a request at most this much (on a CPU a step's cost grows with the rows; on a GPU it
        hardly does, and the batch is not capped). 0: no cap.
    timeout_s: per-request deadline, queueing included (504 after it).
    max_request_chars / max_list: limits on one request's text and on the requests of one /v1/plan call (413).
    max_new_tokens: generation cap; None = twice the longest training target of any shard (what a correct
        graph can need, with room), at most 768 (the paper's cap).
    engine: what generates locally: ``"llama.cpp"`` (each shard's merged GGUF model; rows of one shard decode
        together, shards take turns - :class:`~skillbank.serve.engine.LlamaCppEngine`), ``"torch"`` (the
        reference engine: rows of every shard share each step - :class:`~skillbank.serve.engine.LocalEngine`), or
        ``"auto"`` (llama.cpp for a bank on the embedded base where llama-cpp-python is installed, else torch).
        Ignored with ``upstream``.
    upstream: base URL of an OpenAI-compatible server (vLLM, or another ``skillbank serve``) that generates;
        routing and the scope check stay here and the routed shard is sent as the model name. No base model is
        loaded locally (the scope check's small sentence encoder is, unless the bank's detector has none).
    admin_token: bearer token guarding ``POST /v1/families``; None = learning over HTTP is refused.
        Read from ``$SKILLBANK_ADMIN_TOKEN`` by :meth:`from_env`, never from the command line (it would
        show in ``ps``).
    threads: threads of the served model; None = one fewer than the cores (at least 1, at most 8), which
        leaves a core for the event loop and the HTTP traffic (on 2 cores this measured faster than 2 threads).
    max_resident: most shards kept loaded at once, least recently used evicted (None = every shard, once used;
        with the llama.cpp engine at most ``SERVED_MERGED`` merged models, 350-460 MB each); with torch a batch
        keeps every shard its rows decode with, so the bound is max(max_resident, shards in the batch).
    learn_threads: torch threads of a background learn process (None = half the cores: it shares them with
        serving).
    learn_checkpoint_minutes: a learn job's training writes its state into ``BANK/checkpoints/`` this often (0:
        never), so a job ended by a crash or a restart is continued by posting the same family and records again.
    max_upload_mb: largest records upload accepted by ``POST /v1/families``.
    allowed_hosts: Host header names answered (any port); None = any. ``skillbank serve`` on a loopback address
        sets the loopback names, so a web page cannot reach the service through a rebound DNS name.
    header_timeout_s: a request head (request line and headers) must arrive whole within this many seconds of the
        connection opening, or of its first byte on a kept-alive connection; else 408 and the connection is
        closed. Without it a client that sends part of a head, or nothing, holds its connection forever
        (slowloris): uvicorn times out only idle keep-alive connections. See :mod:`skillbank.serve.protocol`.
    body_timeout_s, body_min_rate: a request body must arrive within ``body_timeout_s`` seconds of its head, plus
        one second per ``body_min_rate`` bytes received (0: a fixed total); else 408 and the connection is
        closed. A client announcing a Content-Length and sending a byte now and then is dropped; an upload at
        a steady pace is not (64 MB at 64 KiB/s gets ~17 minutes).
    keep_alive_s: an idle keep-alive connection is closed after this many seconds (uvicorn's timeout_keep_alive).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    batching: bool = True
    batch_window_ms: float = Field(10.0, ge=0, le=10_000)
    max_batch: int = Field(16, ge=1, le=1024)
    reuse_prefixes: bool = True
    constrain: bool = True
    scope: bool = True
    max_resident: Optional[int] = Field(None, ge=1)
    queue_size: int = Field(256, ge=1)
    timeout_s: float = Field(120.0, gt=0)
    max_request_chars: int = Field(4000, ge=1)
    max_list: int = Field(64, ge=1)
    max_new_tokens: Optional[int] = Field(None, ge=1, le=8192)
    engine: Literal["auto", "llama.cpp", "torch"] = "auto"
    upstream: Optional[str] = None
    upstream_timeout_s: float = Field(120.0, gt=0)
    admin_token: Optional[str] = None
    threads: Optional[int] = Field(None, ge=1)
    learn_threads: Optional[int] = Field(None, ge=1)
    learn_checkpoint_minutes: float = Field(10.0, ge=0)
    max_upload_mb: float = Field(64.0, gt=0)
    allowed_hosts: Optional[list[str]] = None
    header_timeout_s: float = Field(10.0, gt=0, le=3600)
    body_timeout_s: float = Field(30.0, gt=0, le=3600)
    body_min_rate: float = Field(65536.0, ge=0)
    fair_admission: bool = True
    client_queue: Optional[int] = Field(None, ge=1)
    fair_slowdown: float = Field(2.0, ge=0)
    keep_alive_s: float = Field(5.0, gt=0, le=3600)

    @field_validator("upstream")
    @classmethod
    def _check_upstream(cls, v: Optional[str]) -> Optional[str]:
        if v is None:
            return v
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"upstream must be an http(s):// URL, got {v!r}")
        return v.rstrip("/")

    @field_validator("admin_token")
    @classmethod
    def _check_token(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and len(v) < 8:
            raise ValueError("the admin token must be at least 8 characters")
        return v or None

    @property
    def effective_max_batch(self) -> int:
        return self.max_batch if self.batching else 1

    @property
    def effective_window_s(self) -> float:
        return self.batch_window_ms / 1000 if self.batching else 0.0

    @property
    def effective_client_queue(self) -> int | None:
        """One client's share of the queue; None when admission is not fair (one queue for all)."""
        if not self.fair_admission:
            return None
        return self.client_queue or max(1, self.queue_size // 4)

    @property
    def model_threads(self) -> int:
        return self.threads or max(1, min(8, (os.cpu_count() or 2) - 1))

    def uvicorn_options(self) -> dict:
        """The connection settings of this config as ``uvicorn.Config`` / ``uvicorn.run`` keywords."""
        return {"http": http_protocol(self.header_timeout_s, self.body_timeout_s, self.body_min_rate),
                "timeout_keep_alive": self.keep_alive_s}

    @classmethod
    def from_env(cls, **values) -> "ServeConfig":
        """A config whose admin token comes from ``$SKILLBANK_ADMIN_TOKEN`` (unset or empty = none)."""
        return cls(admin_token=os.environ.get(ADMIN_TOKEN_ENV) or None, **values)


LOOPBACK_NAMES = ["localhost", "127.0.0.1", "::1"]


def is_loopback(host: str) -> bool:
    import ipaddress
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
