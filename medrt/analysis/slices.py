"""2.5-D input: a CT slice with the slices before and after it in its series.

On one slice a small lung nodule and a vessel's cross-section, or a small liver
lesion and a bowel loop, look alike; on the neighbouring slices the anatomy goes on
and a 2-5 mm lesion (on 3-5 mm slices) does not. A segmentation model whose spec
says ``[model] slices = 3`` takes the previous, this and the next slice as three
input channels, all normalised by this frame's window; an ROI classifier whose
spec says so takes the three slices' thumbnails likewise.

Which frames are neighbours is checked, not assumed from file order: same series,
same size and pixel spacing, same orientation, and the positions along the slice
normal one step apart (at most :data:`MAX_GAP_MM`). A model whose spec gives
``[model] neighbour_mm`` (the distance of the neighbours it learnt) gets, on each side,
the slice nearest that distance instead (:func:`nearest_at`): on a thin-slice series the
next slice is almost this one. A frame without such a
neighbour (the first or last slice, a lone image, a radiograph, or a listener that
has only this one) gets itself in that place, which is how the model was trained
for those cases (``models/data.py``, ``neighbour_drop``).

A series that holds several whole acquisitions at the same slice positions (a pre- and a
post-contrast pass: :mod:`medrt.io.stacks`) is several stacks: a slice's neighbours are
of its own pass (:func:`frame_stacks`), never the other's slice one step away.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from medrt.io.header import finite_int
from medrt.io.series import head_first_order, points_away
from medrt.io.stacks import acquisition_stacks
from medrt.preprocess import normalize
from medrt.types import Frame, Geometry

__all__ = ["MAX_GAP_MM", "MAX_REACH", "Neighbours", "Sides", "adjacent", "along_normal", "frame_stacks",
           "head_first", "in_stacks", "parallel", "points_away", "nearest_at", "nearest_sides",
           "ordered_sides",
           "slice_stack", "series_neighbours",
           "stack_pixels", "phantom_input", "phantom_sides"]

# The farthest a neighbour may lie from the slice along its normal; the models were
# trained on 3 and 5 mm slices, and a gap beyond this is a missing slice.
MAX_GAP_MM = 10.0
# The most slices looked at on each side for one a model's neighbour_mm away (0.25 mm
# slices for a 3 mm neighbour: 12).
MAX_REACH = 16

Neighbours = tuple["Frame | None", "Frame | None"]


def along_normal(frame: Frame) -> float | None:
    """The frame's position along its slice normal (mm), or None without patient geometry.

    The normal is turned to point along its largest patient axis, whichever way the rows
    and columns run: larger is towards the head for axial slices (+z, also on a tilted
    gantry), the patient's left for sagittal ones, posterior for coronal ones. Row × column
    alone points to the feet on a feet-first scan (ImageOrientationPatient -1\\0\\0\\0\\1\\0),
    which gave the 2.5-D models their neighbours the wrong way round: false lesions by the
    dozen."""
    g = frame.geometry
    if g is None:
        return None
    n = _unit(g.normal)
    along = float(np.dot(g.position, n))
    return -along if points_away(n) else along


def _unit(normal: Sequence[float]) -> Sequence[float]:
    """``normal`` of length 1 (a zero one as it is). Row × column is a hair short of it where
    the direction cosines are (0.9992\\0\\0\\0\\0.9992\\0: 0.9984), which moved such a slice
    0.8 mm towards the origin at 500 mm, past its 0.5 mm neighbour, and made the two's normals
    less than parallel (a dot product of 0.998): neither order nor neighbours agreed with
    :func:`medrt.io.series.head_first_order`, which holds those cosines one orientation."""
    length = math.sqrt(sum(v * v for v in normal))
    return normal if length in (0.0, 1.0) else tuple(v / length for v in normal)


def parallel(a: Geometry, b: Geometry) -> bool:
    """Whether two slices' normals are parallel enough (within about 2.6°) for the slices to
    stand beside each other in one stack."""
    return float(np.dot(_unit(a.normal), _unit(b.normal))) >= 0.999


def head_first(frames: Sequence[Frame]) -> list[int] | None:
    """The indices of one multi-frame object's ``frames`` in slice order, head first (the
    larger :func:`along_normal` first, as :func:`medrt.analysis.tracking.link_series` and
    the viewer order a series' slices), where every frame has a place of its own on one
    orientation; None otherwise (no per-frame geometry, several phases or stacks at one
    place, frames of several orientations: their frame order keeps those together). An
    enhanced CT may store its frames in any order, and a stream that handed them on in
    frame order linked each frame's lesions to those of a slice from elsewhere in the volume.
    The rule is :func:`medrt.io.series.head_first_order`, the one the viewer orders the
    frames by from the header, so no path orders one object's frames another way."""
    return head_first_order([f.geometry for f in frames])


