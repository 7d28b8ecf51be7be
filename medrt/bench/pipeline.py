"""Pipeline benchmarks: pipelined vs serial throughput on one 512² stream, and a
sustained replay at the scanner's rate.

Serial runs the same five stage functions one frame at a time on one thread, at
whichever ORT thread count is faster for it (both are measured and reported),
so the speed-up is against the best serial layout, not a straw man.

The files are those ``medrt batch`` takes from the folder (named ``.dcm`` or not),
replayed by name, as ``medrt stream`` replays a folder, and a 2.5-D model's neighbours
come from the series' slice order with each pass of a series of several acquisitions
ended (:meth:`medrt.io.sources.FileReplay.slice_order`), as in ``medrt stream`` and the
batch: the pipeline measured is the one users run.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from medrt.bands import usable_cores
from medrt.bench import SETTLE_S

__all__ = ["pipelined_vs_serial", "stream_replay", "TimedBackend", "default_stream", "stream_files", "stream_folder"]


def default_stream() -> Path:
    """The sample CT stream shipped in the repository (40 × 512² JPEG-LS)."""
    return Path(__file__).resolve().parents[2] / "sample_dicom" / "ct_stream"


class TimedBackend:
    """Wraps a backend and adds up the time spent in ``infer`` (model-only time)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.spec = inner.spec
        self.ms = 0.0
        self.calls = 0

    def infer(self, x: Any) -> Any:
        t0 = time.perf_counter()
        out = self.inner.infer(x)
        self.ms += (time.perf_counter() - t0) * 1000.0
        self.calls += 1
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class _Count:
    def __init__(self) -> None:
        self.n = 0
        self.errors = 0
        self.sections = 0  # lesions found, per frame: the same for the same frames in any layout

    def on_result(self, result: Any, env: Any) -> None:
        self.n += 1
        self.sections += len(result.lesions)

    def on_error(self, error: Any, env: Any) -> None:
        self.errors += 1


def _dicom_paths(folder: Path) -> list[Path]:
    """The files of ``folder`` that the pipeline suites replay, by name as ``medrt stream``
    replays a folder: the ones ``medrt batch`` takes, found as its scan finds them
    (:func:`medrt.batch.plan.scan`: the folder walked, links that leave it and hidden files
    passed over, the headers grouped), whatever their names end in (a PACS export's or
    ``medrt listen``'s spool's files have no ``.dcm``): each series' images, and the files
    the batch reports as errors (a damaged image is a frame that fails, as it is there).
    Those the batch passes over with a note are left out: not DICOM (the phantom's ground
    truth, a README), no image (an SR, a SEG), another copy of an image already taken."""
    from medrt.io.scan import iter_files
    from medrt.io.series import group_series

    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: {'not a folder' if folder.exists() else 'no such folder'} "
                                "for the stream benchmark")
    grouped = group_series(list(iter_files([folder])), dicomdir=False)
    paths = {item.path for series in grouped.series for item in series.items if item.path is not None}
    paths |= {Path(bad.source) for bad in grouped.errors if not getattr(bad.error, "skippable", False)}
    if not paths:
        raise FileNotFoundError(f"{folder}: no DICOM images for the stream benchmark")
    return sorted(paths)


def stream_files(folder: Path | str | None = None) -> list[Path]:
    """The files the pipeline suites replay from ``folder`` (None: the sample stream), in
    replay order; FileNotFoundError, naming the folder, when it is not a folder or holds no
    DICOM image."""
    return _dicom_paths(default_stream() if folder is None else Path(folder))


def stream_folder(folder: Path | str | None) -> str | None:
    """The folder a pipeline suite replays, as its result names it (``folder``, a run setting
    that ``medrt bench --compare`` matches): None for the sample stream, else the folder's
    absolute path."""
    if folder is None:
        return None
    path = Path(folder).resolve()
    return None if path == default_stream().resolve() else str(path)


def _slice_order(paths: list[Path]) -> list[Path | None]:
    """The files' slice order for a 2.5-D model's neighbours, as ``medrt stream`` gives it
    (a None after each pass of a series of several acquisitions); read from the headers
    before any clock starts."""
    from medrt.io.sources import FileReplay

    return FileReplay(paths).slice_order()


