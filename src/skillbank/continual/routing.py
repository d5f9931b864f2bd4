"""Route evaluation over the prefixes of a task order (no language model involved).

After each stage ``t`` of the order, every selector has been ``partial_fit`` with stage ``t``'s training
requests only (the offline reference keeps earlier ones itself), and is scored on the held-out requests
of every family learned so far: overall (micro: every request counts once), task-macro, and per family.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from skillbank.data.stream import Stream
from skillbank.memory.address import Selector
from skillbank.metrics import route_accuracy, task_macro


@dataclass
class PrefixRouting:
    stage: int
    family: str  # the family learned at this stage
    micro: float
    macro: float
    per_family: dict[str, float]
    n_requests: int


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
        selector = factory()
        rows: list[PrefixRouting] = []
        spent = 0.0
        for t, family in enumerate(order, start=1):
            if progress:
                progress(f"{order_name} {name}: stage {t}/{len(order)} ({family})")
            train_requests = [r.request for r in stream.train[family]]
            start = time.perf_counter()
            selector.partial_fit(train_requests, family)
            spent += time.perf_counter() - start
            per_family, golds, preds = {}, [], []
            for k in order[:t]:
                requests = [r.request for r in stream.test[k]]
                if not requests:
                    continue
                predicted = selector.predict(requests)
                per_family[k] = route_accuracy([k] * len(requests), predicted)
                golds += [k] * len(requests)
                preds += predicted
            rows.append(PrefixRouting(t, family, route_accuracy(golds, preds) if golds else 0.0,
                                      task_macro(per_family.values()), per_family, len(golds)))
        result.selectors[name] = rows
        result.fit_seconds[name] = spent
    return result
