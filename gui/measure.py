"""Lengths measured on the image with the length tool: in mm where the header says how
big a pixel is, and what that size means.

- ``PixelSpacing``: in the patient (CT, MR): "12.3 mm".
- ``ImagerPixelSpacing`` (DX, CR): at the detector plane, so a length includes the
  geometric magnification (often 5–15 % for a chest radiograph): "12.3 mm at detector",
  as OHIF and Cornerstone mark a projection calibration.
- ``ImagePlanePixelSpacing`` (RT images): "12.3 mm at receptor";
  ``NominalScannedPixelSpacing`` (a scanned film): "12.3 mm (scanned film)".
- No spacing: pixels, never an invented mm value: "45.0 px".

Pure Python (no Qt), so the numbers are tested apart from the drawing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from medrt.types import SpacingSource

__all__ = ["Length", "length_mm", "length_text"]

_QUALIFIER = {
    SpacingSource.PIXEL_SPACING: "",
    SpacingSource.IMAGER_PIXEL_SPACING: " at detector",
    SpacingSource.IMAGE_PLANE: " at receptor",
    SpacingSource.NOMINAL_SCANNED: " (scanned film)",
}


@dataclass(frozen=True, slots=True)
class Length:
    """A line from ``a`` to ``b``, each ``(x, y)`` = (column, row) in source pixels
    (sub-pixel: the scene's coordinates, pixel centres at .5)."""

    a: tuple[float, float]
    b: tuple[float, float]


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
    return f"{mm:.1f} mm{_QUALIFIER.get(SpacingSource(source), '')}"
