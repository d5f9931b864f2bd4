"""Every selector over one frozen FSM bank: route accuracy and EM after every prefix of each task order.

The bank's executors are fixed (one frozen shard per family, trained once); only the selector changes.
For each order and each selector, stage ``t`` feeds the selector stage ``t``'s training requests
(``partial_fit``; the offline reference keeps earlier ones itself), then the held-out requests of every
family learned so far are routed among the shards learned so far. EM comes from the routed shard's
output. Executors are frozen, so each (shard, request) output is generated once and shared by every
selector, prefix and order (:class:`PersistentOutputCache`, which also writes it to ``outputs.jsonl``
so an interrupted run resumes where it stopped and a run elsewhere - a GPU - can fill it).

Self-route makes every learned shard generate for every request, which also gives its
coverage/selection split: *coverage* = share of requests for which some learned executor's output is
exactly correct; *selection* = share for which the executor it picked is (its EM).

Sets of records from elsewhere (``extra``: requests written by hand, in styles no template produced) are
routed by each selector once every family is learned (after each order's last stage) and scored the same
way: route accuracy and EM of the routed shard's output, next to the Oracle's EM on the same set. The
scope check is not applied here: every request is routed and answered.
"""
from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable, Sequence

from skillbank.memory.execution import ShardOutputCache as OutputCache
from skillbank.data.stream import Stream
from skillbank.errors import SelectorError
from skillbank.experiments.provenance import write_provenance
from skillbank.experiments.routing import route_prefixes
from skillbank.memory.address import make_selector
from skillbank.memory.execution import ShardOutput
from skillbank.memory.selectors.embedding import encoder_memo
from skillbank.metrics import AccuracyMatrix, route_accuracy, score_example, task_macro
from skillbank.model.serialization import decode_output
from skillbank.report.selectors import write_selectors_report

Say = Callable[[str], None]

#: every selector kind, in report order
ALL_SELECTORS = ("oracle", "hashing-nb", "tfidf-logreg", "embed-lda-nb", "epi", "adaptercl", "self-route",
                 "address-compete")
LABELS = {
    "oracle": "Oracle (gold family)",
    "hashing-nb": "FSM Address (hashing+NB)",
    "tfidf-logreg": "offline TF-IDF+LR (keeps requests)",
    "embed-lda-nb": "ours: MiniLM LDA + hashing NB",
    "epi": "EPI (base hidden states, Mahalanobis)",
    "adaptercl": "AdapterCL (request perplexity)",
    "self-route": "Self-route (max mean log-prob)",
    "address-compete": "FSM Address, top-3 compete when unsure",
}


class PersistentOutputCache(OutputCache):
    """:class:`~skillbank.memory.execution.ShardOutputCache` backed by a JSON Lines file.

    Existing lines are read back on start (re-parsed with each shard's decoder), new outputs are appended
    in chunks of ``chunk`` pairs as they are produced. A line records the generation cap it was made
    with and whether decoding was constrained; lines made otherwise are ignored, since they would not be the
    same output (lines written before constrained decoding existed were unconstrained).
    """

    def __init__(self, execution, batch_size: int, max_new_tokens: int, path: str | Path, chunk: int = 128,
                 constrain: bool = True):
        super().__init__(execution, batch_size, max_new_tokens, constrain)
        self.path = Path(path)
        self.chunk = chunk
        self.reused = 0
        if self.path.is_file():
            lines = self.path.read_text().splitlines()
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    d = json.loads(line)
                except json.JSONDecodeError as exc:
                    if number == len(lines):  # torn by a kill mid-write: that output is generated again
                        continue
                    raise SelectorError(f"{self.path}, line {number}: not a JSON object ({exc.msg}); "
                                        "delete the file to generate every output again") from None
                entry = execution.shards.get(d["shard"])
                if entry is None or d.get("max_new_tokens") != max_new_tokens \
                        or bool(d.get("constrained", False)) != constrain:
                    continue
                parsed = decode_output(d["text"], entry.target_format, entry.family_prefix, stopped=d["stopped"],
                                       reason=d.get("reason"))
                self.outputs[(d["shard"], d["request"])] = ShardOutput(
                    d["shard"], d["text"], parsed, d["n_tokens"], d["mean_logprob"], d["stopped"], constrain)
                self.reused += 1

    def get(self, pairs: list[tuple[str, str]], say: Say | None = None) -> list:
        missing = sorted(dict.fromkeys(p for p in pairs if p not in self.outputs), key=lambda p: p[0])
        if missing and say:
            say(f"generating {len(missing)} outputs over {len({s for s, _ in missing})} shard(s) "
                f"({len(self.outputs)} cached)")
        for s in range(0, len(missing), self.chunk):
            part = missing[s:s + self.chunk]
            super().get(part, None)
            with open(self.path, "a") as fh:
                for shard, request in part:
                    o = self.outputs[(shard, request)]
                    fh.write(json.dumps({"shard": shard, "request": request, "text": o.text, "n_tokens": o.n_tokens,
                                         "mean_logprob": o.mean_logprob, "stopped": o.stopped,
                                         "reason": None if o.stopped else o.parsed.error,
                                         "max_new_tokens": self.max_new_tokens, "constrained": self.constrain},
                                        ensure_ascii=False) + "\n")
            if say:
                say(f"  {min(s + self.chunk, len(missing))}/{len(missing)} generated")
        return [self.outputs[p] for p in pairs]


