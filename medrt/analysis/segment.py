"""The lesion UNet on crops (the ROI path) or over the whole frame (the baseline).

Inputs are a frame's pixels already normalised to 0..1 by its window: a 2-D
array, or for a 2.5-D model (``[model] slices = 3``) the (3, rows, cols) stack of
:func:`medrt.analysis.slices.slice_stack` (a 2-D frame given to such a model is
its own neighbours; a stack given to a one-slice model is read at its middle).
Regions that reach past the frame are padded with 0 (below the window, like air).
Outputs are lesion probabilities in the source pixel grid.

Spacing normalisation: when the caller gives the frame's ``spacing_mm`` and the
model's spec names the spacing it was trained at (``[model] spacing_mm``), a
frame much finer than that is area-averaged by an integer factor per axis
before the UNet runs (a 1024² crop of a 0.125 mm radiograph becomes a 256²
input for a 0.5 mm model), and the UNet's logits are interpolated bilinearly
back onto the source grid before the sigmoid (:mod:`medrt.analysis.resample`).
Without ``spacing_mm`` (or without the spec field) the UNet runs at the
frame's own resolution.

Resampled outputs are exact only from :data:`PROB_FLOOR` up. The logits come back
onto the source grid only in blocks around model pixels whose probability
reaches the floor (dilated by one model pixel, the reach of the bilinear
interpolation); elsewhere the probability is left at 0. An interpolated logit is
a convex combination of its neighbours' logits and the sigmoid is monotonic, so
a source pixel can reach the floor only next to a model pixel that does: every
pixel at or above the floor is exactly what the whole-grid interpolation gives,
and below it a pixel holds that value or less (0 outside every block). A 4096²
radiograph with a few nodules then costs a few small blocks instead of 16 M
interpolated pixels. Nothing downstream reads probabilities that low: the
analyzer, ``models/evaluate.py`` and the quantisation gate use the map only
through :func:`medrt.analysis.lesions.lesions_from_probability` (the spec's
threshold, 0.5-0.7; a lesion's score is its mean above it) and the recheck
(:mod:`medrt.analysis.recheck`, candidates from ``RecheckConfig.faint_low``, 0.25).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from medrt.analysis.components import Box, foreground_boxes
from medrt.analysis.resample import (
    Bilinear,
    Factors,
    area_downsample,
    resample_factors,
    upsample_bilinear,
)
from medrt.bands import map_bands
from medrt.engine.backends.base import Backend
from medrt.preprocess import Windowed, pad_to_multiple

__all__ = ["PROB_FLOOR", "CROP_CONTEXT", "segment_crops", "sliding_window", "gaussian_importance", "model_factors"]

# Resampled probabilities are exact from here up and may be 0 below (module docstring).
# Well under anything read downstream (the recheck's faint_low, 0.25).
PROB_FLOOR = 0.01
# Model pixels of frame context around each crop (segment_crops): 16 mm at 0.5 mm.
CROP_CONTEXT = 32
# The floor as a logit, a hair lower: rounding in the interpolation (an ulp or so)
# cannot then lift a source pixel across the floor next to no model pixel that reaches it.
_FLOOR_LOGIT = math.log(PROB_FLOOR / (1.0 - PROB_FLOOR)) - 1e-3


def _sigmoid(x: np.ndarray) -> np.ndarray:
    out = np.negative(x, dtype=np.float32)
    np.exp(out, out=out)
    out += 1.0
    np.reciprocal(out, out=out)
    return out


def as_logits(values: np.ndarray, activation: str) -> np.ndarray:
    """A model output as logits, which the analysis resamples and blends: as it is for
    ``activation = "sigmoid"``, the log-odds of a probability output (``"none"``: an
    imported MONAI bundle's softmax channel, say), clipped to 1e-6 from 0 and 1."""
    if activation == "sigmoid":
        return values
    p = np.clip(values, 1e-6, 1.0 - 1e-6, dtype=np.float32)
    return np.log(p) - np.log1p(-p)


def _model_input(model: Backend, region: np.ndarray) -> tuple[np.ndarray, tuple[int, int]]:
    """One region (2-D, or a stack of slices) as the model's (1, C, H, W) input, padded to
    its multiple, and the region's own (rows, cols) to cut the output back to."""
    slices = getattr(model.spec, "slices", 1)
    if region.ndim == 3 and slices == 1:
        region = region[region.shape[0] // 2]
    x, (h, w) = pad_to_multiple(region, max(1, model.spec.multiple_of))
    if x.ndim == 2:
        x = x[None, None] if slices == 1 else np.broadcast_to(x, (1, slices, *x.shape))
    else:
        x = x[None]
    return x, (h, w)


def _activation(model: Backend) -> str:
    outputs = getattr(model.spec, "outputs", None)  # a stand-in model without a spec: logits
    return outputs[0].activation if outputs else "sigmoid"


def _run(model: Backend, region: np.ndarray) -> np.ndarray:
    """Logits for one region (2-D, or a stack of slices), padded to the model's multiple
    and cut back."""
    x, (h, w) = _model_input(model, region)
    return as_logits(model.infer(x)[0][0, 0, :h, :w], _activation(model))


def _run_many(model: Backend, regions: list[np.ndarray]) -> list[np.ndarray]:
    """:func:`_run` on each region, in batches of up to ``model.max_batch`` where the
    regions have one shape: on a GPU backend each call costs a copy in, a copy out and a
    synchronisation whatever its size, so the fine sweep's flipped views go as one
    batch. A backend with ``max_batch`` 1 (onnxruntime, whose shipped graphs have a
    batch of 1) gets one call per region."""
    batch = max(1, int(getattr(model, "max_batch", 1)))
    if batch == 1 or len(regions) < 2 or len({r.shape for r in regions}) != 1:
        return [_run(model, r) for r in regions]
    inputs = [_model_input(model, r) for r in regions]
    (h, w), activation, out = inputs[0][1], _activation(model), []
    for i in range(0, len(inputs), batch):
        x = np.concatenate([xi for xi, _ in inputs[i : i + batch]])
        logits = model.infer(x)[0]
        out += [as_logits(logits[j, 0, :h, :w], activation) for j in range(x.shape[0])]
    return out


def model_factors(model: Backend, spacing_mm: tuple[float, float] | None) -> Factors:
    """The area-averaging factors for ``model`` on a frame of ``spacing_mm`` ((1, 1): native)."""
    return resample_factors(spacing_mm, getattr(model.spec, "spacing_mm", None))


def _logits_at(model: Backend, region: np.ndarray, factors: Factors) -> np.ndarray:
    """Logits for a source-resolution region, the UNet run at ``factors`` coarser and its
    logits brought back onto the region's grid."""
    if factors == (1, 1):
        return _run(model, region)
    return upsample_bilinear(_run(model, area_downsample(region, factors)), factors, region.shape[-2:])


def _floor_logit(floor: float) -> float:
    """``floor`` as a logit, a hair lower: rounding in the interpolation (an ulp or so)
    cannot then lift a source pixel across it next to no model pixel that reaches it."""
    if floor == PROB_FLOOR:
        return _FLOOR_LOGIT
    if not 0.0 < floor < 1.0:
        raise ValueError(f'Argument "floor" must be in (0, 1), got {floor!r}')
    return math.log(floor / (1.0 - floor)) - 1e-3


def _probability_blocks(
    logits: np.ndarray, factors: Factors, shape: tuple[int, int], floor: float = PROB_FLOOR
) -> list[tuple[Box, np.ndarray]]:
    """``sigmoid(upsample_bilinear(logits, factors, shape))`` on blocks of the ``shape``
    grid that hold every pixel >= ``floor``: ``((r0, c0, r1, c1), values)``, each value
    exactly the whole-grid one (module docstring). Blocks are the boxes around the model
    pixels that reach the floor, grown by one model pixel (the interpolation's reach);
    two of them may overlap by a line or two, holding the same values there."""
    hot = logits >= _floor_logit(floor)
    if not hot.any():
        return []
    up = Bilinear(logits, factors, shape)
    fr, fc = factors
    rows, cols = shape
    hr, hc = hot.shape
    out = []
    for r0, c0, r1, c1 in foreground_boxes(hot):
        r0, c0, r1, c1 = max(r0 - 1, 0), max(c0 - 1, 0), min(r1 + 1, hr), min(c1 + 1, hc)
        box = (r0 * fr, c0 * fc, min(r1 * fr, rows), min(c1 * fc, cols))
        out.append((box, _sigmoid(up.block(*box))))
    return out


def _region(norm: np.ndarray, r0: int, c0: int, r1: int, c1: int) -> np.ndarray:
    """``norm[..., r0:r1, c0:c1]``, zero-padded where it reaches past the frame; the frame
    itself (not a copy: callers only read it) when the region is exactly the frame, as a
    CT slice's whole-slice crop is. ``norm`` may be a :class:`~medrt.preprocess.Windowed`
    frame, normalised here only over the region."""
    rows, cols = norm.shape[-2:]
    if isinstance(norm, Windowed):  # normalised only where read: this region, unless it is all of it
        return np.asarray(norm) if (r0, c0, r1, c1) == (0, 0, rows, cols) else norm.region(r0, c0, r1, c1)
    if (r0, c0, r1, c1) == (0, 0, rows, cols) and norm.dtype == np.float32:
        return norm
    out = np.zeros((*norm.shape[:-2], r1 - r0, c1 - c0), np.float32)
    rr0, cc0, rr1, cc1 = max(r0, 0), max(c0, 0), min(r1, rows), min(c1, cols)
    if rr1 > rr0 and cc1 > cc0:
        out[..., rr0 - r0 : rr1 - r0, cc0 - c0 : cc1 - c0] = norm[..., rr0:rr1, cc0:cc1]
    return out


def segment_crops(
    model: Backend,
    norm: np.ndarray,
    crops: tuple[tuple[int, int, int, int], ...] | list[tuple[int, int, int, int]],
    *,
    spacing_mm: tuple[float, float] | None = None,
    context: int = CROP_CONTEXT,
    factors: Factors | None = None,
    floor: float = PROB_FLOOR,
) -> np.ndarray:
    """Lesion probability over the frame from the UNet on each crop; 0 outside every
    crop. Where crops overlap, the higher probability wins. ``spacing_mm`` is the
    frame's (row, col) pixel spacing: with it, crops are resampled to the model's
    spacing and their probabilities are exact from :data:`PROB_FLOOR` up (module
    docstring); None runs the UNet at source resolution.

    Each crop is run with up to ``context`` model pixels of the frame around it, on the
    sides where the frame goes on, and only the crop's own pixels are kept: a crop edge
    inside the frame is otherwise an image edge to the network (zero padding beyond it),
    and on radiographs most of the ROI path's false positives sat within 96 px of one
    (36 of 51 on 16 validation frames). Sides at or past the frame's edge get none, so
    a crop that covers the whole frame (a CT slice) costs nothing extra.

    ``factors`` overrides the area-averaging factors that ``spacing_mm`` gives (the
    fine sweep, :mod:`medrt.analysis.sweep`, runs at half of them), and ``floor`` the
    probability from which resampled values are exact (a caller that reads the map only
    from its threshold up, as the fine sweep does, saves the blocks below it)."""
    return _segment_crops(model, norm, crops, spacing_mm=spacing_mm, context=context, factors=factors,
                          floor=floor)[0]


def _segment_crops(
    model: Backend,
    norm: np.ndarray,
    crops: tuple[tuple[int, int, int, int], ...] | list[tuple[int, int, int, int]],
    *,
    spacing_mm: tuple[float, float] | None = None,
    context: int = CROP_CONTEXT,
    factors: Factors | None = None,
    floor: float = PROB_FLOOR,
) -> tuple[np.ndarray, list[Box] | None]:
    """:func:`segment_crops`, and the boxes of the blocks it resampled (every pixel of
    the map at or above ``floor`` lies in one; None at the model's own scale, where the
    map is whole)."""
    rows, cols = norm.shape[-2:]
    prob = np.zeros((rows, cols), np.float32)
    factors = model_factors(model, spacing_mm) if factors is None else factors
    fr, fc = factors

    def prepare(crop: tuple[int, int, int, int]) -> tuple[int, int, tuple[int, int], np.ndarray]:
        """The crop's run region with its context, at the model's spacing: (origin row,
        origin col, the region's source shape, the model's input)."""
        r0, c0, r1, c1 = crop
        up, left = _margin(r0, context, fr), _margin(c0, context, fc)
        down, right = _margin(rows - r1, context, fr), _margin(cols - c1, context, fc)
        region = _region(norm, r0 - up, c0 - left, r1 + down, c1 + right)
        return r0 - up, c0 - left, region.shape[-2:], region if factors == (1, 1) else area_downsample(region, factors)

    def cut(job: tuple[tuple[int, int, int, int], tuple[int, int, tuple[int, int], np.ndarray], np.ndarray]
            ) -> list[tuple[int, int, int, int, np.ndarray]]:
        """The crop's probability blocks from its logits, in frame coordinates, cut to the crop."""
        (r0, c0, r1, c1), (e0, f0, shape, _), logits = job
        if factors == (1, 1):
            blocks = [((0, 0, shape[0], shape[1]), _sigmoid(logits))]
        else:
            blocks = _probability_blocks(logits, factors, shape, floor)
        keep = (max(r0, 0), max(c0, 0), min(r1, rows), min(c1, cols))  # the crop, inside the frame
        out = []
        for (b0, d0, b1, d1), p in blocks:  # region coordinates
            rr0, cc0 = max(e0 + b0, keep[0]), max(f0 + d0, keep[1])
            rr1, cc1 = min(e0 + b1, keep[2]), min(f0 + d1, keep[3])
            if rr1 > rr0 and cc1 > cc0:
                top, lft = rr0 - e0 - b0, cc0 - f0 - d0
                out.append((rr0, cc0, rr1, cc1, p[top : top + rr1 - rr0, lft : lft + cc1 - cc0]))
        return out

    # On a large frame the crops' resampling before and after the model runs on the band
    # pool; the model runs here, one crop after another. (Model calls from the pool's
    # threads made a torch-on-CUDA frame 4x slower on an H200 host: its eager forward is
    # Python-heavy and fought the numpy threads for the GIL.) The maximum below does not
    # depend on the order the crops come in.
    crops = list(crops)
    inputs = map_bands(prepare, crops, pixels=rows * cols)
    logits = [_run(model, x) for *_, x in inputs]
    boxes: list[Box] | None = [] if factors != (1, 1) else None
    for blocks in map_bands(cut, list(zip(crops, inputs, logits, strict=True)), pixels=rows * cols):
        for rr0, cc0, rr1, cc1, p in blocks:
            view = prob[rr0:rr1, cc0:cc1]
            np.maximum(view, p, out=view)
            if boxes is not None:
                boxes.append((rr0, cc0, rr1, cc1))
    return prob, boxes


def _margin(room: int, context: int, factor: int) -> int:
    """Source pixels of context on one side: up to ``context`` model pixels, as far as the
    frame goes on (``room`` source pixels), whole model pixels only (keeps the grid)."""
    return (min(max(room, 0), context * factor) // factor) * factor


@lru_cache(maxsize=8)
def gaussian_importance(size: int, sigma_scale: float = 0.125) -> np.ndarray:
    """MONAI's gaussian blending weights for a ``size``² window (sigma = 0.125 · size)."""
    sigma = sigma_scale * size
    x = np.arange(size, dtype=np.float64) - (size - 1) / 2.0
    g = np.exp(-0.5 * (x / sigma) ** 2)
    w = np.outer(g, g)
    w /= w.max()
    w = np.maximum(w, w[w > 0].min() if (w > 0).any() else 1e-3).astype(np.float32)
    w.flags.writeable = False
    return w


def _starts(length: int, roi: int, step: int) -> list[int]:
    if length <= roi:
        return [0]
    n = math.ceil((length - roi) / step) + 1
    return sorted({min(i * step, length - roi) for i in range(n)})


def sliding_window(
    model: Backend,
    norm: np.ndarray,
    roi: int = 1024,
    overlap: float = 0.25,
    *,
    spacing_mm: tuple[float, float] | None = None,
    factors: Factors | None = None,
    floor: float = PROB_FLOOR,
) -> np.ndarray:
    """Full-frame inference with MONAI ``sliding_window_inference`` semantics: ``roi``²
    windows at stride ``roi·(1-overlap)`` (the last aligned to the edge), logits
    blended with gaussian weights, then the sigmoid. The reference that every
    ROI-path speed claim is measured against.

    With ``spacing_mm`` (the frame's) and a model spacing, the whole frame is first
    area-averaged to the model's spacing and the windows tile that (``roi`` is then in
    the network's pixels, as after MONAI's ``Spacingd``); the blended logits are brought
    back onto the source grid before the sigmoid, where the probability can reach
    :data:`PROB_FLOOR` (module docstring). ``factors`` overrides the factors that
    ``spacing_mm`` gives, and ``floor`` the probability from which resampled values are
    exact, as in :func:`segment_crops`."""
    return _sliding_window(model, norm, roi, overlap, spacing_mm=spacing_mm, factors=factors, floor=floor)[0]


def _sliding_window(
    model: Backend,
    norm: np.ndarray,
    roi: int,
    overlap: float,
    *,
    spacing_mm: tuple[float, float] | None,
    factors: Factors | None,
    floor: float,
) -> tuple[np.ndarray, list[Box] | None]:
    """:func:`sliding_window`, and the boxes of the blocks it resampled (as
    :func:`_segment_crops`)."""
    factors = model_factors(model, spacing_mm) if factors is None else factors
    if factors == (1, 1):
        return _sigmoid(_blended_logits(model, norm, roi, overlap)), None
    logits = _blended_logits(model, area_downsample(norm, factors), roi, overlap)
    prob = np.zeros(norm.shape[-2:], np.float32)
    boxes = []
    for (r0, c0, r1, c1), p in _probability_blocks(logits, factors, norm.shape[-2:], floor):
        prob[r0:r1, c0:c1] = p
        boxes.append((r0, c0, r1, c1))
    return prob, boxes


def _blended_logits(model: Backend, norm: np.ndarray, roi: int, overlap: float) -> np.ndarray:
    rows, cols = norm.shape[-2:]
    step = max(1, int(roi * (1.0 - overlap)))
    wr, wc = min(roi, rows), min(roi, cols)
    starts_r, starts_c = _starts(rows, roi, step), _starts(cols, roi, step)
    if len(starts_r) == len(starts_c) == 1:
        # One window over the whole frame: sum(w·x) / sum(w) is x, so skip the blend (a
        # 4096² radiograph's fine sweep is one 2048² window; its blend was ~15 ms of host
        # time per frame on a GPU machine).
        return _run(model, norm)
    weight = gaussian_importance(roi)[:wr, :wc]
    acc = np.zeros((rows, cols), np.float32)
    norm_w = np.zeros((rows, cols), np.float32)
    for r0 in starts_r:
        for c0 in starts_c:
            logits = _run(model, norm[..., r0 : r0 + wr, c0 : c0 + wc])
            acc[r0 : r0 + wr, c0 : c0 + wc] += logits * weight
            norm_w[r0 : r0 + wr, c0 : c0 + wc] += weight
    acc /= norm_w
    return acc
