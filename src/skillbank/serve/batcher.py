"""Dynamic batching: concurrent requests are admitted to the engine's batch as room frees up.

Everything here runs on the event loop. The queue is a plain list the collector owns:

- ``submit`` adds a call's jobs all-or-nothing; when queued plus running jobs would exceed ``queue_size`` it
  raises :class:`QueueFull` with a Retry-After estimate from the recent service rate (the HTTP layer answers
  429).
- Fair admission (``client_queue`` set): each client (the peer's address) may hold at most ``client_queue``
  jobs queued or running (one call of any length when it holds none) - past that only it gets 429, with a
  Retry-After for its own backlog - and a free row goes to the client with the fewest rows in the engine
  (ties: the one served longest ago, so clients take turns), not to the oldest job. While more than one
  client is active (holding jobs, or answered within ``ACTIVE_S``), each leaves a row free for every other,
  and the batch grows only while the engine's measured time per token stays within ``fair_slowdown`` times a
  lone row's (skillbank.serve.fairness). A client that floods the service fills its own share; one that
  sends a request at a time is taken at the next step, and the flood's rows slow it at most that much. A
  client alone gets the whole batch.
- The local engine decodes a batch whose rows come and go between steps (skillbank.model.decode). The collector keeps it
  at up to ``max_batch`` rows: whenever rows finish, the oldest queued jobs take their places at the next
  step, whatever their shard (each row runs its own shard's LoRA). Only an idle engine waits for company:
  the first request waits up to the window for others to start with it.
- An upstream engine (``--upstream``) gets the gathered jobs at once and batches them itself.
- A job whose client left or timed out is marked ``cancelled``: dropped if still queued, and taken out of the
  running batch at its next step - the other rows are not touched.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from typing import Sequence

from skillbank.errors import SkillbankError
from skillbank.serve.engine import Job, Output, UpstreamError

log = logging.getLogger("skillbank.serve")
ACTIVE_S = 2.0  # a client answered this recently is still active: one sending a request at a time is between two

_EXPECTED = (SkillbankError, UpstreamError)  # reported to the client as such; anything else is also logged


class QueueFull(Exception):
    """No room: in the whole queue, or (``client`` set) in that client's share of it."""

    def __init__(self, retry_after_s: int, depth: int, limit: int, client: str | None = None):
        if client is None:
            message = f"the queue is full ({depth} requests waiting or running, limit {limit})"
        else:
            message = (f"too many requests from this client ({client}): {depth} waiting or running, the limit per "
                       f"client is {limit}")
        super().__init__(f"{message}; retry after {retry_after_s} s")
        self.retry_after_s, self.client = retry_after_s, client


