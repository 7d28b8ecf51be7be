"""Training data from medrt.phantom: cached arrays, then augmented batches.

Train and held-out data come from disjoint seed ranges (train from 1000, held-out
from 9000; the committed samples use single-digit seeds). Everything is made by
the project's own deterministic generator, so a cache can always be rebuilt.

Two products are cached per seed set:
- ``roi``: thumbnails (raw modality values, area-averaged exactly as
  ``medrt.preprocess.thumbnail`` does at run time), their window, a per-cell
  lesion target at the classifier's heatmap stride, and frame-level presence;
- ``seg``: patches at source resolution (raw values + window + label mask),
  centred on lesions or drawn at random.
"""

from __future__ import annotations

import logging
import math
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from medrt.phantom import generate_ct_series, generate_radiograph
from medrt.preprocess import normalize, thumbnail

log = logging.getLogger(__name__)

TRAIN_SEED = 1000
HELDOUT_SEED = 9000
THUMB = 512  # longest thumbnail side
STRIDE = 8  # heatmap cell, in thumbnail pixels
PATCH = 384  # cached patch side; training crops 256 from it


@dataclass
class RoiData:
    thumbs: list[np.ndarray]  # float32 raw values
    windows: np.ndarray  # (n, 2) center, width
    targets: list[np.ndarray]  # uint8 heatmap targets
    presence: np.ndarray  # (n,) 0/1


@dataclass
class SegData:
    patches: np.ndarray  # (n, PATCH, PATCH) float32 raw values
    windows: np.ndarray  # (n, 2)
    masks: np.ndarray  # (n, PATCH, PATCH) uint8
    is_ct: np.ndarray  # (n,) bool


def heatmap_target(labels: np.ndarray, factor: int, stride: int) -> np.ndarray:
    """1 where a heatmap cell (``factor*stride`` source pixels square) holds lesion pixels."""
    cell = factor * stride
    rows, cols = labels.shape
    tr, tc = math.ceil(rows / cell), math.ceil(cols / cell)
    padded = np.zeros((tr * cell, tc * cell), dtype=bool)
    padded[:rows, :cols] = labels > 0
    return padded.reshape(tr, cell, tc, cell).any(axis=(1, 3)).astype(np.uint8)


