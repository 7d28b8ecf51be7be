"""Frame -> network input: window normalisation and thumbnails.

Training (``models/``) and inference (``medrt.analysis``) call these same
functions, so a model sees at run time exactly what it was trained on.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["normalize", "thumbnail", "pad_to_multiple"]


def normalize(pixels: np.ndarray, center: float, width: float, out: np.ndarray | None = None) -> np.ndarray:
    """Map the window ``[center - width/2, center + width/2]`` to ``[0, 1]``, clipped, float32."""
    width = max(float(width), 1e-6)
    low = float(center) - width / 2.0
    out = np.subtract(pixels, np.float32(low), out=out, dtype=np.float32)
    out *= np.float32(1.0 / width)
    np.clip(out, 0.0, 1.0, out=out)
    return out


def thumbnail(pixels: np.ndarray, max_side: int) -> tuple[np.ndarray, int]:
    """Area-average ``pixels`` by the smallest integer factor that fits ``max_side``.

    Returns ``(thumb, factor)``; thumbnail pixel ``(i, j)`` covers source pixels
    ``[i*factor, (i+1)*factor)``. Edges that do not fill a whole block are
    averaged over the pixels they have. Averaging (not subsampling) keeps a faint
    lesion's signal while it cuts the noise.
    """
    rows, cols = pixels.shape
    factor = max(1, math.ceil(max(rows, cols) / max_side))
    if factor == 1:
        return np.asarray(pixels, dtype=np.float32), 1
    tr, tc = math.ceil(rows / factor), math.ceil(cols / factor)
    full_r, full_c = rows // factor, cols // factor
    out = np.empty((tr, tc), dtype=np.float32)
    core = pixels[: full_r * factor, : full_c * factor].reshape(full_r, factor, full_c, factor)
    out[:full_r, :full_c] = core.mean(axis=(1, 3), dtype=np.float32)
    if tc > full_c:
        out[:full_r, full_c] = (
            pixels[: full_r * factor, full_c * factor :].reshape(full_r, factor, -1).mean(axis=(1, 2), dtype=np.float32)
        )
    if tr > full_r:
        for j in range(tc):
            out[full_r, j] = pixels[full_r * factor :, j * factor : (j + 1) * factor].mean(dtype=np.float32)
    return out, factor


def pad_to_multiple(arr: np.ndarray, multiple: int, value: float = 0.0) -> tuple[np.ndarray, tuple[int, int]]:
    """Pad the last two axes at the bottom/right up to a multiple; returns the original (rows, cols)."""
    rows, cols = arr.shape[-2:]
    pr, pc = (-rows) % multiple, (-cols) % multiple
    if pr == 0 and pc == 0:
        return arr, (rows, cols)
    pad = [(0, 0)] * (arr.ndim - 2) + [(0, pr), (0, pc)]
    return np.pad(arr, pad, mode="constant", constant_values=value), (rows, cols)
