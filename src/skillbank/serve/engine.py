"""Engines turn routed jobs into outputs: locally on the one loaded base, or through an upstream server.

:class:`LocalEngine` owns the model. Every model operation - a decode step, taking new rows in, attaching a
newly published shard - runs on its single thread, so they never interleave (PEFT's active adapter is global
state of the model). Rows of several shards share the batch: PEFT's mixed-adapter batches (``adapter_names``)
run the base weights once for all rows and each LoRA shard only on its own rows. Rows join between steps
and leave when they stop (skillbank.model.decode). The outputs are those of ``SkillBank.plan``.

:class:`LlamaCppEngine` plans on llama.cpp, one shard's merged model at a time, rows of that shard joining
between steps.

:class:`UpstreamEngine` keeps routing here and sends each job to an OpenAI-compatible server (vLLM with the
shards loaded as LoRA modules, or another ``skillbank serve``), naming the routed shard as the model.
"""
from __future__ import annotations

import asyncio
import time
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from skillbank.errors import BankError
from skillbank.graph import ParseResult, parse_graph
from skillbank.memory.bank import ShardEntry
from skillbank.model.prompts import USER_TEMPLATE, prompt_ids, render_prompt
from skillbank.model.serialization import decode, decode_output
from skillbank.model.decode import RowBatch
from skillbank.serve.fairness import StepCost


class UpstreamError(Exception):
    """The upstream server failed or refused; ``status`` is the HTTP status this service should answer."""

    def __init__(self, message: str, status: int = 502):
        super().__init__(message)
        self.status = status


@dataclass
class Job:
    """One request on its way through the queue. ``future`` resolves to an :class:`Output`."""

    request: str
    shard: str
    entry: ShardEntry
    max_new_tokens: int
    future: asyncio.Future
    prompt_tokens: int = 0
    enqueued: float = field(default_factory=time.perf_counter)
    cancelled: bool = False  # the client left or timed out: drop it if it has not started yet
    grammar: Any = None  # what the output must follow (skillbank.model.constrain); None: unconstrained
    client: str = ""  # who asked (the peer's address): fair admission shares the queue and the batch by it
    client_grammar: bool = False  # ``grammar`` came with the request (structured_outputs), not from the shard
    prior: Any = None  # the shard's skill prior for this request (skillbank.model.constrain.SkillPrior), or None


@dataclass(frozen=True)
class Output:
    """What generating one job produced. ``batch_size`` counts the rows generated together with it."""

    text: str
    parsed: ParseResult
    n_tokens: int
    stopped: bool
    started: float  # perf_counter when it joined the batch
    generate_s: float
    batch_size: int  # rows decoding together when it joined
    mean_logprob: float | None = None  # the executor's mean token log-probability; None when unknown (upstream)


def parse_output(text: str, entry: ShardEntry, stopped: bool = True, reason: str | None = None) -> ParseResult:
    """Parse an executor's text written in the shard's target format (invalid, with the reason, when it did not
    stop). An upstream ``skillbank serve`` answers with the canonical JSON graph whatever its shards' training
    format, so JSON is accepted as well."""
    if not stopped:
        return decode_output(text, stopped=False, reason=reason)
    parsed = decode(text, entry.target_format, entry.family_prefix)
    if parsed.graph is None and entry.target_format != "json":
        alt = parse_graph(text)
        if alt.graph is not None:
            return alt
    return parsed