def frame_stacks(frames: Sequence[Frame]) -> list[int] | None:
    """Which stack (0, 1, ... by ascending AcquisitionNumber) each of one series' ``frames``
    is in when they are several whole acquisitions at the same slice positions, by the rule
    that orders a series' items (:func:`medrt.io.stacks.acquisition_stacks`, here on the
    frames' positions along the normal and AcquisitionNumbers); None for one stack."""
    if len(frames) < 2:
        return None
    acquisitions = [finite_int(f.source.dataset.get("AcquisitionNumber")) for f in frames]
    return acquisition_stacks([along_normal(f) for f in frames], acquisitions)


def in_stacks(items: Sequence[object], stacks: list[int]) -> list[list[int]]:
    """The indices of ``items`` per stack (``stacks``: :func:`frame_stacks`), in the order given."""
    out: list[list[int]] = [[] for _ in range(max(stacks) + 1)]
    for i, k in enumerate(stacks):
        out[k].append(i)
    return out


def adjacent(frame: Frame, other: Frame | None) -> bool:
    """True when ``other`` can stand beside ``frame`` as a neighbouring slice."""
    if other is None or other is frame:
        return False
    if other.series_instance_uid != frame.series_instance_uid or other.shape != frame.shape:
        return False
    if other.spacing_mm != frame.spacing_mm or (other.modality or "") != (frame.modality or ""):
        return False
    a, b = frame.geometry, other.geometry
    if a is None or b is None:  # a multi-frame object without per-frame geometry: its frame order
        return a is None and b is None and other.sop_instance_uid == frame.sop_instance_uid
    if not parallel(a, b):
        return False
    gap = abs(along_normal(other) - along_normal(frame))  # type: ignore[operator]
    return 0.0 < gap <= MAX_GAP_MM


Sides = tuple["np.ndarray | None", "np.ndarray | None"]


def ordered_sides(frame: Frame, neighbours: Neighbours | None = None) -> Sides:
    """The pixels of the neighbour on the head side (the larger position along the slice
    normal) and of the one on the feet side, whichever order the series was read in (the
    models were trained head to feet); None for one that is missing or not :func:`adjacent`."""
    prev, nxt = (nb if adjacent(frame, nb) else None for nb in (neighbours or (None, None)))
    here = along_normal(frame)
    if here is not None:
        sides: list[Frame | None] = [None, None]
        for nb in (prev, nxt):
            if nb is not None:
                sides[0 if along_normal(nb) > here else 1] = nb  # type: ignore[operator]
        prev, nxt = sides
    return (None if prev is None else prev.pixels, None if nxt is None else nxt.pixels)


def slice_stack(frame: Frame, neighbours: Neighbours | None = None, sides: Sides | None = None,
                window: tuple[float, float] | None = None) -> np.ndarray:
    """(3, rows, cols) float32: the head-side neighbour, this slice and the feet-side one
    (:func:`ordered_sides`, or ``sides`` when the caller has them already), each normalised
    by ``window`` (default: this frame's VOI window); a missing one is this slice again
    (:func:`stack_pixels`)."""
    before, after = ordered_sides(frame, neighbours) if sides is None else sides
    if window is None:
        window = (frame.window.center, frame.window.width)
    return stack_pixels(frame.pixels, window, before, after)


def series_neighbours(frames: Sequence[Frame], target_mm: float | None = None) -> list[Neighbours]:
    """Each frame's (previous, next) in slice order (a series' frames as read, a multi-frame
    object's frames), in the order given; None where the one beside it is not
    :func:`adjacent`. With ``target_mm`` (a 2.5-D model's ``[model] neighbour_mm``) each
    side's is the slice nearest that distance (:func:`nearest_at`), not the next one.

    Frames that all have a position but are not given in position order (an enhanced
    CT may store its frames in any order) are put in order first: frame order gave
    them neighbours from elsewhere in the volume. Not where two frames share a place (an
    object of several phases or stacks: its frame order keeps each together), but the
    images of several whole acquisitions (:func:`frame_stacks`) get their neighbours
    within their own."""
    stacks = frame_stacks(frames)
    if stacks is not None:
        out_of_stacks: list[Neighbours] = [(None, None)] * len(frames)
        for part in in_stacks(frames, stacks):
            for i, nb in zip(part, series_neighbours([frames[i] for i in part], target_mm), strict=True):
                out_of_stacks[i] = nb
        return out_of_stacks
    positions = [along_normal(f) for f in frames]
    if all(p is not None for p in positions) and len({round(p, 3) for p in positions}) == len(frames):  # type: ignore[arg-type]
        steps = [b - a for a, b in zip(positions, positions[1:], strict=False)]  # type: ignore[operator]
        if not (all(d > 0 for d in steps) or all(d < 0 for d in steps)):
            order = sorted(range(len(frames)), key=lambda i: positions[i])  # type: ignore[arg-type,return-value]
            found = series_neighbours([frames[i] for i in order], target_mm)
            out_of_order: list[Neighbours] = [(None, None)] * len(frames)
            for k, i in enumerate(order):
                out_of_order[i] = found[k]
            return out_of_order
    out: list[Neighbours] = []
    for i, frame in enumerate(frames):
        before = (frames[j] if j >= 0 else None for j in range(i - 1, i - 1 - MAX_REACH, -1))
        after = (frames[j] if j < len(frames) else None for j in range(i + 1, i + 1 + MAX_REACH))
        out.append((nearest_at(frame, before, target_mm), nearest_at(frame, after, target_mm)))
    return out


