"""Telemetry for the staged pipeline: latency per stage and end to end, throughput,
queue depths, drops, errors and memory.

Stages run on worker threads, so every ``record_*`` / ``count_*`` call is
thread-safe and cheap on the hot path (a lock and an append or an add; no I/O, no
formatting). Everything that costs something (percentiles, tables, JSON, PNG)
happens when a caller asks for it.

Warm-up is skipped the way Holoscan does it: the first ``warmup`` latency samples
of each recorder, and the first ``warmup`` completed frames for throughput and for
the RSS baseline.

Memory stays bounded on a long run: each recorder keeps its latest ``capacity``
samples (percentiles describe those), and the per-frame log keeps the latest
``keep_frames`` records. Until those caps fill, the telemetry's own lists are part
of any RSS growth it reports (about 0.5 MB per 1000 frames with the defaults).
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from medrt.io.atomic import atomic_write_bytes
from medrt.types import StageTimings

__all__ = ["LatencyRecorder", "Telemetry", "MemorySample", "latency_summary", "rss_bytes", "gpu_memory_bytes"]

log = logging.getLogger(__name__)

QUANTILES = {"p50": 50.0, "p95": 95.0, "p99": 99.0}
STATUS_WINDOW_S = 2.0
MB = float(2**20)


# -- latency ------------------------------------------------------------------


class LatencyRecorder:
    """Latency samples in ms, after skipping the first ``warmup``; thread-safe.

    Keeps the latest ``capacity`` samples; :meth:`percentiles` describes them.
    """

    def __init__(self, warmup: int = 10, capacity: int = 20_000) -> None:
        if warmup < 0:
            raise ValueError(f'Argument "warmup" must be >= 0, got {warmup!r}.')
        if capacity < 1:
            raise ValueError(f'Argument "capacity" must be >= 1, got {capacity!r}.')
        self.warmup = warmup
        self._skipped = 0
        self._count = 0
        self._values: deque[float] = deque(maxlen=capacity)
        self._lock = threading.Lock()

    def add(self, ms: float) -> None:
        with self._lock:
            if self._skipped < self.warmup:
                self._skipped += 1
                return
            self._values.append(ms)
            self._count += 1

    @property
    def count(self) -> int:
        """Samples recorded after warm-up (including any no longer kept)."""
        return self._count

    def values(self) -> list[float]:
        """A copy of the kept samples, oldest first."""
        with self._lock:
            return list(self._values)

    def percentiles(self) -> dict[str, float]:
        """``p50``, ``p95``, ``p99``, ``max``, ``mean`` in ms and ``n``; NaNs and n=0 when empty.

        Linear interpolation, as numpy (and :func:`medrt.bench.percentile`) do.
        """
        return _stats(self.values())


def latency_summary(values: Sequence[float]) -> dict[str, Any]:
    """``p50``, ``p95``, ``p99``, ``max``, ``mean`` (ms, rounded to µs) and ``n`` of
    ``values``: the shape of every ``timings_ms`` entry in a run's summary and report."""
    return _rounded(_stats(values))


def _stats(values: Sequence[float]) -> dict[str, float]:
    if not values:
        nan = float("nan")
        return {"p50": nan, "p95": nan, "p99": nan, "max": nan, "mean": nan, "n": 0}
    a = np.asarray(values, dtype=np.float64)
    p50, p95, p99 = (float(v) for v in np.percentile(a, list(QUANTILES.values())))
    return {"p50": p50, "p95": p95, "p99": p99, "max": float(a.max()), "mean": float(a.mean()), "n": int(a.size)}


# -- memory -------------------------------------------------------------------


def rss_bytes() -> tuple[int | None, str]:
    """This process's resident set size and where it came from.

    On Linux it is the current RSS (``/proc/self/statm`` x page size). Elsewhere it
    falls back to ``getrusage`` max RSS, which is the *peak* so far, not the
    current size; the source string says which.
    """
    try:
        with open("/proc/self/statm", encoding="ascii") as fp:
            return int(fp.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"), "statm"
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    try:
        import resource
    except ImportError:  # Windows
        return None, "none"
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) * (1 if sys.platform == "darwin" else 1024), "ru_maxrss (peak)"


_nvml_state: dict[str, Any] = {}


