"""Learning while serving: background learn jobs, one at a time, each in its own process (see learn_process.py).

A job is checked whole before it starts, whatever form the upload came in - family name (it becomes a
directory: nothing path-like), not already learned, training settings of the right types and ranges, every
string of every record valid Unicode text without control characters (:func:`text_problem`), records parsed
line by line with :func:`skillbank.data.records.read_records` (every bad line is named), skills disjoint from
the served shards, and - where the service holds the base model - every record tokenized into its training
example as the learner will, the LoRA's target modules and layers found in the base - so a bad upload is
refused at once with 409/422 instead of failing minutes later: a job fails only for what the upload could
not show (the machine running out of memory, the process killed, the bank changed meanwhile). Then the
learner process trains and publishes into the bank on disk while the service keeps answering from its
in-memory snapshot; when the process ends, the service
picks up whatever the bank on disk now holds (``on_finished``) and only then reports the job ``done``, so a
client that sees ``done`` is routed to the new family by its next request.

The training keeps a checkpoint in the bank (``BANK/checkpoints/<family>.fit.pt``, no requests in it; see
learn_process.py): a job whose process died or whose service shut down leaves it, and posting the same family and
records again continues that training instead of starting over. A job cancelled by request removes it.

The uploaded records live in a private temporary directory for the job's lifetime only: the bank keeps no
requests, and neither does the service. It is removed however the job ends: done, failed, cancelled, its process
killed, the service shut down (``close`` waits for every job's own clean-up), or the service killed (the
learner, which dies with its service, removes it then: see learn_process.py).
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
import unicodedata
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator

from skillbank.data.catalog import check_disjoint
from skillbank.data.records import read_records
from skillbank.errors import BankError, ModelError, RecordError
from skillbank.memory.bank import check_family_name, learn_checkpoint_path, read_manifest
from skillbank.train.recipes import RECIPES as TRAIN_RECIPES

log = logging.getLogger("skillbank.serve")

RECIPES = ("auto", *TRAIN_RECIPES)  # auto: the recipe that suits the bank's base
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


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be part of a record, or None: a lone surrogate (valid JSON - ``"\\ud800"`` - but
    no text: the tokenizer fails on it), or a control character other than tab, line feed and carriage
    return (a NUL, an escape sequence: learned as part of the request, never typed by a user)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"is not valid Unicode text ({exc.reason} at character {exc.start})"
    for i, ch in enumerate(text):
        if ch not in "\t\n\r" and unicodedata.category(ch) == "Cc":
            return f"holds the control character U+{ord(ch):04X} at character {i}"
    return None


def _strings(obj: Any, where: str = "") -> Iterator[tuple[str, str]]:
    """(where, string) for every string value inside a decoded JSON value (a record's fields are named by the
    format; what it holds besides them is ignored, so only values are checked)."""
    if isinstance(obj, str):
        yield where or "value", obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _strings(v, f"{where}.{k}" if where else str(k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _strings(v, f"{where}[{i}]")


def record_text_problems(records_text: str) -> list[str]:
    """Every record line holding a string that is not plain text (see :func:`text_problem`), as "line N:
    field: why". Lines that are not JSON are left to read_records, which names them."""
    problems = []
    for lineno, line in enumerate(records_text.split("\n"), start=1):
        line = line.removeprefix("\ufeff") if lineno == 1 else line
        if not line.strip():
            continue
        try:
            obj = json.loads(line.rstrip("\r"))
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("id"), bool):  # JSON's true is no id (Python's is 1)
            problems.append(f"line {lineno}: id must be a string or an integer, got {json.dumps(obj['id'])}")
            continue
        if isinstance(obj, dict) and obj.get("structure") is not None and not isinstance(obj["structure"], str):
            problems.append(f"line {lineno}: structure must be a string, got {json.dumps(obj['structure'])}")
            continue
        for where, text in _strings(obj):
            why = text_problem(text)
            if why:
                problems.append(f"line {lineno}: {where} {why}")
                break
    return problems


