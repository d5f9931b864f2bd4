"""How many threads a process that was not told should compute with (torch and llama.cpp alike); no torch here.

The rule is the machine's physical cores this process may run on, at most 8, unless told otherwise
(``--threads``, ``$SKILLBANK_THREADS``, or ``$OMP_NUM_THREADS``, which torch and llama.cpp users already set).
An earlier rule sampled the machine's load for a quarter of a second when a model loaded and kept what it
saw for the whole job: a short job of another program at that moment left an hour-long demo on one of two
cores (issue 66). Hyper-threads are not counted: two torch threads on one core's two hyper-threads wait on
each other at every operation and run no faster than one.
"""
from __future__ import annotations

import os

MAX_THREADS = 8  # past this a 135M model's operations are too small to share out (torch and llama.cpp alike)
ENV = "SKILLBANK_THREADS"


def usable_cores() -> tuple[int, int]:
    """(physical, logical) cores this process may run on: the CPU affinity mask (a container's or taskset's
    limit) and, where psutil can read the topology, its share of physical cores."""
    try:
        logical = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        logical = os.cpu_count() or 1
    physical = logical
    try:
        import psutil

        total_logical, total_physical = psutil.cpu_count(logical=True), psutil.cpu_count(logical=False)
        if total_logical and total_physical and total_physical < total_logical:
            per_core = total_logical // total_physical  # hyper-threads per core
            physical = max(1, logical // per_core)
    except Exception:  # noqa: BLE001 - no psutil or no topology here: count each logical CPU as a core
        pass
    return physical, logical


def told_threads() -> tuple[int, str] | None:
    """The thread count the environment sets, and which variable set it (None: neither is set)."""
    for name in (ENV, "OMP_NUM_THREADS"):
        raw = os.environ.get(name, "").strip()
        if not raw:
            continue
        try:
            n = int(raw)
        except ValueError:
            raise ValueError(f"${name}={raw!r}: expected a positive whole number of threads") from None
        if n < 1:
            raise ValueError(f"${name}={raw!r}: expected a positive whole number of threads")
        return n, name
    return None


def default_threads() -> int:
    """Intra-op threads for a process that was not told by its caller: ``$SKILLBANK_THREADS`` or
    ``$OMP_NUM_THREADS`` where set, else the physical cores it may use, at most :data:`MAX_THREADS`."""
    told = told_threads()
    if told is not None:
        return told[0]
    return max(1, min(usable_cores()[0], MAX_THREADS))


def threads_reason(threads: int | None = None) -> str:
    """Why a process computes with the threads it does, for `skillbank doctor` and progress lines."""
    if threads:
        return f"{threads} (--threads)"
    told = told_threads()
    if told is not None:
        return f"{told[0]} (${told[1]})"
    physical, logical = usable_cores()
    return f"{default_threads()} (physical cores: {physical} of {logical} logical CPUs usable, at most {MAX_THREADS})"