class _EngineThread:
    """What both local engines share: one thread owns the model; jobs and model operations reach it through an
    inbox under a condition. A subclass sets ``tokenizer`` and ``_loop``."""

    continuous = True  # the batcher admits jobs whenever the batch has room
    thread_name = "skillbank-engine"

    def __init__(self, execution):
        self.execution = execution
        self._cond = threading.Condition()
        self._inbox: list[tuple[Job, Callable]] = []
        self._commands: list[tuple[Callable, tuple, asyncio.AbstractEventLoop, asyncio.Future]] = []
        self._closed = False
        self.cost = StepCost()  # what a row costs the others (fair admission reads it)
        self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
        self._thread.start()

    def context_limit(self) -> int:
        return self.execution.context_limit()

    def prompt_tokens(self, request: str, entry: ShardEntry) -> int:
        return len(prompt_ids(self.tokenizer, request, entry.system_prompt))

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    async def call(self, fn: Callable, *args) -> Any:
        """Run ``fn(*args)`` on the engine thread, between two decode steps (llama.cpp: two shards' batches)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._cond:
            self._commands.append((fn, args, loop, future))
            self._cond.notify()
        return await future

    def admit(self, jobs: Sequence[Job], deliver: Callable[[Job, Output | None, BaseException | None], None]) -> None:
        """Queue jobs for the batch. ``deliver(job, output, error)`` is called on the engine thread once per job:
        with its output, with the error that failed it, or with (None, None) when it was cancelled."""
        with self._cond:
            self._inbox.extend((j, deliver) for j in jobs)
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    @staticmethod
    def _run_commands(commands) -> None:
        for fn, args, loop, future in commands:
            try:
                result, error = fn(*args), None
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
                result, error = None, exc
            loop.call_soon_threadsafe(_resolve, future, result, error)

    def _next(self, busy: bool) -> tuple[list[tuple[Job, Callable]], bool] | None:
        """Wait until there is something to do (``busy``: the loop still has rows to decode or jobs waiting), run
        the queued model operations, and take the admitted jobs: (jobs, whether any operation ran); None once
        the engine is closed."""
        with self._cond:
            while not (self._inbox or self._commands or busy or self._closed):
                self._cond.wait()
            if self._closed:
                return None
            new, self._inbox = self._inbox, []
            commands, self._commands = self._commands, []
        self._run_commands(commands)
        return new, bool(commands)

    def _loop(self) -> None:
        raise NotImplementedError


class LocalEngine(_EngineThread):
    """Generation on the base model held in this process, by one engine thread that owns the model.

    The thread runs the decode loop of a :class:`~skillbank.model.decode.RowBatch`: between two steps it takes
    the jobs the batcher admitted (``admit``) into the batch and runs queued model operations (``call``, e.g.
    attaching a newly published shard); after each step it hands every finished row's output back through the
    ``deliver`` callback it was admitted with. A job marked ``cancelled`` leaves the batch at the next step.
    """

    def __init__(self, execution, *, reuse_prefixes: bool = True):
        self.reuse_prefixes = reuse_prefixes
        super().__init__(execution)

    @property
    def tokenizer(self):
        return self.execution.base.tokenizer

    def join_rows(self, batch: RowBatch, jobs: list[Job]) -> None:
        """Prefill ``jobs`` and add them to the batch (engine thread); each row follows its job's grammar."""
        tok = self.tokenizer
        prompts = [render_prompt(tok, j.request, j.entry.system_prompt) for j in jobs]
        matchers = None
        if any(j.grammar is not None for j in jobs):
            cache = self.execution.grammar_cache()
            matchers = [cache.matcher(j.grammar, prior=j.prior) if j.grammar is not None else None for j in jobs]
        batch.add(prompts, [id(j) for j in jobs], [j.shard for j in jobs], [j.max_new_tokens for j in jobs], matchers)

    def _load_shards(self, fresh: list, rows: dict) -> list:
        """Shards load on first use and may be evicted under ``max_resident``: load the new jobs' shards,
        never evicting one that rows still in the batch decode with (so a batch needing more distinct shards
        than ``max_resident`` holds them all until its rows finish). A shard that cannot load (deleted or
        corrupted after the bank was opened) fails its own jobs with the reason; the others go on."""
        needed = list(dict.fromkeys(j.shard for j, _ in fresh))
        pinned = [job.shard for job, *_ in rows.values()]
        broken: dict[str, BaseException] = {}
        for shard in needed:
            try:
                self.execution.ensure_resident([shard], pinned=pinned + needed)
            except BankError as exc:
                broken[shard] = exc
        for job, deliver in fresh:
            if job.shard in broken:
                deliver(job, None, broken[job.shard])
        return [(j, d) for j, d in fresh if j.shard not in broken]

    def _loop(self) -> None:
        base = self.execution.base
        batch: RowBatch | None = None
        rows: dict[int, tuple[Job, Callable, float, int]] = {}  # id(job) -> job, deliver, joined at, batch size
        last_step = None  # when the last step ended, while rows kept decoding
        while True:
            taken = self._next(bool(rows))
            if taken is None:
                return
            new, ran = taken
            if ran and batch is not None:
                batch.forget_prefixes()  # a command may have changed the adapters whose k/v they hold
            try:
                for job, deliver in new:
                    if job.cancelled:
                        deliver(job, None, None)
                fresh = self._load_shards([(j, d) for j, d in new if not j.cancelled], rows)
                if fresh:
                    if batch is None:
                        batch = RowBatch(base.peft, self.tokenizer, base, reuse_prefixes=self.reuse_prefixes)
                    self.join_rows(batch, [j for j, _ in fresh])
                    now, size = time.perf_counter(), len(batch.rows)
                    rows.update((id(j), (j, d, now, size)) for j, d in fresh)
                if batch is not None and batch.rows:
                    drop = {key for key, (job, *_) in rows.items() if job.cancelled}
                    decoding = len(batch.rows)
                    finished = batch.step(drop)
                    now = time.perf_counter()
                    if last_step is not None:  # a row's time per token: the step, the joins, and every wait between
                        self.cost.observe(decoding, now - last_step)
                    last_step = now if batch.rows else None
                    for row, decoded in finished:
                        job, deliver, joined, size = rows.pop(row.key)
                        out = None if decoded is None else Output(
                            decoded.text, parse_output(decoded.text, job.entry, decoded.stopped, decoded.reason),
                            decoded.n_tokens, decoded.stopped, joined, time.perf_counter() - joined, size,
                            decoded.mean_logprob)
                        deliver(job, out, None)
            except Exception as exc:  # noqa: BLE001 - fails the rows of this batch only; the loop goes on
                for job, deliver in new:
                    if id(job) not in rows and not job.cancelled:
                        deliver(job, None, exc)
                for job, deliver, *_ in rows.values():
                    deliver(job, None, exc)
                rows.clear()
                batch, last_step = None, None

