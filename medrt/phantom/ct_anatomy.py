"""The CT phantom's anatomy: a tissue map per axial slice of a lower-chest/abdomen scan.

Coordinates are millimetres in the axial plane: ``x`` grows towards the patient's
left (image right), ``y`` towards posterior (image down), as in DICOM's LPS with the
standard orientation ``[1,0,0, 0,1,0]``. ``s`` is the depth below the series' first
slice (caudal is positive). Organs are ellipses whose size and place change with
``s``: lung bases and the heart at the top, then liver, spleen and stomach, then
kidneys, bowel and psoas lower down. The map holds tissue ids; HU come from
:data:`TISSUE_HU` so lesions can be placed inside one homogeneous tissue.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["Tissue", "TISSUE_HU", "Anatomy", "AxialGrid", "make_anatomy"]


class Tissue:
    """Tissue ids in the label map (uint8)."""

    AIR, TABLE, FOAM, FAT, MUSCLE, LIVER, SPLEEN, KIDNEY, SINUS = range(9)
    AORTA, IVC, CORTEX, MARROW, LUNG, VESSEL, STOMACH, GAS, BOWEL = range(9, 18)
    HEART, CSF, GALL, DISC, CARTILAGE, WALL = range(18, 24)


TISSUE_HU: dict[int, float] = {
    Tissue.AIR: -1000.0,
    Tissue.TABLE: 250.0,
    Tissue.FOAM: -900.0,
    Tissue.FAT: -100.0,
    Tissue.MUSCLE: 48.0,
    Tissue.LIVER: 62.0,
    Tissue.SPLEEN: 50.0,
    Tissue.KIDNEY: 140.0,
    Tissue.SINUS: -60.0,
    Tissue.AORTA: 165.0,
    Tissue.IVC: 120.0,
    Tissue.CORTEX: 800.0,
    Tissue.MARROW: 240.0,
    Tissue.LUNG: -860.0,
    Tissue.VESSEL: 40.0,
    Tissue.STOMACH: 15.0,
    Tissue.GAS: -1000.0,
    Tissue.BOWEL: 20.0,
    Tissue.HEART: 42.0,
    Tissue.CSF: 12.0,
    Tissue.GALL: 8.0,
    Tissue.DISC: 85.0,
    Tissue.CARTILAGE: 130.0,
    Tissue.WALL: 45.0,
}


@dataclass(frozen=True, slots=True)
class AxialGrid:
    """Pixel-centre coordinates (mm) of the columns (x) and rows (y)."""

    x: np.ndarray
    y: np.ndarray


@dataclass(frozen=True, slots=True)
class Anatomy:
    """Per-series patient build, drawn once from the series' generator."""

    body_ax: float
    body_ay: float
    fat: float
    wall: float
    liver_end: float
    lung_end: float
    heart_end: float
    kidney_start: float
    disc_phase: float
    phase: float
    bowel: tuple[tuple[float, float, float, float, int], ...]
    vessels: tuple[tuple[float, float, float, float, float], ...]
    ribs: tuple[float, ...]


def make_anatomy(rng: np.random.Generator) -> Anatomy:
    """Draw one patient's build: habitus, organ extents, bowel loops, lung vessels, ribs."""
    hab = rng.uniform(0.86, 1.0)
    bowel = tuple(
        (
            rng.uniform(-0.6, 0.6),
            rng.uniform(-0.75, 0.1),
            rng.uniform(7, 14),
            rng.uniform(0, 2 * math.pi),
            int(rng.integers(0, 3)),
        )
        for _ in range(12)
    )
    vessels = tuple(
        (
            rng.choice([-1.0, 1.0]) * rng.uniform(0.25, 0.8),
            rng.uniform(-0.55, 0.7),
            rng.uniform(0.8, 2.6),
            rng.uniform(-0.004, 0.004),
            rng.uniform(-0.004, 0.004),
        )
        for _ in range(40)
    )
    ribs = tuple(rng.uniform(-0.08, 0.08) + a for a in np.linspace(0.35, 2.8, 7))
    return Anatomy(
        body_ax=160.0 * hab,
        body_ay=112.0 * hab,
        fat=rng.uniform(10, 26) * hab,
        wall=rng.uniform(9, 13),
        liver_end=rng.uniform(140, 170),
        lung_end=rng.uniform(45, 65),
        heart_end=rng.uniform(18, 30),
        kidney_start=rng.uniform(55, 80),
        disc_phase=rng.uniform(0, 32),
        phase=rng.uniform(0, 2 * math.pi),
        bowel=bowel,
        vessels=vessels,
        ribs=ribs,
    )


