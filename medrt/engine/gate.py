"""The accuracy gate: a reduced-precision model is refused when it loses accuracy.

``compare`` runs the FP32 model and its reduced twin (INT8, FP16, ...) on the same
held-out phantom frames, through the same analysis path, and scores both with
:func:`medrt.evaluation.evaluate`: lesion sensitivity and mean Dice. When either
drops by more than one point (0.01) the model is refused, with a message that
gives both figures (design: "a model whose Dice on the validation phantoms drops
more than 1 point is refused, with a message"). Both models' false positives are
in the message too, reported but not gated.

The validation frames come from the held-out seeds (9000 up, as
``models/evaluate.py``), never from the training (1000 up) or calibration (5000
up) ranges. By default (:data:`DEFAULT_SET`) they are about a hundred lesions per
modality, so that one lesion moves sensitivity by about one point, the limit: 6 CT
series of 40 slices and 28 radiographs of three nodules each (every other one with
a fourth across the border), generated one series or radiograph at a time (a 4096²
radiograph is 64 MB) and scored only where the model's spec lists the modality.
Until the seventeenth session the gate scored 1 series (29 lesions) and 3 or 10
radiographs (21 nodules): one lesion was 2.5-5 points, and verdicts near the limit
were one lesion's. Each frame goes through what the analyzer runs on it by default:

- CT slices (512²) go through the segmentation model on the whole slice, then the
  2× recheck of small and faint candidates and the analyzer's least reported length
  (until the seventeenth session: the first pass alone);
- 4096² radiographs, much finer than a segmenter's 0.5 mm, go through the fine
  sweep over the whole frame (the network at twice its scale, each component kept
  only when flipped views confirm it; :mod:`medrt.analysis.sweep` with the
  analyzer's settings). Until the sixteenth session they went through the ROI path's
  first pass, which the analyzer's default (``--mode auto``) has not run on
  radiographs since the tenth;
- a frame no finer than the segmenter goes through the ROI path: the ROI classifiers
  the analyzer would use plan the 1024² crops (``roi_classifier`` and
  ``roi_classifier_dx``, each frame to the one whose spec lists its modality;
  computed once, so both models see identical crops), or, where there is no
  classifier, 1024² crops around the true lesions; then the recheck as above;
- an ROI classifier under test is scored end to end instead: each variant plans
  its own crops and one shared segmentation model segments them (and rechecks them,
  as the analyzer would).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from medrt.analysis.config import AnalyzerConfig, sweep_config
from medrt.analysis.lesions import lesions_from_probability
from medrt.analysis.recheck import RecheckConfig, recheck_map
from medrt.analysis.roi import classify, plan_crops, proposals_from_boxes
from medrt.analysis.segment import segment_crops
from medrt.analysis.slices import Sides, phantom_input, phantom_sides
from medrt.analysis.sweep import SweepConfig, sweep
from medrt.engine.backends.base import Backend
from medrt.engine.backends.onnxrt import OnnxRuntimeBackend
from medrt.engine.registry import ModelError, ModelSpec, load_spec, shipped_models_dir
from medrt.engine.routing import pick_for_modality
from medrt.evaluation import FramePrediction, evaluate
from medrt.phantom.frame import PhantomFrame
from medrt.phantom.truth import FrameTruth

__all__ = [
    "LIMIT_POINTS",
    "VALIDATION_SEED",
    "DEFAULT_SET",
    "AccuracyGateError",
    "Figures",
    "GateReport",
    "GateSet",
    "compare",
    "validation_frames",
]

log = logging.getLogger(__name__)

LIMIT_POINTS = 1.0  # largest allowed drop, in points (0.01)
VALIDATION_SEED = 9000  # medrt.models.data.HELDOUT_SEED: frames no model was trained or calibrated on
CROP = 1024
_MARGIN = 64
# The classifiers a segmentation model's radiograph crops are planned with (the
# analyzer's default --roi-model), routed per frame by their specs' modalities.
ROI_CLASSIFIERS = ("roi_classifier", "roi_classifier_dx")


@dataclass(frozen=True, slots=True)
class GateSet:
    """Which held-out phantoms the gate scores when it is given no frames."""

    ct_series: int = 6  # seeds seed+100 up, ``ct_slices`` 512² slices each
    ct_slices: int = 40
    radiographs: int = 28  # 4096², seed ``seed``, indices 0 up
    nodules: int | None = 3  # per radiograph, plus one across the border on every other (None: 0-3 drawn)
    seed: int = VALIDATION_SEED

    def groups(self, modalities: set[str]) -> Iterator[tuple[PhantomFrame, ...]]:
        """One CT series or one radiograph at a time, only of ``modalities`` (all when empty)."""
        # here, not at the top: the analyzer imports this module for AccuracyGateError, and the
        # generators bring SimpleITK (~145 MB) into every process that analyses
        from medrt.phantom.ct import generate_ct_series
        from medrt.phantom.xray import generate_radiograph

        if not modalities or "CT" in modalities:
            for s in range(self.ct_series):
                yield tuple(generate_ct_series(self.seed + 100 + s, n_frames=self.ct_slices))
        if not modalities or modalities & {"DX", "CR"}:
            for i in range(self.radiographs):
                yield (generate_radiograph(self.seed, size=4096, index=i, n_lesions=self.nodules,
                                           border_lesion=i % 2 == 1),)


# About a hundred lesions per modality (119 CT lesion sections, 98 nodules): one lesion is
# about one point, the limit.
DEFAULT_SET = GateSet()


class AccuracyGateError(ModelError):
    """A reduced-precision model lost more accuracy than the gate allows."""


@dataclass(frozen=True, slots=True)
class Figures:
    """Lesion sensitivity and mean Dice (fractions; for ``drop_points``, points)."""

    sensitivity: float
    dice: float


@dataclass(frozen=True, slots=True)
class GateReport:
    """Both models' figures on the validation phantoms, and the verdict."""

    passed: bool
    model: str
    precision: str
    fp32: Figures
    reduced: Figures
    drop_points: Figures  # fp32 minus reduced, in points; positive is a loss
    limit_points: float
    frames: int
    lesions: int
    seconds: float
    message: str
    # FP32's and the twin's false positives on the same frames: reported in the message,
    # not gated (the limit is on sensitivity and Dice), so a twin that marks more is seen
    false_positives: tuple[int, int] = (0, 0)

    def enforce(self) -> None:
        """Raise :class:`AccuracyGateError` (with the figures) unless the model passed."""
        if not self.passed:
            raise AccuracyGateError(self.message)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _truth(key: str, frame: PhantomFrame) -> FrameTruth:
    return FrameTruth.from_phantom(frame, key)


