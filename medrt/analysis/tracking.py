"""The lesions of a series: the sections of one lesion on neighbouring slices joined.

The analyzer works slice by slice, so a CT nodule 8 mm across on 3 mm slices is found
three or four times, once per slice it crosses. A radiologist counts it once, gives its
longest axial diameter on the slice where it is largest (as RECIST and Lung-RADS
measure), and may follow its volume. :func:`link_series` joins the sections:

- Frames are put in slice order (by position along the slice normal, head first), and
  two of them are neighbours when :func:`medrt.analysis.slices.adjacent` says so (same
  series, size, pixel spacing, orientation, at most ``MAX_GAP_MM`` apart) and they share
  their pixel grid (in-plane offset under half a pixel). A gap wider than that (a
  missing stretch of slices) breaks a lesion in two rather than joining across it.
  A slice that lacks its position (a damaged header: no ImagePositionPatient) takes
  its place by InstanceNumber, and stands beside its neighbours when they are two
  slice steps apart on one grid, the gap it fills; otherwise its lesions are its own.
- Two lesions on neighbouring slices are one when their masks (in the frames' label
  maps) overlap by at least :data:`MIN_OVERLAP` of the smaller one's area, and at least
  one pixel.
- Each series lesion gets a number (1, 2, ... in slice order from the head, then by
  row and column), a tracking UID derived from its series and first section (the same
  for the same results, so the SR and ``lesions.csv`` of a rerun agree), its longest
  section diameter and which section that is, and, where positions along the normal are
  known and the spacing is in mm, its volume: the sum of its section areas times the
  slice spacing (the median step between neighbouring slices; Cavalieri's estimate, so
  a lesion seen on one slice has the volume of a slab that thick).

A series of several whole acquisitions at the same slice positions (a pre- and a
post-contrast pass: :func:`medrt.analysis.slices.frame_stacks`) is linked stack by stack:
no lesion joins sections of two passes, and each lesion says which acquisition it was
seen in (``acquisition``), so one seen in both passes reads as the same place twice,
not as two lesions of one scan. Numbers run on from one stack to the next, lower
AcquisitionNumber first.

A radiograph, a lone image, or a frame whose neighbours are missing has series lesions
of one section each (volume None). No library offered this: scikit-image and
scipy.ndimage label connected voxels in a regular volume, which would need every slice's
full mask stacked and a regular spacing, and would merge two lesions the analyzer kept
apart on one slice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from medrt.analysis.slices import adjacent, along_normal, frame_stacks, in_stacks, parallel
from medrt.io.header import finite_int
from medrt.io.stacks import LivePasses
from medrt.types import Frame, FrameResult, Lesion

__all__ = ["MIN_OVERLAP", "Linked", "Section", "SeriesLesion", "link_series", "LesionCounter"]

MIN_OVERLAP = 0.1  # of the smaller section's pixels


@dataclass(frozen=True, slots=True)
class Section:
    """One lesion on one frame: the frame's key (``SOPInstanceUID[#frame]``), SOP Instance
    UID and frame index, the lesion's label in that frame's label map, and its record."""

    key: str
    sop_instance_uid: str
    frame_index: int
    slice: int  # position in slice order, from 0 (head first when positions are known)
    lesion: Lesion


@dataclass(frozen=True, slots=True)
class SeriesLesion:
    number: int
    uid: str  # Tracking UID (TID 1500): the same for every section and measurement of this lesion
    sections: tuple[Section, ...]  # in slice order
    largest: Section  # the section with the longest diameter
    diameter_mm: float  # the longest section diameter (pixel widths when in_mm is False)
    volume_mm3: float | None  # sum of section areas x slice spacing; None without positions or mm
    score: float  # the highest section score
    in_mm: bool  # sizes in mm; else in pixels (no pixel spacing in the header)
    # the AcquisitionNumber of the stack it is in, when its series holds several whole
    # acquisitions at the same positions (medrt.analysis.slices.frame_stacks); else None
    acquisition: int | None = None

    @property
    def slices(self) -> int:
        return len(self.sections)

    def to_json(self) -> dict[str, Any]:
        first, last = self.sections[0], self.sections[-1]
        return {
            "lesion": self.number,
            "tracking_uid": self.uid,
            "slices": self.slices,
            "first": {"sop_instance_uid": first.sop_instance_uid, "frame_index": first.frame_index},
            "last": {"sop_instance_uid": last.sop_instance_uid, "frame_index": last.frame_index},
            "largest": {"sop_instance_uid": self.largest.sop_instance_uid, "frame_index": self.largest.frame_index,
                        "id": int(self.largest.lesion.label)},
            "diameter_mm": round(self.diameter_mm, 4) if self.in_mm else None,
            "diameter_px": None if self.in_mm else round(self.diameter_mm, 4),
            "volume_mm3": None if self.volume_mm3 is None else round(self.volume_mm3, 3),
            "score": round(self.score, 4),
            "acquisition": self.acquisition,
        }


#: What :func:`link_series` returns: the series lesions (numbered from 1) and each section's
#: number, ``{(frame key, lesion label): series lesion number}``.
Linked = tuple[list[SeriesLesion], dict[tuple[str, int], int]]


def _order(results: Sequence[FrameResult]) -> tuple[list[FrameResult], bool]:
    """Slice order: by position along the normal, head (larger) first, when every frame has
    one; by InstanceNumber when only some single-frame images lack one and the others'
    instance numbers run with their positions (:func:`_by_instance`; the flag is then True);
    else as given (a multi-frame object's frame order)."""
    positions = [along_normal(r.frame) for r in results]
    if results and all(p is not None for p in positions):
        order = sorted(range(len(results)), key=lambda i: (-positions[i], results[i].frame.frame_index))  # type: ignore[operator]
        return [results[i] for i in order], False
    by_instance = _by_instance(results, positions)
    return (by_instance, True) if by_instance is not None else (list(results), False)


def _instance_number(frame: Frame) -> int | None:
    try:
        return int(frame.source.dataset.get("InstanceNumber"))
    except (TypeError, ValueError):
        return None


def _by_instance(results: Sequence[FrameResult], positions: list[float | None]) -> list[FrameResult] | None:
    """A series of single-frame slices where some (a damaged slice: no ImagePositionPatient)
    lack a position: in InstanceNumber order, head first, when every image has a distinct
    instance number and those with positions number them strictly one way along the normal,
    as a scanner numbers its slices. None otherwise."""
    numbers = [_instance_number(r.frame) for r in results]
    placed = [(p, n) for p, n in zip(positions, numbers, strict=True) if p is not None]
    if (len(placed) < 2 or any(n is None for n in numbers) or len(set(numbers)) < len(numbers)
            or any(r.frame.number_of_frames > 1 for r in results)):
        return None
    by_position = [n for _, n in sorted(placed, key=lambda pn: -pn[0])]  # head first
    steps = np.diff(by_position)
    if not (np.all(steps > 0) or np.all(steps < 0)):
        return None
    head_first = 1 if steps[0] > 0 else -1
    return sorted(results, key=lambda r: head_first * _instance_number(r.frame))  # type: ignore[operator]


def _bridged(ordered: list[FrameResult], i: int, step: float | None) -> tuple[int, int] | None:
    """The grid shift between slices ``i`` and ``i + 1`` when one lacks a position but stands
    where its series has a gap of one slice: its neighbours on either side (which have
    positions) are two steps apart, on one grid, and :func:`adjacent` to each other in all
    but the gap, and it matches them in size, spacing and modality. None otherwise (its
    sections then start lesions of their own, as before)."""
    a, b = ordered[i].frame, ordered[i + 1].frame
    lone = i if a.geometry is None else i + 1
    if step is None or (a.geometry is None) == (b.geometry is None) or not 0 < lone < len(ordered) - 1:
        return None
    x, before, after = ordered[lone].frame, ordered[lone - 1].frame, ordered[lone + 1].frame
    if before.geometry is None or after.geometry is None:
        return None
    for f in (before, after):
        if (f.series_instance_uid, f.shape, f.spacing_mm, f.modality or "") != \
                (x.series_instance_uid, x.shape, x.spacing_mm, x.modality or ""):
            return None
    if not parallel(before.geometry, after.geometry):
        return None
    gap = abs(along_normal(before) - along_normal(after))  # type: ignore[operator]
    if abs(gap - 2 * step) > 0.1 * step or _grid_shift(before, after) != (0, 0):
        return None
    return (0, 0)


def _grid_shift(a: Frame, b: Frame) -> tuple[int, int] | None:
    """Where ``b``'s pixel grid lies on ``a``'s, seen along the slice normal: ``b``'s pixel
    (r, c) is over ``a``'s (r + dr, c + dc). A gantry-tilted CT steps its slices along the
    table, not the normal, so each lies a little further along the tilted column
    direction (3 mm × sin 10° = 0.5 mm a slice): comparing pixel for pixel split every
    lesion into its sections. None for an in-plane offset larger than the step along the
    normal (beyond a 45° tilt: not one stack of slices)."""
    if a.geometry is None or b.geometry is None:
        return (0, 0)  # frames of one multi-frame object (adjacent checked that)
    step = np.subtract(b.geometry.position, a.geometry.position)
    normal = np.asarray(a.geometry.normal, dtype=float)
    along = float(np.dot(step, normal))
    in_plane = step - normal * along
    if float(np.linalg.norm(in_plane)) > max(abs(along), 1e-6):
        return None
    spacing = a.spacing_mm or (1.0, 1.0)  # (between rows, between columns)
    row_dir, col_dir = np.asarray(a.geometry.orientation[:3], float), np.asarray(a.geometry.orientation[3:], float)
    return round(float(np.dot(in_plane, col_dir)) / spacing[0]), round(float(np.dot(in_plane, row_dir)) / spacing[1])


def _overlap(a: FrameResult, la: Lesion, b: FrameResult, lb: Lesion, shift: tuple[int, int] = (0, 0)) -> bool:
    """Whether sections ``la`` (on ``a``) and ``lb`` (on ``b``, whose grid lies ``shift``
    pixels on from ``a``'s: :func:`_grid_shift`) overlap enough to be one lesion."""
    dr, dc = shift
    r0, c0 = max(la.bbox[0], lb.bbox[0] + dr), max(la.bbox[1], lb.bbox[1] + dc)
    r1, c1 = min(la.bbox[2], lb.bbox[2] + dr), min(la.bbox[3], lb.bbox[3] + dc)
    if r0 >= r1 or c0 >= c1:
        return False
    both = int(np.count_nonzero((a.labels[r0:r1, c0:c1] == la.label)
                                & (b.labels[r0 - dr:r1 - dr, c0 - dc:c1 - dc] == lb.label)))
    return both >= max(1.0, MIN_OVERLAP * min(_pixels(a, la), _pixels(b, lb)))


def _pixels(r: FrameResult, les: Lesion) -> int:
    r0, c0, r1, c1 = les.bbox
    return int(np.count_nonzero(r.labels[r0:r1, c0:c1] == les.label))


def link_series(results: Sequence[FrameResult]) -> Linked:
    """The series lesions of ``results`` (the frames of one series, in any order), and each
    section's number: ``{(frame key, lesion label): series lesion number}``. The stacks of a
    series of several acquisitions are linked each by itself, numbered on from one to the
    next."""
    stacks = frame_stacks([r.frame for r in results])
    if stacks is None:
        return _link(results, 1, None)
    lesions: list[SeriesLesion] = []
    numbers: dict[tuple[str, int], int] = {}
    for part in in_stacks(results, stacks):
        mine = [results[i] for i in part]
        found, numbered = _link(mine, len(lesions) + 1,
                                finite_int(mine[0].frame.source.dataset.get("AcquisitionNumber")))
        lesions += found
        numbers.update(numbered)
    return lesions, numbers


def _link(results: Sequence[FrameResult], first: int, acquisition: int | None) -> Linked:
    """:func:`link_series` of one stack, its lesions numbered from ``first``."""
    from pydicom.uid import generate_uid

    ordered, by_instance = _order(results)
    sections: list[Section] = []
    index: dict[tuple[int, int], int] = {}  # (slice, label) -> section
    for i, r in enumerate(ordered):
        for les in r.lesions:
            index[(i, les.label)] = len(sections)
            sections.append(Section(r.frame.key, r.frame.sop_instance_uid, r.frame.frame_index, i, les))
    parent = list(range(len(sections)))

    def root(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    steps: list[float] = []
    pairs: list[tuple[int, tuple[int, int]]] = []
    lone: list[int] = []  # pairs where one slice lacks a position: linked once the step is known
    for i in range(len(ordered) - 1):
        a, b = ordered[i], ordered[i + 1]
        shift = _grid_shift(a.frame, b.frame) if adjacent(a.frame, b.frame) else None
        if shift is None:
            lone.append(i)
            continue
        pa, pb = along_normal(a.frame), along_normal(b.frame)
        if pa is not None and pb is not None:
            steps.append(abs(pa - pb))
        pairs.append((i, shift))
    step = float(np.median(steps)) if steps else None
    if by_instance:  # a slice without a position is placed only by its instance number
        pairs += [(i, shift) for i in lone if (shift := _bridged(ordered, i, step)) is not None]
    for i, shift in pairs:
        a, b = ordered[i], ordered[i + 1]
        for la in a.lesions:
            for lb in b.lesions:
                if _overlap(a, la, b, lb, shift):
                    parent[root(index[(i, la.label)])] = root(index[(i + 1, lb.label)])
    groups: dict[int, list[Section]] = {}
    for k, s in enumerate(sections):
        groups.setdefault(root(k), []).append(s)
    found = sorted(groups.values(), key=lambda g: (g[0].slice, g[0].lesion.centroid[0], g[0].lesion.centroid[1]))
    series_uid = ordered[0].frame.series_instance_uid if ordered else ""
    lesions: list[SeriesLesion] = []
    numbers: dict[tuple[str, int], int] = {}
    for n, group in enumerate(found, start=first):
        in_mm = ordered[group[0].slice].frame.spacing_mm is not None
        largest = max(group, key=lambda s: (s.lesion.diameter_mm, -s.slice))
        volume = None
        if in_mm and step is not None and any(along_normal(ordered[s.slice].frame) is not None for s in group):
            volume = float(sum(s.lesion.area_mm2 for s in group) * step)
        uid = generate_uid(entropy_srcs=["medrt series lesion", series_uid, group[0].key, str(group[0].lesion.label)])
        lesions.append(SeriesLesion(n, uid, tuple(group), largest, float(largest.lesion.diameter_mm), volume,
                                    float(max(s.lesion.score for s in group)), in_mm, acquisition))
        numbers.update({(s.key, s.lesion.label): n for s in group})
    return lesions, numbers


@dataclass(slots=True)
class _Last:
    """What :class:`LesionCounter` holds of one acquisition of a series as a stream sends it:
    its last frame and that frame's lesion numbers."""

    result: FrameResult
    numbers: dict[int, int]


class LesionCounter:
    """Lesions counted once in a stream of results (``medrt stream``), as they arrive.

    A live stream keeps no series whole, so this links each frame's lesions only to those
    of the frame before it in the same series and pass (when :func:`adjacent`, on the same
    grid, by the same overlap rule as :func:`link_series`), holding the last frame of the
    last ``keep`` acquisitions. A scanner sends slices in order, so on a whole stream the
    count is :func:`link_series`'s, except across frames the stream dropped (a gap over
    ``MAX_GAP_MM`` starts a new lesion). A lesion whose parts join only on a later slice
    (a V or a Y along the slices) was numbered once per part before they met: those
    numbers stay (they were already reported), the section where they meet and those
    after it take the first part's number, and :attr:`lesions` counts the joined parts
    once, as :func:`link_series` does.

    A series of several whole acquisitions at the same slice positions (a pre- and a
    post-contrast pass, :mod:`medrt.io.stacks`) is linked pass by pass, as
    :func:`link_series` links it. Which AcquisitionNumbers are passes of their own is
    told by :class:`medrt.io.stacks.LivePasses`, the rule the live neighbours of a 2.5-D
    model are chosen by (:class:`medrt.pipeline.stages.SliceContext`), so the two never
    disagree on what they have both seen: two acquisitions are apart once an image of one
    lies at a position the other has held. A frame joins the last frame of its own
    acquisition, or, when its acquisition has none yet (a sequential CT that numbers every
    slice or every rotation as an acquisition of its own, moving on to new positions), the
    last frame of its series of an acquisition not apart from its own. So the last slice
    of one pass is never joined to the first of the next, even where a pass spans 10 mm
    or less, and passes sent at the same time (interleaved, whichever starts where) are
    each linked by itself once they have met at a position. (This counter had a rule of
    its own before, which compared a frame with its series' last frame's pass only: a
    second pass sent interleaved with the first and starting at a position the first had
    not reached was never told apart from it.)
    """

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        self.numbered = 0  # numbers handed out
        self.lesions = 0  # distinct lesions: numbered, less the parts that joined another
        self.sections = 0
        # (series, AcquisitionNumber) -> its last frame, the last ``keep``, least recent first
        self._last: dict[tuple[str, int | None], _Last] = {}
        self._passes = LivePasses()  # which acquisitions of a series are passes of their own
        self._joined: dict[int, int] = {}  # a part's number -> the number of the part it joined

    def restart(self) -> None:
        """Link nothing that comes next to what came before (a replay that sends its series
        again from the start: ``medrt stream --loop``), keeping the counts so far: the next
        frames' lesions are counted as new ones, as a replay of their own would count them."""
        self._last.clear()
        self._passes = LivePasses()

    def _root(self, n: int) -> int:
        while n in self._joined:
            n = self._joined[n]
        return n

    def _before(self, series: str, acquisition: int | None) -> _Last | None:
        """The frame this series' next frame of ``acquisition`` joins: its acquisition's last,
        else its series' last of an acquisition :class:`LivePasses` does not hold apart."""
        own = self._last.get((series, acquisition))
        if own is not None:
            return own
        for (uid, other), held in reversed(self._last.items()):
            if uid == series and not self._passes.apart(series, acquisition, other):
                return held
        return None

    def add(self, result: FrameResult) -> list[int]:
        """Count ``result``'s lesions; returns each one's number in this stream."""
        series = result.frame.series_instance_uid
        acquisition = finite_int(result.frame.source.dataset.get("AcquisitionNumber"))
        self._passes.add(series, acquisition, along_normal(result.frame))  # before: it may start a pass
        before = self._before(series, acquisition)
        shift = _grid_shift(before.result.frame, result.frame) \
            if before is not None and adjacent(result.frame, before.result.frame) else None
        numbers: dict[int, int] = {}
        if shift is not None:
            prev, ids = before.result, before.numbers  # type: ignore[union-attr]
            pairs = [(p, les) for les in result.lesions for p in prev.lesions
                     if _overlap(prev, p, result, les, shift)]
            for p, les in pairs:  # parts that meet here become one lesion (union by the smaller number)
                a, b = self._root(ids[p.label]), self._root(numbers.get(les.label, ids[p.label]))
                if a != b:
                    self._joined[max(a, b)] = min(a, b)
                    self.lesions -= 1
                numbers[les.label] = min(a, b)
            numbers = {label: self._root(n) for label, n in numbers.items()}
        for les in sorted(result.lesions, key=lambda les: les.centroid):  # new ones as link_series numbers them
            if les.label not in numbers:
                self.numbered += 1
                self.lesions += 1
                numbers[les.label] = self.numbered
        self.sections += len(result.lesions)
        key = (series, acquisition)
        self._last.pop(key, None)
        self._last[key] = _Last(result, numbers)
        while len(self._last) > self.keep:
            self._last.pop(next(iter(self._last)))
        return [numbers[les.label] for les in result.lesions]
