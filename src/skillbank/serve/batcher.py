"""Dynamic batching: concurrent requests gathered for a short window, run as one batch on the engine.

Everything here runs on the event loop; only the engine's ``run`` leaves it (to the engine thread). The
queue is a plain list the collector owns:

- ``submit`` adds a call's jobs all-or-nothing; when the queue would exceed ``queue_size`` it raises
  :class:`QueueFull` with a Retry-After estimate from the recent service rate (the HTTP layer answers 429).
- The collector takes the oldest job's batch: up to ``max_batch`` jobs in arrival order that share its
  generation cap. If the batch is not full and the oldest job has waited less than the window, it waits for
  the rest of the window (or until the batch fills). Requests that queued while a batch was generating have
  waited longer than the window already, so under load batches start back to back.
- Jobs are ordered by shard inside the batch; the engine runs each shard on its own rows.
- A job whose client left or timed out is marked ``cancelled``: dropped if still queued, its output discarded
  if already generating - the other rows of its batch are not touched.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Sequence

from skillbank.errors import SkillbankError
from skillbank.serve.engine import Job, UpstreamError

log = logging.getLogger("skillbank.serve")


class QueueFull(Exception):
    def __init__(self, retry_after_s: int, depth: int, limit: int):
        super().__init__(f"the queue is full ({depth} requests waiting, limit {limit}); retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s


class Batcher:
    def __init__(self, engine, *, max_batch: int, window_s: float, queue_size: int, metrics=None):
        self.engine = engine
        self.max_batch = max_batch
        self.window_s = window_s
        self.queue_size = queue_size
        self.metrics = metrics
        self._pending: list[Job] = []
        self._running = 0  # jobs handed to the engine and not finished
        self._wake = asyncio.Event()
        self._full = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._inflight: set[asyncio.Task] = set()
        self._rate = 0.0  # jobs finished per second, smoothed: the Retry-After estimate
        self._slots = asyncio.Semaphore(max(1, max_batch))  # concurrent engines: batches in flight at once

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
        return self._task is not None and not self._task.done()

    @property
    def depth(self) -> int:
        """Jobs queued or generating."""
        return len(self._pending) + self._running

    # -- intake ----------------------------------------------------------------------------------
    def submit(self, jobs: Sequence[Job]) -> None:
        if self.depth + len(jobs) > self.queue_size:
            raise QueueFull(self.retry_after(), self.depth, self.queue_size)
        self._pending.extend(jobs)
        self._set_depth()
        self._wake.set()
        if len(self._pending) >= self.max_batch:
            self._full.set()

    def retry_after(self) -> int:
        """Seconds until the queue has likely drained enough: depth / recent rate, 1..60."""
        if self._rate <= 0:
            return 1
        return int(min(60, max(1, math.ceil(self.depth / self._rate))))

    # -- the collector ---------------------------------------------------------------------------
    async def _collect(self) -> None:
        while True:
            self._drop_cancelled()
            if not self._pending:
                self._wake.clear()
                self._full.clear()
                await self._wake.wait()
                continue
            head = self._pending[0]
            if self.window_s > 0 and len(self._pending) < self.max_batch:
                remaining = head.enqueued + self.window_s - time.perf_counter()
                if remaining > 0:
                    self._full.clear()
                    try:
                        await asyncio.wait_for(self._full.wait(), remaining)
                    except asyncio.TimeoutError:
                        pass
                    continue  # re-check: the head may have been cancelled meanwhile
            batch = self._take(head.max_new_tokens)
            if self.engine.concurrent:
                await self._slots.acquire()
                task = asyncio.get_running_loop().create_task(self._run(batch))
                self._inflight.add(task)
                task.add_done_callback(self._inflight.discard)
            else:
                await self._run(batch)

    def _take(self, cap: int) -> list[Job]:
        batch, rest = [], []
        for job in self._pending:
            (batch if len(batch) < self.max_batch and job.max_new_tokens == cap else rest).append(job)
        self._pending = rest
        batch.sort(key=lambda j: j.shard)  # stable: arrival order within a shard
        return batch

    def _drop_cancelled(self) -> None:
        if any(j.cancelled for j in self._pending):
            self._pending = [j for j in self._pending if not j.cancelled]
            self._set_depth()

    async def _run(self, batch: list[Job]) -> None:
        self._running += len(batch)
        self._set_depth()
        if self.metrics is not None:
            self.metrics.batch_size.observe(len(batch))
        t0 = time.perf_counter()
        try:
            outputs = await self.engine.run(batch)
        except asyncio.CancelledError:
            for job in batch:
                if not job.future.done():
                    job.future.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - delivered to each waiting request, which answers for itself
            if not isinstance(exc, _EXPECTED):
                log.exception("batch of %d failed", len(batch))
            for job in batch:
                if not job.future.done():
                    job.future.set_exception(exc)
        else:
            for job, out in zip(batch, outputs):
                if not job.future.done():  # a cancelled client's future may be gone: its row is dropped
                    job.future.set_result(out)
            took = max(time.perf_counter() - t0, 1e-6)
            rate = len(batch) / took
            self._rate = rate if self._rate <= 0 else 0.8 * self._rate + 0.2 * rate
        finally:
            self._running -= len(batch)
            self._set_depth()
            if self.engine.concurrent:
                self._slots.release()

    def _set_depth(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.set(self.depth)


_EXPECTED = (SkillbankError, UpstreamError)  # reported to the client as such; anything else is also logged
