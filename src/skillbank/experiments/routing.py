"""Route evaluation over the prefixes of a task order (no language model involved): the one loop that every
routing study (route-eval, route-scale, the selectors over a bank) and the routing benchmarks run.

Along an order, a selector is given each stage's training requests (``partial_fit``; the offline reference
keeps earlier ones itself) and, at each prefix, the held-out requests of every family learned so far are
routed among the families learned so far. :func:`route_prefixes` yields each prefix; :func:`route_eval`
scores every prefix of one order: overall (micro: every request counts once), task-macro, and per family.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

from skillbank.data.stream import Stream
from skillbank.memory.scope import family_catalog_text
from skillbank.memory.selector import Selector
from skillbank.metrics import route_accuracy, task_macro


@dataclass
class Prefix:
    """One checkpoint of :func:`route_prefixes`: the first ``k`` families of the order learned."""
    k: int
    families: list[str]  # order[:k]
    records: list  # the held-out records of those families, family by family in order
    routed: list  # what ``route`` returned for their requests (None when no route was asked)
    fit_seconds: float  # partial_fit time of the stages since the previous checkpoint
    route_seconds: float  # time of ``route`` on this prefix's requests


def route_prefixes(selector: Selector, stream: Stream, order: Sequence[str], *, marks: Sequence[int] | None = None,
                   test: dict[str, list] | None = None,
                   route: Callable[[Selector, list[str]], list] | None = lambda s, q: s.predict(q),
                   progress: Callable[[str], None] | None = None, label: str = "") -> Iterator[Prefix]:
    """Feed ``selector`` the families of ``order`` and route the held-out requests at each checkpoint.

    marks: the prefix lengths to stop at (default: every prefix). Stages between two marks are given to
    ``partial_fit`` together: for additive statistics, and for references that refit on everything they kept,
    that is the same state as stage by stage. test: held-out records per family (default: the stream's).
    route: what to do with the requests at a checkpoint (default: ``predict``; None: only fit)."""
    order = list(order)
    test = stream.test if test is None else test
    done = 0
    for k in (range(1, len(order) + 1) if marks is None else marks):
        chunk = order[done:k]
        if progress:
            progress(f"{label + ': ' if label else ''}learning {', '.join(chunk) if len(chunk) == 1 else f'families {done + 1}-{k}'}"
                     f" ({k}/{len(order)})")
        requests = [r.request for fam in chunk for r in stream.train[fam]]
        labels = chunk[0] if len(chunk) == 1 else [fam for fam in chunk for _ in stream.train[fam]]
        t0 = time.perf_counter()
        selector.partial_fit(requests, labels)
        for fam in chunk:  # as SkillBank.learn does (a no-op for routers that read requests alone)
            selector.partial_fit_catalog(family_catalog_text(stream.catalog, fam), fam)
        fit_seconds = time.perf_counter() - t0
        done = k
        records = [r for fam in order[:k] for r in test.get(fam, [])]
        t0 = time.perf_counter()
        routed = route(selector, [r.request for r in records]) if route is not None and records else None
        yield Prefix(k, order[:k], records, routed, fit_seconds, time.perf_counter() - t0)


def fit_stages(selector: Selector, stream: Stream, order: Sequence[str]) -> Selector:
    """``selector`` fitted stage by stage along ``order``, as in the continual stream (no routing)."""
    for _ in route_prefixes(selector, stream, order, route=None):
        pass
    return selector


@dataclass
class PrefixRouting:
    stage: int
    family: str  # the family learned at this stage
    micro: float
    macro: float
    per_family: dict[str, float]
    n_requests: int


def score_prefix(prefix: Prefix) -> PrefixRouting:
    """Route accuracy of one prefix: overall, task-macro and per family."""
    golds = [r.family for r in prefix.records]
    per_family = {}
    for k in prefix.families:
        idx = [i for i, g in enumerate(golds) if g == k]
        if idx:
            per_family[k] = route_accuracy([k] * len(idx), [prefix.routed[i] for i in idx])
    return PrefixRouting(prefix.k, prefix.families[-1], route_accuracy(golds, prefix.routed) if golds else 0.0,
                         task_macro(per_family.values()), per_family, len(golds))


@dataclass
class RouteEvalResult:
    order_name: str
    order: list[str]
    selectors: dict[str, list[PrefixRouting]] = field(default_factory=dict)
    fit_seconds: dict[str, float] = field(default_factory=dict)

    def final(self, name: str) -> PrefixRouting:
        return self.selectors[name][-1]

    def to_dict(self) -> dict:
        return {"order_name": self.order_name, "order": self.order, "fit_seconds": self.fit_seconds,
                "selectors": {n: [vars(p) for p in rows] for n, rows in self.selectors.items()}}


def route_eval(stream: Stream, order_name: str, selectors: dict[str, Callable[[], Selector]],
               progress: Callable[[str], None] | None = None) -> RouteEvalResult:
    """Fit each selector stage by stage along ``order_name`` and score every prefix."""
    order = stream.order(order_name)
    result = RouteEvalResult(order_name, order)
    for name, factory in selectors.items():
        prefixes = list(route_prefixes(factory(), stream, order, progress=progress, label=f"{order_name} {name}"))
        result.selectors[name] = [score_prefix(p) for p in prefixes]
        result.fit_seconds[name] = sum(p.fit_seconds for p in prefixes)
    return result
