"""The lesion UNet on crops (the ROI path) or over the whole frame (the baseline).

Inputs are a frame's pixels already normalised to 0..1 by its window. Regions
that reach past the frame are padded with 0 (below the window, like air).
Outputs are lesion probabilities in the source pixel grid.

Spacing normalisation: when the caller gives the frame's ``spacing_mm`` and the
model's spec names the spacing it was trained at (``[model] spacing_mm``), a
frame much finer than that is area-averaged by an integer factor per axis
before the UNet runs (a 1024² crop of a 0.125 mm radiograph becomes a 256²
input for a 0.5 mm model), and the UNet's logits are interpolated bilinearly
back onto the source grid before the sigmoid (:mod:`medrt.analysis.resample`).
Without ``spacing_mm`` (or without the spec field) the UNet runs at the
frame's own resolution.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from medrt.analysis.resample import Factors, area_downsample, resample_factors, upsample_bilinear
from medrt.engine.backends.base import Backend
from medrt.preprocess import pad_to_multiple

__all__ = ["segment_crops", "sliding_window", "gaussian_importance", "model_factors"]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    out = np.negative(x, dtype=np.float32)
    np.exp(out, out=out)
    out += 1.0
    np.reciprocal(out, out=out)
    return out


def _run(model: Backend, region: np.ndarray) -> np.ndarray:
    """Logits for one 2-D region, padded to the model's multiple and cut back."""
    x, (h, w) = pad_to_multiple(region, max(1, model.spec.multiple_of))
    return model.infer(x[None, None])[0][0, 0, :h, :w]


def model_factors(model: Backend, spacing_mm: tuple[float, float] | None) -> Factors:
    """The area-averaging factors for ``model`` on a frame of ``spacing_mm`` ((1, 1): native)."""
    return resample_factors(spacing_mm, getattr(model.spec, "spacing_mm", None))


def _logits_at(model: Backend, region: np.ndarray, factors: Factors) -> np.ndarray:
    """Logits for a source-resolution region, the UNet run at ``factors`` coarser and its
    logits brought back onto the region's grid."""
    if factors == (1, 1):
        return _run(model, region)
    return upsample_bilinear(_run(model, area_downsample(region, factors)), factors, region.shape)


def _region(norm: np.ndarray, r0: int, c0: int, r1: int, c1: int) -> np.ndarray:
    rows, cols = norm.shape
    out = np.zeros((r1 - r0, c1 - c0), np.float32)
    rr0, cc0, rr1, cc1 = max(r0, 0), max(c0, 0), min(r1, rows), min(c1, cols)
    if rr1 > rr0 and cc1 > cc0:
        out[rr0 - r0 : rr1 - r0, cc0 - c0 : cc1 - c0] = norm[rr0:rr1, cc0:cc1]
    return out


def segment_crops(
    model: Backend,
    norm: np.ndarray,
    crops: tuple[tuple[int, int, int, int], ...] | list[tuple[int, int, int, int]],
    *,
    spacing_mm: tuple[float, float] | None = None,
) -> np.ndarray:
    """Lesion probability over the frame from the UNet on each crop; 0 outside every
    crop. Where crops overlap, the higher probability wins. ``spacing_mm`` is the
    frame's (row, col) pixel spacing: with it, crops are resampled to the model's
    spacing (module docstring); None runs the UNet at source resolution."""
    rows, cols = norm.shape
    prob = np.zeros((rows, cols), np.float32)
    factors = model_factors(model, spacing_mm)
    for r0, c0, r1, c1 in crops:
        p = _sigmoid(_logits_at(model, _region(norm, r0, c0, r1, c1), factors))
        rr0, cc0, rr1, cc1 = max(r0, 0), max(c0, 0), min(r1, rows), min(c1, cols)
        view = prob[rr0:rr1, cc0:cc1]
        np.maximum(view, p[rr0 - r0 : rr1 - r0, cc0 - c0 : cc1 - c0], out=view)
    return prob


@lru_cache(maxsize=8)
def gaussian_importance(size: int, sigma_scale: float = 0.125) -> np.ndarray:
    """MONAI's gaussian blending weights for a ``size``² window (sigma = 0.125 · size)."""
    sigma = sigma_scale * size
    x = np.arange(size, dtype=np.float64) - (size - 1) / 2.0
    g = np.exp(-0.5 * (x / sigma) ** 2)
    w = np.outer(g, g)
    w /= w.max()
    w = np.maximum(w, w[w > 0].min() if (w > 0).any() else 1e-3).astype(np.float32)
    w.flags.writeable = False
    return w


def _starts(length: int, roi: int, step: int) -> list[int]:
    if length <= roi:
        return [0]
    n = math.ceil((length - roi) / step) + 1
    return sorted({min(i * step, length - roi) for i in range(n)})


def sliding_window(
    model: Backend,
    norm: np.ndarray,
    roi: int = 1024,
    overlap: float = 0.25,
    *,
    spacing_mm: tuple[float, float] | None = None,
) -> np.ndarray:
    """Full-frame inference with MONAI ``sliding_window_inference`` semantics: ``roi``²
    windows at stride ``roi·(1-overlap)`` (the last aligned to the edge), logits
    blended with gaussian weights, then the sigmoid. The reference that every
    ROI-path speed claim is measured against.

    With ``spacing_mm`` (the frame's) and a model spacing, the whole frame is first
    area-averaged to the model's spacing and the windows tile that (``roi`` is then in
    the network's pixels, as after MONAI's ``Spacingd``); the blended logits are brought
    back onto the source grid before the sigmoid."""
    factors = model_factors(model, spacing_mm)
    if factors == (1, 1):
        return _sigmoid(_blended_logits(model, norm, roi, overlap))
    small = area_downsample(norm, factors)
    return _sigmoid(upsample_bilinear(_blended_logits(model, small, roi, overlap), factors, norm.shape))


def _blended_logits(model: Backend, norm: np.ndarray, roi: int, overlap: float) -> np.ndarray:
    rows, cols = norm.shape
    step = max(1, int(roi * (1.0 - overlap)))
    wr, wc = min(roi, rows), min(roi, cols)
    weight = gaussian_importance(roi)[:wr, :wc]
    acc = np.zeros((rows, cols), np.float32)
    norm_w = np.zeros((rows, cols), np.float32)
    for r0 in _starts(rows, roi, step):
        for c0 in _starts(cols, roi, step):
            logits = _run(model, norm[r0 : r0 + wr, c0 : c0 + wc])
            acc[r0 : r0 + wr, c0 : c0 + wc] += logits * weight
            norm_w[r0 : r0 + wr, c0 : c0 + wc] += weight
    acc /= norm_w
    return acc
