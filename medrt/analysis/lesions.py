"""Connected components of a lesion probability map, measured as :class:`medrt.types.Lesion`.

The last analysis step: threshold the UNet's probability map, split it into
8-connected components (scipy.ndimage) and measure each in mm with the same
conventions as the phantom ground truth (:mod:`medrt.phantom.shapes`), so that a
perfect prediction measures exactly like its truth:

- ``bbox`` half-open ``(r0, c0, r1, c1)``, ``centroid`` the mean ``(row, col)``
  pixel index;
- ``area_mm2`` the pixel count times the pixel area;
- ``diameter_mm`` :func:`medrt.phantom.longest_diameter_mm` (the longest chord
  between pixel centres plus one pixel's extent along it), evaluated on the
  component's convex-hull vertices: the same number, without the quadratic cost
  on large components.

A 4096² radiograph holds a few small lesions, so the map is first cut into
boxes around the foreground along empty rows and columns (an XY cut); labelling
and measuring run only inside those boxes. ``lesion_to_json`` and
``lesion_from_json`` define the lesion record of the public ``results.jsonl``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from medrt.analysis import components
from medrt.analysis.components import Box
from medrt.bands import at_least
from medrt.phantom.shapes import longest_chord_mm, longest_diameter_mm
from medrt.types import Lesion

__all__ = ["MAX_LESIONS", "lesions_from_probability", "lesion_to_json", "lesion_from_json"]

log = logging.getLogger(__name__)

_MAX_LABEL = int(np.iinfo(np.uint16).max)
MAX_LESIONS = 1000
# Masks with fewer pixels than this go straight to longest_diameter_mm.
_HULL_MIN_PIXELS = 64



@dataclass(frozen=True, slots=True)
class _Component:
    """One measured component before labels are assigned; ``mask`` is inside ``bbox``."""

    pixels: int
    bbox: Box
    centroid: tuple[float, float]
    mask: np.ndarray
    diameter_mm: float
    score: float
    max_score: float
    rechecked: bool

    @property
    def order(self) -> tuple[int, int, int, float, float]:
        return (-self.pixels, self.bbox[0], self.bbox[1], self.centroid[0], self.centroid[1])


def lesions_from_probability(
    prob: np.ndarray,
    spacing_mm: tuple[float, float] | None,
    threshold: float = 0.5,
    min_area_px: int = 1,
    rechecked_mask: np.ndarray | None = None,
    max_lesions: int = MAX_LESIONS,
    min_diameter_mm: float = 0.0,
    within: list[Box] | tuple[Box, ...] | None = None,
) -> tuple[np.ndarray, list[Lesion]]:
    """Label the components of ``prob >= threshold`` and measure each as a Lesion.

    ``prob`` is a float ``(rows, cols)`` map in [0, 1]. ``spacing_mm`` is
    ``(row, col)`` in mm; when it is None, 1 mm is assumed, so ``area_mm2`` and
    ``diameter_mm`` are then in pixels² and pixels. Components smaller than
    ``min_area_px`` pixels are dropped, and only the ``max_lesions`` largest are
    kept (a warning is logged): an untrained or broken model's speckle map then
    costs a second, not minutes. A lesion is ``rechecked`` when any of its pixels
    is set in ``rechecked_mask`` (same shape as ``prob``). Components whose longest
    diameter is under ``min_diameter_mm`` are dropped too (the analyzer's
    ``AnalyzerConfig.min_diameter_mm``: a speck of a pixel or two is not a lesion).

    ``within``: boxes that the caller knows hold every pixel ``>= threshold`` (the fine
    sweep's kept components, whose map is 0 elsewhere above the floor); only they are
    scanned, not the whole frame (a 4096² map: two 16 M-pixel passes). Overlapping boxes
    are merged. The lesions are those of the whole-frame scan, except which of equal-
    sized components ``max_lesions`` keeps.

    Returns ``(labels, lesions)``: a uint16 label map (0 = background) and the
    lesions, labelled 1..n by area, largest first (ties: top-most, then
    left-most), so the same map always gives the same labels.
    """
    prob = np.asarray(prob)
    if prob.ndim != 2:
        raise ValueError(f'Argument "prob" must be a 2-D array, got shape {prob.shape}')
    if rechecked_mask is not None:
        rechecked_mask = np.asarray(rechecked_mask, dtype=bool)
        if rechecked_mask.shape != prob.shape:
            raise ValueError(
                f'Argument "rechecked_mask" must have the shape of "prob" {prob.shape}, '
                f"got {rechecked_mask.shape}"
            )
    if not threshold > 0.0:
        raise ValueError(f'Argument "threshold" must be > 0, got {threshold}')
    if min_area_px < 1:
        raise ValueError(f'Argument "min_area_px" must be >= 1, got {min_area_px}')
    if not min_diameter_mm >= 0.0:
        raise ValueError(f'Argument "min_diameter_mm" must be >= 0, got {min_diameter_mm}')
    if not 1 <= max_lesions <= _MAX_LABEL:
        raise ValueError(f'Argument "max_lesions" must be in 1..{_MAX_LABEL}, got {max_lesions}')
    spacing = (1.0, 1.0) if spacing_mm is None else (float(spacing_mm[0]), float(spacing_mm[1]))
    if not (spacing[0] > 0.0 and spacing[1] > 0.0):
        raise ValueError(f'Argument "spacing_mm" must be positive, got {spacing_mm}')

    if within is None:
        boxes = _label_boxes(at_least(prob, threshold), min_area_px)
    else:
        boxes = []
        for r0, c0, r1, c1 in _disjoint(within, prob.shape):
            for (b0, d0, b1, d1), comps in _label_boxes(prob[r0:r1, c0:c1] >= threshold, min_area_px):
                boxes.append(((r0 + b0, c0 + d0, r0 + b1, c0 + d1), comps))
    found: list[_Component] = []
    for box, comps, keep in _select(boxes, max_lesions, threshold):
        found.extend(_measure(comps, keep, box, prob, spacing, rechecked_mask))
    found = [c for c in found if c.diameter_mm >= min_diameter_mm]
    found.sort(key=lambda c: c.order)

    labels = np.zeros(prob.shape, dtype=np.uint16)
    pixel_area = spacing[0] * spacing[1]
    lesions: list[Lesion] = []
    for label, c in enumerate(found, start=1):
        r0, c0, r1, c1 = c.bbox
        labels[r0:r1, c0:c1][c.mask] = label
        lesions.append(
            Lesion(
                label=label,
                bbox=c.bbox,
                centroid=c.centroid,
                area_mm2=c.pixels * pixel_area,
                diameter_mm=c.diameter_mm,
                score=c.score,
                max_score=c.max_score,
                rechecked=c.rechecked,
            )
        )
    return labels, lesions


def lesion_to_json(lesion: Lesion, in_mm: bool = True) -> dict[str, Any]:
    """The public ``results.jsonl`` record of a lesion.

    ``{id, bbox: [r0, c0, r1, c1], centroid: [r, c], area_mm2, diameter_mm, score,
    rechecked}``; ``id`` is the lesion's value in the frame's label map. ``in_mm`` False
    (a frame without pixel spacing, measured in pixels): ``area_mm2`` and ``diameter_mm``
    are null and ``area_px`` and ``diameter_px`` hold the sizes, so that no pixel count
    is read as millimetres.
    """
    area, diameter = round(float(lesion.area_mm2), 4), round(float(lesion.diameter_mm), 4)
    return {
        "id": int(lesion.label),
        "bbox": [int(v) for v in lesion.bbox],
        "centroid": [round(float(lesion.centroid[0]), 3), round(float(lesion.centroid[1]), 3)],
        "area_mm2": area if in_mm else None,
        "diameter_mm": diameter if in_mm else None,
        **({} if in_mm else {"area_px": area, "diameter_px": diameter}),
        "score": round(float(lesion.score), 4),
        "rechecked": bool(lesion.rechecked),
    }


def lesion_from_json(record: dict[str, Any]) -> Lesion:
    """Read a :func:`lesion_to_json` record back; raises KeyError/ValueError/TypeError if malformed.

    The record has no peak probability, so ``max_score`` is set to ``score``.
    """
    bbox = tuple(int(v) for v in record["bbox"])
    centroid = tuple(float(v) for v in record["centroid"])
    if len(bbox) != 4 or len(centroid) != 2:
        raise ValueError("bbox must have 4 values and centroid 2")
    score = float(record["score"])
    return Lesion(
        label=int(record["id"]),
        bbox=bbox,  # type: ignore[arg-type]
        centroid=centroid,  # type: ignore[arg-type]
        # (in pixels, as measured, where the frame had no spacing: lesion_to_json's in_mm)
        area_mm2=float(record["area_mm2"] if record["area_mm2"] is not None else record["area_px"]),
        diameter_mm=float(record["diameter_mm"] if record["diameter_mm"] is not None else record["diameter_px"]),
        score=score,
        max_score=score,
        rechecked=bool(record.get("rechecked", False)),
    )


def _disjoint(boxes: list[Box] | tuple[Box, ...], shape: tuple[int, ...]) -> list[Box]:
    """``boxes`` cut to the frame, overlapping ones merged into their union until none
    overlap: a component inside one of the given boxes is then inside exactly one."""
    rows, cols = shape[-2:]
    out = [(max(r0, 0), max(c0, 0), min(r1, rows), min(c1, cols)) for r0, c0, r1, c1 in boxes]
    out = [b for b in out if b[2] > b[0] and b[3] > b[1]]
    changed = True
    while changed:  # a pass merges each box into the first it overlaps; unions may overlap anew
        changed = False
        merged: list[Box] = []
        for b in sorted(out):
            for k, m in enumerate(merged):
                if m[0] < b[2] and b[0] < m[2] and m[1] < b[3] and b[1] < m[3]:
                    merged[k] = (min(m[0], b[0]), min(m[1], b[1]), max(m[2], b[2]), max(m[3], b[3]))
                    changed = True
                    break
            else:
                merged.append(b)
        out = merged
    return sorted(out)


def _label_boxes(fg: np.ndarray, min_area_px: int) -> list[tuple[Box, components.Components]]:
    """Each box's components, renumbered 1..n by size (largest first)."""
    out = []
    for box in components.foreground_boxes(fg):
        r0, c0, r1, c1 = box
        comps = components.by_size(components.label(fg[r0:r1, c0:c1]), min_area_px)
        if len(comps):
            out.append((box, comps))
    return out


def _select(
    boxes: list[tuple[Box, components.Components]], max_lesions: int, threshold: float
) -> list[tuple[Box, components.Components, int]]:
    """Keep the ``max_lesions`` largest components: ``(box, its components, labels 1..k kept)``.

    Labels in a box are sorted by size, so what a box keeps is always a prefix.
    """
    total = sum(len(comps) for _, comps in boxes)
    if total <= max_lesions:
        return [(box, comps, len(comps)) for box, comps in boxes]
    log.warning(
        "%d components above threshold %.3g: keeping the %d largest",
        total,
        threshold,
        max_lesions,
    )
    ranked = sorted(
        (-int(n), b, k)
        for b, (_, comps) in enumerate(boxes)
        for k, n in enumerate(comps.sizes[:max_lesions], 1)
    )
    keep = [0] * len(boxes)
    for _, b, k in ranked[:max_lesions]:
        keep[b] = max(keep[b], k)
    return [(box, comps, k) for (box, comps), k in zip(boxes, keep, strict=True) if k]


def _measure(
    comps: components.Components,
    keep: int,
    box: Box,
    prob: np.ndarray,
    spacing: tuple[float, float],
    rechecked_mask: np.ndarray | None,
) -> list[_Component]:
    """Measure labels 1..``keep`` of the components of a box whose top-left is at ``box[:2]``."""
    out: list[_Component] = []
    for k in range(1, keep + 1):
        y0, x0, y1, x1 = comps.box(k)
        mask = comps.mask(k)
        br0, bc0, br1, bc1 = box[0] + y0, box[1] + x0, box[0] + y1, box[1] + x1  # in the frame
        window = (slice(br0, br1), slice(bc0, bc1))
        rows, cols = np.nonzero(mask)
        p = prob[window][mask]
        out.append(
            _Component(
                pixels=int(rows.size),
                bbox=(br0, bc0, br1, bc1),
                centroid=(br0 + float(rows.mean()), bc0 + float(cols.mean())),
                mask=mask,
                diameter_mm=_diameter_mm(mask, spacing),
                score=float(p.mean(dtype=np.float64)),
                max_score=float(p.max()),
                rechecked=bool(rechecked_mask is not None and rechecked_mask[window][mask].any()),
            )
        )
    return out


def _diameter_mm(mask: np.ndarray, spacing: tuple[float, float]) -> float:
    """:func:`longest_diameter_mm` of ``mask``, computed on its convex-hull vertices.

    The longest chord always joins two hull vertices, so the result is the same;
    the pairwise search then runs on tens of points, not thousands. The hull of each
    row's first and last pixel is Qhull's (``scipy.spatial.ConvexHull``); it replaced a
    monotone chain in Python that took ~2 ms of a radiograph's measuring here, and ~3x
    that on a GPU machine's host.
    """
    if int(np.count_nonzero(mask)) < _HULL_MIN_PIXELS:
        return longest_diameter_mm(mask, spacing)
    from scipy.spatial import ConvexHull, QhullError

    rows = np.flatnonzero(mask.any(axis=1))
    sub = mask[rows]
    first = sub.argmax(axis=1)
    last = sub.shape[1] - 1 - sub[:, ::-1].argmax(axis=1)
    two = last != first
    points = np.concatenate([np.stack([rows, first], axis=1), np.stack([rows[two], last[two]], axis=1)])
    try:
        points = points[ConvexHull(points).vertices]
    except QhullError:  # all on one line (one row or column, or a diagonal): no 2-D hull
        pass
    # distinct points, in np.unique's order (rows, then columns), as longest_diameter_mm's
    return longest_chord_mm(points[np.lexsort((points[:, 1], points[:, 0]))].astype(np.float64), spacing)