def _check_kinds(kinds: Sequence[str]) -> list[str]:
    kinds = list(dict.fromkeys(kinds))
    if not kinds:
        raise SelectorError(f"no selector given; choose from {list(ALL_SELECTORS)}")
    unknown = [k for k in kinds if k not in ALL_SELECTORS]
    if unknown:
        raise SelectorError(f"unknown selector kind(s) {unknown}; choose from {list(ALL_SELECTORS)}")
    return kinds


def _check_extra(extra: dict[str, list], stream: Stream) -> None:
    """Every record of an extra set belongs to a family of the stream and uses its catalog's skills."""
    families, skills = set(stream.family_keys), stream.catalog.family_map
    for name, recs in extra.items():
        for r in recs:
            if r.family not in families:
                raise SelectorError(f"{name}: record {r.id!r} is of family {r.family!r}, which stream "
                                    f"{stream.name} does not have (its families: {stream.family_keys})")
            foreign = [t for t in r.graph.tasks if skills.get(t) != r.family]
            if foreign:
                raise SelectorError(f"{name}: record {r.id!r} uses skill(s) {foreign} outside family "
                                    f"{r.family!r} of stream {stream.name}'s catalog")


def output_em(record, output: ShardOutput) -> float:
    """Graph exact match of one shard's output against the record's gold graph."""
    return score_example(record.graph, output.parsed.graph).graph_em


def _mean(values) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None


