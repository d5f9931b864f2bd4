"""Learning while serving: background learn jobs, one at a time, each in its own process (see learner.py).

A job is checked before it starts - family name (it becomes a directory: nothing path-like), not already
learned, records parsed line by line with :func:`skillbank.data.records.read_records` (every bad line is
named), skills disjoint from the served shards, training settings valid - so a bad upload is refused at once
with 409/422 instead of failing minutes later. Then the learner process trains and publishes into the bank
on disk while the service keeps answering from its in-memory snapshot; when the process ends, the service
picks up whatever the bank on disk now holds (``on_finished``) and only then reports the job ``done``, so a
client that sees ``done`` is routed to the new family by its next request.

The training keeps a checkpoint in the bank (``BANK/checkpoints/<family>.fit.pt``, no requests in it; see
learner.py): a job whose process died or whose service shut down leaves it, and posting the same family and
records again continues that training instead of starting over. A job cancelled by request removes it.

The uploaded records live in a private temporary directory for the job's lifetime only: the bank keeps no
requests, and neither does the service. It is removed however the job ends: done, failed, cancelled, its process
killed, the service shut down (``close`` waits for every job's own clean-up), or the service killed (the
learner, which dies with its service, removes it then: see learner.py).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Callable

from skillbank.data.records import read_records
from skillbank.errors import BankError, ModelError, RecordError
from skillbank.memory.bank import check_family_name, learn_checkpoint_path, read_manifest

log = logging.getLogger("skillbank.serve")

RECIPES = ("auto", "paper", "small-cpu")
MAX_LISTED_BAD_LINES = 10


class LearnRefused(Exception):
    """A learn request that cannot start; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


@dataclass
class LearnJob:
    id: str
    family: str
    state: str = "queued"  # queued -> loading -> training -> publishing -> done | failed | cancelled
    created: float = field(default_factory=time.time)
    finished: float | None = None
    progress: dict = field(default_factory=dict)
    error: str | None = None
    result: dict = field(default_factory=dict)
    records: int = 0
    workdir: Path | None = None
    process: asyncio.subprocess.Process | None = None
    discard_checkpoint: bool = False  # cancelled by request: its training is not to be continued

    @property
    def active(self) -> bool:
        return self.state not in ("done", "failed", "cancelled")

    def to_dict(self) -> dict:
        step, total = self.progress.get("step"), self.progress.get("total")
        fraction = 1.0 if self.state == "done" else (round(step / total, 4) if step is not None and total else 0.0)
        return {"job": self.id, "family": self.family, "state": self.state, "records": self.records,
                "progress": {**self.progress, "fraction": fraction}, "error": self.error, "result": self.result,
                "created": self.created, "finished": self.finished}


def train_config(recipe: str, overrides: dict | None, base: str = ""):
    """The TrainConfig of a job: a recipe (as ``skillbank learn --recipe``; ``auto``: the one that suits the
    bank's ``base``, see :mod:`skillbank.train.recipes`) plus field overrides."""
    from skillbank.train.executor import TrainConfig
    from skillbank.train.recipes import recipe_for_base
    if recipe not in RECIPES:
        raise LearnRefused(f"recipe must be one of {list(RECIPES)}, got {recipe!r}", 422)
    if recipe == "auto":
        recipe = recipe_for_base(base)[0]
    values = TrainConfig.for_small_cpu().to_dict() if recipe == "small-cpu" else {}
    values.update(overrides or {})
    try:
        return TrainConfig.from_dict(values)
    except (ModelError, TypeError) as exc:
        raise LearnRefused(f"invalid training settings: {exc}", 422) from None


