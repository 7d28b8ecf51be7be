"""Frame -> network input: window normalisation and thumbnails.

Training (``models/``) and inference (``medrt.analysis``) call these same
functions, so a model sees at run time exactly what it was trained on.
"""

from __future__ import annotations

import math

import numpy as np

from medrt.bands import for_bands

__all__ = ["normalize", "thumbnail", "block_mean", "pad_to_multiple"]


def normalize(pixels: np.ndarray, center: float, width: float, out: np.ndarray | None = None) -> np.ndarray:
    """Map the window ``[center - width/2, center + width/2]`` to ``[0, 1]``, clipped, float32.

    A large 2-D frame is done in row bands on several threads (:mod:`medrt.bands`)."""
    width = max(float(width), 1e-6)
    low, scale = np.float32(float(center) - width / 2.0), np.float32(1.0 / width)
    pixels = np.asarray(pixels)
    if out is None:
        out = np.empty(pixels.shape, dtype=np.float32)
    if pixels.ndim != 2:
        return _normalize(pixels, low, scale, out)
    for_bands(lambda a, b: _normalize(pixels[a:b], low, scale, out[a:b]), pixels.shape[0], pixels=pixels.size)
    return out


def _normalize(pixels: np.ndarray, low: np.float32, scale: np.float32, out: np.ndarray) -> np.ndarray:
    np.subtract(pixels, low, out=out, dtype=np.float32)
    out *= scale
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
    return block_mean(pixels, factor, factor), factor


def block_mean(x: np.ndarray, fr: int, fc: int) -> np.ndarray:
    """Mean of each ``fr`` × ``fc`` block of a 2-D array, float32; blocks at the bottom
    or right edge that do not fill are averaged over the pixels they have.

    Adds strided row slices, then strided column slices, instead of numpy's
    ``reshape(...).mean(axis=(1, 3))``, whose reduction over two strided axes took
    49 ms for a 4096² frame by 4 here (this: 8 ms; a 1024² crop 3.1 → 0.2 ms).
    """
    rows, cols = x.shape
    n_r, n_c = -(-rows // fr), -(-cols // fc)
    out = np.empty((n_r, n_c), dtype=np.float32)
    whole = rows % fr == 0 and cols % fc == 0  # one rule for every band: bit-identical to one band
    for_bands(lambda a, b: _block_mean(x[a:b], fr, fc, out[a // fr : -(-b // fr)], whole), rows,
              pixels=x.size, multiple=fr)
    return out


def _block_mean(x: np.ndarray, fr: int, fc: int, out: np.ndarray, whole: bool) -> None:
    rows, cols = x.shape
    acc = np.array(x[0::fr], dtype=np.float32)  # (n_r, cols)
    for k in range(1, fr):
        part = x[k::fr]
        acc[: len(part)] += part
    out[:] = acc[:, 0::fc]
    for k in range(1, fc):
        part = acc[:, k::fc]
        out[:, : part.shape[1]] += part
    if whole:
        out *= np.float32(1.0 / (fr * fc))
    else:
        per_r = np.minimum(fr, rows - np.arange(out.shape[0]) * fr)
        per_c = np.minimum(fc, cols - np.arange(out.shape[1]) * fc)
        out /= np.outer(per_r, per_c).astype(np.float32)


def pad_to_multiple(arr: np.ndarray, multiple: int, value: float = 0.0) -> tuple[np.ndarray, tuple[int, int]]:
    """Pad the last two axes at the bottom/right up to a multiple; returns the original (rows, cols)."""
    rows, cols = arr.shape[-2:]
    pr, pc = (-rows) % multiple, (-cols) % multiple
    if pr == 0 and pc == 0:
        return arr, (rows, cols)
    pad = [(0, 0)] * (arr.ndim - 2) + [(0, pr), (0, pc)]
    return np.pad(arr, pad, mode="constant", constant_values=value), (rows, cols)
