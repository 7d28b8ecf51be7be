"""Lengths and elliptical ROIs measured on the image: in mm where the header says how
big a pixel is, and what that size means.

- ``PixelSpacing``: in the patient (CT, MR): "12.3 mm".
- ``ImagerPixelSpacing`` (DX, CR): at the detector plane, so a length includes the
  geometric magnification (often 5–15 % for a chest radiograph): "12.3 mm at detector",
  as OHIF and Cornerstone mark a projection calibration.
- ``ImagerPixelSpacing`` with an Estimated Radiographic Magnification Factor: at the
  patient plane, estimated: "11.2 mm (ERMF)", as Cornerstone marks it.
- ``ImagePlanePixelSpacing`` (RT images): "12.3 mm at receptor";
  ``NominalScannedPixelSpacing`` (a scanned film): "12.3 mm (scanned film)".
- No spacing: pixels, never an invented mm value: "45.0 px".

An elliptical ROI (the ellipse tool) gives the mean and standard deviation of the pixel
values inside it (HU on CT: "is it fluid?") and its area, over the pixels whose centres
lie inside the ellipse.

No Qt here, so the numbers are tested apart from the drawing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from medrt.types import SpacingSource

__all__ = ["Length", "Ellipse", "length_mm", "length_text", "ellipse_mask", "ellipse_text", "size_units"]


@dataclass(frozen=True, slots=True)
class Length:
    """A line from ``a`` to ``b``, each ``(x, y)`` = (column, row) in source pixels
    (sub-pixel: the scene's coordinates, pixel centres at .5)."""

    a: tuple[float, float]
    b: tuple[float, float]


def size_units(spacing_mm: tuple[float, float] | None, source: SpacingSource | str) -> tuple[str, str]:
    """(length unit, area unit) for sizes measured on an image of this spacing: "mm" and
    "mm²" with the qualifier :func:`length_text` gives ("mm at detector", "mm (ERMF)"), or
    "px" and "px²" when the header gives no spacing (the lesions are then in pixels)."""
    if spacing_mm is None:
        return "px", "px²"
    qualifier = SpacingSource(source).qualifier
    return f"mm{qualifier}", f"mm²{qualifier}"


def length_mm(line: Length, spacing_mm: tuple[float, float] | None) -> float | None:
    """The line's length in mm with ``spacing_mm`` = (row spacing, column spacing); None without one."""
    if spacing_mm is None:
        return None
    dx = (line.b[0] - line.a[0]) * float(spacing_mm[1])
    dy = (line.b[1] - line.a[1]) * float(spacing_mm[0])
    return math.hypot(dx, dy)


def length_text(line: Length, spacing_mm: tuple[float, float] | None, source: SpacingSource | str) -> str:
    """What the viewer writes beside the line."""
    mm = length_mm(line, spacing_mm)
    if mm is None:
        return f"{math.hypot(line.b[0] - line.a[0], line.b[1] - line.a[1]):.1f} px"
    return f"{mm:.1f} mm{SpacingSource(source).qualifier}"


@dataclass(frozen=True, slots=True)
class Ellipse:
    """The ellipse inscribed in the box with corners ``a`` and ``b``, each ``(x, y)`` in
    source pixels (scene coordinates)."""

    a: tuple[float, float]
    b: tuple[float, float]


def ellipse_mask(roi: Ellipse, shape: tuple[int, int]) -> tuple[tuple[int, int], np.ndarray]:
    """``((row0, col0), mask)``: the pixels of an image of ``shape`` whose centres lie inside
    the ellipse, as a boolean mask over the part of the image its box covers."""
    x0, x1 = sorted((roi.a[0], roi.b[0]))
    y0, y1 = sorted((roi.a[1], roi.b[1]))
    rows, cols = shape
    r0, r1 = max(0, math.floor(y0)), min(rows, math.ceil(y1))
    c0, c1 = max(0, math.floor(x0)), min(cols, math.ceil(x1))
    if r1 <= r0 or c1 <= c0 or x1 <= x0 or y1 <= y0:
        return (r0, c0), np.zeros((0, 0), dtype=bool)
    yy = (np.arange(r0, r1) + 0.5 - (y0 + y1) / 2) / ((y1 - y0) / 2)
    xx = (np.arange(c0, c1) + 0.5 - (x0 + x1) / 2) / ((x1 - x0) / 2)
    return (r0, c0), (yy[:, None] ** 2 + xx[None, :] ** 2) <= 1.0


def ellipse_text(roi: Ellipse, pixels: np.ndarray, spacing_mm: tuple[float, float] | None,
                 source: SpacingSource | str, modality: str) -> str:
    """``mean 34.2 HU, SD 12.1, 123.4 mm²`` (CT), ``mean 1234.0, SD ...`` otherwise; the area
    in mm² as :func:`length_text` qualifies a mm, or in px without spacing."""
    (r0, c0), mask = ellipse_mask(roi, (int(pixels.shape[0]), int(pixels.shape[1])))
    n = int(mask.sum())
    if n == 0:
        return "no pixel inside"
    values = pixels[r0:r0 + mask.shape[0], c0:c0 + mask.shape[1]][mask].astype(np.float64)
    unit = " HU" if modality.upper() == "CT" else ""
    if spacing_mm is None:
        area = f"{n} px"
    else:
        area = f"{n * float(spacing_mm[0]) * float(spacing_mm[1]):.1f} mm²{SpacingSource(source).qualifier}"
    return f"mean {values.mean():.1f}{unit}, SD {values.std():.1f}, {area}"
