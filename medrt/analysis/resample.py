"""Spacing normalisation: bring a fine frame to a model's pixel spacing, and back.

A segmentation spec may name the pixel spacing its network was trained at
(``[model] spacing_mm``, :attr:`medrt.engine.registry.ModelSpec.spacing_mm`).
A frame much finer than that (a 4096² radiograph at ~0.125 mm against a 0.5 mm
model) is area-averaged by an integer factor per axis before the network runs,
and the network's output is interpolated back onto the frame's grid: what
MONAI pipelines do with ``Spacingd`` and its inverse, restricted to integer
block means so that no intensity is invented and a faint nodule keeps its
contrast while the noise drops.

Training (``models/data.py``) and inference (:mod:`medrt.analysis.segment`,
:mod:`medrt.analysis.recheck`) call these same functions, so a network sees at
run time exactly the pixels it was trained on.

Grid convention: coarse pixel ``i`` covers source pixels ``[i*f, (i+1)*f)``, so
its centre lies at source coordinate ``i*f + (f-1)/2``.
"""

from __future__ import annotations

import numpy as np

from medrt.preprocess import Windowed, block_mean

__all__ = [
    "RESAMPLE_RATIO", "resample_factors", "recheck_factors", "area_downsample", "upsample_bilinear", "Bilinear",
]

# A frame is resampled only when it is clearly finer than the model: spacing <
# target / RESAMPLE_RATIO. CT slices (0.6-0.8 mm) against a 0.5 mm model stay native.
RESAMPLE_RATIO = 1.5

Factors = tuple[int, int]


def _check_spacing(spacing_mm: tuple[float, float]) -> tuple[float, float]:
    if len(spacing_mm) != 2:
        raise ValueError(f'Argument "spacing_mm" must be (row, col) in mm, got {spacing_mm!r}')
    sr, sc = float(spacing_mm[0]), float(spacing_mm[1])
    if not (sr > 0.0 and sc > 0.0 and np.isfinite(sr) and np.isfinite(sc)):
        raise ValueError(f'Argument "spacing_mm" must be positive, got {spacing_mm!r}')
    return sr, sc


def resample_factors(
    spacing_mm: tuple[float, float] | None, target_mm: float | None, *, ratio: float = RESAMPLE_RATIO
) -> Factors:
    """Integer area-averaging factor per axis, ``(row, col)``, that brings a frame of
    ``spacing_mm`` to about ``target_mm``.

    ``(1, 1)`` (run at native resolution) when either is None or the axis is not
    finer than ``target_mm / ratio``; else ``round(target_mm / spacing)``, at least 2.
    A 0.125 mm radiograph against 0.5 mm gives ``(4, 4)``; a 0.7 mm CT slice ``(1, 1)``.
    """
    if spacing_mm is None or target_mm is None:
        return (1, 1)
    out = []
    for s in _check_spacing(spacing_mm):
        out.append(max(2, int(round(target_mm / s))) if s < target_mm / ratio else 1)
    return (out[0], out[1])


def recheck_factors(spacing_mm: tuple[float, float] | None, target_mm: float | None) -> Factors | None:
    """Factors for the multi-scale recheck, at twice the model's effective scale.

    None when the frame runs at native resolution (no resampling): the recheck
    then upsamples 2× itself. Otherwise half the first-pass factor, as
    ``round(target / (2 · spacing))`` per axis and at least 1 (1 = source
    resolution): ``(2, 2)`` for a 0.125 mm radiograph against a 0.5 mm model.
    """
    first = resample_factors(spacing_mm, target_mm)
    if first == (1, 1):
        return None
    assert spacing_mm is not None and target_mm is not None
    sr, sc = _check_spacing(spacing_mm)
    return (max(1, int(round(target_mm / (2.0 * sr)))), max(1, int(round(target_mm / (2.0 * sc)))))