class _Painter:
    """Paints ellipses into a tissue map, touching only each ellipse's bounding box."""

    def __init__(self, grid: AxialGrid) -> None:
        self.grid = grid
        self.tissue = np.full((grid.y.size, grid.x.size), Tissue.AIR, dtype=np.uint8)

    def region(
        self, cx: float, cy: float, ax: float, ay: float, angle: float = 0.0
    ) -> tuple[tuple[slice, slice], np.ndarray] | None:
        if ax <= 0 or ay <= 0:
            return None
        reach = max(ax, ay)
        g = self.grid
        c0, c1 = np.searchsorted(g.x, [cx - reach, cx + reach])
        r0, r1 = np.searchsorted(g.y, [cy - reach, cy + reach])
        if c0 >= c1 or r0 >= r1:
            return None
        dx = g.x[None, c0:c1] - cx
        dy = g.y[r0:r1, None] - cy
        if angle:
            ca, sa = math.cos(angle), math.sin(angle)
            dx, dy = dx * ca + dy * sa, -dx * sa + dy * ca
        inside = (dx / ax) ** 2 + (dy / ay) ** 2 <= 1.0
        return (slice(r0, r1), slice(c0, c1)), inside

    def ellipse(
        self,
        tid: int,
        cx: float,
        cy: float,
        ax: float,
        ay: float,
        angle: float = 0.0,
        within: tuple[int, ...] | None = None,
    ) -> None:
        """Paint ``tid`` inside the ellipse; with ``within``, only over those tissues."""
        hit = self.region(cx, cy, ax, ay, angle)
        if hit is None:
            return
        sl, inside = hit
        view = self.tissue[sl]
        if within is not None:
            inside &= np.isin(view, within)
        view[inside] = tid

    def ring(
        self, tid: int, cx: float, cy: float, ax: float, ay: float, t: float, angle: float = 0.0
    ) -> None:
        """A shell of thickness ``t`` (a cortical rim) around an ellipse's inside."""
        hit = self.region(cx, cy, ax, ay, angle)
        inner = self.region(cx, cy, ax - t, ay - t, angle)
        if hit is None:
            return
        sl, inside = hit
        if inner is not None:
            isl, iin = inner
            sub = np.zeros_like(inside)
            sub[
                isl[0].start - sl[0].start : isl[0].stop - sl[0].start,
                isl[1].start - sl[1].start : isl[1].stop - sl[1].start,
            ] = iin
            inside &= ~sub
        self.tissue[sl][inside] = tid


def _profile(s: float, top: float, bottom: float) -> float:
    """An organ's size factor along z: 0 outside [top, bottom], a smooth dome inside."""
    if s <= top or s >= bottom:
        return 0.0
    t = (s - top) / (bottom - top)
    return math.sqrt(max(0.0, 1.0 - (2.0 * t - 1.0) ** 4))


