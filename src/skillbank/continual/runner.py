"""The continual runner: any method, any stream, any base; the accuracy matrix per prefix; resumable.

For each method and each task order, stage t learns family t (the method's own way, through the shared
training loop), then every held-out request of families 1..t is evaluated closed-book: the lower triangle
of the accuracy matrix, for every variant the method evaluates (FSM: routed and Oracle).
With ``[eval] split = "validation"`` the requests evaluated are instead the validation split carved from
each family's training requests (``[stream] validation_per_family``; those are then not trained on), so a
hyperparameter search (:mod:`skillbank.continual.sweep`) never looks at the held-out set.

On disk: :mod:`skillbank.run_dir` (the layout, and reading finished stages back).

Resume: a rerun finds the last finished stage of each method and order, loads its state and continues.
Outputs are cached under a digest of the weights that produced them, so reuse is exact: a run killed
anywhere ends, after a rerun, with the same results as an uninterrupted one. Files are written to a
temporary name and renamed, so a kill never leaves a half-written state or evaluation.

Under ``accelerate launch`` (several processes) every process trains (the shared loop averages
gradients) and only the main one evaluates and writes.
"""
from __future__ import annotations

import gc
import hashlib
import json
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

from skillbank.config import ConfigError, RunConfig, saved_encoding
from skillbank.run_dir import (COMPLETE, FIT_CHECKPOINT, build_run_stream, collect_method_order,
                                         write_json_atomic, write_jsonl_atomic)
from skillbank.continual.progress import machine_label
from skillbank.run_dir import stage_dir as _stage_dir
from skillbank.continual.stage_cache import StageCache
from skillbank.data.records import Record
from skillbank.data.stream import Stream
from skillbank.metrics import aggregate, route_accuracy, score_example, task_macro
from skillbank.model.serialization import decode_output

Say = Callable[[str], None]


# -- small file helpers ----------------------------------------------------------------------------
def _is_main() -> bool:
    from skillbank.train.loop import process_state
    return process_state().is_main_process


def _barrier() -> None:
    from skillbank.train.loop import process_state
    process_state().wait_for_everyone()


# -- the output cache ------------------------------------------------------------------------------
def prompt_key(prompt: str) -> str:
    return hashlib.sha256(prompt.encode()).hexdigest()[:24]


