"""Dynamic batching: concurrent requests are admitted to the engine's batch as room frees up.

Everything here runs on the event loop. The queue is a plain list the collector owns:

- ``submit`` adds a call's jobs all-or-nothing; when queued plus running jobs would exceed ``queue_size`` it
  raises :class:`QueueFull` with a Retry-After estimate from the recent service rate (the HTTP layer answers
  429).
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
from typing import Sequence

from skillbank.errors import SkillbankError
from skillbank.serve.engine import Job, Output, UpstreamError

log = logging.getLogger("skillbank.serve")

_EXPECTED = (SkillbankError, UpstreamError)  # reported to the client as such; anything else is also logged


class QueueFull(Exception):
    def __init__(self, retry_after_s: int, depth: int, limit: int):
        super().__init__(f"the queue is full ({depth} requests waiting or running, limit {limit}); "
                         f"retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s


class Batcher:
    def __init__(self, engine, *, max_batch: int, window_s: float, queue_size: int, metrics=None):
        self.engine = engine
        self.max_batch = max_batch
        self.window_s = window_s
        self.queue_size = queue_size
        self.metrics = metrics
        self._pending: list[Job] = []
        self._running = 0  # jobs admitted to the engine and not finished
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
    def check_room(self, n: int) -> None:
        """Raise :class:`QueueFull` unless ``n`` more jobs fit (callers ask before doing work for them)."""
        if self.depth + n > self.queue_size:
            raise QueueFull(self.retry_after(), self.depth, self.queue_size)

    def submit(self, jobs: Sequence[Job]) -> None:
        self.check_room(len(jobs))
        self._pending.extend(jobs)
        self._set_depth()
        self._wake.set()
        if len(self._pending) >= self.max_batch:
            self._full.set()

    def retry_after(self) -> int:
        """Seconds until the queue has likely drained enough: depth / recent completion rate, 1..60."""
        now = time.perf_counter()
        recent = [t for t in self._done_times if now - t < 60]
        if len(recent) < 2:
            return 1
        rate = (len(recent) - 1) / max(recent[-1] - recent[0], 1e-3)
        return int(min(60, max(1, math.ceil(self.depth / rate))))

    # -- the collector ---------------------------------------------------------------------------
    async def _collect(self) -> None:
        while True:
            self._drop_cancelled()
            room = self.max_batch - self._running if self.engine.continuous else self.max_batch
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
            batch, self._pending = self._pending[:room], self._pending[room:]
            self._running += len(batch)
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
            self._pending = [j for j in self._pending if not j.cancelled]
            self._set_depth()

    def _set_depth(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.set(self.depth)
