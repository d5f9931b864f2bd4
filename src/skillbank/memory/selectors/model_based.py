"""Selectors that need the bank's models: EPI, AdapterCL, Self-route, and the Oracle reference.

They speak the same interface as the Address Memory, but what they read is not only the request text:

* :class:`EPISelector` (Wang et al., 2023c) - task identity from the *frozen base's* hidden states:
  per-stage mean and one shared covariance, Mahalanobis distance. Statistics only (count, mean, pooled
  scatter); the base runs once per request with every adapter disabled.
* :class:`AdapterCLSelector` (Madotto et al., 2021) - the shard under whose adapter the request itself
  is least surprising (lowest perplexity of the request tokens inside the closed-book prompt). It learns
  nothing but the list of shards; its state is that list.
* :class:`SelfRouteSelector` - every executor generates; the output with the highest mean token
  log-probability wins. State: the list of shards.
* :class:`OracleSelector` - the request's gold family (the execution-only reference); it is handed the
  gold labels of the requests it will be asked about, and saves only its list of shards.

How they get the models: the constructor takes them as *context* keyword arguments that are not
hyperparameters and are never saved - ``base`` (a :class:`~skillbank.model.base.LoadedBase`) for EPI,
``execution`` (an :class:`~skillbank.memory.execution.ExecutionMemory`) for AdapterCL and Self-route,
``gold`` for the Oracle - and :func:`~skillbank.memory.address.load_selector` passes the same keywords
through (``load_selector(dir, execution=bank.execution)``). Expensive per-request work can be shared
between selector instances (two task orders, or prefixes) through the optional ``featurizer``,
``scorer`` and ``cache`` arguments, which memoise per request or per (shard, request) pair.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from skillbank.errors import ModelError, SelectorError
from skillbank.memory.selector import Selector, check_requests
from skillbank.memory.selectors.gaussian import GaussianClassStats


def _softmax(scores: np.ndarray) -> np.ndarray:
    s = scores - scores.max(axis=1, keepdims=True)
    p = np.exp(s)
    return p / p.sum(axis=1, keepdims=True)


def _top2_margin(jll: np.ndarray) -> np.ndarray:
    """Per row: best minus second-best log score; +inf where there is a single class."""
    if jll.shape[1] < 2:
        return np.full(len(jll), np.inf)
    top2 = np.sort(jll, axis=1)[:, -2:]
    return top2[:, 1] - top2[:, 0]


class _ShardListSelector(Selector):
    """Selectors whose only learned state is the list of shards seen (in arrival order)."""

    def reset(self) -> None:
        self.classes_ = []

    def _register(self, requests, labels) -> list[str]:
        reqs = check_requests(requests)
        if not reqs:
            raise SelectorError("partial_fit needs at least one request")
        labs = self._labels(reqs, labels)
        self.classes_ = self.classes_ + [c for c in dict.fromkeys(labs) if c not in self.classes_]
        return labs

    def _state(self):
        return {"classes": self.classes_}, {}

    def _set_state(self, state, arrays):
        self.classes_ = list(state.get("classes", []))


# -- EPI -----------------------------------------------------------------------------------------
class BaseHiddenStates:
    """Mean-pooled hidden states of the frozen base (every adapter disabled) for raw requests, (n, d) float64.

    layer: which hidden state (-1 = the last layer's output). memo: keep each request's vector in memory so
    a second order or prefix does not run the base again (an evaluation cache; never saved).
    """

    def __init__(self, base, layer: int = -1, batch_size: int = 16, memo: bool = False):
        if base is None:
            raise SelectorError("EPI needs the bank's frozen base model: pass base=<LoadedBase> "
                                "(e.g. make_selector('epi', base=bank.execution.base))")
        self.base, self.layer, self.batch_size = base, layer, batch_size
        self._memo: dict[str, np.ndarray] | None = {} if memo else None

    def __call__(self, requests: Sequence[str]) -> np.ndarray:
        todo = [r for r in dict.fromkeys(requests) if self._memo is None or r not in self._memo]
        fresh = dict(zip(todo, self._compute(todo))) if todo else {}
        if self._memo is not None:
            self._memo.update(fresh)
            fresh = self._memo
        return np.stack([fresh[r] for r in requests])

    def _compute(self, requests: list[str]) -> list[np.ndarray]:
        import contextlib

        import torch

        tok, base = self.base.tokenizer, self.base
        model = base.peft if base.peft is not None else base.model
        off = base.peft.disable_adapter() if base.peft is not None else contextlib.nullcontext()
        device = next(model.parameters()).device
        out: list[np.ndarray] = [None] * len(requests)  # type: ignore[list-item]
        order = sorted(range(len(requests)), key=lambda i: len(requests[i]))
        with torch.inference_mode(), off:
            for s in range(0, len(order), self.batch_size):
                idx = order[s:s + self.batch_size]
                ids = [tok(requests[i].strip(), add_special_tokens=False)["input_ids"] for i in idx]
                width = max(len(x) for x in ids)
                pad = tok.pad_token_id if tok.pad_token_id is not None else 0
                # Right padding: a causal model's states at real tokens never see the pads after them.
                input_ids = torch.tensor([x + [pad] * (width - len(x)) for x in ids], device=device)
                mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids], device=device)
                hidden = model(input_ids=input_ids, attention_mask=mask,
                               output_hidden_states=True).hidden_states[self.layer]  # (b, L, d)
                m = mask.unsqueeze(-1).to(hidden.dtype)
                pooled = ((hidden * m).sum(1) / m.sum(1)).float().cpu().numpy().astype(np.float64)
                for row, i in enumerate(idx):
                    out[i] = pooled[row]
        return out


class EPISelector(Selector):
    """Non-parametric task identification from frozen-base hidden states (Mahalanobis, shared covariance).

    Parameters: ``layer`` (hidden state used, -1 = last), ``prior_strength`` (covariance shrinkage in
    pseudo-observations; small, only so the first stage - fewer requests than dimensions - is invertible).
    Context (not saved): ``base`` or ``featurizer``.
    """

    kind = "epi"
    replay_free = True

    def __init__(self, layer: int = -1, prior_strength: float = 10.0, base=None, featurizer=None):
        self.layer = int(layer)
        self.prior_strength = float(prior_strength)
        self.stats_ = GaussianClassStats(self.prior_strength)
        self._base = base
        self._featurizer = featurizer
        self.base_identity_: dict = {}
        self.reset()

    def reset(self) -> None:
        self.classes_ = []
        self.stats_.reset()

    def get_params(self) -> dict:
        return {"layer": self.layer, "prior_strength": self.prior_strength}

    def features(self, requests: Sequence[str]) -> np.ndarray:
        if self._featurizer is None:
            self._featurizer = BaseHiddenStates(self._base, self.layer)
        base = self._featurizer.base
        identity = {"name": base.identity.get("name"), "digest": base.identity.get("digest")}
        if self.base_identity_ and self.base_identity_.get("digest") != identity["digest"]:
            raise SelectorError(f"these EPI statistics were computed on base {self.base_identity_.get('name')!r} "
                                f"({self.base_identity_.get('digest', '')[:19]}...), not on the loaded "
                                f"{identity['name']!r} ({str(identity['digest'])[:19]}...)")
        self.base_identity_ = identity
        return self._featurizer(requests)

    def partial_fit(self, requests, labels) -> "EPISelector":
        reqs = check_requests(requests)
        if not reqs:
            raise SelectorError("partial_fit needs at least one request")
        labs = self._labels(reqs, labels)
        self.stats_.partial_fit(self.features(reqs), labs)
        self.classes_ = list(self.stats_.classes_)
        return self

    def predict_proba(self, requests) -> np.ndarray:
        self._check_fitted()
        return _softmax(self.stats_.log_scores(self.features(check_requests(requests))))

    def _state(self):
        return {"classes": self.classes_, "base": self.base_identity_}, self.stats_.arrays()

    def _set_state(self, state, arrays):
        self.classes_ = list(state.get("classes", []))
        self.base_identity_ = dict(state.get("base", {}))
        self.stats_.set_arrays(self.classes_, arrays)


# -- AdapterCL -----------------------------------------------------------------------------------
class AdapterRequestNLL:
    """Mean negative log-likelihood (nats/token) of a request's own tokens in the closed-book prompt, under
    one shard. memo: keep each (shard, request) score (an evaluation cache; never saved)."""

    def __init__(self, execution, batch_size: int = 8, memo: bool = False):
        if execution is None:
            raise SelectorError("this selector needs the bank's executors: pass execution=<ExecutionMemory> "
                                "(e.g. make_selector('adaptercl', execution=bank.execution))")
        self.execution, self.batch_size = execution, batch_size
        self._memo: dict[tuple[str, str], float] | None = {} if memo else None

    def __call__(self, shard: str, requests: Sequence[str]) -> np.ndarray:
        memo = self._memo if self._memo is not None else {}
        todo = [r for r in dict.fromkeys(requests) if (shard, r) not in memo]
        if todo:
            memo.update({(shard, r): v for r, v in zip(todo, self._compute(shard, todo))})
        return np.array([memo[(shard, r)] for r in requests])

    def _compute(self, shard: str, requests: list[str]) -> list[float]:
        import torch

        from skillbank.model.prompts import render_prompt

        if shard not in self.execution.shards:
            raise SelectorError(f"unknown shard {shard!r}; loaded: {sorted(self.execution.shards)}")
        tok = self.execution.base.tokenizer
        if not getattr(tok, "is_fast", False):
            raise ModelError("AdapterCL needs a fast tokenizer (offsets locate the request inside the prompt)")
        entry = self.execution.shards[shard]
        model = self.execution.activate(shard)
        device = next(model.parameters()).device
        rows = []
        for r in requests:
            prompt = render_prompt(tok, r, entry.system_prompt)
            start = prompt.rfind(r.strip())
            enc = tok(prompt, add_special_tokens=False, return_offsets_mapping=True)
            # Score the tokens that overlap the request's characters (the instruction around it is the
            # same for every request and shard, so it would only add a shared offset).
            target = [i for i, (a, b) in enumerate(enc["offset_mapping"]) if i > 0 and b > start and b > a]
            rows.append((enc["input_ids"], target))
        out = []
        with torch.inference_mode():
            for s in range(0, len(rows), self.batch_size):
                chunk = rows[s:s + self.batch_size]
                width = max(len(ids) for ids, _ in chunk)
                pad = tok.pad_token_id if tok.pad_token_id is not None else 0
                ids = torch.tensor([x + [pad] * (width - len(x)) for x, _ in chunk], device=device)
                mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x, _ in chunk], device=device)
                logp = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), dim=-1)  # (b, L, V)
                for row, (x, target) in enumerate(chunk):
                    pos = torch.tensor(target, device=device)
                    # token at position i is predicted by the logits at i - 1
                    lp = logp[row, pos - 1, ids[row, pos]]
                    out.append(float(-lp.mean()) if len(target) else 0.0)
        return out


class AdapterCLSelector(_ShardListSelector):
    """Route to the shard under which the request has the lowest perplexity (AdapterCL).

    Context (not saved): ``execution`` or ``scorer``. Labels given to ``partial_fit`` must be shards of the
    execution memory; the requests themselves are not used (AdapterCL's selection needs no training).
    """

    kind = "adaptercl"
    replay_free = True

    def __init__(self, batch_size: int = 8, execution=None, scorer=None):
        self.batch_size = int(batch_size)
        self._execution = execution
        self._scorer = scorer
        self.reset()

    def get_params(self) -> dict:
        return {"batch_size": self.batch_size}

    def scorer(self) -> AdapterRequestNLL:
        if self._scorer is None:
            self._scorer = AdapterRequestNLL(self._execution, self.batch_size)
        return self._scorer

    def partial_fit(self, requests, labels) -> "AdapterCLSelector":
        labs = self._register(requests, labels)
        shards = self.scorer().execution.shards
        missing = [c for c in dict.fromkeys(labs) if c not in shards]
        if missing:
            raise SelectorError(f"label(s) {missing} are not shards of the execution memory {sorted(shards)}")
        return self

    def nll(self, requests: Sequence[str]) -> np.ndarray:
        """Per-token NLL of each request under each learned shard, (n_requests, n_classes)."""
        self._check_fitted()
        reqs = check_requests(requests)
        return np.stack([self.scorer()(c, reqs) for c in self.classes_], axis=1)

    def predict_proba(self, requests) -> np.ndarray:
        return _softmax(-self.nll(requests))


# -- Self-route ----------------------------------------------------------------------------------
class SelfRouteSelector(_ShardListSelector):
    """Every learned shard generates; pick the output with the highest mean token log-probability.

    Context (not saved): ``execution`` or ``cache`` - any object with ``get(pairs) -> outputs`` over
    ``(shard, request)`` pairs whose outputs carry ``mean_logprob`` (``skillbank.memory.execution.ShardOutputCache``;
    sharing one lets an evaluation reuse the generations for EM and coverage).
    """

    kind = "self-route"
    replay_free = True

    def __init__(self, batch_size: int = 8, max_new_tokens: int = 256, execution=None, cache=None):
        if batch_size < 1 or max_new_tokens < 1:
            raise SelectorError(f"batch_size and max_new_tokens must be >= 1, got {batch_size}, {max_new_tokens}")
        self.batch_size, self.max_new_tokens = int(batch_size), int(max_new_tokens)
        self._execution = execution
        self._cache = cache
        self.reset()

    def get_params(self) -> dict:
        return {"batch_size": self.batch_size, "max_new_tokens": self.max_new_tokens}

    def cache(self):
        if self._cache is None:
            if self._execution is None:
                raise SelectorError("self-route needs the bank's executors: pass execution=<ExecutionMemory> "
                                    "or cache=<OutputCache>")
            from skillbank.memory.execution import ShardOutputCache as OutputCache  # the one (shard, request) output cache
            self._cache = OutputCache(self._execution, self.batch_size, self.max_new_tokens)
        return self._cache

    def partial_fit(self, requests, labels) -> "SelfRouteSelector":
        self._register(requests, labels)
        return self

    def clear_outputs(self) -> None:
        """Forget the generations made so far (an own cache only; a shared one passed as ``cache`` is
        the caller's), so that the next routing generates again - e.g. to time it."""
        if self._execution is not None:
            self._cache = None

    def outputs(self, requests: Sequence[str]) -> list[list]:
        """Every learned shard's output for each request: ``[request][class]``."""
        self._check_fitted()
        reqs = check_requests(requests)
        flat = self.cache().get([(c, r) for r in reqs for c in self.classes_])
        k = len(self.classes_)
        return [flat[i * k:(i + 1) * k] for i in range(len(reqs))]

    def confidence(self, requests: Sequence[str]) -> np.ndarray:
        """Mean token log-probability of each shard's output, (n_requests, n_classes)."""
        return np.array([[o.mean_logprob for o in row] for row in self.outputs(requests)])

    def predict_proba(self, requests) -> np.ndarray:
        return _softmax(self.confidence(requests))


# -- Oracle --------------------------------------------------------------------------------------
class OracleSelector(_ShardListSelector):
    """The gold family of each request (execution-only reference). Context (not saved): ``gold``, a mapping
    request -> family, covering every request it will be asked about."""

    kind = "oracle"
    replay_free = True

    def __init__(self, gold: Mapping[str, str] | None = None):
        self._gold = dict(gold or {})
        self.reset()

    def get_params(self) -> dict:
        return {}

    def partial_fit(self, requests, labels) -> "OracleSelector":
        self._register(requests, labels)
        return self

    def predict_proba(self, requests) -> np.ndarray:
        self._check_fitted()
        reqs = check_requests(requests)
        proba = np.zeros((len(reqs), len(self.classes_)))
        for i, r in enumerate(reqs):
            family = self._gold.get(r)
            if family is None:
                raise SelectorError(f"the oracle has no gold family for request {i} ({r[:60]!r}); pass gold={{request: family}}")
            if family not in self.classes_:
                raise SelectorError(f"request {i}'s gold family {family!r} has not been learned; learned: {self.classes_}")
            proba[i, self.classes_.index(family)] = 1.0
        return proba


# -- Address Memory, with the top candidates competing when it is unsure ----------------------------
class AddressCompeteSelector(Selector):
    """The Address Memory (hashing + Naive Bayes) routes; where it is unsure, the executors of its top ``k``
    candidates each generate and the output with the highest mean token log-probability wins (Self-route
    restricted to those ``k``).

    "Unsure" is a top-2 margin - the log posterior ratio of the best to the second-best family - below a
    threshold chosen on training requests only: the ``quantile`` of the margins the training requests had
    just after their own stage was learned, each with its own counts left out of its family (leave-one-out,
    exact for counts: in-sample margins were so inflated that at K = 50 the 10% quantile made 61% of the
    held-out requests compete). Only those margins (numbers) are kept, never the requests, so the selector
    stays replay-free. A request with a clear margin costs what the Address Memory costs; one that
    competes costs ``k`` generations instead of one.

    Context (not saved): ``execution`` or ``cache`` as for :class:`SelfRouteSelector`.
    """

    kind = "address-compete"
    replay_free = True

    def __init__(self, k: int = 3, quantile: float = 0.1, n_features: int = 2**18, alpha: float = 0.01,
                 batch_size: int = 8, max_new_tokens: int = 256, execution=None, cache=None):
        if not isinstance(k, int) or k < 2:
            raise SelectorError(f"k (candidates that compete) must be an integer >= 2, got {k!r}")
        if not 0 < quantile < 1:
            raise SelectorError(f"quantile must be in (0, 1), got {quantile!r}")
        from skillbank.memory.address import HashingNBAddress
        self.k, self.quantile = k, float(quantile)
        self.address = HashingNBAddress(n_features=n_features, alpha=alpha)
        self.self_route = SelfRouteSelector(batch_size, max_new_tokens, execution=execution, cache=cache)
        self.reset()

    def reset(self) -> None:
        self.address.reset()
        self.classes_: list[str] = []
        self.margins_ = np.zeros(0)
        self.competed_ = 0  # requests routed by competition in the last predict_proba call

    def get_params(self) -> dict:
        return {"k": self.k, "quantile": self.quantile, "n_features": self.address.n_features,
                "alpha": self.address.alpha, **self.self_route.get_params()}

    @property
    def threshold_(self) -> float:
        self._check_fitted()
        return float(np.quantile(self.margins_, self.quantile))

    def margins(self, requests: Sequence[str]) -> np.ndarray:
        """Top-2 margin of each request: log p(best family) - log p(second); +inf with a single family."""
        return _top2_margin(self.address.joint_log_likelihood(check_requests(requests)))

    def partial_fit(self, requests, labels) -> "AddressCompeteSelector":
        reqs = check_requests(requests)
        self.address.partial_fit(reqs, labels)
        self.classes_ = list(self.address.classes_)
        self.self_route.classes_ = self.classes_
        fresh = _top2_margin(self.address.leave_one_out_log_likelihood(reqs, self._labels(reqs, labels)))
        self.margins_ = np.concatenate([self.margins_, fresh[np.isfinite(fresh)]])
        return self

    def partial_fit_catalog(self, docs, label) -> "AddressCompeteSelector":
        self.address.partial_fit_catalog(docs, label)
        return self

    def _contest(self, reqs: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The Address Memory's probabilities, the indices of the unsure requests and each one's top-k
        candidate columns (best first)."""
        jll = self.address.joint_log_likelihood(reqs)  # once: both the routing and the margins read it
        proba = _softmax(jll)
        if len(self.classes_) < 2 or not len(self.margins_):
            return proba, np.zeros(0, dtype=int), np.zeros((0, 0), dtype=int)
        unsure = np.flatnonzero(_top2_margin(jll) < self.threshold_)
        k = min(self.k, len(self.classes_))
        return proba, unsure, np.argsort(-proba[unsure], axis=1)[:, :k]

    def competing_pairs(self, requests) -> list[tuple[str, str]]:
        """The (shard, request) generations :meth:`predict` would ask for, without generating them: which
        requests compete depends on the Address Memory alone, so an evaluation can collect the pairs of many
        calls and generate them in a few large batches first."""
        self._check_fitted()
        reqs = check_requests(requests)
        return self._pairs(reqs, *self._contest(reqs)[1:])

    def _pairs(self, reqs: list[str], unsure: np.ndarray, candidates: np.ndarray) -> list[tuple[str, str]]:
        return [(self.classes_[c], reqs[i]) for i, row in zip(unsure, candidates) for c in row]

    def predict_proba(self, requests) -> np.ndarray:
        self._check_fitted()
        reqs = check_requests(requests)
        proba, unsure, candidates = self._contest(reqs)
        self.competed_ = len(unsure)
        if not len(unsure):
            return proba
        k = candidates.shape[1]
        outputs = self.self_route.cache().get(self._pairs(reqs, unsure, candidates))
        for n, (i, row) in enumerate(zip(unsure, candidates)):
            scores = np.array([o.mean_logprob for o in outputs[n * k:(n + 1) * k]])
            proba[i] = 0.0
            proba[i, row] = _softmax(scores[None, :])[0]  # the competitors share the mass, best first
        return proba

    def _state(self):
        state, arrays = self.address._state()
        return state, {**arrays, "margins": self.margins_}

    def _set_state(self, state, arrays):
        self.address._set_state(state, {k: v for k, v in arrays.items() if k != "margins"})
        self.classes_ = list(self.address.classes_)
        self.self_route.classes_ = self.classes_
        self.margins_ = np.asarray(arrays.get("margins", np.zeros(0)), dtype=float)
