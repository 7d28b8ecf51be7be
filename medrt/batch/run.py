"""``run_batch``: a folder in, per-series SEG/SR/PNG, results.jsonl, errors.csv and a run report out.

The batch is the pipeline with the ``block`` policy (nothing is ever dropped),
fed series by series. A series is the unit of completion: its outputs appear
together when its last frame is done, and a rerun skips every series whose
manifest records the same content hash and settings. Top-level files are
rebuilt from the finished series at the end, atomically, also after Ctrl-C; a
Ctrl-C or SIGTERM while they and the report are written is held off until they are
(:mod:`medrt.batch.interrupts`), and the run then ends as interrupted.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from medrt import __version__
from medrt.batch.interrupts import DeferredInterrupts
from medrt.batch.outputs import LESIONS_JSON, SEG_COVERAGE, OutputOptions, SeriesOutput
from medrt.batch.plan import (
    Note,
    Plan,
    SeriesPlan,
    finished,
    relative,
    scan,
    series_notes,
    settings_key,
)
from medrt.errors import NoModelForImageError
from medrt.export.write import atomic_write
from medrt.io.series import slice_order
from medrt.types import SpacingSource

__all__ = ["BatchConfig", "BatchSummary", "run_batch", "EXIT_OK", "EXIT_ERRORS", "EXIT_FAILED", "EXIT_INTERRUPTED"]

log = logging.getLogger(__name__)

EXIT_OK = 0  # every image analysed (files that are not images may have been skipped)
EXIT_ERRORS = 1  # completed, but some inputs could not be analysed: see errors.csv
EXIT_FAILED = 2  # nothing analysed: no input, no DICOM image in it, or the models could not load
EXIT_INTERRUPTED = 130

RESULTS = "results.jsonl"
LESIONS_CSV = "lesions.csv"
LESION_COLUMNS = ["series_instance_uid", "modality", "lesion", "slices", "diameter_mm", "diameter_px", "volume_mm3",
                  "score", "largest_sop_instance_uid", "largest_frame_index", "largest_id", "first_sop_instance_uid",
                  "last_sop_instance_uid", "tracking_uid", "diameter_unit", "acquisition"]
ERRORS = "errors.csv"
MASKS = "masks.npz"
REPORT_JSON = "report.json"
REPORT_MD = "report.md"
HISTOGRAM = "latency.png"
# Bumped when what a series folder holds changes, so a rerun redoes series an older medrt
# finished (2: lesions.json, series_lesion in frames.jsonl, SR lesions counted once;
# 3: a SEG segment per lesion; 4: lesions.csv's diameter_unit and acquisition, sizes of
# frames without a pixel spacing as area_px/diameter_px, a SEG per acquisition pass and the
# SR's image regions as outlines).
OUTPUT_LAYOUT = 4


@dataclass(frozen=True)
class BatchConfig:
    input: Path
    out: Path
    analyzer: Any = None  # AnalyzerConfig; None: the defaults
    workers: int = 1
    decode_workers: int = 1
    decode_processes: int = 0  # > 0: decode in worker processes (codecs that hold the GIL)
    processes: int = 0  # > 0: decode and analyse in worker processes (medrt.pipeline.stages.ProcessAnalysis)
    depth: int | None = None  # queue capacity; None: from measured stage times
    outputs: OutputOptions = field(default_factory=OutputOptions)
    follow_links: bool = False


@dataclass
class BatchSummary:
    exit_code: int
    files_seen: int = 0
    series: int = 0
    series_resumed: int = 0
    series_analysed: int = 0
    frames: int = 0
    frames_with_lesions: int = 0
    lesions: int = 0  # lesion sections: a CT lesion counts once per slice it shows on
    series_lesions: int = 0  # each lesion once (its sections on neighbouring slices joined)
    errors: int = 0
    skipped: int = 0
    interrupted: bool = False
    # the signal ("SIGTERM", "SIGINT") that arrived while the results and report were
    # written: they were finished first, and exit_code is EXIT_INTERRUPTED
    stopped_while_writing: str | None = None
    elapsed_s: float = 0.0
    out: Path | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)  # per series, for the CLI table
    unwritten: dict[str, str] = field(default_factory=dict)  # series UID -> why its outputs could not be written
    report: dict[str, Any] = field(default_factory=dict)


class _Sink:
    """Routes results to their series (by the file they came from) and finishes a series
    as soon as its last frame is in. Runs on the pipeline's sink thread."""

    def __init__(self, outputs: dict[str, SeriesOutput], progress: Callable[[int, int], None] | None,
                 total: int) -> None:
        self.by_path = outputs
        self.progress = progress
        self.total = total
        self.done = 0
        self.started: set[int] = set()
        self.finished: dict[str, dict[str, Any]] = {}
        # series whose outputs could not be written (a full disk, a folder gone): never
        # finished, so no manifest says they were; a rerun (the listener's retry) redoes them
        self.unwritten: dict[str, str] = {}
        self.lock = threading.Lock()

    def _series(self, origin: str) -> SeriesOutput:
        so = self.by_path[origin]
        if id(so) not in self.started:
            self.started.add(id(so))
            self._writing(so, so.start)
        return so

    def _writing(self, so: SeriesOutput, write: Callable[[], Any]) -> Any:
        """``write()`` for a series still being written; an OSError gives the series up."""
        if so.plan.uid in self.unwritten:
            return None
        try:
            return write()
        except OSError as exc:
            from medrt.privacy import describe_exception

            self.unwritten[so.plan.uid] = describe_exception(exc)
            log.error("batch: series %s: its outputs cannot be written (%s); it is not finished",
                      so.plan.uid, self.unwritten[so.plan.uid])
            return None

    def _advance(self, so: SeriesOutput, frames: int) -> None:
        self.done += frames
        if self.progress is not None:
            self.progress(self.done, self.total)
        if so.complete:
            self.finish(so)

    def finish(self, so: SeriesOutput) -> None:
        """Write a series' outputs, once, unless they could not be written before."""
        uid = so.plan.uid
        if uid not in self.finished and uid not in self.unwritten:
            manifest = self._writing(so, so.finish)
            if manifest is not None:
                self.finished[uid] = manifest

    def on_result(self, result: Any, env: Any) -> None:
        so = self._series(env.origin)
        self._writing(so, lambda: so.add(result, env.origin))
        if so.plan.uid in self.unwritten:  # not kept (add failed, or was not tried): counted
            so.count_done(env.origin)
        self._advance(so, 1)

    def on_error(self, error: Any, env: Any) -> None:
        so = self._series(env.origin)
        before = so.done_paths.get(env.origin, 0)
        whole = env.key == env.origin  # failed before the file fanned out into frames
        so.fail(env.origin, error.stage, error.reason, error.skippable, whole_file=whole,
                sop_instance_uid="" if whole else env.key)
        self._advance(so, max(0, so.plan.frames.get(env.origin, 1) - before))


