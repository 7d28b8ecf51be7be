"""Connected components of 2-D masks: 8-connected labels with boxes and sizes.

medrt labels small maps many times per frame: a 64² ROI heatmap, a 512² CT
probability map, boxes cut around a radiograph's few lesions (the XY cut below).
scipy.ndimage labels those in microseconds; SimpleITK, used here before, spent
about 0.75 ms of fixed cost per call on pipeline setup, and at three to five
calls a frame that was 2.7 of the 3.6 ms a 512² CT slice spent outside its
models (measured on this 2-core machine).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage

__all__ = ["Box", "Components", "foreground_boxes", "label", "by_size"]

Box = tuple[int, int, int, int]  # half-open (r0, c0, r1, c1)

# Above this many boxes the XY cut stops splitting: a noisy map is labelled in
# fewer, larger boxes instead of paying Python overhead per speck.
_MAX_BOXES = 256
_EIGHT = np.ones((3, 3), dtype=bool)


@dataclass(frozen=True, slots=True, eq=False)
class Components:
    """Components of a mask: ``labels`` 1..n (0 background), and for label ``k`` its
    bounding ``slices[k - 1]`` and pixel count ``sizes[k - 1]``."""

    labels: np.ndarray
    slices: tuple[tuple[slice, slice], ...]
    sizes: np.ndarray

    def __len__(self) -> int:
        return len(self.slices)

    def box(self, k: int) -> Box:
        """Label ``k``'s bounding box, half-open ``(r0, c0, r1, c1)``."""
        rs, cs = self.slices[k - 1]
        return (int(rs.start), int(cs.start), int(rs.stop), int(cs.stop))

    def mask(self, k: int) -> np.ndarray:
        """Label ``k``'s pixels inside its bounding box."""
        return self.labels[self.slices[k - 1]] == k


def label(mask: np.ndarray) -> Components:
    """8-connected components of the non-zero pixels of ``mask``, numbered in raster
    order of their first pixel."""
    labels, n = ndimage.label(np.asarray(mask), structure=_EIGHT)
    slices = tuple(ndimage.find_objects(labels, max_label=n))
    sizes = np.bincount(labels.ravel(), minlength=n + 1)[1:]
    return Components(labels, slices, sizes)  # type: ignore[arg-type]


def by_size(comps: Components, minimum: int = 1) -> Components:
    """``comps`` renumbered 1..m by size, largest first (ties keep their order), with
    components under ``minimum`` pixels dropped."""
    order = np.argsort(-comps.sizes, kind="stable")
    order = order[comps.sizes[order] >= minimum]
    lut = np.zeros(len(comps) + 1, dtype=comps.labels.dtype)
    lut[order + 1] = np.arange(1, len(order) + 1, dtype=lut.dtype)
    return Components(lut[comps.labels], tuple(comps.slices[i] for i in order), comps.sizes[order])


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