def pipelined_vs_serial(
    model: str = "lesion_unet_lite", folder: Path | str | None = None, loops: int = 3, repeats: int = 3,
    workers: int | None = None, processes: int | None = None, precision: str = "fp32",
) -> dict[str, Any]:
    """Throughput of the same stream through the pipeline and through the serial loop,
    interleaved ``repeats`` times (medians), plus the model-only time per frame.

    Two pipelined layouts: threads (``workers`` inference workers sharing one
    analyzer) and processes (``processes`` workers each decoding and analysing whole
    files, :class:`~medrt.pipeline.stages.ProcessAnalysis`; None: one per core, 0:
    skip). ``speedup`` and the overhead use the faster one, named in ``pipelined_layout``."""
    from medrt.analyzer import load_analyzer
    from medrt.io.sources import FileReplay
    from medrt.pipeline.graph import Pipeline, run_serial
    from medrt.pipeline.stages import analysis_stages

    paths = stream_files(folder)
    order = _slice_order(paths)
    cores = usable_cores()
    workers = workers or cores
    processes = cores if processes is None else processes
    one = load_analyzer(seg_model=model, threads=1, precision=precision)
    multi = load_analyzer(seg_model=model, threads=cores, precision=precision) if cores > 1 else one
    n = len(paths) * loops

    errors: dict[str, int] = {}  # frames that failed, per layout (their fps counts only frames analysed)
    sections: set[int] = set()  # lesions found by each run over the frames: one value when all agree

    def serial(analyzer: Any, key: str = "warm-up") -> float:
        sink = _Count()
        t0 = time.perf_counter()
        run_serial(FileReplay(paths, fps=0, loop=loops), analysis_stages(analyzer, order=order), [sink])
        errors[key] = errors.get(key, 0) + sink.errors
        sections.add(sink.sections)
        return sink.n / (time.perf_counter() - t0)

    def pipelined(stages: list[Any], key: str) -> float:
        sink = _Count()
        pipe = Pipeline(FileReplay(paths, fps=0, loop=loops), stages, [sink], policy="block")
        t0 = time.perf_counter()
        pipe.run()
        errors[key] = errors.get(key, 0) + sink.errors
        sections.add(sink.sections)
        return sink.n / (time.perf_counter() - t0)

    fps: dict[str, list[float]] = {"serial_1_thread": [], f"serial_{cores}_threads": [], "pipelined": []}
    if processes > 0:
        fps["pipelined_processes"] = []
    serial(one)  # warm caches and the OS file cache once
    for _ in range(repeats):
        fps["serial_1_thread"].append(serial(one, "serial_1_thread"))
        if multi is not one:
            fps[f"serial_{cores}_threads"].append(serial(multi, f"serial_{cores}_threads"))
            time.sleep(SETTLE_S)  # its ORT thread pool spins a moment after its last run
        fps["pipelined"].append(pipelined(analysis_stages(one, infer_workers=workers, order=order), "pipelined"))
        if processes > 0:
            # The pool starts (models loaded in every process) before the clock does;
            # the pipeline closes it when it ends.
            fps["pipelined_processes"].append(pipelined(analysis_stages(one, processes=processes, order=order),
                                                        "pipelined_processes"))
    med = {k: statistics.median(v) for k, v in fps.items() if v}
    best_serial_key = max((k for k in med if k.startswith("serial")), key=lambda k: med[k])
    best_pipe_key = max((k for k in med if k.startswith("pipelined")), key=lambda k: med[k])

    # model-only: the same frames, one thread, only the time inside the backends
    rois, segs = tuple(TimedBackend(r) for r in one.rois), tuple(TimedBackend(s) for s in one.segs)
    real = (one.rois, one.segs)
    one.rois, one.segs = rois, segs
    try:
        sink = _Count()
        t0 = time.perf_counter()
        run_serial(FileReplay(paths, fps=0), analysis_stages(one, order=order), [sink])
        serial_ms = (time.perf_counter() - t0) * 1000.0 / max(1, sink.n)
    finally:
        one.rois, one.segs = real
    model_ms = (sum(r.ms for r in rois) + sum(s.ms for s in segs)) / max(1, sink.n)
    pipelined_ms = 1000.0 / med[best_pipe_key]
    return {
        "model": one.seg.spec.ident, "folder": stream_folder(folder), "frames": n, "workers": workers, "cores": cores,
        "processes": processes,
        "fps": {k: round(v, 1) for k, v in med.items()},
        # frames that failed in all the timed runs (each layout's fps counts the frames analysed):
        # not 0 means the figures are of a broken run, and --compare calls it a regression
        "errors": sum(v for k, v in errors.items() if k != "warm-up"),
        # lesion sections found over the frames, by every run (one value when all agree):
        # what the pipeline measured finds, as `medrt stream --fps 0 --loop N` counts them
        "lesion_sections": sorted(sections),
        "serial_baseline": best_serial_key,
        "pipelined_layout": best_pipe_key,
        # the best pipelined layout against the best serial one; per layout as well
        "speedup": round(med[best_pipe_key] / med[best_serial_key], 2),
        "speedup_threads": round(med["pipelined"] / med[best_serial_key], 2),
        **({"speedup_processes": round(med["pipelined_processes"] / med[best_serial_key], 2)}
           if "pipelined_processes" in med else {}),
        "model_only_ms_per_frame": round(model_ms, 2),
        "serial_ms_per_frame": round(serial_ms, 2),
        "pipelined_ms_per_frame": round(pipelined_ms, 2),
        # How much more wall time per frame of throughput than the models alone need:
        "overhead_pct": round(100.0 * (pipelined_ms - model_ms) / model_ms, 1),
    }


