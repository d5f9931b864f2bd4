"""What one more row costs the others: the engine's measured step time as the batch grows.

On a GPU a decode step costs about the same for one row or sixteen; on a CPU it grows with the rows (the
README's service bench: sixteen rows take ~5x one row's step). Continuous batching then trades each request's
latency for throughput, and a client that floods the service, even within its share of the queue, fills the
batch and slows every other client's request several times over. Fair admission bounds that: while more than
one client is active, the batch grows only as far as a step stays within ``fair_slowdown`` times a lone row's
(:meth:`StepCost.rows_within`), so a client sending one request at a time is slowed at most that much by
another's flood. A client alone gets the whole batch.
"""
from __future__ import annotations

import threading

MIN_SAMPLES = 3  # iterations of one batch size before its mean counts
ALPHA = 0.1  # weight of a new iteration in its batch size's running mean (the machine's load changes)


class StepCost:
    """Seconds between two decode steps - a row's time per token: the step, new rows' prefill, and whatever else
    held the engine (the CPU shared with the HTTP traffic) - by the rows decoded: a running mean per batch
    size, and a least-squares line ``t(B) = a + b * B`` through those means - one point per size, so a long
    flood at one size does not drown what an idle spell measured at another. The engine thread observes; the
    event loop reads."""

    def __init__(self):
        self._means: dict[int, tuple[float, int]] = {}  # rows -> (running mean seconds, iterations seen)
        self._lock = threading.Lock()

    def observe(self, rows: int, seconds: float) -> None:
        if rows <= 0 or seconds <= 0:
            return
        with self._lock:
            mean, n = self._means.get(rows, (seconds, 0))
            self._means[rows] = (mean + ALPHA * (seconds - mean) if n else seconds, n + 1)

    def line(self) -> tuple[float, float] | None:
        """(a, b) of the line through the per-size means, or None until two sizes were seen often enough."""
        with self._lock:
            points = [(r, m) for r, (m, n) in self._means.items() if n >= MIN_SAMPLES]
        if len(points) < 2:
            return None
        mean_r = sum(r for r, _ in points) / len(points)
        mean_t = sum(t for _, t in points) / len(points)
        b = sum((r - mean_r) * (t - mean_t) for r, t in points) / sum((r - mean_r) ** 2 for r, _ in points)
        return mean_t - b * mean_r, b

    def rows_within(self, slowdown: float, max_rows: int) -> int:
        """The most rows whose step takes at most ``slowdown`` times a lone row's; ``max_rows`` while the cost
        is unknown or does not grow with the rows (a GPU)."""
        fit = self.line()
        if fit is None:
            return max_rows
        a, b = fit
        with self._lock:
            lone = self._means.get(1, (0.0, 0))
        one = lone[0] if lone[1] >= MIN_SAMPLES else a + b
        if b <= 0 or one <= 0:
            return max_rows
        return max(1, min(max_rows, int((slowdown * one - a) / b)))
