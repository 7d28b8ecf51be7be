"""Multi-scale recheck: small and faint candidates are segmented again at 2× scale.

A 2 mm nodule on a 0.125 mm radiograph is 16 pixels across, and a 2 mm CT
lesion 3 pixels: the UNet's first pass sees them at the edge of what it
resolves. For each small component (longest diameter under ``max_diameter_mm``)
and each faint candidate (a peak between ``faint_low`` and the detection
threshold), a window around it is segmented again at twice the scale of the
first pass, brought back to source resolution and written over the first pass
inside that window. Pixels of large components are never touched, so the
recheck changes only small or faint candidates.

Twice the scale depends on where the first pass ran (:mod:`medrt.analysis.resample`):

- at the frame's own resolution (CT slices, or a model without ``[model]
  spacing_mm``): the window is upsampled 2× (nearest, as the training's zoom),
  segmented, and brought back by a 2×2 mean;
- area-averaged by ``f`` to the model's spacing (radiographs): the window is
  area-averaged by about ``f/2`` instead (``recheck_factors``; 1 = source
  resolution), and the logits are interpolated back onto the source grid.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from medrt.analysis.components import foreground_boxes, label
from medrt.analysis.resample import recheck_factors
from medrt.analysis.segment import _logits_at, _region, _run, _sigmoid
from medrt.bands import at_least
from medrt.engine.backends.base import Backend
from medrt.types import Lesion

__all__ = ["RecheckConfig", "recheck", "recheck_map", "candidates"]


@dataclass(frozen=True, slots=True)
class RecheckConfig:
    # Chosen on validation phantoms (CT seeds 5100-5107, 16 radiographs from seed 5000;
    # one first pass, settings side by side): against 5 mm and 0.25, rechecking
    # lesions up to 8 mm and faint peaks from 0.15 found 2 more CT lesions of 5-10 mm
    # and 1 more 2-5 mm nodule, at 0.172 instead of 0.181 false positives per slice and
    # the same 0.31 per radiograph, radiograph Dice 0.83 -> 0.90.
    max_diameter_mm: float = 8.0
    faint_low: float = 0.15
    min_window_mm: float = 8.0
    window_factor: float = 4.0  # window side = factor × candidate diameter, at least min_window_mm
    max_candidates: int = 32
    # Frame the network sees around each window on every side, not written back. Off by
    # default: on the validation CT series (seeds 5100-5107, lite UNet at 0.8) 8 mm kept
    # the lesions the tight windows lose (78 instead of 74 of 110) but let more false
    # positives through (0.35 instead of 0.18 per slice; at threshold 0.97 still 0.24),
    # and on validation radiographs it found the same nodules with more false positives
    # (0.38 instead of 0.31 per frame). A sensitivity-first setting, not the default.
    context_mm: float = 0.0


def _faint_peaks(prob: np.ndarray, low: float, high: float, labels: np.ndarray) -> list[tuple[float, float, float]]:
    """(row, col, peak) of connected regions >= ``low`` that never reach ``high``.

    A region that holds a labelled lesion is that lesion with its soft rim, not a
    faint candidate (masking the lesions out first would split every rim into arcs,
    each rechecked again). Regions are labelled only inside boxes around the band
    (the XY cut of :mod:`medrt.analysis.components`, which no region crosses) and come
    out in raster order of their first pixel, as one labelling of the whole frame
    would give them."""
    band = at_least(prob, low)
    found: list[tuple[int, int, float, float, float]] = []  # first pixel (row, col), row, col, peak
    for r0, c0, r1, c1 in foreground_boxes(band):
        comps = label(band[r0:r1, c0:c1])
        for k in range(1, len(comps) + 1):
            y0, x0, y1, x1 = comps.box(k)
            inside = comps.mask(k)
            window = (slice(r0 + y0, r0 + y1), slice(c0 + x0, c0 + x1))
            peak = float(prob[window][inside].max())
            if peak < high and not labels[window][inside].any():
                rows, cols = np.nonzero(inside)
                n = rows.size  # the centroid as the whole-frame labelling computes it
                cy = (int(rows.sum()) + n * (r0 + y0)) / n
                cx = (int(cols.sum()) + n * (c0 + x0)) / n
                found.append((r0 + y0, c0 + x0 + int(cols[0]), cy, cx, peak))
    found.sort(key=lambda f: f[:2])
    return [(cy, cx, peak) for _, _, cy, cx, peak in found]


def candidates(
    prob: np.ndarray, labels: np.ndarray, lesions: list[Lesion] | tuple[Lesion, ...], threshold: float,
    cfg: RecheckConfig,
) -> list[tuple[float, float, float, float]]:
    """(row, col, diameter_mm, priority) of what to recheck: small lesions, then faint peaks."""
    out = [(les.centroid[0], les.centroid[1], les.diameter_mm, 1.0 - les.score)
           for les in lesions if les.diameter_mm < cfg.max_diameter_mm]
    out += [(r, c, 0.0, 2.0 - peak) for r, c, peak in _faint_peaks(prob, cfg.faint_low, threshold, labels)]
    out.sort(key=lambda t: t[3])
    return out[: cfg.max_candidates]


def recheck(
    model: Backend,
    norm: np.ndarray,
    prob: np.ndarray,
    labels: np.ndarray,
    lesions: list[Lesion] | tuple[Lesion, ...],
    spacing_mm: tuple[float, float] | None,
    threshold: float,
    cfg: RecheckConfig = RecheckConfig(),
) -> tuple[np.ndarray, np.ndarray, int]:
    """Return ``(new prob, mask of rechecked pixels, number of windows run)``.

    ``prob`` is updated in place and returned as the new prob: the first pass is not
    kept (the analyzer does not read it again); a caller that needs it passes a copy.
    ``spacing_mm`` is the frame's (row, col) pixel spacing: it sizes the windows in
    mm and, with the model's ``spacing_mm``, sets the scale of the second pass (module
    docstring). None: 1 mm is assumed and the second pass upsamples 2×. ``norm`` may be a
    stack of slices for a 2.5-D model (:mod:`medrt.analysis.segment`)."""
    sr, sc = spacing_mm or (1.0, 1.0)
    factors = recheck_factors(spacing_mm, getattr(model.spec, "spacing_mm", None))
    big = [les.label for les in lesions if les.diameter_mm >= cfg.max_diameter_mm]
    touched = np.zeros(prob.shape, dtype=bool)
    if factors is None:  # 2x upsampled: half the model's multiple in source pixels
        multiple = max(8, model.spec.multiple_of // 2 if model.spec.multiple_of > 1 else 8)
    else:  # area-averaged by the factors: whole blocks of the model's multiple
        multiple = max(factors) * max(8, model.spec.multiple_of)
    rows, cols = prob.shape
    runs = 0
    for r, c, diameter, _ in candidates(prob, labels, lesions, threshold, cfg):
        side_mm = max(cfg.min_window_mm, cfg.window_factor * diameter)
        side = int(np.ceil(side_mm / min(sr, sc) / multiple) * multiple)
        side = max(side, 2 * multiple)
        r0, c0 = int(round(r)) - side // 2, int(round(c)) - side // 2
        rr0, cc0, rr1, cc1 = max(r0, 0), max(c0, 0), min(r0 + side, rows), min(c0 + side, cols)
        if rr1 <= rr0 or cc1 <= cc0:
            continue
        ctx = int(np.ceil(cfg.context_mm / min(sr, sc) / multiple) * multiple) if cfg.context_mm > 0 else 0
        full = side + 2 * ctx
        region = _region(norm, r0 - ctx, c0 - ctx, r0 + side + ctx, c0 + side + ctx)
        if factors is None:
            up = np.repeat(np.repeat(region, 2, axis=-2), 2, axis=-1)  # nearest, as the training's 2x zoom
            p2 = _sigmoid(_run(model, up))
            back = p2.reshape(full, 2, full, 2).mean(axis=(1, 3))
        else:
            back = _sigmoid(_logits_at(model, region, factors))
        new = back[ctx + rr0 - r0 : ctx + rr1 - r0, ctx + cc0 - c0 : ctx + cc1 - c0]
        view = prob[rr0:rr1, cc0:cc1]
        t = touched[rr0:rr1, cc0:cc1]
        if big:  # pixels of large components are never touched
            free = ~np.isin(labels[rr0:rr1, cc0:cc1], big)
            np.copyto(view, new, where=free)
            t |= free
        else:
            view[...] = new
            t[...] = True
        runs += 1
    return prob, touched, runs


def recheck_map(
    model: Backend,
    norm: np.ndarray,
    prob: np.ndarray,
    spacing_mm: tuple[float, float] | None,
    threshold: float,
    cfg: RecheckConfig = RecheckConfig(),
) -> tuple[np.ndarray, np.ndarray, int]:
    """:func:`recheck` of a first-pass map, its components taken at ``threshold`` first:
    what the analyzer runs after the first pass (and the accuracy gate with it)."""
    from medrt.analysis.lesions import lesions_from_probability

    labels, lesions = lesions_from_probability(prob, spacing_mm, threshold)
    return recheck(model, norm, prob, labels, lesions, spacing_mm, threshold, cfg)
