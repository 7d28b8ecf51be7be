"""The lesion UNet on crops (the ROI path) or over the whole frame (the baseline).

Inputs are a frame's pixels already normalised to 0..1 by its window. Regions
that reach past the frame are padded with 0 (below the window, like air).
Outputs are lesion probabilities in the source pixel grid.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from medrt.engine.backends.base import Backend
from medrt.preprocess import pad_to_multiple

__all__ = ["segment_crops", "sliding_window", "gaussian_importance"]


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


def _region(norm: np.ndarray, r0: int, c0: int, r1: int, c1: int) -> np.ndarray:
    rows, cols = norm.shape
    out = np.zeros((r1 - r0, c1 - c0), np.float32)
    rr0, cc0, rr1, cc1 = max(r0, 0), max(c0, 0), min(r1, rows), min(c1, cols)
    if rr1 > rr0 and cc1 > cc0:
        out[rr0 - r0 : rr1 - r0, cc0 - c0 : cc1 - c0] = norm[rr0:rr1, cc0:cc1]
    return out


def segment_crops(
    model: Backend, norm: np.ndarray, crops: tuple[tuple[int, int, int, int], ...] | list[tuple[int, int, int, int]]
) -> np.ndarray:
    """Lesion probability over the frame from the UNet on each crop; 0 outside every
    crop. Where crops overlap, the higher probability wins."""
    rows, cols = norm.shape
    prob = np.zeros((rows, cols), np.float32)
    for r0, c0, r1, c1 in crops:
        p = _sigmoid(_run(model, _region(norm, r0, c0, r1, c1)))
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


def sliding_window(model: Backend, norm: np.ndarray, roi: int = 1024, overlap: float = 0.25) -> np.ndarray:
    """Full-frame inference with MONAI ``sliding_window_inference`` semantics: ``roi``²
    windows at stride ``roi·(1-overlap)`` (the last aligned to the edge), logits
    blended with gaussian weights, then the sigmoid. The reference that every
    ROI-path speed claim is measured against."""
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
    return _sigmoid(acc / norm_w)