def stream_replay(
    model: str = "lesion_unet_lite", folder: Path | str | None = None, fps: float = 30.0, frames: int = 320,
    policy: str = "latest", workers: int | None = None, precision: str = "fp32", max_in_flight: int | None = None,
) -> dict[str, Any]:
    """Replay the stream at ``fps`` for ``frames`` frames through the live pipeline
    (entry policy ``policy``; ``max_in_flight`` None: the live default, 0: unbounded):
    achieved fps, drops, end-to-end p99 and RSS growth. The series is sent over and
    over and the last pass cut short, so that ``frames`` is the count sent, exactly."""
    from medrt.analyzer import load_analyzer
    from medrt.io.sources import FileReplay
    from medrt.pipeline.admission import live_in_flight
    from medrt.pipeline.graph import Pipeline
    from medrt.pipeline.stages import analysis_stages

    if isinstance(frames, bool) or not isinstance(frames, int) or frames < 1:
        raise ValueError(f'Argument "frames" must be a whole number >= 1, got {frames!r}.')
    paths = stream_files(folder)
    workers = workers or usable_cores()
    analyzer = load_analyzer(seg_model=model, threads=1, precision=precision)
    source = FileReplay([paths[i % len(paths)] for i in range(frames)], fps=fps)
    stages = analysis_stages(analyzer, infer_workers=workers, order=_slice_order(paths))
    sink = _Count()
    bound = live_in_flight(policy, stages, max_in_flight)
    pipe = Pipeline(source, stages, [sink], policy={stages[0].name: policy}, telemetry=True, name="bench-stream",
                    max_in_flight=bound)
    tel = pipe.telemetry
    pipe.start()
    while not pipe.join(1.0):
        tel.sample_memory()
    tel.sample_memory()
    e2e = tel.latency("e2e")
    counters = pipe.counters()
    drops = sum(c["drops"] + c["rejects"] for c in counters.values())
    return {
        "model": analyzer.seg.spec.ident, "folder": stream_folder(folder), "target_fps": fps, "frames": len(source),
        "analysed": sink.n,
        "fps": round(tel.throughput_fps(), 2), "drops": drops, "late_source_items": source.late,
        "p50_ms": round(e2e["p50"], 1), "p99_ms": round(e2e["p99"], 1), "max_ms": round(e2e["max"], 1),
        "rss_growth_pct": round(tel.rss_growth(), 2), "depth": pipe.depth, "workers": workers,
        "max_in_flight": bound, "errors": sink.errors,
        "lesion_sections": sink.sections,  # over the frames analysed (not those dropped)
    }
