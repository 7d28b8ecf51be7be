"""Measure the shipped models on held-out phantoms and write their model cards.

    python -m medrt.models.evaluate --models models

Held-out frames come from seeds the training never saw (``data.HELDOUT_SEED``).
Radiographs go through the ROI path (classifier -> 1024² crops -> UNet); CT
slices through the classifier and then the UNet on the whole 512² slice. The
figures written into each card are the ones measured here, on this machine.
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
from medrt.analysis.segment import segment_crops
from medrt.bench import interleaved_medians
from medrt.engine.backends.onnxrt import OnnxRuntimeBackend
from medrt.engine.registry import load_spec
from medrt.evaluation import FramePrediction, evaluate
from medrt.models import data as phantom_data
from medrt.phantom import generate_ct_series, generate_radiograph
from medrt.phantom.truth import FrameTruth
from medrt.preprocess import normalize

log = logging.getLogger("medrt.models.evaluate")


@dataclass
class Collected:
    preds: dict[str, list[FramePrediction]] = field(default_factory=dict)
    truth: dict[str, FrameTruth] = field(default_factory=dict)
    covered: int = 0
    lesions: int = 0
    negatives: int = 0
    negatives_called_negative: int = 0
    positives: int = 0
    positives_called_positive: int = 0
    crops: list[int] = field(default_factory=list)


def _truth(key: str, frame: Any) -> FrameTruth:
    return FrameTruth.from_phantom(frame, key)


def _inside(bbox: tuple[int, int, int, int], crop: tuple[int, int, int, int]) -> bool:
    return bbox[0] >= crop[0] and bbox[1] >= crop[1] and bbox[2] <= crop[2] and bbox[3] <= crop[3]


def _frame(col: Collected, key: str, frame: Any, roi_model: Any, unets: dict[str, Any]) -> None:
    truth = _truth(key, frame)
    col.truth[key] = truth
    roi = classify(roi_model, frame.pixels, frame.window)
    scored = truth.scored_lesions
    if scored:
        col.positives += 1
        col.positives_called_positive += int(not roi.negative)
    else:
        col.negatives += 1
        col.negatives_called_negative += int(roi.negative)
    rows, cols = frame.shape
    for les in scored:
        col.lesions += 1
        col.covered += int(any(_inside(les.bbox, c) for c in roi.crops))
    col.crops.append(len(roi.crops))
    norm = normalize(frame.pixels, *frame.window)
    for name, unet in unets.items():
        prob = segment_crops(unet, norm, roi.crops) if roi.crops else np.zeros((rows, cols), np.float32)
        labels, lesions = lesions_from_probability(prob, frame.spacing_mm, unet.spec.thresholds.get("probability", 0.5))
        col.preds.setdefault(name, []).append(FramePrediction(key=key, lesions=tuple(lesions), labels=labels))


def collect(models: Path, n_dx: int, n_ct: int) -> tuple[Collected, Collected, dict[str, Any]]:
    roi_model = OnnxRuntimeBackend(load_spec(models / "roi_classifier.toml"))
    unet = OnnxRuntimeBackend(load_spec(models / "lesion_unet.toml"))
    lite = OnnxRuntimeBackend(load_spec(models / "lesion_unet_lite.toml"))
    dx, ct = Collected(), Collected()
    t0 = time.perf_counter()
    for i in range(n_dx):
        frame = generate_radiograph(phantom_data.HELDOUT_SEED, size=4096, index=i)
        _frame(dx, f"dx{i}", frame, roi_model, {"lesion_unet": unet})
    for s in range(n_ct):
        for frame in generate_ct_series(phantom_data.HELDOUT_SEED + 100 + s, n_frames=40):
            _frame(ct, f"ct{s}_{frame.index}", frame, roi_model, {"lesion_unet": unet, "lesion_unet_lite": lite})
    log.info("held-out inference took %.0f s", time.perf_counter() - t0)
    return dx, ct, {"roi_classifier": roi_model, "lesion_unet": unet, "lesion_unet_lite": lite}


def latency(backends: dict[str, Any], repeats: int = 7) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name, b in backends.items():
        funcs = {f"{s}": (lambda s=s, b=b: b.infer(np.random.rand(1, 1, s, s).astype(np.float32))) for s in (512, 1024)}
        out[name] = {k: round(v, 1) for k, v in interleaved_medians(funcs, repeats=repeats).items()}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m medrt.models.evaluate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="models")
    p.add_argument("--n-dx", type=int, default=24, help="held-out 4096² radiographs")
    p.add_argument("--n-ct", type=int, default=3, help="held-out CT series (40 slices each)")
    p.add_argument("--json", default="", help="also write the raw figures to this file")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    models = Path(args.models)
    dx, ct, backends = collect(models, args.n_dx, args.n_ct)
    results = {
        "dx": {name: evaluate(preds, dx.truth).to_json() for name, preds in dx.preds.items()},
        "ct": {name: evaluate(preds, ct.truth).to_json() for name, preds in ct.preds.items()},
        "roi": {
            name: {
                "lesions": c.lesions, "covered": c.covered, "coverage": c.covered / max(c.lesions, 1),
                "negative_frames": c.negatives, "specificity": c.negatives_called_negative / max(c.negatives, 1),
                "positive_frames": c.positives, "frame_sensitivity": c.positives_called_positive / max(c.positives, 1),
                "mean_crops": float(np.mean(c.crops)) if c.crops else 0.0,
            }
            for name, c in (("dx", dx), ("ct", ct))
        },
        "latency_ms": latency(backends),
        "held_out": {"dx_frames": args.n_dx, "ct_series": args.n_ct, "seed": phantom_data.HELDOUT_SEED},
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, onnxruntime CPU",
        "date": time.strftime("%Y-%m-%d"),
    }
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    from medrt.models.cards import write_cards

    write_cards(models, results, args)
    print(json.dumps({k: results[k] for k in ("roi", "latency_ms")}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