def _patches_from(
    pixels: np.ndarray, labels: np.ndarray, window: tuple[float, float], rng: np.random.Generator, n_random: int
) -> list[tuple[np.ndarray, np.ndarray, tuple[float, float]]]:
    rows, cols = pixels.shape
    half = PATCH // 2
    centres: list[tuple[int, int]] = []
    ids = np.unique(labels)
    for lab in ids[ids > 0]:
        rr, cc = np.nonzero(labels == lab)
        i = rng.integers(len(rr))
        jitter = rng.integers(-PATCH // 4, PATCH // 4 + 1, size=2)
        centres.append((int(rr[i] + jitter[0]), int(cc[i] + jitter[1])))
    for _ in range(n_random):
        centres.append((int(rng.integers(0, rows)), int(rng.integers(0, cols))))
    out = []
    for r, c in centres:
        r0 = int(np.clip(r - half, 0, max(rows - PATCH, 0)))
        c0 = int(np.clip(c - half, 0, max(cols - PATCH, 0)))
        p = np.zeros((PATCH, PATCH), np.float32)
        m = np.zeros((PATCH, PATCH), np.uint8)
        sub = pixels[r0 : r0 + PATCH, c0 : c0 + PATCH]
        p[: sub.shape[0], : sub.shape[1]] = sub
        m[: sub.shape[0], : sub.shape[1]] = labels[r0 : r0 + PATCH, c0 : c0 + PATCH] > 0
        if sub.shape != (PATCH, PATCH):  # pad with the darkest value, as outside the body
            p[sub.shape[0] :, :] = pixels.min()
            p[:, sub.shape[1] :] = pixels.min()
        out.append((p, m, window))
    return out


def _dx_item(args: tuple[int, int, int]) -> tuple[tuple, list]:
    seed, index, size = args
    frame = generate_radiograph(seed, size=size, index=index)
    thumb, factor = thumbnail(frame.pixels, THUMB)
    roi = (thumb, frame.window, heatmap_target(frame.labels, factor, STRIDE), int(len(frame.lesions) > 0))
    rng = np.random.default_rng([seed, index, 7])
    patches = _patches_from(frame.pixels, frame.labels, frame.window, rng, n_random=3)
    return roi, patches


def _ct_item(args: tuple[int, int]) -> tuple[list, list]:
    seed, n_frames = args
    rois, patches = [], []
    rng = np.random.default_rng([seed, 11])
    for frame in generate_ct_series(seed, n_frames=n_frames):
        thumb, factor = thumbnail(frame.pixels, THUMB)
        present = int(any(not t.extras.get("ignore") for t in frame.lesions))
        rois.append((thumb, frame.window, heatmap_target(frame.labels, factor, STRIDE), present))
        has = bool(frame.labels.any())
        if has or rng.random() < 0.15:
            patches += _patches_from(frame.pixels, frame.labels, frame.window, rng, n_random=1)
    return rois, patches


def build(
    cache: Path, *, base_seed: int, n_dx: int, n_ct_series: int, ct_frames: int = 40, size: int = 4096, workers: int = 2
) -> tuple[RoiData, SegData]:
    """Generate (or load from ``cache``) the ROI and segmentation training arrays."""
    path = cache / f"phantom_{base_seed}_{n_dx}_{n_ct_series}_{ct_frames}_{size}.npz"
    if path.is_file():
        return _load(path)
    cache.mkdir(parents=True, exist_ok=True)
    rois: list[tuple] = []
    patches: list[tuple] = []
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for roi, p in pool.map(_dx_item, [(base_seed, i, size) for i in range(n_dx)]):
            rois.append(roi)
            patches += [(*item, False) for item in p]
        for r, p in pool.map(_ct_item, [(base_seed + 100 + s, ct_frames) for s in range(n_ct_series)]):
            rois += r
            patches += [(*item, True) for item in p]
    is_ct = np.array([p[3] for p in patches], dtype=bool)
    np.savez(
        path,
        thumbs=np.stack([r[0] for r in rois]).astype(np.float32),  # all THUMB² (4096/8, 512/1)
        windows=np.array([r[1] for r in rois], np.float32),
        targets=np.stack([r[2] for r in rois]).astype(np.uint8),
        presence=np.array([r[3] for r in rois], np.uint8),
        patches=np.stack([p[0] for p in patches]).astype(np.int16),  # phantom values are integers
        pwindows=np.array([p[2] for p in patches], np.float32),
        masks=np.stack([p[1] for p in patches]).astype(np.uint8),
        is_ct=is_ct,
    )
    log.info("cached %d thumbnails and %d patches in %s", len(rois), len(patches), path)
    return _load(path)


def _load(path: Path) -> tuple[RoiData, SegData]:
    z = np.load(path)
    roi = RoiData(list(z["thumbs"]), z["windows"], list(z["targets"]), z["presence"])
    seg = SegData(z["patches"].astype(np.float32), z["pwindows"], z["masks"], z["is_ct"])
    return roi, seg


def jitter_window(rng: np.random.Generator, window: np.ndarray) -> tuple[float, float]:
    """Window shifts as a reader or a different scanner preset would give."""
    c, w = float(window[0]), float(window[1])
    return c + rng.uniform(-0.12, 0.12) * w, w * float(np.exp(rng.uniform(-0.25, 0.25)))


def augment_pair(rng: np.random.Generator, img: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flips and 90° turns, applied to image and mask alike."""
    k = int(rng.integers(4))
    img, mask = np.rot90(img, k), np.rot90(mask, k)
    if rng.random() < 0.5:
        img, mask = img[:, ::-1], mask[:, ::-1]
    return np.ascontiguousarray(img), np.ascontiguousarray(mask)


def seg_batch(rng: np.random.Generator, data: SegData, batch: int, crop: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Normalised crops with augmentation: window jitter, extra noise, flips, and a 2×
    zoom now and then (the multi-scale recheck feeds the UNet 2× upsampled crops)."""
    xs = np.empty((batch, 1, crop, crop), np.float32)
    ys = np.empty((batch, 1, crop, crop), np.float32)
    n = len(data.patches)
    for b in range(batch):
        i = int(rng.integers(n))
        img, mask = data.patches[i], data.masks[i]
        if rng.random() < 0.2:  # 2x zoom of a half-size region
            half = crop // 2
            r0, c0 = rng.integers(0, PATCH - half + 1, size=2)
            img = np.kron(img[r0 : r0 + half, c0 : c0 + half], np.ones((2, 2), np.float32))
            mask = np.kron(mask[r0 : r0 + half, c0 : c0 + half], np.ones((2, 2), np.uint8))
        else:
            r0, c0 = rng.integers(0, PATCH - crop + 1, size=2)
            img = img[r0 : r0 + crop, c0 : c0 + crop]
            mask = mask[r0 : r0 + crop, c0 : c0 + crop]
        img, mask = augment_pair(rng, img, mask)
        center, width = jitter_window(rng, data.windows[i])
        x = normalize(img, center, width)
        if rng.random() < 0.3:
            x = np.clip(x + rng.normal(0, rng.uniform(0.002, 0.01), x.shape).astype(np.float32), 0, 1)
        xs[b, 0] = x
        ys[b, 0] = mask
    return xs, ys


def roi_batch(
    rng: np.random.Generator, data: RoiData, batch: int, crop: int = 256
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random ``crop``² windows of the thumbnails (a multiple of STRIDE), their heatmap
    targets and presence (any lesion cell in the window). The network is fully
    convolutional with global pooling, so it runs on whole thumbnails at inference;
    crops make a training step 2.5x cheaper on this CPU."""
    cells = crop // STRIDE
    xs = np.zeros((batch, 1, crop, crop), np.float32)
    ys = np.zeros((batch, 2, cells, cells), np.float32)  # channel 0 target, 1 valid
    ps = np.zeros((batch, 1), np.float32)
    for b in range(batch):
        i = int(rng.integers(len(data.thumbs)))
        thumb, target = augment_pair(rng, data.thumbs[i], data.targets[i])
        tr, tc = target.shape
        # Half of the windows are centred on a lesion cell when the frame has one.
        hits = np.argwhere(target > 0)
        if len(hits) and rng.random() < 0.5:
            r, c = hits[rng.integers(len(hits))] - cells // 2 + rng.integers(-cells // 4, cells // 4 + 1, size=2)
        else:
            r, c = rng.integers(0, max(tr - cells, 0) + 1), rng.integers(0, max(tc - cells, 0) + 1)
        r0, c0 = int(np.clip(r, 0, max(tr - cells, 0))), int(np.clip(c, 0, max(tc - cells, 0)))
        sub_t = target[r0 : r0 + cells, c0 : c0 + cells]
        sub_x = thumb[r0 * STRIDE : (r0 + cells) * STRIDE, c0 * STRIDE : (c0 + cells) * STRIDE]
        center, width = jitter_window(rng, data.windows[i])
        x = normalize(sub_x, center, width)
        xs[b, 0, : x.shape[0], : x.shape[1]] = x
        ys[b, 0, : sub_t.shape[0], : sub_t.shape[1]] = sub_t
        ys[b, 1, : sub_t.shape[0], : sub_t.shape[1]] = 1.0
        ps[b, 0] = float(sub_t.any())
    return xs, ys, ps
