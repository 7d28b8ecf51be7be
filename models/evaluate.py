"""Measure the shipped models on held-out phantoms and write their model cards.

    python -m medrt.models.evaluate --models models

Held-out frames come from seeds the training never saw (``data.HELDOUT_SEED``).
Radiographs go through the ROI path (classifier -> 1024² crops -> UNet) and over
the whole frame (sliding window, ``@full``: what the analyzer's default ``auto``
mode runs on them), which separates the classifier's misses from the UNet's; CT
slices whole (what ``auto`` runs on a frame that fits in one crop) and through the
classifier first (``@roi``: a slice it calls negative gets no UNet). The
UNet gets the frame's pixel spacing, so a model whose spec names one runs at it
(radiographs area-averaged, ``medrt.analysis.resample``). Each UNet is scored
without and with the multi-scale recheck of small lesions (``+recheck``), which on
radiographs is the fine sweep at twice the UNet's scale in place of the first pass
and the recheck (``medrt.analysis.sweep``), as the analyzer runs it. The figures written into
each card are the ones measured here, on this machine.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from medrt.analysis.lesions import lesions_from_probability
from medrt.analysis.roi import classify
from medrt.analysis.segment import segment_crops, sliding_window
from medrt.analysis.slices import phantom_input, phantom_sides
from medrt.analyzer import Analyzer, AnalyzerConfig, Work, fits_one_crop, pick_for_modality
from medrt.bench import interleaved_medians
from medrt.engine.backends.onnxrt import OnnxRuntimeBackend
from medrt.engine.registry import load_spec
from medrt.evaluation import FramePrediction, evaluate
from medrt.models import data as phantom_data
from medrt.phantom import generate_ct_series, generate_radiograph
from medrt.phantom.truth import FrameTruth
from medrt.types import StageTimings

log = logging.getLogger("medrt.models.evaluate")
_DEFAULTS = AnalyzerConfig()  # the analyzer as shipped: its crop size, recheck, sweep and least length


@dataclass
class RoiStats:
    """One ROI classifier's figures on one modality."""

    covered: int = 0
    lesions: int = 0
    negatives: int = 0
    negatives_called_negative: int = 0
    positives: int = 0
    positives_called_positive: int = 0
    crops: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "lesions": self.lesions, "covered": self.covered, "coverage": self.covered / max(self.lesions, 1),
            "negative_frames": self.negatives,
            "specificity": self.negatives_called_negative / max(self.negatives, 1),
            "negatives_called_negative": self.negatives_called_negative,
            "positive_frames": self.positives,
            "frame_sensitivity": self.positives_called_positive / max(self.positives, 1),
            "mean_crops": float(np.mean(self.crops)) if self.crops else 0.0,
        }


@dataclass
class Collected:
    preds: dict[str, list[FramePrediction]] = field(default_factory=dict)
    truth: dict[str, FrameTruth] = field(default_factory=dict)
    roi: dict[str, RoiStats] = field(default_factory=dict)  # per ROI classifier
    routed: str = ""  # the classifier the analyzer picks for this modality


def _truth(key: str, frame: Any) -> FrameTruth:
    return FrameTruth.from_phantom(frame, key)


def _inside(bbox: tuple[int, int, int, int], crop: tuple[int, int, int, int]) -> bool:
    return bbox[0] >= crop[0] and bbox[1] >= crop[1] and bbox[2] <= crop[2] and bbox[3] <= crop[3]


def _predict(col: Collected, analyzer: Analyzer, key: str, name: str, unet: Any, norm: np.ndarray, prob: np.ndarray,
             frame: Any, with_recheck: bool, crops: Any = None) -> None:
    """The UNet's findings from its first-pass ``prob``, and with ``with_recheck`` also
    what the analyzer makes of that pass (:meth:`medrt.analyzer.Analyzer.refine` and
    ``finish``: the recheck, or for a frame much finer than the UNet, a radiograph, the
    fine sweep over ``crops`` (None: the whole frame) in its place; lesions from the
    analyzer's least length)."""
    labels, lesions = lesions_from_probability(prob, frame.spacing_mm, analyzer.threshold_for(unet))
    col.preds.setdefault(name, []).append(FramePrediction(key=key, lesions=tuple(lesions), labels=labels))
    if with_recheck:
        work = Work(frame=frame.as_frame(key), norm=norm, mode="full" if crops is None else "roi", recheck=True,
                    timings=StageTimings(), seg=unet, crops=tuple(crops or ()), prob=prob)
        result = analyzer.finish(analyzer.refine(work))
        col.preds.setdefault(f"{name}+recheck", []).append(
            FramePrediction(key=key, lesions=result.lesions, labels=result.labels))


