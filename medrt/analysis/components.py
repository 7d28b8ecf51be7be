"""Connected components with SimpleITK, one thread per call.

medrt runs frames in parallel itself (pipeline workers, the batch's decode and
inference stages), and the maps it labels are small: a 64² ROI heatmap, a 512²
CT probability map, boxes cut around a radiograph's lesions. SimpleITK's default
per-filter thread pool costs more than it gains there and competes with the
other stages for the same cores. Measured on this 2-core machine: 0.99 → 0.35 ms
to label a 64² map, 1.34 → 0.81 ms to label and measure a 512² one.
"""

from __future__ import annotations

import numpy as np
import SimpleITK as sitk

__all__ = ["Box", "foreground_boxes", "label", "shape_statistics", "relabel"]

Box = tuple[int, int, int, int]  # half-open (r0, c0, r1, c1)

# Above this many boxes the XY cut stops splitting: a noisy map is labelled in
# fewer, larger boxes instead of paying Python overhead per speck.
_MAX_BOXES = 256



def label(mask: np.ndarray, fully_connected: bool = True) -> sitk.Image:
    """Components of the non-zero pixels of ``mask`` (8-connected in 2-D when
    ``fully_connected``), numbered from 1 in SimpleITK's scan order."""
    f = sitk.ConnectedComponentImageFilter()
    f.SetFullyConnected(fully_connected)
    f.SetNumberOfThreads(1)
    return f.Execute(sitk.GetImageFromArray(np.ascontiguousarray(mask, dtype=np.uint8)))


def shape_statistics(labels: sitk.Image) -> sitk.LabelShapeStatisticsImageFilter:
    """Per-label shape statistics (bounding box, centroid, pixel count) of ``labels``."""
    stats = sitk.LabelShapeStatisticsImageFilter()
    stats.SetNumberOfThreads(1)
    stats.Execute(labels)
    return stats


def relabel(labels: sitk.Image, minimum_object_size: int = 0) -> tuple[sitk.Image, list[int]]:
    """Labels renumbered 1..n by size, largest first, objects smaller than
    ``minimum_object_size`` pixels dropped; with each object's size in pixels."""
    f = sitk.RelabelComponentImageFilter()
    f.SetMinimumObjectSize(minimum_object_size)
    f.SetSortByObjectSize(True)
    f.SetNumberOfThreads(1)
    image = f.Execute(labels)
    return image, [int(n) for n in f.GetSizeOfObjectsInPixels()]


def _runs(flags: np.ndarray) -> list[tuple[int, int]]:
    """Half-open ``(start, stop)`` of each run of True in a 1-D bool array."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], flags.view(np.int8), [0]))))
    return [(int(a), int(b)) for a, b in zip(edges[0::2], edges[1::2], strict=True)]


def foreground_boxes(fg: np.ndarray) -> list[Box]:
    """Disjoint boxes that hold all foreground, each component wholly inside one box.

    Boxes are cut along rows and columns with no foreground (a recursive XY cut),
    which no 8-connected component can cross.
    """
    out: list[Box] = []
    # (r0, c0, r1, c1, axis to cut next, consecutive cuts that found one run)
    stack: list[tuple[int, int, int, int, int, int]] = [(0, 0, fg.shape[0], fg.shape[1], 0, 0)]
    while stack:
        if len(out) + len(stack) > _MAX_BOXES:
            out.extend(s[:4] for s in stack)
            break
        r0, c0, r1, c1, axis, calm = stack.pop()
        runs = _runs(fg[r0:r1, c0:c1].any(axis=1 - axis))
        if axis == 0:
            boxes = [(r0 + a, c0, r0 + b, c1) for a, b in runs]
        else:
            boxes = [(r0, c0 + a, r1, c0 + b) for a, b in runs]
        if len(boxes) == 1 and calm == 1:
            out.append(boxes[0])
            continue
        nxt = calm + 1 if len(boxes) == 1 else 0
        stack.extend((*b, 1 - axis, nxt) for b in reversed(boxes))
    return out
