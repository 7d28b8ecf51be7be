"""CT-like axial series: a scanner stream moving along z, with 3-D lesions.

Each series is one synthetic patient (see :mod:`medrt.phantom.ct_anatomy`) scanned
head-to-feet from the lung bases down. Lesions are irregular ellipsoids placed
inside one homogeneous tissue (liver, spleen, kidney, muscle, lung), so
consecutive slices show their cross-sections; each slice's ground truth lists the
cross-sections it contains, measured on that slice's mask. Cross-sections smaller
than 2 mm are kept but flagged ``extras["ignore"] = 1.0``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace

import numpy as np

from medrt.phantom.ct_anatomy import TISSUE_HU, Anatomy, AxialGrid, Tissue, make_anatomy, tissue_map
from medrt.phantom.fields import blur, quantize_constant, smooth_noise
from medrt.phantom.frame import CT, PhantomFrame, freeze
from medrt.phantom.seeding import check_seed, stream_rng
from medrt.phantom.shapes import (
    IRREGULAR,
    ROUND,
    Blob,
    log_uniform,
    random_harmonics,
    render_blob,
    truth_from_mask,
)
from medrt.types import LesionTruth

__all__ = ["generate_ct_series", "noise_sigma", "CT_WINDOW", "MIN_DIAMETER_MM", "MAX_DIAMETER_MM", "NOISE_BLUR_PX"]

log = logging.getLogger(__name__)

CT_WINDOW = (40.0, 400.0)  # soft tissue (center, width) in HU
MIN_DIAMETER_MM = 2.0
MAX_DIAMETER_MM = 28.0  # a 3-D lesion's largest diameter; its masks then stay below 30 mm
HU_MIN, HU_MAX = -1024.0, 3071.0
_MARGIN_PX = 7  # homogeneous tissue kept around each lesion (room for a ring test)
_ORGANS = (Tissue.LIVER, Tissue.SPLEEN, Tissue.KIDNEY, Tissue.MUSCLE, Tissue.LUNG)
_ORGAN_P = (0.45, 0.12, 0.13, 0.12, 0.18)
_NEGATIVE_P = {Tissue.LIVER: 0.7, Tissue.SPLEEN: 0.6, Tissue.KIDNEY: 0.8, Tissue.MUSCLE: 0.4}
# The quantum noise: white noise blurred by a Gaussian of this sigma in pixels, so one
# independent sample covers about 4 pi 0.8^2 = 8 px (medrt.models.ceiling).
NOISE_BLUR_PX = 0.8

_TEXTURE_HU = {
    Tissue.LUNG: 25.0,
    Tissue.MARROW: 15.0,
    Tissue.FAT: 4.0,
    Tissue.AIR: 0.0,
    Tissue.GAS: 0.0,
    Tissue.FOAM: 0.0,
}


@dataclass(frozen=True, slots=True)
class _Series:
    """Scanner geometry of one series."""

    size: int
    n_frames: int
    spacing: float
    thickness: float
    z_top: float
    sigma: float
    grid: AxialGrid

    def depth(self, i: int) -> float:
        return i * self.thickness

    def z(self, i: int) -> float:
        return round(self.z_top - i * self.thickness, 4)


@dataclass(frozen=True, slots=True)
class _Lesion3D:
    """An irregular ellipsoid: in-plane outline ``blob`` (mm) and half-length ``half_z``."""

    label: int
    x: float
    y: float
    z: float
    radii: tuple[float, float]
    half_z: float
    angle: float
    harmonics: tuple[tuple[int, float, float], ...]
    twist: float
    contrast: float
    shape: str
    kind: str
    diameter_mm: float

    @property
    def reach_mm(self) -> float:
        return max(self.radii) * (1.0 + sum(abs(a) for _, a, _ in self.harmonics))

    def section(self, z: float, series: _Series) -> Blob | None:
        """The cross-section at slice position ``z`` in pixel coordinates, or None."""
        dz = z - self.z
        if abs(dz) >= self.half_z:
            return None
        f = math.sqrt(1.0 - (dz / self.half_z) ** 2)
        sp, g = series.spacing, series.grid
        harm = tuple((k, a, p + self.twist * dz) for k, a, p in self.harmonics)
        return Blob(
            center=((self.y - float(g.y[0])) / sp, (self.x - float(g.x[0])) / sp),
            radii=(self.radii[0] * f / sp, self.radii[1] * f / sp),
            angle=self.angle,
            harmonics=harm,
            edge_px=1.0,
        )


def _make_series(n_frames: int, size: int, rng: np.random.Generator, thickness_mm: float | None = None) -> _Series:
    fov = rng.uniform(350.0, 400.0)
    spacing = round(fov / size, 6)
    thickness = float(rng.choice([3.0, 5.0]))  # drawn either way: the other draws stay as they were
    if thickness_mm is not None:
        thickness = float(thickness_mm)
    x0 = round(-(size - 1) / 2.0 * spacing, 4)
    y0 = round(x0 + 25.0, 4)
    grid = AxialGrid(
        x=x0 + np.arange(size, dtype=np.float64) * spacing,
        y=y0 + np.arange(size, dtype=np.float64) * spacing,
    )
    return _Series(
        size=size,
        n_frames=n_frames,
        spacing=spacing,
        thickness=thickness,
        z_top=round(float(rng.uniform(-120.0, -60.0)), 1),
        sigma=round(float(rng.uniform(10.0, 14.0)), 2),
        grid=grid,
    )


def _fits(
    les: _Lesion3D, organ: int, tissues: list[np.ndarray], series: _Series, clean: set[int]
) -> bool:
    """True when every cross-section, plus a margin, lies in ``organ`` and off the clean block."""
    sp, g = series.spacing, series.grid
    row, col = (les.y - g.y[0]) / sp, (les.x - g.x[0]) / sp
    for i in range(series.n_frames):
        dz = series.z(i) - les.z
        if abs(dz) >= les.half_z:
            continue
        if i in clean:
            return False
        f = math.sqrt(1.0 - (dz / les.half_z) ** 2)
        reach = les.reach_mm * f / sp + _MARGIN_PX
        r0, r1 = int(row - reach), int(math.ceil(row + reach)) + 1
        c0, c1 = int(col - reach), int(math.ceil(col + reach)) + 1
        if r0 < 0 or c0 < 0 or r1 > series.size or c1 > series.size:
            return False
        rr = np.arange(r0, r1)[:, None] - row
        cc = np.arange(c0, c1)[None, :] - col
        disk = rr * rr + cc * cc <= reach * reach
        if not np.all(tissues[i][r0:r1, c0:c1][disk] == organ):
            return False
    return True


def _place_lesions(
    rng: np.random.Generator, series: _Series, tissues: list[np.ndarray]
) -> list[_Lesion3D]:
    """Draw 3-D lesions inside organs, apart from each other, leaving some slices clean."""
    n_frames = series.n_frames
    wanted = int(rng.integers(6, 12))
    if n_frames < 40:
        wanted = max(1, round(wanted * n_frames / 40))
    block = max(1, n_frames // 5)
    start = int(rng.integers(0, max(1, n_frames - block + 1)))
    clean = set(range(start, start + block)) if n_frames > 1 else set()
    allowed = [i for i in range(n_frames) if i not in clean] or list(range(n_frames))
    lesions: list[_Lesion3D] = []
    sp = series.spacing
    gap = _MARGIN_PX * sp
    for _ in range(4 * wanted):
        if len(lesions) >= wanted:
            break
        # Shape first, then look for room: big lesions are not crowded out by small ones.
        diameter = log_uniform(rng, MIN_DIAMETER_MM, MAX_DIAMETER_MM)
        irregular = bool(rng.random() < 0.5)
        harm = random_harmonics(rng, irregular)
        a = diameter / 2.0 / (1.0 + sum(abs(h[1]) for h in harm))
        half_z = diameter / 2.0 * float(rng.uniform(0.6, 1.0))
        proto = _Lesion3D(
            label=len(lesions) + 1,
            x=0.0,
            y=0.0,
            z=0.0,
            radii=(a, a * float(rng.uniform(0.75, 1.0))),
            half_z=half_z,
            angle=float(rng.uniform(0.0, math.pi)),
            harmonics=harm,
            twist=float(rng.uniform(-0.08, 0.08)) if irregular else 0.0,
            contrast=0.0,
            shape=IRREGULAR if irregular else ROUND,
            kind="faint" if rng.random() < 0.45 else "bright",
            diameter_mm=round(diameter, 4),
        )
        for _ in range(40):
            organ = int(rng.choice(_ORGANS, p=_ORGAN_P))
            k = int(allowed[int(rng.integers(len(allowed)))])
            where = np.flatnonzero(tissues[k] == organ)
            if where.size == 0:
                continue
            r, c = divmod(int(where[int(rng.integers(where.size))]), series.size)
            if organ == Tissue.LUNG:
                kind, contrast = "bright", float(rng.uniform(600.0, 820.0))
            else:
                kind = proto.kind
                lo, hi = (1.5, 3.0) if kind == "faint" else (4.0, 9.0)
                sign = -1.0 if rng.random() < _NEGATIVE_P[organ] else 1.0
                contrast = sign * float(rng.uniform(lo, hi)) * series.sigma
            # Centred near slice k, so every lesion shows on at least one slice.
            dz = float(rng.uniform(-0.5, 0.5)) * min(series.thickness, half_z)
            les = replace(
                proto,
                x=float(series.grid.x[c] + rng.uniform(-0.5, 0.5) * sp),
                y=float(series.grid.y[r] + rng.uniform(-0.5, 0.5) * sp),
                z=series.z(k) + dz,
                contrast=round(contrast, 3),
                kind=kind,
            )
            if any(
                math.dist((les.x, les.y, les.z), (o.x, o.y, o.z)) < les.reach_mm + o.reach_mm + gap
                for o in lesions
            ):
                continue
            if _fits(les, organ, tissues, series, clean):
                lesions.append(les)
                break
    log.debug("placed %d of %d CT lesions", len(lesions), wanted)
    return lesions


def _render_slice(
    seed: int,
    i: int,
    series: _Series,
    tissue: np.ndarray,
    lesions: list[_Lesion3D],
    render_lesions: bool,
) -> tuple[np.ndarray, np.ndarray, tuple[LesionTruth, ...]]:
    """HU pixels, label map and truth of slice ``i``."""
    shape = tissue.shape
    lut = np.zeros(256, dtype=np.float64)
    tex = np.full(256, 3.0, dtype=np.float64)
    for tid, hu in TISSUE_HU.items():
        lut[tid] = hu
        tex[tid] = _TEXTURE_HU.get(tid, 3.0)
    rng = stream_rng(seed, CT, 1, i)
    hu = blur(lut[tissue], 0.5)
    hu += smooth_noise(rng, shape, 2.5 / series.spacing) * tex[tissue]
    labels = np.zeros(shape, dtype=np.uint16)
    truths: list[LesionTruth] = []
    z = series.z(i)
    for les in lesions:
        blob = les.section(z, series)
        hit = render_blob(blob, shape) if blob is not None else None
        if hit is None:
            continue
        sl, weight, mask = hit
        if not mask.any():
            continue
        added = les.contrast * weight
        if render_lesions:
            hu[sl] += added
        labels[sl][mask] = les.label
        extras = {"generated_diameter_mm": les.diameter_mm}
        t = truth_from_mask(
            les.label,
            mask,
            (sl[0].start, sl[1].start),
            added,
            (series.spacing, series.spacing),
            les.shape,
            les.kind,
            extras,
        )
        if t.diameter_mm < MIN_DIAMETER_MM:
            t = replace(t, extras={**extras, "ignore": 1.0})
        truths.append(t)
    # Quantum noise: mildly correlated, weaker in air outside the patient.
    white = blur(rng.standard_normal(shape), NOISE_BLUR_PX)
    white /= quantize_constant(float(white.std()))
    body = blur((tissue != Tissue.AIR).astype(np.float64), 2.0)
    hu += white * (series.sigma * (0.3 + 0.7 * body))
    pixels = np.clip(np.rint(hu), HU_MIN, HU_MAX).astype(np.float32)
    return pixels, labels, tuple(truths)


def noise_sigma(seed: int, n_frames: int = 40, size: int = 512) -> float:
    """The quantum noise of ``generate_ct_series(seed, n_frames, size)`` inside the body,
    in HU: white noise blurred by :data:`NOISE_BLUR_PX`, scaled to this standard deviation
    (a faint lesion's contrast is 1.5-3 times it, a bright one's 4-9)."""
    return _make_series(n_frames, size, stream_rng(check_seed(seed), CT, 0)).sigma


def generate_ct_series(
    seed: int, n_frames: int = 40, size: int = 512, *, render_lesions: bool = True,
    thickness_mm: float | None = None,
) -> list[PhantomFrame]:
    """A CT-like axial series of ``n_frames`` slices of ``size``² pixels, head to feet.

    Same ``seed`` -> bit-identical frames. ``render_lesions=False`` gives the same
    series and truth without the lesions added to the pixels (a lesion-free
    background, for checking that the masks sit on the lesions). ``thickness_mm``
    sets the slice thickness and step (drawn from 3 and 5 mm when None; the models
    were trained on those): a thin-slice series to test them on.
    """
    seed = check_seed(seed)
    if not isinstance(n_frames, int) or n_frames < 1:
        raise ValueError(f'Argument "n_frames" must be a positive integer, got {n_frames!r}.')
    if not isinstance(size, int) or size < 64:
        raise ValueError(f'Argument "size" must be an integer >= 64, got {size!r}.')
    rng = stream_rng(seed, CT, 0)
    if thickness_mm is not None and not 0.1 <= float(thickness_mm) <= 20.0:
        raise ValueError(f'Argument "thickness_mm" must be in 0.1..20 mm, got {thickness_mm!r}.')
    series = _make_series(n_frames, size, rng, thickness_mm)
    anatomy: Anatomy = make_anatomy(rng)
    tissues = [tissue_map(anatomy, series.grid, series.depth(i)) for i in range(n_frames)]
    lesions = _place_lesions(stream_rng(seed, CT, 2), series, tissues)
    frames = []
    x0, y0 = float(series.grid.x[0]), float(series.grid.y[0])
    for i in range(n_frames):
        pixels, labels, truths = _render_slice(seed, i, series, tissues[i], lesions, render_lesions)
        frames.append(
            PhantomFrame(
                kind=CT,
                seed=seed,
                index=i,
                pixels=freeze(pixels),
                labels=freeze(labels),
                lesions=truths,
                spacing_mm=(series.spacing, series.spacing),
                window=CT_WINDOW,
                slice_location=series.z(i),
                slice_thickness_mm=series.thickness,
                position=(x0, y0, series.z(i)),
            )
        )
    return frames