def _nvml_used() -> tuple[int | None, str]:
    """GPU memory of this process by NVML (or the devices' total when NVML cannot see our pid)."""
    if _nvml_state.get("failed"):
        return None, "none"
    try:
        if "mod" not in _nvml_state:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            _nvml_state["mod"] = pynvml
        nv = _nvml_state["mod"]
        pid, ours, device_total = os.getpid(), 0, 0
        found = False
        for i in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(i)
            device_total += int(nv.nvmlDeviceGetMemoryInfo(handle).used)
            for proc in nv.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == pid and proc.usedGpuMemory is not None:
                    ours += int(proc.usedGpuMemory)
                    found = True
        return (ours, "nvml") if found else (device_total, "nvml device total")
    except Exception as exc:  # ImportError, or any NVML error: no GPU figure, say so once
        _nvml_state["failed"] = True
        log.debug("no GPU memory figure from NVML: %s", exc)
        return None, "none"


def gpu_memory_bytes() -> tuple[int | None, str]:
    """GPU memory in use and its source, from a runtime that is already loaded.

    torch's allocator when torch is already imported and sees CUDA; otherwise
    NVML when ``pynvml`` is importable; otherwise ``(None, "none")``. Never imports
    torch itself (that would cost seconds and hundreds of MB).
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                return int(torch.cuda.memory_allocated()), "torch"
        except Exception as exc:  # a half-initialised CUDA runtime: fall through to NVML
            log.debug("torch.cuda memory query failed: %s", exc)
    return _nvml_used()


@dataclass(frozen=True, slots=True)
class MemorySample:
    """One memory reading: seconds since start, RSS and GPU bytes (None when unknown)."""

    t_s: float
    rss: int | None
    gpu: int | None


# -- telemetry ----------------------------------------------------------------


class _Edge:
    __slots__ = ("drops", "rejects", "depth_last", "depth_max", "depth_sum", "depth_n")

    def __init__(self) -> None:
        self.drops = self.rejects = 0
        self.depth_last = self.depth_max = self.depth_sum = self.depth_n = 0


class Telemetry:
    """What a pipeline run cost, recorded from its worker threads.

    ``stages`` and ``edges`` name the graph's stages and queues; recording under
    a name not given here raises ``KeyError`` (a wiring mistake). ``clock``
    returns seconds (``time.perf_counter`` by default; tests pass a fake one).

    Where to call what:

    - ``record_stage(stage, ms)``: a worker, after each item, with that stage's service time;
    - ``record_frame(key, timings, e2e_ms)``: the last stage, once per finished frame;
    - ``record_depth(edge, qsize)``, ``count_drop(edge)``, ``count_reject(edge)``: the queues;
    - ``count_error(stage)``: a worker that caught an exception for one item;
    - ``sample_memory()``: a monitor every second or so (``start``/``stop`` also sample).
    """

    def __init__(
        self,
        stages: Sequence[str],
        edges: Sequence[str] = (),
        warmup: int = 10,
        clock: Callable[[], float] = time.perf_counter,
        *,
        capacity: int = 20_000,
        keep_frames: int = 20_000,
    ) -> None:
        if isinstance(stages, str) or not all(isinstance(s, str) and s for s in stages):
            raise TypeError('Argument "stages" must be a sequence of non-empty stage names.')
        if isinstance(edges, str) or not all(isinstance(e, str) and e for e in edges):
            raise TypeError('Argument "edges" must be a sequence of non-empty edge names.')
        for arg, names in (("stages", stages), ("edges", edges)):
            if len(set(names)) != len(names):
                raise ValueError(f'Argument "{arg}" has duplicate names: {list(names)}.')
        if warmup < 0:
            raise ValueError(f'Argument "warmup" must be >= 0, got {warmup!r}.')
        if keep_frames < 0:
            raise ValueError(f'Argument "keep_frames" must be >= 0, got {keep_frames!r}.')
        self.stages = tuple(stages)
        self.edges = tuple(edges)
        self.warmup = warmup
        self.clock = clock
        self._lock = threading.Lock()
        self._stage = {s: LatencyRecorder(warmup, capacity) for s in self.stages}
        self._e2e = LatencyRecorder(warmup, capacity)
        self._edge = {e: _Edge() for e in self.edges}
        self._errors = dict.fromkeys(self.stages, 0)
        # frame log: (key, timings, e2e_ms, t_s, dropped); timings kept raw, formatted on write
        self._frames: deque[tuple[str, Any, float, float, bool]] = deque(maxlen=keep_frames or 1)
        self._keep_frames = keep_frames
        self._frames_logged = 0
        self._done = 0
        self._dropped_frames = 0
        self._recent: deque[float] = deque(maxlen=8192)  # completion times, for status_line
        self._t0 = clock()
        self._t_stop: float | None = None
        self._t_warm: float | None = self._t0 if warmup == 0 else None
        self._t_last: float | None = None
        self._rss_first: MemorySample | None = None
        self._rss_warm: MemorySample | None = None
        self._rss_last: MemorySample | None = None
        self._rss_max: int | None = None
        self._rss_source = ""
        self._gpu_last: int | None = None
        self._gpu_max: int | None = None
        self._gpu_source = "none"

    # -- hot path --------------------------------------------------------------

    def record_stage(self, stage: str, ms: float) -> None:
        """One item's service time in ``stage`` (ms)."""
        self._lookup(self._stage, stage, "stage").add(ms)

    def record_frame(self, key: str, timings: StageTimings | Mapping[str, float], e2e_ms: float,
                     *, dropped: bool = False) -> None:
        """A frame left the pipeline: its key, per-step timings and end-to-end latency.

        ``dropped=True`` logs a frame that did not complete (a queue dropped it):
        it is kept in the JSON lines but counts toward neither latency nor
        throughput. Per-edge drop counts come from :meth:`count_drop` only.
        """
        if not isinstance(timings, StageTimings):
            timings = dict(timings)
        now = self.clock()
        with self._lock:
            if self._keep_frames:
                self._frames.append((key, timings, e2e_ms, now - self._t0, dropped))
                self._frames_logged += 1
            if dropped:
                self._dropped_frames += 1
                return
            self._done += 1
            self._t_last = now
            self._recent.append(now)
            if self._done == self.warmup:
                self._t_warm = now
        self._e2e.add(e2e_ms)

    def record_depth(self, edge: str, depth: int) -> None:
        """A sampled depth of the queue on ``edge``: keeps last, max and a running mean."""
        e = self._lookup(self._edge, edge, "edge")
        with self._lock:
            e.depth_last = depth
            e.depth_max = max(e.depth_max, depth)
            e.depth_sum += depth
            e.depth_n += 1

    def count_drop(self, edge: str, n: int = 1) -> None:
        """Items the queue on ``edge`` discarded to make room (latest-wins)."""
        e = self._lookup(self._edge, edge, "edge")
        with self._lock:
            e.drops += n

    def count_reject(self, edge: str, n: int = 1) -> None:
        """New items the queue on ``edge`` refused because it was full."""
        e = self._lookup(self._edge, edge, "edge")
        with self._lock:
            e.rejects += n

    def count_error(self, stage: str) -> None:
        """An item failed in ``stage``."""
        self._lookup(self._errors, stage, "stage")
        with self._lock:
            self._errors[stage] += 1

    @staticmethod
    def _lookup(table: Mapping[str, Any], name: str, what: str) -> Any:
        try:
            return table[name]
        except KeyError:
            raise KeyError(f"unknown {what} {name!r}; this Telemetry knows {list(table)}") from None

    # -- run clock and memory --------------------------------------------------

    def start(self) -> None:
        """Start the wall clock (frame timestamps are relative to it) and sample memory."""
        with self._lock:
            self._t0 = self.clock()
            self._t_stop = None
            if self.warmup == 0:
                self._t_warm = self._t0
        self.sample_memory()

    def stop(self) -> None:
        """Stop the wall clock and take a last memory sample."""
        self.sample_memory()
        with self._lock:
            self._t_stop = self.clock()

    def elapsed_s(self) -> float:
        end = self._t_stop if self._t_stop is not None else self.clock()
        return end - self._t0

    def sample_memory(self) -> MemorySample:
        """Read RSS and GPU memory now (not on the hot path: a file read, maybe an NVML call)."""
        rss, source = rss_bytes()
        gpu, gpu_source = gpu_memory_bytes()
        with self._lock:
            s = MemorySample(self.clock() - self._t0, rss, gpu)
            if rss is not None:
                self._rss_source = source
                self._rss_first = self._rss_first or s
                if self._rss_warm is None and self._done >= self.warmup:
                    self._rss_warm = s
                self._rss_last = s
                self._rss_max = rss if self._rss_max is None else max(self._rss_max, rss)
            if gpu is not None:
                self._gpu_source = gpu_source
                self._gpu_last = gpu
                self._gpu_max = gpu if self._gpu_max is None else max(self._gpu_max, gpu)
        return s

    def rss_growth(self) -> float:
        """RSS growth in percent from the first sample after warm-up to the last; NaN without both."""
        warm, last = self._rss_warm, self._rss_last
        if warm is None or last is None or warm is last or not warm.rss:
            return float("nan")
        return 100.0 * (last.rss - warm.rss) / warm.rss  # type: ignore[operator]

    # -- figures ---------------------------------------------------------------

    @property
    def frames(self) -> int:
        """Frames completed (not counting dropped ones)."""
        return self._done

    def throughput_fps(self) -> float:
        """Frames per second completed after warm-up: from the ``warmup``-th completion
        (or ``start`` when warm-up is 0) to the last. NaN until there is a span."""
        with self._lock:
            n, t_warm, t_last = self._done - self.warmup, self._t_warm, self._t_last
        if n <= 0 or t_warm is None or t_last is None or t_last <= t_warm:
            return float("nan")
        return n / (t_last - t_warm)

    def recent_fps(self, window_s: float = STATUS_WINDOW_S) -> float:
        """Completions per second over the last ``window_s`` (shorter right after start)."""
        now = self._t_stop if self._t_stop is not None else self.clock()
        with self._lock:
            recent = list(self._recent)
            span = min(window_s, now - self._t0)
        if span <= 0:
            return float("nan")
        return sum(1 for t in recent if t >= now - window_s) / span

    def latency(self, stage: str = "e2e") -> dict[str, float]:
        """Percentiles for ``"e2e"``, a stage, or a per-frame timing name (e.g. ``"segment"``)."""
        return _stats(self._samples(stage))

    def _samples(self, stage: str) -> list[float]:
        if stage == "e2e":
            return self._e2e.values()
        if stage in self._stage:
            return self._stage[stage].values()
        timings = self._timings()
        if stage in timings:
            return timings[stage]
        raise KeyError(f"no latency named {stage!r}; have e2e, stages {list(self._stage)}, timings {list(timings)}")

    def _timings(self) -> dict[str, list[float]]:
        """Per-frame timings of completed frames after warm-up, by name (from the frame log)."""
        with self._lock:
            frames = list(self._frames) if self._keep_frames else []
            skip = max(0, self.warmup - (self._frames_logged - len(frames)))
        out: dict[str, list[float]] = {}
        seen = 0
        for _, timings, _, _, dropped in frames:
            if dropped:
                continue
            seen += 1
            if seen <= skip:
                continue
            for name, ms in _timing_items(timings):
                out.setdefault(name, []).append(ms)
        return out

    def summary(self) -> dict[str, Any]:
        """Everything measured so far as one JSON-ready dict (NaN becomes null)."""
        with self._lock:
            edges = {
                name: {"drops": e.drops, "rejects": e.rejects, "depth_last": e.depth_last,
                       "depth_max": e.depth_max,
                       "depth_mean": round(e.depth_sum / e.depth_n, 2) if e.depth_n else None}
                for name, e in self._edge.items()
            }
            errors = dict(self._errors)
            done, dropped = self._done, self._dropped_frames
            rss_first, rss_warm, rss_last, rss_max = self._rss_first, self._rss_warm, self._rss_last, self._rss_max
            gpu_last, gpu_max = self._gpu_last, self._gpu_max
        memory = {
            "rss_source": self._rss_source or "none",
            "rss_first_mb": _mb(rss_first.rss if rss_first else None),
            "rss_after_warmup_mb": _mb(rss_warm.rss if rss_warm else None),
            "rss_last_mb": _mb(rss_last.rss if rss_last else None),
            "rss_max_mb": _mb(rss_max),
            "rss_growth_pct": _round(self.rss_growth(), 2),
            "gpu_source": self._gpu_source,
            "gpu_last_mb": _mb(gpu_last),
            "gpu_max_mb": _mb(gpu_max),
        }
        return _json_ready({
            "warmup": self.warmup,
            "frames": done,
            "frames_dropped": dropped,
            "elapsed_s": round(self.elapsed_s(), 3),
            "fps": _round(self.throughput_fps(), 2),
            "e2e_ms": _rounded(self._e2e.percentiles()),
            "stages_ms": {s: _rounded(r.percentiles()) for s, r in self._stage.items()},
            "timings_ms": {k: latency_summary(v) for k, v in self._timings().items()},
            "edges": edges,
            "drops": sum(e["drops"] for e in edges.values()),
            "rejects": sum(e["rejects"] for e in edges.values()),
            "errors": errors,
            "memory": memory,
        })

    def summary_table(self) -> str:
        """The summary as aligned plain text for people (a terminal or a log)."""
        from medrt.pipeline.render import format_summary

        return format_summary(self.summary())

    def status_line(self) -> str:
        """One short line for a live display: ``fps 29.9 | p99 41 ms | drops 0 | queues 1/2/0``.

        ``drops`` counts items lost on every edge (dropped and rejected);
        ``queues`` shows the last sampled depth of each edge, in wiring order.
        """
        fps = self.recent_fps()
        p99 = self._e2e.percentiles()["p99"]
        with self._lock:
            lost = sum(e.drops + e.rejects for e in self._edge.values())
            depths = "/".join(str(e.depth_last) for e in self._edge.values()) or "-"
        fps_s = "-" if math.isnan(fps) else f"{fps:.1f}"
        p99_s = "-" if math.isnan(p99) else f"{p99:.0f}"
        return f"fps {fps_s} | p99 {p99_s} ms | drops {lost} | queues {depths}"

    # -- files -----------------------------------------------------------------

    def write_jsonl(self, path: str | Path) -> Path:
        """One JSON object per logged frame, then ``{"summary": ...}``; written atomically."""
        with self._lock:
            frames = list(self._frames) if self._keep_frames else []
        buf = io.StringIO()
        for key, timings, e2e_ms, t_s, dropped in frames:
            rec: dict[str, Any] = {"key": key, "t_s": round(t_s, 4), "e2e_ms": round(e2e_ms, 3),
                                   "timings_ms": {k: round(v, 3) for k, v in _timing_items(timings)}}
            if dropped:
                rec["dropped"] = True
            buf.write(json.dumps(_json_ready(rec), allow_nan=False) + "\n")
        buf.write(json.dumps({"summary": self.summary()}, allow_nan=False) + "\n")
        return atomic_write_bytes(Path(path), buf.getvalue().encode("utf-8"))

    def histogram_png(self, path: str | Path, stage: str = "e2e", size: tuple[int, int] = (800, 480)) -> Path:
        """A latency histogram of ``stage`` (see :meth:`latency`) with p50/p99 marked; written atomically.

        Drawn with matplotlib when it is importable, otherwise with PIL, so the
        file always exists (an empty run gives a labelled "no samples" chart).
        """
        from medrt.pipeline import render

        return atomic_write_bytes(Path(path), render.histogram_png(self._samples(stage), stage, size))


# -- helpers ------------------------------------------------------------------


def _timing_items(timings: StageTimings | Mapping[str, float]) -> Iterable[tuple[str, float]]:
    if isinstance(timings, StageTimings):
        return ((k, getattr(timings, k)) for k in StageTimings.__slots__)
    return timings.items()


def _round(x: float | None, nd: int) -> float | None:
    return None if x is None or math.isnan(x) else round(x, nd)


def _rounded(stats: Mapping[str, float]) -> dict[str, Any]:
    return {k: (v if k == "n" else _round(v, 3)) for k, v in stats.items()}


def _mb(nbytes: int | None) -> float | None:
    return None if nbytes is None else round(nbytes / MB, 1)


def _json_ready(obj: Any) -> Any:
    if isinstance(obj, float):
        return None if math.isnan(obj) or math.isinf(obj) else obj
    if isinstance(obj, dict):
        return {k: _json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_ready(v) for v in obj]
    return obj
