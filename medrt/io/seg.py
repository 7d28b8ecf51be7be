"""DICOM SEG objects read back into label maps, one per source frame (highdicom).

Any SEG, medrt's (``OUT/series/<uid>/seg.dcm``) or another tool's: the viewer lays it over
its images (``medrt view --seg``) and ``medrt eval`` scores it against ground truth.
Each map is keyed like :attr:`medrt.types.Frame.key` (the source SOPInstanceUID, or
``UID#index`` for a frame of a multi-frame source). Every image the SEG names as a source
gets a map, so frames a SEG left out (no segment on them) read as empty, as DICOM means.
A multi-frame source is named as a whole, but the SEG does not say how many frames it has:
given that (``source_frames``, as ``medrt eval`` takes it from the ground truth), each of its
frames gets a map too; without it, only the frames the SEG holds a segment on do.

Segments may overlap in another tool's SEG (a "Lung" segment around "Nodule" ones), which
highdicom's ``combine_segments`` refuses: the map holds, per pixel, the highest segment
number set there, and ``segments`` chooses which count (by number or label).

Each segment's Recommended Display CIELab Value (medrt writes its overlay's colour for the
lesion there; dcmqi, OHIF and Slicer write theirs) is read as sRGB into ``colors``, so a
viewer shows every segment in the colour its author chose.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from medrt.io.header import dicom_values
from medrt.privacy import describe_exception

__all__ = ["SegMasks", "read_seg", "SEG_SOP_CLASSES"]

log = logging.getLogger(__name__)

#: Segmentation Storage and Label Map Segmentation Storage.
SEG_SOP_CLASSES = ("1.2.840.10008.5.1.4.1.1.66.4", "1.2.840.10008.5.1.4.1.1.66.7")


@dataclass(frozen=True, slots=True)
class SegMasks:
    """The label maps of one SEG: ``{frame key: uint16 (rows, cols)}``, 0 = background,
    k = segment k. ``labels`` names every segment of the SEG, in segment-number order;
    ``segments`` are the numbers the maps hold; ``colors`` the sRGB colour the SEG recommends
    for each segment that names one (segment number → ``(r, g, b)``)."""

    path: Path
    masks: dict[str, np.ndarray]
    labels: tuple[str, ...]
    series_instance_uid: str
    segments: tuple[int, ...] = ()
    colors: dict[int, tuple[int, int, int]] = field(default_factory=dict)

    def label_of(self, number: int) -> str:
        """Segment ``number``'s label (``"segment N"`` when the SEG has no such number)."""
        i = number - 1
        return self.labels[i] if 0 <= i < len(self.labels) else f"segment {number}"


def _chosen(seg: object, wanted: Sequence[int | str] | None, path: Path) -> tuple[int, ...]:
    """The segment numbers ``wanted`` names (numbers, or labels, case-insensitive); all by default."""
    described = {int(d.SegmentNumber): str(d.SegmentLabel) for d in seg.SegmentSequence}  # type: ignore[attr-defined]
    if not wanted:
        return tuple(sorted(described))
    by_label = {label.casefold(): n for n, label in described.items()}
    chosen = []
    for w in wanted:
        n = int(w) if isinstance(w, int) or str(w).isdigit() else by_label.get(str(w).casefold())
        if n not in described:
            names = ", ".join(f"{k} {v!r}" for k, v in sorted(described.items()))
            raise ValueError(f"{path.name}: no segment {w!r} (it has {names})")
        chosen.append(n)
    return tuple(sorted(set(chosen)))  # type: ignore[arg-type]


def _colors(seg: object, path: Path) -> dict[int, tuple[int, int, int]]:
    """Each segment's Recommended Display CIELab Value as sRGB (highdicom's conversion, clipped
    to the sRGB gamut); a segment without one, or with a malformed one, is left out."""
    import highdicom as hd

    out: dict[int, tuple[int, int, int]] = {}
    for d in seg.SegmentSequence:  # type: ignore[attr-defined]
        value = d.get("RecommendedDisplayCIELabValue")
        if value is None:
            continue
        try:
            rgb = hd.color.CIELabColor.from_dicom_value([int(v) for v in value]).to_rgb(clip=True)
        except (TypeError, ValueError) as exc:
            log.warning("%s: segment %s has an unusable Recommended Display CIELab Value %s (%s); "
                        "shown in the default colour", path.name, d.SegmentNumber, list(value), exc)
            continue
        out[int(d.SegmentNumber)] = (int(round(rgb[0])), int(round(rgb[1])), int(round(rgb[2])))
    return out


