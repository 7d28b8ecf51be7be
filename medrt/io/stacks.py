"""Several whole acquisitions at the same slice positions in one series, told apart.

Some scanners store a pre- and a post-contrast pass, or two phases, in one series: the
same slice positions twice, each pass with its own AcquisitionNumber. Keeping one image
per position (as for a slice re-acquired within a pass: a motion repeat) would leave
half the series unanalysed, and 3D Slicer's DICOM plugin loads such a series as one
volume per AcquisitionNumber. So does medrt, by one rule used wherever a series' images
are put in order: :func:`acquisition_stacks`, on the headers of a series' items
(:mod:`medrt.io.series`) and of decoded frames (:mod:`medrt.analysis.slices`, the 2.5-D
neighbours and the lesion tracking, so a slice of one pass is never taken as the
neighbour of the other's).

The rule is strict, because sequential (axial) CT often gives every slice, or every
rotation, its own AcquisitionNumber: a series is several stacks only when the images at
positions held more than once split by AcquisitionNumber into groups of at least
:data:`MIN_STACK` images each, every image has an AcquisitionNumber, and no group holds a
position twice. Anything else (a re-acquired slice or two) is one stack, of which
:func:`medrt.io.series.order_items` keeps one image per position.

A live source (a watched folder) cannot wait for a series to be whole before it counts
groups: :class:`LivePasses` keeps the rule as far as it can be told as slices arrive, for
both things a stream does pass by pass: the live neighbours of a 2.5-D model
(:class:`medrt.pipeline.stages.SliceContext`) and the lesion count
(:class:`medrt.analysis.tracking.LesionCounter`), so the two cannot disagree on which
slices are of one pass.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

__all__ = ["MIN_STACK", "POSITION_ATOL_MM", "POSITION_RTOL", "LivePasses", "acquisition_stacks",
           "position_tolerance"]

POSITION_ATOL_MM = 0.01  # two slices closer than this (or 1e-3 of the spacing) share a position
POSITION_RTOL = 1e-3
#: The fewest images at shared positions an acquisition needs to be a stack of its own;
#: fewer are slices re-acquired within a pass.
MIN_STACK = 3


def position_tolerance(positions: Sequence[float]) -> float:
    """How close (mm) two positions along the slice normal are to count as one: 0.01 mm, or
    1e-3 of the median step between distinct positions when that is more."""
    steps = np.diff(np.sort(np.asarray(positions, dtype=np.float64)))
    real = steps[steps > POSITION_ATOL_MM]
    return max(POSITION_ATOL_MM, POSITION_RTOL * float(np.median(real))) if real.size else POSITION_ATOL_MM


def _places(positions: Sequence[float]) -> list[int]:
    """Each position's place: positions within :func:`position_tolerance` of the first of a
    run (in sorted order) share one."""
    tolerance = position_tolerance(positions)
    order = sorted(range(len(positions)), key=lambda i: positions[i])
    places = [0] * len(positions)
    place, start = -1, None
    for i in order:
        if start is None or positions[i] - start > tolerance:
            place, start = place + 1, positions[i]
        places[i] = place
    return places


def acquisition_stacks(positions: Sequence[float | None], acquisitions: Sequence[int | None]) -> list[int] | None:
    """Which stack (0, 1, ... by ascending AcquisitionNumber) each image is in, when the
    images (their positions along one slice normal, in mm, and AcquisitionNumbers) are
    several whole acquisitions at the same positions; None when they are one stack (see
    the module's rule)."""
    if len(positions) != len(acquisitions) or any(p is None for p in positions):
        return None
    places = _places(positions)  # type: ignore[arg-type]
    held = np.bincount(places)
    shared = [i for i, place in enumerate(places) if held[place] > 1]
    if not shared or any(a is None for a in acquisitions):
        return None
    at_shared: dict[int, int] = {}
    for i in shared:
        at_shared[acquisitions[i]] = at_shared.get(acquisitions[i], 0) + 1  # type: ignore[index]
    if len(at_shared) < 2 or min(at_shared.values()) < MIN_STACK:
        return None
    if any(a not in at_shared for a in acquisitions):  # an image of yet another acquisition
        return None
    for number in at_shared:
        mine = [places[i] for i, a in enumerate(acquisitions) if a == number]
        if len(set(mine)) < len(mine):  # a position twice within one pass
            return None
    rank = {number: k for k, number in enumerate(sorted(at_shared))}
    return [rank[a] for a in acquisitions]  # type: ignore[index]


class LivePasses:
    """Which AcquisitionNumbers of a series arriving live are passes of their own
    (:func:`acquisition_stacks` as far as it can be told before the series is whole).

    Two acquisitions of one series are two passes once an image of one lies at a position
    an image of the other holds (a post-contrast pass going over the pre-contrast one's
    slices, sent after it or interleaved with it); acquisitions that never share a
    position (a sequential CT numbering each slice or rotation) stay one pass, and an
    image without an AcquisitionNumber is of every pass, as the strict rule makes such a
    series one stack. The strict rule's count (:data:`MIN_STACK` images at shared
    positions) cannot be waited for live: a next pass's first slice must already find its
    neighbours in its own pass. So a slice re-acquired under another AcquisitionNumber is
    apart from the acquisition whose position it repeats: within a pass of one
    AcquisitionNumber it is nobody's neighbour, rather than one of two images at one
    place. This is the one live rule: :class:`medrt.pipeline.stages.SliceContext` picks
    neighbours by it and :class:`medrt.analysis.tracking.LesionCounter` links lesions by
    it (each with its own instance, fed the same images). Positions are matched within
    :data:`POSITION_ATOL_MM`: slices that can be neighbours lie at most 10 mm apart, where
    1e-3 of the spacing (:func:`position_tolerance`) is less.

    Two passes sent interleaved in opposite directions (one head to feet, one feet to head)
    are one pass until they meet: before that, nothing tells them from a sequential CT's
    rotations sent in another order than acquired (both are acquisitions at positions none
    of the others holds, seen going either way), and parting the rotations would cost every
    slice at a rotation's edge its neighbours. The few slices just before the two passes
    meet may take the other's as a neighbour; a rule that parted acquisitions going opposite
    ways was tried and left out for that reason.

    Holds the positions of the last ``keep`` series (of up to ``per_series`` acquisitions
    each, the latest ``positions`` positions of each): a watched folder runs for days.
    """

    def __init__(self, keep: int = 32, per_series: int = 1024, positions: int = 4096) -> None:
        self.keep, self.per_series, self.positions = keep, per_series, positions
        # series -> AcquisitionNumber -> the positions along the normal its images were at (sorted)
        self._held: OrderedDict[str, OrderedDict[int, list[float]]] = OrderedDict()
        # series -> acquisition -> the acquisitions it was seen at one place with (both ways)
        self._apart: dict[str, dict[int, set[int]]] = {}

    def add(self, series: str, acquisition: int | None, position: float | None) -> None:
        """An image of ``series`` arrived (or was seen ahead of its turn: adding it again
        changes nothing) with this AcquisitionNumber at this position along the normal."""
        if acquisition is None or position is None:
            return
        held = self._held.pop(series, None) or OrderedDict()
        self._held[series] = held
        while len(self._held) > self.keep:
            gone, _ = self._held.popitem(last=False)
            self._apart.pop(gone, None)
        for other, places in held.items():
            if other != acquisition and _holds(places, position):
                apart = self._apart.setdefault(series, {})
                apart.setdefault(acquisition, set()).add(other)
                apart.setdefault(other, set()).add(acquisition)
        mine = held.pop(acquisition, [])
        held[acquisition] = mine
        if not _holds(mine, position):
            bisect.insort(mine, position)
            if len(mine) > self.positions:
                mine.pop(0 if position > mine[len(mine) // 2] else -1)  # the far end from this one
        while len(held) > self.per_series:  # its pairs go with it (one acquisition per image, all at one place)
            gone_acquisition, _ = held.popitem(last=False)
            apart = self._apart.get(series, {})
            for other in apart.pop(gone_acquisition, ()):
                if other in apart:
                    apart[other].discard(gone_acquisition)
                    if not apart[other]:
                        del apart[other]

    def apart(self, series: str, a: int | None, b: int | None) -> bool:
        """Whether images of ``series`` with AcquisitionNumbers ``a`` and ``b`` are of two
        passes (never each other's neighbours)."""
        return a is not None and b is not None and a != b and b in self._apart.get(series, {}).get(a, ())

    def of_its_own(self, series: str, acquisition: int | None) -> bool:
        """Whether ``acquisition`` is a pass apart from another of ``series``."""
        return acquisition is not None and bool(self._apart.get(series, {}).get(acquisition))


def _holds(places: list[float], position: float) -> bool:
    """Whether sorted ``places`` hold ``position`` (within :data:`POSITION_ATOL_MM`)."""
    i = bisect.bisect_left(places, position - POSITION_ATOL_MM)
    return i < len(places) and places[i] <= position + POSITION_ATOL_MM