def _settings(analyzer: Any, options: OutputOptions) -> dict[str, Any]:
    return {
        "medrt": __version__,
        "models": [f"{b.spec.ident}:{b.spec.sha256}" for b in (*analyzer.rois, *analyzer.segs)],
        "mode": analyzer.config.mode, "recheck": analyzer.config.recheck,
        "backend": analyzer.backend_name, "precision": analyzer.precision,
        "threshold": [analyzer.threshold_for(s) for s in analyzer.segs], "crop": analyzer.config.crop,
        "outputs": {"png": options.png, "png_max_side": options.png_max_side, "sc": options.sc,
                    "seg": options.seg, "sr": options.sr, "omit_empty_frames": options.omit_empty_frames,
                    "seg_compression": options.seg_compression, "layout": OUTPUT_LAYOUT},
    }


def run_batch(config: BatchConfig, *, analyzer: Any = None,
              progress: Callable[[int, int], None] | None = None,
              stop: threading.Event | None = None) -> BatchSummary:
    """Analyse every DICOM image under ``config.input`` into ``config.out``.

    ``analyzer`` may be one already loaded (else it is loaded from ``config.analyzer``);
    ``progress(done_frames, total_frames)`` is called from the sink thread; setting
    ``stop`` (or Ctrl-C) ends the run at once, keeping every finished series (the
    unfinished one is redone by the next run). A Ctrl-C or SIGTERM once the frames are
    done waits until the results and report are written, then sets
    ``stopped_while_writing`` and exit code :data:`EXIT_INTERRUPTED`.
    """
    from medrt.io.sources import FileReplay
    from medrt.pipeline.graph import Pipeline
    from medrt.pipeline.stages import analysis_stages

    t0 = time.perf_counter()
    out, plan = _open(config)
    if analyzer is None:
        from medrt.analyzer import load_analyzer

        analyzer = load_analyzer(config.analyzer)
    settings = _settings(analyzer, config.outputs)
    key = settings_key(settings)
    series_dir = out / "series"
    plan.series, passed_over = _for_these_models(plan, analyzer)
    plan.notes.extend(passed_over)
    pending = _unfinished(plan, series_dir, key)
    resumed = len(plan.series) - len(pending)
    log.info("batch: %d series, %d already finished, %d to analyse; %d note(s) from the scan",
             len(plan.series), resumed, len(pending), len(plan.notes))
    outputs: dict[str, SeriesOutput] = {}
    for sp in pending:
        so = SeriesOutput(sp, series_dir / sp.folder_name, key, config.outputs, plan.root)
        for p in sp.paths:
            outputs[str(p)] = so
    total = sum(sp.n_frames for sp in pending)
    sink = _Sink(outputs, progress, total)
    interrupted = False
    telemetry = None
    if pending:
        paths = [p for sp in pending for p in sp.paths]
        stages = analysis_stages(analyzer, infer_workers=config.workers, decode_workers=config.decode_workers,
                                 decode_processes=config.decode_processes, processes=config.processes,
                                 order=slice_order(sp.series for sp in pending))  # a 2.5-D model's neighbours
        pipe = Pipeline(FileReplay(paths, fps=0), stages, [sink], policy="block", depth=config.depth,
                        telemetry=True, name="batch")
        telemetry = pipe.telemetry
        pipe.start()
        try:
            while not pipe.join(0.2):
                if stop is not None and stop.is_set():
                    interrupted = True
                    pipe.abort()
                    break
        except KeyboardInterrupt:
            interrupted = True
            log.warning("batch: interrupted; finished series are kept, a rerun does the rest")
            pipe.abort()
    with DeferredInterrupts() as held:  # an interrupt now would cost the report: noted, acted on after it
        if not interrupted:  # a series whose frame count surprised us still gets its outputs
            for so in {id(s): s for s in outputs.values()}.values():
                uid = so.plan.uid
                if id(so) in sink.started and uid not in sink.finished and uid not in sink.unwritten:
                    so.notes.append(Note(so.rel(str(so.plan.paths[0])), "error", "batch",
                                         "fewer frames decoded than the headers announced"))
                    sink.finish(so)
        for sp in pending:
            if sp.uid in sink.unwritten:
                plan.notes.append(Note(relative(min(sp.paths), plan.root) if sp.paths else sp.uid, "error", "write",
                                       f"the series' outputs could not be written ({sink.unwritten[sp.uid]}); "
                                       "it is not finished, and the next run analyses it again"))
        summary = _assemble(plan, out, series_dir, key, interrupted, time.perf_counter() - t0)
        summary.unwritten = dict(sink.unwritten)
        summary.series_resumed = resumed
        summary.series_analysed = len(sink.finished)

        def report() -> dict[str, Any]:
            return _report(summary, plan, settings, analyzer, telemetry, out)

        summary.report = report()
        stop_after_writing(summary, held, report)
    stop_after_writing(summary, held, report)  # one that came in between
    return summary