class LlamaCppEngine(_EngineThread):
    """Generation on llama.cpp (:class:`~skillbank.memory.execution_llamacpp.LlamaCppExecution`), by one engine
    thread that owns it - the same contract as :class:`LocalEngine` (``admit``, ``call``, outputs of
    ``SkillBank.plan``).

    Each shard decodes with its own merged model, so rows of two shards cannot share a forward pass. The thread
    serves one shard at a time: the oldest waiting job's shard, with every waiting job of that shard; jobs of
    that shard arriving meanwhile join the running batch between steps (continuous batching) - until a job of
    another shard is waiting: then the batch takes no one more, finishes its rows, and that shard goes next, so
    no shard waits behind a steady stream of another's. Each job is delivered the moment its row ends. A shard
    llama.cpp cannot apply exactly is generated by the reference engine (torch, loaded for it), as
    ``SkillBank.plan`` does.
    """

    thread_name = "skillbank-llamacpp"

    def __init__(self, execution, *, max_batch: int):
        self.max_batch = max_batch
        self._hints: dict[str | None, list[int]] = {}  # system prompt -> a prompt rendered with it (its head)
        super().__init__(execution)

    @property
    def tokenizer(self):
        return self.execution.tokenizer

    # -- the engine thread ---------------------------------------------------------------------------
    def _loop(self) -> None:
        waiting: list[tuple[Job, Callable]] = []
        while True:
            taken = self._next(bool(waiting))
            if taken is None:
                return
            waiting = _without_cancelled(waiting + taken[0])
            if not waiting:
                continue
            shard = waiting[0][0].shard
            group = [w for w in waiting if w[0].shard == shard]
            waiting = [w for w in waiting if w[0].shard != shard]
            delivered: set[int] = set()  # id() of the jobs answered (a job is answered once)

            def answer(job: Job, deliver: Callable, out: Output | None, exc: BaseException | None) -> None:
                delivered.add(id(job))
                deliver(job, out, exc)

            try:
                self._serve(shard, group, waiting, answer)
            except Exception as exc:  # noqa: BLE001 - fails this shard's batch only (its files damaged or
                # changed since publishing: BankError naming it); the loop goes on
                for job, deliver in group:
                    if id(job) not in delivered:
                        answer(job, deliver, None, exc)

    def _serve(self, shard: str, group: list[tuple[Job, Callable]], waiting: list[tuple[Job, Callable]],
               answer: Callable) -> None:
        """Decode ``group`` (jobs of ``shard``) and the jobs of it that arrive meanwhile; ``waiting`` (the other
        shards' jobs) gains what arrives for other shards. Every job of the batch is appended to ``group``."""
        serving = self.execution.decoder_for(shard, rows=len(group))  # the rows it starts with pick the encoding
        if serving is None:
            self._by_reference(group, answer)
            return
        decoder, adapter = serving
        execution, entry = self.execution, group[0][0].entry
        grammars = execution.grammars_compiled
        hint = self._hints.get(entry.system_prompt)
        if hint is None:
            hint = self._hints[entry.system_prompt] = prompt_ids(self.tokenizer, "-", entry.system_prompt)
        state = {"rows": 0, "last": None}
        joined: dict[int, tuple[float, int]] = {}  # id(job) -> when it joined the batch, rows decoding then

        def start(job: Job) -> tuple[list[int], Any, int]:
            state["rows"] += 1
            joined[id(job)] = (time.perf_counter(), state["rows"])
            matcher = grammars.matcher(job.grammar, prior=job.prior) if job.grammar is not None else None
            return prompt_ids(self.tokenizer, job.request, entry.system_prompt), matcher, job.max_new_tokens

        def feed() -> list[tuple[list[int], Any, int]]:
            with self._cond:
                waiting.extend(self._inbox)
                self._inbox = []
            waiting[:] = _without_cancelled(waiting)
            if any(job.shard != shard for job, _ in waiting):
                return []  # another shard waits: this batch takes no one more
            joining = waiting[:]
            waiting.clear()
            group.extend(joining)
            return [start(job) for job, _ in joining]

        def on_done(index: int, step) -> None:
            job, deliver = group[index]
            state["rows"] -= 1
            out = execution.step_output(shard, entry, step, job.grammar is not None)
            started, rows = joined.pop(id(job))
            answer(job, deliver, Output(out.text, out.parsed, out.n_tokens, out.stopped, started,
                                        time.perf_counter() - started, rows, out.mean_logprob), None)

        def on_step(rows: int) -> None:  # a row's time per token, for fair admission (see fairness.StepCost)
            now = time.perf_counter()
            if state["last"] is not None:
                self.cost.observe(rows, now - state["last"])
            state["last"] = now

        firsts = [start(job) for job, _ in group]
        decoder.decode_many([p for p, _, _ in firsts], adapter, [c for _, _, c in firsts], execution.stops,
                            [m for _, m, _ in firsts], execution._bitmask, width=self.max_batch, feed=feed,
                            on_done=on_done, on_step=on_step, head_hint=hint)

    def _by_reference(self, group: list[tuple[Job, Callable]], answer: Callable) -> None:
        """The shard's jobs on the reference engine, as ``SkillBank.plan`` would: the shard's own grammar or none.
        A grammar the client sent cannot be handed to it: those jobs fail, saying so."""
        shard = group[0][0].shard
        why = self.execution.reference_shards.get(shard, "")
        sets: dict[tuple[bool, int], list[tuple[Job, Callable]]] = {}
        for job, deliver in group:
            if job.client_grammar:
                answer(job, deliver, None, BankError(f"shard {shard!r} is generated by the reference engine ({why}), "
                                             "which takes the shard's own grammar only, not one sent with the request"))
            else:
                sets.setdefault((job.grammar is not None, job.max_new_tokens), []).append((job, deliver))
        for (constrain, cap), jobs in sets.items():
            started = time.perf_counter()
            outs = self.execution.reference().generate([j.request for j, _ in jobs], [shard] * len(jobs),
                                                       batch_size=self.max_batch, max_new_tokens=cap,
                                                       constrain=constrain, priors=[j.prior for j, _ in jobs])
            for (job, deliver), o in zip(jobs, outs):
                answer(job, deliver, Output(o.text, o.parsed, o.n_tokens, o.stopped, started,
                                            time.perf_counter() - started, len(jobs), o.mean_logprob), None)


