"""Lesion shapes: round and irregular blobs with a soft edge, and how they are measured.

A lesion is a star-shaped outline ``r(θ) = R(θ) · (1 + Σ a_k cos(kθ + φ_k))`` around
an ellipse ``R(θ)``: "round" lesions have no harmonics, "irregular" ones a few low
harmonics (lobulated, spiculated-looking). Rendering gives a weight in [0, 1] that is
1 inside, falls to 0 across about ``edge_px`` pixels, and is 0.5 on the outline;
the lesion's mask is the pixels whose centre lies inside the outline. Work is done only inside the
lesion's bounding box, so a 4096² radiograph with a few nodules stays fast.

The measuring helpers (:func:`longest_diameter_mm`, :func:`truth_from_mask`) define
the conventions the ground truth uses, so evaluation code should reuse them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from medrt.types import LesionTruth

__all__ = [
    "Blob",
    "render_blob",
    "random_harmonics",
    "log_uniform",
    "longest_diameter_mm",
    "truth_from_mask",
    "ROUND",
    "IRREGULAR",
]

ROUND = "round"
IRREGULAR = "irregular"

# Ground-truth floats are rounded so that the JSON sidecar round-trips exactly.
_DECIMALS = 4


@dataclass(frozen=True, slots=True)
class Blob:
    """A 2-D lesion outline in pixel coordinates.

    ``radii`` are the semi-axes along the rotated row/col axes (pixels), ``angle``
    the rotation in radians, ``harmonics`` ``(k, amplitude, phase)`` triples.
    ``dome`` in [0, 1] makes the inside a projected sphere (1 - dome at the outline,
    1 at the centre) instead of flat: a nodule on a radiograph.
    """

    center: tuple[float, float]
    radii: tuple[float, float]
    angle: float = 0.0
    harmonics: tuple[tuple[int, float, float], ...] = ()
    edge_px: float = 1.0
    dome: float = 0.0

    @property
    def max_radius(self) -> float:
        """An upper bound of the outline's distance from the centre, in pixels."""
        bump = 1.0 + sum(abs(a) for _, a, _ in self.harmonics)
        return max(self.radii) * bump

    def scaled(self, factor: float) -> Blob:
        """The same outline, ``factor`` times as large (a cross-section of a 3-D lesion)."""
        return Blob(
            self.center,
            (self.radii[0] * factor, self.radii[1] * factor),
            self.angle,
            self.harmonics,
            self.edge_px,
            self.dome,
        )


def random_harmonics(
    rng: np.random.Generator, irregular: bool
) -> tuple[tuple[int, float, float], ...]:
    """Harmonics for an irregular outline (lobulation), or none for a round one.

    The total amplitude stays below 0.35, so the outline is star-shaped and the
    lesion never splits into pieces.
    """
    if not irregular:
        return ()
    ks = rng.choice(np.arange(2, 8), size=int(rng.integers(2, 5)), replace=False)
    amps = rng.uniform(0.03, 0.14, size=ks.size)
    total = float(amps.sum())
    if total > 0.35:
        amps = amps * (0.35 / total)
    phases = rng.uniform(0.0, 2.0 * math.pi, size=ks.size)
    return tuple(
        (int(k), round(float(a), 6), round(float(p), 6))
        for k, a, p in zip(sorted(ks.tolist()), amps.tolist(), phases.tolist(), strict=True)
    )


def log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    """A value uniform in log between ``lo`` and ``hi``: small lesions are common."""
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def render_blob(
    blob: Blob, shape: tuple[int, int]
) -> tuple[tuple[slice, slice], np.ndarray, np.ndarray] | None:
    """The blob's weight and mask inside its bounding box, clipped to an image of ``shape``.

    Returns ``(bbox slices, float64 weight, bool mask)`` or None when the box lies
    outside the image. The mask is the pixels whose centre is inside the outline.
    The weight is computed in float64 so results are bit-identical across CPUs.
    """
    cr, cc = blob.center
    reach = blob.max_radius + blob.edge_px + 1.0
    r0 = max(int(math.floor(cr - reach)), 0)
    r1 = min(int(math.ceil(cr + reach)) + 1, shape[0])
    c0 = max(int(math.floor(cc - reach)), 0)
    c1 = min(int(math.ceil(cc + reach)) + 1, shape[1])
    if r0 >= r1 or c0 >= c1:
        return None
    dr = np.arange(r0, r1, dtype=np.float64)[:, None] - cr
    dc = np.arange(c0, c1, dtype=np.float64)[None, :] - cc
    cos_a, sin_a = math.cos(blob.angle), math.sin(blob.angle)
    u = dr * cos_a + dc * sin_a
    v = -dr * sin_a + dc * cos_a
    rho = np.hypot(u, v)
    theta = np.arctan2(v, u)
    a, b = blob.radii
    # Radius of the ellipse along each pixel's direction, then the lobulation.
    ellipse_r = (a * b) / np.maximum(np.hypot(b * np.cos(theta), a * np.sin(theta)), 1e-12)
    mod = np.ones_like(theta)
    for k, amp, phase in blob.harmonics:
        mod += amp * np.cos(k * theta + phase)
    outline = ellipse_r * mod
    mask = outline >= rho
    weight = np.clip(0.5 + (outline - rho) / blob.edge_px, 0.0, 1.0)
    if blob.dome > 0.0:
        inner = np.clip(1.0 - (rho / np.maximum(outline, 1e-12)) ** 2, 0.0, 1.0)
        weight *= (1.0 - blob.dome) + blob.dome * np.sqrt(inner)
    return (slice(r0, r1), slice(c0, c1)), weight, mask


