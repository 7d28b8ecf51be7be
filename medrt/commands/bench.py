"""``medrt bench``: measured figures, as ratios against a baseline taken in the same run."""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

log = logging.getLogger(__name__)

SUITES = ("decode", "engines", "roi_vs_full", "int8", "cold_start", "efficiency")


def _decode(args: argparse.Namespace, _: Any) -> Any:
    from medrt.bench.decode import run_decode_bench

    return run_decode_bench(size=args.size, repeats=args.repeats)


def _engines(args: argparse.Namespace, _: Any) -> Any:
    from medrt.bench.engine import engine_table

    return engine_table(args.model, repeats=max(args.repeats, 10))


def _roi_vs_full(args: argparse.Namespace, analyzer: Any) -> Any:
    from medrt.bench.engine import roi_vs_full

    return roi_vs_full(analyzer, n_frames=args.frames)


def _int8(args: argparse.Namespace, _: Any) -> Any:
    from medrt.bench.quant import int8_vs_fp32

    return int8_vs_fp32(args.model, repeats=args.repeats)


def _cold_start(args: argparse.Namespace, _: Any) -> Any:
    from medrt.analyzer import AnalyzerConfig
    from medrt.bench.engine import cold_start

    return cold_start(AnalyzerConfig(seg_model=args.model))


def _efficiency(args: argparse.Namespace, analyzer: Any) -> Any:
    from medrt.bench.engine import unet_efficiency

    return unet_efficiency(analyzer.seg, repeats=args.repeats)


RUNNERS = {"decode": _decode, "engines": _engines, "roi_vs_full": _roi_vs_full, "int8": _int8,
           "cold_start": _cold_start, "efficiency": _efficiency}
KEYS = {"roi_vs_full": "roi_vs_full", "int8": "int8_vs_fp32", "cold_start": "cold_start",
        "efficiency": "unet_efficiency", "engines": "engines", "decode": "decode"}


def _print(results: dict[str, Any]) -> None:
    for key, value in results.items():
        print(f"\n== {key}")
        if key == "decode":
            for row in value["rows"]:
                print(f"  {row['syntax']:<28} pydicom {row['pydicom_ms']:8.1f} ms   medrt {row['medrt_ms']:8.1f} ms"
                      f"   ratio {row['ratio']:.2f}x")
        elif isinstance(value, list):
            for row in value:
                print("  " + ", ".join(f"{k}={v}" for k, v in row.items()))
        else:
            print("  " + ", ".join(f"{k}={v}" for k, v in value.items()))


def run(args: argparse.Namespace) -> int:
    suites = [s for s in (args.only.split(",") if args.only else SUITES) if s]
    unknown = [s for s in suites if s not in RUNNERS]
    if unknown:
        print(f"medrt bench: unknown suite(s) {unknown}; choose from {', '.join(SUITES)}")
        return 2
    analyzer = None
    if any(s in ("roi_vs_full", "efficiency") for s in suites):
        from medrt.analyzer import load_analyzer

        analyzer = load_analyzer(seg_model=args.model, recheck=not args.no_recheck)
    results: dict[str, Any] = {}
    for suite in suites:
        log.info("bench suite %s", suite)
        results[KEYS[suite]] = RUNNERS[suite](args, analyzer)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        _print(results)
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "bench",
        help="benchmarks, measured as ratios in one run",
        description="Benchmarks measured side by side in one run (medians over repeats). Suites: "
        "decode (read_frames vs pydicom pixel_array), engines (latency per backend/precision), "
        "roi_vs_full (ROI path vs full-frame sliding window on 4096² phantoms), int8 (INT8 vs FP32 "
        "with the accuracy gate), cold_start (first frame vs steady state), efficiency (UNet GFLOP/s "
        "vs sgemm).",
    )
    p.add_argument("--only", default="", help=f"comma-separated suites (default: all of {', '.join(SUITES)})")
    p.add_argument("--model", default="lesion_unet", help="segmentation model for the engine suites")
    p.add_argument("--size", type=int, default=4096, help="frame size for the decode suite")
    p.add_argument("--frames", type=int, default=4, help="4096² frames for roi_vs_full")
    p.add_argument("--repeats", type=int, default=9, help="repeats per measurement (median is reported)")
    p.add_argument("--no-recheck", action="store_true", help="roi_vs_full without the 2x recheck")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)
