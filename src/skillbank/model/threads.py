"""How many threads a process that was not told should compute with (torch and llama.cpp alike); no torch here."""
from __future__ import annotations

import os
import time


class ThreadsProbe:
    """Samples how many cores other processes keep busy, from when it is made to :meth:`threads`.

    Torch's threads wait for each other at every operation, so a thread that shares its core with another
    busy process stalls all of them: on a 2-core machine a 2-thread process next to one other job ran 5-10x
    slower than with 1 thread (training and generation alike). The sample is system-wide CPU use minus this
    process's own (psutil, a dependency of accelerate), not the load average, which lags a finished job by
    minutes. Made before other start-up work, the sample runs during it and :meth:`threads` need not wait."""

    def __init__(self):
        self.started = time.perf_counter()
        try:
            import psutil

            self._me = psutil.Process()
            psutil.cpu_percent(None), self._me.cpu_percent(None)  # start both counters
        except Exception:  # noqa: BLE001 - no psutil / no counters on this platform: assume an idle machine
            self._me = None

    def threads(self, window_s: float = 0.25) -> int:
        """Intra-op threads: the cores other work is not using, capped at 8, over a sample of at least
        ``window_s`` (waiting only for what is left of it)."""
        cores = os.cpu_count() or 1
        busy = 0.0
        if self._me is not None:
            left = window_s - (time.perf_counter() - self.started)
            if left > 0:
                time.sleep(left)
            try:
                import psutil

                busy = psutil.cpu_percent(None) / 100 * cores - self._me.cpu_percent(None) / 100
            except Exception:  # noqa: BLE001 - counters gone: assume an idle machine
                busy = 0.0
        return max(1, min(cores - int(busy + 0.5), 8))


def default_threads(window_s: float = 0.25) -> int:
    """Intra-op threads for a process that was not told (:class:`ThreadsProbe` sampled over ``window_s``)."""
    return ThreadsProbe().threads(window_s)
