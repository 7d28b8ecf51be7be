"""Smooth fields for the phantoms: blur, upsampling and correlated noise.

Heavy smoothing runs in SimpleITK (a core dependency, multi-threaded C++; scipy is
not one) and at low resolution where it can, then is upsampled. Transcendental
maths runs in float64 and full-size float32 arrays only see exactly rounded
operations (+, -, *, /, sqrt), so the same seed gives bit-identical pixels on any
x86-64 machine with the same packages.
"""

from __future__ import annotations

import math

import numpy as np
import SimpleITK as sitk

__all__ = ["blur", "upsample", "smooth_noise", "quantize_constant"]


def quantize_constant(value: float, digits: int = 6) -> float:
    """Round a derived constant to ``digits`` significant digits.

    Constants computed by reductions (a standard deviation) can differ in the last
    bit between machines; rounding them keeps the pixels reproducible.
    """
    if value == 0.0 or not math.isfinite(value):
        return value
    return float(f"{value:.{digits - 1}e}")


def blur(arr: np.ndarray, sigma_px: float) -> np.ndarray:
    """Gaussian blur with ``sigma_px`` (pixels), float64 in and out."""
    if sigma_px <= 0:
        return np.asarray(arr, dtype=np.float64)
    img = sitk.GetImageFromArray(np.ascontiguousarray(arr, dtype=np.float64))
    out = sitk.SmoothingRecursiveGaussian(img, float(sigma_px))
    return sitk.GetArrayFromImage(out)


def upsample(arr: np.ndarray, shape: tuple[int, int], dtype: type = np.float64) -> np.ndarray:
    """Linear upsampling of a coarse 2-D field to ``shape`` (at least the coarse size).

    The factor is ``ceil(shape / coarse)``; the result is cropped to ``shape``.
    ``float32`` halves the memory of a 4096² field (the interpolation is done by
    SimpleITK, the same code on every machine).
    """
    fr = max(1, math.ceil(shape[0] / arr.shape[0]))
    fc = max(1, math.ceil(shape[1] / arr.shape[1]))
    if fr == 1 and fc == 1:
        return np.array(arr[: shape[0], : shape[1]], dtype=dtype)
    img = sitk.GetImageFromArray(np.ascontiguousarray(arr, dtype=dtype))
    # sitk sizes are (x, y) = (cols, rows).
    out = sitk.GetArrayFromImage(sitk.Expand(img, [fc, fr], sitk.sitkLinear))
    if out.shape != tuple(shape):
        out = np.ascontiguousarray(out[: shape[0], : shape[1]])
    return out


def smooth_noise(
    rng: np.random.Generator, shape: tuple[int, int], scale_px: float, coarse: int = 1
) -> np.ndarray:
    """Gaussian noise with unit standard deviation and correlation length ``scale_px``.

    ``coarse`` > 1 draws and blurs the noise on a grid ``coarse`` times smaller, then
    upsamples: the cheap way to get low-frequency variation on a 4096² frame.
    """
    cshape = (max(2, math.ceil(shape[0] / coarse)), max(2, math.ceil(shape[1] / coarse)))
    field = blur(rng.standard_normal(cshape), scale_px / coarse)
    std = quantize_constant(float(field.std()))
    if std > 0:
        field /= std
    if coarse > 1:
        field = upsample(field, shape)
    return field
