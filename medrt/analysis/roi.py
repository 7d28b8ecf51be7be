"""ROI classifier: thumbnail -> presence and a cell heatmap -> proposals -> 1024² crops.

A frame whose presence and heatmap both stay under their thresholds is
negative: the UNet is skipped for it (conditional compute). A 2.5-D classifier
(``[model] slices = 3``) also sees the neighbouring slices' thumbnails.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from medrt.analysis.components import label
from medrt.analysis.slices import Sides
from medrt.engine.backends.base import Backend
from medrt.preprocess import normalize, pad_to_multiple, thumbnail
from medrt.types import RoiProposal, Window

__all__ = ["RoiProposal", "RoiResult", "classify", "thumbnail_input", "proposals_from_heatmap", "proposals_from_boxes", "plan_crops"]


@dataclass(frozen=True, slots=True)
class RoiResult:
    presence: float
    proposals: tuple[RoiProposal, ...]
    crops: tuple[tuple[int, int, int, int], ...]  # (r0, c0, r1, c1), may reach past the frame

    @property
    def negative(self) -> bool:
        return not self.crops


def _probability(x: np.ndarray, activation: str) -> np.ndarray:
    """An output as a probability: the sigmoid of a logit output, a probability output
    (``activation = "none"``) as it is."""
    return 1.0 / (1.0 + np.exp(-x)) if activation == "sigmoid" else np.clip(x, 0.0, 1.0)


def classify(
    model: Backend,
    pixels: np.ndarray,
    window: Window | tuple[float, float],
    *,
    crop: int = 1024,
    presence_threshold: float | None = None,
    heatmap_threshold: float | None = None,
    margin_px: int | None = None,
    max_crops: int = 8,
    neighbours: Sides = (None, None),
) -> RoiResult:
    """Run the ROI classifier on ``pixels`` (modality units) and plan the crops. A 2.5-D
    classifier (``[model] slices = 3``) also gets the thumbnails of ``neighbours``, the
    head- and feet-side slices' pixels (:func:`medrt.analysis.slices.ordered_sides`; a
    missing one is this slice again, as in training). ``window`` is the frame's VOI
    window; a ``fixed_window`` classifier uses its own (:meth:`ModelSpec.input_window`)."""
    spec = model.spec
    window = spec.input_window(window)
    p_thr = spec.thresholds.get("presence", 0.5) if presence_threshold is None else presence_threshold
    h_thr = spec.thresholds.get("heatmap", 0.3) if heatmap_threshold is None else heatmap_threshold
    x, factor = thumbnail_input(pixels, window, spec.thumbnail, spec.slices, neighbours)
    x, _ = pad_to_multiple(x, max(spec.stride, spec.multiple_of))
    outs = dict(zip(model.output_names, model.infer(x[None] if x.ndim == 3 else x[None, None]), strict=True))
    presence = float(_probability(outs["presence"].reshape(-1)[:1], spec.output("presence").activation)[0])
    heat = _probability(outs["heatmap"][0, 0], spec.output("heatmap").activation)
    cell = factor * spec.stride
    margin = cell if margin_px is None else margin_px
    proposals = proposals_from_heatmap(heat, cell, pixels.shape, h_thr, margin)
    if presence < p_thr and not proposals:
        return RoiResult(presence, (), ())
    if not proposals:  # present but not localised: look at the whole frame
        proposals = (RoiProposal((0, 0, pixels.shape[0], pixels.shape[1]), presence),)
    return RoiResult(presence, proposals, plan_crops(proposals, pixels.shape, crop, max_crops))


def thumbnail_input(pixels: np.ndarray, window: tuple[float, float], side: int, slices: int = 1,
                    neighbours: Sides = (None, None)) -> tuple[np.ndarray, int]:
    """A classifier's input before padding, and the thumbnail's factor: the frame's
    thumbnail (longest side at most ``side``) normalised by ``window``; with ``slices=3``
    a (3, h, w) stack of the head-side neighbour's, this and the feet-side neighbour's
    (a missing one: this thumbnail again)."""
    thumb, factor = thumbnail(pixels, side)
    x = normalize(thumb, *window)
    if slices == 3:
        x = np.stack([x if nb is None else normalize(thumbnail(nb, side)[0], *window)
                      for nb in (neighbours[0], None, neighbours[1])])
    return x, factor


def proposals_from_heatmap(
    heat: np.ndarray, cell: int, shape: tuple[int, int], threshold: float, margin: int
) -> tuple[RoiProposal, ...]:
    """Connected groups of cells over ``threshold`` -> boxes in source pixels (plus a margin)."""
    hot = (heat >= threshold).astype(np.uint8)
    if not hot.any():
        return ()
    comps = label(hot)
    rows, cols = shape
    out = []
    for k in range(1, len(comps) + 1):
        y0, x0, y1, x1 = comps.box(k)
        score = float(heat[comps.slices[k - 1]][comps.mask(k)].max())
        r0 = max(0, y0 * cell - margin)
        c0 = max(0, x0 * cell - margin)
        r1 = min(rows, y1 * cell + margin)
        c1 = min(cols, x1 * cell + margin)
        out.append(RoiProposal((int(r0), int(c0), int(r1), int(c1)), score))
    out.sort(key=lambda p: -p.score)
    return tuple(out)


def proposals_from_boxes(
    boxes: Sequence[tuple[int, int, int, int]], shape: tuple[int, int], margin: int = 64
) -> list[RoiProposal]:
    """Known boxes (e.g. ground-truth lesions) as certain proposals, widened by ``margin``
    pixels and clipped to the frame: what the calibration and the accuracy gate crop
    around instead of asking the classifier."""
    rows, cols = shape
    return [RoiProposal((max(0, r0 - margin), max(0, c0 - margin), min(rows, r1 + margin), min(cols, c1 + margin)), 1.0)
            for r0, c0, r1, c1 in boxes]


def plan_crops(
    proposals: tuple[RoiProposal, ...] | list[RoiProposal], shape: tuple[int, int], crop: int = 1024, max_crops: int = 8
) -> tuple[tuple[int, int, int, int], ...]:
    """``crop``² windows that together cover every proposal, greedily, strongest first.

    A proposal joins an existing window when the union of what that window must
    cover still fits in ``crop``²; otherwise it opens a new one, and one larger
    than ``crop`` is tiled. A frame no larger than ``crop`` is one window. Windows
    are centred on what they cover and kept inside the frame where it is large
    enough. Past ``max_crops`` the frame is tiled instead.
    """
    rows, cols = shape
    if rows <= crop and cols <= crop:  # the whole frame, as it is (a 512² CT slice is not padded to 1024²)
        return ((0, 0, rows, cols),)
    groups: list[list[int]] = []  # each a covered union [r0, c0, r1, c1]
    for prop in proposals:
        r0, c0, r1, c1 = prop.bbox
        if r1 - r0 > crop or c1 - c0 > crop:
            for tr in range(r0, r1, crop):
                for tc in range(c0, c1, crop):
                    groups.append([tr, tc, min(tr + crop, r1), min(tc + crop, c1)])
            continue
        for g in groups:
            u = [min(g[0], r0), min(g[1], c0), max(g[2], r1), max(g[3], c1)]
            if u[2] - u[0] <= crop and u[3] - u[1] <= crop:
                g[:] = u
                break
        else:
            groups.append([r0, c0, r1, c1])
    if len(groups) > max_crops:
        return _tile(shape, crop)
    return tuple(_centre(g, shape, crop) for g in groups)


def _centre(g: list[int], shape: tuple[int, int], crop: int) -> tuple[int, int, int, int]:
    out = []
    for lo, hi, size in ((g[0], g[2], shape[0]), (g[1], g[3], shape[1])):
        start = (lo + hi) // 2 - crop // 2
        start = min(max(start, 0), max(size - crop, 0)) if size >= crop else 0
        out.append(start)
    return (out[0], out[1], out[0] + crop, out[1] + crop)


def _tile(shape: tuple[int, int], crop: int) -> tuple[tuple[int, int, int, int], ...]:
    rows, cols = shape
    nr, nc = math.ceil(rows / crop), math.ceil(cols / crop)
    out = []
    for i in range(nr):
        for j in range(nc):
            r0 = min(i * crop, max(rows - crop, 0))
            c0 = min(j * crop, max(cols - crop, 0))
            out.append((r0, c0, r0 + crop, c0 + crop))
    return tuple(out)
