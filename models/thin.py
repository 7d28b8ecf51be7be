"""Thin-slice CT: how the 2.5-D CT UNet does on slices thinner than it learnt, with its
neighbours taken the next slice away or ``[model] neighbour_mm`` away.

    python -m medrt.models.thin --seed 9000 --series 6 --frames 120 --thickness 1

The phantoms' series have 3 or 5 mm slices, and so had the training series; a 1 mm
series is the same anatomy and lesions sampled five times as finely (its quantum noise
is not raised to a real 1 mm slice's, so this isolates what the neighbours do). Each
series is scored with the analyzer as shipped (whole slices, the recheck), once per way
of choosing the neighbours (``medrt.analysis.slices.series_neighbours``), by
``medrt.evaluation`` as ``medrt eval`` scores. Seeds as ``medrt.models.evaluate``: the
series are ``seed + 100 + i`` (9000: held out; 5000: the validation series the
neighbour distance was chosen on).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from medrt.analysis.slices import series_neighbours
from medrt.analyzer import AnalyzerConfig, load_analyzer
from medrt.evaluation import FramePrediction, evaluate
from medrt.phantom import generate_ct_series
from medrt.phantom.truth import FrameTruth


def measure(seed: int, series: int, frames: int, thickness: float, targets: list[float | None]) -> dict[str, Any]:
    analyzer = load_analyzer(AnalyzerConfig(warmup_shapes=((512, 512),)))
    preds: dict[str, list[FramePrediction]] = {str(t): [] for t in targets}
    truth: dict[str, FrameTruth] = {}
    for s in range(series):
        phantoms = generate_ct_series(seed + 100 + s, n_frames=frames, thickness_mm=thickness)
        decoded = [p.as_frame(f"thin{s}_{p.index}") for p in phantoms]
        for p, f in zip(phantoms, decoded, strict=True):
            truth[f.key] = FrameTruth.from_phantom(p, f.key)
        for t in targets:
            for f, nb in zip(decoded, series_neighbours(decoded, t), strict=True):
                r = analyzer.analyze(f, neighbours=nb)
                preds[str(t)].append(FramePrediction(f.key, r.lesions, r.labels))
    out: dict[str, Any] = {"seed": seed, "series": series, "frames": frames, "thickness_mm": thickness,
                           "model": analyzer.segs[0].spec.ident, "rows": {}}
    for t in targets:
        report = evaluate(preds[str(t)], truth)
        out["rows"][str(t)] = {
            "buckets": {b.name: [b.detected, b.gt] for b in report.buckets},
            "fp_per_slice": round(report.fp_per_frame or 0.0, 3),
            "dice": round(report.dice_mean or 0.0, 3),
        }
    return out


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m medrt.models.thin`` (tests/test_docs_commands.py parses the
    docs' commands with it)."""
    p = argparse.ArgumentParser(prog="python -m medrt.models.thin", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=9000)
    p.add_argument("--series", type=int, default=6)
    p.add_argument("--frames", type=int, default=120)
    p.add_argument("--thickness", type=float, default=1.0)
    p.add_argument("--targets", default="none,3",
                   help="neighbour distances to compare, mm; none = the next slice (default: none,3)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    targets = [None if t.strip().lower() == "none" else float(t) for t in args.targets.split(",")]
    t0 = time.perf_counter()
    out = measure(args.seed, args.series, args.frames, args.thickness, targets)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    for t, row in out["rows"].items():
        found = ", ".join(f"{name} {d}/{n}" for name, (d, n) in row["buckets"].items())
        where = "the next slice" if t == "None" else f"{float(t):g} mm away"
        print(f"{args.thickness:g} mm slices, neighbours {where}: {found}; "
              f"{row['fp_per_slice']} false positives per slice, Dice {row['dice']}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