class OutputCache:
    """(model state, prompt digest) -> generated output, appended to a JSONL file as it grows.

    A state names the exact weights (methods put a weight digest in it), so a cached output is reused only
    by the same weights on the same prompt. A torn last line (a kill mid-write) is ignored on load.

    With ``catalog`` given, decoding is constrained: a query's output may only use its ``skills`` and their
    declared arguments (``skillbank.model.constrain``), and the grammar's digest joins the prompt digest, so
    constrained and free outputs of the same prompt never stand in for each other.

    ``shared``: a second file that several methods' caches read and append to (the stage cache's, where
    methods that share a trained stage share its outputs too). An output found only there is copied into
    ``path``, so ``path`` always holds every output this method's evaluation used.

    ``engine``: what generates (:mod:`skillbank.continual.engines`; default the torch reference decoder). An
    engine other than torch joins the prompt digest too, so one engine's outputs never stand in for another's."""

    def __init__(self, path: Path, batch_size: int, max_new_tokens: int, catalog=None, shared: Path | None = None,
                 engine=None):
        from skillbank.continual.engines import TorchOutputs

        self.engine = engine if engine is not None else TorchOutputs()
        self.path = path
        self.shared = shared
        self.batch_size = batch_size
        self.max_new_tokens = max_new_tokens
        self.catalog = catalog
        self._grammars: dict[tuple, object] = {}
        self.shared_outputs: dict[tuple[str, str], dict] = self._read(shared) if shared else {}
        self.generate_seconds = 0.0
        self.generated = 0
        self.outputs = self._read(path)

    @classmethod
    def for_run(cls, path: Path, cfg: RunConfig, stream: Stream, engine, shared: Path | None = None) -> "OutputCache":
        """The cache a run's evaluation generates through: its ``[eval]`` batch size, cap and grammars."""
        return cls(path, cfg.eval.batch_size, cfg.eval.max_new_tokens,
                   catalog=stream.catalog if cfg.eval.constrain else None, shared=shared, engine=engine)

    @staticmethod
    def _read(path: Path) -> dict[tuple[str, str], dict]:
        out = {}
        if path.is_file():
            for line in path.read_text().splitlines():
                try:
                    d = json.loads(line)
                    out[(d["state"], d["prompt"])] = d
                except (json.JSONDecodeError, KeyError):
                    continue
        return out

    @staticmethod
    def _append(path: Path, rows: list[dict]) -> None:
        # One write() per line on an O_APPEND descriptor: processes running other orders or methods append
        # to the same file concurrently without interleaving inside a line.
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            for d in rows:
                os.write(fd, (json.dumps(d, ensure_ascii=False) + "\n").encode())
        finally:
            os.close(fd)

    def grammar(self, query):
        """The grammar a query's output must follow (None: unconstrained)."""
        if self.catalog is None or not query.skills:
            return None
        key = (query.skills, query.fmt, query.prefix)
        if key not in self._grammars:
            from skillbank.model.constrain import SkillSpec, build_grammar
            specs = [SkillSpec.of(self.catalog.skills[s]) for s in query.skills]
            self._grammars[key] = build_grammar(specs, query.fmt, query.prefix)
        return self._grammars[key]

    def key(self, query, grammar) -> tuple[str, str]:
        """(state, digest of the prompt, its grammar and the engine): what an output is cached under."""
        text = query.prompt if grammar is None else f"{query.prompt}\0grammar:{grammar.digest}"
        if self.engine.key:
            text += f"\0{self.engine.key}"
        return query.state, prompt_key(text)

    def get(self, method, queries: Sequence, say: Say | None = None, progress: bool = False) -> list[dict]:
        grammars = [self.grammar(q) for q in queries]
        keys = [self.key(q, g) for q, g in zip(queries, grammars)]
        missing: dict[tuple[str, str], tuple] = {}
        reused = []
        for q, g, k in zip(queries, grammars, keys):
            if k not in self.outputs and k in self.shared_outputs:
                self.outputs[k] = self.shared_outputs[k]
                reused.append(self.shared_outputs[k])
            if k not in self.outputs:
                missing.setdefault(k, (q.prompt, g))
        if reused:
            self._append(self.path, reused)
        by_state: dict[str, list[tuple[str, tuple]]] = {}
        for (state, pk), item in missing.items():
            by_state.setdefault(state, []).append((pk, item))
        for state, items in by_state.items():
            if say:
                say(f"  generating {len(items)} outputs with {state}")
            t0 = time.perf_counter()
            with method.model_for(state) as model:
                gens = self.engine.generate(model, method.base.tokenizer, [p for _, (p, _) in items],
                                            batch_size=self.batch_size, max_new_tokens=self.max_new_tokens,
                                            progress=progress, grammars=[g for _, (_, g) in items])
            self.generate_seconds += time.perf_counter() - t0
            self.generated += len(items)
            rows = []
            for (pk, _), g in zip(items, gens):
                d = {"state": state, "prompt": pk, "text": g.text, "n_tokens": g.n_tokens,
                     "mean_logprob": g.mean_logprob, "stopped": g.stopped, "reason": g.reason}
                self.outputs[(state, pk)] = d
                rows.append(d)
            self._append(self.path, rows)
            if self.shared is not None:
                self._append(self.shared, rows)
        return [self.outputs[k] for k in keys]