def _frame(col: Collected, analyzer: Analyzer, key: str, frame: Any, rois: dict[str, Any], unets: dict[str, Any],
           full: bool = False, with_recheck: bool = True, series: Any = ()) -> None:
    """Every ROI classifier scored on the frame; the UNets run on the crops of the one
    the analyzer routes this modality to (:func:`medrt.engine.routing.pick_for_modality`).
    A 2.5-D UNet gets the frame's neighbours in ``series`` (its CT series, in order)."""
    truth = _truth(key, frame)
    col.truth[key] = truth
    routed = pick_for_modality(list(rois.values()), frame.modality)
    if routed is None:
        raise ValueError(f"{key}: none of the ROI classifiers {list(rois)} is for {frame.modality} frames")
    col.routed = routed.spec.name
    scored = truth.scored_lesions
    used: Any = None
    sides = phantom_sides(frame, series) if series else (None, None)  # for a 2.5-D classifier
    for name, model in rois.items():
        roi = classify(model, frame.pixels, frame.window, neighbours=sides)
        st = col.roi.setdefault(name, RoiStats())
        if scored:
            st.positives += 1
            st.positives_called_positive += int(not roi.negative)
        else:
            st.negatives += 1
            st.negatives_called_negative += int(roi.negative)
        for les in scored:
            st.lesions += 1
            st.covered += int(any(_inside(les.bbox, c) for c in roi.crops))
        st.crops.append(len(roi.crops))
        if model is routed:
            used = roi
    rows, cols = frame.shape
    inputs: dict[tuple, np.ndarray] = {}
    for name, unet in unets.items():
        slices, window = getattr(unet.spec, "slices", 1), unet.spec.own_window
        if (slices, window) not in inputs:
            inputs[slices, window] = phantom_input(frame, series, slices, window)
        norm = inputs[slices, window]
        if used.crops:
            prob = segment_crops(unet, norm, used.crops, spacing_mm=frame.spacing_mm)
        else:
            prob = np.zeros((rows, cols), np.float32)
        if fits_one_crop((rows, cols), _DEFAULTS.crop):
            # A frame that fits in one crop (a CT slice): the analyzer's auto mode runs it
            # whole (Analyzer.mode_for); the classifier's path is scored beside it (@roi).
            _predict(col, analyzer, key, f"{name}@roi", unet, norm, prob, frame, with_recheck)
            prob = segment_crops(unet, norm, ((0, 0, rows, cols),), spacing_mm=frame.spacing_mm)
            _predict(col, analyzer, key, name, unet, norm, prob, frame, with_recheck)
            continue
        _predict(col, analyzer, key, name, unet, norm, prob, frame, with_recheck, crops=used.crops)
        if full:
            prob = sliding_window(unet, norm, roi=1024, spacing_mm=frame.spacing_mm)
            _predict(col, analyzer, key, f"{name}@full", unet, norm, prob, frame, with_recheck)


def collect(models: Path, n_dx: int, n_ct: int, *, unets: tuple[str, ...] = ("lesion_unet", "lesion_unet_dx", "lesion_unet_lite"),
            rois: tuple[str, ...] = phantom_data.ROI_MODELS,
            seed: int = phantom_data.HELDOUT_SEED) -> tuple[Collected, Collected, dict[str, Any]]:
    roi_models = {name: OnnxRuntimeBackend(load_spec(models / f"{name}.toml")) for name in rois}
    nets = {name: OnnxRuntimeBackend(load_spec(models / f"{name}.toml")) for name in unets}
    # the shipped analyzer's stages over these backends (each frame names its UNet)
    analyzer = Analyzer(_DEFAULTS, list(roi_models.values()), list(nets.values()))
    dx, ct = Collected(), Collected()
    t0 = time.perf_counter()
    for i in range(n_dx):
        frame = generate_radiograph(seed, size=4096, index=i)
        _frame(dx, analyzer, f"dx{i}", frame, roi_models, nets, full=True)
    for s in range(n_ct):
        series = generate_ct_series(seed + 100 + s, n_frames=40)
        for frame in series:
            _frame(ct, analyzer, f"ct{s}_{frame.index}", frame, roi_models, nets, series=series)
    log.info("inference on seeds from %d took %.0f s", seed, time.perf_counter() - t0)
    return dx, ct, {**roi_models, **nets}


