"""The radiograph phantom's anatomy: a PA chest, drawn on a coarse grid.

Values are presentation values 0..4095 with display semantics (denser is brighter):
direct exposure is dark, lungs are dark grey, soft tissue, mediastinum, bone and
the collimated border are bright. Coordinates are normalised, ``u`` across
(-1 = image left = patient's right) and ``v`` down (-1 = top). The coarse map is
upsampled to full resolution by :mod:`medrt.phantom.xray`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from medrt.phantom.fields import smooth_noise

__all__ = ["ChestBuild", "make_build", "chest_map", "COLLIMATED", "DIRECT"]

COLLIMATED = 3400.0  # behind the collimator blades: no exposure, bright
DIRECT = 260.0  # direct exposure outside the patient: dark


@dataclass(frozen=True, slots=True)
class ChestBuild:
    """One synthetic patient and exposure, drawn once per radiograph."""

    width: float
    lung_top: float
    dome: float
    heart: float
    shift: float
    collimation: tuple[float, float, float, float]  # top, bottom, left, right (fraction)
    rib_phase: float
    exposure: float


def make_build(rng: np.random.Generator) -> ChestBuild:
    return ChestBuild(
        width=float(rng.uniform(0.8, 0.92)),
        lung_top=float(rng.uniform(-0.8, -0.7)),
        dome=float(rng.uniform(0.38, 0.52)),
        heart=float(rng.uniform(0.9, 1.15)),
        shift=float(rng.uniform(-0.04, 0.04)),
        collimation=tuple(float(x) for x in rng.uniform(0.015, 0.05, size=4)),  # type: ignore[arg-type]
        rib_phase=float(rng.uniform(-0.03, 0.03)),
        exposure=float(rng.uniform(-120.0, 120.0)),
    )


def _soft(x: np.ndarray, width: float) -> np.ndarray:
    """A smooth step from 0 (x << 0) to 1 (x >> 0) over about ``width``."""
    return 0.5 * (1.0 + np.tanh(x / width))


def _band(
    u: np.ndarray, v: np.ndarray, centre: np.ndarray, half: np.ndarray, edge: float
) -> np.ndarray:
    """A bone band around a centre line ``v = centre(u)``, with brighter cortical edges."""
    d = np.abs(v - centre) / half
    body = _soft(1.0 - d, edge)
    cortex = np.exp(-(((d - 0.85) / 0.15) ** 2))
    return body * (0.65 + 0.35 * cortex)


def _vessel_tree(rng: np.random.Generator, coords: np.ndarray, shift: float) -> np.ndarray:
    """Branching vessels from both hila, as a field in [0, 1] on the coarse grid."""
    n = coords.size
    px = float(coords[1] - coords[0])
    field = np.zeros((n, n), dtype=np.float64)
    segments: list[tuple[float, float, float, float, float]] = []

    def branch(x: float, y: float, ang: float, length: float, width: float, depth: int) -> None:
        x1, y1 = x + length * math.cos(ang), y + length * math.sin(ang)
        segments.append((x, y, x1, y1, width))
        if depth < 5:
            for turn in (-1.0, 1.0):
                branch(
                    x1,
                    y1,
                    ang + turn * rng.uniform(0.2, 0.55) + rng.normal(0.0, 0.1),
                    length * rng.uniform(0.65, 0.85),
                    width * 0.75,
                    depth + 1,
                )

    for side in (-1.0, 1.0):
        for ang in np.linspace(-1.25, 1.35, 7):
            a = float(ang + rng.normal(0.0, 0.12))
            a = a if side > 0 else math.pi - a
            branch(
                side * 0.17 + shift,
                -0.06 + rng.normal(0.0, 0.03),
                a,
                rng.uniform(0.1, 0.15),
                0.011,
                0,
            )
    for x0, y0, x1, y1, w in segments:
        reach = 2.5 * w
        c0, c1 = np.searchsorted(coords, [min(x0, x1) - reach, max(x0, x1) + reach])
        r0, r1 = np.searchsorted(coords, [min(y0, y1) - reach, max(y0, y1) + reach])
        if c0 >= c1 or r0 >= r1:
            continue
        gx, gy = coords[None, c0:c1], coords[r0:r1, None]
        dx, dy = x1 - x0, y1 - y0
        t = np.clip(((gx - x0) * dx + (gy - y0) * dy) / max(dx * dx + dy * dy, 1e-12), 0.0, 1.0)
        d2 = (gx - x0 - t * dx) ** 2 + (gy - y0 - t * dy) ** 2
        w_eff = max(w, 0.7 * px)
        np.maximum(field[r0:r1, c0:c1], np.exp(-d2 / (w_eff * w_eff)), out=field[r0:r1, c0:c1])
    return field


def chest_map(b: ChestBuild, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Presentation values and a noise-scale map, both ``n``×``n`` float64.

    The noise scale is relative (about 1 in the lungs): quantum noise is larger where
    fewer photons arrive (denser parts), and near zero behind the collimator.
    """
    px = 2.0 / n
    coords = -1.0 + px * (np.arange(n, dtype=np.float64) + 0.5)
    u = coords[None, :] - b.shift
    v = coords[:, None]
    au = np.abs(u)
    # Torso with shoulders and neck; projected thickness tapers at the edges.
    half_w = b.width * (0.93 + 0.07 * np.clip(v + 0.2, 0.0, 1.0))
    shoulder = -0.84 + 0.3 * (u / b.width) ** 2
    neck = _soft(0.2 - au, 0.02)
    inside = _soft(half_w - au, 0.015) * np.maximum(_soft(v - shoulder, 0.02), neck)
    thick = np.sqrt(np.clip(1.0 - (u / (half_w + 0.05)) ** 2, 0.0, 1.0))
    val = DIRECT + inside * (1200.0 + 1100.0 * thick)
    # Lungs: superellipses cut below by the diaphragm domes.
    lungs = np.zeros_like(val + u)
    for side, cx, ax in ((-1.0, -0.43, 0.37), (1.0, 0.42, 0.34)):
        cu = (u - cx * b.width / 0.86) / (ax * b.width / 0.86)
        top = b.lung_top
        cv = (v - (top + 0.62)) / 0.64
        shape = _soft(1.0 - (np.abs(cu) ** 2.4 + np.abs(cv) ** 2.2), 0.06)
        dome_v = b.dome + (0.05 if side < 0 else 0.08) - 0.12 * np.cos(np.clip(cu, -1, 1) * 1.4)
        lungs += shape * _soft(dome_v - v, 0.012)
    lungs = np.clip(lungs, 0.0, 1.0)
    # Mediastinum, heart, aortic knob and spine; the heart hides most lung behind it.
    med = _soft(0.1 - au, 0.025) * _soft(v + 0.75, 0.03)
    hx, hy = (u - 0.09) / (0.33 * b.heart), (v - 0.31) / 0.24
    heart = _soft(1.0 - np.hypot(hx, hy), 0.04)
    knob = _soft(1.0 - np.hypot((u - 0.1) / 0.08, (v + 0.27) / 0.07), 0.1)
    depth = lungs * (0.55 + 0.45 * thick) * (1.0 - 0.6 * heart)
    val -= 1250.0 * depth
    below = _soft(v - (b.dome + 0.02 + 0.06 * au), 0.02) * inside  # under the diaphragm
    val += 950.0 * np.clip(np.maximum(med, heart) + 0.6 * knob, 0.0, 1.2) * (1.0 - below)
    val += 1000.0 * below
    spine = _soft(0.055 - au, 0.008) * inside
    plates = 0.85 + 0.15 * np.cos((v + b.rib_phase) * 2.0 * math.pi / 0.085) ** 8
    val += 180.0 * spine * plates
    # Trachea: a darker column above the carina.
    val -= 300.0 * _soft(0.035 - au, 0.01) * _soft(-0.15 - v, 0.03) * _soft(v + 0.9, 0.03)
    # Ribs: posterior arcs from the spine, fainter anterior ones sloping down medially.
    bones = np.zeros_like(val)
    x = np.clip(au - 0.06, 0.0, None)
    reach = _soft(half_w - 0.04 - au, 0.02)
    for k in range(10):
        v0 = b.lung_top + 0.02 + k * 0.118 + b.rib_phase
        centre = v0 - 0.55 * x + 1.0 * x**2
        bones += (
            300.0 * _band(u, v, centre, 0.022 + 0.012 * x, 0.12) * reach * _soft(au - 0.05, 0.01)
        )
    for k in range(6):
        v1 = b.lung_top + 0.12 + k * 0.13
        centre = v1 + 0.38 * np.clip(0.85 - au, 0.0, None) ** 1.3
        bones += 150.0 * _band(u, v, centre, 0.02, 0.15) * _soft(au - 0.18, 0.03) * reach
    # Clavicles and the humeral heads.
    for side in (-1.0, 1.0):
        su = side * u
        cl = -0.7 - 0.18 * (su - 0.1) + 0.09 * np.sin((su - 0.1) * 5.0)
        bones += (
            380.0 * _band(u, v, cl, 0.03, 0.1) * _soft(su - 0.08, 0.02) * _soft(0.62 - su, 0.02)
        )
    val += bones * np.maximum(inside, 0.3)
    # Lung markings: branching vessels from the hila, and a faint parenchymal texture.
    val += lungs * (
        130.0 * _vessel_tree(rng, coords, b.shift) + 25.0 * smooth_noise(rng, (n, n), n / 60.0)
    )
    # Low-frequency variation: heel effect and scatter, and the exposure level.
    val += b.exposure + 90.0 * v + 55.0 * smooth_noise(rng, (n, n), n / 6.0)
    # The detector's response: linear, with a soft shoulder near the top of the range.
    knee = 2600.0
    val = np.where(val < knee, val, knee + 1300.0 * np.tanh((val - knee) / 1300.0))
    val = np.maximum(val, 40.0)
    # Collimation: outside the exposed rectangle the detector saw nothing.
    t, bo, le, ri = b.collimation
    lim = 0.004
    field = (
        _soft(v - (-1.0 + 2 * t), lim)
        * _soft((1.0 - 2 * bo) - v, lim)
        * _soft(coords[None, :] - (-1.0 + 2 * le), lim)
        * _soft((1.0 - 2 * ri) - coords[None, :], lim)
    )
    val = field * val + (1.0 - field) * COLLIMATED
    noise_scale = field * np.exp((val - 1200.0) / 2600.0) + (1.0 - field) * 0.15
    return val, noise_scale
