"""Benchmarks that ``medrt bench`` runs.

Each figure is a ratio against a baseline measured side by side in the same
run, interleaved, median over repeats: this machine's timings drift too much
for absolute numbers to mean much on their own.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

__all__ = ["interleaved_medians", "interleaved_times", "percentile", "SETTLE_S"]

SETTLE_S = 0.2  # pause between runs of different thread pools (interleaved_times)


def interleaved_times(funcs: dict[str, Callable[[], Any]], repeats: int, warmup: int = 1,
                      settle_s: float = 0.0) -> dict[str, list[float]]:
    """Wall times in ms of each function, run in turn within each repeat (after ``warmup`` rounds).

    ``settle_s``: pause before each call. Give it (0.2 s) when the functions use
    different thread pools: OpenBLAS's threads spin about 0.1 s after a matrix
    product and ONNX Runtime's after a run, and a call made meanwhile shares the
    cores with them (a UNet run measured 106 ms right after an sgemm, 66 ms alone)."""
    times: dict[str, list[float]] = {name: [] for name in funcs}
    for i in range(warmup + repeats):
        for name, func in funcs.items():
            if settle_s > 0:
                time.sleep(settle_s)
            t0 = time.perf_counter()
            func()
            dt = (time.perf_counter() - t0) * 1000.0
            if i >= warmup:
                times[name].append(dt)
    return times


def interleaved_medians(funcs: dict[str, Callable[[], Any]], repeats: int, warmup: int = 1,
                        settle_s: float = 0.0) -> dict[str, float]:
    """Median wall time in ms of each function, run in turn within each repeat."""
    return {k: statistics.median(v) for k, v in interleaved_times(funcs, repeats, warmup, settle_s).items()}


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation, as numpy does."""
    import numpy as np

    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else float("nan")
