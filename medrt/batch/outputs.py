"""Per-series outputs of a batch run, each file written atomically; the series'
``manifest.json`` goes last, so a folder without it is unfinished and redone.

    OUT/series/<SeriesInstanceUID>/
        seg.dcm            DICOM SEG (absent when no frame holds a lesion; seg_<n>.dcm, one per
                           image, for a radiograph series of several views, and one per pass for a
                           series of several whole acquisitions at the same positions)
        sr.dcm             DICOM SR TID 1500 measurement report
        sc/<n>.dcm         secondary captures with the overlay burned in (--sc)
        png/<n>.png        overlay PNGs (fill + outline, sizes labelled)
        frames.jsonl       this series' lines of results.jsonl
        lesions.json       each lesion once: its sections on neighbouring slices joined (slices,
                           longest diameter and where, volume, and the acquisition it was seen in
                           for a series of several; medrt.analysis.tracking)
        masks.npz          label maps of frames with lesions (for medrt eval's Dice)
        manifest.json      content hash, settings, counts, notes (errors.csv's rows), seg_notes
                           (what a reader of the SEG should know: a SliceThickness inferred)
"""

from __future__ import annotations

import io
import json
import logging
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from medrt.analysis.lesions import lesion_to_json
from medrt.analysis.tracking import Linked, link_series
from medrt.batch.plan import MANIFEST, Note, SeriesPlan
from medrt.export.write import atomic_write, write_dataset
from medrt.privacy import describe_exception
from medrt.types import FrameResult

__all__ = ["frame_record", "SeriesOutput", "OutputOptions", "strip_pixels", "LESIONS_JSON"]

log = logging.getLogger(__name__)

#: errors.csv stage of an image analysed, its lesions in the SR, but left out of the SEG
#: (:func:`medrt.export.seg_left_out`)
SEG_COVERAGE = "seg-coverage"

LESIONS_JSON = "lesions.json"


@dataclass(frozen=True)
class OutputOptions:
    png: str = "positive"  # "positive" | "all" | "none"
    png_max_side: int | None = 2048
    sc: bool = False
    seg: bool = True
    sr: bool = True
    omit_empty_frames: bool | None = None  # None: keep every frame with one lesion, omit with more
    seg_compression: str = "none"  # "none" | "jpeg2000" (medrt.export.SEG_COMPRESSION)


def frame_record(result: FrameResult, file: str) -> dict[str, Any]:
    """One line of results.jsonl (the public schema documented in the README)."""
    frame = result.frame
    t = result.timings
    return {
        "file": file,
        "sop_instance_uid": frame.sop_instance_uid,
        "series_instance_uid": frame.series_instance_uid,
        "frame_index": frame.frame_index,
        "rows": frame.rows,
        "cols": frame.cols,
        "pixel_spacing_mm": list(frame.spacing_mm) if frame.spacing_mm else None,
        "pixel_spacing_source": frame.spacing_source.value,
        "lesions": [lesion_to_json(les, in_mm=frame.spacing_mm is not None) for les in result.lesions],
        "timings_ms": {k: round(getattr(t, k), 2)
                       for k in ("decode", "preprocess", "roi", "segment", "recheck", "postprocess", "total")},
        "mode": result.mode,
        "backend": result.backend,
        "precision": result.precision,
        "models": list(result.models),
    }


def strip_pixels(result: FrameResult) -> FrameResult:
    """What a series keeps of ``result`` until its SEG is written
    (:meth:`FrameResult.without_pixels`): no pixels, and no label map for a frame without
    lesions (1 GB on a 2,000-slice series)."""
    return result.without_pixels()