def stop_after_writing(summary: BatchSummary, held: DeferredInterrupts,
                       rewrite: Callable[[], dict[str, Any]]) -> None:
    """End the run as interrupted when a signal was held off while its results and report
    were written (they are complete; the report says how far the run got), and write the
    report once more (``rewrite``, atomically) so that its ``exit_code`` is the process's,
    130, with ``stopped_while_writing`` naming the signal: a script that reads report.json
    saw 0 from a run that exited 130. Called inside the :class:`DeferredInterrupts` block
    after the report, and once more after it for a signal that came in between (then
    unguarded: another signal leaves the complete first report)."""
    if held.received is None or summary.stopped_while_writing is not None:
        return
    log.warning("batch: %s while the results and report were written; they are complete, and the run ends "
                "as interrupted", held.received)
    summary.stopped_while_writing = held.received
    summary.exit_code = EXIT_INTERRUPTED
    summary.report = rewrite()


def _open(config: BatchConfig) -> tuple[Path, Plan]:
    """The output folder (made; temporaries of a run killed mid-write removed) and the plan
    of the input: a run's first steps, local or on Ray (medrt.distributed)."""
    root, out = Path(config.input), Path(config.out)
    if not root.exists():
        raise FileNotFoundError(f"{root}: no such file or folder")
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob(".*.tmp"):
        stale.unlink(missing_ok=True)
    return out, scan(root, exclude=out, follow_links=config.follow_links)


def _unfinished(plan: Plan, series_dir: Path, key: str) -> list[SeriesPlan]:
    """The series no earlier run finished with this content and these settings (``key``)."""
    return [sp for sp in plan.series if finished(series_dir / sp.folder_name, sp, key) is None]


