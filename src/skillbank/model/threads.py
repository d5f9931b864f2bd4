"""How many threads a process that was not told should compute with (torch and llama.cpp alike); no torch here."""
from __future__ import annotations

import os
import time


def default_threads(window_s: float = 0.25) -> int:
    """Intra-op threads for a process that was not told: the cores other work is not using, capped at 8.

    Torch's threads wait for each other at every operation, so a thread that shares its core with another
    busy process stalls all of them: on a 2-core machine a 2-thread process next to one other job ran 5-10x
    slower than with 1 thread (training and generation alike). How many cores other processes keep busy is
    sampled over ``window_s`` (psutil, a dependency of accelerate: system-wide CPU use minus this
    process's own), not read from the load average, which lags a finished job by minutes."""
    cores = os.cpu_count() or 1
    try:
        import psutil

        me = psutil.Process()
        psutil.cpu_percent(None), me.cpu_percent(None)  # start both counters
        time.sleep(window_s)
        busy = psutil.cpu_percent(None) / 100 * cores - me.cpu_percent(None) / 100
    except Exception:  # noqa: BLE001 - no psutil / no counters on this platform: assume an idle machine
        busy = 0.0
    return max(1, min(cores - int(busy + 0.5), 8))