# -- evaluation of one stage -------------------------------------------------------------------------
def evaluate_stage(method, t: int, seen: Sequence[str], stream: Stream, cache: OutputCache,
                   say: Say | None = None, progress: bool = False, keep_predictions: bool = False,
                   variants: Callable[[list[Record]], dict] | None = None, split: str = "test",
                   records: dict[str, list[Record]] | None = None) -> dict:
    """Every variant's metrics on every seen task after stage ``t`` (and per-request predictions if asked).
    ``variants`` replaces the method's own queries (``tests -> {variant: queries}``), e.g. for a probe.
    ``split``: the held-out ``test`` requests, or the ``validation`` split carved from training (tuning).
    ``records``: other requests per family instead of a split (an extra set; a family may have none)."""
    if records is None:
        records = stream.split(split)
    seen = [k for k in seen if records.get(k)]
    tests: list[Record] = [r for k in seen for r in records[k]]
    variants = method.queries(t, tests) if variants is None else variants(tests)
    flat = [q for qs in variants.values() for q in qs]
    outs = cache.get(method, flat, say, progress)
    result: dict = {"stage": t, "variants": {}}
    if split != "test":  # runs evaluated on the test set keep their eval.json as it always was
        result["split"] = split
    predictions: list[dict] = []
    pos = 0
    for variant, qs in variants.items():
        mine, pos = outs[pos:pos + len(qs)], pos + len(qs)
        parsed = [decode_output(o["text"], q.fmt, q.prefix, stopped=o["stopped"], reason=o.get("reason"))
                  for q, o in zip(qs, mine)]
        scores = [score_example(r.graph, p.graph) for r, p in zip(tests, parsed)]
        per_task = {}
        for k in seen:
            idx = [i for i, r in enumerate(tests) if r.family == k]
            m = aggregate([scores[i] for i in idx])
            if qs and qs[0].route is not None:
                m["route_accuracy"] = route_accuracy([k] * len(idx), [qs[i].route for i in idx])
            m["n"] = len(idx)
            per_task[k] = m
        entry = {"tasks": per_task}
        if qs and qs[0].route is not None:
            entry["route_accuracy"] = route_accuracy([r.family for r in tests], [q.route for q in qs])
        result["variants"][variant] = entry
        if keep_predictions:
            for r, q, o, p, s in zip(tests, qs, mine, parsed, scores):
                predictions.append({"variant": variant, "id": r.id, "family": r.family, "route": q.route,
                                    "state": q.state, "output": o["text"], "em": s.graph_em, "error": p.error,
                                    "graph": p.graph.canonical().to_dict() if p.graph is not None else None,
                                    "mean_logprob": o["mean_logprob"]})
    if keep_predictions:
        result["predictions"] = predictions
    return result


# -- sets written elsewhere, evaluated after the last stage ----------------------------------------------
EXTRA_RESULTS = "extra.json"  # in a method-order directory: {set name: {path, digest, variants}}


def load_extra_sets(paths: Sequence[str], stream: Stream) -> dict[str, tuple[str, dict[str, list[Record]]]]:
    """Each ``[eval] extra_sets`` file read and checked before anything trains: set name (the file's stem) ->
    (content digest, records per family). A bad line, a skill the stream's catalog lacks or a family the stream
    does not have is an error naming the file and line."""
    from skillbank.data.records import read_records

    sets: dict[str, tuple[str, dict[str, list[Record]]]] = {}
    for raw in paths:
        path = Path(raw)
        if not path.is_file():
            raise ConfigError(f"[eval] extra_sets: {path} is not a file (paths are relative to {Path.cwd()})")
        if path.stem in sets:
            raise ConfigError(f"[eval] extra_sets: two files named {path.stem!r}; sets are reported by file name")
        records = read_records(path, stream.catalog).records
        if not records:
            raise ConfigError(f"[eval] extra_sets: {path} holds no records")
        by_family: dict[str, list[Record]] = {}
        for line, r in enumerate(records, 1):
            if r.family not in stream.catalog.family_keys:
                raise ConfigError(f"{path}: record {r.id!r} (record {line}) is of family {r.family!r}, which the "
                                  f"stream does not have ({', '.join(stream.catalog.family_keys)})")
            by_family.setdefault(r.family, []).append(r)
        sets[path.stem] = (hashlib.sha256(path.read_bytes()).hexdigest()[:16], by_family)
    return sets


