"""The one planning path: a raw request becomes a :class:`Plan` here, and nowhere else.

A request goes through four steps:

1. **check** - it is non-blank text (:meth:`Planner.check`);
2. **decide** - the Address Memory routes it to one shard (or the caller forces one) and the scope statistics
   say whether any learned family covers it (:meth:`Planner.decide`). Neither needs the base model, so an
   out-of-scope request is answered without loading it;
3. **generate** - the chosen executor writes the task graph. In-process that is the bank's engine: llama.cpp on
   the embedded GGUF (:class:`~skillbank.memory.execution_llamacpp.LlamaCppExecution`) where it can serve the bank,
   else :meth:`ExecutionMemory.generate <skillbank.memory.execution.ExecutionMemory.generate>`; the service instead
   queues the request for its continuous batch (``skillbank.serve.engine``), which decodes with the same
   :class:`~skillbank.model.decode.RowBatch`;
4. **settle** - the output is parsed and the :class:`Plan` built (:meth:`Planner.settle`).

``SkillBank.plan``, ``skillbank plan`` and the service's ``/v1/plan`` and ``/v1/chat/completions`` all go
through these steps; the service only adds what a service needs around step 3 (queueing, batching across
clients, timeouts, metrics). A plan serialises the same way everywhere: :meth:`Plan.to_dict` is the JSON line
of ``skillbank plan`` and the element of ``/v1/plan``'s ``plans``.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, Sequence

import numpy as np

from skillbank.errors import BankError, RecordError
from skillbank.memory.context import scene_sentences
from skillbank.memory.refusal import is_refusal

if TYPE_CHECKING:
    from skillbank.memory.scope import ScopeVerdict


class Bank(Protocol):
    """What the planner reads of a bank (:class:`skillbank.memory.bank.SkillBank` is one): the planner sits
    below the bank, which hands itself over in ``SkillBank.plan``."""

    manifest: Any  # its shard entries (the generation cap reads their training summaries)
    address: Any  # the Address Memory (classes_)
    scope: Any  # the scope statistics, or None
    execution: Any  # the Execution Memory, loaded on first use
    engine: Any  # what generates plans: the Execution Memory or the llama.cpp engine (same generate/length_problems)

    @property
    def shard_names(self) -> list[str]: ...

    def route(self, requests: Sequence[str]) -> tuple[list[str], np.ndarray]: ...

    def check_scope(self, requests: Sequence[str]) -> list["ScopeVerdict"]: ...

    def skill_priors(self, requests: Sequence[str], shards: Sequence[str], weight: float | None = None) -> list: ...

    def skill_address(self, family: str) -> Any: ...

    def refusal_of(self, family: str) -> str | None: ...


class RequestError(RecordError):
    """A request that cannot be planned (blank, not text). ``index`` is its position in the call."""

    def __init__(self, message: str, index: int):
        super().__init__(message)
        self.index = index


@dataclass
class Plan:
    """One request's answer: generated, refused as out of scope, or failed by its shard.

    ``shard`` is None when the request is out of scope (nothing was generated); ``graph`` is the canonical
    task graph (``task_nodes``, ``task_links``) or None when the output was not a valid graph (``error`` says
    why) or nothing was generated."""

    request: str
    shard: str | None
    routed: bool = True  # False when the caller forced the shard
    probabilities: dict[str, float] = field(default_factory=dict)  # Address Memory p(shard | request)
    out_of_scope: bool = False
    reason: str | None = None  # why no learned family covers the request
    #: route: p(shard | request); scope_margin: scope score minus threshold (< 0: out of scope; None when not
    #: checked); executor_logprob: the executor's mean token log-probability of ``raw`` (None: not generated)
    confidence: dict = field(default_factory=dict)
    valid: bool = False
    failed: bool = False  # the shard could not serve the request (damaged files, adapter failing); error names it
    constrained: bool = False  # decoded under a grammar
    graph: dict | None = None
    error: str | None = None
    raw: str = ""  # the executor's text as generated
    tokens: int = 0  # tokens generated
    truncated: bool = False  # generation hit the token cap (or a grammar dead end)
    batch_size: int = 0  # rows generated together with this one
    timings: dict = field(default_factory=dict)  # queue_ms, route_ms, generate_ms, total_ms
    mean_logprob: float | None = None
    #: with ``explain=True``: the scope margin, the top families with their probabilities, the words that
    #: counted for the chosen family (their scores) and the spans read as values, not as evidence
    explain: dict | None = None

    def to_dict(self) -> dict:
        """The plan as JSON-ready data: the JSON line of ``skillbank plan``, an element of ``/v1/plan``'s
        ``plans`` (``explain`` is null unless asked for)."""
        return asdict(self)

    # Names the Python API used before the planning path was one (kept: scripts and notebooks read them).
    @property
    def n_tokens(self) -> int:
        return self.tokens

    @property
    def route_seconds(self) -> float:
        return self.timings.get("route_ms", 0.0) / 1000

    @property
    def generate_seconds(self) -> float:
        return self.timings.get("generate_ms", 0.0) / 1000


@dataclass
class Decision:
    """Where a request goes (step 2): its shard - routed, or forced - and the scope verdict."""

    request: str
    shard: str  # for a refused request: the shard routing would have picked
    probabilities: dict[str, float]
    verdict: "ScopeVerdict | None"  # None when the scope was not checked (shard forced, or scope off)
    routed: bool
    route_s: float
    proba: np.ndarray | None = None  # the router's row (for explain); None when forced

    @property
    def out_of_scope(self) -> bool:
        return self.verdict is not None and self.verdict.in_scope is False

    @property
    def scope_margin(self) -> float | None:
        """Scope score minus threshold (< 0: out of scope); None when not checked or nothing to score."""
        v = self.verdict
        return round(v.score - v.threshold, 3) if v is not None and v.score is not None else None


class Planner:
    """The planning steps over one bank (see the module docstring)."""

    def __init__(self, bank: Bank):
        self.bank = bank

    # -- step 1 ----------------------------------------------------------------------------------
    @staticmethod
    def check(requests: Sequence[str] | str) -> list[str]:
        """The requests as a list of stripped strings; a blank or non-text one raises :class:`RequestError`."""
        if isinstance(requests, str):
            requests = [requests]
        out = []
        for i, r in enumerate(requests):
            if not isinstance(r, str):
                raise RequestError(f"request {i} is not text but {type(r).__name__}", i)
            if not r.strip():
                raise RequestError(f"request {i} is empty", i)
            try:
                r.encode("utf-8")
            except UnicodeEncodeError as exc:  # a lone surrogate ("\ud800") is valid JSON but not text
                raise RequestError(f"request {i} is not valid Unicode text ({exc.reason} at character {exc.start})",
                                   i) from None
            out.append(r.strip())
        return out

    # -- step 2 ----------------------------------------------------------------------------------
    def decide(self, requests: Sequence[str], *, shard: str | None = None, scope: bool = True) -> list[Decision]:
        """Route each request (or force ``shard``) and, with ``scope``, check whether a learned family covers
        it; needs no model."""
        bank = self.bank
        t0 = time.perf_counter()
        if shard is not None:
            if shard not in bank.shard_names:
                raise BankError(f"unknown shard {shard!r}; this bank has {bank.shard_names}")
            n = len(requests)
            route_s = (time.perf_counter() - t0) / max(1, n)
            return [Decision(r, shard, {shard: 1.0}, None, False, route_s) for r in requests]
        names, proba = bank.route(requests)
        verdicts = bank.check_scope(requests) if scope else [None] * len(requests)
        route_s = (time.perf_counter() - t0) / max(1, len(requests))
        classes = list(bank.address.classes_)
        return [Decision(r, name, {c: float(p) for c, p in zip(classes, row)}, v, True, route_s, row)
                for r, name, row, v in zip(requests, names, proba, verdicts)]

    def default_max_new_tokens(self) -> int:
        """The generation cap when the caller gives none: twice the longest target any shard was trained on
        (an output longer than that is a runaway, not a plan), at most the paper's 768."""
        from skillbank.model.generate import DEFAULT_MAX_NEW_TOKENS
        lengths = [s.training.get("max_target_tokens") for s in self.bank.manifest.shards]
        lengths = [n for n in lengths if isinstance(n, int) and n > 0]
        return min(DEFAULT_MAX_NEW_TOKENS, 2 * max(lengths)) if lengths else DEFAULT_MAX_NEW_TOKENS

    # -- step 4 ----------------------------------------------------------------------------------
    def settle(self, decision: Decision, output: Any = None, *, failure: str | None = None,
               constrained: bool = False, batch_size: int = 0, queue_s: float = 0.0, generate_s: float = 0.0,
               arrived: float | None = None, explain: bool = False) -> Plan:
        """The :class:`Plan` of a decided request. ``output`` is what generating it produced (anything with
        ``text``, ``parsed``, ``n_tokens``, ``stopped``, ``mean_logprob``); None when it was refused as out of
        scope, or when its shard failed (``failure`` then says why and names the shard)."""
        d = decision
        total_s = (time.perf_counter() - arrived) if arrived is not None else d.route_s + queue_s + generate_s
        timings = {"queue_ms": 1000 * queue_s, "route_ms": 1000 * d.route_s, "generate_ms": 1000 * generate_s,
                   "total_ms": 1000 * total_s}
        v = d.verdict
        confidence = {"route": round(d.probabilities[d.shard], 4), "scope_margin": d.scope_margin,
                      "executor_logprob": None}
        why = self.explain(d) if explain else None
        if d.out_of_scope and output is None and failure is None:
            reason = v.reason
            if v.score is not None and v.family is not None and d.routed and v.family != d.shard:
                # The gate and the router weigh different evidence; the probabilities shown are the router's,
                # so the reason says where the router would have sent the request too.
                reason += (f"; the router would have sent it to {d.shard} "
                           f"(probability {d.probabilities[d.shard]:.2f})")
            return Plan(d.request, None, d.routed, d.probabilities, out_of_scope=True, reason=reason,
                        confidence=confidence, timings=timings, explain=why)
        if failure is not None or output is None:
            return Plan(d.request, d.shard, d.routed, d.probabilities, confidence=confidence, failed=True,
                        error=failure or f"shard {d.shard!r} produced no output", timings=timings, explain=why)
        graph = output.parsed.graph
        logprob = output.mean_logprob
        if logprob is not None:
            logprob = round(float(logprob), 4)
            confidence["executor_logprob"] = logprob
        if is_refusal(graph, self.bank.refusal_of(d.shard)):
            # the second opinion: the gate let it through, the family's executor wrote its refusal skill
            return Plan(d.request, None, d.routed, d.probabilities, out_of_scope=True,
                        reason=f"the {d.shard} executor has no skill for this (it wrote its refusal)",
                        confidence=confidence, raw=output.text, tokens=output.n_tokens, batch_size=batch_size,
                        timings=timings, mean_logprob=logprob, explain=why)
        # Generated although out of scope (the caller turned refusal off): planned, and still flagged.
        return Plan(d.request, d.shard, d.routed, d.probabilities, d.out_of_scope,
                    v.reason if d.out_of_scope else None, confidence=confidence, valid=graph is not None,
                    constrained=constrained, graph=graph.canonical().to_dict() if graph is not None else None,
                    error=None if graph is not None else output.parsed.error, raw=output.text,
                    tokens=output.n_tokens, truncated=not output.stopped, batch_size=batch_size, timings=timings,
                    mean_logprob=logprob, explain=why)

    def explain(self, decision: Decision) -> dict:
        """Why a request got its verdict: the scope margin, the top three families by the router's
        probability, the words that counted for the family the scope statistics chose (with what each adds
        to its score), the spans read as argument values (no evidence either way) and the sentences the router
        left out as scene-setting (``context``; routers that read the whole request leave nothing out) and the
        three skills of the chosen shard its skill statistics find likeliest (``top_skills``; the prior the
        executor's choice of skill names was weighed by; empty for a shard written without them). A gate with
        an outlier corpus adds ``outside``: how like the learned families (+1: their mean) rather than like
        requests no skill serves (-1: the corpus's mean) the request's embedding is, and with one discriminant
        per corpus category ``outside_like``: where ``outside`` is below 0, the category it looks likest to (its
        ``outside`` is that one's), else None. A family with negatives adds ``closest_negative``: its negative
        likest to the request (kind, source, request) and its own score minus its negatives' (refused below
        -0.25: :data:`~skillbank.memory.scope.NEGATIVE_MARGIN`)."""
        bank, v = self.bank, decision.verdict
        out = {"scope_margin": decision.scope_margin, "scope_family": v.family if v is not None else None, "top_families": [], "counted_words": [],
               "values": [], "context": [], "top_skills": []}
        skills = bank.skill_address(decision.shard) if decision.shard is not None else None
        if skills is not None:
            proba = np.asarray(skills.predict_proba([decision.request]))[0]
            out["top_skills"] = [{"skill": str(skills.classes_[j]), "p": round(float(proba[j]), 4)}
                                 for j in np.argsort(-proba)[:3]]
        if getattr(bank.address, "drop_context", False):
            out["context"] = scene_sentences(decision.request)
        if decision.proba is not None:
            order = np.argsort(-decision.proba)[:3]
            out["top_families"] = [{"family": bank.address.classes_[j], "p": round(float(decision.proba[j]), 4)}
                                   for j in order]
        if bank.scope is not None and v is not None and v.family is not None:
            masked = bank.scope.read([decision.request])[0]
            out["values"] = [{"kind": k, "text": t} for k, t in masked.values]
            out["counted_words"] = [{"word": w, "score": round(x, 3)}
                                    for w, x in bank.scope.word_evidence(masked, v.family)]
            if bank.scope.outliers is not None:
                score, like = bank.scope.closest_outside([masked])
                out["outside"] = round(float(score[0]), 3)
                if bank.scope.outlier_categories:
                    # a pointer, not a classification: on the development off-domain sets it names the set's own
                    # category for 66% of requests (other services' tools 98%, injections 83%, questions 34%;
                    # scripts/scope_outside_like.py)
                    out["outside_like"] = like[0] if score[0] < 0 else None
            if v.family in bank.scope.negatives_:
                # the family's negative closest to the request, and by how much the family's own statistics beat
                # its negatives' (below -NEGATIVE_MARGIN the request was refused for looking like them)
                c = bank.scope.classes_.index(v.family)
                neg, own, closest = bank.scope.negative_scores([masked], [c])
                out["closest_negative"] = {"kind": closest[0].kind, "source": closest[0].source,
                                           "request": closest[0].request,
                                           "own_minus_negatives": round(float(own[0] - neg[0]), 3)}
        return out

    # -- all four, in this process ------------------------------------------------------------------
    def plan(self, requests: Sequence[str] | str, *, shard: str | None = None, batch_size: int = 8,
             max_new_tokens: int | None = None, constrain: bool = True, copy_values: bool | None = None,
             scope: bool = True, explain: bool = False, skill_prior: float | None = None) -> list[Plan]:
        """Check, decide, generate with the bank's Execution Memory, settle (see ``SkillBank.plan``). With
        ``scope=False`` every request is generated, and one no family covers is still flagged ``out_of_scope``.
        skill_prior: the weight of each shard's skill statistics in its choice of skill names (None: the
        default; 0: off)."""
        from skillbank.memory.selectors.embedding import encoder_memo

        # The router and the skill statistics embed the same request text: once per call (nothing is kept
        # after it; a deployed router holds no request).
        with encoder_memo():
            return self._plan(requests, shard=shard, batch_size=batch_size, max_new_tokens=max_new_tokens,
                              constrain=constrain, copy_values=copy_values, scope=scope, explain=explain,
                              skill_prior=skill_prior)

    def _plan(self, requests, *, shard, batch_size, max_new_tokens, constrain, copy_values, scope, explain,
              skill_prior) -> list[Plan]:
        requests = self.check(requests)
        decisions = self.decide(requests, shard=shard)
        run = [i for i, d in enumerate(decisions) if not (scope and d.out_of_scope)]
        outputs: dict[int, Any] = {}
        too_long: dict[int, str] = {}
        gen_s = 0.0
        if run:
            max_new_tokens = max_new_tokens or self.default_max_new_tokens()
            engine = self.bank.engine  # the model loads here, on the first request that needs it
            # A request that cannot fit the context fails alone, with the reason; the others are planned.
            problems = engine.length_problems([requests[i] for i in run], max_new_tokens)
            too_long = {i: p for i, p in zip(run, problems) if p is not None}
            run = [i for i in run if i not in too_long]
        if run:
            t1 = time.perf_counter()
            shards = [decisions[i].shard for i in run]
            priors = (self.bank.skill_priors([requests[i] for i in run], shards, skill_prior)
                      if constrain else None)
            outputs = dict(zip(run, engine.generate(
                [requests[i] for i in run], shards, batch_size=batch_size,
                max_new_tokens=max_new_tokens, constrain=constrain, copy_values=copy_values, priors=priors)))
            gen_s = (time.perf_counter() - t1) / len(run)
        size = min(batch_size, len(run)) if run else 0
        return [self.settle(d, outputs.get(i), failure=too_long.get(i), constrained=constrain,
                            batch_size=size if i in outputs else 0, generate_s=gen_s if i in outputs else 0.0,
                            explain=explain)
                for i, d in enumerate(decisions)]


__all__ = ["Plan", "Decision", "Planner", "RequestError"]