def latency(backends: dict[str, Any], repeats: int = 7) -> dict[str, dict[str, float]]:
    """Median ORT CPU latency per input size; a 1024² radiograph crop at 0.125 mm is a
    256² input for a 0.5 mm UNet, a 4096² radiograph a 1024² one."""
    out: dict[str, dict[str, float]] = {}
    rng = np.random.default_rng(0)
    for name, b in backends.items():
        channels = getattr(b.spec, "slices", 1)  # a 2.5-D UNet takes three slices
        inputs = {s: rng.random((1, channels, s, s), dtype=np.float32) for s in (256, 512, 1024)}
        # The inputs are made beforehand: drawing 1024² random numbers inside the timed
        # call added ~5 ms to the model's time.
        funcs = {f"{s}": (lambda x=x, b=b: b.infer(x)) for s, x in inputs.items()}
        out[name] = {k: round(v, 1) for k, v in interleaved_medians(funcs, repeats=repeats).items()}
    return out


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m medrt.models.evaluate`` (tests/test_docs_commands.py parses the
    docs' commands with it)."""
    p = argparse.ArgumentParser(prog="python -m medrt.models.evaluate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="models")
    # 160 radiographs and 12 series: at the first cards' 40 and 3, a size bucket held 11-51
    # lesions, and its sensitivity's 95 % interval was 0.15-0.4 wide (fourteenth session)
    p.add_argument("--n-dx", type=int, default=160, help="held-out 4096² radiographs")
    p.add_argument("--n-ct", type=int, default=12, help="held-out CT series (40 slices each)")
    p.add_argument("--unets", default="lesion_unet,lesion_unet_dx,lesion_unet_lite", help="segmentation models to score")
    p.add_argument("--json", default="", help="also write the raw figures to this file")
    p.add_argument("--no-cards", action="store_true", help="measure only: leave the cards and metrics.json alone")
    p.add_argument("--cards-from", default="", metavar="JSON",
                   help="write the cards and metrics.json from the raw figures of an earlier held-out run (its --json "
                        "file) instead of measuring again")
    p.add_argument("--seed", type=int, default=phantom_data.HELDOUT_SEED,
                   help="first phantom seed (default: the held-out one; 5000 = the validation frames used to"
                        " choose thresholds and candidates, which then never write cards)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    models = Path(args.models)
    if args.cards_from:
        results = json.loads(Path(args.cards_from).read_text(encoding="utf-8"))
        if results.get("held_out", {}).get("seed") != phantom_data.HELDOUT_SEED:
            p.error(f"{args.cards_from}: not a held-out run (cards report held-out figures only)")
        from medrt.models.cards import write_cards

        write_cards(models, results, args)
        print(json.dumps(summary(results), indent=2))
        return 0
    if args.seed != phantom_data.HELDOUT_SEED:
        args.no_cards = True  # cards report held-out figures only
    dx, ct, backends = collect(models, args.n_dx, args.n_ct, unets=tuple(args.unets.split(",")), seed=args.seed)
    results = {
        "dx": {name: scored(preds, dx.truth) for name, preds in dx.preds.items()},
        "ct": {name: scored(preds, ct.truth) for name, preds in ct.preds.items()},
        # per classifier and modality; "routed": which one the analyzer uses for each
        "roi": {name: {"dx": dx.roi.get(name, RoiStats()).to_json(), "ct": ct.roi.get(name, RoiStats()).to_json()}
                for name in {**dx.roi, **ct.roi}},  # either modality may have no frames (--n-dx 0)
        "roi_routed": {"dx": dx.routed, "ct": ct.routed},
        "latency_ms": latency(backends),
        "held_out": {"dx_frames": args.n_dx, "ct_series": args.n_ct, "seed": args.seed},
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, onnxruntime CPU",
        "date": time.strftime("%Y-%m-%d"),
    }
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    if not args.no_cards:
        from medrt.models.cards import write_cards

        write_cards(models, results, args)
    print(json.dumps(summary(results), indent=2))
    return 0


def scored(preds: list[FramePrediction], truth: dict[str, FrameTruth]) -> dict[str, Any]:
    """:func:`medrt.evaluation.evaluate`'s figures, plus lesions found per phantom contrast
    class (``by_kind``: faint / bright, as the phantom drew them), which the size buckets
    alone hide: on radiographs the faint nodules are the ones missed at every size."""
    report = evaluate(preds, truth)
    out = report.to_json()
    kinds = {key: {les.label: les.kind for les in t.lesions} for key, t in truth.items()}
    by_kind: dict[str, dict[str, int]] = {}
    for m in report.matches:
        k = by_kind.setdefault(kinds[m.key].get(m.gt_label, "?"), {"gt": 0, "detected": 0})
        k["gt"] += 1
        k["detected"] += int(m.detected)
    out["by_kind"] = dict(sorted(by_kind.items()))
    return out


def summary(results: dict[str, Any]) -> dict[str, Any]:
    """Per model and data: sensitivity per bucket, FP/frame, mean Dice; ROI coverage."""
    out: dict[str, Any] = {}
    for data in ("dx", "ct"):
        for name, r in results[data].items():
            out[f"{data} {name}"] = {
                "sens": [round(b["sensitivity"], 3) if b["sensitivity"] is not None else None for b in r["buckets"]],
                "n": [b["gt"] for b in r["buckets"]],
                "fp/frame": round(r["fp_per_frame"], 3),
                "dice": None if r["dice"]["mean"] is None else round(r["dice"]["mean"], 3),
                "by_kind": {k: f"{v['detected']}/{v['gt']}" for k, v in r.get("by_kind", {}).items()},
            }
    out["roi"] = results["roi"]
    out["roi_routed"] = results["roi_routed"]
    out["latency_ms"] = results["latency_ms"]
    return out


if __name__ == "__main__":
    raise SystemExit(main())