def _extra_summary(ev: dict, predictions: list[dict], records: dict[str, list[Record]], stream: Stream) -> dict:
    """Per variant: EM over every request (these sets are not balanced over families), its macro over families,
    route accuracy, the per-family metrics and how many requests fail in each way (``metrics.failure_kind``)."""
    from skillbank.graph import TaskGraph
    from skillbank.metrics import failure_kind

    gold = {r.id: r.graph for rs in records.values() for r in rs}
    families = stream.catalog.family_map
    out = {}
    for variant, e in ev["variants"].items():
        tasks = e["tasks"]  # the families learned by then: a set's requests of others are not counted
        n = sum(m["n"] for m in tasks.values())
        kinds: dict[str, int] = {}
        for p in predictions:
            if p["variant"] == variant:
                pred = TaskGraph.from_dict(p["graph"]) if p["graph"] is not None else None
                kind = failure_kind(gold[p["id"]], pred, families=families)
                kinds[kind] = kinds.get(kind, 0) + 1
        out[variant] = {"n": n, "em": sum(m["graph_em"] * m["n"] for m in tasks.values()) / n,
                        "macro_em": task_macro(m["graph_em"] for m in tasks.values()),
                        "route_accuracy": e.get("route_accuracy"), "tasks": tasks, "failures": kinds}
    return out


def evaluate_extra_sets(method, t: int, order: Sequence[str], stream: Stream, cache: OutputCache, odir: Path,
                        sets: dict[str, tuple[str, dict[str, list[Record]]]], say: Say | None = None,
                        progress: bool = False) -> None:
    """Evaluate the state after stage ``t`` (the last) on every set not yet in ``odir/extra.json`` under its
    current digest; predictions go to ``extra-<set>.predictions.jsonl``."""
    done = _extra_done(odir)
    for name, (digest, records) in sets.items():
        if done.get(name, {}).get("digest") == digest:
            continue
        if say:
            say(f"  evaluating {sum(map(len, records.values()))} requests of {name} after stage {t}")
        ev = evaluate_stage(method, t, order[:t], stream, cache, say, progress, keep_predictions=True, records=records)
        predictions = ev.pop("predictions")
        write_jsonl_atomic(odir / f"extra-{name}.predictions.jsonl", predictions)
        done[name] = {"digest": digest, "stage": t, "variants": _extra_summary(ev, predictions, records, stream)}
        write_json_atomic(odir / EXTRA_RESULTS, done)
        if say:
            say(f"  {name}: " + ", ".join(f"{v} EM {100 * r['em']:.1f}" for v, r in done[name]["variants"].items()))


def _extra_done(odir: Path) -> dict:
    path = odir / EXTRA_RESULTS
    return json.loads(path.read_text()) if path.is_file() else {}


def _extra_missing(odir: Path, sets: dict) -> bool:
    done = _extra_done(odir)
    return any(done.get(name, {}).get("digest") != digest for name, (digest, _) in sets.items())


# -- one method over one order ---------------------------------------------------------------------
@dataclass
class RunContext:
    cfg: RunConfig
    stream: Stream
    out: Path
    say: Say | None
    progress: bool
    stage_cache: Path | None = None  # trained stages other methods may load (skillbank.continual.stage_cache)
    engine: str = "torch"  # what generates the outputs ([eval] engine resolved: skillbank.continual.engines)
    encoding: str = "auto"  # the llama.cpp engine's merged models ([eval] llamacpp_encoding resolved)


def run_method_order(rc: RunContext, method_name: str, order_name: str, pretrained: dict | None = None) -> dict:
    """Train and evaluate one method over one order, resuming from its last finished stage."""
    from skillbank.memory.selectors.embedding import encoder_memo
    with encoder_memo():  # every stage routes the earlier stages' held-out requests again: embed each once
        return _run_method_order(rc, method_name, order_name, pretrained)


