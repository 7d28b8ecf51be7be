"""The one inference path: Frame -> ROI classifier -> 1024² crops -> UNet -> 2× recheck -> lesions.

``load_analyzer(config)`` loads every model once, warms it up on the real input
shapes, and returns an :class:`Analyzer` whose ``analyze(frame)`` every face
(viewer, batch, listener) calls. ``mode="full"`` runs the UNet as a sliding
window over the whole frame instead: the baseline every speed claim is
measured against. ``mode="auto"`` (the default) picks one of the two per frame
(:meth:`Analyzer.mode_for`): the ROI path where it pays, which for the shipped
models' CT slices and radiographs it does not. Frames much finer than the UNet's spacing
(radiographs) are segmented at twice its scale instead, each finding checked on
flipped views (:mod:`medrt.analysis.sweep`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from medrt.analysis.config import MODES, AnalyzerConfig, sweep_config
from medrt.analysis.lesions import lesions_from_probability
from medrt.analysis.recheck import recheck_map
from medrt.analysis.resample import recheck_factors, resample_factors
from medrt.analysis.roi import classify
from medrt.analysis.segment import segment_crops, sliding_window
from medrt.analysis.slices import Neighbours, Sides, ordered_sides, slice_stack
from medrt.analysis.sweep import sweep
from medrt.engine.backends.base import Backend
from medrt.engine.registry import ModelSpec, find_spec
from medrt.engine.routing import (
    SECONDARY_CAPTURE,
    ImageKind,
    aliased,
    fits_one_crop,
    pick,
    pick_for_modality,
    route,
    routing_modality,
)
from medrt.errors import NoModelForImageError
from medrt.io.header import PROJECTION_MODALITIES, spacing_problem
from medrt.preprocess import Windowed, normalize
from medrt.types import Frame, FrameResult, RoiProposal, StageTimings

# AnalyzerConfig and the routing helpers live in medrt.analysis.config and
# medrt.engine.routing; they are re-exported here, where every face has imported them.
__all__ = [
    "MODES", "SECONDARY_CAPTURE", "AnalyzerConfig", "Analyzer", "Work", "fits_one_crop", "load_analyzer",
    "pick_for_modality", "routing_modality", "sweep_config",
]

log = logging.getLogger(__name__)


def _create(spec: ModelSpec, config: AnalyzerConfig) -> Backend:
    """The backend for ``spec``. With ``precision="int8"``, a model whose INT8 twin fails
    the accuracy gate runs in FP32 instead (one WARNING with the figures): the other
    models keep their INT8 speed, and no model runs less accurately than the gate allows."""
    from medrt.engine.gate import AccuracyGateError

    try:
        return _create_as(spec, config, config.precision)
    except AccuracyGateError as exc:
        log.warning("%s; running %s in fp32", exc, spec.ident)
        return _create_as(spec, config, "fp32")


def _create_as(spec: ModelSpec, config: AnalyzerConfig, precision: str) -> Backend:
    try:
        from medrt.engine.select import create_backend
    except ImportError:  # pragma: no cover - select is part of the package
        create_backend = None
    if create_backend is not None:
        return create_backend(spec, backend=config.backend, device=config.device, precision=precision,
                              threads=config.threads, options=config.backend_options)
    from medrt.engine.backends.onnxrt import OnnxRuntimeBackend

    return OnnxRuntimeBackend(spec, threads=config.threads)


@dataclass(frozen=True, slots=True, eq=False)
class Work:
    """One frame between the analyzer's stages: what each stage has added so far."""

    frame: Frame
    # the frame normalised by its window (for a 2.5-D model, the stack of its slices); a
    # Windowed frame, normalised only where read, for the whole-frame fine sweep
    norm: np.ndarray | Windowed
    mode: str
    recheck: bool
    timings: StageTimings
    roi: Backend | None = None  # the ROI classifier for this frame's modality (None in full mode)
    seg: Backend | None = None  # the segmenter for this frame's modality (None: the analyzer's first)
    # the head- and feet-side neighbours' pixels, for a 2.5-D ROI classifier (until it has run)
    sides: tuple[np.ndarray | None, np.ndarray | None] = (None, None)
    presence: float = 1.0
    proposals: tuple[RoiProposal, ...] = ()
    crops: tuple[tuple[int, int, int, int], ...] = ()
    prob: np.ndarray | None = None
    rechecked: np.ndarray | None = None
    # boxes holding every pixel of prob at or above the threshold, where the segment
    # stage knows them (the fine sweep's kept components): finish scans only those
    hot: tuple[tuple[int, int, int, int], ...] | None = None
    # the pixels the models see when they differ from the frame's (a shutter's border
    # filled from its edge: :func:`analysis_pixels`); None: the frame's own
    pixels: np.ndarray | None = None