@dataclass
class SeriesOutput:
    """Collects one series' results as they arrive and writes its outputs when complete."""

    plan: SeriesPlan
    folder: Path
    settings_key: str
    options: OutputOptions
    root: Path
    results: list[FrameResult] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    done_paths: dict[str, int] = field(default_factory=dict)
    previous_sr: Any = None  # the header of a finished earlier run's SR, which the new one replaces
    # what a reader of the SEG should know that is no error (a SliceThickness inferred
    # where the source images leave theirs empty): manifest.json and the report say it
    seg_notes: list[str] = field(default_factory=list)
    # seconds :meth:`finish` spent linking lesions ("link"), building the SEG(s) ("seg") and
    # the SR ("sr"), and writing those ("write"): the tail a series waits for after its
    # last frame (``medrt bench --only series_outputs`` reports them; the log says them)
    stage_s: dict[str, float] = field(default_factory=dict)

    def start(self) -> None:
        """Clear what an interrupted or earlier run may have left (nothing in it is trusted),
        keeping the header of an earlier run's SR: the new SR names it as its predecessor."""
        if self.folder.exists():
            if (self.folder / MANIFEST).is_file():  # finished: its SR may have been sent on
                self.previous_sr = _earlier_sr(self.folder / "sr.dcm")
            shutil.rmtree(self.folder)
        self.folder.mkdir(parents=True)

    def rel(self, path: str) -> str:
        try:
            return Path(path).relative_to(self.root).as_posix()
        except ValueError:
            return path

    def __post_init__(self) -> None:
        self._index = {p: i for i, p in enumerate(self.plan.paths)}
        self._plan: Any = None  # the SEGs' layout (medrt.export.plan_segs), which the SR reuses
        # files still short of the frames their headers announced: kept as a count, so that
        # each result tells in O(1) whether the series is complete (scanning every file per
        # result was O(n²): 2 million look-ups for a 2,000-slice series)
        self._short = sum(1 for p, n in self.plan.frames.items() if self.done_paths.get(p, 0) < n)

    def count_done(self, origin: str, frames: int | None = None) -> None:
        """One more frame of ``origin`` done, or (``frames``) all it holds: the one way
        :attr:`done_paths` changes, so :attr:`complete` stays right."""
        before = self.done_paths.get(origin, 0)
        after = before + 1 if frames is None else frames
        self.done_paths[origin] = after
        expected = self.plan.frames.get(origin)
        if expected is not None:
            self._short += (after < expected) - (before < expected)

    def add(self, result: FrameResult, origin: str) -> None:
        self.records.append(frame_record(result, self.rel(origin)))
        if self.options.png == "all" or (self.options.png == "positive" and result.lesions):
            from medrt.overlay import save_png

            save_png(result, self.folder / "png" / f"{self._frame_name(result)}.png",
                     max_side=self.options.png_max_side)
        self.results.append(strip_pixels(result) if not self.options.sc else result)
        self.count_done(origin)

    def fail(self, origin: str, stage: str, reason: str, skippable: bool = False, *, whole_file: bool = True,
             sop_instance_uid: str = "") -> None:
        """Record a failure: of the whole file (it did not decode) or of one of its frames."""
        self.notes.append(Note(self.rel(origin), "skipped" if skippable else "error", stage, reason, sop_instance_uid))
        self.count_done(origin, self.plan.frames.get(origin, 1) if whole_file else None)

    @property
    def complete(self) -> bool:
        """Every file has given the frames its header announced (done or failed)."""
        return self._short == 0

    def _frame_name(self, result: FrameResult) -> str:
        """``<position in the series>[_f<frame>]``: PHI-free and in slice order."""
        name = f"{self._index.get(result.frame.source.path, 0) + 1:05d}"
        return f"{name}_f{result.frame.frame_index + 1:04d}" if result.frame.number_of_frames > 1 else name

    def finish(self) -> dict[str, Any]:
        """Write SEG, SR, SC, JSON lines, masks and (last) the manifest. Returns the manifest."""
        written: dict[str, Any] = {}
        seg = None
        ok = self.results
        # each lesion once (sections on neighbouring slices joined): the SEG's segments, the
        # SR's tracking identifiers and lesions.json number them alike
        with self._stage("link"):
            linked = self._export("lesions", lambda: link_series(ok)) if ok else None
        if ok and self.options.seg:
            seg = self._export("seg", lambda: self._seg(ok, linked))
            if seg is not None:
                written["seg"] = ["seg.dcm"] if len(seg) == 1 else [f"seg_{i + 1}.dcm" for i in range(len(seg))]
        if ok and self.options.sr:
            sr = self._export("sr", lambda: self._sr(ok, seg, linked))
            if sr is not None:
                written["sr"] = "sr.dcm"
        if ok and self.options.sc:
            n_sc = self._export("sc", lambda: self._sc(ok))
            written["sc"] = n_sc or 0
        self._write_masks(ok)
        series_lesions = (self._export("lesions", lambda: self._link(linked)) or []) if linked is not None else []
        lines = "".join(json.dumps(rec) + "\n" for rec in self.records)
        atomic_write(self.folder / "frames.jsonl", lambda fp: fp.write(lines.encode()))
        manifest = {
            "series_instance_uid": self.plan.uid,
            "study_instance_uid": self.plan.series.study_instance_uid,
            "modality": self.plan.series.modality,
            "content_sha256": self.plan.content_sha256,
            "settings_key": self.settings_key,
            "files": [self.rel(str(p)) for p in self.plan.paths],
            "frames": len(self.records),
            "lesions": sum(len(r["lesions"]) for r in self.records),
            "series_lesions": len(series_lesions),
            "outputs": written,
            "notes": [n.as_row() for n in self.notes],
            "seg_notes": self.seg_notes,
        }
        atomic_write(self.folder / MANIFEST, lambda fp: fp.write(json.dumps(manifest, indent=1).encode()))
        log.debug("series %s outputs: %s", self.plan.uid,
                  ", ".join(f"{k} {v:.3f} s" for k, v in self.stage_s.items()))
        return manifest

    @contextmanager
    def _stage(self, name: str) -> Iterator[None]:
        """Add the time the block takes to :attr:`stage_s` ``[name]``."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.stage_s[name] = self.stage_s.get(name, 0.0) + time.perf_counter() - t0

    def _link(self, linked: Linked) -> list[dict[str, Any]]:
        """Number every lesion record as its series lesion (``series_lesion``) and write
        ``lesions.json``, one entry per lesion."""
        lesions, numbers = linked
        for rec, result in zip(self.records, self.results, strict=True):
            for les_rec, les in zip(rec["lesions"], result.lesions, strict=True):
                les_rec["series_lesion"] = numbers[(result.frame.key, les.label)]
        entries = [les.to_json() for les in lesions]
        doc = {"series_instance_uid": self.plan.uid, "lesions": entries}
        atomic_write(self.folder / LESIONS_JSON, lambda fp: fp.write(json.dumps(doc, indent=1).encode()))
        return entries

    def _export(self, what: str, build: Any) -> Any:
        try:
            return build()
        except OSError:  # the disk, not the object: the series cannot be finished now (no manifest)
            raise
        except Exception as exc:  # an object we cannot build must not lose the rest of the series
            reason = describe_exception(exc)  # a library's message may quote a header value
            log.error("series %s: %s export failed: %s", self.plan.uid, what, reason)
            self.notes.append(Note(self.rel(str(self.plan.paths[0])) if self.plan.paths else self.plan.uid,
                                   "error", f"export-{what}", reason))
            return None

    def _seg(self, results: list[FrameResult], linked: Linked | None) -> Any:
        from medrt.export import build_seg, plan_segs

        # A damaged slice (no ImagePositionPatient...) is left out of the SEG, not the whole
        # series; errors.csv names it where that leaves lesions out (the SR still has them).
        # Laid out once for the SEG(s) and the SR (three walks of every header before).
        with self._stage("seg"):
            self._plan = plan = plan_segs(results)
        left_out = plan.left_out
        for r in results:
            if r.frame.key in left_out and r.lesions:
                self.notes.append(Note(self.rel(str(r.frame.source.path or r.frame.key)), "error", SEG_COVERAGE,
                                       f"its {len(r.lesions)} lesion(s) are in the SR but not in the SEG: "
                                       f"{left_out[r.frame.key]}", r.frame.sop_instance_uid))
        # A radiograph series of several views has no shared geometry: one SEG per image.
        with self._stage("seg"):
            built = [(seg, plan.thickness.get(group[0].frame.sop_instance_uid)) for group in plan.groups
                     if (seg := build_seg(group, linked=linked, omit_empty_frames=self.options.omit_empty_frames,
                                          compression=self.options.seg_compression)) is not None]
        segs = [seg for seg, _ in built]
        for i, (seg, thickness) in enumerate(built):
            name = "seg.dcm" if len(segs) == 1 else f"seg_{i + 1}.dcm"
            with self._stage("write"):
                write_dataset(seg, self.folder / name)
            if thickness is not None:
                self.seg_notes.append(f"{name}: {thickness.note()}")
        return segs or None

    def _sr(self, results: list[FrameResult], seg: Any, linked: Linked | None) -> Any:
        from medrt.export import build_sr

        with self._stage("sr"):
            sr = build_sr(results, seg=seg, linked=linked, plan=self._plan,
                          previous_versions=[self.previous_sr] if self.previous_sr is not None else ())
        with self._stage("write"):
            write_dataset(sr, self.folder / "sr.dcm")
        return sr

    def _sc(self, results: list[FrameResult]) -> int:
        from medrt.export import build_sc

        n = 0
        for r in results:
            if r.lesions:
                write_dataset(build_sc(r), self.folder / "sc" / f"{self._frame_name(r)}.dcm")
                n += 1
        return n

    def _write_masks(self, results: list[FrameResult]) -> None:
        maps = {r.frame.key: np.asarray(r.labels) for r in results if r.lesions}
        if not maps:
            return
        buf = io.BytesIO()
        np.savez_compressed(buf, **maps)
        atomic_write(self.folder / "masks.npz", lambda fp: fp.write(buf.getvalue()))


def _earlier_sr(path: Path) -> Any:
    """The header of the SR at ``path`` (what a Predecessor Documents Sequence needs), or None
    when there is none or it cannot be read (the new SR is then written without it)."""
    if not path.is_file():
        return None
    import pydicom

    try:
        return pydicom.dcmread(path, stop_before_pixels=True)
    except Exception as exc:  # noqa: BLE001 - a damaged earlier SR must not cost the new one
        log.warning("%s: the earlier SR cannot be read (%s); the new one names no predecessor",
                    path, type(exc).__name__)
        return None
