"""A large CT series' outputs: the SEG, the SR and the files a series writes after its
last frame, timed stage by stage (``medrt bench --only series_outputs``).

Nothing here runs a model: each slice's result is what a perfect analyzer returns (the
phantom's ground-truth mask, measured as the analyzer measures its own,
:func:`truth_result`), so the figures are the export's alone and the same on every
machine's models. The series is a deterministic CT phantom (``medrt phantom ct --frames N
--seed 3``, 512², RLE), written once into the user's cache (:func:`phantom_series`).

Each repeat hands :meth:`medrt.batch.outputs.SeriesOutput.finish`, the step the batch
and the listener run, a fresh copy of the results whose headers are as the pipeline
leaves them (elements pydicom has not parsed yet stay unparsed: a second build on the
same headers would find them parsed and measure less than a series does), and reads
back the seconds it spent per stage (``SeriesOutput.stage_s``): ``link`` (lesions
linked across slices), ``seg`` (which slices a SEG can hold, and the SEG built), ``sr``
(the SR built), ``write`` (both written) and ``total`` (the whole step, also the frame
records, masks, lesions.json and manifest). Its memory, two ways: ``peak_rss_mb``, how
far each timed run raised the process's resident peak above what was resident before it
(Linux: the peak is reset first; the largest rise over the repeats), and ``peak_mb``, the
peak of the bytes it allocated, traced in one more run that is not timed (tracemalloc,
numpy's arrays included; tracing slows Python code). The two differ where an array is
allocated but mostly never written: ``np.zeros`` of a series' SEG mask is counted whole
by tracemalloc, while the kernel backs only the pages written. A warm-up run first (highdicom's and pydicom's first use), then
the repeats; medians.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from medrt.types import Frame, FrameResult

__all__ = ["series_outputs", "phantom_series", "truth_result", "BENCH_SEED", "TRUTH_MODELS"]

log = logging.getLogger(__name__)

#: the 500-slice phantom session 40 profiled (``medrt phantom ct --frames 500 --seed 3``)
BENCH_SEED = 3
#: the models a :func:`truth_result` names, as the SEG and SR name the algorithm
TRUTH_MODELS = ("roi_classifier@1.0.0", "lesion_unet_lite@1.0.0")


def phantom_series(frames: int, seed: int = BENCH_SEED, cache: Path | None = None) -> Path:
    """The folder of a ``frames``-slice 512² CT phantom (RLE) with its ground truth, written
    on first use under ``cache`` (default ``medrt.engine.cache.cache_dir("bench")``) and
    reused: 1,200 slices take minutes to generate. Written beside its final name and then
    renamed, so an interrupted run leaves no half series to be mistaken for a whole one."""
    from medrt.phantom import write_ct_series
    from medrt.phantom.truth import TRUTH_JSON

    if cache is None:
        from medrt.engine.cache import cache_dir

        cache = cache_dir("bench")
    folder = Path(cache) / f"ct_seed{seed}_{frames}x512_rle"
    if (folder / TRUTH_JSON).is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    part = Path(tempfile.mkdtemp(prefix=folder.name + ".part-", dir=folder.parent))
    try:
        log.info("bench: writing a %d-slice CT phantom (seed %d) to %s", frames, seed, folder)
        write_ct_series(part, seed, n_frames=frames, size=512, compress="rle")
        if folder.exists():  # a stale, unfinished copy (no ground truth): replaced
            shutil.rmtree(folder)
        os.replace(part, folder)
    finally:
        if part.exists():
            shutil.rmtree(part, ignore_errors=True)
    return folder


def truth_result(frame: Frame, mask: np.ndarray, models: tuple[str, ...] = TRUTH_MODELS) -> FrameResult:
    """What a perfect analyzer returns for ``frame``: the ground-truth ``mask`` as its label
    map, its lesions measured as the analyzer measures its own; ``models`` as the SEG and SR
    name the algorithm. The export, tracking and batch tests build their results with it too."""
    import numpy as np

    from medrt.analysis.lesions import lesions_from_probability
    from medrt.types import FrameResult, StageTimings

    labels, lesions = lesions_from_probability((np.asarray(mask) > 0).astype(np.float32), frame.spacing_mm, 0.5)
    labels.flags.writeable = False
    return FrameResult(frame=frame, lesions=tuple(lesions), labels=labels, presence=1.0, proposals=(), crops=(),
                       mode="full", timings=StageTimings(), backend="truth", precision="fp32", models=models)


def _results(folder: Path) -> tuple[Any, list[tuple[Any, str]]]:
    """The series' plan and each slice's result, without its pixels (as a series holds them
    until its last frame), with the file it came from."""
    from medrt.batch.outputs import strip_pixels
    from medrt.batch.plan import scan
    from medrt.io.dicom import read_frames
    from medrt.phantom import load_ground_truth

    plan = scan(folder)
    if len(plan.series) != 1:
        raise RuntimeError(f"bench: {folder} holds {len(plan.series)} series, not the one phantom series")
    (sp,) = plan.series
    truth = load_ground_truth(folder)
    out = []
    for path in sp.paths:
        for frame in read_frames(path):
            out.append((strip_pixels(truth_result(frame, truth[frame.sop_instance_uid].mask)), str(path)))
    return sp, out


def _fresh(result: Any) -> Any:
    """``result`` with a new copy of its header as the pipeline leaves it (raw elements
    stay raw), so that what one run parses is parsed again by the next, as in a series."""
    from medrt.io.dicom import _header_only

    frame = result.frame
    source = dataclasses.replace(frame.source, dataset=_header_only(frame.source.dataset))
    return dataclasses.replace(result, frame=dataclasses.replace(frame, source=source))


def _status_mb(field: str) -> float | None:
    """``field`` (VmRSS, VmHWM) of this process in MB, from /proc (None elsewhere)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fp:
            for line in fp:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _reset_peak_rss() -> float | None:
    """This process's resident MB now, its peak (VmHWM) reset to it (Linux 4.0+: "5" to
    /proc/self/clear_refs); None where the peak cannot be reset, so none is reported."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fp:
            fp.write("5")
    except OSError:
        return None
    return _status_mb("VmRSS")


def _finish(sp: Any, results: list[tuple[Any, str]], folder: Path, *, trace: bool = False,
            ) -> tuple[dict[str, Any], dict[str, float], float, float | None]:
    """One series' outputs written into ``folder``: its manifest, the seconds per stage, the
    seconds of the whole :meth:`SeriesOutput.finish`, and how far it raised the memory in
    MB: with ``trace`` the peak of the bytes it allocated (tracemalloc, started just before
    it, so the results are not counted; pages never touched count too), else the rise of
    the resident set's peak over what was resident before it (None off Linux)."""
    from medrt.batch.outputs import OutputOptions, SeriesOutput

    out = SeriesOutput(sp, folder, "bench", OutputOptions(png="none"), sp.paths[0].parent)
    out.start()
    for result, origin in results:
        out.add(_fresh(result), origin)
    peak: float | None = None
    if trace:
        tracemalloc.start()
    rss = None if trace else _reset_peak_rss()
    try:
        t0 = time.perf_counter()
        manifest = out.finish()
        total = time.perf_counter() - t0
        if trace:
            peak = tracemalloc.get_traced_memory()[1] / 1e6
        elif rss is not None and (hwm := _status_mb("VmHWM")) is not None:
            peak = hwm - rss
    finally:
        if trace:
            tracemalloc.stop()
    if manifest["notes"]:
        raise RuntimeError(f"bench: the series' outputs failed: {manifest['notes']}")
    return manifest, dict(out.stage_s), total, peak


