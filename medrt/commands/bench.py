"""``medrt bench``: measured figures, as ratios against a baseline taken in the same run."""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SUITES = ("decode", "engines", "graph", "roi_vs_full", "pipelined", "stream", "int8", "cold_start", "efficiency",
          "listener", "listener_memory", "ray", "series_outputs")
#: ``--frames`` of each suite that takes it, when not given
DEFAULT_FRAMES = {"roi_vs_full": 4, "series_outputs": 300}


def _decode(args: argparse.Namespace, _: Any) -> Any:
    from medrt.bench.decode import run_decode_bench

    return run_decode_bench(size=args.size, repeats=args.repeats)


def _engines(args: argparse.Namespace, _: Any) -> Any:
    from medrt.bench.engine import engine_table

    return engine_table(args.model, repeats=max(args.repeats, 10))


def _graph(args: argparse.Namespace, _: Any) -> Any:
    from medrt.bench.engine import concat_rewrite

    return concat_rewrite(repeats=args.repeats)


def _roi_vs_full(args: argparse.Namespace, analyzer: Any) -> Any:
    from medrt.bench.engine import roi_vs_full

    return roi_vs_full(analyzer, n_frames=args.frames or DEFAULT_FRAMES["roi_vs_full"], repeats=args.repeats)


def _int8(args: argparse.Namespace, _: Any) -> Any:
    from medrt.bench.quant import int8_vs_fp32

    return int8_vs_fp32(args.model, repeats=args.repeats)


def _cold_start(args: argparse.Namespace, _: Any) -> Any:
    from medrt.analyzer import AnalyzerConfig
    from medrt.bench.engine import cold_start

    return cold_start(AnalyzerConfig(seg_model=args.model, precision=args.precision))


def _efficiency(args: argparse.Namespace, analyzer: Any) -> Any:
    from medrt.bench.engine import unet_efficiency

    seg = analyzer.seg
    if analyzer.precision != "fp32":  # GFLOP/s against sgemm is an FP32 figure
        from medrt.engine.backends.onnxrt import OnnxRuntimeBackend
        from medrt.engine.registry import find_spec

        seg = OnnxRuntimeBackend(find_spec(args.model))
    return unet_efficiency(seg, repeats=args.repeats)


