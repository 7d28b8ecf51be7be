"""DICOM SEG objects shown next to their source images (no Qt here).

A SEG written earlier (``medrt batch DIR --out OUT`` puts one per series in
``OUT/series/<uid>/seg.dcm``), or another tool's, is read by
:func:`medrt.io.seg.read_seg` into one label map per source frame, keyed like
:attr:`medrt.types.Frame.key`. The viewer draws it with
:func:`medrt.overlay.overlay_rgba`, the same code that draws the AI overlay, tinted
one colour so the two can be told apart.
"""

from __future__ import annotations

import numpy as np

from medrt.io.seg import SegMasks, read_seg
from medrt.overlay import overlay_rgba
from medrt.types import Frame, FrameResult, StageTimings

__all__ = ["SegMasks", "read_seg", "seg_overlay", "SEG_COLOR"]

#: The SEG layer's colour (magenta: none of the AI palette's first colours).
SEG_COLOR = (255, 0, 255)


def seg_overlay(frame: Frame, labels: np.ndarray, color: tuple[int, int, int] = SEG_COLOR) -> np.ndarray:
    """The SEG layer of ``frame``: :func:`medrt.overlay.overlay_rgba` of ``labels`` (fill and
    outline at the cornerstone alphas) in one colour. Raises ValueError when the SEG frame's
    size differs from the image's."""
    if labels.shape != frame.shape:
        raise ValueError(f"SEG frame is {labels.shape[1]}×{labels.shape[0]}, the image {frame.cols}×{frame.rows}")
    as_result = FrameResult(frame=frame, lesions=(), labels=labels, presence=1.0, proposals=(), crops=(),
                            mode="seg", timings=StageTimings(), backend="DICOM SEG", precision="", models=())
    rgba = overlay_rgba(as_result)
    rgba[rgba[:, :, 3] > 0, :3] = color
    return rgba