def area_downsample(x: np.ndarray, factors: Factors) -> np.ndarray:
    """Block mean of a 2-D array by ``factors`` ``(row, col)``, float32.

    Output pixel ``(i, j)`` is the mean of ``x[i*fr:(i+1)*fr, j*fc:(j+1)*fc]``;
    blocks at the bottom or right edge that do not fill are averaged over the
    pixels they have (as :func:`medrt.preprocess.thumbnail` does). A 3-D array (a
    stack of slices, :mod:`medrt.analysis.slices`) is averaged slice by slice; a
    :class:`~medrt.preprocess.Windowed` frame is normalised and averaged in one pass.
    """
    fr, fc = int(factors[0]), int(factors[1])
    if fr < 1 or fc < 1:
        raise ValueError(f'Argument "factors" must be positive integers, got {factors!r}')
    if isinstance(x, Windowed) and (fr, fc) != (1, 1):  # a frame normalised only where read
        return x.block_mean(fr, fc)
    x = np.asarray(x)
    if x.ndim == 3:
        return np.stack([area_downsample(s, factors) for s in x])
    if x.ndim != 2:
        raise ValueError(f'Argument "x" must be a 2-D array or a stack of them, got shape {x.shape}')
    if (fr, fc) == (1, 1):
        return np.asarray(x, dtype=np.float32)
    return block_mean(x, fr, fc)


def _axis_weights(n_out: int, n_in: int, f: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each output index: the two input indices and the weight of the second."""
    u = (np.arange(n_out, dtype=np.float64) + 0.5) / f - 0.5
    u = np.clip(u, 0.0, n_in - 1.0)
    i0 = np.floor(u).astype(np.intp)
    i1 = np.minimum(i0 + 1, n_in - 1)
    return i0, i1, (u - i0).astype(np.float32)


def upsample_bilinear(x: np.ndarray, factors: Factors, shape: tuple[int, int]) -> np.ndarray:
    """The inverse of :func:`area_downsample` for a smooth map (a logit or probability):
    bilinear interpolation from the coarse grid onto the ``shape`` source grid, pixel
    centres aligned as in the module docstring, edges held constant. float32."""
    fr, fc = int(factors[0]), int(factors[1])
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f'Argument "x" must be a 2-D array, got shape {x.shape}')
    rows, cols = int(shape[0]), int(shape[1])
    if (fr, fc) == (1, 1):
        if x.shape[0] < rows or x.shape[1] < cols:
            raise ValueError(f"cannot bring a {x.shape} map to {shape} with factors (1, 1)")
        return x[:rows, :cols]
    return Bilinear(x, factors, shape).block(0, 0, rows, cols)


class Bilinear:
    """:func:`upsample_bilinear` of one coarse map, evaluated a block of the source grid
    at a time: each block holds exactly the values the whole-grid call gives there
    (the same float32 operations on the same operands, pixel by pixel), so a caller
    that needs only a few regions of a large frame does not pay for all of it."""

    def __init__(self, x: np.ndarray, factors: Factors, shape: tuple[int, int]) -> None:
        self.x = np.asarray(x, dtype=np.float32)
        rows, cols = int(shape[0]), int(shape[1])
        self.rows = _axis_weights(rows, self.x.shape[0], int(factors[0]))
        self.cols = _axis_weights(cols, self.x.shape[1], int(factors[1]))

    def block(self, r0: int, c0: int, r1: int, c1: int) -> np.ndarray:
        """Source rows ``r0:r1`` and columns ``c0:c1`` of the upsampled map, float32."""
        i0, i1, wr = (a[r0:r1] for a in self.rows)
        j0, j1, wc = (a[c0:c1] for a in self.cols)
        if not (i0.size and j0.size):
            return np.zeros((i0.size, j0.size), np.float32)
        lo, hi = int(j0[0]), int(j1[-1]) + 1  # the coarse columns this block reads
        x = self.x[:, lo:hi]
        top, bottom = x[i0], x[i1]  # (r1 - r0, hi - lo)
        tall = top + (bottom - top) * wr[:, None]
        left, right = tall[:, j0 - lo], tall[:, j1 - lo]
        return left + (right - left) * wc[None, :]