def _train_overrides(overrides: dict) -> dict:
    """Overrides of the right JSON types and ranges (TrainConfig's own checks take a bool for a number), as
    TrainConfig takes them (2.0 is the integer 2)."""
    from pydantic import ValidationError

    from skillbank.serve.schemas import TrainOverrides
    unknown = sorted(set(overrides) - set(TrainOverrides.model_fields))
    if unknown:
        raise LearnRefused(f"invalid training settings: unknown TrainConfig field(s) {unknown}", 422)
    try:
        checked = TrainOverrides.model_validate(overrides)
    except ValidationError as exc:
        e = exc.errors()[0]
        where = ".".join(str(x) for x in e["loc"])
        raise LearnRefused(f"invalid training settings: TrainConfig.{where}: {e['msg']}", 422) from None
    return {k: getattr(checked, k) for k in overrides}


def train_config(recipe: str, overrides: dict | None, base: str = ""):
    """The TrainConfig of a job: a recipe (as ``skillbank learn --recipe``; ``auto``: the one that suits the
    bank's ``base``, see :mod:`skillbank.train.recipes`) plus field overrides."""
    from skillbank.train.recipes import recipe_for_base, train_config_for_recipe
    if recipe not in RECIPES:
        raise LearnRefused(f"recipe must be one of {list(RECIPES)}, got {recipe!r}", 422)
    if not isinstance(overrides or {}, dict):
        raise LearnRefused("invalid training settings: an object of TrainConfig fields is expected", 422)
    overrides = _train_overrides(overrides or {})
    if recipe == "auto":
        recipe = recipe_for_base(base)[0]
    try:
        return train_config_for_recipe(recipe, overrides)
    except (ModelError, TypeError) as exc:
        raise LearnRefused(f"invalid training settings: {exc}", 422) from None


@dataclass(frozen=True)
class CheckedUpload:
    """An upload that passed every check, its records written into ``workdir`` (private, removed with the job)."""

    family: str
    workdir: Path
    data: Path
    records: int
    cfg: Any  # TrainConfig
    skills: list[str] | None


