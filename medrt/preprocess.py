"""Frame -> network input: window normalisation and thumbnails.

Training (``models/``) and inference (``medrt.analysis``) call these same
functions, so a model sees at run time exactly what it was trained on.
"""

from __future__ import annotations

import math

import numpy as np

from medrt.bands import for_bands

__all__ = ["normalize", "normalized_block_mean", "Windowed", "thumbnail", "block_mean", "pad_to_multiple"]

# Rows of source pixels normalised at a time by normalized_block_mean: 64 rows of a 4096²
# frame are 1 MB of float32, which stays in a core's cache between the two passes.
_CHUNK_ROWS = 64


def normalize(pixels: np.ndarray, center: float, width: float, out: np.ndarray | None = None) -> np.ndarray:
    """Map the window ``[center - width/2, center + width/2]`` to ``[0, 1]``, clipped, float32.

    A large 2-D frame is done in row bands on several threads (:mod:`medrt.bands`)."""
    low, scale = _window(center, width)
    pixels = np.asarray(pixels)
    if out is None:
        out = np.empty(pixels.shape, dtype=np.float32)
    if pixels.ndim != 2:
        return _normalize(pixels, low, scale, out)
    for_bands(lambda a, b: _normalize(pixels[a:b], low, scale, out[a:b]), pixels.shape[0], pixels=pixels.size)
    return out


def _window(center: float, width: float) -> tuple[np.float32, np.float32]:
    width = max(float(width), 1e-6)
    return np.float32(float(center) - width / 2.0), np.float32(1.0 / width)


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


def normalized_block_mean(pixels: np.ndarray, center: float, width: float, fr: int, fc: int) -> np.ndarray:
    """``block_mean(normalize(pixels, center, width), fr, fc)``, bit for bit, without the
    whole normalised frame: each band normalises :data:`_CHUNK_ROWS` rows at a time into
    a small buffer and averages them from there.

    A 4096² radiograph swept at 2× its UNet's scale needs only this 2048² mean of its
    normalised pixels (:class:`Windowed`); normalising all 16 Mpixel first wrote and read
    back 64 MB, ~10 ms of an H200 host's ~44 ms per frame (README, Performance). Same
    arithmetic in the same order as the two calls, so the same float32 values."""
    pixels = np.asarray(pixels)
    if pixels.ndim != 2:
        raise ValueError(f'Argument "pixels" must be a 2-D array, got shape {pixels.shape}')
    fr, fc = int(fr), int(fc)
    if fr < 1 or fc < 1:
        raise ValueError(f"block factors must be positive integers, got {(fr, fc)!r}")
    low, scale = _window(center, width)
    rows, cols = pixels.shape
    out = np.empty((-(-rows // fr), -(-cols // fc)), dtype=np.float32)
    whole = rows % fr == 0 and cols % fc == 0  # as block_mean decides it, for the whole frame
    step = max(fr, (_CHUNK_ROWS // fr) * fr)

    def band(a: int, b: int) -> None:
        scratch = np.empty((min(step, b - a), cols), dtype=np.float32)
        for r in range(a, b, step):
            e = min(r + step, b)
            norm = _normalize(pixels[r:e], low, scale, scratch[: e - r])
            _block_mean(norm, fr, fc, out[r // fr : -(-e // fr)], whole)

    for_bands(band, rows, pixels=pixels.size, multiple=fr)
    return out


class Windowed:
    """A 2-D frame's pixels and the window that maps them to 0..1, normalised only where
    read: what the analyzer hands the fine sweep over a whole radiograph
    (:mod:`medrt.analysis.sweep`), which reads the frame only as block means at its scale
    and as small regions around its components.

    ``block_mean(fr, fc)`` is the normalised frame's block mean (:func:`normalized_block_mean`,
    kept for the next call); ``region(r0, c0, r1, c1)`` a window of the normalised frame,
    0 where it reaches past the frame; ``np.asarray(w)`` the whole normalised frame (made
    once, on first use, for any other reader). Each holds the very values
    :func:`normalize` gives."""

    ndim = 2
    dtype = np.dtype(np.float32)

    def __init__(self, pixels: np.ndarray, center: float, width: float) -> None:
        self.pixels = np.asarray(pixels)
        if self.pixels.ndim != 2:
            raise ValueError(f'Argument "pixels" must be a 2-D array, got shape {self.pixels.shape}')
        self.window = (float(center), float(width))
        self.shape: tuple[int, int] = self.pixels.shape  # type: ignore[assignment]
        self._means: dict[tuple[int, int], np.ndarray] = {}
        self._whole: np.ndarray | None = None

    def block_mean(self, fr: int, fc: int) -> np.ndarray:
        key = (int(fr), int(fc))
        if key not in self._means:
            if self._whole is not None:
                self._means[key] = block_mean(self._whole, *key)
            else:
                self._means[key] = normalized_block_mean(self.pixels, *self.window, *key)
        return self._means[key]

    def region(self, r0: int, c0: int, r1: int, c1: int) -> np.ndarray:
        out = np.zeros((r1 - r0, c1 - c0), np.float32)
        rows, cols = self.shape
        rr0, cc0, rr1, cc1 = max(r0, 0), max(c0, 0), min(r1, rows), min(c1, cols)
        if rr1 > rr0 and cc1 > cc0:
            inside = out[rr0 - r0 : rr1 - r0, cc0 - c0 : cc1 - c0]
            if self._whole is not None:
                inside[...] = self._whole[rr0:rr1, cc0:cc1]
            else:
                _normalize(self.pixels[rr0:rr1, cc0:cc1], *_window(*self.window), inside)
        return out

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        if self._whole is None:
            self._whole = normalize(self.pixels, *self.window)
        return self._whole if dtype is None else self._whole.astype(dtype)


def pad_to_multiple(arr: np.ndarray, multiple: int, value: float = 0.0) -> tuple[np.ndarray, tuple[int, int]]:
    """Pad the last two axes at the bottom/right up to a multiple; returns the original (rows, cols)."""
    rows, cols = arr.shape[-2:]
    pr, pc = (-rows) % multiple, (-cols) % multiple
    if pr == 0 and pc == 0:
        return arr, (rows, cols)
    pad = [(0, 0)] * (arr.ndim - 2) + [(0, pr), (0, pc)]
    return np.pad(arr, pad, mode="constant", constant_values=value), (rows, cols)