def _for_these_models(plan: Plan, analyzer: Any) -> tuple[list[SeriesPlan], list[Note]]:
    """The series the analyzer has models for, and a "skipped" note for each file of the
    others (e.g. MR or ultrasound with the CT and radiograph models, a CT localizer series,
    a knee radiograph, a coronal reformat), before any is decoded. A series whose images differ in Image Type,
    body part, view or plane is analysed, and the analyzer refuses its images that no model is
    for one by one."""
    keep: list[SeriesPlan] = []
    notes: list[Note] = []
    for sp in plan.series:
        reason = analyzer.refusal(sp.series.modality, sop_class_uid=sp.series.sop_class_uid,
                                  image_type=sp.series.image_type, body_part=sp.series.body_part,
                                  view=sp.series.view, plane=sp.series.plane)
        if reason is None:
            keep.append(sp)
            continue
        notes.extend(series_notes(sp, plan.root, "skipped", "plan", f"{NoModelForImageError.kind}: {reason}"))
    if notes:
        log.info("batch: %d file(s) passed over: no model for their modality", len(notes))
    return keep, notes


def _assemble(plan: Plan, out: Path, series_dir: Path, key: str, interrupted: bool, elapsed: float) -> BatchSummary:
    """Rebuild results.jsonl, masks.npz and errors.csv from every finished series (in plan order)."""
    lines: list[str] = []
    notes: list[Note] = list(plan.notes)
    masks: dict[str, np.ndarray] = {}
    rows: list[dict[str, Any]] = []
    s = BatchSummary(exit_code=EXIT_OK, files_seen=plan.files_seen, series=len(plan.series), out=out,
                     interrupted=interrupted)
    for sp in plan.series:
        folder = series_dir / sp.folder_name
        manifest = finished(folder, sp, key)
        if manifest is None:
            continue
        text = (folder / "frames.jsonl").read_text(encoding="utf-8")
        lines.append(text)
        recs = [json.loads(line) for line in text.splitlines() if line.strip()]
        s.frames += len(recs)
        s.frames_with_lesions += sum(1 for r in recs if r["lesions"])
        s.lesions += sum(len(r["lesions"]) for r in recs)
        own = [Note(**n) for n in manifest.get("notes", [])]
        notes.extend(own)
        if (folder / MASKS).is_file():
            with np.load(folder / MASKS) as npz:
                masks.update({k: npz[k] for k in npz.files})
        linked = folder / LESIONS_JSON  # absent only when linking failed (errors.csv says so)
        found = json.loads(linked.read_text(encoding="utf-8"))["lesions"] if linked.is_file() else []
        s.series_lesions += len(found)
        units = _diameter_units(recs, found)
        rows.extend({"series_instance_uid": sp.uid, "modality": sp.series.modality, **_lesion_row(f),
                     "diameter_unit": u} for f, u in zip(found, units, strict=True))
        sizes = sorted(((round(f["diameter_mm"] if f["diameter_mm"] is not None else f["diameter_px"], 1), u)
                        for f, u in zip(found, units, strict=True)), key=lambda d: -d[0])
        shared = set(units)
        s.findings.append({"series_instance_uid": sp.uid, "modality": sp.series.modality,
                           "frames": len(recs), "lesions": len(found),
                           # several whole acquisitions at the same slice positions (a pre- and a
                           # post-contrast pass): each analysed as a stack, and its lesions
                           # counted per acquisition, so one seen in both passes is not read
                           # as two lesions of one scan
                           "acquisitions": sp.series.acquisitions,
                           "lesions_by_acquisition": _by_acquisition(sp, found),
                           "sections": sum(len(r["lesions"]) for r in recs),
                           # each lesion's longest diameter and its unit; diameters_mm and
                           # diameter_unit say the same where the series' lesions share one
                           "diameters": [list(d) for d in sizes],
                           "diameters_mm": [d for d, _ in sizes],
                           "diameter_unit": shared.pop() if len(shared) == 1 else ("mixed" if shared else
                                                                                 _diameter_unit(recs)),
                           # what was not analysed or not written, so that a series none of
                           # whose images could be read never reads as one with no lesions
                           "failed": sum(1 for n in own if n.kind == "error" and not n.stage.startswith("export-")
                                         and n.stage != SEG_COVERAGE),
                           # images analysed but in no SEG (medrt.export.seg_left_out)
                           "seg_left_out": sum(1 for n in own if n.stage == SEG_COVERAGE),
                           # what a reader of the SEG should know that is no error: a
                           # SliceThickness inferred where the sources leave theirs empty
                           "seg_notes": list(manifest.get("seg_notes", [])),
                           "not_written": sorted({n.stage.removeprefix("export-") for n in own
                                                  if n.kind == "error" and n.stage.startswith("export-")}),
                           "folder": str(folder.relative_to(out)),
                           # the series' first file in INPUT: UIDs that differ only at their
                           # end look alike, a file name is what a reader recognises
                           "first_file": relative(min(sp.paths), plan.root) if sp.paths else ""})
    atomic_write(out / RESULTS, lambda fp: fp.write("".join(lines).encode()))
    table = io.StringIO()
    writer = csv.DictWriter(table, fieldnames=LESION_COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write(out / LESIONS_CSV, lambda fp: fp.write(table.getvalue().encode("utf-8", "backslashreplace")))
    buf = io.BytesIO()
    np.savez_compressed(buf, **masks)
    atomic_write(out / MASKS, lambda fp: fp.write(buf.getvalue()))
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=["file", "kind", "stage", "reason", "sop_instance_uid"])
    writer.writeheader()
    for n in notes:
        writer.writerow(n.as_row())
    atomic_write(out / ERRORS, lambda fp: fp.write(text.getvalue().encode("utf-8", "backslashreplace")))
    s.errors = sum(1 for n in notes if n.kind == "error")
    s.skipped = sum(1 for n in notes if n.kind == "skipped")
    s.elapsed_s = elapsed
    if interrupted:
        s.exit_code = EXIT_INTERRUPTED
    elif not plan.series or not s.frames:  # no image, none that these models are for, or none readable
        s.exit_code = EXIT_FAILED
    elif s.errors:
        s.exit_code = EXIT_ERRORS
    return s


