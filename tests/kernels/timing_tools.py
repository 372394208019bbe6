"""Shared by the kernel tests that compare the interpreter's CPU time of calls."""

from __future__ import annotations

import gc
import time


def least_cpu_seconds(calls, repeats: int = 4) -> list[float]:
    """The least CPU time (``time.process_time``: this process's own work, whoever else
    runs) of each call over ``repeats`` interleaved runs, with Python's garbage
    collector off while they run (as timeit does). With it on, one call of
    test_sparse_cost that usually takes 0.30 s took 0.51 s in all five of its runs in
    one process (the same allocations repeated can land a collection in every run);
    with it off that was not seen again, in six runs."""
    best = [float("inf")] * len(calls)
    gc.collect()
    was_on = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeats):
            for i, f in enumerate(calls):
                t = time.process_time()
                f()
                best[i] = min(best[i], time.process_time() - t)
    finally:
        if was_on:
            gc.enable()
    return best
