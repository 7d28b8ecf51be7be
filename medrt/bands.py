"""Whole-frame array passes split into row bands on a small shared thread pool.

A 4096² radiograph is 16 Mpixel: one pass of numpy over it (normalise, block
means, a threshold) writes 64 MB. On the first GPU run (H200 host, 16 cores,
benchmarks/results/h200_2026-11-30_before.md) the analysis of such a frame took
~140 ms, of which ~30 ms were model calls and most of the rest such passes and the
crops' resampling on one core. numpy releases the GIL in its loops, so row bands on
threads run side by side.

Only frames of at least :data:`MIN_PIXELS` are split: a 512² CT slice stays on the
caller's thread, where the streaming pipeline already keeps every core busy with
whole frames. Every banded function gives bit-identical results to its one-band
form (the bands are independent and each does the same arithmetic).

``MEDRT_BAND_THREADS`` sets the pool's size (default: the usable cores, at most 8;
``1`` turns banding off). No library served: numexpr and numba would each be a
new dependency for a handful of elementwise loops numpy already has.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np

__all__ = ["MIN_PIXELS", "at_least", "bands", "for_bands", "map_bands", "threads", "usable_cores"]

MIN_PIXELS = 1 << 21  # 2 Mpixel (about 1448²): smaller frames are not worth a hand-off
_MAX_THREADS = 8
T = TypeVar("T")
R = TypeVar("R")

_PREFIX = "medrt-bands"
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not on Linux
        return max(1, os.cpu_count() or 1)


def threads() -> int:
    """Threads for banded passes: ``MEDRT_BAND_THREADS``, else the usable cores (at most 8)."""
    env = os.environ.get("MEDRT_BAND_THREADS", "").strip()
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise ValueError(f"MEDRT_BAND_THREADS must be a whole number, got {env!r}") from None
    return min(_MAX_THREADS, usable_cores())


def bands(rows: int, n: int, multiple: int = 1) -> list[tuple[int, int]]:
    """``n`` (or fewer) contiguous half-open row ranges covering ``rows``, each starting
    at a multiple of ``multiple`` (block passes keep their blocks whole)."""
    if rows <= 0:
        return []
    multiple = max(1, multiple)
    blocks = -(-rows // multiple)
    n = max(1, min(n, blocks))
    cuts = [round(k * blocks / n) * multiple for k in range(n + 1)]
    cuts[-1] = rows
    return [(a, b) for a, b in zip(cuts, cuts[1:], strict=False) if b > a]


def _serial(pixels: int, n: int, items: int) -> bool:
    """Whether to stay on this thread: a small frame, one thread or item, or a call made
    from a band itself (waiting there on the same pool could deadlock it)."""
    return (pixels < MIN_PIXELS or n == 1 or items < 2
            or threading.current_thread().name.startswith(_PREFIX))


def _executor(n: int) -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None or _pool._max_workers != n:  # the setting changed (tests)
            if _pool is not None:
                _pool.shutdown(wait=False)  # its queued tasks still run; then its threads exit
            _pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix=_PREFIX)
        return _pool


def for_bands(fn: Callable[[int, int], object], rows: int, *, pixels: int, multiple: int = 1) -> None:
    """Call ``fn(r0, r1)`` for row bands of a ``rows``-row array of ``pixels`` pixels:
    on the shared pool when the array is large, else once on this thread. Each call
    must touch only its rows. The first exception is raised after all bands finish."""
    n = threads()
    if _serial(pixels, n, rows):
        fn(0, rows)
        return
    work = bands(rows, n, multiple)
    if len(work) == 1:
        fn(0, rows)
        return
    futures = [_executor(n).submit(fn, a, b) for a, b in work]
    errors = [f.exception() for f in futures]
    for exc in errors:
        if exc is not None:
            raise exc


def map_bands(fn: Callable[[T], R], items: Sequence[T], *, pixels: int) -> list[R]:
    """``[fn(x) for x in items]``, on the shared pool when the frame they come from has
    at least :data:`MIN_PIXELS` pixels and there is more than one item; results in the
    items' order. For per-crop work on a large frame (the crops are the bands)."""
    n = threads()
    if _serial(pixels, n, len(items)):
        return [fn(x) for x in items]
    return list(_executor(n).map(fn, items))


def at_least(values: np.ndarray, threshold: float) -> np.ndarray:
    """``values >= threshold`` for a 2-D map, by row bands on a large frame."""
    out = np.empty(values.shape, dtype=bool)
    if values.ndim != 2:
        np.greater_equal(values, threshold, out=out)
        return out
    for_bands(lambda a, b: np.greater_equal(values[a:b], threshold, out=out[a:b]), values.shape[0],
              pixels=values.size)
    return out