def _key(frame: PhantomFrame) -> str:
    return f"{frame.kind}{frame.seed}_{frame.index}"


@functools.lru_cache(maxsize=2)
def _frames(seed: int, n_ct_series: int, ct_slices: int, n_dx: int) -> tuple[PhantomFrame, ...]:
    chosen = GateSet(ct_series=n_ct_series, ct_slices=ct_slices, radiographs=n_dx, nodules=None, seed=seed)
    return tuple(f for group in chosen.groups(set()) for f in group)


def _analyzer_defaults() -> tuple[SweepConfig | None, RecheckConfig | None, float]:
    """What the analyzer's defaults run, which the gate scores: the fine sweep and the
    recheck (None: configured off), and the least reported length in mm."""
    config = AnalyzerConfig()
    return sweep_config(config), (config.recheck_config if config.recheck else None), config.min_diameter_mm


def validation_frames(
    *, seed: int = VALIDATION_SEED, n_ct_series: int = 1, ct_slices: int = 40, n_dx: int = 3
) -> list[PhantomFrame]:
    """Held-out phantoms: ``n_ct_series`` CT series of ``ct_slices`` 512² slices (seeds
    ``seed+100`` up) and ``n_dx`` 4096² radiographs (seed ``seed``; every other one with
    a lesion across the border). Cached: the same arguments give the same frames."""
    return list(_frames(seed, n_ct_series, ct_slices, n_dx))