def check_against_base(records, cfg, *, tokenizer, num_layers: int, module_names: set[str]) -> None:
    """What only the base model can tell, checked as the learner will meet it: each record tokenized into its
    training example (a tokenizer may refuse text that JSON allowed), at least one example within
    ``max_length``, the LoRA's target modules and layers present in the base. Raises :class:`LearnRefused`."""
    from skillbank.model.prompts import build_example
    from skillbank.model.serialization import encode
    from skillbank.train.executor import common_prefix

    missing = [m for m in cfg.target_modules if m not in module_names]
    if missing:
        raise LearnRefused(f"invalid training settings: TrainConfig.target_modules names {missing}, which the base "
                           f"model does not have (it has e.g. {sorted(module_names)[:8]})", 422)
    if cfg.layers_to_transform and max(cfg.layers_to_transform) >= num_layers:
        raise LearnRefused(f"invalid training settings: TrainConfig.layers_to_transform names layer "
                           f"{max(cfg.layers_to_transform)}, but the base has layers 0..{num_layers - 1}", 422)
    prefix = common_prefix(sorted({t for r in records for t in r.graph.tasks}))
    fits = 0
    for r in records:
        try:
            example = build_example(tokenizer, r.request, encode(r.graph, cfg.target_format, prefix), cfg.system_prompt)
        except Exception as exc:  # noqa: BLE001 - a tokenizer's errors have no common type (TypeError, ValueError...)
            raise LearnRefused(f"record {r.id}: the base model's tokenizer cannot take it ({type(exc).__name__}: "
                               f"{exc})", 422) from None
        fits += cfg.max_length is None or len(example.input_ids) <= cfg.max_length
    if not fits:
        raise LearnRefused(f"all {len(records)} records are longer than TrainConfig.max_length={cfg.max_length} "
                           "tokens (prompt and target): nothing would be learned", 422)


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
        self._deleted: set[str] = set()  # deleted by request while running: hidden, forgotten when they end
        self._tasks: set[asyncio.Task] = set()

    def running(self) -> LearnJob | None:
        return next((j for j in self.jobs.values() if j.active), None)

    def check(self, family: str, records_text: str, *, served: dict[str, list[str]], recipe: str = "auto",
              train: dict | None = None, skills: list[str] | None = None,
              base_check: Callable | None = None) -> "CheckedUpload":
        """Check a whole upload (nothing is started; no event loop needed: run it off the loop, it may tokenize
        thousands of records). ``served``: shard name -> skill ids of the bank being served; ``base_check``:
        ``(records, TrainConfig) -> None``, raising :class:`LearnRefused` for what the base model cannot take
        (:func:`check_against_base`). Raises LearnRefused; else the records are in a private work directory
        that :meth:`launch` hands to the learner (or :meth:`discard` removes)."""
        try:
            check_family_name(family)
        except Exception as exc:  # BankError: the message says what a name may be
            raise LearnRefused(str(exc), 422) from None
        if family in served:
            raise LearnRefused(f"family {family!r} is already in the bank; shards are write-once - use a new name", 409)
        self._refuse_if_busy()
        try:
            base = read_manifest(self.root).base["name"]
        except BankError:
            base = ""  # an unreadable bank fails the learn process itself, which reports why
        cfg = train_config(recipe, train, base)
        if skills is not None and (not skills or not all(isinstance(s, str) and s.strip() for s in skills)):
            raise LearnRefused("skills must be a non-empty list of skill ids", 422)
        try:
            records_text.encode("utf-8")
        except UnicodeEncodeError as exc:  # only a caller in Python can hand one over: HTTP bodies are decoded
            raise LearnRefused(f"the records are not valid Unicode text ({exc.reason} at character {exc.start})",
                               422) from None
        bad = record_text_problems(records_text)
        if bad:
            listed = "; ".join(bad[:MAX_LISTED_BAD_LINES])
            more = len(bad) - MAX_LISTED_BAD_LINES
            raise LearnRefused(f"{len(bad)} bad record line(s): {listed}" + (f"; and {more} more" if more > 0 else ""),
                               422)

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
            check_disjoint(declared, {s: name for name, ss in served.items() for s in ss})  # RecordError: 422
            if base_check is not None:
                base_check(rs.records, cfg)
        except RecordError as exc:
            shutil.rmtree(workdir, ignore_errors=True)
            raise LearnRefused(str(exc.reason), 422) from None
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        return CheckedUpload(family, workdir, data, len(rs.records), cfg, skills)

    def launch(self, upload: "CheckedUpload") -> LearnJob:
        """Start the learn process of a checked upload (on the event loop)."""
        try:
            self._refuse_if_busy()  # again: another upload may have been launched while this one was checked
        except LearnRefused:
            self.discard(upload)
            raise
        job = LearnJob(id=uuid.uuid4().hex[:12], family=upload.family, records=upload.records, workdir=upload.workdir)
        self.jobs[job.id] = job
        args = [sys.executable, "-m", "skillbank.serve.learn_process", "--bank", str(self.root.resolve()),
                "--family", upload.family, "--data", str(upload.data), "--status", str(upload.workdir / "status.json"),
                "--train", json.dumps(upload.cfg.to_dict()), "--parent-pid", str(os.getpid()),
                "--workdir", str(upload.workdir)]
        if upload.skills is not None:
            args += ["--skills", json.dumps(sorted(set(upload.skills)))]
        if self.threads:
            args += ["--threads", str(self.threads)]
        args += ["--checkpoint-minutes", str(self.checkpoint_minutes)]
        task = asyncio.get_running_loop().create_task(self._run(job, args), name=f"learn-{job.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return job

    def start(self, family: str, records_text: str, **options) -> LearnJob:
        """Check an upload and start its job at once (see :meth:`check` for ``options``)."""
        return self.launch(self.check(family, records_text, **options))

    @staticmethod
    def discard(upload: "CheckedUpload") -> None:
        shutil.rmtree(upload.workdir, ignore_errors=True)

    def _refuse_if_busy(self) -> None:
        busy = self.running()
        if busy is not None:
            raise LearnRefused(f"learn job {busy.id} ({busy.family}) is still running; one job at a time", 409)

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
        if job.id in self._deleted:  # deleted while it ran: nothing is left to report
            self.jobs.pop(job.id, None)
            self._deleted.discard(job.id)

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

    def visible(self, job_id: str) -> bool:
        """A job the API reports: started here, and not deleted."""
        return job_id in self.jobs and job_id not in self._deleted

    def listed(self) -> list[LearnJob]:
        return [j for j in self.jobs.values() if j.id not in self._deleted]

    def delete(self, job_id: str) -> LearnJob:
        """Cancel a job if it runs, and forget it: the API answers 404 for it from now on. A running one is kept
        out of sight until its process has ended (so no new job starts beside it)."""
        job = self.cancel(job_id)
        if job.finished is None:
            self._deleted.add(job_id)
        else:
            self.jobs.pop(job_id, None)
        return job

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
