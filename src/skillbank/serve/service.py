"""The state behind the HTTP app: the served snapshot, the engine, the batcher, learn jobs and metrics, and
the one planning path that /v1/plan and /v1/chat/completions share (limits, routing, queueing, waiting)."""
from __future__ import annotations

import asyncio
import copy
import functools
import hmac
import logging
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from fastapi import Request
from fastapi.responses import JSONResponse

from skillbank.errors import SkillbankError
from skillbank.planner import Decision, Planner, RequestError
from skillbank.serve import schemas as S
from skillbank.serve.batcher import Batcher, QueueFull
from skillbank.serve.config import ADMIN_TOKEN_ENV, ServeConfig
from skillbank.serve.engine import Job, LlamaCppEngine, LocalEngine, Output, UpstreamEngine, UpstreamError
from skillbank.serve.learn_jobs import LearnManager, check_against_base
from skillbank.serve.metrics import Metrics
from skillbank.serve.state import Snapshot, newer_snapshot

log = logging.getLogger("skillbank.serve")

ROUTER_MODEL = "skillbank"
ERROR_TYPES = {400: "invalid_request_error", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               405: "invalid_request_error", 408: "timeout", 409: "conflict", 413: "too_large",
               415: "invalid_request_error",
               422: "invalid_request_error", 429: "rate_limited", 499: "client_closed", 502: "upstream_error",
               503: "unavailable", 504: "timeout"}
ERRORS = {code: {"model": S.ErrorResponse} for code in (400, 413, 422, 429, 500, 504)}
ADMIN_ERRORS = {code: {"model": S.ErrorResponse} for code in (400, 401, 403, 404, 409, 413, 415, 422)}
JSONL_TYPES = ("application/x-ndjson", "application/jsonl", "application/jsonlines", "text/plain")


