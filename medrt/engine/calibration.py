"""Calibration inputs for INT8 quantization: the inputs a model sees at run time,
made from phantoms, with the edge cases a lesion model must keep.

Segmentation models get CT slices (with their neighbours for a 2.5-D model) and 1024²
crops of 4096² radiographs around tiny, faint, bright and border-crossing lesions,
plus lesion-free crops, resampled to the spec's ``spacing_mm``; ROI classifiers get
the thumbnails of CT slices and radiographs. Picked round-robin over those
categories and cached per ``(spec kind, seed, n)`` (read-only arrays).
:mod:`medrt.engine.quantize` calibrates on them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from medrt.engine.registry import ModelSpec
from medrt.preprocess import normalize, pad_to_multiple

if TYPE_CHECKING:  # pragma: no cover - typing only
    from medrt.phantom.frame import PhantomFrame

__all__ = ["CALIBRATION_SEED", "calibration_inputs", "calibration_description"]

# Calibration frames come from their own seed range: training starts at 1000 and the
# held-out validation (the gate) at 9000 (medrt.models.data).
CALIBRATION_SEED = 5000
CROP = 1024  # the ROI path's crop side
_MARGIN = 64  # pixels kept around a lesion in a calibration crop
_TINY_MM = 5.0


def _category(frame: PhantomFrame, region: tuple[int, int, int, int] | None = None) -> str:
    """The edge case a frame (or a crop of it) stands for: border, tiny, faint, bright, empty."""
    lesions = frame.lesions
    if region is not None:
        r0, c0, r1, c1 = region
        lesions = tuple(t for t in lesions if t.bbox[0] < r1 and t.bbox[2] > r0 and t.bbox[1] < c1 and t.bbox[3] > c0)
    if not lesions:
        return "empty"
    if any(t.extras.get("border") for t in lesions):
        return "border"
    if any(t.diameter_mm < _TINY_MM for t in lesions):
        return "tiny"
    if any(t.kind == "faint" for t in lesions):
        return "faint"
    return "bright"


def _crop(norm: np.ndarray, box: tuple[int, int, int, int]) -> np.ndarray:
    """``norm[box]``, zero-padded where the box reaches past the frame (as the ROI path pads)."""
    r0, c0, r1, c1 = box
    out = np.zeros((r1 - r0, c1 - c0), np.float32)
    rows, cols = norm.shape
    rr0, cc0, rr1, cc1 = max(r0, 0), max(c0, 0), min(r1, rows), min(c1, cols)
    out[rr0 - r0 : rr1 - r0, cc0 - c0 : cc1 - c0] = norm[rr0:rr1, cc0:cc1]
    return out


def _empty_box(frame: PhantomFrame) -> tuple[int, int, int, int] | None:
    rows, cols = frame.shape
    low_r, low_c = rows - CROP, cols - CROP
    for r0, c0 in ((low_r // 2, low_c // 2), (0, 0), (low_r, 0), (0, low_c), (low_r, low_c)):
        if r0 >= 0 and c0 >= 0 and not frame.labels[r0 : r0 + CROP, c0 : c0 + CROP].any():
            return (r0, c0, r0 + CROP, c0 + CROP)
    return None


def _segmentation_items(seed: int, n_ct: int, n_dx: int, spacing_mm: float | None,
                        slices: int = 1, window: tuple[float, float] | None = None,
                        ) -> Iterator[tuple[str, np.ndarray]]:
    """(category, normalised input): CT slices 512², then 1024² crops of 4096² radiographs,
    area-averaged to the model's ``spacing_mm`` as the analysis feeds them (a 0.5 mm
    model gets a 0.125 mm radiograph's crop as 256²). ``slices=3``: (3, H, W) stacks,
    a CT slice with its neighbours in the series and a radiograph as its own."""
    from medrt.analysis.resample import area_downsample, resample_factors
    from medrt.analysis.roi import plan_crops, proposals_from_boxes
    from medrt.analysis.slices import phantom_input
    from medrt.phantom import generate_ct_series, generate_radiograph

    for s in range(math.ceil(n_ct / 12)):
        series = generate_ct_series(seed + 100 + s, n_frames=40)
        for frame in series:
            yield "ct-" + _category(frame), phantom_input(frame, series, slices, window)
    for i in range(math.ceil(n_dx / 4)):
        frame = generate_radiograph(seed, size=4096, index=i, n_lesions=3, border_lesion=True, far_apart=i % 2 == 1)
        norm = normalize(frame.pixels, *(window or frame.window))
        factors = resample_factors(frame.spacing_mm, spacing_mm)
        props = proposals_from_boxes([t.bbox for t in frame.lesions], frame.shape, _MARGIN)
        boxes = list(plan_crops(props, frame.shape, CROP)) if props else []
        empty = _empty_box(frame)
        if empty is not None:
            boxes.append(empty)
        for box in boxes:
            x = area_downsample(_crop(norm, box), factors)
            yield "dx-" + _category(frame, box), (np.stack([x] * 3) if slices == 3 else x)


def _roi_items(thumb: int, seed: int, n: int, slices: int = 1,
               window: tuple[float, float] | None = None,
               ct_share: float = 0.5) -> Iterator[tuple[str, np.ndarray]]:
    """(category, normalised thumbnail) of CT slices and 4096² radiographs (only those
    of the kind ``ct_share`` asks for when it is 1 or 0); ``slices=3``: (3, h, w)
    stacks, a CT slice's thumbnail with its neighbours' and a radiograph's thrice, as
    :func:`medrt.analysis.roi.classify` feeds a 2.5-D classifier."""
    from medrt.analysis.roi import thumbnail_input
    from medrt.analysis.slices import phantom_sides
    from medrt.phantom import generate_ct_series, generate_radiograph

    n_series = math.ceil(n / 24) if ct_share > 0 else 0
    series = [generate_ct_series(seed + 100 + s, n_frames=40) for s in range(n_series)]
    frames: Iterable[tuple[PhantomFrame, Any]] = ((f, ser) for ser in series for f in ser)
    n_dx = max(2, n // 4) if ct_share < 1 else 0
    for kind, frame_iter in (("ct", frames), ("dx", (
        (generate_radiograph(seed, size=4096, index=i, border_lesion=i % 2 == 0, n_lesions=i % 3), ())
        for i in range(n_dx)
    ))):  # fmt: skip
        for frame, ser in frame_iter:
            sides = phantom_sides(frame, ser) if slices == 3 else (None, None)
            x, _ = thumbnail_input(frame.pixels, window or frame.window, thumb, slices, sides)
            yield f"{kind}-{_category(frame)}", x  # padded to ``mult`` by _cached_inputs


def _balanced(items: Iterable[tuple[str, np.ndarray]], n: int, ct_share: float = 0.5) -> list[np.ndarray]:
    """Up to ``n`` inputs, ``ct_share`` of them CT and the rest DX (topped up from the other
    where one runs short), each picked round-robin over the edge-case categories."""
    pools: dict[str, dict[str, list[np.ndarray]]] = {"ct": {}, "dx": {}}
    for cat, x in items:
        kind, sub = cat.split("-", 1)
        pools[kind].setdefault(sub, []).append(x)

    def pick(cats: dict[str, list[np.ndarray]], k: int) -> list[np.ndarray]:
        out: list[np.ndarray] = []
        while len(out) < k and any(cats.values()):
            for sub in ("border", "tiny", "faint", "bright", "empty"):
                if cats.get(sub) and len(out) < k:
                    out.append(cats[sub].pop(0))
        return out

    n_ct = round(n * ct_share)
    chosen = pick(pools["ct"], n_ct) + pick(pools["dx"], n - n_ct)
    return chosen + pick(pools["ct"], n - len(chosen))


@functools.lru_cache(maxsize=4)
def _cached_inputs(task: str, thumb: int, mult: int, seed: int, n: int,
                   spacing_mm: float | None, slices: int = 1, ct_share: float = 0.5,
                   window: tuple[float, float] | None = None) -> tuple[np.ndarray, ...]:
    if task == "roi_classifier":
        items = _roi_items(thumb, seed, n, slices, window, ct_share)
    else:
        n_ct = round(n * ct_share)
        items = _segmentation_items(seed, n_ct, max(n - n_ct, 0), spacing_mm, slices, window)
    out = []
    for x in _balanced(items, n, ct_share):
        x = pad_to_multiple(np.ascontiguousarray(x, np.float32), mult)[0]
        x = x[None] if x.ndim == 3 else x[None, None]
        x.flags.writeable = False
        out.append(x)
    return tuple(out)


def _ct_share(spec: ModelSpec) -> float:
    """The share of CT inputs in a model's calibration set, by the modalities its spec
    lists: 1 for CT only, 0 without CT, else (or none listed) half."""
    modalities = set(getattr(spec, "modalities", ()) or ())
    if not modalities:
        return 0.5
    return 1.0 if modalities <= {"CT"} else 0.0 if "CT" not in modalities else 0.5


def calibration_inputs(spec: ModelSpec, seed: int = CALIBRATION_SEED, n: int | None = None) -> list[np.ndarray]:
    """``n`` NCHW float32 inputs the model sees at run time, edge cases included
    (default 24; 48 for a CT-only model, see below).

    Segmentation: half CT slices (512², normalised by their window, as the analysis
    does), half 1024² crops of 4096² radiographs around lesions (border-crossing
    ones at the crop edge, tiny and faint ones) and lesion-free crops, resampled to
    the spec's ``spacing_mm`` when it names one (as the analysis does); each half
    is picked round-robin over border / tiny / faint / bright / empty. A model whose
    spec lists only CT (``[model] modalities``) is calibrated on CT slices alone (with
    their neighbours for a 2.5-D one), one that lists only radiographs on radiograph
    crops alone: the inputs it will see, normalised as it will see them (by each
    frame's VOI window, or by the spec's ``fixed_window``). A CT-only model gets 48 slices from two
    series by default: the 2.5-D ``lesion_unet_lite`` 2.0 calibrated on 24 slices of one
    series lost one of the gate's 29 lesions (refused), on 48 it lost none. An ROI
    classifier gets thumbnails instead, of CT slices and radiographs mixed in the same
    way by its modalities (the CT-only ``roi_classifier`` had been calibrated half on
    radiograph thumbnails it never sees). The same
    ``(spec kind, seed, n)`` gives the same arrays (cached, read-only).
    """
    ct_share = _ct_share(spec)
    if n is None:
        n = 48 if ct_share == 1.0 else 24
    if n < 1:
        raise ValueError(f'Argument "n" must be >= 1, got {n}')
    mult = max(1, spec.multiple_of, spec.stride if spec.task == "roi_classifier" else 1)
    fixed = getattr(spec, "own_window", None)
    return list(_cached_inputs(spec.task, spec.thumbnail, mult, seed, n, getattr(spec, "spacing_mm", None),
                               getattr(spec, "slices", 1), ct_share, fixed))


def calibration_description(spec: ModelSpec, seed: int = CALIBRATION_SEED, n: int = 24) -> str:
    share = _ct_share(spec)
    parts = {1.0: "CT slices 512²", 0.0: "1024² crops of 4096² radiographs"}.get(
        share, "CT slices 512² + 1024² crops of 4096² radiographs")
    if getattr(spec, "slices", 1) == 3 and share > 0:
        parts += " (each slice with its neighbours)"
    ct_thumbs = "thumbnails of CT slices" + (" (each with its neighbours')" if getattr(spec, "slices", 1) == 3 else "")
    what = (
        {1.0: ct_thumbs, 0.0: "thumbnails of 4096² radiographs"}.get(share, ct_thumbs + " and 4096² radiographs")
        if spec.task == "roi_classifier"
        else parts + (f" at {spec.spacing_mm:g} mm" if getattr(spec, "spacing_mm", None) else "")
    )
    return (
        f"medrt.phantom, seeds from {seed}: {n} inputs, {what}, round-robin over "
        "border-crossing, tiny (< 5 mm), faint, bright lesions and empty frames"
    )
