"""FSM's stages in parallel: each executor depends only on its own family's records, so the families can
be trained at the same time in separate processes (several GPUs, or one large GPU shared by a few small
models) and appended to the bank afterwards in order.

Each worker loads the base, trains one family's adapter with the run's recipe and writes a plain PEFT
directory plus ``training.json`` under ``<fsm dir>/pretrained/<family>``; ``SkillBank.learn(...,
pretrained=dir)`` then loads it instead of training (checking the recipe matches). A family already in
the bank, or already pretrained, is skipped, so this step resumes too; a worker killed inside its training
continues from its checkpoint (``<fsm dir>/pretrained/<family>.fit.pt``, every ``[runner]
checkpoint_minutes``, as a stage trained in turn does).
"""
from __future__ import annotations

import json
import os
import shutil
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path
from typing import Callable

from skillbank.config import RunConfig
from skillbank.data.stream import Stream


def _family_prefix(stream: Stream, family: str) -> str:
    from skillbank.train.executor import common_prefix
    return common_prefix(sorted(stream.catalog.family(family).skills))


def _train_one(cfg_dict: dict, family: str, records: list, prefix: str, target: str, device: str | None,
               threads: int | None) -> str:
    from skillbank.model.base import load_base
    from skillbank.train.checkpoint import FitCheckpoint
    from skillbank.train.executor import train_executor

    cfg = RunConfig.model_validate(cfg_dict)
    base_cfg = cfg.base_config()
    from dataclasses import replace
    if device is not None:
        base_cfg = replace(base_cfg, device=device)
    if threads is not None and base_cfg.threads is None:
        base_cfg = replace(base_cfg, threads=threads)  # workers share the cores instead of each taking all
    base = load_base(base_cfg, progress=False)
    target_dir = Path(target)
    checkpoint = None
    if cfg.runner.checkpoint_minutes > 0:
        checkpoint = FitCheckpoint(target_dir.with_name(f"{target_dir.name}.fit.pt"),
                                   every_seconds=60 * cfg.runner.checkpoint_minutes, keep_final=True)
    _, summary = train_executor(base, records, cfg.train_config_for("fsm"), adapter_name=family, family_prefix=prefix,
                                progress=False, checkpoint=checkpoint)
    tmp = target_dir.with_name(target_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    base.save_adapter(family, tmp)
    (tmp / "training.json").write_text(json.dumps(summary.to_dict(), indent=1) + "\n")
    shutil.rmtree(target_dir, ignore_errors=True)
    os.replace(tmp, target_dir)
    if checkpoint is not None:  # kept past the training's end until the adapter directory was in place
        checkpoint.remove()
    return family


def pretrain_fsm_stages(cfg: RunConfig, stream: Stream, fsm_dir: Path,
                        say: Callable[[str], None] | None = None) -> dict[str, Path]:
    """Train every FSM family not yet in the bank in ``cfg.runner.parallel_stages`` worker processes.
    Returns family -> adapter directory for ``SkillBank.learn(pretrained=...)``."""
    import torch

    from skillbank.memory.bank import read_manifest

    done_in_bank: set[str] = set()
    if (fsm_dir / "bank" / "bank.json").is_file():
        done_in_bank = {s.name for s in read_manifest(fsm_dir / "bank").shards}
    root = fsm_dir / "pretrained"
    root.mkdir(parents=True, exist_ok=True)
    wanted = list(dict.fromkeys(f for o in cfg.eval.orders for f in stream.order(o)))
    todo = [f for f in wanted if f not in done_in_bank and not (root / f / "training.json").is_file()]
    if todo:
        workers = min(cfg.runner.parallel_stages, len(todo))
        gpus = torch.cuda.device_count()
        if say:
            say(f"fsm: training {len(todo)} stages in {workers} parallel processes"
                + (f" over {gpus} GPU(s)" if gpus else " on the CPU"))
        # spawn: a forked child would inherit the parent's torch threads and CUDA state.
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
            futures = []
            for i, fam in enumerate(todo):
                device = f"cuda:{i % gpus}" if gpus else None
                threads = None if gpus else max(1, (os.cpu_count() or 1) // workers)
                futures.append(pool.submit(_train_one, cfg.model_dump(), fam, stream.train[fam],
                                           _family_prefix(stream, fam), str(root / fam), device, threads))
            for fut in as_completed(futures):
                fam = fut.result()
                if say:
                    say(f"  fsm: {stream.task_label(fam)} {fam} trained")
    return {f: root / f for f in wanted if (root / f / "training.json").is_file()}