def nearest_at(frame: Frame, outward: Iterable[Frame | None], target_mm: float | None = None) -> Frame | None:
    """Of the slices on one side of ``frame``, nearest first (``outward``: i + 1, i + 2, …
    or i - 1, i - 2, …), the :func:`adjacent` one whose distance along the normal is
    nearest ``target_mm`` (the nearer of two as near); the first alone when ``target_mm``
    is None. The walk stops at the first that is not adjacent (another series, a gap) or
    that reaches ``target_mm``, so only the slices up to it are looked at (and decoded).

    A model trained on 3 and 5 mm slices sees, on a 1 mm series, neighbours that look
    like the slice itself: a 6 mm nodule goes on over them as a vessel does. Measured on
    6 validation CT phantom series at 1 mm (``lesion_unet_lite`` 4.1, thirty-third
    session): lesion sections of 5-10 mm found 70 of 102 with the next slices, 87 with
    the slices 3 mm away, at 0.135 and 0.124 false positives per slice."""
    best: Frame | None = None
    best_off = math.inf
    for other in outward:
        if not adjacent(frame, other):
            break
        if target_mm is None or frame.geometry is None:  # (frames of one object without positions: the next)
            return other
        gap = abs(along_normal(other) - along_normal(frame))  # type: ignore[operator]
        off = abs(gap - target_mm)
        if off < best_off:
            best, best_off = other, off
        if gap >= target_mm:
            break
    return best


def nearest_sides(frame: Frame, pool: Iterable[Frame | None], target_mm: float | None = None) -> Neighbours:
    """The neighbours of ``frame`` among ``pool``, slices in no particular order (a live
    source's: those received lately and those held after it): on each side (head, feet)
    the :func:`adjacent` slice whose distance along the normal is nearest ``target_mm``
    (None: the nearest slice), the nearer of two as near. A sender's order (a scanner's
    slice order, or a PACS's, or a spool's file names) is then no matter, as long as the
    neighbours are among them. Returned as (head side, feet side)."""
    here = along_normal(frame)
    best: list[tuple[float, float, Frame] | None] = [None, None]
    if here is None:
        return (None, None)
    for other in pool:
        if not adjacent(frame, other):
            continue
        signed = along_normal(other) - here  # type: ignore[operator]
        gap = abs(signed)
        key = (abs(gap - target_mm) if target_mm is not None else gap, gap)
        side = 0 if signed > 0 else 1
        held = best[side]
        if held is None or key < held[:2]:
            best[side] = (*key, other)  # type: ignore[assignment]
    return tuple(None if b is None else b[2] for b in best)  # type: ignore[return-value]


def stack_pixels(pixels: np.ndarray, window: tuple[float, float], before: np.ndarray | None = None,
                 after: np.ndarray | None = None) -> np.ndarray:
    """(3, rows, cols): ``before`` (head side), ``pixels`` and ``after`` (feet side), each
    normalised by ``window``; a missing one is ``pixels`` again. For callers that know the
    order already (phantom series, training, calibration)."""
    out = np.empty((3, *pixels.shape), np.float32)
    normalize(pixels, *window, out=out[1])
    for k, nb in ((0, before), (2, after)):
        if nb is None:
            out[k] = out[1]
        else:
            normalize(nb, *window, out=out[k])
    return out


def phantom_input(frame: object, series: Sequence[object] | dict[tuple, object], slices: int,
                  window: tuple[float, float] | None = None) -> np.ndarray:
    """A phantom frame's (``medrt.phantom.PhantomFrame``) normalised input for a model of
    ``slices`` (1: 2-D; 3: with its neighbours in ``series``, a sequence of that series'
    frames in order or a dict keyed by (kind, seed, index)). Phantom CT series run head
    to feet, so index - 1 is the head side. ``window``: the model's
    (:meth:`ModelSpec.input_window`); default the frame's own."""
    if window is None:
        window = frame.window  # type: ignore[attr-defined]
    if slices != 3:
        return normalize(frame.pixels, *window)  # type: ignore[attr-defined]
    return stack_pixels(frame.pixels, window, *phantom_sides(frame, series))  # type: ignore[attr-defined]


def phantom_sides(frame: object, series: Sequence[object] | dict[tuple, object]) -> Sides:
    """A phantom frame's head- and feet-side neighbours' pixels (see :func:`phantom_input`;
    None for a radiograph and at a series' ends)."""
    if frame.slice_location is None:  # type: ignore[attr-defined]  # a radiograph: its own neighbours
        return (None, None)
    kind, seed, index = frame.kind, frame.seed, frame.index  # type: ignore[attr-defined]
    if isinstance(series, dict):
        before, after = series.get((kind, seed, index - 1)), series.get((kind, seed, index + 1))
    else:
        before = series[index - 1] if index > 0 else None
        after = series[index + 1] if index + 1 < len(series) else None
    return (None if before is None else before.pixels,  # type: ignore[attr-defined]
            None if after is None else after.pixels)  # type: ignore[attr-defined]
