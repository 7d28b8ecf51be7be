"""Radiograph-like frames (PA chest DX, up to 4096²) with nodules.

The anatomy is drawn on a coarse grid (at most 1024²) and upsampled; nodules and
quantum-like noise are added at full resolution, nodules only inside their
bounding boxes. Nodules are denser (brighter) than their background, may sit
anywhere, including across the image border (mask and bbox clipped to the image),
and can be asked for far apart (opposite corners). Values are presentation values
0..4095 in display semantics; MONOCHROME1 storage is a writer option and does not
change the frame.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from medrt.phantom.fields import blur, quantize_constant, upsample
from medrt.phantom.frame import XRAY, PhantomFrame, freeze
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
from medrt.phantom.xray_anatomy import chest_map, make_build
from medrt.types import LesionTruth

__all__ = ["generate_radiograph", "nodule_outline", "XRAY_MAX", "NOISE_SIGMA"]

log = logging.getLogger(__name__)

XRAY_MAX = 4095.0  # 12-bit presentation values
NOISE_SIGMA = 1.5  # quantum noise in the lungs, presentation units
_COARSE_MAX = 1024
_MIN_MM, _MAX_MM = 2.0, 30.0


def _coarse_size(size: int) -> int:
    for f in (4, 2, 1):
        if size % f == 0 and size // f <= _COARSE_MAX:
            return size // f
    return size


def _nodule(
    rng: np.random.Generator,
    center: tuple[float, float],
    diameter_mm: float,
    spacing: float,
    faint: bool,
) -> tuple[Blob, float, str, str]:
    """A nodule outline (pixels), its contrast, shape and kind."""
    irregular = bool(rng.random() < 0.45)
    harm = random_harmonics(rng, irregular)
    r = diameter_mm / 2.0 / spacing / (1.0 + sum(abs(h[1]) for h in harm))
    blob = Blob(
        center=center,
        radii=(r, r * float(rng.uniform(0.8, 1.0))),
        angle=float(rng.uniform(0.0, math.pi)),
        harmonics=harm,
        edge_px=max(1.0, 0.3 / spacing),
        dome=0.5,
    )
    # Contrast against the anatomy, not against the noise: this phantom's noise is
    # kept low so the samples compress, and contrast scaled to it made nodules a
    # thousandth of the window (far subtler than real ones). Faint nodules are
    # 0.6-1.4 % of a chest window (25-50 units of 4095), bright ones 2-8 %; both
    # are still 15-200 times the noise.
    lo, hi = (25.0, 50.0) if faint else (80.0, 300.0)
    contrast = round(float(rng.uniform(lo, hi)), 3)
    return blob, contrast, IRREGULAR if irregular else ROUND, "faint" if faint else "bright"


def nodule_outline(
    rng: np.random.Generator, center: tuple[float, float], diameter_mm: float, spacing: float, faint: bool
) -> tuple[Blob, float]:
    """A nodule as :func:`generate_radiograph` draws one (outline in pixels of ``spacing``
    mm, and its contrast in units): for drawing more of them elsewhere (training data)."""
    blob, contrast, _, _ = _nodule(rng, center, diameter_mm, spacing, faint)
    return blob, contrast


def _centers(
    rng: np.random.Generator,
    size: int,
    n_random: int,
    border: bool,
    far_apart: bool,
    max_r_px: float,
) -> list[tuple[tuple[float, float], str]]:
    """Nodule centres (pixels) with a role: ``corner``, ``border`` or ``random``."""
    out: list[tuple[tuple[float, float], str]] = []
    if far_apart:
        flip = bool(rng.random() < 0.5)
        a = rng.uniform(0.06, 0.16, size=4) * size
        first = (float(a[0]), float(size - a[1] if flip else a[1]))
        second = (float(size - a[2]), float(a[3] if flip else size - a[3]))
        out += [(first, "corner"), (second, "corner")]
    if border:
        edge = int(rng.integers(4))
        along = float(rng.uniform(0.2, 0.8)) * size
        off = float(rng.uniform(-0.3, 0.4)) * max_r_px  # centre just in or out of the image
        pos = {
            0: (off, along),
            1: (size - 1 - off, along),
            2: (along, off),
            3: (along, size - 1 - off),
        }
        out.append((pos[edge], "border"))
    for _ in range(n_random):
        out.append(((float(rng.uniform(0, size - 1)), float(rng.uniform(0, size - 1))), "random"))
    return out


def _place_nodules(
    rng: np.random.Generator,
    base: np.ndarray,
    spacing: float,
    n_random: int,
    border: bool,
    far_apart: bool,
) -> tuple[np.ndarray, list[LesionTruth], list[tuple[tuple[slice, slice], np.ndarray]]]:
    """Draw the nodules: label map, truth, and what each adds to the pixels in its box."""
    size = base.shape[0]
    max_mm = min(_MAX_MM, 0.25 * size * spacing)
    roles = _centers(rng, size, n_random, border, far_apart, max_mm / 2.0 / spacing)
    labels = np.zeros((size, size), dtype=np.uint16)
    truths: list[LesionTruth] = []
    placed: list[tuple[float, float, float]] = []
    added_all: list[tuple[tuple[slice, slice], np.ndarray]] = []
    for center, role in roles:
        for _ in range(30):
            # a small --size leaves less room than the smallest nodule asks: draw within it
            diameter = log_uniform(rng, min(6.0 if role == "border" else _MIN_MM, max_mm), max_mm)
            faint = bool(rng.random() < 0.4)
            r, c = (int(np.clip(v, 0, size - 1)) for v in center)
            blob, contrast, shape, kind = _nodule(rng, center, diameter, spacing, faint)
            if any(math.dist(center, p[:2]) < blob.max_radius + 8.0 + p[2] for p in placed):
                if role == "random":
                    center = (float(rng.uniform(0, size - 1)), float(rng.uniform(0, size - 1)))
                continue
            hit = render_blob(blob, (size, size))
            if hit is None or not hit[2].any():
                continue
            sl, weight, mask = hit
            # Keep clear of the top of the range, so clipping never eats contrast.
            contrast = min(contrast, XRAY_MAX - 40.0 - float(base[sl].max()))
            added = contrast * weight
            extras = {"generated_diameter_mm": round(diameter, 4)}
            if _touches_border(sl, mask, size):
                extras["border"] = 1.0
            offset = (sl[0].start, sl[1].start)
            t = truth_from_mask(
                len(truths) + 1, mask, offset, added, (spacing, spacing), shape, kind, extras
            )
            if not _MIN_MM <= t.diameter_mm <= _MAX_MM or (
                role == "border" and "border" not in extras
            ):
                continue
            labels[sl][mask] = t.label
            truths.append(t)
            placed.append((center[0], center[1], blob.max_radius))
            added_all.append((sl, added))
            break
    return labels, truths, added_all


def generate_radiograph(
    seed: int,
    size: int = 4096,
    *,
    index: int = 0,
    spacing_mm: float | None = None,
    n_lesions: int | None = None,
    border_lesion: bool = False,
    far_apart: bool = False,
    render_lesions: bool = True,
) -> PhantomFrame:
    """One chest radiograph ``size``² with nodules and their ground truth.

    ``(seed, index)`` selects the frame deterministically. ``spacing_mm`` is the
    ImagerPixelSpacing (drawn in 0.1-0.15 mm when None). ``n_lesions`` random
    nodules are added (drawn 0-3 when None) to a border-crossing one
    (``border_lesion``) and two at opposite corners (``far_apart``).
    ``render_lesions=False`` keeps the truth but leaves the nodules out of the pixels.
    """
    seed = check_seed(seed)
    if not isinstance(size, int) or size < 64:
        raise ValueError(f'Argument "size" must be an integer >= 64, got {size!r}.')
    if not isinstance(index, int) or index < 0:
        raise ValueError(f'Argument "index" must be a non-negative integer, got {index!r}.')
    rng = stream_rng(seed, XRAY, 0, index)
    if spacing_mm is None:
        spacing_mm = round(float(rng.uniform(0.1, 0.15)), 4)
    elif not 0.01 <= float(spacing_mm) <= 1.0:
        raise ValueError(f'Argument "spacing_mm" must be in 0.01..1 mm, got {spacing_mm!r}.')
    spacing = float(spacing_mm)
    build = make_build(rng)
    n = _coarse_size(size)
    coarse, scale = chest_map(build, stream_rng(seed, XRAY, 1, index), n)
    lo, hi = np.percentile(coarse[scale > 0.3], [1.0, 99.5])  # the exposed field only
    window = (float(round((lo + hi) / 2.0)), float(round((hi - lo) * 1.1)))
    base = upsample(coarse, (size, size), np.float32)
    sigma_map = upsample(scale * NOISE_SIGMA, (size, size), np.float32)
    del coarse, scale

    lrng = stream_rng(seed, XRAY, 2, index)
    if n_lesions is None:
        n_lesions = int(lrng.integers(0, 4))
    labels, truths, added_all = _place_nodules(
        lrng, base, spacing, n_lesions, border_lesion, far_apart
    )
    if render_lesions:
        for sl, added in added_all:
            base[sl] += added.astype(np.float32)
    noise = _noise(stream_rng(seed, XRAY, 3, index), size)
    noise *= sigma_map
    base += noise
    del noise, sigma_map
    np.rint(base, out=base)
    np.clip(base, 0.0, XRAY_MAX, out=base)
    pixels = base
    log.debug("radiograph seed=%d index=%d: %d nodules", seed, index, len(truths))
    return PhantomFrame(
        kind=XRAY,
        seed=seed,
        index=index,
        pixels=freeze(pixels),
        labels=freeze(labels),
        lesions=tuple(truths),
        spacing_mm=(spacing, spacing),
        window=window,
    )


def _touches_border(sl: tuple[slice, slice], mask: np.ndarray, size: int) -> bool:
    """Whether a mask (given in its box ``sl``) reaches the first or last row or column."""
    return bool(
        (sl[0].start == 0 and mask[0].any())
        or (sl[0].stop == size and mask[-1].any())
        or (sl[1].start == 0 and mask[:, 0].any())
        or (sl[1].stop == size and mask[:, -1].any())
    )


def _noise(rng: np.random.Generator, size: int) -> np.ndarray:
    """Unit-variance noise: part white, part correlated over a couple of pixels.

    The correlated part is drawn at half resolution and upsampled, which keeps it
    cheap and keeps lossless compression of the frame reasonable.
    """
    half = max(2, size // 2)
    corr = blur(rng.standard_normal((half, half)), 0.6)
    corr /= quantize_constant(float(corr.std()))
    field = upsample(corr * 0.95, (size, size), np.float32)
    field += np.float32(0.3) * rng.standard_normal((size, size), dtype=np.float32)
    field /= np.float32(quantize_constant(float(field[::7, ::7].astype(np.float64).std()), 4))
    return field
