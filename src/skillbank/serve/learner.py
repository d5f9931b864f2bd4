"""The background learn process: ``python -m skillbank.serve.learner`` learns one family into a bank on disk.

The service starts one per ``POST /v1/families`` job. Learning runs in its own process rather than a thread of
the service because training and serving cannot share one model object (PEFT's active adapter and the
train/eval mode are global to it): here the learn step gets its own copy of the base, the served model is
never touched, and a crash, an out-of-memory kill or ``DELETE /v1/families/{job}`` ends only this process.
``SkillBank.learn`` publishes atomically (one ``os.replace`` of bank.json), so whatever happens to this
process the bank on disk is either the old one or the old one plus the new shard.

Progress goes to a JSON status file the service polls: ``{"state": "loading" | "training" | "published" |
"failed", "step", "total", "epoch", "loss", "error", ...}``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path


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
                             epoch=post.get("epoch"), loss=post.get("loss"))
            return out

        def set_postfix(self, ordered_dict=None, refresh=True, **kwargs):
            self.postfix_dict = {**(ordered_dict or {}), **kwargs}
            return super().set_postfix(ordered_dict, refresh, **kwargs)

    return StatusBar


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bank", type=Path, required=True)
    ap.add_argument("--family", required=True)
    ap.add_argument("--data", type=Path, required=True, help="records JSONL (validated by the service already)")
    ap.add_argument("--status", type=Path, required=True)
    ap.add_argument("--train", default="{}", help="TrainConfig as JSON")
    ap.add_argument("--skills", default=None, help="the family's skill ids as a JSON list (default: those used)")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)

    from skillbank.errors import SkillbankError
    try:
        import tqdm.auto

        from skillbank.data.records import read_records
        from skillbank.memory.bank import SkillBank, read_manifest
        from skillbank.model.base import BaseModelConfig
        from skillbank.train.executor import TrainConfig

        write_status(args.status, state="loading")
        cfg = TrainConfig.from_dict(json.loads(args.train))
        skills = json.loads(args.skills) if args.skills else None
        records = read_records(args.data).records
        manifest = read_manifest(args.bank)
        bank = SkillBank.open(args.bank, base_config=BaseModelConfig(name=manifest.base["name"], threads=args.threads))
        tqdm.auto.tqdm = _progress_bar(args.status)
        entry = bank.learn(args.family, records, cfg, skills=skills, progress=True)
        t = entry.training
        write_status(args.status, state="published", shard=entry.dir, skills=len(entry.skills),
                     examples=t.get("examples"), steps=t.get("steps"), total=t.get("steps"),
                     train_seconds=t.get("wall_seconds"), final_loss=t.get("final_loss"))
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