@encoder_memo()  # every prefix re-routes the same requests: each embedded once, nothing kept after the study
def evaluate_selectors(bank, stream: Stream, orders: Sequence[str], kinds: Sequence[str] = ALL_SELECTORS, *,
                       out_dir: str | Path, batch_size: int = 16, max_new_tokens: int = 256,
                       test_per_family: int | None = None, say: Say | None = None, constrain: bool = True,
                       compete: dict | None = None, extra: dict[str, Sequence] | None = None) -> dict:
    """Evaluate ``kinds`` over the opened ``bank`` (a :class:`~skillbank.memory.bank.SkillBank`) on every
    prefix of each order; write ``selectors.json``, ``outputs.jsonl`` and the report into ``out_dir``.

    constrain: generate with each shard's grammar. Self-route then compares the mean log-probability, under
    each shard's own (unconstrained) distribution, of the graph its grammar let it write; AdapterCL scores
    the request, not an output, so the constraint does not touch it.
    compete: parameters of ``address-compete`` (``k``, ``quantile``).
    extra: set name -> records of the stream's families (e.g. hand-written requests), each routed by every
    selector after the last stage of each order and scored like the held-out requests."""
    from skillbank.memory.selectors import AdapterRequestNLL, BaseHiddenStates

    kinds = _check_kinds(kinds)
    if not orders:
        raise SelectorError("no task order given (e.g. O1, O2)")
    missing = [k for k in stream.family_keys if k not in bank.shard_names]
    if missing:
        raise SelectorError(f"the bank {bank.root} has no shard for stream famil(ies) {missing}; "
                            f"its shards: {bank.shard_names}")
    if test_per_family is not None and test_per_family < 1:
        raise SelectorError(f"test_per_family must be >= 1, got {test_per_family}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tests = {k: stream.test[k][:test_per_family] if test_per_family else stream.test[k] for k in stream.family_keys}
    if not any(tests.values()):
        raise SelectorError(f"stream {stream.name} has no held-out requests")

    extra = {name: list(recs) for name, recs in (extra or {}).items()}
    _check_extra(extra, stream)

    cache = PersistentOutputCache(bank.execution, batch_size, max_new_tokens, out / "outputs.jsonl", constrain=constrain)
    if say and cache.reused:
        say(f"resuming: {cache.reused} outputs read from {cache.path}")
    gold = {r.request: r.family for recs in [*tests.values(), *extra.values()] for r in recs}
    context = {"oracle": {"gold": gold},
               "epi": {"featurizer": BaseHiddenStates(bank.execution.base, batch_size=batch_size, memo=True)},
               "adaptercl": {"scorer": AdapterRequestNLL(bank.execution, batch_size=batch_size, memo=True)},
               "self-route": {"cache": cache}, "address-compete": {**(compete or {}), "cache": cache}}
    if "self-route" in kinds:
        # Self-route needs every shard's output for every request; one call lets each shard batch them all.
        everything = [r for k in stream.family_keys for r in tests[k]] + [r for recs in extra.values() for r in recs]
        cache.get([(s, r.request) for r in everything for s in stream.family_keys], say)

    if "address-compete" in kinds:
        # Which requests compete depends on the Address Memory alone: collect every prefix's competing pairs
        # with a selector that only routes, then generate them per shard in full batches (inside the prefix
        # loop each prefix would generate its few pairs in small batches of its own).
        planned: set[tuple[str, str]] = set()
        for order_name in orders:
            order = stream.order(order_name)
            scout = make_selector("address-compete", **context["address-compete"])
            for prefix in route_prefixes(scout, stream, order, test=tests, route=lambda s, q: s.competing_pairs(q)):
                planned.update(prefix.routed or ())
            if any(extra.values()):
                planned.update(scout.competing_pairs([r.request for recs in extra.values() for r in recs]))
        cache.get(sorted(planned), say)

    t_start = time.perf_counter()
    routes: dict[str, dict[str, list[list[str]]]] = {}  # order -> kind -> per stage: routed shard per request
    extra_routes: dict[str, dict[str, dict[str, list[str]]]] = {}  # order -> kind -> set -> routed shard per request
    cost: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for order_name in orders:
        order = stream.order(order_name)
        routes[order_name], extra_routes[order_name] = {}, {}
        for kind in kinds:
            sel = make_selector(kind, **context.get(kind, {}))
            per_stage = []
            for prefix in route_prefixes(sel, stream, order, test=tests):
                per_stage.append(prefix.routed or [])
                cost[kind]["fit_seconds"] += prefix.fit_seconds
                cost[kind]["route_seconds"] += prefix.route_seconds
                cost[kind]["routed"] += len(prefix.records)
            routes[order_name][kind] = per_stage
            # after the last stage (every family learned); not counted in the routing cost above
            extra_routes[order_name][kind] = {name: sel.predict([r.request for r in recs]) if recs else []
                                              for name, recs in extra.items()}
            if kind == "address-compete":  # how many of the final prefix's requests paid for k generations
                cost[kind]["competed_final"] += sel.competed_
                cost[kind]["routed_final"] += len(per_stage[-1])
                cost[kind]["threshold"] = sel.threshold_
                cost[kind]["quantile"], cost[kind]["k"] = sel.quantile, sel.k
            if say:
                final = per_stage[-1]
                seen = [r for k in order for r in tests[k]]
                say(f"{order_name} {kind}: final route accuracy "
                    f"{100 * route_accuracy([r.family for r in seen], final):.2f}")

    # One cache call for every routed and gold pair, so each shard's missing pairs share batches.
    pairs = {(s, r.request) for o in orders for kind in kinds for t, family in enumerate(stream.order(o), 1)
             for s, r in zip(routes[o][kind][t - 1], [r for k in stream.order(o)[:t] for r in tests[k]])}
    pairs |= {(r.family, r.request) for recs in [*tests.values(), *extra.values()] for r in recs}
    pairs |= {(s, r.request) for o in orders for kind in kinds for name, recs in extra.items()
              for s, r in zip(extra_routes[o][kind][name], recs)}
    cache.get(sorted(pairs), say)
    em_memo: dict[tuple[str, str], float] = {}

    def em(shard: str, record) -> float:
        key = (shard, record.request)
        if key not in em_memo:
            em_memo[key] = output_em(record, cache.outputs[key])
        return em_memo[key]

    record = {"bank": str(bank.root), "base": bank.manifest.base, "stream": {"name": stream.name, "source": stream.source},
              "test_per_family": {k: len(v) for k, v in tests.items()},
              "task_labels": {k: stream.task_label(k) for k in stream.family_keys},
              "selectors": kinds, "labels": {k: LABELS[k] for k in kinds},
              "max_new_tokens": max_new_tokens, "constrained": constrain, "orders": {}}
    for o in orders:
        order = stream.order(o)
        res = {"order": order, "selectors": {}}
        for kind in kinds:
            m = AccuracyMatrix(order)
            route_rows, micro, em_micro = [], [], []
            for t in range(1, len(order) + 1):
                seen = [r for k in order[:t] for r in tests[k]]
                routed = routes[o][kind][t - 1]
                row = {}
                for k in order[:t]:
                    idx = [i for i, r in enumerate(seen) if r.family == k]
                    row[k] = route_accuracy([k] * len(idx), [routed[i] for i in idx]) if idx else None
                    m.set(t, k, task_macro(em(routed[i], seen[i]) for i in idx) if idx else None)
                route_rows.append(row)
                micro.append(route_accuracy([r.family for r in seen], routed))
                em_micro.append(task_macro(em(s, r) for s, r in zip(routed, seen)))
            res["selectors"][kind] = {"route": route_rows, "route_micro": micro, "em": m.to_dict(),
                                      "em_macro": [m.macro(t) for t in range(1, len(order) + 1)],
                                      "em_micro": em_micro, "bwt": m.bwt()}
        if "self-route" in kinds:
            split = []
            for t in range(1, len(order) + 1):
                seen = [r for k in order[:t] for r in tests[k]]
                covered = [max(em(s, r) for s in order[:t]) for r in seen]
                chosen = [em(s, r) for s, r in zip(routes[o]["self-route"][t - 1], seen)]
                split.append({"coverage": task_macro(covered), "selection": task_macro(chosen),
                              "n": len(seen)})
            res["self_route_split"] = split
        if extra:
            res["extra"] = {name: {kind: {"route": route_accuracy([r.family for r in recs], extra_routes[o][kind][name]),
                                          "em": _mean(em(sh, r) for sh, r in zip(extra_routes[o][kind][name], recs))}
                                   for kind in kinds}
                            for name, recs in extra.items()}
        record["orders"][o] = res
    if extra:
        record["extra_sets"] = {name: {"n": len(recs), "per_task": dict(sorted(
            (k, sum(r.family == k for r in recs)) for k in {r.family for r in recs}))} for name, recs in extra.items()}
    # Wall time inside this evaluation, where per-request work is memoised across prefixes and orders (and
    # Self-route's generations were made up front): not a routing cost. bench/route_selectors.py measures that.
    record["eval_seconds"] = {k: {"fit": round(v["fit_seconds"], 3), "route": round(v["route_seconds"], 3),
                                  "routed": int(v["routed"])} for k, v in cost.items()}
    if "address-compete" in cost:
        c = cost["address-compete"]
        competed, routed = int(c["competed_final"]), int(c["routed_final"])
        record["compete"] = {"competed_final": competed, "routed_final": routed, "threshold": round(c["threshold"], 3),
                             "k": int(c["k"]), "quantile": c["quantile"],
                             # what a request costs in executor generations at the final prefix (1 = routing only)
                             "generations_per_request": round((routed + (c["k"] - 1) * competed) / routed, 3)}
    record["timing"] = {"generate_seconds": round(cache.generate_seconds, 1), "outputs": len(cache.outputs),
                        "outputs_reused": cache.reused, "evaluate_seconds": round(time.perf_counter() - t_start, 1)}
    (out / "selectors.json").write_text(json.dumps(record, indent=1) + "\n")
    write_selectors_report(record, out)
    write_provenance(out)
    return record