def _by_acquisition(sp: SeriesPlan, found: list[dict[str, Any]]) -> dict[str, int] | None:
    """A series of several acquisitions: its lesions per AcquisitionNumber (as text, a JSON
    key), every acquisition named; None for a series of one."""
    if not sp.series.stacks:
        return None
    counts = {str(n): 0 for n in sp.series.acquisition_numbers}
    for f in found:
        key = str(f.get("acquisition"))
        counts[key] = counts.get(key, 0) + 1
    return counts


def _diameter_unit(recs: list[dict[str, Any]], source: str | None = None) -> str:
    """What a diameter measured at ``source`` (a frame's ``pixel_spacing_source``; default:
    the series' first frame's) is in: "mm" and where it measures
    (:attr:`medrt.types.SpacingSource.qualifier`: "mm at detector" for a radiograph's
    ImagerPixelSpacing, so nobody reads it as a size in the patient)."""
    if source is None and recs:
        source = recs[0].get("pixel_spacing_source")
    try:
        return "mm" + SpacingSource(source).qualifier
    except ValueError:
        return "mm"


def _diameter_units(recs: list[dict[str, Any]], found: list[dict[str, Any]]) -> list[str]:
    """Each lesion's diameter unit: "px" where its frame has no pixel spacing, else that of
    the frame it was measured on (its largest section). One unit per series mislabelled a
    series that mixes them: a slice without PixelSpacing among CT slices with it (pixels
    shown as mm), a radiograph at the detector beside one corrected to the patient."""
    source = {(r["sop_instance_uid"], r["frame_index"]): r.get("pixel_spacing_source") for r in recs}
    out = []
    for f in found:
        if f["diameter_mm"] is None:
            out.append("px")
            continue
        largest = f.get("largest") or {}
        out.append(_diameter_unit(recs, source.get((largest.get("sop_instance_uid"), largest.get("frame_index")))))
    return out


def _lesion_row(entry: dict[str, Any]) -> dict[str, Any]:
    """One row of lesions.csv from an entry of a series' lesions.json."""
    return {"lesion": entry["lesion"], "slices": entry["slices"], "diameter_mm": entry["diameter_mm"],
            "diameter_px": entry["diameter_px"], "volume_mm3": entry["volume_mm3"], "score": entry["score"],
            "largest_sop_instance_uid": entry["largest"]["sop_instance_uid"],
            "largest_frame_index": entry["largest"]["frame_index"], "largest_id": entry["largest"]["id"],
            "first_sop_instance_uid": entry["first"]["sop_instance_uid"],
            "last_sop_instance_uid": entry["last"]["sop_instance_uid"], "tracking_uid": entry["tracking_uid"],
            # the AcquisitionNumber of its stack in a series of several acquisitions, else empty
            "acquisition": entry.get("acquisition")}


def _report(s: BatchSummary, plan: Plan, settings: dict[str, Any], analyzer: Any, telemetry: Any,
            out: Path) -> dict[str, Any]:
    from medrt.batch.report import write_report

    return write_report(s, plan, settings, analyzer, telemetry, out)