class LearnManager:
    """Starts, tracks and cancels learn jobs for one bank; ``on_finished`` reloads the served snapshot."""

    def __init__(self, root: Path, *, threads: int | None, on_finished: Callable[[], Awaitable[list[str]]],
                 metrics=None, checkpoint_minutes: float = 10.0):
        self.root = root
        # Default: half the cores, so training does not starve the requests being served meanwhile.
        self.threads = threads or max(1, (os.cpu_count() or 2) // 2)
        self.checkpoint_minutes = checkpoint_minutes
        self.on_finished = on_finished
        self.metrics = metrics
        self.jobs: dict[str, LearnJob] = {}
        self._tasks: set[asyncio.Task] = set()

    def running(self) -> LearnJob | None:
        return next((j for j in self.jobs.values() if j.active), None)

    def start(self, family: str, records_text: str, *, served: dict[str, list[str]], recipe: str = "auto",
              train: dict | None = None, skills: list[str] | None = None) -> LearnJob:
        """Validate and start a job. ``served``: shard name -> skill ids of the bank being served."""
        try:
            check_family_name(family)
        except Exception as exc:  # BankError: the message says what a name may be
            raise LearnRefused(str(exc), 422) from None
        if family in served:
            raise LearnRefused(f"family {family!r} is already in the bank; shards are write-once - use a new name", 409)
        busy = self.running()
        if busy is not None:
            raise LearnRefused(f"learn job {busy.id} ({busy.family}) is still running; one job at a time", 409)
        try:
            base = read_manifest(self.root).base["name"]
        except BankError:
            base = ""  # an unreadable bank fails the learn process itself, which reports why
        cfg = train_config(recipe, train, base)
        if skills is not None and (not skills or not all(isinstance(s, str) and s for s in skills)):
            raise LearnRefused("skills must be a non-empty list of skill ids", 422)

        workdir = Path(tempfile.mkdtemp(prefix="skillbank-learn-"))  # private (0700): the records are user data
        try:
            data = workdir / "records.jsonl"
            data.write_text(records_text, encoding="utf-8")
            rs = read_records(data, skip_invalid=True, family=family)
            if rs.skipped:
                lines = "; ".join(f"line {e.line}: {e.reason}" if e.line else e.reason
                                  for e in rs.skipped[:MAX_LISTED_BAD_LINES])
                more = len(rs.skipped) - MAX_LISTED_BAD_LINES
                raise LearnRefused(f"{len(rs.skipped)} bad record line(s): {lines}" + (f"; and {more} more" if more > 0 else ""), 422)
            if not rs.records:
                raise LearnRefused("no records uploaded: send one JSON record per line "
                                   '({"id", "family", "request", "graph"})', 422)
            used = {t for r in rs.records for t in r.graph.tasks}
            declared = set(skills) if skills is not None else used
            if used - declared:
                raise LearnRefused(f"records use skill(s) outside the given skills: {sorted(used - declared)[:5]}", 422)
            owned = {s: name for name, ss in served.items() for s in ss}
            clash = sorted(s for s in declared if s in owned)
            if clash:
                raise LearnRefused("skill(s) already learned by another shard (families must be disjoint): "
                                   + ", ".join(f"{s} (in {owned[s]})" for s in clash[:5]), 422)
        except RecordError as exc:
            shutil.rmtree(workdir, ignore_errors=True)
            raise LearnRefused(str(exc.reason), 422) from None
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)
            raise

        job = LearnJob(id=uuid.uuid4().hex[:12], family=family, records=len(rs.records), workdir=workdir)
        self.jobs[job.id] = job
        args = [sys.executable, "-m", "skillbank.serve.learner", "--bank", str(self.root.resolve()),
                "--family", family, "--data", str(data), "--status", str(workdir / "status.json"),
                "--train", json.dumps(cfg.to_dict()), "--parent-pid", str(os.getpid()), "--workdir", str(workdir)]
        if skills is not None:
            args += ["--skills", json.dumps(sorted(set(skills)))]
        if self.threads:
            args += ["--threads", str(self.threads)]
        args += ["--checkpoint-minutes", str(self.checkpoint_minutes)]
        task = asyncio.get_running_loop().create_task(self._run(job, args), name=f"learn-{job.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return job

    async def _run(self, job: LearnJob, args: list[str]) -> None:
        status_path = job.workdir / "status.json"
        log_path = job.workdir / "learn.log"
        try:
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            with open(log_path, "wb") as logf:
                job.process = await asyncio.create_subprocess_exec(*args, stdin=asyncio.subprocess.DEVNULL,
                                                                   stdout=logf, stderr=logf, env=env)
                job.state = "loading"
                while True:
                    try:
                        await asyncio.wait_for(job.process.wait(), 0.5)
                        break
                    except asyncio.TimeoutError:
                        self._read_status(job, status_path)
            status = self._read_status(job, status_path)
            code = job.process.returncode
            if job.state != "cancelled":
                if code == 0 and status.get("state") == "published":
                    job.state = "publishing"
                    job.result = {k: status.get(k) for k in ("shard", "skills", "examples", "steps", "train_seconds",
                                                            "final_loss", "resumed_after_step")}
                else:
                    job.state = "failed"
                    how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
                    job.error = status.get("error") or f"the learn process {how}; the bank is unchanged"
                    if learn_checkpoint_path(self.root, job.family).is_file():
                        job.error += ("; its training so far is kept: post the same family and records again to "
                                      "continue it")
                    log.warning("learn job %s (%s) failed: %s; its log ends:\n%s", job.id, job.family, job.error,
                                _tail(log_path))
        except Exception as exc:  # noqa: BLE001 - the job reports it; the service keeps running
            log.exception("learn job %s", job.id)
            job.state, job.error = "failed", f"could not run the learn process: {type(exc).__name__}: {exc}"
        finally:
            if job.process is not None and job.process.returncode is None:  # this task was cancelled: shutdown
                job.process.kill()
                await job.process.wait()  # a process still writing into the directory would outlive its removal
            shutil.rmtree(job.workdir, ignore_errors=True)  # the uploaded records go with it
            if job.discard_checkpoint:  # after the process ended: it can no longer write one
                learn_checkpoint_path(self.root, job.family).unlink(missing_ok=True)
        try:
            # Serve whatever the bank on disk now holds: normally the new shard; after a kill at the very end
            # (after the manifest was replaced) that is the new shard too - the disk is the truth.
            added = await self.on_finished()
        except Exception as exc:  # noqa: BLE001
            log.exception("reloading the bank after learn job %s", job.id)
            added = []
            if job.state == "publishing":
                job.state, job.error = "failed", f"learned, but the service could not load the new shard: {exc}"
        if job.family in added or job.state == "publishing":
            job.state, job.error = "done", None
        job.finished = time.time()
        if self.metrics is not None:
            self.metrics.learn_jobs.labels(job.state).inc()

    def _read_status(self, job: LearnJob, path: Path) -> dict:
        try:
            status = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        if job.state != "cancelled" and status.get("state") in ("loading", "training"):
            job.state = status["state"]
        job.progress = {k: status[k] for k in ("step", "total", "epoch", "loss", "resumed_after_step")
                        if status.get(k) is not None}
        return status

    def cancel(self, job_id: str) -> LearnJob:
        job = self.jobs[job_id]
        if job.active and job.process is not None and job.process.returncode is None:
            job.state = "cancelled"
            job.error = "cancelled by request; the bank is unchanged"
            job.discard_checkpoint = True
            job.process.kill()  # SIGKILL on purpose: the publish is atomic, so even this leaves the bank whole
        return job

    async def close(self) -> None:
        """Stop every job (the bank stays as it was) and remove its records before the service exits."""
        for job in self.jobs.values():
            if job.process is not None and job.process.returncode is None:
                job.state, job.error = "cancelled", ("the service shut down; the bank is unchanged and the "
                                                     "training so far is kept: post the same family and records "
                                                     "again to continue it")
                job.process.kill()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        # Awaited, not only cancelled: a task the event loop drops at exit never runs its ``finally``.
        await asyncio.gather(*tasks, return_exceptions=True)
        for job in self.jobs.values():  # a task cancelled before its first step never entered its ``try``
            if job.workdir is not None:
                shutil.rmtree(job.workdir, ignore_errors=True)


def _tail(path: Path, n: int = 2000) -> str:
    """The end of a job's log, for the service's own log only (it may hold a traceback: never sent to clients)."""
    try:
        return path.read_text(errors="replace").strip()[-n:]
    except OSError:
        return ""