class ServiceError(Exception):
    """An answer other than 200, raised anywhere in a handler."""

    def __init__(self, status: int, message: str, *, param: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers or {}


def error_response(status: int, message: str, param: str | None = None, headers: dict | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": ERROR_TYPES.get(status, "internal_error"), "param": param}}
    return JSONResponse(body, status_code=status, headers=headers)


@dataclass
class Planned:
    """One request's way through :meth:`Service.plan`: the planner's decision, then generated (``job`` and
    ``out``), refused as out of scope (both None: it was never queued), or failed by its shard (``failure`` says
    why, naming the shard; the other requests of the call are answered as usual)."""

    decision: Decision
    planner: Planner  # over the snapshot the request was routed with (explain reads its statistics)
    job: Job | None = None
    out: Output | None = None
    failure: str | None = None

    @property
    def request(self) -> str:
        return self.decision.request

    @property
    def shard(self) -> str:
        return self.decision.shard

    @property
    def out_of_scope(self) -> bool:
        return self.decision.out_of_scope


SERVED_MERGED = 8  # merged models the llama.cpp engine keeps loaded while serving (~350 MB each in Q8_0, ~460 in
# BF16; a shard served both alone and in batches holds one of each): more shards are hot at once than in one
# `skillbank plan`, and reloading one costs ~0.3 s


def serve_engine(root: Path, config: ServeConfig, base=None) -> str:
    """What generates for ``skillbank serve`` (see :attr:`ServeConfig.engine`): "upstream", "llama.cpp" or
    "torch". "auto" picks llama.cpp for a bank it can serve, unless a model is in hand (``base``); an explicit
    "llama.cpp" that cannot serve the bank is an error, before anything is loaded."""
    if config.upstream:
        return "upstream"
    from skillbank.memory.bank import read_manifest
    from skillbank.memory.execution_llamacpp import pick_engine
    return pick_engine(config.engine, read_manifest(root), root, model_in_hand=base is not None)


class Service:
    """The state behind the app: the served snapshot, the engine, the batcher, learn jobs, metrics."""

    def __init__(self, snapshot: Snapshot, config: ServeConfig, *, engine: str = "torch"):
        self.snapshot = snapshot
        self.config = config
        self.metrics = Metrics()
        self.metrics.shards.set(len(snapshot.shard_names))
        self.engine_kind = "upstream" if config.upstream else engine
        self._reference = None  # the torch Execution Memory behind the llama.cpp engine, loaded if a shard needs it
        self._reference_lock = threading.Lock()
        if config.upstream:
            self.engine = UpstreamEngine(config.upstream, config.upstream_timeout_s)
        elif engine == "llama.cpp":
            from skillbank.memory.execution_llamacpp import LlamaCppExecution
            llama = LlamaCppExecution(snapshot.bank.root, lambda: self.snapshot.manifest,
                                      reference=self._reference_memory, threads=config.threads,
                                      max_resident=config.max_resident, merged_resident=SERVED_MERGED)
            self.engine = LlamaCppEngine(llama, max_batch=config.effective_max_batch)
        else:
            self.engine = LocalEngine(snapshot.bank.execution, reuse_prefixes=config.reuse_prefixes)
        self.batcher: Batcher | None = None  # made on the event loop, at startup
        self.learner = LearnManager(snapshot.bank.root, threads=config.learn_threads, on_finished=self.reload,
                                    metrics=self.metrics, checkpoint_minutes=config.learn_checkpoint_minutes)
        self.started = int(time.time())
        self.learn_base_check = self._base_check(snapshot) if config.admin_token else None
        execution = snapshot.bank.execution
        # What a learn call's LoRA may target in the served base (the schema states it); None in upstream mode.
        self.lora_targets = lora_targets(execution.base.model) if execution is not None else None
        self.num_layers = execution.base.num_layers if execution is not None else None
        self._warn_if_scope_unknown(snapshot)

    @staticmethod
    def _base_check(snap: Snapshot):
        """:func:`check_against_base` for learn uploads, on the served base; None in upstream mode (no model is
        loaded here; the learner's process loads it and reports what it cannot take)."""
        execution = snap.bank.execution
        if execution is None:
            return None
        base = execution.base
        # Taken now, before the engine thread first touches the model: the uploads are checked on worker
        # threads, with a tokenizer of their own (a fast tokenizer is not to be shared across threads), and
        # the module names are read while no adapter is being attached.
        return functools.partial(check_against_base, tokenizer=copy.deepcopy(base.tokenizer),
                                 num_layers=base.num_layers, module_names=set(lora_targets(base.model)))

    def _warn_if_scope_unknown(self, snap: Snapshot) -> None:
        """Out-of-scope checking is on but this bank cannot do it: say so once, rather than plan everything quietly."""
        if not self.config.scope or not snap.shard_names:
            return
        [verdict] = snap.bank.check_scope(["probe"])
        if verdict.in_scope is None:
            log.warning("out-of-scope requests will be planned anyway: %s", verdict.reason)

    def _reference_memory(self):
        """The reference (torch) Execution Memory with every shard the service serves now: loaded the first time
        the llama.cpp engine meets a shard it cannot apply exactly (then never again unloaded)."""
        from skillbank.memory.bank import SkillBank
        from skillbank.model.base import BaseModelConfig
        with self._reference_lock:
            snap = self.snapshot
            if self._reference is None:
                config = BaseModelConfig(name=snap.manifest.base["name"], threads=self.config.model_threads)
                self._reference = SkillBank.open(snap.bank.root, base_config=config, engine="torch",
                                                 max_resident=self.config.max_resident, lazy=False).execution
            for s in snap.manifest.shards:
                if s.name not in self._reference.shards:  # published since it was loaded
                    self._reference.add(s.name, snap.bank.root / s.dir, s)
            return self._reference

    @property
    def mode(self) -> str:
        return "upstream" if self.config.upstream else "local"

    async def start(self) -> None:
        self.batcher = Batcher(self.engine, max_batch=self.config.effective_max_batch,
                               window_s=self.config.effective_window_s, queue_size=self.config.queue_size,
                               metrics=self.metrics, client_queue=self.config.effective_client_queue,
                               fair_slowdown=self.config.fair_slowdown)
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
        if isinstance(self.engine, UpstreamEngine):
            # The upstream must hold the new LoRA modules before anything is routed to them.
            for entry in new.manifest.shards[len(current.shard_names):]:
                await self.engine.load_adapter(entry.name, new.bank.root / entry.dir, self.config.admin_token)
        self.snapshot = new  # one assignment: requests already accepted keep the snapshot they were routed with
        self.metrics.shards.set(len(new.shard_names))
        self._warn_if_scope_unknown(new)
        added = [s for s in new.shard_names if s not in current.shard_names]
        log.info("serving %d shards (added %s)", len(new.shard_names), ", ".join(added))
        return added

    def default_max_new_tokens(self, snap: Snapshot) -> int:
        if self.config.max_new_tokens:
            return self.config.max_new_tokens
        return Planner(snap.bank).default_max_new_tokens()

    def _decide(self, snap: Snapshot, planner: Planner, requests: list[str], shard: str | None, with_priors: bool
                ) -> tuple[list, dict[int, object], dict[str, str]]:
        """Route and scope-check ``requests`` and, ``with_priors``, weigh each planned one's skills by its shard's
        skill statistics: (decisions, priors by request index, failures by shard whose priors could not be
        read). One thread, one encoder memo: nothing of a request is kept after the call."""
        from skillbank.memory.selectors.embedding import encoder_memo

        priors: dict[int, object] = {}
        broken: dict[str, str] = {}
        with encoder_memo():
            decisions = planner.decide(requests, shard=shard, scope=self.config.scope)
            wanted = [i for i, d in enumerate(decisions) if not d.out_of_scope] if with_priors else []
            for name in dict.fromkeys(decisions[i].shard for i in wanted):
                mine = [i for i in wanted if decisions[i].shard == name]
                try:
                    got = snap.bank.skill_priors([requests[i] for i in mine], [name] * len(mine))
                except SkillbankError as exc:
                    broken[name] = shard_failure(name, exc, snap.bank.root)
                    continue
                priors.update(zip(mine, got))
        return decisions, priors, broken

    # -- the one planning path of /v1/plan and /v1/chat/completions --------------------------------
    async def plan(self, requests: list[str], *, shard: str | None, max_new_tokens: int | None,
                   http: Request | None, param: str = "request", grammar=None) -> list[Planned]:
        """Route (or force ``shard``), check the scope, and generate. A routed request no learned family covers
        is refused here - before the engine, local or upstream - and never queued. Each job follows its shard's
        grammar when the service constrains decoding, or ``grammar`` when the client sent one
        (``structured_outputs``).

        A request whose shard cannot be served (its files damaged, its adapter failing to load or generate)
        comes back with ``failure`` set; the call's other requests are generated all the same. Only an upstream
        that fails every request of the call fails the call (502/504): then nothing could be generated."""
        cfg, snap = self.config, self.snapshot
        if not snap.shard_names:
            raise ServiceError(409, f"the bank {snap.bank.root.name} has no shards yet; learn a family first")
        if len(requests) > cfg.max_list:
            raise ServiceError(413, f"too many requests in one call: {len(requests)}, the limit is {cfg.max_list}",
                               param=param)
        if not requests:
            raise ServiceError(422, "no requests given: send a string or a non-empty list", param=param)
        def where_(i: int) -> str:  # how an error names request i: the field itself, or its list element
            return param if len(requests) == 1 else f"{param}[{i}]"

        try:
            requests = Planner.check(requests)
        except RequestError as exc:
            where = where_(exc.index)
            raise ServiceError(422, str(exc).replace(f"request {exc.index}", where, 1), param=where) from None
        for i, r in enumerate(requests):
            if len(r) > cfg.max_request_chars:
                where = where_(i)
                raise ServiceError(413, f"{where} is {len(r)} characters long, the limit is {cfg.max_request_chars}",
                                   param=where)
        client = client_of(http)
        self._admit(lambda: self.batcher.check_room(len(requests), client))  # refuse before routing and tokenizing

        if shard is not None and shard not in snap.shard_names:
            raise ServiceError(404, f"unknown shard {shard!r}; this bank has {snap.shard_names}", param="shard")
        planner = Planner(snap.bank)
        # The scope check, the embedding router and the shards' skill priors run a sentence encoder, milliseconds
        # per request: off the event loop, so that other connections are served meanwhile; in one thread, so
        # that the router's embedding of a request serves its skill prior too (an upstream server takes the
        # grammar only, so it decodes without priors).
        with_priors = grammar is None and cfg.constrain and self.mode != "upstream"
        decisions, priors, broken = await asyncio.to_thread(self._decide, snap, planner, requests, shard, with_priors)
        self.metrics.route_seconds.observe(decisions[0].route_s)
        planned = [Planned(d, planner) for d in decisions]

        # Upstream mode: a shard's files are hashed on its first routed request, off the event loop (a local
        # bank checks them as it loads the shard).
        if self.mode == "upstream":
            for name in dict.fromkeys(q.shard for q in planned if not q.out_of_scope):
                if name not in snap.verified:
                    try:
                        await asyncio.to_thread(snap.verify, name)
                    except SkillbankError as exc:
                        broken[name] = shard_failure(name, exc, snap.bank.root)

        cap = self.default_max_new_tokens(snap)
        mnt = min(max_new_tokens, cap) if max_new_tokens else cap
        limit = self.engine.context_limit()
        loop = asyncio.get_running_loop()
        jobs = []
        for i, q in enumerate(planned):
            if q.out_of_scope:
                continue
            rule = grammar
            if rule is None and cfg.constrain and q.shard not in broken:
                try:
                    rule = snap.grammar(q.shard, q.request)  # a shard whose skills.json is unreadable fails here, alone
                except SkillbankError as exc:
                    broken[q.shard] = shard_failure(q.shard, exc, snap.bank.root)
            if q.shard in broken:
                q.failure = broken[q.shard]
                continue
            entry = snap.entry(q.shard)
            n_prompt = self.engine.prompt_tokens(q.request, entry)
            if limit and n_prompt + mnt > limit:
                where = where_(i)
                raise ServiceError(413, f"{where} is too long: {n_prompt} prompt tokens + {mnt} generation tokens "
                                        f"exceed the base model's context of {limit} tokens", param=where)
            q.job = Job(q.request, q.shard, entry, mnt, loop.create_future(), prompt_tokens=n_prompt, grammar=rule,
                        client=client, client_grammar=grammar is not None, prior=priors.get(i))
            jobs.append(q.job)
        for q in planned:
            if q.out_of_scope:
                self.metrics.out_of_scope.labels(q.decision.verdict.family or "none").inc()
        if jobs:
            self._admit(lambda: self.batcher.submit(jobs))
            results = await self._wait(jobs, http)
            self._settle([q for q in planned if q.job is not None], results, snap.bank.root)
        for q in planned:
            if q.failure is not None:
                self.metrics.errors.labels("shard").inc()
        return planned

    def _settle(self, planned: list[Planned], results: list, root: Path) -> None:
        """Hand each generated request its output or its failure. An upstream that failed every request (down,
        or timing out) fails the call as before; an unexpected error (a bug, not a shard's) is raised: the
        app logs it and answers a generic 500."""
        upstream = [r for r in results if isinstance(r, UpstreamError)]
        if upstream and len(upstream) == len(results):
            self.metrics.errors.labels("upstream").inc()
            raise ServiceError(upstream[0].status, str(upstream[0]))
        for q, result in zip(planned, results):
            if isinstance(result, Output):
                q.out = result
            elif isinstance(result, UpstreamError):
                self.metrics.errors.labels("upstream").inc()
                q.failure = f"shard {q.shard!r} could not be generated upstream: {_without_paths(str(result), root)}"
            elif isinstance(result, SkillbankError):
                q.failure = shard_failure(q.shard, result, root)
            else:
                raise result

    def _admit(self, step) -> None:
        """Run a queue step; a full queue is a 429 with Retry-After."""
        try:
            step()
        except QueueFull as exc:
            self.metrics.errors.labels("client_queue_full" if exc.client else "queue_full").inc()
            raise ServiceError(429, str(exc), headers={"Retry-After": str(exc.retry_after_s)}) from None

    async def _wait(self, jobs: list[Job], http: Request | None) -> list:
        """Wait for every job, the deadline, or the client going away - whichever comes first. Returns each job's
        Output, or the exception that failed it."""
        gathered = asyncio.gather(*(j.future for j in jobs), return_exceptions=True)
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
            results = gathered.result()
            if any(isinstance(r, asyncio.CancelledError) for r in results):  # the batcher stopped
                raise ServiceError(503, "the service is shutting down")
            return results
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

    def plan_result(self, planned: Planned, arrived: float, *, explain: bool = False) -> dict:
        """The plan of one request as the API answers it: :meth:`Plan.to_dict <skillbank.planner.Plan.to_dict>`,
        the same shape as ``SkillBank.plan`` and ``skillbank plan`` give."""
        planner = planned.planner
        job, out = planned.job, planned.out
        if out is None:
            return planner.settle(planned.decision, failure=planned.failure, arrived=arrived, explain=explain).to_dict()
        plan = planner.settle(planned.decision, out, constrained=job.grammar is not None, batch_size=out.batch_size,
                              queue_s=max(0.0, out.started - job.enqueued), generate_s=out.generate_s,
                              arrived=arrived, explain=explain)
        self.metrics.plans.labels(job.shard, str(plan.valid).lower()).inc()
        self.metrics.queue_seconds.observe(plan.timings["queue_ms"] / 1000)
        self.metrics.generate_seconds.observe(out.generate_s)
        return plan.to_dict()

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


def lora_targets(model) -> list[str]:
    """The module names a LoRA may target in ``model`` (what TrainConfig.target_modules names): its linear,
    embedding and convolution layers, by their last name; adapters already attached are not counted."""
    import torch.nn as nn
    names = set()
    for name, module in model.named_modules():
        if not (isinstance(module, (nn.Linear, nn.Embedding, nn.Conv1d, nn.Conv2d))
                or type(module).__name__ == "Conv1D"):  # transformers' GPT-2 style linear layer
            continue
        parts = name.split(".")
        if any(p.startswith("lora_") for p in parts):
            continue
        if parts[-1] == "base_layer":  # a layer an adapter wraps: it is targeted by the wrapper's name
            parts = parts[:-1]
        names.add(parts[-1])
    return sorted(names)


def client_of(http: Request | None) -> str:
    """Whom a request counts against in fair admission: the peer's address (as the ASGI server reports it;
    behind a reverse proxy, have the server take it from the proxy's headers, or every client is the proxy)."""
    peer = http.client if http is not None else None
    return peer.host if peer is not None and peer.host else "unknown"


# An absolute path: "/" that does not continue a word, a relative path or a URL, then path characters.
_ABSOLUTE_PATH = re.compile(r"(?<![\w.~:/-])/(?:[\w.@+~-]+/)*[\w.@+~-]*")


def _without_paths(text: str, root: Path) -> str:
    """``text`` with no path of the server in it: paths inside the bank become relative to it, any other
    absolute path is replaced by "<path>" (where the bank or the model lives is the server's business)."""
    for prefix in dict.fromkeys((str(root.resolve()), str(root.absolute()))):
        text = text.replace(prefix + "/", "")
    return _ABSOLUTE_PATH.sub("<path>", text)


def shard_failure(name: str, exc: BaseException, root: Path) -> str:
    """What a client is told about a shard that cannot be served: the shard's name and the reason, no path."""
    reason = _without_paths(str(exc), root)
    return reason if f"shard {name!r}" in reason else f"shard {name!r} cannot be served: {reason}"


async def _disconnected(http: Request) -> None:
    """Return when the client has gone away (the ASGI server delivers ``http.disconnect``)."""
    while True:
        message = await http.receive()
        if message["type"] == "http.disconnect":
            return
