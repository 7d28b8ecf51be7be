"""Fine sweep: a frame much finer than the UNet is segmented again at twice its scale.

``lesion_unet`` runs at 0.5 mm, so a 0.125 mm radiograph is area-averaged 4× before
its first pass, and a 2-3 mm nodule is 4-6 network pixels: on 32 validation
radiographs (seed 5000) the first pass with the small-lesion recheck
(:mod:`medrt.analysis.recheck`) found 42 of 61 nodules, and most of the misses had
probability 0 there, so no recheck candidate came of them. The same network over the
whole frame at 0.25 mm (area-averaged 2×, the scale the recheck runs at) found 53,
but with 5 false positives per frame: lung texture seen twice as large.

Those false marks are not stable under a mirror image of the input; the nodules are.
So each component of the fine map is run again on a window around it flipped left to
right and top to bottom (``SweepConfig.flips``), and kept only when the least of its
probabilities over the views reaches ``confirm`` at its peak (0.999, or the segmenter's own
``[thresholds] confirm``: how sure a network is, is the network's) and it is at least
``min_diameter_mm`` long. What comes out is the fine map with the other components
taken off, masks at 0.25 mm; it takes the place of the first pass and the recheck,
which then do not run (:meth:`medrt.analyzer.Analyzer.segment`).

Chosen on the validation frames (one run, rules scored side by side, whole-frame
flipped views): 52 of 61 nodules at 0 false positives per frame, Dice 0.93 (first pass
and recheck over the whole frame: 42, 0.25, 0.91). Also scored: keeping components the
first pass marked from 0.9 over the views (52, 0.03), and only the left-right flip
(51, 0.09-0.31 as the threshold goes). Held out (seed 9000, 40 radiographs): 57 of 63
at 0.05, Dice 0.88, 2-5 mm 17 of 20 (first pass and recheck: 39, 0.225, 0.84).

Only frames finer than the model's spacing by the resample ratio are swept
(:func:`medrt.analysis.resample.recheck_factors`): radiographs, not CT slices, which
already run at their own resolution. On the ROI path the sweep covers the crops (with
context, as :func:`medrt.analysis.segment.segment_crops`); over the whole frame it is a
sliding window at the finer scale.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from medrt.analysis.lesions import MAX_LESIONS, lesions_from_probability
from medrt.analysis.resample import Bilinear, Factors, area_downsample, recheck_factors
from medrt.analysis.segment import (
    CROP_CONTEXT,
    _region,
    _run_many,
    _segment_crops,
    _sigmoid,
    _sliding_window,
)
from medrt.engine.backends.base import Backend
from medrt.preprocess import Windowed

__all__ = ["CONFIRM", "SweepConfig", "Swept", "sweep", "view_window", "FLIPS"]

log = logging.getLogger(__name__)

CONFIRM = 0.999  # SweepConfig.confirm for a segmenter whose spec sets none
FLIPS = {"h": -1, "v": -2}  # the array axis each flip mirrors: left-right, top-bottom
PROB_FLOOR_MAX = 0.99  # the fine map is exact from its threshold up, at most from here


@dataclass(frozen=True, slots=True)
class SweepConfig:
    """Settings of :func:`sweep`, chosen on validation radiographs (module docstring)."""

    # The least probability over the views that a component of the fine map needs at
    # its peak, and its least length. None: the segmenter's spec's [thresholds] confirm,
    # else CONFIRM (a network's probabilities are its own: lesion_unet_dx 1.1, trained on
    # drawn-in faint nodules, marks more of everything at 0.999 and is confirmed at 0.9999).
    confirm: float | None = None
    min_diameter_mm: float = 1.5
    flips: tuple[str, ...] = ("h", "v")
    # Frame around a component in its flipped views, each side. 16, 32 and 48 mm found
    # the same nodules with the same false positives on the validation radiographs.
    view_margin_mm: float = 32.0
    # On a backend where a new input shape is costly (Backend.few_shapes: a GPU), views
    # are grown (more frame around the component, centred) to whole multiples of this
    # many network pixels, and moved inside the frame rather than cut at its edges, so
    # that they come in a few sizes, all warmed up (view_sides; cudnn's algorithm search
    # or a CUDA graph capture cost 0.2-1 s per new shape on an H200). Same nodules,
    # false positives and Dice on the 32 validation and 40 held-out radiographs as
    # without; on the CPU, where the larger views cost 12 % more time per radiograph,
    # they stay at the margin. 0: never.
    view_bucket: int = 64
    # Components checked per frame, the strongest first; the rest are dropped unchecked
    # (a broken model's speckle then costs a bounded time).
    max_views: int = 32
    # Sliding-window side in network pixels over the whole frame: a 4096² radiograph at
    # 0.25 mm is one window (2048: the same findings as 1024 on the validation frames, in
    # 60 % of the time)
    window: int = 2048
    overlap: float = 0.25
    context: int = 2 * CROP_CONTEXT  # network pixels around each crop: 16 mm at 0.25 mm

    def __post_init__(self) -> None:
        unknown = [f for f in self.flips if f not in FLIPS]
        if unknown or not self.flips:
            raise ValueError(f'Argument "flips" must name at least one of {sorted(FLIPS)}, got {self.flips!r}')
        if self.confirm is not None and not 0.0 < self.confirm <= 1.0:
            raise ValueError(f'Argument "confirm" must be in (0, 1], got {self.confirm!r}')
        if self.view_bucket < 0:
            raise ValueError(f'Argument "view_bucket" must be >= 0, got {self.view_bucket!r}')

    def view_sides(self, model_spacing_mm: float, multiple: int, largest_mm: float = 30.0) -> list[int]:
        """The sides, in network pixels, of the views around components up to ``largest_mm``
        long inside a large frame at the sweep's scale (half ``model_spacing_mm``): what a
        GPU backend warms up. Empty without buckets."""
        bucket = _bucket(self.view_bucket, multiple)
        if not bucket:
            return []
        fine = model_spacing_mm / 2.0
        least = 2.0 * self.view_margin_mm / fine + 1.0
        most = least + largest_mm / fine + multiple
        return list(range(int(-(-least // bucket) * bucket), int(-(-most // bucket) * bucket) + 1, bucket))


def _bucket(view_bucket: int, multiple: int) -> int:
    """``view_bucket`` rounded up to the model's multiple (0 stays 0)."""
    return -(-view_bucket // multiple) * multiple if view_bucket else 0


class Swept(NamedTuple):
    """What :func:`sweep` gives: the fine map (0 outside the swept area and where a
    component was dropped; exact from the threshold up), the swept mask, the flipped
    views run, and the boxes of the components kept (every pixel of ``prob`` at or
    above the threshold lies in one: :func:`lesions_from_probability`'s ``within``;
    None past ``MAX_LESIONS`` components, when the unlisted ones were not checked)."""

    prob: np.ndarray
    swept: np.ndarray
    views: int
    kept: tuple[tuple[int, int, int, int], ...] | None


def sweep(
    model: Backend,
    norm: np.ndarray | Windowed,
    spacing_mm: tuple[float, float] | None,
    threshold: float,
    cfg: SweepConfig = SweepConfig(),
    crops: tuple[tuple[int, int, int, int], ...] | list[tuple[int, int, int, int]] | None = None,
) -> Swept | None:
    """The fine sweep of one frame (:class:`Swept`), or None when
    the frame is not finer than the model or ``crops`` is empty (nothing to sweep: the
    first pass and the recheck run as for CT, on no crops nothing).

    ``crops`` (source boxes) limits the sweep to the ROI path's crops; None sweeps the
    whole frame. The map is 0 outside the swept mask and takes the place of the first
    pass and the recheck. ``cfg.confirm`` None: the model's spec's ``[thresholds] confirm``,
    else :data:`CONFIRM`."""
    if cfg.confirm is None:
        cfg = replace(cfg, confirm=float(getattr(model.spec, "thresholds", {}).get("confirm", CONFIRM)))
    factors = recheck_factors(spacing_mm, getattr(model.spec, "spacing_mm", None))
    if factors is None or (crops is not None and not len(crops)):
        return None
    rows, cols = norm.shape[-2:]
    # The fine map is read only from the threshold up (components, their peaks and
    # views), so it is resampled exactly from there (segment's floor): a radiograph's
    # lung texture reaches 1 % in ~130 places, the threshold in a few.
    floor = min(threshold, PROB_FLOOR_MAX)
    if crops is None:
        fine, blocks = _sliding_window(model, norm, cfg.window, cfg.overlap, spacing_mm=None, factors=factors,
                                       floor=floor)
        swept = np.broadcast_to(np.True_, (rows, cols))  # all of it, read-only, no 16 MB to fill
    else:
        fine, blocks = _segment_crops(model, norm, crops, factors=factors, context=cfg.context, floor=floor)
        swept = np.zeros((rows, cols), bool)
        for r0, c0, r1, c1 in crops:
            swept[max(r0, 0):r1, max(c0, 0):c1] = True
    # every pixel at or above the floor, so the threshold, lies in one of the blocks
    labels, lesions = lesions_from_probability(fine, spacing_mm, threshold, within=blocks)
    checks: list[tuple[float, int, tuple[int, int, int, int]]] = []  # peak, label, bbox
    drop: list[tuple[int, tuple[int, int, int, int]]] = []
    for les in lesions:
        r0, c0, r1, c1 = les.bbox
        peak = float(fine[r0:r1, c0:c1][labels[r0:r1, c0:c1] == les.label].max())
        if peak < cfg.confirm or les.diameter_mm < cfg.min_diameter_mm:  # no view can lift it
            drop.append((les.label, les.bbox))
        else:
            checks.append((peak, les.label, les.bbox))
    checks.sort(key=lambda c: (-c[0], c[2]))
    if len(checks) > cfg.max_views:
        log.debug("fine sweep: %d components, the %d strongest checked", len(checks), cfg.max_views)
        drop += [(label, bbox) for _, label, bbox in checks[cfg.max_views:]]
    views = 0
    sr, sc = spacing_mm if spacing_mm is not None else (1.0, 1.0)
    margin = (int(np.ceil(cfg.view_margin_mm / sr)), int(np.ceil(cfg.view_margin_mm / sc)))
    multiple = max(1, model.spec.multiple_of)
    axes = [FLIPS[flip] for flip in cfg.flips]
    bucket = _bucket(cfg.view_bucket, multiple) if getattr(model, "few_shapes", False) else 0
    for _, label, bbox in checks[: cfg.max_views]:
        r0, c0, r1, c1 = bbox
        mask = labels[r0:r1, c0:c1] == label
        least = fine[r0:r1, c0:c1][mask]
        window = view_window(bbox, margin, factors, multiple, bucket, (rows, cols))
        for view in _flipped_views(model, norm, bbox, window, factors, axes):  # one batch on a GPU
            least = np.minimum(least, view[mask])
            views += 1
        if float(least.max()) < cfg.confirm:
            drop.append((label, bbox))
    for label, (r0, c0, r1, c1) in drop:
        window = fine[r0:r1, c0:c1]
        window[labels[r0:r1, c0:c1] == label] = 0.0
    dropped = {label for label, _ in drop}
    # (past MAX_LESIONS components the smallest were never listed, nor dropped: unknown)
    kept = None if len(lesions) >= MAX_LESIONS else tuple(les.bbox for les in lesions if les.label not in dropped)
    return Swept(fine, swept, views, kept)


def view_window(
    bbox: tuple[int, int, int, int], margin: tuple[int, int], factors: Factors, multiple: int, bucket: int,
    shape: tuple[int, int],
) -> tuple[int, int, int, int]:
    """The source window of a component's flipped views: ``bbox`` with ``margin`` source
    pixels more on each side, starting and ending on the fine grid (whole model blocks of
    ``factors`` · ``multiple`` source pixels), so that the network sees the same blocks it
    saw in the sweep, mirrored.

    ``bucket`` (network pixels, a multiple of ``multiple``; 0 = off) grows the window,
    centred, to whole buckets, and a window reaching past the frame is moved inside it;
    it is cut at the frame's edges only where the frame is smaller than it. Without
    buckets the window stops at the frame's edges where the grid allows (its first
    pixel; its last when the frame is whole blocks), so the logits come back clamped
    there as in the sweep."""
    (w0, w1), (v0, v1) = (_span(bbox[0], bbox[2], margin[0], factors[0], multiple, bucket, shape[0]),
                          _span(bbox[1], bbox[3], margin[1], factors[1], multiple, bucket, shape[1]))
    return w0, v0, w1, v1


def _span(a0: int, a1: int, margin: int, factor: int, multiple: int, bucket: int, length: int) -> tuple[int, int]:
    """One axis of :func:`view_window`: ``a0:a1`` (source pixels) widened."""
    unit = factor * multiple
    w0 = ((a0 - margin) // unit) * unit
    w1 = w0 + -(-(a1 + margin - w0) // unit) * unit
    whole = length % factor == 0  # the frame ends on the model's grid
    if bucket:
        step = factor * bucket
        size = -(-(w1 - w0) // step) * step
        w0 -= ((size - (w1 - w0)) // (2 * unit)) * unit
        if whole and w0 + size > length:  # move it inside, keeping the grid; a frame that
            # does not end on it is cut below, and the model's padding brings back the size
            w0 = -(-(length - size) // unit) * unit
        w0 = max(w0, 0)
        w1 = w0 + size
    else:
        w0 = max(w0, 0)
    return w0, min(w1, length) if whole else w1


def _fine_window(norm: np.ndarray | Windowed, window: tuple[int, int, int, int], factors: Factors,
                 axes: list[int]) -> np.ndarray | None:
    """The network's input for ``window`` cut from the frame's block means at the sweep's
    scale, which the whole-frame sweep has already made (a :class:`Windowed` frame keeps
    them), instead of normalising and averaging the window again; None where that would
    not give the same values bit for bit, and the caller does it the long way.

    Same values when the window and the frame both lie on whole blocks (so the blocks are
    the frame's, and padding is whole blocks of 0) and each flipped axis is averaged over
    at most 2 pixels: a block mean of a mirrored pair adds the same two numbers the other
    way round (exact in floating point), where three would be summed in another order.
    A 0.1-0.15 mm radiograph against the 0.5 mm UNet is swept at (2, 2)."""
    if not isinstance(norm, Windowed) or factors == (1, 1):
        return None
    fr, fc = factors
    w0, v0, w1, v1 = window
    rows, cols = norm.shape
    if any(factors[axis] > 2 for axis in axes) or rows % fr or cols % fc or w0 % fr or w1 % fr or v0 % fc or v1 % fc:
        return None
    return _region(norm.block_mean(fr, fc), w0 // fr, v0 // fc, w1 // fr, v1 // fc)


def _flipped_views(
    model: Backend, norm: np.ndarray | Windowed, bbox: tuple[int, int, int, int], window: tuple[int, int, int, int],
    factors: Factors, axes: list[int],
) -> list[np.ndarray]:
    """The fine-scale probability over ``bbox`` from the network run on ``window``
    (:func:`view_window`) mirrored along each of ``axes``, mirrored back; the views go
    to the model as one batch where it takes one. Only the bbox's pixels are brought
    back to the source grid (:class:`Bilinear` blocks hold exactly the whole-window
    values): the window is ~10x the bbox's area, and upsampling all of it was ~3 ms per
    view on a GPU machine's host."""
    r0, c0, r1, c1 = bbox
    w0, v0, w1, v1 = window
    rows, cols = w1 - w0, v1 - v0
    fine = _fine_window(norm, window, factors, axes)
    if fine is not None:
        small = [np.ascontiguousarray(np.flip(fine, axis=axis)) for axis in axes]
    else:
        region = _region(norm, w0, v0, w1, v1)
        flipped = [np.ascontiguousarray(np.flip(region, axis=axis)) for axis in axes]
        small = flipped if factors == (1, 1) else [area_downsample(r, factors) for r in flipped]
    out = []
    for axis, logits in zip(axes, _run_many(model, small), strict=True):
        # the bbox as it lies in the mirrored window
        b0, b1 = (r0 - w0, r1 - w0) if axis == -1 else (rows - (r1 - w0), rows - (r0 - w0))
        d0, d1 = (cols - (c1 - v0), cols - (c0 - v0)) if axis == -1 else (c0 - v0, c1 - v0)
        if factors == (1, 1):
            block = logits[b0:b1, d0:d1]
        else:
            block = Bilinear(logits, factors, (rows, cols)).block(b0, d0, b1, d1)
        out.append(_sigmoid(np.ascontiguousarray(np.flip(block, axis=axis))))
    return out
