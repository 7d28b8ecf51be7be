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
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["MIN_STACK", "POSITION_ATOL_MM", "POSITION_RTOL", "acquisition_stacks", "position_tolerance"]

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