def _run_method_order(rc: RunContext, method_name: str, order_name: str, pretrained: dict | None = None) -> dict:
    from skillbank.continual.engines import outputs_engine
    from skillbank.continual.methods import MethodContext, method_class
    from skillbank.model.base import load_base

    cfg, stream, say = rc.cfg, rc.stream, rc.say
    cls = method_class(method_name)
    order = stream.order(order_name)
    mdir = rc.out / "methods" / method_name
    odir = mdir / order_name
    odir.mkdir(parents=True, exist_ok=True)
    finished = 0
    while (_stage_dir(odir, finished + 1) / "eval.json").is_file():
        finished += 1
    extra = load_extra_sets(cfg.eval.extra_sets, stream)
    if finished == len(order) and not _extra_missing(odir, extra):
        if say:
            say(f"{method_name} {order_name}: already finished")
        return collect_method_order(odir, order)
    if finished == len(order) and not (_stage_dir(odir, finished) / "state" / COMPLETE).is_file():
        raise ConfigError(f"{odir}: finished, but its last stage's state is gone, so the extra sets cannot be "
                          f"evaluated; run them in a new directory")

    main = _is_main()
    t0 = time.perf_counter()
    base = load_base(cfg.base_config(), progress=rc.progress)
    ctx = MethodContext(base=base, train=cfg.train_config_for(method_name), stream=stream, order_name=order_name,
                        order=order, workdir=mdir, progress=rc.progress and main, say=say,
                        extras={"address": cfg.address.model_dump(), "pretrained": pretrained or {},
                                "stage_cache": StageCache(rc.stage_cache) if rc.stage_cache else None},
                        # a process killed inside a stage's training continues it from here (train/checkpoint.py)
                        checkpoint_path=(lambda t: _stage_dir(odir, t) / FIT_CHECKPOINT)
                        if cfg.runner.checkpoint_minutes > 0 else None,
                        checkpoint_seconds=60 * cfg.runner.checkpoint_minutes)
    method = cls(ctx, cfg.method_params_for(method_name))
    shared = rc.stage_cache / "outputs.jsonl" if rc.stage_cache and cls.first_stage_group else None
    engine = outputs_engine(rc.engine, base.identity, rc.encoding)
    cache = OutputCache.for_run(mdir / "outputs.jsonl", cfg, stream, engine, shared=shared)
    if finished:
        if say:
            say(f"{method_name} {order_name}: " + ("evaluating the extra sets" if finished == len(order)
                                                    else f"resuming after stage {finished}"))
        method.load(_stage_dir(odir, finished) / "state", finished)
    try:
        for t in range(finished + 1, len(order) + 1):
            family = order[t - 1]
            sdir = _stage_dir(odir, t)
            sdir.mkdir(exist_ok=True)
            state_dir = sdir / "state"
            if (state_dir / COMPLETE).is_file() and (sdir / "train.json").is_file():
                method.load(state_dir, t)  # trained before a kill during evaluation
                summary = json.loads((sdir / "train.json").read_text())
            else:
                if say:
                    what = (f"learning {stream.task_label(family)} {family} ({len(stream.train[family])} requests)"
                            if cls.trains else f"{stream.task_label(family)} arrives (frozen base: nothing to learn)")
                    say(f"{method_name} {order_name} stage {t}/{len(order)}: {what}")
                summary = method.learn(t, family, stream.train[family])
                if main:
                    tmp = sdir / ".state-tmp"
                    shutil.rmtree(tmp, ignore_errors=True)
                    tmp.mkdir()
                    method.save(tmp)
                    (tmp / COMPLETE).write_text("")
                    shutil.rmtree(state_dir, ignore_errors=True)
                    os.replace(tmp, state_dir)
                    # the dtype actually loaded ([base] dtype = "auto" resolves per machine) and the machine, whose
                    # speed `skillbank exp progress` estimates from
                    write_json_atomic(sdir / "train.json", _lite({**summary, "base_dtype": method.base.identity["dtype"],
                                                                  "machine": _machine(method)}))
            if main:  # the stage's state is saved: its training's final checkpoint has done its job
                (sdir / FIT_CHECKPOINT).unlink(missing_ok=True)
            if main:
                t_eval = time.perf_counter()
                seen = order[:t]
                ev = evaluate_stage(method, t, seen, stream, cache, say, rc.progress, keep_predictions=t == len(order),
                                    split=cfg.eval.split)
                ev["eval_seconds"] = round(time.perf_counter() - t_eval, 2)
                ev["finished_at"] = round(time.time(), 1)  # with the two durations: when this stage ran
                ev["machine"] = _machine(method)
                ev["order"] = order
                preds = ev.pop("predictions", None)
                if preds is not None:
                    write_jsonl_atomic(odir / "predictions.jsonl", preds)
                write_json_atomic(sdir / "eval.json", ev)
                if say:
                    say(f"  {method_name} {order_name} after stage {t}: " + ", ".join(
                        f"{v} macro EM {100 * task_macro(m['graph_em'] for m in e['tasks'].values()):.1f}"
                        for v, e in ev["variants"].items()))
                if not cfg.runner.keep_states and t > 1:
                    shutil.rmtree(_stage_dir(odir, t - 1) / "state", ignore_errors=True)
            _barrier()
        if extra and _is_main():
            evaluate_extra_sets(method, len(order), order, stream, cache, odir, extra, say, rc.progress)
    finally:
        engine.close()
        method.close()
        del method, base
        gc.collect()
        try:
            import torch
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except Exception:  # pragma: no cover - cleanup only
            pass
    result = collect_method_order(odir, order)
    result["timing"]["wall_seconds_this_run"] = round(time.perf_counter() - t0, 1)
    result["timing"]["generated_this_run"] = cache.generated
    result["timing"]["generate_seconds_this_run"] = round(cache.generate_seconds, 1)
    return result