def _label_map(stack: np.ndarray, numbers: tuple[int, ...]) -> np.ndarray:
    """(rows, cols, segments) bits → the highest segment number set at each pixel."""
    out = np.zeros(stack.shape[:2], np.uint16)
    for i, n in enumerate(numbers):  # ascending: a later (higher) segment wins where they overlap
        out[stack[:, :, i] > 0] = n
    return out


def read_seg(path: str | os.PathLike[str], segments: Sequence[int | str] | None = None,
             source_frames: Mapping[str, int] | None = None) -> SegMasks:
    """Read a DICOM SEG into per-frame label maps of ``segments`` (numbers or labels; every
    segment by default). ``source_frames`` gives the number of frames of multi-frame source
    images (by SOPInstanceUID) where the caller knows it: every frame of such a source the SEG
    names gets a map, empty where the SEG left the frame out. Raises ValueError naming the
    file when it is not a SEG highdicom can read, names no segment asked for, or refers to
    no image frame."""
    import highdicom as hd  # only when a SEG is read

    path = Path(path)
    try:
        seg = hd.seg.segread(path)
    except Exception as exc:  # pydicom / highdicom raise many kinds for a bad file
        raise ValueError(f"{path.name}: not a readable DICOM SEG ({describe_exception(exc)})") from exc
    labels = tuple(str(d.SegmentLabel) for d in sorted(seg.SegmentSequence, key=lambda d: int(d.SegmentNumber)))
    numbers = _chosen(seg, segments, path)
    masks: dict[str, np.ndarray] = {}
    frames_of = source_frames or {}
    for _, _, uid in seg.get_source_image_uids():
        n_frames = int(frames_of.get(uid, 1))
        if n_frames > 1:  # a multi-frame source, named as a whole: each of its frames
            masks.update(_by_frames(seg, uid, numbers, n_frames))
            continue
        try:
            px = seg.get_pixels_by_source_instance([uid], segment_numbers=list(numbers), combine_segments=False,
                                                   assert_missing_frames_are_empty=True)
            masks[uid] = _label_map(px[0], numbers)
        except (ValueError, KeyError, RuntimeError) as exc:
            log.debug("%s: no per-instance frames for %s (%s); trying per frame", path.name, uid, exc)
            masks.update(_by_frames(seg, uid, numbers))
    if not masks:
        raise ValueError(f"{path.name}: the SEG refers to no image frames it can be shown on")
    log.info("read SEG %s: %d frame(s), segments %s", path.name, len(masks), list(numbers))
    return SegMasks(path, masks, labels, str(seg.SeriesInstanceUID), numbers, _colors(seg, path))


def _by_frames(seg: object, uid: str, numbers: tuple[int, ...], n_frames: int = 0) -> dict[str, np.ndarray]:
    """A multi-frame source: one label map per referenced frame, keyed ``uid#index``, and an
    empty one for each other frame of its ``n_frames`` (when known), which the SEG left out."""
    found = sorted({int(n) for item in seg.PerFrameFunctionalGroupsSequence  # type: ignore[attr-defined]
                    for d in item.get("DerivationImageSequence", [])
                    for s in d.get("SourceImageSequence", [])
                    if str(s.ReferencedSOPInstanceUID) == uid
                    for n in dicom_values(s.get("ReferencedFrameNumber"))})
    out: dict[str, np.ndarray] = {}
    if found:
        px = seg.get_pixels_by_source_frame(uid, found, segment_numbers=list(numbers),  # type: ignore[attr-defined]
                                            combine_segments=False, assert_missing_frames_are_empty=True)
        out = {f"{uid}#{n - 1}": _label_map(stack, numbers) for n, stack in zip(found, px, strict=True)}
    shape = (int(seg.Rows), int(seg.Columns))  # type: ignore[attr-defined]
    for i in range(n_frames):
        out.setdefault(f"{uid}#{i}", np.zeros(shape, np.uint16))
    return out
