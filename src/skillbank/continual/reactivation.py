"""The paper's "w/ correct skill address" rows: each finished method's final checkpoint re-evaluated on
every task with the correct skill address appended to every request, no retraining.

A diagnostic, not a deployment condition (the address names the gold skills): it separates a method that
lost access to an earlier family from one that lost its execution. Sequential SFT already probes the
address after every stage (``address_probe``); this adds the final-checkpoint probe to the methods that do
not (by default the paper's LwF, EWC and O-LoRA), reading nothing but the run directory.

On disk: ``methods/<m>/<order>/stage-NN/address.json`` next to the final stage's ``eval.json`` (variant
``<m>+address``). Generations go to the method's output cache, so an interrupted reactivation resumes and
a repeated one costs nothing.
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Sequence

from skillbank.errors import SkillbankError

PAPER_METHODS = ("lwf", "ewc", "olora")


def reactivate(run_dir: str | Path, methods: Sequence[str] = PAPER_METHODS, orders: Sequence[str] | None = None,
               say=None, progress: bool = True) -> dict[str, dict[str, str]]:
    """Probe the final checkpoint of every finished (method, order) named; returns ``{method: {order:
    what happened}}`` (probed, already probed, or why it was skipped)."""
    from skillbank.config import RunConfig
    from skillbank.continual.methods import method_class
    from skillbank.run_dir import COMPLETE, build_run_stream, stage_dir

    out = Path(run_dir)
    if not (out / "config.json").is_file():
        raise SkillbankError(f"{out} is not a run directory (no config.json; start one with `skillbank exp run`)")
    cfg = RunConfig.from_run(json.loads((out / "config.json").read_text()), str(out / "config.json"))
    stream = build_run_stream(cfg)
    done: dict[str, dict[str, str]] = {}
    for name in methods:
        cls = method_class(name)  # raises on an unknown method name
        if not cls.trains:
            raise SkillbankError(f"{name} trains nothing: its results already use what it is given")
        mdir = out / "methods" / name
        for order_name in orders or cfg.eval.orders:
            order = stream.order(order_name)
            final = stage_dir(mdir / order_name, len(order))
            status = done.setdefault(name, {})
            if not (final / "eval.json").is_file():
                status[order_name] = "not finished: skipped"
                continue
            if (final / "address.json").is_file():
                status[order_name] = "already probed"
                continue
            if not (final / "state" / COMPLETE).is_file():
                status[order_name] = "final state not kept: skipped"
                continue
            if f"{name}+address" in json.loads((final / "eval.json").read_text())["variants"]:
                status[order_name] = "probed at every stage by the run"
                continue
            if say:
                say(f"{name} {order_name}: final checkpoint with the correct skill address")
            _probe(cfg, stream, name, order_name, order, mdir, final, say, progress)
            status[order_name] = "probed"
    return done


def address_records(records):
    """The records with the correct skill address (their gold skill ids) appended to each request."""
    from skillbank.continual.diagnostics import address_hint, with_text
    return [dataclasses.replace(r, request=with_text(r.request, address_hint(r.graph.tasks))) for r in records]


def final_method(cfg, stream, name: str, order_name: str, mdir: Path, base, say=None, progress: bool = False):
    """Method ``name`` of a run (``cfg``, ``stream``; its directory ``mdir``) as it was after the last stage of
    order ``order_name``, on the loaded ``base``."""
    from skillbank.continual.methods import MethodContext, method_class
    from skillbank.run_dir import stage_dir

    order = stream.order(order_name)
    ctx = MethodContext(base=base, train=cfg.train_config_for(name), stream=stream, order_name=order_name, order=order,
                        workdir=mdir, progress=progress, say=say, extras={"address": cfg.address.model_dump()})
    method = method_class(name)(ctx, cfg.method_params_for(name))
    try:
        method.load(stage_dir(mdir / order_name, len(order)) / "state", len(order))
    except BaseException:
        method.close()
        raise
    return method


def _probe(cfg, stream, name, order_name, order, mdir, final, say, progress) -> None:
    from skillbank.continual.engines import outputs_engine
    from skillbank.run_dir import write_json_atomic
    from skillbank.continual.runner import OutputCache, evaluate_stage
    from skillbank.model.base import load_base

    base = load_base(cfg.base_config(), progress=progress)
    method = final_method(cfg, stream, name, order_name, mdir, base, say, progress)
    engine = outputs_engine(cfg.eval_engine(), base.identity, cfg.eval_encoding())  # what the run generated with
    try:
        cache = OutputCache.for_run(mdir / "outputs.jsonl", cfg, stream, engine)
        t0 = time.perf_counter()
        # Scored against the untouched records: only the request text the model reads changes.
        ev = evaluate_stage(method, len(order), order, stream, cache, say, progress, split=cfg.eval.split,
                            variants=lambda tests: {f"{name}+address": method.queries(len(order), address_records(tests))[name]})
        ev["eval_seconds"] = round(time.perf_counter() - t0, 2)
        ev["order"] = order
        write_json_atomic(final / "address.json", ev)
    finally:
        engine.close()
        method.close()