def tissue_map(a: Anatomy, grid: AxialGrid, s: float) -> np.ndarray:
    """The tissue ids of the axial slice at depth ``s`` mm."""
    p = _Painter(grid)
    wobble = 1.0 + 0.04 * math.sin(2 * math.pi * s / 300.0 + a.phase)
    ax, ay = a.body_ax * wobble, a.body_ay * (1.0 + 0.02 * math.sin(s / 90.0 + a.phase))
    # Patient table under the back: a gently curved carbon top, foam core, carbon base.
    ty, k, w = ay + 4.0, 600.0, 700.0
    p.ellipse(Tissue.TABLE, 0.0, ty - k, w + 45.0, k + 45.0, within=(Tissue.AIR,))
    p.ellipse(Tissue.FOAM, 0.0, ty - k, w + 42.0, k + 42.0, within=(Tissue.TABLE,))
    p.ellipse(Tissue.TABLE, 0.0, ty - k, w + 3.0, k + 3.0, within=(Tissue.FOAM,))
    p.ellipse(Tissue.AIR, 0.0, ty - k, w, k)
    p.tissue[:, np.abs(grid.x) > 215.0] = Tissue.AIR
    p.ellipse(Tissue.FAT, 0.0, 0.0, ax, ay)
    mx, my = ax - a.fat, ay - a.fat
    p.ellipse(Tissue.MUSCLE, 0.0, 0.0, mx, my)
    cx_, cy_ = mx - a.wall, my - a.wall
    p.ellipse(Tissue.FAT, 0.0, -4.0, cx_, cy_ - 4.0)
    cav = (Tissue.FAT,)
    vb_y = my - 62.0  # vertebral body centre
    # Heart and pericardial fat at the top of the series.
    h = _profile(s, -60.0, a.heart_end)
    if h > 0:
        p.ellipse(Tissue.FAT, 12.0, -cy_ * 0.35, cx_ * 0.5 * h + 4, cy_ * 0.5 * h + 4, 0.3, cav)
        p.ellipse(Tissue.HEART, 12.0, -cy_ * 0.35, cx_ * 0.5 * h, cy_ * 0.5 * h, 0.3)
    # Liver: right lobe (image left) and, higher up, the left lobe across the midline.
    lv = _profile(s, -40.0, a.liver_end)
    p.ellipse(Tissue.LIVER, -cx_ * 0.32, -4.0, cx_ * 0.64 * lv, cy_ * 0.82 * lv, -0.2, cav)
    ll = _profile(s, -40.0, 75.0)
    p.ellipse(Tissue.LIVER, cx_ * 0.05, -cy_ * 0.45, cx_ * 0.42 * ll, cy_ * 0.3 * ll, 0.15, cav)
    for k, (vx, vy, vr, _, _) in enumerate(a.vessels[:6]):
        p.ellipse(
            Tissue.VESSEL,
            -cx_ * (0.15 + 0.5 * abs(vx)),
            cy_ * 0.6 * vy,
            2.0 + vr * (1 + 0.3 * math.sin(s / 20 + k)),
            2.0 + vr,
            0.0,
            (Tissue.LIVER,),
        )
    g = _profile(s, 45.0, 110.0)
    p.ellipse(Tissue.GALL, -cx_ * 0.22, -cy_ * 0.42, 13 * g, 17 * g, 0.4, (Tissue.LIVER,))
    # Spleen (image right, posterior) and stomach with an air-fluid level.
    sp = _profile(s, -10.0, 115.0)
    p.ellipse(Tissue.SPLEEN, cx_ * 0.66, cy_ * 0.22, cx_ * 0.2 * sp, cy_ * 0.46 * sp, 0.6, cav)
    st = _profile(s, -20.0, 95.0)
    scx, scy, sax, say = cx_ * 0.3, -cy_ * 0.3, cx_ * 0.27 * st, cy_ * 0.3 * st
    p.ellipse(Tissue.WALL, scx, scy, sax + 3.0, say + 3.0, 0.0, cav)
    p.ellipse(Tissue.STOMACH, scx, scy, sax, say)
    p.ellipse(Tissue.GAS, scx, scy - say, sax * 0.8, say * 0.45, 0.0, (Tissue.STOMACH,))
    # Kidneys (the right one a little lower) with renal sinus fat at the hilum.
    for side, shift in ((-1.0, 12.0), (1.0, 0.0)):
        k = _profile(s, a.kidney_start + shift, a.kidney_start + shift + 115.0)
        if k > 0:
            kx, ky = side * 68.0, vb_y + 4.0
            p.ellipse(Tissue.KIDNEY, kx, ky, 24.0 * k, 34.0 * k, -side * 0.6, cav)
            p.ellipse(
                Tissue.SINUS,
                kx - side * 12.0 * k,
                ky - 4.0,
                9.0 * k,
                13.0 * k,
                -side * 0.6,
                (Tissue.KIDNEY,),
            )
    # Bowel loops in the lower abdomen: fluid, gas or mixed, with a wall.
    for bx, by, br, bph, content in a.bowel:
        b = _profile(s, 70.0 + 30 * abs(bx), 600.0)
        if b <= 0:
            continue
        r = br * (0.75 + 0.25 * math.sin(s / 12.0 + bph)) * min(1.0, b * 1.5)
        x, y = bx * cx_, by * cy_
        p.ellipse(Tissue.WALL, x, y, r + 2.0, r + 2.0, 0.0, cav)
        p.ellipse(Tissue.BOWEL if content != 1 else Tissue.GAS, x, y, r, r)
        if content == 2:
            p.ellipse(Tissue.GAS, x, y - r, r * 0.9, r * 0.5, 0.0, (Tissue.BOWEL,))
    # Lung bases, posterior and lateral, above the diaphragm; with vessels.
    lu = _profile(s, -200.0, a.lung_end) ** 0.7
    if lu > 0:
        for side in (-1.0, 1.0):
            grow = 1.0 + 0.6 * max(0.0, 1.0 - s / 25.0)
            p.ellipse(
                Tissue.LUNG,
                side * cx_ * 0.55,
                vb_y - 10.0 - 20 * (grow - 1),
                cx_ * 0.42 * lu * grow,
                cy_ * 0.5 * lu * grow,
                side * 0.3,
                (Tissue.FAT, Tissue.LIVER, Tissue.SPLEEN, Tissue.STOMACH, Tissue.WALL, Tissue.GAS),
            )
        for vx, vy, vr, dx, dy in a.vessels:
            p.ellipse(
                Tissue.VESSEL, (vx + dx * s) * cx_, (vy + dy * s) * cy_, vr, vr, 0.0, (Tissue.LUNG,)
            )
    # Great vessels in front of the spine.
    p.ellipse(Tissue.AORTA, 14.0, vb_y - 31.0, 12.0, 12.0)
    p.ellipse(Tissue.IVC, -24.0, vb_y - 30.0 - 10 * lv, 13.0, 9.0)
    # Psoas muscles appear lower down, beside the spine.
    ps = max(0.0, (s - 95.0) / 80.0)
    if ps > 0:
        for side in (-1.0, 1.0):
            p.ellipse(
                Tissue.MUSCLE, side * 32.0, vb_y + 2.0, 8 + 10 * min(ps, 1), 10 + 8 * min(ps, 1)
            )
    # Paraspinal muscles and the vertebra: body (or disc), canal, arch, processes.
    for side in (-1.0, 1.0):
        p.ellipse(Tissue.MUSCLE, side * 33.0, my - 22.0, 27.0, 21.0)
    disc = (s + a.disc_phase) % 32.0 < 6.0
    if disc:
        p.ellipse(Tissue.DISC, 0.0, vb_y, 21.0, 17.0)
    else:
        p.ellipse(Tissue.MARROW, 0.0, vb_y, 21.0, 17.0)
        p.ring(Tissue.CORTEX, 0.0, vb_y, 21.0, 17.0, 2.2)
    p.ellipse(Tissue.CORTEX, 0.0, vb_y + 27.0, 14.0, 12.0)
    p.ellipse(Tissue.CSF, 0.0, vb_y + 26.0, 8.5, 7.5)
    for side in (-1.0, 1.0):
        p.ellipse(Tissue.CORTEX, side * 24.0, vb_y + 24.0, 15.0, 4.5, side * 0.25)
    p.ellipse(Tissue.CORTEX, 0.0, vb_y + 48.0, 4.5, 13.0)
    # Ribs in the body wall, drifting with z; costal cartilage anteriorly.
    if s < 140.0:
        for k, ang in enumerate(a.ribs):
            for side in (-1.0, 1.0):
                th = ang + 0.004 * s + 0.05 * k
                x = side * (mx - a.wall * 0.5) * math.sin(th)
                y = -(my - a.wall * 0.5) * math.cos(th)
                rot = math.atan2(y, x) + math.pi / 2
                if th < 0.6:
                    p.ellipse(Tissue.CARTILAGE, x, y, 7.0, 4.5, rot)
                else:
                    p.ellipse(Tissue.MARROW, x, y, 7.0, 4.5, rot)
                    p.ring(Tissue.CORTEX, x, y, 7.0, 4.5, 1.6, rot)
    return p.tissue