def _without_cancelled(waiting: list[tuple[Job, Callable]]) -> list[tuple[Job, Callable]]:
    """The jobs still wanted; each cancelled one is told it was dropped."""
    kept = []
    for job, deliver in waiting:
        if job.cancelled:
            deliver(job, None, None)
        else:
            kept.append((job, deliver))
    return kept


def _resolve(future: asyncio.Future, result, error) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class UpstreamEngine:
    """Generation by an OpenAI-compatible server; this process loads no model."""

    continuous = False  # the upstream batches by itself: every admitted batch is sent at once

    def __init__(self, url: str, timeout_s: float):
        import httpx

        self.url = url
        self.client = httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(timeout_s, connect=10.0))

    def context_limit(self) -> int:
        return 0  # unknown here; the upstream refuses what does not fit

    def prompt_tokens(self, request: str, entry: ShardEntry) -> int:
        return 0

    async def call(self, fn: Callable, *args) -> Any:
        return fn(*args)  # nothing model-side to serialise with

    async def run(self, jobs: Sequence[Job]) -> list[Output]:
        return list(await asyncio.gather(*(self._one(j, len(jobs)) for j in jobs)))

    async def _one(self, job: Job, batch_size: int) -> Output:
        import httpx

        # The same prompt the local engine renders: the shard's system instruction, the user template, greedy
        # decoding, and no "thinking" turn for templates that have one (prompts.render_prompt does the same).
        body = {"model": job.shard, "temperature": 0, "max_tokens": job.max_new_tokens,
                "chat_template_kwargs": {"enable_thinking": False},
                "messages": [{"role": "system", "content": job.entry.system_prompt},
                             {"role": "user", "content": USER_TEMPLATE.format(request=job.request)}]}
        if job.grammar is not None:
            # vLLM's structured outputs (>= 0.10.2; its `guidance` backend reads Lark): the same grammar as here.
            body["structured_outputs"] = {"grammar": job.grammar.lark()}
        started = time.perf_counter()
        try:
            resp = await self.client.post("/v1/chat/completions", json=body)
        except httpx.TimeoutException:
            raise UpstreamError(f"upstream {self.url} did not answer in time", 504) from None
        except httpx.HTTPError as exc:
            raise UpstreamError(f"upstream {self.url} unreachable: {type(exc).__name__}: {exc}", 502) from None
        if resp.status_code != 200:
            raise UpstreamError(f"upstream {self.url} answered {resp.status_code}: {_error_text(resp)}", 502)
        try:
            data = resp.json()
            choice = data["choices"][0]
            text = choice["message"]["content"] or ""
            usage = data.get("usage") or {}
        except (ValueError, KeyError, IndexError, TypeError):
            raise UpstreamError(f"upstream {self.url} sent a reply that is not an OpenAI chat completion", 502) from None
        stopped = choice.get("finish_reason") != "length"
        return Output(text, parse_output(text, job.entry, stopped, f"hit the token cap ({job.max_new_tokens}) upstream "
                                                                  "before the output ended"),
                      int(usage.get("completion_tokens") or 0), stopped, started, time.perf_counter() - started,
                      batch_size)

    async def load_adapter(self, name: str, path, token: str | None) -> None:
        """Ask the upstream to load a newly published shard: vLLM's runtime LoRA API (``POST
        /v1/load_lora_adapter``, needs VLLM_ALLOW_RUNTIME_LORA_UPDATING=True), which ``skillbank serve`` also
        answers. Raises UpstreamError when it does not."""
        import httpx

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            resp = await self.client.post("/v1/load_lora_adapter", headers=headers,
                                          json={"lora_name": name, "lora_path": str(Path(path).resolve())})
        except httpx.HTTPError as exc:
            raise UpstreamError(f"upstream {self.url} unreachable while loading shard {name!r}: {exc}") from None
        if resp.status_code != 200:
            raise UpstreamError(f"upstream {self.url} did not load shard {name!r} ({resp.status_code}: "
                                f"{_error_text(resp)}); restart it with the shard (skillbank export vllm), "
                                "then POST /v1/reload here")

    def close(self) -> None:
        pass

    async def aclose(self) -> None:
        await self.client.aclose()


def _error_text(resp) -> str:
    try:
        data = resp.json()
        err = data.get("error") if isinstance(data, dict) else None
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(data, dict) and data.get("detail"):
            return str(data["detail"])
    except ValueError:
        pass
    return resp.text[:200]
