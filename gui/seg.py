"""DICOM SEG objects shown next to their source images (no Qt here).

A SEG written earlier (``medrt batch DIR --out OUT`` puts one per series in
``OUT/series/<uid>/seg.dcm``), or another tool's, is read by
:func:`medrt.io.seg.read_seg` into one label map per source frame, keyed like
:attr:`medrt.types.Frame.key`. The viewer draws it with
:func:`medrt.overlay.overlay_rgba`, the same code that draws the AI overlay, each
segment in the colour the SEG recommends for it (its Recommended Display CIELab Value,
as OHIF and Slicer show it); a segment that names none is drawn magenta, a colour the
AI palette does not use. medrt's own SEG recommends the AI overlay's colour for each
lesion, so its lesions look alike in both layers; the SEG layer's check box (and ``g``
for both) tells them apart.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from medrt.io.seg import SegMasks, read_seg
from medrt.overlay import overlay_rgba
from medrt.types import Frame, FrameResult, StageTimings

__all__ = ["SegMasks", "read_seg", "seg_overlay", "segments_on", "SEG_COLOR"]

#: The colour of a segment whose SEG recommends none (magenta: none of the AI palette's).
SEG_COLOR = (255, 0, 255)


def seg_overlay(frame: Frame, labels: np.ndarray,
                colors: Mapping[int, tuple[int, int, int]] | None = None) -> np.ndarray:
    """The SEG layer of ``frame``: :func:`medrt.overlay.overlay_rgba` of ``labels`` (fill and
    outline at the cornerstone alphas), segment ``n`` in ``colors[n]``, or :data:`SEG_COLOR`
    where ``colors`` has none. Raises ValueError when the SEG frame's size differs from the
    image's."""
    if labels.shape != frame.shape:
        raise ValueError(f"SEG frame is {labels.shape[1]}×{labels.shape[0]}, the image {frame.cols}×{frame.rows}")
    chosen = dict(colors or {})
    as_result = FrameResult(frame=frame, lesions=(), labels=labels, presence=1.0, proposals=(), crops=(),
                            mode="seg", timings=StageTimings(), backend="DICOM SEG", precision="", models=())
    return overlay_rgba(as_result, colors=lambda n: chosen.get(n, SEG_COLOR))


def segments_on(labels: np.ndarray) -> tuple[int, ...]:
    """The segment numbers a label map shows, ascending (one counting pass, not a sort:
    a 4096² radiograph's map takes milliseconds)."""
    counts = np.bincount(labels.ravel())
    return tuple(int(n) for n in np.flatnonzero(counts[1:]) + 1)