def _lite(summary: dict) -> dict:
    """A training summary without the bulky parts (loss curve kept: the report may plot it)."""
    return {k: v for k, v in summary.items() if k != "config"}


# -- the whole run ---------------------------------------------------------------------------------
def _check_config(out: Path, cfg: RunConfig) -> None:
    """A run directory belongs to one configuration: resuming with another would mix results."""
    path = out / "config.json"
    new = cfg.resolved()
    if path.is_file():
        old = json.loads(path.read_text())
        check_same_config(out, old, new)
        _keep_encoding(out, cfg, old, new)
        new["methods"] = list(dict.fromkeys(old.get("methods", []) + new["methods"]))
        new["method_params"] = {**old.get("method_params", {}), **new["method_params"]}
        new["method_train"] = {**old.get("method_train", {}), **new["method_train"]}
        new["eval"]["orders"] = list(dict.fromkeys(old["eval"]["orders"] + new["eval"]["orders"]))
        new["eval"]["extra_sets"] = list(dict.fromkeys(old["eval"].get("extra_sets", []) + new["eval"]["extra_sets"]))
    write_json_atomic(path, new)


def _keep_encoding(out: Path, cfg: RunConfig, old: dict, new: dict) -> None:
    """A resumed run generates with the llama.cpp encoding it started with (``new`` is set to it): "auto" is
    resolved once, when the run starts, so a run moved to a machine whose rule picks another keeps its own; an
    explicit other encoding is :class:`ConfigError` (the two round differently)."""
    saved = saved_encoding(old)
    if new["eval"]["engine"] != "llama.cpp" or saved == "auto":
        return
    if cfg.eval.llamacpp_encoding not in ("auto", saved):
        raise ConfigError(f"{out} holds a run generated with llama.cpp models in {saved}, not "
                          f"{cfg.eval.llamacpp_encoding} ([eval] llamacpp_encoding); use another directory or "
                          "--restart to discard it")
    new["eval"]["llamacpp_encoding"] = saved