class Batcher:
    def __init__(self, engine, *, max_batch: int, window_s: float, queue_size: int, metrics=None,
                 client_queue: int | None = None, fair_slowdown: float = 0.0):
        self.engine = engine
        self.max_batch = max_batch
        self.window_s = window_s
        self.queue_size = queue_size
        self.metrics = metrics
        self.client_queue = client_queue  # None: no fair admission (one queue, in arrival order)
        self._pending: list[Job] = []
        self._running = 0  # jobs admitted to the engine and not finished
        self._held: Counter[str] = Counter()  # client -> its jobs queued or running
        self._rows: Counter[str] = Counter()  # client -> its jobs in the engine
        self._served: dict[str, int] = {}  # client -> when it was last given a row (a counter: turns, not time)
        self._turn = 0
        self.fair_slowdown = fair_slowdown  # 0: no cap on the batch for other clients' sake
        self._answered: dict[str, float] = {}  # client -> when its last job left the engine
        self._per_client = max_batch  # rows one client may hold in the engine now
        self._wake = asyncio.Event()  # new jobs, or room in the batch
        self._full = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._inflight: set[asyncio.Task] = set()
        self._done_times: list[float] = []  # recent completion times: the Retry-After estimate

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._collect(), name="skillbank-batcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        for job in self._pending:
            if not job.future.done():
                job.future.cancel()
        self._pending.clear()

    @property
    def alive(self) -> bool:
        engine_ok = getattr(self.engine, "alive", True)
        return self._task is not None and not self._task.done() and engine_ok

    @property
    def depth(self) -> int:
        """Jobs queued or running."""
        return len(self._pending) + self._running

    # -- intake ----------------------------------------------------------------------------------
    def check_room(self, n: int, client: str | None = None) -> None:
        """Raise :class:`QueueFull` unless ``n`` more jobs (of ``client``, when given) fit (callers ask before
        doing work for them)."""
        if self.depth + n > self.queue_size:
            raise QueueFull(self.retry_after(), self.depth, self.queue_size)
        # A client holding nothing is admitted whatever its call's length (a list may be longer than its share).
        held = self._held[client] if client is not None else 0
        if self.client_queue is not None and held and held + n > self.client_queue:
            # Its own backlog, drained at the rate it is served: about one row in the engine's share of the batch.
            raise QueueFull(self.retry_after(held, share=max(1, self._rows[client])), held, self.client_queue, client)

    def submit(self, jobs: Sequence[Job]) -> None:
        self.check_room(len(jobs))
        for client, n in Counter(j.client for j in jobs).items():
            self.check_room(n, client)
        self._pending.extend(jobs)
        self._held.update(j.client for j in jobs)
        self._set_depth()
        self._wake.set()
        if len(self._pending) >= self.max_batch:
            self._full.set()

    def retry_after(self, depth: int | None = None, share: int | None = None) -> int:
        """Seconds until ``depth`` jobs (default: the whole queue) have likely drained: depth / recent completion
        rate, 1..60; ``share``: that many of the engine's rows serve them (a client's own backlog)."""
        depth = self.depth if depth is None else depth
        now = time.perf_counter()
        recent = [t for t in self._done_times if now - t < 60]
        if len(recent) < 2:
            return 1
        rate = (len(recent) - 1) / max(recent[-1] - recent[0], 1e-3)
        if share is not None:
            rate *= min(1.0, share / max(1, self._running))
        return int(min(60, max(1, math.ceil(depth / rate))))

    # -- the collector ---------------------------------------------------------------------------
    async def _collect(self) -> None:
        while True:
            self._drop_cancelled()
            room = self._rows_allowed() - self._running if self.engine.continuous else self.max_batch
            if not self._pending or room <= 0:
                self._wake.clear()
                await self._wake.wait()
                continue
            head = self._pending[0]
            idle = self._running == 0 or not self.engine.continuous
            if self.window_s > 0 and idle and len(self._pending) < self.max_batch:
                remaining = head.enqueued + self.window_s - time.perf_counter()
                if remaining > 0:
                    self._full.clear()
                    try:
                        await asyncio.wait_for(self._full.wait(), remaining)
                    except asyncio.TimeoutError:
                        pass
                    continue  # re-check: jobs may have been cancelled meanwhile
            batch = self._take(room)
            if not batch:  # every waiting client holds its rows' share: wait for one of its rows to finish
                self._wake.clear()
                await self._wake.wait()
                continue
            self._running += len(batch)
            self._rows.update(j.client for j in batch)
            self._set_depth()
            if self.metrics is not None:
                self.metrics.batch_size.observe(self._running if self.engine.continuous else len(batch))
            if self.engine.continuous:
                loop = asyncio.get_running_loop()
                self.engine.admit(batch, lambda job, out, exc: loop.call_soon_threadsafe(self._finish, job, out, exc))
            else:
                task = asyncio.get_running_loop().create_task(self._run(batch))
                self._inflight.add(task)
                task.add_done_callback(self._inflight.discard)

    def _rows_allowed(self) -> int:
        """The batch's size limit now: max_batch, or - several clients active, fair admission on - as many rows
        as keep a step within fair_slowdown times a lone row's (at least one per active client)."""
        cost = getattr(self.engine, "cost", None)
        if self.client_queue is None or not self.fair_slowdown or cost is None:
            return self.max_batch
        now = time.perf_counter()
        self._answered = {c: t for c, t in self._answered.items() if now - t < ACTIVE_S}
        active = len(set(self._held) | set(self._answered))
        limit = self.max_batch
        if active >= 2:
            limit = min(self.max_batch, max(active, cost.rows_within(self.fair_slowdown, self.max_batch)))
        if self.metrics is not None:
            self.metrics.batch_limit.set(limit)
            self.metrics.active_clients.set(active)
        # One client leaves a row free for each other active one: a request arriving finds its row at once.
        self._per_client = max(1, limit - (active - 1)) if active >= 2 else limit
        return limit

    def _take(self, room: int) -> list[Job]:
        """The next jobs for the engine: the oldest, or - fair admission - one at a time from the client with the
        fewest rows in the engine (ties: the client served longest ago, then the job waiting longest)."""
        if self.client_queue is None:
            batch, self._pending = self._pending[:room], self._pending[room:]
            return batch
        rows, batch = Counter(self._rows), []
        while len(batch) < room and self._pending:
            first: dict[str, int] = {}
            for i, job in enumerate(self._pending):
                if rows[job.client] < self._per_client:
                    first.setdefault(job.client, i)
            if not first:
                break
            i = min(first.values(), key=lambda k: (rows[self._pending[k].client],
                                                   self._served.get(self._pending[k].client, -1), k))
            job = self._pending.pop(i)
            rows[job.client] += 1
            self._turn += 1
            self._served[job.client] = self._turn
            batch.append(job)
        return batch

    async def _run(self, batch: list[Job]) -> None:
        """An upstream batch: every job sent at once."""
        try:
            outputs = await self.engine.run(batch)
        except Exception as exc:  # noqa: BLE001 - delivered to each waiting request, which answers for itself
            for job in batch:
                self._finish(job, None, exc)
        else:
            for job, out in zip(batch, outputs):
                self._finish(job, out, None)

    def _finish(self, job: Job, out: Output | None, exc: BaseException | None) -> None:
        """One job left the engine (event loop): hand its result over, make room for the next."""
        self._running -= 1
        _decrement(self._rows, job.client)
        _decrement(self._held, job.client)
        if job.client not in self._held:
            self._served.pop(job.client, None)
        self._answered[job.client] = time.perf_counter()
        self._set_depth()
        self._wake.set()
        if exc is not None and not isinstance(exc, _EXPECTED):
            log.error("generation failed: %s: %s", type(exc).__name__, exc, exc_info=exc)
        if job.future.done():  # the client left or timed out: nobody waits for it
            return
        if exc is not None:
            job.future.set_exception(exc)
        elif out is not None:
            job.future.set_result(out)
            self._done_times = self._done_times[-63:] + [time.perf_counter()]
        else:
            job.future.cancel()

    def _drop_cancelled(self) -> None:
        if any(j.cancelled for j in self._pending):
            for job in self._pending:
                if job.cancelled:
                    _decrement(self._held, job.client)
                    if job.client not in self._held:
                        self._served.pop(job.client, None)
            self._pending = [j for j in self._pending if not j.cancelled]
            self._set_depth()

    def _set_depth(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.set(self.depth)


def _decrement(counts: Counter, key: str) -> None:
    counts[key] -= 1
    if counts[key] <= 0:  # forget clients that left: the counters stay as small as the clients now served
        del counts[key]
