"""Training data from medrt.phantom: cached arrays, then augmented batches.

Train and held-out data come from disjoint seed ranges (train from 1000, held-out
from 9000; the committed samples use single-digit seeds). Everything is made by
the project's own deterministic generator, so a cache can always be rebuilt.

Two products are cached per seed set:
- ``roi``: thumbnails (raw modality values, area-averaged exactly as
  ``medrt.preprocess.thumbnail`` does at run time), their window, a per-cell
  lesion target at the classifier's heatmap stride, and frame-level presence;
- ``seg``: patches at the UNets' pixel spacing ``SEG_SPACING`` (raw values +
  window + lesion fraction per pixel), centred on lesions or drawn at random.
  Frames much finer than that (radiographs, ~0.125 mm) are area-averaged to it
  by ``medrt.analysis.resample``, the function inference uses; CT slices
  (0.6-0.8 mm) stay at source resolution, as at run time.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from medrt.analysis.resample import area_downsample, resample_factors
from medrt.phantom import generate_ct_series, generate_radiograph
from medrt.preprocess import normalize, thumbnail

log = logging.getLogger(__name__)

TRAIN_SEED = 1000
HELDOUT_SEED = 9000
# The ROI classifiers: the general one, and one trained on radiographs only (--data dx).
ROI_MODELS = ("roi_classifier", "roi_classifier_dx")
THUMB = 1024  # longest thumbnail side: 4096² radiographs at ~0.5 mm, 512² CT slices as they are
STRIDE = 8  # heatmap cell, in thumbnail pixels
PATCH = 384  # cached patch side (at SEG_SPACING); training crops 256 from it
SEG_SPACING = 0.5  # mm: the UNets' pixel spacing ([model] spacing_mm in their specs)
CACHE_VERSION = 2  # bump when what the cache holds changes
_DX_SCALE = 8.0  # radiograph averages are stored as int16 in 1/8 units (exact enough, half the size)


@dataclass
class RoiData:
    thumbs: list[np.ndarray]  # float32 raw values
    windows: np.ndarray  # (n, 2) center, width
    targets: list[np.ndarray]  # uint8 heatmap targets
    presence: np.ndarray  # (n,) 0/1
    is_ct: np.ndarray  # (n,) bool
    # (n, 2) int: the rows of the previous and next slice of each CT thumbnail's series
    # (the row itself at a series' ends, and for radiographs); None: not known
    neighbours: np.ndarray | None = None

    def subset(self, keep: np.ndarray) -> RoiData:
        idx = np.flatnonzero(keep)
        nb = None
        if self.neighbours is not None:  # renumbered; a neighbour left out becomes the row itself
            new = np.full(len(self.thumbs), -1)
            new[idx] = np.arange(len(idx))
            nb = new[self.neighbours[idx]]
            nb = np.where(nb < 0, np.arange(len(idx))[:, None], nb)
        return RoiData([self.thumbs[i] for i in idx], self.windows[idx], [self.targets[i] for i in idx],
                       self.presence[idx], self.is_ct[idx], nb)

    @property
    def lung_rows(self) -> np.ndarray:
        """Indices of the CT thumbnails with room for a lung nodule (:func:`lung_room`)."""
        if getattr(self, "_lung", None) is None or self._lung_n != len(self.is_ct):
            self._lung_n = len(self.is_ct)  # the rows it was computed for
            self._lung = np.array([i for i in np.flatnonzero(self.is_ct) if lung_room(self.thumbs[i]).any()], int)
        return self._lung

    def slices(self, i: int) -> np.ndarray:
        """(3, rows, cols) float32 raw values: the previous, this and the next slice's
        thumbnail (the thumbnail itself where there is none)."""
        prev, nxt = (int(j) for j in self.neighbours[i]) if self.neighbours is not None else (i, i)
        return np.stack([self.thumbs[prev], self.thumbs[i], self.thumbs[nxt]])


@dataclass
class SegData:
    patches: np.ndarray  # (n, PATCH, PATCH) float32 raw values at SEG_SPACING (or coarser)
    windows: np.ndarray  # (n, 2)
    masks: np.ndarray  # (n, PATCH, PATCH) uint8: lesion fraction of the pixel x 255
    is_ct: np.ndarray  # (n,) bool
    # (n_ct, 2, PATCH, PATCH) int16: the previous and next slice of each CT patch, in the
    # order of the CT rows (build_neighbours); None when not loaded
    neighbours: np.ndarray | None = None

    def subset(self, keep: np.ndarray) -> SegData:
        nb = None
        if self.neighbours is not None:
            nb = self.neighbours[keep[self.is_ct]]
        return SegData(self.patches[keep], self.windows[keep], self.masks[keep], self.is_ct[keep], nb)

    def slices(self, i: int) -> np.ndarray:
        """(3, PATCH, PATCH) float32: previous, this and next slice of patch ``i`` (a
        radiograph patch, or any patch without neighbours, stands in for its own)."""
        out = np.empty((3, *self.patches.shape[1:]), np.float32)
        out[1] = self.patches[i]
        if self.neighbours is not None and self.is_ct[i]:
            if getattr(self, "_ct_row", None) is None or len(self._ct_row) != len(self.is_ct):
                self._ct_row = np.cumsum(self.is_ct) - 1
            out[0], out[2] = self.neighbours[int(self._ct_row[i])]
        else:
            out[0] = out[2] = self.patches[i]
        return out

    @property
    def lung_rows(self) -> np.ndarray:
        """Indices of the CT patches with room for a lung nodule (:func:`lung_room`)."""
        if getattr(self, "_lung", None) is None or self._lung_n != len(self.is_ct):
            self._lung_n = len(self.is_ct)  # the rows it was computed for
            rooms = {int(i): lung_room(self.patches[i]) for i in np.flatnonzero(self.is_ct)}
            self._lung_room = {i: room.astype(np.uint8) * 255 for i, room in rooms.items() if room.any()}
            self._lung = np.array(sorted(self._lung_room), int)
        return self._lung

    def lung_room(self, i: int) -> np.ndarray:
        """(PATCH, PATCH) uint8, 255 where patch ``i`` (one of :attr:`lung_rows`) has room."""
        return self._lung_room[i] if len(self.lung_rows) else np.zeros(self.patches.shape[1:], np.uint8)

    @property
    def has_lesion(self) -> np.ndarray:
        """(n,) bool: the patch holds a pixel that is mostly lesion."""
        if getattr(self, "_has", None) is None or len(self._has) != len(self.masks):
            self._has = self.masks.reshape(len(self.masks), -1).max(axis=1) > 127
        return self._has


def heatmap_target(labels: np.ndarray, factor: int, stride: int) -> np.ndarray:
    """1 where a heatmap cell (``factor*stride`` source pixels square) holds lesion pixels."""
    cell = factor * stride
    rows, cols = labels.shape
    tr, tc = math.ceil(rows / cell), math.ceil(cols / cell)
    padded = np.zeros((tr * cell, tc * cell), dtype=bool)
    padded[:rows, :cols] = labels > 0
    return padded.reshape(tr, cell, tc, cell).any(axis=(1, 3)).astype(np.uint8)


def _patches_from(
    pixels: np.ndarray,
    labels: np.ndarray,
    window: tuple[float, float],
    rng: np.random.Generator,
    n_random: int,
    factors: tuple[int, int] = (1, 1),
    neighbours: tuple[np.ndarray, np.ndarray] | None = None,
) -> list[tuple]:
    """PATCH² patches at ``factors`` coarser than the source: source regions of
    ``PATCH·factor`` pixels, area-averaged (the mask to a lesion fraction x 255).
    With ``neighbours`` (the previous and next slice of a series), each patch also
    carries their patches at the same place, as a (2, PATCH, PATCH) array."""
    rows, cols = pixels.shape
    side_r, side_c = PATCH * factors[0], PATCH * factors[1]
    centres: list[tuple[int, int]] = []
    ids = np.unique(labels)
    for lab in ids[ids > 0]:
        rr, cc = np.nonzero(labels == lab)
        i = rng.integers(len(rr))
        jitter = rng.integers(-PATCH // 4, PATCH // 4 + 1, size=2) * np.array(factors)
        centres.append((int(rr[i] + jitter[0]), int(cc[i] + jitter[1])))
    for _ in range(n_random):
        centres.append((int(rng.integers(0, rows)), int(rng.integers(0, cols))))
    def cut(a: np.ndarray, r0: int, c0: int) -> np.ndarray:
        """The region, area-averaged; outside the frame: as outside the body."""
        q = np.full((side_r, side_c), a.min(), np.float32)
        sub = a[r0 : r0 + side_r, c0 : c0 + side_c]
        q[: sub.shape[0], : sub.shape[1]] = sub
        return area_downsample(q, factors)

    out = []
    for r, c in centres:
        r0 = int(np.clip(r - side_r // 2, 0, max(rows - side_r, 0)))
        c0 = int(np.clip(c - side_c // 2, 0, max(cols - side_c, 0)))
        m = np.zeros((side_r, side_c), np.float32)
        m_sub = labels[r0 : r0 + side_r, c0 : c0 + side_c] > 0
        m[: m_sub.shape[0], : m_sub.shape[1]] = m_sub
        frac = np.rint(area_downsample(m, factors) * 255.0).astype(np.uint8)
        item: tuple = (cut(pixels, r0, c0), frac, window)
        if neighbours is not None:
            item += (np.stack([cut(nb, r0, c0) for nb in neighbours]),)
        out.append(item)
    return out


def _dx_item(args: tuple[int, int, int]) -> tuple[tuple, list]:
    seed, index, size = args
    frame = generate_radiograph(seed, size=size, index=index)
    thumb, factor = thumbnail(frame.pixels, THUMB)
    roi = (thumb, frame.window, heatmap_target(frame.labels, factor, STRIDE), int(len(frame.lesions) > 0))
    rng = np.random.default_rng([seed, index, 7])
    factors = resample_factors(frame.spacing_mm, SEG_SPACING)
    patches = _patches_from(frame.pixels, frame.labels, frame.window, rng, n_random=3, factors=factors)
    return roi, patches


def _ct_item(args: tuple) -> tuple[list, list]:
    """One CT series' thumbnails and patches; ``args`` = (seed, n_frames[, neighbours]):
    with ``neighbours`` each patch also carries the previous and next slice's patch at the
    same place (the series' first and last slice stand in for their missing neighbour)."""
    seed, n_frames, *rest = args
    with_nb = bool(rest and rest[0])
    rois, patches = [], []
    rng = np.random.default_rng([seed, 11])
    series = generate_ct_series(seed, n_frames=n_frames)
    for i, frame in enumerate(series):
        thumb, factor = thumbnail(frame.pixels, THUMB)
        present = int(any(not t.extras.get("ignore") for t in frame.lesions))
        rois.append((thumb, frame.window, heatmap_target(frame.labels, factor, STRIDE), present))
        has = bool(frame.labels.any())
        if has or rng.random() < 0.15:
            factors = resample_factors(frame.spacing_mm, SEG_SPACING)  # (1, 1) for CT slices
            nbs = None
            if with_nb:
                nbs = (series[max(i - 1, 0)].pixels, series[min(i + 1, len(series) - 1)].pixels)
            patches += _patches_from(frame.pixels, frame.labels, frame.window, rng, n_random=1, factors=factors,
                                     neighbours=nbs)
    return rois, patches


def cache_path(cache: Path, *, base_seed: int, n_dx: int, n_ct_series: int, ct_frames: int = 40,
               size: int = 4096) -> Path:
    """The cache file for these settings; its name changes with whatever the cache holds."""
    return cache / (f"phantom_v{CACHE_VERSION}_{base_seed}_{n_dx}_{n_ct_series}_{ct_frames}_{size}"
                    f"_t{THUMB}_s{SEG_SPACING:g}.npz")


def neighbour_path(cache: Path, *, base_seed: int, n_ct_series: int, ct_frames: int = 40) -> Path:
    """The CT neighbour-slice cache that goes with :func:`cache_path`'s CT patches."""
    return cache / f"phantom_v{CACHE_VERSION}_nb_{base_seed}_{n_ct_series}_{ct_frames}_s{SEG_SPACING:g}.npz"


def _save_atomically(path: Path, **arrays: np.ndarray) -> None:
    """``np.savez`` to a file beside ``path``, then renamed onto it: the README trains two
    networks side by side from one cache, and the second must never load a half-written
    file the first is still writing (nor two writers interleave in one)."""
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npz")
    try:
        np.savez(tmp, **arrays)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def build_neighbours(cache: Path, seg: SegData, *, base_seed: int, n_ct_series: int, ct_frames: int = 40,
                     workers: int = 2) -> SegData:
    """``seg`` with each CT patch's previous- and next-slice patches (for 2.5-D UNets),
    generated once into their own cache file beside the main one (the main cache, and
    the models trained from it, stay as they are). The CT series are drawn again with
    the same seeds, so the patches come out at the same places; the centre slices are
    checked against the cached patches."""
    path = neighbour_path(cache, base_seed=base_seed, n_ct_series=n_ct_series, ct_frames=ct_frames)
    if not path.is_file():
        centres, nbs = [], []
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for _, p in pool.map(_ct_item, [(base_seed + 100 + s, ct_frames, True) for s in range(n_ct_series)]):
                centres += [q[0] for q in p]
                nbs += [q[3] for q in p]
        ct_rows = seg.patches[seg.is_ct]
        if len(centres) != len(ct_rows) or not all(np.array_equal(a, b) for a, b in zip(centres, ct_rows, strict=True)):
            raise RuntimeError(f"{path.name}: the regenerated CT patches differ from the cached ones; rebuild both")
        _save_atomically(path, neighbours=np.stack(nbs).astype(np.int16))
        log.info("cached the neighbours of %d CT patches in %s", len(nbs), path)
    with np.load(path) as z:
        nb = z["neighbours"]
    if len(nb) != int(seg.is_ct.sum()):
        raise RuntimeError(f"{path.name}: {len(nb)} neighbour patches for {int(seg.is_ct.sum())} CT patches")
    seg.neighbours = nb
    return seg


def build(
    cache: Path, *, base_seed: int, n_dx: int, n_ct_series: int, ct_frames: int = 40, size: int = 4096,
    workers: int = 2, parts: tuple[str, ...] = ("roi", "seg"),
) -> tuple[RoiData | None, SegData | None]:
    """Generate (or load from ``cache``) the ROI and segmentation training arrays;
    only the ``parts`` asked for are read back (None for the others)."""
    path = cache_path(cache, base_seed=base_seed, n_dx=n_dx, n_ct_series=n_ct_series, ct_frames=ct_frames, size=size)
    if path.is_file():
        return _load(path, parts, ct_frames)
    cache.mkdir(parents=True, exist_ok=True)
    dx_rois: list[tuple] = []
    ct_rois: list[tuple] = []
    dx_patches: list[tuple] = []
    ct_patches: list[tuple] = []
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for roi, p in pool.map(_dx_item, [(base_seed, i, size) for i in range(n_dx)]):
            dx_rois.append(roi)
            dx_patches += p
        for r, p in pool.map(_ct_item, [(base_seed + 100 + s, ct_frames) for s in range(n_ct_series)]):
            ct_rois += r
            ct_patches += p
    patches = dx_patches + ct_patches
    rois = dx_rois + ct_rois

    def scaled(items: list[np.ndarray]) -> np.ndarray:  # averages of integers, to 1/8
        return np.rint(np.stack(items) * _DX_SCALE).astype(np.int16)

    arrays = {
        "windows": np.array([r[1] for r in rois], np.float32),
        "presence": np.array([r[3] for r in rois], np.uint8),
        "pwindows": np.array([p[2] for p in patches], np.float32),
        "masks": np.stack([p[1] for p in patches]).astype(np.uint8),
        "is_ct": np.array([False] * len(dx_patches) + [True] * len(ct_patches), dtype=bool),
    }
    # Phantom CT values are integer HU; radiograph averages are kept to 1/8 of a unit.
    for key, items, conv in (("dx_thumbs", [r[0] for r in dx_rois], scaled),
                             ("ct_thumbs", [r[0] for r in ct_rois], lambda v: np.stack(v).astype(np.int16)),
                             ("dx_targets", [r[2] for r in dx_rois], lambda v: np.stack(v).astype(np.uint8)),
                             ("ct_targets", [r[2] for r in ct_rois], lambda v: np.stack(v).astype(np.uint8)),
                             ("dx_patches", [p[0] for p in dx_patches], scaled),
                             ("ct_patches", [p[0] for p in ct_patches], lambda v: np.stack(v).astype(np.int16))):
        if items:
            arrays[key] = conv(items)
    _save_atomically(path, **arrays)
    log.info("cached %d thumbnails and %d patches in %s", len(rois), len(patches), path)
    return _load(path, parts, ct_frames)


def _load(path: Path, parts: tuple[str, ...] = ("roi", "seg"),
          ct_frames: int = 40) -> tuple[RoiData | None, SegData | None]:
    """Read each array once (an npz re-reads a member on every key access). The CT
    thumbnails are whole series of ``ct_frames`` slices in order, head to feet, which
    gives each its neighbours (``RoiData.neighbours``)."""
    with np.load(path) as z:
        names = set(z.files)
        roi = seg = None
        if "roi" in parts:
            thumbs: list[np.ndarray] = []
            targets: list[np.ndarray] = []
            n_dx = 0
            if "dx_thumbs" in names:
                thumbs += list(z["dx_thumbs"].astype(np.float32) / np.float32(_DX_SCALE))
                targets += list(z["dx_targets"])
                n_dx = len(thumbs)
            if "ct_thumbs" in names:
                thumbs += list(z["ct_thumbs"].astype(np.float32))
                targets += list(z["ct_targets"])
            is_ct = np.arange(len(thumbs)) >= n_dx
            rows = np.arange(len(thumbs))
            pos = (rows - n_dx) % ct_frames  # slice index within its series (CT rows)
            prev = np.where(is_ct & (pos > 0), rows - 1, rows)
            nxt = np.where(is_ct & (pos < ct_frames - 1) & (rows + 1 < len(thumbs)), rows + 1, rows)
            roi = RoiData(thumbs, z["windows"], targets, z["presence"], is_ct, np.stack([prev, nxt], axis=1))
        if "seg" in parts:
            stacks = []
            if "dx_patches" in names:
                stacks.append(z["dx_patches"].astype(np.float32) / np.float32(_DX_SCALE))
            if "ct_patches" in names:
                stacks.append(z["ct_patches"].astype(np.float32))
            seg = SegData(np.concatenate(stacks), z["pwindows"], z["masks"], z["is_ct"])
    return roi, seg


JITTER_NOTE = "CT ±12 % centre, ×0.78–1.28 width; radiographs ±4 %, ×1.0–1.3"  # for the model cards


def jitter_window(rng: np.random.Generator, window: np.ndarray | tuple[float, float], is_ct: bool = True,
                  fixed: bool = False) -> tuple[float, float]:
    """Window shifts as a reader or a different scanner preset would give.

    CT: ±12 % of the width on the centre, ×0.78-1.28 on the width. Radiographs:
    ±4 % and ×1.0-1.3 only. Their window spans the whole exposed field, and nodules
    sit anywhere in it, down in the dark direct exposure and up by the collimator
    edge: the CT jitter clipped those to flat black or white, asking the UNet to
    find a nodule where the pixels hold none (invented lesions, learnt on purpose).

    ``fixed``: a model's own fixed window (``--window``), which no reader moves; ±2 %
    and ×0.9-1.1 stand for scanner calibration and kernel differences only."""
    c, w = float(window[0]), float(window[1])
    if fixed:
        return c + rng.uniform(-0.02, 0.02) * w, w * float(np.exp(rng.uniform(-0.1, 0.1)))
    if not is_ct:
        return c + rng.uniform(-0.04, 0.04) * w, w * float(rng.uniform(1.0, 1.3))
    return c + rng.uniform(-0.12, 0.12) * w, w * float(np.exp(rng.uniform(-0.25, 0.25)))


def _window_for(rng: np.random.Generator, data: RoiData | SegData, i: int,
                window: tuple[float, float] | None) -> tuple[float, float, float]:
    """Item ``i``'s jittered (center, width), and the factor that keeps extra CT noise
    the same in HU (1 for the VOI window the noise range was set on)."""
    ct = bool(data.is_ct[i])
    if window is None or not ct:
        return (*jitter_window(rng, data.windows[i], ct), 1.0)
    center, width = jitter_window(rng, window, ct, fixed=True)
    return center, width, float(data.windows[i][1]) / width


def augment_pair(rng: np.random.Generator, img: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flips and 90° turns, applied to image and mask alike (over their last two axes:
    ``img`` may be a stack of slices)."""
    k = int(rng.integers(4))
    img, mask = np.rot90(img, k, axes=(-2, -1)), np.rot90(mask, k, axes=(-2, -1))
    if rng.random() < 0.5:
        img, mask = img[..., ::-1], mask[..., ::-1]
    return np.ascontiguousarray(img), np.ascontiguousarray(mask)


def _crop_start(rng: np.random.Generator, mask: np.ndarray, size: int) -> tuple[int, int]:
    """Top-left of a ``size``² window of ``mask`` (PATCH²); when ``mask`` holds lesion,
    the window holds a random lesion pixel at least size/8 from its edges."""
    hi = PATCH - size
    pts = np.argwhere(mask > 127)
    if not len(pts):
        r0, c0 = rng.integers(0, hi + 1, size=2)
        return int(r0), int(c0)
    r, c = pts[rng.integers(len(pts))]
    m = size // 8
    out = []
    for v in (r, c):
        lo_v, hi_v = max(0, v - size + m), min(hi, v - m)
        out.append(int(rng.integers(lo_v, hi_v + 1)) if hi_v >= lo_v else int(np.clip(v - size // 2, 0, hi)))
    return out[0], out[1]


# Small-lesion insertion (CT crops): the phantom's organ parenchyma, its lesion contrasts and
# sizes, at the mean CT pixel spacing (0.68-0.78 mm: sizes within ±7 %).
_INSERT_SPACING_MM = 0.73
INSERT_SMALL_MM = (2.0, 6.0)  # the inserted small lesions' diameters unless train.py --insert-small-mm says
_PARENCHYMA_HU = ((35.0, 75.0), (120.0, 160.0))  # muscle, spleen, liver; kidney
_INSERT_NEGATIVE_P = 0.65  # hypodense, as most of the phantom's soft-tissue lesions


def _parenchyma_at(rng: np.random.Generator, img: np.ndarray, mask: np.ndarray, reach: int) -> tuple[int, int] | None:
    """A random pixel of the raw-HU ``img`` whose box of ``reach`` pixels each side is
    homogeneous soft-tissue parenchyma (:data:`_PARENCHYMA_HU`, spread <= 25 HU) with no
    lesion in ``mask``; None when the drawn pixel's box is not."""
    rows, cols = img.shape
    r, c = int(rng.integers(reach, rows - reach)), int(rng.integers(reach, cols - reach))
    box = (slice(r - reach, r + reach + 1), slice(c - reach, c + reach + 1))
    level, spread = float(img[box].mean()), float(img[box].std())
    if spread > 25.0 or mask[box].any() or not any(lo <= level <= hi for lo, hi in _PARENCHYMA_HU):
        return None
    return r, c


def insert_small_lesions(rng: np.random.Generator, img: np.ndarray, mask: np.ndarray, count: int,
                         spacing_mm: float = _INSERT_SPACING_MM,
                         sizes_mm: tuple[float, float] = INSERT_SMALL_MM) -> tuple[np.ndarray, np.ndarray]:
    """Up to ``count`` small lesions (``sizes_mm``, log-uniform: 2-6 mm) drawn into homogeneous
    soft tissue of a raw-HU CT region, with their masks (255 inside). Returns new arrays; the
    inputs are untouched.

    Why: a small soft-tissue lesion shows on one slice, so the 24 training series hold some
    sixty of them against thousands of slices of large ones, and both UNets learnt them not
    at all (held-out 3-5 mm lesions at 50-90 HU, a known-location detectability d' of 6-13,
    got p < 0.1). Drawn like the phantom draws them (:mod:`medrt.phantom.ct`): round or
    lobulated outlines with a one-pixel edge, faint (1.5-3x the noise) or clear (4-9x),
    mostly hypodense. Not in the lungs: there a small nodule and a vessel's cross-section
    look the same on one slice (telling them apart takes the neighbouring slices), and
    inserted nodules would teach the network that vessels are lesions.
    """
    from medrt.phantom.shapes import Blob, log_uniform, random_harmonics, render_blob

    img, mask = img.astype(np.float32, copy=True), mask.copy()
    rows, cols = img.shape
    placed = 0
    for _ in range(12 * count):
        if placed >= count:
            break
        d_px = log_uniform(rng, *sizes_mm) / spacing_mm
        reach = int(d_px / 2 + 4)
        if min(rows, cols) <= 2 * reach + 1:
            break
        spot = _parenchyma_at(rng, img, mask, reach)
        if spot is None:
            continue
        r, c = spot
        irregular = bool(rng.random() < 0.5)
        harm = random_harmonics(rng, irregular)
        a = d_px / 2.0 / (1.0 + sum(abs(h[1]) for h in harm))
        blob = Blob(center=(r + float(rng.uniform(-0.5, 0.5)), c + float(rng.uniform(-0.5, 0.5))),
                    radii=(a, a * float(rng.uniform(0.75, 1.0))), angle=float(rng.uniform(0.0, math.pi)),
                    harmonics=harm, edge_px=1.0)
        hit = render_blob(blob, img.shape)
        if hit is None or not hit[2].any():
            continue
        sl, weight, inside = hit
        sigma = float(rng.uniform(10.0, 14.0))
        lo, hi = (1.5, 3.0) if rng.random() < 0.45 else (4.0, 9.0)
        sign = -1.0 if rng.random() < _INSERT_NEGATIVE_P else 1.0
        img[sl] += np.float32(sign * rng.uniform(lo, hi) * sigma) * weight.astype(np.float32)
        mask[sl][inside] = 255
        placed += 1
    return img, mask


# Lung-nodule insertion (CT crops, ``insert_lung``): as :mod:`medrt.phantom.ct` draws them,
# 600-820 HU above the lung, whole irregular ellipsoids across the slices before and after.
_LUNG_HU = (-960.0, -700.0)  # lung parenchyma with its texture and noise; vessels are 40 HU
_LUNG_MEAN_MIN = -885.0  # lung averages -860 HU, the table's foam pad -900
_LUNG_MM = (3.0, 20.0)
_LUNG_CONTRAST = (600.0, 820.0)


def lung_room(img: np.ndarray, box: int = 15) -> np.ndarray:
    """Bool map of pixels of a raw-HU slice whose ``box``² neighbourhood is all lung
    parenchyma (no vessel, pleura, air outside the body or the table's foam pad)."""
    from scipy import ndimage

    inside = (img > _LUNG_HU[0]) & (img < _LUNG_HU[1])
    inside &= ndimage.uniform_filter(img.astype(np.float32), size=box) > _LUNG_MEAN_MIN
    return ndimage.minimum_filter(inside.astype(np.uint8), size=box, mode="constant") > 0


def insert_lung_nodules(rng: np.random.Generator, img: np.ndarray, mask: np.ndarray, count: int,
                        spacing_mm: float = _INSERT_SPACING_MM) -> tuple[np.ndarray, np.ndarray]:
    """Up to ``count`` lung nodules (3-20 mm) drawn into lung parenchyma of a raw-HU CT
    region, ``img`` (H, W) or the 2.5-D stack (3, H, W) of the previous, this and next
    slice; the mask (255 inside) is this slice's. Returns new arrays.

    Why: lung nodules are 8 % of the training slices' lesions, and the 2.x CT models
    found 4 of 9 of them ≥ 5 mm on validation series (62 of 72 other lesions). Each is a
    3-D ellipsoid like the phantom's (half-length 0.6-1 × the radius, the slice 3 or 5 mm
    thick, centred within half a slice of this one), so the neighbouring slices show its
    smaller sections or nothing, where a vessel runs on.
    """
    from scipy import ndimage

    from medrt.phantom.shapes import log_uniform

    img, mask = img.astype(np.float32, copy=True), mask.copy()
    stack = img if img.ndim == 3 else img[None]
    mid = stack[stack.shape[0] // 2]
    rows, cols = mid.shape
    room = lung_room(mid, box=3)
    if stack.shape[0] == 3:
        room &= lung_room(stack[0], box=3) & lung_room(stack[2], box=3)
    room[mask > 0] = False
    # distance to the nearest vessel, pleura or lesion; a nodule fits where it exceeds its reach
    clear = ndimage.distance_transform_edt(room)
    placed = 0
    for _ in range(4 * count):
        if placed >= count or clear.max() < _LUNG_MM[0] / spacing_mm / 2 + 2:
            break
        d_mm = min(log_uniform(rng, *_LUNG_MM), 2.0 * (float(clear.max()) - 2.0) * spacing_mm)
        d_px = d_mm / spacing_mm
        reach = d_px / 2 + 2
        pts = np.argwhere(clear > reach)
        if not len(pts):
            continue
        r, c = (int(v) for v in pts[rng.integers(len(pts))])
        _draw_ellipsoid(rng, stack, mask, (r, c), d_mm, spacing_mm, lambda: np.float32(rng.uniform(*_LUNG_CONTRAST)))
        rr, cc = np.ogrid[:rows, :cols]
        clear[(rr - r) ** 2 + (cc - c) ** 2 <= (2 * reach) ** 2] = 0  # apart from the next one
        placed += 1
    return img, mask


def _draw_ellipsoid(rng: np.random.Generator, stack: np.ndarray, mask: np.ndarray, at: tuple[int, int], d_mm: float,
                    spacing_mm: float, contrast: Callable[[], np.float32]) -> None:
    """Draw one lesion as the phantom draws a 3-D one (:mod:`medrt.phantom.ct`) into
    ``stack`` (1 or 3 slices: this one, or the previous, this and next) in place, centred
    near pixel ``at`` of the middle slice, ``d_mm`` across in-plane; ``mask`` (255 inside)
    is the middle slice's. An irregular ellipsoid, its half-length 0.6-1 × the radius, the
    slices 3 or 5 mm thick and centred within half a slice of the middle one, so the
    neighbours show smaller sections of it or nothing. ``contrast()`` draws its value."""
    from medrt.phantom.shapes import Blob, random_harmonics, render_blob

    r, c = at
    d_px = d_mm / spacing_mm
    irregular = bool(rng.random() < 0.5)
    harm = random_harmonics(rng, irregular)
    a = d_px / 2.0 / (1.0 + sum(abs(h[1]) for h in harm))
    radii = (a, a * float(rng.uniform(0.75, 1.0)))
    angle = float(rng.uniform(0.0, math.pi))
    twist = float(rng.uniform(-0.08, 0.08)) if irregular else 0.0
    half_z = d_mm / 2.0 * float(rng.uniform(0.6, 1.0))
    thickness = float(rng.choice([3.0, 5.0]))
    dz = float(rng.uniform(-0.5, 0.5)) * min(thickness, half_z)
    centre = (r + float(rng.uniform(-0.5, 0.5)), c + float(rng.uniform(-0.5, 0.5)))
    value = contrast()
    offsets = (-thickness, 0.0, thickness) if len(stack) == 3 else (0.0,)
    for k, z in enumerate(offsets):
        rel = z - dz
        if abs(rel) >= half_z:
            continue
        f = math.sqrt(1.0 - (rel / half_z) ** 2)
        blob = Blob(center=centre, radii=(radii[0] * f, radii[1] * f), angle=angle,
                    harmonics=tuple((h, amp, ph + twist * rel) for h, amp, ph in harm), edge_px=1.0)
        hit = render_blob(blob, stack.shape[-2:])
        if hit is None:
            continue
        sl, weight, inside = hit
        stack[k][sl] += value * weight.astype(np.float32)
        if z == 0.0:
            mask[sl][inside] = 255


# Faint soft-tissue lesions (CT crops, ``insert_faint``): the lesions >= 5 mm that the CT
# models miss on the validation series are mostly these, hypodense at 1.5-2.5x the noise.
_FAINT_MM = (5.0, 15.0)
_FAINT_NOISE = (1.5, 3.0)  # contrast in units of the noise, as the phantom's faint class


def insert_faint_lesions(rng: np.random.Generator, img: np.ndarray, mask: np.ndarray, count: int,
                         spacing_mm: float = _INSERT_SPACING_MM) -> tuple[np.ndarray, np.ndarray]:
    """Up to ``count`` faint soft-tissue lesions (5-15 mm, 1.5-3x the noise, mostly
    hypodense) drawn into homogeneous parenchyma of a raw-HU CT region, ``img`` (H, W) or
    the 2.5-D stack (3, H, W), as 3-D ellipsoids across the slices (:func:`_draw_ellipsoid`);
    the mask (255 inside) is this slice's. Returns new arrays; the inputs are untouched.

    Why: of the lesions >= 5 mm that ``lesion_unet_lite`` 3.0 misses on the validation
    series, most are faint hypodense soft-tissue lesions that its first pass gives p < 0.4,
    and the phantom's 24 training series hold few of them."""
    from medrt.phantom.shapes import log_uniform

    img, mask = img.astype(np.float32, copy=True), mask.copy()
    stack = img if img.ndim == 3 else img[None]
    mid = stack[stack.shape[0] // 2]
    rows, cols = mid.shape
    placed = 0
    for _ in range(12 * count):
        if placed >= count:
            break
        d_mm = log_uniform(rng, *_FAINT_MM)
        reach = int(d_mm / spacing_mm / 2 + 4)
        if min(rows, cols) <= 2 * reach + 1:
            break
        spot = _parenchyma_at(rng, mid, mask, reach)
        if spot is None:
            continue
        sigma = float(rng.uniform(10.0, 14.0))
        sign = -1.0 if rng.random() < _INSERT_NEGATIVE_P else 1.0
        _draw_ellipsoid(rng, stack, mask, spot, d_mm, spacing_mm,
                        lambda sign=sign, sigma=sigma: np.float32(sign * rng.uniform(*_FAINT_NOISE) * sigma))
        placed += 1
    return img, mask


# Faint small radiograph nodules (DX crops, ``insert_faint_dx``): 20 of the 21 held-out
# nodules ``lesion_unet_dx`` 1.0 misses are 2-5 mm and faint (25-50 units of 4095 over a
# background of ribs and vessels), and they are few among the training radiographs' nodules.
_DX_FAINT_MM = (2.0, 6.0)
_DX_FINE = 4  # drawn at a quarter of the patch spacing (a 4096² radiograph's 0.125 mm), then area-averaged


def insert_faint_nodules(rng: np.random.Generator, img: np.ndarray, mask: np.ndarray, count: int,
                         spacing_mm: float = SEG_SPACING) -> tuple[np.ndarray, np.ndarray]:
    """Up to ``count`` faint 2-6 mm nodules drawn into a radiograph region ``img`` (raw
    units at ``spacing_mm``) away from its lesions, as the phantom draws its faint class
    (``medrt.phantom.xray``: the same outline, dome profile and 25-50 unit contrast),
    rendered four times finer and area-averaged as the training patches are; ``mask``
    gets their lesion fraction (x 255). Returns new arrays; the inputs are untouched."""
    from medrt.phantom.shapes import log_uniform, render_blob
    from medrt.phantom.xray import XRAY_MAX, nodule_outline

    img, mask = img.astype(np.float32, copy=True), mask.copy()
    rows, cols = img.shape
    placed = 0
    for _ in range(12 * count):
        if placed >= count:
            break
        d_mm = log_uniform(rng, *_DX_FAINT_MM)
        half = int(math.ceil(d_mm / spacing_mm / 2.0)) + 2
        if min(rows, cols) <= 2 * half + 1:
            break
        r, c = int(rng.integers(half, rows - half)), int(rng.integers(half, cols - half))
        box = (slice(r - half, r + half), slice(c - half, c + half))
        if mask[box].any():
            continue
        side = 2 * half * _DX_FINE
        centre = (side / 2.0 + float(rng.uniform(-2, 2)), side / 2.0 + float(rng.uniform(-2, 2)))
        blob, contrast = nodule_outline(rng, centre, d_mm, spacing_mm / _DX_FINE, faint=True)
        hit = render_blob(blob, (side, side))
        if hit is None:
            continue
        sl, weight, inside = hit
        w, m = np.zeros((side, side), np.float32), np.zeros((side, side), np.float32)
        w[sl], m[sl] = weight, inside
        contrast = min(contrast, XRAY_MAX - 40.0 - float(img[box].max()))  # as the phantom: never clipped
        img[box] += np.float32(contrast) * area_downsample(w, (_DX_FINE, _DX_FINE))
        frac = np.rint(area_downsample(m, (_DX_FINE, _DX_FINE)) * 255.0).astype(np.uint8)
        mask[box] = np.maximum(mask[box], frac)
        placed += 1
    return img, mask


def seg_batch(
    rng: np.random.Generator, data: SegData, batch: int, crop: int = 256, ct_fraction: float = 0.5,
    lesion_fraction: float = 0.6, insert_small: float = 0.0, slices: int = 1, neighbour_drop: float = 0.15,
    window: tuple[float, float] | None = None, insert_lung: float = 0.0, insert_faint: float = 0.0,
    small_mm: tuple[float, float] = INSERT_SMALL_MM, insert_faint_dx: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Normalised crops with augmentation: window jitter, extra noise, flips, and a 2×
    zoom now and then (the multi-scale recheck feeds the UNet 2× finer crops).

    About ``ct_fraction`` of the crops are CT when both kinds are there (the DX
    patches outnumber the CT ones), and about ``lesion_fraction`` of each kind hold
    a lesion (most radiograph patches are random: ribs, vessels and edges are the
    hard negatives, and a lesion-poor batch taught a mixed model to ignore
    radiographs). Targets are the lesion fraction of each pixel (0..1). Extra noise
    is scaled to each modality: a few HU on CT, a few units of the 12-bit range on
    radiographs (whose faint nodules are 25 units). ``insert_small`` of the CT crops get
    one to three small lesions drawn in (:func:`insert_small_lesions`), ``small_mm`` across.

    ``slices=3`` gives 2.5-D inputs: channels previous, this and next slice (needs
    ``data.neighbours``; a radiograph stands in for its own neighbours), cropped, zoomed,
    turned and windowed alike. Inserted lesions go into the middle slice only (a 2-6 mm
    lesion shows on one 3-5 mm slice). Each neighbour is replaced by the middle slice
    with probability ``neighbour_drop``, as at a series' ends or for a lone image.

    ``window``: CT crops are normalised by this fixed (center, width) instead of their
    own VOI window (:func:`jitter_window` ``fixed``); the extra noise stays the same in HU.

    ``insert_lung``: that share of the CT crops is cut around lung parenchyma (from the
    patches that have room for a nodule) and gets one or two lung nodules drawn in, across
    the three slices (:func:`insert_lung_nodules`).

    ``insert_faint``: that share of the CT crops gets one or two faint 5-15 mm soft-tissue
    lesions drawn in, across the three slices (:func:`insert_faint_lesions`).

    ``insert_faint_dx``: that share of the radiograph crops gets one to three faint 2-6 mm
    nodules drawn in (:func:`insert_faint_nodules`)."""
    if slices not in (1, 3):
        raise ValueError(f"slices must be 1 or 3, got {slices}")
    if slices == 3 and data.neighbours is None:
        raise ValueError("slices=3 needs the CT neighbours (models.data.build_neighbours)")
    xs = np.empty((batch, slices, crop, crop), np.float32)
    ys = np.empty((batch, 1, crop, crop), np.float32)
    has = data.has_lesion
    pools = {}
    for kind, sel in (("ct", data.is_ct), ("dx", ~data.is_ct)):
        pools[kind] = (np.flatnonzero(sel), np.flatnonzero(sel & has))
    for b in range(batch):
        kind = "ct" if (len(pools["ct"][0]) and (not len(pools["dx"][0]) or rng.random() < ct_fraction)) else "dx"
        every, positive = pools[kind]
        lung = kind == "ct" and insert_lung > 0 and len(data.lung_rows) > 0 and rng.random() < insert_lung
        pool = data.lung_rows if lung else (
            positive if (len(positive) and rng.random() < lesion_fraction) else every)
        i = int(pool[rng.integers(len(pool))])
        img, mask = (data.slices(i) if slices == 3 else data.patches[i]), data.masks[i]
        zoom = rng.random() < 0.2  # 2x zoom of a half-size region
        side = crop // 2 if zoom else crop
        # a lung crop is placed over a pixel with room for a nodule, as a lesion crop over a lesion
        r0, c0 = _crop_start(rng, data.lung_room(i) if lung else mask, side)
        img, mask = img[..., r0 : r0 + side, c0 : c0 + side], mask[r0 : r0 + side, c0 : c0 + side]
        if lung:
            img, mask = insert_lung_nodules(rng, img, mask, int(rng.integers(1, 3)))
        if insert_small > 0 and data.is_ct[i] and rng.random() < insert_small:
            if slices == 3:
                mid, mask = insert_small_lesions(rng, img[1], mask, int(rng.integers(1, 4)), sizes_mm=small_mm)
                img = img.copy()
                img[1] = mid
            else:
                img, mask = insert_small_lesions(rng, img, mask, int(rng.integers(1, 4)), sizes_mm=small_mm)
        if insert_faint > 0 and data.is_ct[i] and rng.random() < insert_faint:
            img, mask = insert_faint_lesions(rng, img, mask, int(rng.integers(1, 3)))
        if insert_faint_dx > 0 and not data.is_ct[i] and rng.random() < insert_faint_dx:
            if slices == 3:  # a radiograph stands in for its own neighbours
                mid, mask = insert_faint_nodules(rng, img[1], mask, int(rng.integers(1, 4)))
                img = np.stack([mid, mid, mid])
            else:
                img, mask = insert_faint_nodules(rng, img, mask, int(rng.integers(1, 4)))
        if zoom:
            img = np.repeat(np.repeat(img, 2, axis=-2), 2, axis=-1)
            mask = np.repeat(np.repeat(mask, 2, axis=-2), 2, axis=-1)
        img, mask = augment_pair(rng, img, mask)
        if slices == 3:
            for k in (0, 2):
                if rng.random() < neighbour_drop:
                    img[k] = img[1]
        center, width, scale = _window_for(rng, data, i, window)
        x = normalize(img, center, width)
        if rng.random() < 0.3:
            sigma = rng.uniform(0.002, 0.01) * scale if data.is_ct[i] else rng.uniform(0.0002, 0.001)
            x = np.clip(x + rng.normal(0, sigma, x.shape).astype(np.float32), 0, 1)
        xs[b] = x
        ys[b, 0] = mask * np.float32(1.0 / 255.0)
    return xs, ys


def roi_batch(
    rng: np.random.Generator, data: RoiData, batch: int, crop: int = 256, ct_fraction: float = 0.5,
    slices: int = 1, neighbour_drop: float = 0.15, window: tuple[float, float] | None = None,
    insert_lung: float = 0.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random ``crop``² windows of the thumbnails (a multiple of STRIDE), their heatmap
    targets and presence (any lesion cell in the window). The network is fully
    convolutional with global pooling, so it runs on whole thumbnails at inference;
    crops make a training step 2.5x cheaper on this CPU. About ``ct_fraction`` of the
    windows come from CT slices when both kinds are there. ``slices=3``: channels
    previous, this and next slice's thumbnail (``data.neighbours``), each neighbour
    replaced by the slice itself with probability ``neighbour_drop`` (as at a series'
    ends, or for a lone image), as :func:`seg_batch` does; ``window`` as there.
    ``insert_lung``: that share of the CT windows comes from slices with lung (at the
    thumbnail's own spacing, CT slices being their own thumbnails), with one or two lung
    nodules drawn in (:func:`insert_lung_nodules`) and their cells marked, and is centred
    on one of them."""
    if slices not in (1, 3):
        raise ValueError(f"slices must be 1 or 3, got {slices}")
    cells = crop // STRIDE
    xs = np.zeros((batch, slices, crop, crop), np.float32)
    ys = np.zeros((batch, 2, cells, cells), np.float32)  # channel 0 target, 1 valid
    ps = np.zeros((batch, 1), np.float32)
    ct_idx, dx_idx = np.flatnonzero(data.is_ct), np.flatnonzero(~data.is_ct)
    for b in range(batch):
        pool = ct_idx if (len(ct_idx) and (not len(dx_idx) or rng.random() < ct_fraction)) else dx_idx
        lung = bool(pool is ct_idx and insert_lung > 0 and len(data.lung_rows) and rng.random() < insert_lung)
        i = int((data.lung_rows if lung else pool)[rng.integers(len(data.lung_rows) if lung else len(pool))])
        thumb, target = (data.slices(i) if slices == 3 else data.thumbs[i]), data.targets[i]
        drawn = np.zeros_like(target)
        if lung:
            thumb, mask = insert_lung_nodules(rng, thumb, np.zeros(thumb.shape[-2:], np.uint8), int(rng.integers(1, 3)))
            drawn = heatmap_target(mask, 1, STRIDE)[: target.shape[0], : target.shape[1]]
            target = np.maximum(target, drawn)
        thumb, both = augment_pair(rng, thumb, np.stack([target, drawn]))
        target, drawn = both
        tr, tc = target.shape
        # Half of the windows are centred on a lesion cell when the frame has one; a
        # window with lung nodules drawn in, on one of them.
        hits = np.argwhere(drawn > 0) if drawn.any() else np.argwhere(target > 0)
        if len(hits) and (drawn.any() or rng.random() < 0.5):
            r, c = hits[rng.integers(len(hits))] - cells // 2 + rng.integers(-cells // 4, cells // 4 + 1, size=2)
        else:
            r, c = rng.integers(0, max(tr - cells, 0) + 1), rng.integers(0, max(tc - cells, 0) + 1)
        r0, c0 = int(np.clip(r, 0, max(tr - cells, 0))), int(np.clip(c, 0, max(tc - cells, 0)))
        sub_t = target[r0 : r0 + cells, c0 : c0 + cells]
        sub_x = thumb[..., r0 * STRIDE : (r0 + cells) * STRIDE, c0 * STRIDE : (c0 + cells) * STRIDE]
        center, width, _ = _window_for(rng, data, i, window)
        x = normalize(sub_x, center, width)
        if slices == 3:
            for k in (0, 2):
                if rng.random() < neighbour_drop:
                    x[k] = x[1]
        xs[b, :, : x.shape[-2], : x.shape[-1]] = x
        ys[b, 0, : sub_t.shape[0], : sub_t.shape[1]] = sub_t
        ys[b, 1, : sub_t.shape[0], : sub_t.shape[1]] = 1.0
        ps[b, 0] = float(sub_t.any())
    return xs, ys, ps
