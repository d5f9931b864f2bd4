"""The background learn process: ``python -m skillbank.serve.learn_process`` learns one family into a bank on disk.

The service starts one per ``POST /v1/families`` job. Learning runs in its own process rather than a thread of
the service because training and serving cannot share one model object (PEFT's active adapter and the
train/eval mode are global to it): here the learn step gets its own copy of the base, the served model is
never touched, and a crash, an out-of-memory kill or ``DELETE /v1/families/{job}`` ends only this process.
``SkillBank.learn`` publishes atomically (one ``os.replace`` of bank.json), so whatever happens to this
process the bank on disk is either the old one or the old one plus the new shard.

Progress goes to a JSON status file the service polls: ``{"state": "loading" | "training" | "published" |
"failed", "step", "total", "epoch", "loss", "error", ...}``.

The training writes a checkpoint every ``--checkpoint-minutes`` into the bank (``BANK/checkpoints/<family>.fit.pt``,
as ``skillbank learn`` does): adapter, optimizer and loop state, no requests. A job ended by a killed process
or a service shut down or restarted leaves it there, and the next job that learns the same family from the
same records continues from it (``resumed_after_step`` in its status) and publishes what an uninterrupted
training would have (``skillbank.train.checkpoint``). Other records are another training: the checkpoint
is replaced. A job cancelled by request removes it (the service does, when this process has ended).

A learner never outlives its service (``--parent-pid``): a job nobody can report or cancel any more must not
keep the cores busy, nor publish a family into a bank the (restarted) service did not ask for. On Linux the
kernel sends SIGTERM when the parent dies (``PR_SET_PDEATHSIG``); everywhere, a thread also watches
``os.getppid()``; and the publish itself (the one ``os.replace`` of bank.json) is refused once the parent is
gone. An orphaned learner removes the job's work directory (``--workdir``: the uploaded records) before it
exits - the service that would have removed it is dead.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
WATCH_INTERVAL_S = 0.5
SIGTERM_ORPHAN_WAIT_S = 1.0


def write_status(path: Path, **status) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**status, "time": time.time()}))
    os.replace(tmp, path)  # the service never reads a half-written file


def _progress_bar(status_path: Path):
    """A tqdm class that also writes the step count to the status file (at most twice a second).

    ``train_executor`` draws its progress with ``tqdm.auto.tqdm``; putting this class there is how a
    separate process reads that progress without the trainer knowing about the service."""
    from tqdm import tqdm as base_tqdm

    class StatusBar(base_tqdm):
        _last = 0.0

        def update(self, n=1):
            out = super().update(n)
            now = time.monotonic()
            if now - self._last >= 0.5 or self.n >= (self.total or 0):
                self._last = now
                post = dict(self.postfix_dict) if hasattr(self, "postfix_dict") else {}
                write_status(status_path, state="training", step=int(self.n), total=int(self.total or 0),
                             epoch=post.get("epoch"), loss=post.get("loss"),
                             resumed_after_step=int(self.initial) or None)  # a checkpoint's step (fit's bar)
            return out

        def set_postfix(self, ordered_dict=None, refresh=True, **kwargs):
            self.postfix_dict = {**(ordered_dict or {}), **kwargs}
            return super().set_postfix(ordered_dict, refresh, **kwargs)

    return StatusBar


class ParentWatch:
    """Ends this process when the process that started it (``parent``) is gone; see the module docstring."""

    def __init__(self, parent: int, workdir: Path | None):
        self.parent, self.workdir = parent, workdir

    @property
    def orphaned(self) -> bool:
        # The kernel re-parents an orphan (to init or a subreaper): the parent id changes, it never comes back.
        return os.getppid() != self.parent

    def start(self) -> None:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        how = self._death_signal()
        if self.orphaned:  # the parent died before the death signal was armed: nobody would send it
            self.die()
        threading.Thread(target=self._watch, name="parent-watch", daemon=True).start()
        if how:
            print(f"learner: parent {self.parent} watched every {WATCH_INTERVAL_S} s only ({how})", file=sys.stderr)

    @staticmethod
    def _death_signal() -> str | None:
        """Arm PR_SET_PDEATHSIG; None when armed, else why not (the watcher thread then is the only guard)."""
        if not sys.platform.startswith("linux"):
            return f"no parent-death signal on {sys.platform}"
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
                return f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(ctypes.get_errno())}"
        except (OSError, AttributeError) as exc:
            return f"prctl is unavailable: {exc}"
        return None

    def _watch(self) -> None:
        while not self.orphaned:
            time.sleep(WATCH_INTERVAL_S)
        self.die()

    def _on_sigterm(self, signum, frame) -> None:
        # From the kernel when the parent died, or from anyone else: the records go only when nobody is left to
        # remove them (a live service removes them itself when it sees this process end). The kernel signals
        # when the parent's *thread* that started this process exits, which in a server being killed can come
        # a moment before its other threads are gone and this process is re-parented: wait for that, briefly.
        deadline = time.monotonic() + SIGTERM_ORPHAN_WAIT_S
        while not self.orphaned and time.monotonic() < deadline:
            time.sleep(0.01)
        self.die(signal.SIGTERM)

    def die(self, signum: int = signal.SIGKILL) -> None:
        """Exit now, from any thread, without running any more of the learn step: so without publishing."""
        if self.orphaned and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
        if signum == signal.SIGTERM:  # only the handler passes it, and handlers run in the main thread
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signum)  # ends with the signal as its status, as a kill from outside would
        os._exit(128 + signum)  # not reached: the default action of both signals ends the process

    def guard_publish(self) -> None:
        """Refuse the publish (``write_manifest``: the commit point of ``SkillBank.learn``) once orphaned."""
        import skillbank.memory.bank as bank_module
        write = bank_module.write_manifest

        def guarded(root, manifest):
            if self.orphaned:
                self.die()
            return write(root, manifest)

        bank_module.write_manifest = guarded


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bank", type=Path, required=True)
    ap.add_argument("--family", required=True)
    ap.add_argument("--data", type=Path, required=True, help="records JSONL (validated by the service already)")
    ap.add_argument("--status", type=Path, required=True)
    ap.add_argument("--train", default="{}", help="TrainConfig as JSON")
    ap.add_argument("--skills", default=None, help="the family's skill ids as a JSON list (default: those used)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--checkpoint-minutes", type=float, default=10.0,
                    help="write the training's state into BANK/checkpoints/ this often (0: never)")
    ap.add_argument("--parent-pid", type=int, default=None,
                    help="end (without publishing) when this process, the service, is gone")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="the job's private directory, removed if the service dies first")
    args = ap.parse_args(argv)
    watch = None
    if args.parent_pid is not None:
        watch = ParentWatch(args.parent_pid, args.workdir)
        watch.start()

    from skillbank.errors import SkillbankError
    try:
        import tqdm.auto

        from skillbank.data.records import read_records
        from skillbank.memory.bank import SkillBank, learn_checkpoint_path, read_manifest
        from skillbank.model.base import BaseModelConfig
        from skillbank.train.checkpoint import FitCheckpoint
        from skillbank.train.executor import TrainConfig

        write_status(args.status, state="loading")
        cfg = TrainConfig.from_dict(json.loads(args.train))
        skills = json.loads(args.skills) if args.skills else None
        uploaded = read_records(args.data)  # lines with "graph": null are the family's negatives (scope gate)
        records = uploaded.records
        manifest = read_manifest(args.bank)
        bank = SkillBank.open(args.bank, base_config=BaseModelConfig(name=manifest.base["name"], threads=args.threads))
        tqdm.auto.tqdm = _progress_bar(args.status)
        if watch is not None:
            watch.guard_publish()
        checkpoint = None
        if args.checkpoint_minutes > 0:
            checkpoint = FitCheckpoint(learn_checkpoint_path(args.bank, args.family),
                                       every_seconds=60 * args.checkpoint_minutes)
        entry = bank.learn(args.family, records, cfg, skills=skills, progress=True, checkpoint=checkpoint,
                           negatives=uploaded.negatives)
        t = entry.training
        write_status(args.status, state="published", shard=entry.dir, skills=len(entry.skills),
                     examples=t.get("examples"), steps=t.get("steps"), total=t.get("steps"),
                     train_seconds=t.get("wall_seconds"), final_loss=t.get("final_loss"),
                     resumed_after_step=checkpoint.resumed_step if checkpoint is not None else None)
        return 0
    except SkillbankError as exc:
        write_status(args.status, state="failed", error=str(exc))
        return 2
    except Exception as exc:  # noqa: BLE001 - reported through the status file; the traceback goes to the job log
        traceback.print_exc()
        write_status(args.status, state="failed", error=f"internal error in the learn process: {type(exc).__name__}: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