def series_outputs(frames: int = 300, repeats: int = 3, cache: Path | None = None,
                   keep: Path | None = None) -> dict[str, Any]:
    """Median seconds per stage of a ``frames``-slice CT series' outputs over ``repeats``
    runs (in ms, as ``medrt bench --compare`` reads timings), and the step's peak memory
    (traced, and the resident set's rise: the larger over the repeats); see the module's
    docstring. ``keep``: write the last run's outputs there (a
    test reads its SEG and SR back)."""
    folder = phantom_series(frames, cache=cache)
    sp, results = _results(folder)
    stages: dict[str, list[float]] = {k: [] for k in ("link", "seg", "sr", "write", "total")}
    rss: list[float] = []
    with tempfile.TemporaryDirectory(prefix="medrt-bench-outputs-") as tmp:
        out_dir = Path(tmp) / "series"
        _finish(sp, results, out_dir)  # warm-up: highdicom's and pydicom's first use
        for _ in range(max(1, repeats)):
            _, stage_s, total, rise = _finish(sp, results, out_dir)
            if rise is not None:
                rss.append(rise)
            for k in ("link", "seg", "sr", "write"):
                stages[k].append(stage_s.get(k, 0.0))
            stages["total"].append(total)
        manifest, _, _, peak = _finish(sp, results, out_dir, trace=True)
        if keep is not None:
            shutil.copytree(out_dir, keep, dirs_exist_ok=True)
    med = statistics.median
    return {
        "frames": len(results),
        "frames_with_lesions": sum(1 for r, _ in results if r.lesions),
        "series_lesions": manifest["series_lesions"],
        **{f"{k}_ms": round(1000 * med(v), 1) for k, v in stages.items()},
        "peak_mb": round(peak or 0.0, 1),
        "peak_rss_mb": round(max(rss), 1) if rss else None,
        "repeats": max(1, repeats),
    }