def check_same_config(out: Path, old: dict, new: dict) -> None:
    """Raise :class:`ConfigError` when a run directory's saved configuration ``old`` differs from ``new``
    (resolved) in anything that changes what a method learns or how it is evaluated. Reads, writes nothing."""
    old = json.loads(json.dumps(old))
    old.setdefault("eval", {}).setdefault("constrain", False)  # written before constrained decoding existed
    for section, defaults in _ADDED_DEFAULTS.items():  # settings added since: absent = their default
        for key, value in defaults.items():
            old.setdefault(section, {}).setdefault(key, value)
    # Adding methods or orders to a run is fine (another process may run them); anything that changes
    # what a method learns or how it is evaluated is not.
    skip = {"methods", "runner", "method_params", "method_train", "name"}
    diff = sorted(k for k in set(old) | set(new) if k not in skip and _identity(k, old.get(k)) != _identity(k, new.get(k)))
    shared = set(old.get("method_params", {})) & set(new.get("method_params", {}))
    diff += [f"method_params.{m}" for m in sorted(shared)
             if _params_with_defaults(m, old["method_params"][m]) != new["method_params"][m]]
    # A method's [train] overrides (absent in runs saved before they existed: none) are part of what it learns.
    both = set(old.get("methods", [])) & set(new.get("methods", []))
    diff += [f"method_train.{m}" for m in sorted(both)
             if old.get("method_train", {}).get(m, {}) != new.get("method_train", {}).get(m, {})]
    if diff:
        raise ConfigError(f"{out} holds a run with another configuration (differs in: {', '.join(diff)}); "
                          f"use another directory or --restart to discard it")


def _params_with_defaults(method: str, params: dict) -> dict:
    """A method's saved hyperparameters with those added since filled in at their defaults (a run saved before
    FSM's ``init`` existed started every executor fresh: a method's ``legacy_params``, before the defaults)."""
    from skillbank.method_registry import UnknownMethodError, method_class
    try:
        cls = method_class(method)
        return {**cls.Params().model_dump(), **getattr(cls, "legacy_params", {}), **params}
    except (UnknownMethodError, ValueError):
        return params


def _machine(method) -> str:
    """The machine label a stage file records (skillbank exp progress estimates each machine from its own stages)."""
    return machine_label(str(next(method.base.model.parameters()).device))


# Settings added after runs were saved without them, and what a saved run without them did: the
# validation split did not exist (no split, the held-out test set evaluated).
_ADDED_DEFAULTS = {"stream": {"validation_per_family": None, "validation_fraction": None},
                   "eval": {"split": "test", "engine": "torch"}}


# Settings outside a run's identity: orders are additive (another process may run another order), and the
# thread count, the cache folder and the evaluation batch size change how fast a run goes, not what it learns
# or answers, so a run started on a shared machine with one thread may be resumed alone with more. (Greedy
# decoding with masked padding gives a row the same tokens in any batch: tests/test_multi_lora.py and
# test_serve.py compare them, and bench/eval_batch.py counts differing outputs on a trained adapter; like the
# thread count, only float rounding of the matrix products could ever tell them apart.)
# Extra evaluation sets add figures after the last stage and change none of the stream's.
# The llama.cpp encoding is kept by the run instead (_keep_encoding): resolved once, when it starts.
_NOT_IDENTITY = {"eval": {"orders", "batch_size", "extra_sets", "llamacpp_encoding"}, "base": {"threads", "cache_dir"}}


def _identity(section: str, value):
    if section in _NOT_IDENTITY and isinstance(value, dict):
        return {k: v for k, v in value.items() if k not in _NOT_IDENTITY[section]}
    return value


