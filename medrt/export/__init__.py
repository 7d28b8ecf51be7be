"""DICOM SEG, SR and SC objects built with highdicom, and atomic writers.

Call sites pass only :class:`medrt.types.FrameResult` objects; the builders know
medrt's device identity, the codes and the references:

- :func:`build_seg` (``medrt.export.seg``): one BINARY Segmentation of a
  series' frames, a segment per lesion ("Lesion <n>", numbered as
  :func:`medrt.analysis.tracking.link_series` numbers the series' lesions);
  None when no frame holds a lesion.
  :func:`split_for_seg` cuts a series into the groups one SEG each can hold
  (e.g. a radiograph series with two views: one SEG per image).
- :func:`build_sr` (``medrt.export.sr``): a TID 1500 Measurement Report
  (Comprehensive 3D SR) with a planar ROI group per lesion section, each on its
  lesion's segment, and a volume group per CT lesion.
- :func:`build_sc` / :func:`build_sc_series` (``medrt.export.sc``): secondary
  captures with the overlay burned in, for viewers that cannot show SEG.
- :func:`write_dataset` / :func:`atomic_write` (``medrt.export.write``).

Typical use for one series (batch or listener)::

    linked = link_series(results)  # each lesion once, numbered alike in SEG and SR
    segs = [s for g in split_for_seg(results) if (s := build_seg(g, linked=linked)) is not None]
    sr = build_sr(results, seg=segs or None, linked=linked)
    for ds in (*segs, sr):
        write_dataset(ds, out / f"{ds.SOPInstanceUID}.dcm")

Bad arguments raise ValueError naming the argument; :class:`ExportError` (a
ValueError and a MedrtError) says a source cannot carry the object asked for
(e.g. a SEG of a multi-frame ultrasound without a Frame of Reference), so the
caller can log it and still write the SR and SCs.

Names are imported on first use, so ``import medrt.export.write`` (which the
overlay's PNG writer uses) does not pull in highdicom.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = [
    "ExportError",
    "build_seg",
    "inferred_slice_thickness",
    "plan_segs",
    "SegPlan",
    "SEG_COMPRESSION",
    "seg_frame_numbers",
    "seg_left_out",
    "segment_numbers",
    "split_for_seg",
    "build_sr",
    "build_sc",
    "build_sc_series",
    "write_dataset",
    "atomic_write",
]

_WHERE = {
    "ExportError": "medrt.export.common",
    "build_seg": "medrt.export.seg",
    "inferred_slice_thickness": "medrt.export.seg",
    "plan_segs": "medrt.export.seg",
    "SegPlan": "medrt.export.seg",
    "SEG_COMPRESSION": "medrt.export.seg",
    "seg_frame_numbers": "medrt.export.seg",
    "seg_left_out": "medrt.export.seg",
    "segment_numbers": "medrt.export.seg",
    "split_for_seg": "medrt.export.seg",
    "build_sr": "medrt.export.sr",
    "build_sc": "medrt.export.sc",
    "build_sc_series": "medrt.export.sc",
    "write_dataset": "medrt.export.write",
    "atomic_write": "medrt.export.write",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'medrt.export' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