def _extreme_points(mask: np.ndarray) -> np.ndarray:
    """The first and last pixel of each row and column: a superset of the hull's vertices."""
    rows, cols = np.nonzero(mask)
    pts = [np.stack([rows, cols], axis=1)]
    if rows.size > 64:
        order = np.lexsort((cols, rows))
        r, c = rows[order], cols[order]
        first = np.r_[True, r[1:] != r[:-1]]
        last = np.r_[r[1:] != r[:-1], True]
        order_c = np.lexsort((rows, cols))
        rc, cc = rows[order_c], cols[order_c]
        first_c = np.r_[True, cc[1:] != cc[:-1]]
        last_c = np.r_[cc[1:] != cc[:-1], True]
        pts = [
            np.stack([r[first | last], c[first | last]], axis=1),
            np.stack([rc[first_c | last_c], cc[first_c | last_c]], axis=1),
        ]
    return np.unique(np.concatenate(pts, axis=0), axis=0).astype(np.float64)


def longest_diameter_mm(mask: np.ndarray, spacing_mm: tuple[float, float]) -> float:
    """Longest diameter of a binary mask in mm.

    Convention: the longest chord between pixel centres, extended by one pixel's
    extent along that chord (a single pixel measures one pixel spacing). Spacing is
    ``(row, col)`` in mm, as in DICOM PixelSpacing.
    """
    return longest_chord_mm(_extreme_points(mask), spacing_mm)


def longest_chord_mm(pts: np.ndarray, spacing_mm: tuple[float, float]) -> float:
    """:func:`longest_diameter_mm` of a mask given as points ``(row, col)`` (float64, in
    ``np.unique``'s order) that include its convex hull's vertices."""
    if pts.shape[0] == 0:
        return 0.0
    sr, sc = float(spacing_mm[0]), float(spacing_mm[1])
    mm = pts * np.array([sr, sc])
    d2 = ((mm[:, None, :] - mm[None, :, :]) ** 2).sum(axis=-1)
    i, j = np.unravel_index(int(np.argmax(d2)), d2.shape)
    length = math.sqrt(float(d2[i, j]))
    if length == 0.0:
        return math.sqrt(sr * sc)
    # One pixel step along the chord's direction (sr or sc along an axis, s if isotropic).
    ur = (mm[j, 0] - mm[i, 0]) / length
    uc = (mm[j, 1] - mm[i, 1]) / length
    extent = 1.0 / math.hypot(ur / sr, uc / sc)
    return length + extent


def truth_from_mask(
    label: int,
    mask: np.ndarray,
    offset: tuple[int, int],
    added: np.ndarray,
    spacing_mm: tuple[float, float],
    shape: str,
    kind: str,
    extras: dict[str, float] | None = None,
) -> LesionTruth:
    """Measure one lesion's mask (given inside its box at ``offset``) into a LesionTruth.

    ``added`` is what the renderer added to the pixels in the same box; the recorded
    contrast is its mean inside the mask, so it matches the image by construction.
    """
    rows, cols = np.nonzero(mask)
    r0, c0 = offset
    bbox = (
        int(rows.min()) + r0,
        int(cols.min()) + c0,
        int(rows.max()) + r0 + 1,
        int(cols.max()) + c0 + 1,
    )
    center = (round(float(rows.mean()) + r0, _DECIMALS), round(float(cols.mean()) + c0, _DECIMALS))
    area = float(rows.size) * float(spacing_mm[0]) * float(spacing_mm[1])
    return LesionTruth(
        label=int(label),
        center=center,
        bbox=bbox,
        diameter_mm=round(longest_diameter_mm(mask, spacing_mm), _DECIMALS),
        area_mm2=round(area, _DECIMALS),
        contrast=round(float(added[mask].mean()), _DECIMALS),
        shape=shape,
        kind=kind,
        extras=dict(extras or {}),
    )