def _pipelined(args: argparse.Namespace, _: Any) -> Any:
    from medrt.bench.pipeline import pipelined_vs_serial

    return pipelined_vs_serial(args.stream_model, folder=args.stream_folder, loops=args.stream_loops,
                               repeats=max(1, args.repeats // 3), precision=args.precision)


def _stream(args: argparse.Namespace, _: Any) -> Any:
    from medrt.bench.pipeline import stream_replay

    return stream_replay(args.stream_model, folder=args.stream_folder, fps=args.fps, frames=args.stream_frames,
                         precision=args.precision)


def _listener(args: argparse.Namespace, _: Any) -> Any:
    from medrt.bench.pacs import listener_vs_batch

    return listener_vs_batch(repeats=max(1, args.repeats // 3))


def _listener_memory(args: argparse.Namespace, _: Any) -> Any:
    from medrt.bench.pacs import listener_memory

    return listener_memory(series=args.series)


def _ray(args: argparse.Namespace, _: Any) -> Any:
    from medrt.distributed import ray_available

    if not ray_available():  # the ray extra is optional: say so rather than fail the other suites
        return {"skipped": "Ray is not installed: pip install 'medrt[ray]'"}
    from medrt.bench.cluster import ray_vs_local

    return ray_vs_local(repeats=max(1, args.repeats // 9))


def _series_outputs(args: argparse.Namespace, _: Any) -> Any:
    from medrt.bench.outputs import series_outputs

    return series_outputs(frames=args.frames or DEFAULT_FRAMES["series_outputs"], repeats=max(1, args.repeats // 3))


RUNNERS = {"decode": _decode, "engines": _engines, "graph": _graph, "roi_vs_full": _roi_vs_full, "int8": _int8,
           "cold_start": _cold_start, "efficiency": _efficiency, "pipelined": _pipelined, "stream": _stream,
           "listener": _listener, "listener_memory": _listener_memory, "ray": _ray, "series_outputs": _series_outputs}
KEYS = {"roi_vs_full": "roi_vs_full", "int8": "int8_vs_fp32", "cold_start": "cold_start",
        "efficiency": "unet_efficiency", "engines": "engines", "graph": "concat_as_sum", "decode": "decode",
        "pipelined": "pipelined_vs_serial", "stream": "stream_30fps", "listener": "listener_vs_batch",
        "listener_memory": "listener_memory", "ray": "ray_vs_local", "series_outputs": "series_outputs"}


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
    if "listener_memory" in suites and args.series < 3:
        print(f"medrt bench: --series must be at least 3 (2 warm up), got {args.series}", file=sys.stderr)
        return 2
    if args.stream_folder is not None and any(s in ("pipelined", "stream") for s in suites):
        # a folder that is not there or holds no image is refused before any suite runs
        from medrt.bench.pipeline import stream_files

        try:
            stream_files(args.stream_folder)
        except FileNotFoundError as exc:
            print(f"medrt bench: --stream-folder {exc}", file=sys.stderr)
            return 2
    baseline = None
    if args.compare:  # refused before the (minutes of) benchmarks, not after them
        from medrt.bench.compare import load_bench_json

        if not (math.isfinite(args.tolerance) and args.tolerance >= 0):
            print(f"medrt bench: --tolerance must be >= 0 (0.15 = 15 %), got {args.tolerance}", file=sys.stderr)
            return 2
        try:
            baseline = load_bench_json(args.compare, suites=[KEYS[s] for s in suites])
        except ValueError as exc:
            print(f"medrt bench: {exc}", file=sys.stderr)
            return 2
    analyzer = None
    if any(s in ("roi_vs_full", "efficiency") for s in suites):
        from medrt.analyzer import load_analyzer

        analyzer = load_analyzer(seg_model=args.model, recheck=not args.no_recheck, precision=args.precision)
    results: dict[str, Any] = {}
    for suite in suites:
        log.info("bench suite %s", suite)
        results[KEYS[suite]] = RUNNERS[suite](args, analyzer)
    if args.profile_layers:
        from medrt.bench.profile import format_graph, format_profile, profile_layers

        size = args.profile_size
        profile = profile_layers(args.model, shape=(size, size), runs=max(3, args.repeats // 2))
        results["profile_layers"] = profile
        results["profile_graph"] = profile.graph  # which graph ran: the session's, rewritten or not
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        _print({k: v for k, v in results.items() if k not in ("profile_layers", "profile_graph")})
        if "profile_layers" in results:
            print(f"\n== slowest nodes of {args.model} at {args.profile_size}² (ORT profiler)")
            print(format_graph(results["profile_graph"]))
            print(format_profile(results["profile_layers"]))
    if baseline is not None:
        from medrt.bench.compare import diff_bench, format_regressions

        diff = diff_bench(results, baseline, args.tolerance)
        print(format_regressions(diff), file=sys.stderr if args.json else sys.stdout)
        if not diff.ok:
            return 1
    return 0


def _frames(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "bench",
        help="benchmarks, measured as ratios in one run",
        description="Benchmarks measured side by side in one run (medians over repeats). Suites: "
        "decode (read_frames vs pydicom pixel_array), engines (latency per backend/precision), graph (the "
        "UNets as ORT loads them for the CPU, skip connections as sums of convolutions, vs their files), "
        "roi_vs_full (ROI path vs full-frame sliding window on 4096² phantoms), int8 (INT8 vs FP32 "
        "with the accuracy gate), cold_start (first frame vs steady state), efficiency (UNet GFLOP/s "
        "vs sgemm), pipelined (pipelined vs serial throughput on the 512² sample stream, or --stream-folder's "
        "series), stream (sustained replay of the same at --fps: achieved fps, drops, p99), listener (the sample CT series by C-STORE into "
        "medrt listen's spool, analysed and its SEG/SR forwarded, vs medrt batch on the same files), listener_memory "
        "(medrt listen's resident memory, in a process of its own, over --series copies of the sample CT series "
        "with new UIDs sent one after another: after the warm-up and after the last, growth % and MB per series), "
        "ray (medrt batch "
        "--ray on a private cluster of this machine's cores, one worker and a worker per core, vs medrt batch on "
        "sample_dicom), series_outputs (a --frames-slice CT phantom's SEG, SR and other outputs after its last frame, "
        "stage by stage, with the ground truth as results: no model time). Exit code 1 when --compare finds a regression (a figure worse by more than "
        "--tolerance, memory also by more than 16 MB or, RSS growth, 2 points; a frame failed, or dropped, not analysed or sent late, where the baseline had none), a "
        "result that ran in the baseline and fails now (an engine that no longer loads), or a run "
        "setting that differs from the baseline's (--size, --frames, --repeats, --fps, --stream-frames, "
        "--stream-folder, the model, the core count, the pipeline's workers and depth); 2 when the baseline cannot be read or holds none of the suites run, or --stream-folder is not a folder "
        "holding DICOM images, checked before any runs.",
    )
    p.add_argument("--only", default="", help=f"comma-separated suites (default: all of {', '.join(SUITES)})")
    p.add_argument("--model", default="lesion_unet_dx",
                   help="segmentation model of the engines, int8, efficiency, roi_vs_full and cold_start suites"
                        " (default: lesion_unet_dx, the UNet the analyzer runs radiographs through)")
    p.add_argument("--size", type=int, default=4096, help="frame size for the decode suite")
    p.add_argument("--frames", type=_frames, default=None,
                   help="4096² frames for roi_vs_full (default 4); slices of the CT phantom for series_outputs "
                        "(default 300; written once into the user's cache, 1,200 slices take minutes)")
    p.add_argument("--series", type=_frames, default=12,
                   help="series sent one after another by the listener_memory suite (default 12; the first 2 warm up,"
                        " so at least 3)")
    p.add_argument("--repeats", type=int, default=9, help="repeats per measurement (median is reported)")
    p.add_argument("--no-recheck", action="store_true", help="roi_vs_full without the 2x recheck")
    p.add_argument("--precision", default="fp32", choices=("fp32", "int8"),
                   help="models of the roi_vs_full, cold_start, pipelined and stream suites (int8: the gated"
                        " INT8 twins, made on first use; 'engines' and 'int8' measure both anyway)")
    p.add_argument("--stream-model", default="lesion_unet_lite", help="segmentation model for the stream suites")
    p.add_argument("--stream-folder", type=Path, default=None, metavar="PATH",
                   help="the series the 'pipelined' and 'stream' suites replay: the images medrt batch would take "
                        "from PATH (named .dcm or not), by name (default: the 40-slice 512² sample CT stream, "
                        "sample_dicom/ct_stream); --compare takes it as a run setting")
    p.add_argument("--stream-loops", type=int, default=3, help="passes over the stream for 'pipelined'")
    p.add_argument("--stream-frames", type=_frames, default=320,
                   help="frames replayed by the 'stream' suite, exactly: the series (the 40-slice sample, or "
                        "--stream-folder's) over and over, the last pass cut short (default 320, eight passes of "
                        "the sample)")
    p.add_argument("--fps", type=float, default=30.0, help="replay rate of the 'stream' suite")
    p.add_argument("--profile-layers", action="store_true",
                   help="also print the slowest model nodes (ONNX Runtime profiler) of --model, in the session "
                        "medrt runs it in (its graph as loaded: skip connections as sums of convolutions)")
    p.add_argument("--profile-size", type=int, default=1024, help="input size for --profile-layers")
    p.add_argument("--compare", metavar="BASELINE.json", default=None,
                   help="compare with an earlier 'medrt bench --json' output of the same suites and options; "
                        "flags what got slower, memory that grew and frames lost")
    p.add_argument("--tolerance", type=float, default=0.15,
                   help="relative change --compare tolerates before calling it a regression (default 0.15)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)
