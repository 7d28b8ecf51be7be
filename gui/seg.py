"""DICOM SEG objects shown next to their source images (no Qt here).

A SEG written earlier (``medrt batch DIR --out OUT`` puts one per series in
``OUT/series/<uid>/seg.dcm``) is read with highdicom and turned into one label
map per source frame, keyed like :attr:`medrt.types.Frame.key`. The viewer
draws it with :func:`medrt.overlay.overlay_rgba`, the same code that draws the
AI overlay, tinted one colour so the two can be told apart.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from medrt.overlay import overlay_rgba
from medrt.privacy import describe_exception
from medrt.types import Frame, FrameResult, StageTimings

__all__ = ["SegMasks", "read_seg", "seg_overlay", "SEG_COLOR"]

log = logging.getLogger(__name__)

#: The SEG layer's colour (magenta: none of the AI palette's first colours).
SEG_COLOR = (255, 0, 255)


@dataclass(frozen=True, slots=True)
class SegMasks:
    """The label maps of one SEG: ``{frame key: uint16 (rows, cols)}``, 0 = background,
    k = segment k. ``labels`` names the segments."""

    path: Path
    masks: dict[str, np.ndarray]
    labels: tuple[str, ...]
    series_instance_uid: str


def read_seg(path: str | os.PathLike[str]) -> SegMasks:
    """Read a DICOM SEG into per-frame label maps. Raises ValueError naming the file when it
    is not a SEG highdicom can read."""
    import highdicom as hd  # only when a SEG is opened

    path = Path(path)
    try:
        seg = hd.seg.segread(path)
    except Exception as exc:  # pydicom / highdicom raise many kinds for a bad file
        raise ValueError(f"{path.name}: not a readable DICOM SEG ({describe_exception(exc)})") from exc
    labels = tuple(str(d.SegmentLabel) for d in seg.SegmentSequence)
    masks: dict[str, np.ndarray] = {}
    sources = [uid for _, _, uid in seg.get_source_image_uids()]
    for uid in sources:
        try:
            px = seg.get_pixels_by_source_instance([uid], combine_segments=True,
                                                   assert_missing_frames_are_empty=True)
            masks[uid] = np.ascontiguousarray(px[0]).astype(np.uint16)
        except (ValueError, KeyError, RuntimeError) as exc:
            log.debug("%s: no per-instance frames for %s (%s); trying per frame", path.name, uid, exc)
            masks.update(_by_frames(seg, uid))
    if not masks:
        raise ValueError(f"{path.name}: the SEG refers to no image frames it can be shown on")
    log.info("read SEG %s: %d frame(s), segments %s", path.name, len(masks), labels)
    return SegMasks(path, masks, labels, str(seg.SeriesInstanceUID))


def _by_frames(seg: object, uid: str) -> dict[str, np.ndarray]:
    """A multi-frame source: one label map per referenced frame, keyed ``uid#index``."""
    out: dict[str, np.ndarray] = {}
    numbers = sorted({int(n) for item in seg.PerFrameFunctionalGroupsSequence  # type: ignore[attr-defined]
                      for d in item.get("DerivationImageSequence", [])
                      for s in d.get("SourceImageSequence", [])
                      if str(s.ReferencedSOPInstanceUID) == uid
                      for n in (s.get("ReferencedFrameNumber") or [])})
    if not numbers:
        return out
    px = seg.get_pixels_by_source_frame(uid, numbers, combine_segments=True,  # type: ignore[attr-defined]
                                        assert_missing_frames_are_empty=True)
    for n, mask in zip(numbers, px, strict=True):
        out[f"{uid}#{n - 1}"] = np.ascontiguousarray(mask).astype(np.uint16)
    return out


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