@contextmanager
def file_lock(path: Path, *, wait: bool = True) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing; the kernel releases it if the process
    dies). Yields True once held; with ``wait=False`` yields False at once when another process holds it."""
    import fcntl
    with open(path, "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextmanager
def run_dir_lock(out: Path):
    """Serialises read-modify-write of a run directory's shared files (config.json, results.json): several
    ``skillbank exp run --method M --order O`` processes may fill one run directory at the same time."""
    with file_lock(out / ".lock"):
        yield


def run(cfg: RunConfig, out_dir: str | Path, *, say: Say | None = None, progress: bool = True,
        restart: bool = False, report: bool = True, stage_cache: str | Path | None = "default",
        estimate: bool = False) -> dict:
    """Run every configured method over every configured order; write results and the report.

    estimate: before the first stage of a run that has trained nothing yet, time a few training steps here and
    say how long the run will take on this machine (:mod:`skillbank.continual.estimate`).

    stage_cache: where trainings that several methods share are kept (``<out>/shared-stages`` by
    default; a sweep passes one for all its points; None trains every stage).

    Several processes may run different methods (or orders of a method other than FSM, whose orders
    share one bank) into the same directory at once; results.json and the report then hold them all."""
    out = Path(out_dir)
    main = _is_main()
    if restart and out.exists() and main:
        shutil.rmtree(out)
    _barrier()
    out.mkdir(parents=True, exist_ok=True)
    if main:
        with run_dir_lock(out):
            _check_config(out, cfg)
    t_start = time.perf_counter()
    stream = build_run_stream(cfg)
    if main and not (out / "run.json").is_file():
        write_json_atomic(out / "run.json", {"name": cfg.name, "stream": {"name": stream.name, "source": stream.source,
                                                                    "summary": stream.summary()},
                                       "task_labels": {k: stream.task_label(k) for k in stream.family_keys}})
    if say:
        if stream.validation:
            say(f"stream {stream.name}: " + ", ".join(f"{v['task']} {v['train']}/{v['validation']}/{v['test']}"
                                                       for v in stream.summary().values())
                + f" (train/validation/test per family; evaluated on {cfg.eval.split})")
        else:
            say(f"stream {stream.name}: " + ", ".join(f"{v['task']} {v['train']}/{v['test']}"
                                                       for v in stream.summary().values()) + " (train/test per family)")
    if stage_cache == "default":
        stage_cache = out / "shared-stages"
    # the engine and encoding the run was configured with (config.json), so a run resumed elsewhere never switches
    if main:
        saved = json.loads((out / "config.json").read_text())
        engine, encoding = saved["eval"]["engine"], saved_encoding(saved)
    else:
        engine = cfg.eval_engine()
        encoding = cfg.eval_encoding(engine)
    if estimate and say and main and not (out / "methods").exists():
        from skillbank.continual.estimate import estimate_run
        say(estimate_run(cfg, stream, engine, encoding).text())
    rc = RunContext(cfg, stream, out, say if main else None, progress, Path(stage_cache) if stage_cache else None,
                    engine, encoding)
    methods: dict[str, dict] = {}
    for name in cfg.methods:
        pretrained = None
        if name == "fsm" and cfg.runner.parallel_stages > 1:
            from skillbank.continual.parallel import pretrain_fsm_stages
            pretrained = pretrain_fsm_stages(cfg, stream, out / "methods" / name, say=rc.say)
        methods[name] = {o: run_method_order(rc, name, o, pretrained) for o in cfg.eval.orders}
    record = {
        "name": cfg.name, "config": json.loads((out / "config.json").read_text()) if main else cfg.resolved(),
        "stream": {"name": stream.name, "source": stream.source, "summary": stream.summary()},
        "task_labels": {k: stream.task_label(k) for k in stream.family_keys},
        "methods": methods,
        "timing": {"wall_seconds": round(time.perf_counter() - t_start, 1)},
    }
    if main:
        from skillbank.report.run_report import write_report
        with run_dir_lock(out):
            # results.json holds every method and order run in this directory (by this or another process).
            prior = json.loads((out / "results.json").read_text()) if (out / "results.json").is_file() else {}
            merged = dict(prior.get("methods", {}))
            for name, per_order in methods.items():
                merged[name] = {**merged.get(name, {}), **per_order}
            record["methods"] = merged
            record["config"] = json.loads((out / "config.json").read_text())
            write_json_atomic(out / "results.json", record)
            if report:
                write_report([out], out)
    _barrier()
    return record