def _truth_crops(frame: PhantomFrame) -> tuple[tuple[int, int, int, int], ...]:
    """Without a classifier: 1024² crops around the true lesions (one central crop if none)."""
    rows, cols = frame.shape
    props = proposals_from_boxes([t.bbox for t in frame.lesions], frame.shape, _MARGIN)
    if not props:
        r0, c0 = max(0, (rows - CROP) // 2), max(0, (cols - CROP) // 2)
        return ((r0, c0, r0 + CROP, c0 + CROP),)
    return plan_crops(props, frame.shape, CROP)


class _Router:
    """ROI classifiers routed by modality, as the analyzer routes them
    (:func:`medrt.engine.routing.pick_for_modality`)."""

    def __init__(self, backends: Sequence[Backend]) -> None:
        self.backends = tuple(backends)

    def pick(self, frame: PhantomFrame) -> Backend | None:
        return pick_for_modality(self.backends, frame.modality)


def _plan(frame: PhantomFrame, roi: Backend | _Router | None, whole_small: bool,
          sides: Sides = (None, None)) -> tuple[tuple[int, int, int, int], ...]:
    rows, cols = frame.shape
    small = rows <= CROP and cols <= CROP
    if small and (roi is None or whole_small):
        return ((0, 0, rows, cols),)
    if isinstance(roi, _Router):
        roi = roi.pick(frame)
    if roi is None:
        return _truth_crops(frame)
    result = classify(roi, frame.pixels, frame.window, neighbours=sides)  # a 2.5-D classifier: the neighbours
    if small:
        return () if result.negative else ((0, 0, rows, cols),)
    return result.crops


def _sibling_or_shipped(spec: ModelSpec, names: Sequence[str]) -> ModelSpec | None:
    for name in names:
        for folder in (spec.spec_path.parent, shipped_models_dir()):
            path = folder / f"{name}.toml"
            if path.is_file() and path.resolve() != spec.spec_path:
                try:
                    return load_spec(path)
                except ModelError as exc:
                    log.warning("gate: cannot use %s (%s)", path, exc)
    return None


def _default_segmenter(fp32_spec: ModelSpec, seen: set[str]) -> ModelSpec | None:
    """The segmenter an ROI classifier's crops are scored with: ``lesion_unet_lite``,
    ``lesion_unet_dx`` or ``lesion_unet`` beside it, else shipped, the first made for
    every modality in ``seen``."""
    candidates = (_sibling_or_shipped(fp32_spec, (n,)) for n in ("lesion_unet_lite", "lesion_unet_dx", "lesion_unet"))
    return next((c for c in candidates if c is not None and (not c.modalities or seen <= set(c.modalities))), None)


def _default_classifiers(fp32_spec: ModelSpec) -> list[ModelSpec]:
    """The ROI classifiers that plan a segmenter's crops: :data:`ROI_CLASSIFIERS` beside
    it, else shipped."""
    found = [_sibling_or_shipped(fp32_spec, (name,)) for name in ROI_CLASSIFIERS]
    return [r for r in found if r is not None]


def default_partners(fp32_spec: ModelSpec) -> tuple[ModelSpec, ...]:
    """The other models :func:`compare` scores ``fp32_spec`` with on its default frames:
    for an ROI classifier the segmenter of its crops, for a segmenter the ROI classifiers
    that plan them. Its verdict depends on their files too, so the INT8 cache keys a
    twin by them (:func:`medrt.engine.int8cache.cache_folder`): a new segmenter beside a
    classifier gates the classifier again."""
    if fp32_spec.task == "roi_classifier":
        seg = _default_segmenter(fp32_spec, set(fp32_spec.modalities) or {"CT", "DX"})
        return (seg,) if seg is not None else ()
    return tuple(_default_classifiers(fp32_spec))


def _precision(reduced: ModelSpec) -> str:
    return reduced.version.rsplit("+", 1)[1] if "+" in reduced.version else "reduced"


def _message(model: str, precision: str, fp32: Figures, red: Figures, drop: Figures, limit: float, ok: bool) -> str:
    def change(points: float) -> str:
        return "+0.0" if abs(points) < 0.05 else f"{-points:+.1f}"

    figures = (
        f"Dice {fp32.dice:.3f} -> {red.dice:.3f} ({change(drop.dice)} points), "
        f"sensitivity {fp32.sensitivity:.3f} -> {red.sensitivity:.3f} ({change(drop.sensitivity)} points)"
    )
    limit_text = f"{limit:g} point" + ("" if limit == 1 else "s")
    if ok:
        return f"{model} {precision} accepted: {figures}; within the limit of {limit_text}"
    return f"{model} {precision} refused: {figures}; the limit is {limit_text}"


def _findings(seg: Backend, norm: np.ndarray, prob: np.ndarray, spacing: tuple[float, float] | None,
              threshold: float, rechecking: RecheckConfig | None, least_mm: float) -> tuple[np.ndarray, list[Any]]:
    """Labels and lesions from a first-pass map, as the analyzer's ``finish`` makes them:
    after the 2× recheck (``rechecking``; None: off), from ``least_mm`` long."""
    rechecked = None
    if rechecking is not None and prob.any():
        prob, rechecked, _ = recheck_map(seg, norm, prob, spacing, threshold, rechecking)
    return lesions_from_probability(prob, spacing, threshold, rechecked_mask=rechecked, min_diameter_mm=least_mm)


def compare(
    fp32_spec: ModelSpec,
    reduced_spec: ModelSpec,
    *,
    frames: Sequence[PhantomFrame] | None = None,
    roi_spec: ModelSpec | Sequence[ModelSpec] | None = None,
    segmenter_spec: ModelSpec | None = None,
    limit_points: float = LIMIT_POINTS,
    threads: int | None = None,
) -> GateReport:
    """Score ``fp32_spec`` and ``reduced_spec`` on the same validation frames; see the module doc.

    ``frames`` defaults to :data:`DEFAULT_SET`, generated a series or a radiograph at a
    time. For a segmentation model,
    ``roi_spec`` plans the radiograph crops (one spec, or several routed by modality as
    the analyzer routes them; default: ``roi_classifier`` and ``roi_classifier_dx``
    next to the FP32 spec, else the shipped ones, else crops around the true lesions). For an
    ROI classifier, ``segmenter_spec`` segments the crops (default: ``lesion_unet_lite``,
    ``lesion_unet_dx`` or ``lesion_unet``, found the same way, the first made for every
    modality scored: the segmenter the analyzer pairs it with).

    Only frames of the modalities the model's spec lists are scored (all when it
    lists none): the analyzer never runs a CT-only model on a radiograph.
    """
    if fp32_spec.task != reduced_spec.task:
        raise ModelError(f"cannot compare a {fp32_spec.task} with a {reduced_spec.task}")
    t0 = time.perf_counter()
    made_for = set(fp32_spec.modalities)
    if frames is None:
        if made_for and not made_for & {"CT", "DX", "CR"}:  # the phantoms are CT slices and radiographs
            raise ModelError(f"no validation frame of {sorted(made_for)} for {fp32_spec.ident}: nothing to compare on")
        groups: Iterator[Sequence[PhantomFrame]] | list[Sequence[PhantomFrame]] = DEFAULT_SET.groups(made_for)
        seen = made_for or {"CT", "DX"}
    else:
        frames = [f for f in frames if not made_for or f.modality in made_for]
        if not frames:
            raise ModelError(f"no validation frame of {sorted(made_for)} for {fp32_spec.ident}: nothing to compare on")
        groups, seen = [frames], {f.modality for f in frames}
    variants = {"fp32": OnnxRuntimeBackend(fp32_spec, threads=threads),
                "reduced": OnnxRuntimeBackend(reduced_spec, threads=threads)}  # fmt: skip
    if fp32_spec.task == "roi_classifier":
        seg_spec = segmenter_spec or _default_segmenter(fp32_spec, seen)
        if seg_spec is None:
            raise ModelError("the gate of an ROI classifier needs a segmentation model (lesion_unet[_lite])")
        shared = OnnxRuntimeBackend(seg_spec, threads=threads)
        rois: dict[str, Backend | _Router | None] = dict(variants)
        segs: dict[str, Backend] = {k: shared for k in variants}
    else:
        if roi_spec is None:
            roi_specs = _default_classifiers(fp32_spec)
        else:
            roi_specs = [roi_spec] if isinstance(roi_spec, ModelSpec) else list(roi_spec)
        if not roi_specs:
            log.info("gate: no roi_classifier; radiograph crops are planned around the true lesions")
        router = _Router([OnnxRuntimeBackend(r, threads=threads) for r in roi_specs])
        rois = {k: router if roi_specs else None for k in variants}
        segs = dict(variants)
    testing_roi = fp32_spec.task == "roi_classifier"
    whole_small = not testing_roi
    default_sweep, rechecking, least_mm = _analyzer_defaults()
    fine = None if testing_roi else default_sweep
    preds: dict[str, list[FramePrediction]] = {k: [] for k in variants}
    truth: dict[str, FrameTruth] = {}
    slices = max(getattr(s.spec, "slices", 1) for s in segs.values())
    window = segs["fp32"].spec.own_window  # None: each frame's VOI window
    n_frames = 0
    for group in groups:  # a CT series (its slices are each other's neighbours) or a radiograph
        by_index = {(f.kind, f.seed, f.index): f for f in group}
        for frame in group:
            n_frames += 1
            key = _key(frame)
            truth[key] = _truth(key, frame)
            norm = phantom_input(frame, by_index, slices, window)  # a 2.5-D model gets the neighbouring slices
            sides = phantom_sides(frame, by_index)
            shared_plan = None  # a segmenter's crops: planned once, when first needed (a swept radiograph needs none)
            for name in variants:
                seg = segs[name]
                threshold = seg.spec.thresholds.get("probability", 0.5)
                swept = sweep(seg, norm, frame.spacing_mm, threshold, fine) if fine is not None else None
                if swept is not None:  # a radiograph: the whole frame, swept, as the analyzer runs it
                    labels, lesions = lesions_from_probability(swept.prob, frame.spacing_mm, threshold, within=swept.kept,
                                                               min_diameter_mm=fine.min_diameter_mm)
                    preds[name].append(FramePrediction(key=key, lesions=tuple(lesions), labels=labels))
                    continue
                if testing_roi:  # each variant plans its own crops
                    crops = _plan(frame, rois[name], whole_small, sides)
                else:
                    if shared_plan is None:
                        shared_plan = _plan(frame, rois["fp32"], whole_small, sides)
                    crops = shared_plan
                if crops:
                    prob = segment_crops(seg, norm, crops, spacing_mm=frame.spacing_mm)  # the model's spacing, as in use
                else:
                    prob = np.zeros(frame.shape, np.float32)
                labels, lesions = _findings(seg, norm, prob, frame.spacing_mm, threshold, rechecking, least_mm)
                preds[name].append(FramePrediction(key=key, lesions=tuple(lesions), labels=labels))
    reports = {name: evaluate(p, truth) for name, p in preds.items()}
    if reports["fp32"].gt_lesions == 0:
        raise ModelError("the validation frames hold no scored lesion: the gate cannot measure anything")
    figs = {n: Figures(r.sensitivity or 0.0, r.dice_mean or 0.0) for n, r in reports.items()}
    fp32, red = figs["fp32"], figs["reduced"]
    if fp32.sensitivity == 0.0:
        log.warning("gate: the FP32 %s finds no lesion on the validation phantoms", fp32_spec.ident)
    drop = Figures(
        round((fp32.sensitivity - red.sensitivity) * 100, 2), round((fp32.dice - red.dice) * 100, 2)
    )
    # Judged on the figures the message prints (one decimal): what is read is what was decided.
    passed = max(round(drop.sensitivity, 1), round(drop.dice, 1)) <= limit_points
    precision = _precision(reduced_spec)
    message = _message(fp32_spec.name, precision, fp32, red, drop, limit_points, passed)
    gt = reports["fp32"].gt_lesions
    fps = (reports["fp32"].false_positives, reports["reduced"].false_positives)
    message += f"; false positives {fps[0]} -> {fps[1]}, not gated ({n_frames} validation frames, {gt} lesions)"
    seconds = round(time.perf_counter() - t0, 1)
    (log.info if passed else log.warning)("gate: %s in %.1f s", message, seconds)
    return GateReport(passed, fp32_spec.name, precision, fp32, red, drop, limit_points, n_frames, gt, seconds, message,
                      fps)