def analysis_pixels(frame: Frame) -> np.ndarray:
    """The frame's pixels as the models see them: a radiograph's padded border (its
    :attr:`~medrt.types.Frame.content_box`) filled by repeating the image's edge outward.

    A black shutter or collimation border is a sharp edge no training image had, and the
    networks marked its corners as nodules (three to five false lesions of 5-23 mm per
    radiograph with a 60-300 pixel border); the display keeps the border as it is."""
    box = frame.content_box
    if box is None:
        return frame.pixels
    r0, r1, c0, c1 = box
    return np.pad(frame.pixels[r0:r1, c0:c1], ((r0, frame.rows - r1), (c0, frame.cols - c1)), mode="edge")


class Analyzer:
    """Models loaded once and warmed up.

    ``analyze(frame)`` is the serial path. The pipeline calls its four stages on
    separate worker threads instead: ``prepare`` (normalise) → ``propose`` (ROI
    classifier) → ``segment`` (UNet on the crops, then the 2× recheck) →
    ``finish`` (lesions in mm). A :class:`Work` item carries a frame between them.
    The backends are safe to call from several threads at once (ONNX Runtime
    sessions are); one stage's state lives only in its Work item.

    With several ROI classifiers, each frame goes to the first whose spec lists
    its modality, else to the first that lists none (:meth:`roi_for`); with several
    segmenters likewise (:meth:`seg_for`).
    """

    def __init__(self, config: AnalyzerConfig, roi: Backend | Sequence[Backend],
                 seg: Backend | Sequence[Backend]) -> None:
        self.config = config
        self.rois: tuple[Backend, ...] = (roi,) if not isinstance(roi, Sequence) else tuple(roi)
        if not self.rois:
            raise ValueError("an Analyzer needs at least one ROI classifier")
        self.segs: tuple[Backend, ...] = (seg,) if not isinstance(seg, Sequence) else tuple(seg)
        if not self.segs:
            raise ValueError("an Analyzer needs at least one segmentation model")
        info = self.segs[0].info()
        self.backend_name, self.precision = info.backend, info.precision
        self.models = (*(r.spec.ident for r in self.rois), *(s.spec.ident for s in self.segs))
        self._unscaled: OrderedDict[str, None] = OrderedDict()  # series already warned: no pixel spacing
        self._warned = threading.Lock()
        self.sweep_config = sweep_config(config)  # the fine sweep as this analyzer runs it

    @property
    def roi(self) -> Backend:
        """The first ROI classifier (the only one, usually)."""
        return self.rois[0]

    @property
    def seg(self) -> Backend:
        """The first segmentation model (the only one, unless several are routed by modality)."""
        return self.segs[0]

    @property
    def threshold(self) -> float:
        """The first segmenter's probability threshold (:meth:`threshold_for`)."""
        return self.threshold_for(self.segs[0])

    def threshold_for(self, seg: Backend) -> float:
        """``config.threshold`` when set, else ``seg``'s spec threshold."""
        if self.config.threshold is not None:
            return self.config.threshold
        return seg.spec.thresholds.get("probability", 0.5)

    @property
    def slices(self) -> int:
        """The most slices any model takes (3: a 2.5-D model needs neighbours)."""
        return max(m.spec.slices for m in (*self.segs, *self.rois))

    @property
    def neighbour_mm(self) -> float | None:
        """The distance of the neighbouring slices the first 2.5-D model that names one
        learnt (``[model] neighbour_mm``), or None: the next slices."""
        return next((m.spec.neighbour_mm for m in (*self.segs, *self.rois) if m.spec.neighbour_mm), None)

    def seg_for(self, frame: Frame) -> Backend:
        """The segmenter for this frame (:class:`~medrt.engine.routing.ImageKind`: its routed
        modality, body part and view): the first whose spec lists its modality and takes
        it, else the first that lists none; a :class:`~medrt.errors.NoModelForImageError`
        naming the file when none is for it (a CT-only segmenter marks dozens of false
        lesions on a radiograph, a chest one marks a knee's)."""
        chosen, reason = route(self.segs, self.kind_of(frame), self.config.strict_routing)
        if chosen is None:
            raise NoModelForImageError(frame.source.path or frame.key, reason)
        return chosen

    def roi_for(self, frame: Frame) -> Backend:
        """The ROI classifier for this frame, picked as :meth:`seg_for` picks; a
        :class:`~medrt.errors.NoModelForImageError` naming the file when none is for it."""
        chosen, reason = route(self.rois, self.kind_of(frame), self.config.strict_routing, roi=True)
        if chosen is None:
            raise NoModelForImageError(frame.source.path or frame.key, reason)
        return chosen

    def kind_of(self, frame: Frame) -> ImageKind:
        """What routes ``frame`` (:meth:`ImageKind.of_frame`), its body part read through
        the config's ``body_part_aliases``."""
        return self._aliased(ImageKind.of_frame(frame))

    def _aliased(self, kind: ImageKind) -> ImageKind:
        return aliased(kind, self.config.body_part_aliases)

    def refusal(self, modality: str | None, mode: str | None = None, sop_class_uid: str | None = None,
                image_type: Sequence[str] = (), body_part: str | None = "", view: str | None = "",
                plane: str | None = "") -> str | None:
        """Why frames of ``modality`` (and SOP class, Image Type, BodyPartExamined,
        ViewPosition and anatomical plane) would be refused (no segmenter, or in ROI mode
        no classifier, takes them), or None: lets a batch pass over a whole series before
        decoding it."""
        kind = self._aliased(ImageKind.of(modality, sop_class_uid, image_type, body_part, view, plane))
        strict = self.config.strict_routing
        _, reason = route(self.segs, kind, strict)
        if reason is None and (mode or self.config.mode) == "roi":  # auto: full
            _, reason = route(self.rois, kind, strict, roi=True)
        return reason

    def mode_for(self, frame: Frame, seg: Backend, mode: str) -> str:
        """``mode`` for this frame, with "auto" resolved: "full" when the frame is much
        finer than ``seg``'s spacing (a radiograph: the whole frame is about one network
        window there, and the ROI path would sweep only its crops), when it fits in one
        crop (a CT slice: the ROI path could only skip it), or when no ROI classifier is
        for its modality; else "roi".

        Measured (README, Models): on the held-out radiographs the whole frame with the
        fine sweep found 57 of 63 nodules, the ROI path with it 44. On the validation CT
        series the whole slices found 79 of 110 lesions at 0.156 false positives per
        slice, the ROI path 77 at 0.150 (the classifier skipped 17 % of the lesion-free
        slices and dropped 3 of 10 lung nodules), and took longer: 11.6 against 9.2 ms
        per slice, the classifier costing more than the slices it skipped saved."""
        if mode != "auto":
            return mode
        if resample_factors(frame.spacing_mm, seg.spec.spacing_mm) != (1, 1):
            return "full"
        if fits_one_crop(frame.shape, self.config.crop):
            return "full"
        return "roi" if pick(self.rois, self.kind_of(frame), self.config.strict_routing) is not None else "full"

    def sweeps_whole(self, frame: Frame, seg: Backend, mode: str, recheck: bool) -> bool:
        """Whether :meth:`segment` will run the fine sweep over the whole of ``frame`` (a
        radiograph in ``full`` mode, ``mode`` resolved): it then reads the normalised
        frame only as block means at its scale and as windows around its components, so
        :meth:`prepare` hands it a :class:`~medrt.preprocess.Windowed` frame rather than
        normalising all of it (16 Mpixel, 64 MB for a 4096² radiograph)."""
        return (mode == "full" and recheck and self.sweep_config is not None and seg.spec.slices == 1
                and recheck_factors(frame.spacing_mm, getattr(seg.spec, "spacing_mm", None)) is not None)

    def _warn_unscaled(self, frame: Frame, seg: Backend, *, anisotropic: bool = False) -> None:
        """Once per series: a frame without pixel spacing (none in the header, or one that
        cannot be a length: the warning says which) cannot be brought to the spacing
        the model was trained at, and its sizes are in pixels; a frame whose pixels are not
        square is not resampled to square ones, so the models see it stretched (an audit:
        a CT with 0.7 x 1.4 mm pixels lost its small lesions; sizes are still measured in
        mm on each axis)."""
        key = frame.series_instance_uid or frame.key
        with self._warned:  # prepare runs on several pipeline threads
            if key in self._unscaled:
                return
            self._unscaled[key] = None
            while len(self._unscaled) > 256:
                self._unscaled.popitem(last=False)
        if anisotropic:
            rows_mm, cols_mm = frame.spacing_mm  # type: ignore[misc]
            log.warning("%s: pixels are not square (%g x %g mm): %s sees the image stretched %.2f times along one "
                        "axis (it is not resampled), so its findings may be wrong (series %s)",
                        frame.source.path or frame.key, rows_mm, cols_mm, seg.spec.ident,
                        max(rows_mm, cols_mm) / min(rows_mm, cols_mm), key)
            return
        where = str(frame.source.path or frame.key)
        if frame.source.number_of_frames > 1:
            where += f", frame {frame.frame_index + 1} of {frame.source.number_of_frames}"
        # a spacing the header gives that cannot be a length is not "no spacing": say which it was
        problem = spacing_problem(frame.source.dataset, frame.frame_index) if frame.source.dataset is not None else None
        log.warning("%s: %s: %s runs at the frame's own resolution, not at the %g mm it was trained at, and "
                    "lesion sizes are in pixels (series %s)", where,
                    f"no usable pixel spacing ({problem})" if problem else "no pixel spacing in the header",
                    seg.spec.ident, seg.spec.spacing_mm, key)

    def warmup(self) -> None:
        """Run the real shapes once so the first real frame is not a cold start."""
        t0 = time.perf_counter()
        for s in self.segs:
            s.warmup(list(self.config.warmup_shapes))
            self._warmup_sweep(s)
        for r in self.rois:
            r.warmup([(r.spec.thumbnail, r.spec.thumbnail)])
        _warm_measuring()
        log.info("warm-up took %.0f ms", (time.perf_counter() - t0) * 1000)

    def _warmup_sweep(self, seg: Backend) -> None:
        """The fine sweep's whole-frame window, for a model that may sweep whole
        radiographs (its spec takes projection images, or names no modality): its
        largest input. On the CPU its first run costs ORT's arena growing to it, pages
        touched for the first time: 1.1 s against 0.45 s steady for ``lesion_unet_dx``
        at 2048² on an AVX-512 EPYC, which made the first radiograph 2.5x the steady
        state's time (smaller inputs afterwards reuse the arena). Where any new input
        shape is costly (a GPU: ``Backend.few_shapes``), the flipped views too (batched,
        in their bucket sizes), each of which would cost the first radiograph cudnn's
        algorithm search and a graph capture; on the CPU a small new shape costs little."""
        cfg, spacing = self.sweep_config, getattr(seg.spec, "spacing_mm", None)
        if cfg is None or spacing is None or not self.config.recheck or seg.spec.slices != 1:
            return
        modalities = set(seg.spec.modalities)
        if seg.few_shapes or (self.config.mode != "roi" and (not modalities or modalities & PROJECTION_MODALITIES)):
            seg.warmup([(cfg.window, cfg.window)], repeats=1)
        if seg.few_shapes:
            sides = cfg.view_sides(spacing, max(1, seg.spec.multiple_of))
            seg.warmup([(h, w) for h in sides for w in sides], repeats=1, batch=len(cfg.flips))

    # -- stages -------------------------------------------------------------

    def prepare(self, frame: Frame, *, decode_ms: float = 0.0, mode: str | None = None,
                recheck_small: bool | None = None, neighbours: Neighbours | None = None) -> Work:
        """Stage 1: normalise the frame by its window (the model's own with
        ``fixed_window``). A 2.5-D segmentation model
        (``[model] slices = 3``) gets the (previous, next) slices of ``neighbours``
        beside it (:func:`medrt.analysis.slices.slice_stack`; missing ones: the frame)."""
        mode = mode or self.config.mode
        if mode not in MODES:
            raise ValueError(f'Argument "mode" must be one of {MODES}, got {mode!r}.')
        do_recheck = self.config.recheck if recheck_small is None else recheck_small
        # chosen here, so a frame no model is for is refused before any work
        seg = self.seg_for(frame)
        mode = self.mode_for(frame, seg, mode)
        roi = self.roi_for(frame) if mode == "roi" else None
        t0 = time.perf_counter()
        sides: Sides = (None, None)
        if seg.spec.slices > 1 or (roi is not None and roi.spec.slices > 1):
            sides = ordered_sides(frame, neighbours)
        if frame.spacing_mm is None and seg.spec.spacing_mm is not None:
            self._warn_unscaled(frame, seg)
        elif frame.spacing_mm is not None and max(frame.spacing_mm) > 1.1 * min(frame.spacing_mm):
            self._warn_unscaled(frame, seg, anisotropic=True)
        window = seg.spec.input_window(frame.window)  # the VOI window, or the spec's fixed one
        pixels = analysis_pixels(frame)
        if seg.spec.slices > 1:
            seen = frame if pixels is frame.pixels else replace(frame, pixels=pixels)
            norm: np.ndarray | Windowed = slice_stack(seen, sides=sides, window=window)
        elif self.sweeps_whole(frame, seg, mode, do_recheck):
            norm = Windowed(pixels, *window)  # normalised where the sweep reads it
        else:
            norm = normalize(pixels, *window)
        ms = (time.perf_counter() - t0) * 1000.0
        return Work(frame=frame, norm=norm, mode=mode, recheck=do_recheck, roi=roi, seg=seg, sides=sides,
                    timings=StageTimings(decode=decode_ms, preprocess=ms),
                    pixels=None if pixels is frame.pixels else pixels)

    def propose(self, work: Work) -> Work:
        """Stage 2: the ROI classifier on the thumbnail; a negative frame gets no crops."""
        if work.roi is None:
            return work
        t0 = time.perf_counter()
        frame = work.frame
        roi = classify(work.roi, frame.pixels if work.pixels is None else work.pixels, frame.window,
                       crop=self.config.crop,
                       max_crops=self.config.max_crops, presence_threshold=self.config.presence_threshold,
                       heatmap_threshold=self.config.heatmap_threshold, neighbours=work.sides)
        ms = (time.perf_counter() - t0) * 1000.0
        return replace(work, presence=roi.presence, proposals=roi.proposals, crops=roi.crops, sides=(None, None),
                       timings=replace(work.timings, roi=ms))

    def segment(self, work: Work) -> Work:
        """Stage 3: the UNet on each crop (or the sliding window in full mode), then the 2×
        recheck; for a frame much finer than the UNet (a radiograph), the fine sweep at
        twice its scale instead of both (:mod:`medrt.analysis.sweep`; its time counts as
        segment)."""
        t0 = time.perf_counter()
        swept = self._sweep(work)
        if swept is not None:
            ms = (time.perf_counter() - t0) * 1000.0
            return replace(swept, timings=replace(work.timings, segment=ms, recheck=0.0))
        seg = self._seg_of(work)
        spacing = work.frame.spacing_mm  # resampled to the model's training spacing where it names one
        if work.mode == "full":
            prob = sliding_window(seg, work.norm, roi=self.config.crop, overlap=self.config.overlap,
                                  spacing_mm=spacing)
        elif work.crops:
            prob = segment_crops(seg, work.norm, work.crops, spacing_mm=spacing)
        else:
            prob = None
        t1 = time.perf_counter()
        work = self._recheck(replace(work, prob=prob))
        t2 = time.perf_counter()
        return replace(work, timings=replace(work.timings, segment=(t1 - t0) * 1000.0, recheck=(t2 - t1) * 1000.0))

    def _seg_of(self, work: Work) -> Backend:
        """The segmenter :meth:`prepare` chose for ``work`` (a hand-made Work without one:
        the analyzer's first)."""
        return work.seg or self.seg

    def refine(self, work: Work) -> Work:
        """What :meth:`segment` does after its first pass, from ``work.prob`` (that pass's
        map): the fine sweep where it runs (it takes the first pass's place, so ignores
        it), else the 2× recheck. For scoring the first pass apart from what the product
        makes of it (``models/evaluate.py``, whose figures are the model cards')."""
        swept = self._sweep(work)
        return swept if swept is not None else self._recheck(work)

    def _sweep(self, work: Work) -> Work | None:
        """``work`` with the fine sweep's map, or None where the sweep does not run (no
        recheck, no sweep configured, or a frame not finer than the segmenter)."""
        if not work.recheck or self.sweep_config is None:
            return None
        seg = self._seg_of(work)
        crops = None if work.mode == "full" else work.crops
        swept = sweep(seg, work.norm, work.frame.spacing_mm, self.threshold_for(seg), self.sweep_config, crops=crops)
        if swept is None:
            return None
        log.debug("%s: fine sweep, %d flipped views", work.frame.key, swept.views)
        return replace(work, prob=swept.prob, rechecked=swept.swept, hot=swept.kept)

    def _recheck(self, work: Work) -> Work:
        """``work`` with its first-pass map rechecked at 2× (when it has a map and asks
        for the recheck)."""
        if work.prob is None or not work.recheck:
            return work
        seg = self._seg_of(work)
        prob, rechecked, runs = recheck_map(seg, work.norm, work.prob, work.frame.spacing_mm, self.threshold_for(seg),
                                            self.config.recheck_config)
        log.debug("%s: %d recheck windows", work.frame.key, runs)
        return replace(work, prob=prob, rechecked=rechecked)

    def min_diameter(self, frame: Frame, seg: Backend) -> float:
        """The shortest lesion reported on ``frame``, in its measuring unit: mm, or pixels
        without a pixel spacing. There the model reads the frame as if at the spacing it
        was trained at (it cannot be resampled: :meth:`_warn_unscaled`), so the speck filter
        reads it so too: 1.5 mm at a model's 0.5 mm is 3 pixels, not 1.5."""
        model_mm = getattr(seg.spec, "spacing_mm", None)
        if frame.spacing_mm is None and model_mm:
            return self.config.min_diameter_mm / float(model_mm)
        return self.config.min_diameter_mm

    def finish(self, work: Work) -> FrameResult:
        """Stage 4: connected components → lesions measured in mm."""
        t0 = time.perf_counter()
        frame = work.frame
        seg = self._seg_of(work)
        if work.prob is None:
            labels, lesions = np.zeros(frame.shape, np.uint16), []
        else:
            labels, lesions = lesions_from_probability(work.prob, frame.spacing_mm, self.threshold_for(seg),
                                                       rechecked_mask=work.rechecked,
                                                       min_diameter_mm=self.min_diameter(frame, seg), within=work.hot)
        labels.flags.writeable = False
        t = replace(work.timings, postprocess=(time.perf_counter() - t0) * 1000.0)
        t = replace(t, total=t.decode + t.preprocess + t.roi + t.segment + t.recheck + t.postprocess)
        models = (seg.spec.ident,) if work.roi is None else (work.roi.spec.ident, seg.spec.ident)
        return FrameResult(frame=frame, lesions=tuple(lesions), labels=labels, presence=work.presence,
                           proposals=tuple(work.proposals), crops=tuple(work.crops), mode=work.mode, timings=t,
                           backend=self.backend_name, precision=self.precision, models=models)

    def analyze(self, frame: Frame, *, decode_ms: float = 0.0, mode: str | None = None,
                recheck_small: bool | None = None, neighbours: Neighbours | None = None) -> FrameResult:
        """All four stages in turn on this thread: the serial path. ``neighbours``: the
        (previous, next) slices of ``frame``'s series, for a 2.5-D model (see :meth:`prepare`)."""
        work = self.prepare(frame, decode_ms=decode_ms, mode=mode, recheck_small=recheck_small,
                            neighbours=neighbours)
        return self.finish(self.segment(self.propose(work)))


