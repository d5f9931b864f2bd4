"""A run directory: what it holds, the stream a run uses, and reading its finished stages back.

The runner (:mod:`skillbank.continual.runner`) writes it; the report, the failure analysis, the sweep and the
diagnostics read it through this module, which imports neither the runner nor the report.

On disk (``RUN_DIR``)::

    config.json                       the resolved configuration (a rerun must match it)
    methods/<method>/outputs.jsonl    generated outputs keyed by (model state, prompt digest): the cache
    methods/<method>/bank/            FSM only: the bank its executors were appended to
    methods/<method>/<order>/stage-NN/state/       the method's state after stage NN (last one kept)
    methods/<method>/<order>/stage-NN/train.json   that stage's training summary
    methods/<method>/<order>/stage-NN/eval.json    that stage's evaluation: the stage is finished
    methods/<method>/<order>/predictions.jsonl     per-request outputs (text, parsed graph) at the final prefix
    results.json, report.md, report.html, *.png
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

from skillbank.config import ConfigError, RunConfig
from skillbank.data.stream import Stream
from skillbank.metrics import AccuracyMatrix, task_macro

COMPLETE = "COMPLETE"  # written last into a stage's state directory: the state is whole
FIT_CHECKPOINT = "fit-checkpoint.pt"  # inside a stage directory while its training runs (train/checkpoint.py)


# -- the stream ----------------------------------------------------------------------------------
def build_run_stream(cfg: RunConfig) -> Stream:
    """The stream a run uses, cut to the configured per-family sizes, with its validation split carved out of
    the training requests when ``[stream] validation_per_family`` (or ``validation_fraction``) is set."""
    stream = _build_stream(cfg)
    s = cfg.stream
    if s.has_validation:
        stream.split_validation(s.validation_per_family, s.validation_fraction, seed=s.seed)
    return stream


def _build_stream(cfg: RunConfig) -> Stream:
    s = cfg.stream
    if s.source == "builtin":
        from skillbank.data.builtin import build_builtin_stream
        return build_builtin_stream(seed=s.seed, train_per_family=s.train_per_family,
                                    test_per_family=s.test_per_family or 300)
    if s.source == "taskbench":
        from skillbank.data.taskbench import load_taskbench
        if not s.path:
            raise ConfigError("[stream] source = 'taskbench' needs path = the TaskBench folder")
        return load_taskbench(s.path, seed=s.seed, train_per_family=s.train_per_family,
                              test_per_family=s.test_per_family)
    if s.source == "taskbench-hub":
        from skillbank.data.taskbench import load_taskbench_hub
        return load_taskbench_hub(seed=s.seed, train_per_family=s.train_per_family,
                                  test_per_family=s.test_per_family)
    if not s.path:
        raise ConfigError("[stream] source = 'dir' needs path = a stream directory (skillbank exp stream build)")
    stream = Stream.load(s.path)
    for key in stream.family_keys:
        stream.train[key] = stream.train[key][:s.train_per_family]
        if s.test_per_family:
            stream.test[key] = stream.test[key][:s.test_per_family]
    return stream


# -- files ---------------------------------------------------------------------------------------------
def write_json_atomic(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def write_jsonl_atomic(path: Path, rows) -> None:
    """One JSON object a line, written aside and renamed (a kill never leaves half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def stage_dir(odir: Path, t: int) -> Path:
    return odir / f"stage-{t:02d}"



# -- reading results back --------------------------------------------------------------------------------
def collect_method_order(odir: Path, order: list[str]) -> dict:
    """Rebuild one method-order result from its stage files (so a resumed or stopped run reports what it
    finished). ``complete`` is False when fewer than all stages were evaluated."""
    variants: dict[str, dict] = {}
    training, eval_seconds, spans = {}, {}, []
    done = 0
    while done < len(order) and (stage_dir(odir, done + 1) / "eval.json").is_file():
        done += 1
    for t in range(1, done + 1):
        sdir = stage_dir(odir, t)
        ev = json.loads((sdir / "eval.json").read_text())
        tr = json.loads((sdir / "train.json").read_text()) if (sdir / "train.json").is_file() else {}
        training[order[t - 1]] = tr
        eval_seconds[t] = ev.get("eval_seconds", 0.0)
        spans.append(_stage_span(sdir, ev, tr))
        for v, e in ev["variants"].items():
            d = variants.setdefault(v, {"em": AccuracyMatrix(order), "stages": []})
            for k, m in e["tasks"].items():
                d["em"].set(t, k, m["graph_em"])
            d["stages"].append(e)
    out = {"order": order, "variants": {}, "training": training, "stages_done": done, "complete": done == len(order),
           "timing": {"train_seconds": round(sum(float(s.get("wall_seconds", 0) or 0) for s in training.values()), 1),
                      "eval_seconds": round(sum(eval_seconds.values()), 1), "stage_spans": spans}}
    for v, d in variants.items():
        em: AccuracyMatrix = d["em"]
        out["variants"][v] = {"em": em.to_dict(), "final": d["stages"][-1]["tasks"], "summary": _summary(em, d["stages"]),
                              "macro_per_stage": [em.macro(s) for s in range(1, done + 1)]}
    extra = odir / "extra.json"  # sets written elsewhere, evaluated after the last stage (continual/runner.py)
    if done == len(order) and extra.is_file():
        out["extra"] = json.loads(extra.read_text())
    probe = stage_dir(odir, done) / "address.json"
    if done == len(order) and probe.is_file():
        # the final checkpoint re-evaluated with the correct skill address (``skillbank exp reactivate``): one
        # row, so no BWT
        for v, e in json.loads(probe.read_text())["variants"].items():
            if v not in out["variants"]:
                out["variants"][v] = {"final": e["tasks"], "summary": _final_summary(e["tasks"], order), "final_only": True}
    return out


def _stage_span(sdir: Path, ev: dict, tr: dict) -> dict:
    """When a stage ran: its recorded end (or, for stages written before ends were recorded, eval.json's
    modification time) minus its training and evaluation time. Approximate for FSM's stages trained ahead in
    parallel workers, whose training happened before, not right before, their evaluation."""
    end = ev.get("finished_at")
    source = "recorded"
    if end is None:
        end, source = (sdir / "eval.json").stat().st_mtime, "file time"
    busy = float(tr.get("wall_seconds", 0) or 0) + float(ev.get("eval_seconds", 0) or 0)
    return {"start": round(end - busy, 1), "end": round(end, 1), "source": source}


def _final_summary(final: dict, order: Sequence[str]) -> dict:
    """Metrics of the last evaluation: macro over tasks of EM, tool choice and argument F1."""
    return {"macro_em": task_macro(final[k]["graph_em"] for k in order if k in final),
            "tool_choice": task_macro(m["tool_choice"] for m in final.values()),
            "arg_f1": task_macro(m["arg_f1"] for m in final.values()),
            "final_em": {k: final[k]["graph_em"] for k in order if k in final}}


def _summary(em: AccuracyMatrix, stages: list[dict]) -> dict:
    summary = {**_final_summary(stages[-1]["tasks"], em.order), "bwt": em.bwt(),
               "diagonal_macro_em": task_macro(em.diagonal().values())}
    if "route_accuracy" in stages[-1]:
        summary["route_accuracy"] = stages[-1]["route_accuracy"]
        summary["route_per_stage"] = [s.get("route_accuracy") for s in stages]
    return summary


def load_run(run_dir: str | Path) -> dict:
    """A run's record for reporting: ``run.json`` (stream, task labels) plus every method and order found
    on disk, finished or not (a stopped process leaves its finished stages). Raises if ``run_dir`` holds
    no run."""
    from skillbank.errors import SkillbankError
    out = Path(run_dir)
    meta_path = out / "run.json"
    if not meta_path.is_file():
        raise SkillbankError(f"{out} is not a run directory (no run.json; start one with `skillbank exp run`)")
    try:
        record = json.loads(meta_path.read_text())
        record["config"] = json.loads((out / "config.json").read_text())
    except json.JSONDecodeError as exc:
        raise SkillbankError(f"{out}: a run file is not valid JSON ({exc})") from None
    methods: dict[str, dict] = {}
    root = out / "methods"
    for mdir in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        for odir in sorted(p for p in mdir.iterdir() if p.is_dir() and (p / "stage-01" / "eval.json").is_file()):
            order = json.loads((odir / "stage-01" / "eval.json").read_text()).get("order")
            if order is None:
                continue
            methods.setdefault(mdir.name, {})[odir.name] = collect_method_order(odir, order)
    record["methods"] = methods
    return record