def _warm_measuring() -> None:
    """Measure one made-up lesion, so that the first real one does not pay for what the
    measuring loads on first use: Qhull (``scipy.spatial``, imported where a large
    component's diameter is taken; ~0.2 s here) made the first radiograph after
    ``load_analyzer`` 1.3-1.6x the steady state's time."""
    rr, cc = np.ogrid[:96, :96]
    disc = ((rr - 48) ** 2 + (cc - 48) ** 2 <= 30**2).astype(np.float32)
    lesions_from_probability(disc, (0.5, 0.5), 0.5)


def load_analyzer(config: AnalyzerConfig | None = None, **overrides: object) -> Analyzer:
    """Load the models of ``config`` (verifying their sha256), create their backends once
    and warm them up. Keyword arguments override fields of ``config``."""
    config = replace(config or AnalyzerConfig(), **overrides)  # type: ignore[arg-type]
    roi_specs = [find_spec(name.strip()) for name in config.roi_model.split(",") if name.strip()]
    seg_specs = [find_spec(name.strip()) for name in config.seg_model.split(",") if name.strip()]
    if not roi_specs:
        raise ValueError(f'Argument "roi_model" names no model: {config.roi_model!r}')
    if not seg_specs:
        raise ValueError(f'Argument "seg_model" names no model: {config.seg_model!r}')
    for roi_spec in roi_specs:
        if roi_spec.task != "roi_classifier":
            raise ValueError(f"{roi_spec.spec_path}: task is {roi_spec.task!r}, not roi_classifier")
    for seg_spec in seg_specs:
        if seg_spec.task != "segmentation":
            raise ValueError(f"{seg_spec.spec_path}: task is {seg_spec.task!r}, not segmentation")
    analyzer = Analyzer(config, [_create(r, config) for r in roi_specs], [_create(s, config) for s in seg_specs])
    analyzer.warmup()
    return analyzer
