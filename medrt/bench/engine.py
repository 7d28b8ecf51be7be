"""Inference-engine benchmarks: ROI path vs full-frame sliding window, cold start,
UNet efficiency against the machine's sgemm, and the engine table."""

from __future__ import annotations

import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from medrt.bench import SETTLE_S, interleaved_times, percentile

__all__ = ["roi_vs_full", "cold_start", "unet_efficiency", "engine_table", "phantom_frames"]

log = logging.getLogger(__name__)

BENCH_SEED = 9500  # held out from training (1000+) and calibration (5000+)


def phantom_frames(n: int, size: int = 4096) -> list[tuple[Any, Any]]:
    """``n`` held-out radiographs with at least one nodule: (Frame, FrameTruth)."""
    from medrt.phantom import generate_radiograph
    from medrt.phantom.truth import FrameTruth

    out = []
    for i in range(n):
        p = generate_radiograph(BENCH_SEED, size=size, index=i, n_lesions=2, border_lesion=(i % 2 == 1))
        key = f"bench{i}"
        out.append((p.as_frame(key), FrameTruth.from_phantom(p, key)))
    return out


def _predictions(results: list[Any]) -> list[Any]:
    from medrt.evaluation import FramePrediction

    return [FramePrediction(r.frame.sop_instance_uid, r.lesions, r.labels) for r in results]


def roi_vs_full(analyzer: Any, n_frames: int = 4, size: int = 4096, repeats: int = 1) -> dict[str, Any]:
    """The same analyzer (models, backend) in ROI mode and in full sliding-window mode,
    frame by frame in turn: speed-up (per frame the median of ``repeats`` runs per
    mode, the modes interleaved) and lesion sensitivity of each."""
    from medrt.evaluation import evaluate

    data = phantom_frames(n_frames, size)
    truth = {f.sop_instance_uid: t for f, t in data}
    roi_res, full_res, roi_ms, full_ms = [], [], [], []
    for frame, _ in data:
        times: dict[str, list[float]] = {"roi": [], "full": []}
        for i in range(max(1, repeats)):
            for mode, res in (("roi", roi_res), ("full", full_res)):
                t0 = time.perf_counter()
                result = analyzer.analyze(frame, mode=mode)
                times[mode].append((time.perf_counter() - t0) * 1000.0)
                if i == 0:  # every run gives the same result; keep one (a 4096² label map is 32 MB)
                    res.append(result)
        roi_ms.append(statistics.median(times["roi"]))
        full_ms.append(statistics.median(times["full"]))
    rep_roi, rep_full = evaluate(_predictions(roi_res), truth), evaluate(_predictions(full_res), truth)
    return {
        "frames": n_frames, "size": size,
        "roi_ms_p50": round(percentile(roi_ms, 50), 1), "full_ms_p50": round(percentile(full_ms, 50), 1),
        "speedup": round(percentile(full_ms, 50) / percentile(roi_ms, 50), 2),
        "sensitivity_roi": rep_roi.sensitivity, "sensitivity_full": rep_full.sensitivity,
        "fp_per_frame_roi": rep_roi.fp_per_frame, "fp_per_frame_full": rep_full.fp_per_frame,
        "crops_per_frame": float(np.mean([len(r.crops) for r in roi_res])),
    }


def cold_start(config: Any, n: int = 6) -> dict[str, Any]:
    """Load time, then the first frame after load against the steady state (same frame)."""
    from medrt.analyzer import load_analyzer

    frame, _ = phantom_frames(1)[0]
    t0 = time.perf_counter()
    analyzer = load_analyzer(config)
    load_ms = (time.perf_counter() - t0) * 1000.0
    t1 = time.perf_counter()
    analyzer.analyze(frame)
    first = (time.perf_counter() - t1) * 1000.0
    steady = interleaved_times({"f": lambda: analyzer.analyze(frame)}, repeats=n, warmup=0)["f"]
    med = percentile(steady, 50)
    return {"load_ms": round(load_ms, 1), "first_ms": round(first, 1), "steady_ms_p50": round(med, 1),
            "ratio": round(first / med, 2)}


def _conv_flops(onnx_path: Path, h: int, w: int) -> float:
    """Useful multiply-adds x 2 of every Conv/ConvTranspose for a 1x1xHxW input (shape
    inference): each output (Conv) or input (ConvTranspose) pixel times the layer's
    non-zero weights. Counting non-zeros keeps a ConvTranspose rewritten as Conv +
    pixel shuffle (``medrt.engine.rewrite``, whose kernels are 9/16 zeros for a 3x3
    stride-2 layer) at the FLOPs of the original layer."""
    import onnx
    from onnx import numpy_helper, shape_inference

    model = onnx.load(str(onnx_path))
    inp = model.graph.input[0]
    dims = inp.type.tensor_type.shape.dim
    channels = dims[1].dim_value or 1  # a 2.5-D UNet takes three slices
    for d, v in zip(dims, (1, channels, h, w), strict=True):
        d.ClearField("dim_param")
        d.dim_value = v
    model = shape_inference.infer_shapes(model)
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
              for vi in list(model.graph.value_info) + list(model.graph.output) + list(model.graph.input)}
    inits = {i.name: i for i in model.graph.initializer}
    flops = 0.0
    for node in model.graph.node:
        if node.op_type not in ("Conv", "ConvTranspose") or node.input[1] not in inits:
            continue
        weight = numpy_helper.to_array(inits[node.input[1]])
        out, inshape = shapes.get(node.output[0]), shapes.get(node.input[0])
        if not out or not inshape:
            continue
        # Conv weight [Cout, Cin/g, k, k]: per output pixel (over all Cout) every weight once;
        # ConvTranspose weight [Cin, Cout/g, k, k]: each input pixel scatters every weight once.
        pixels = np.prod(out[2:] if node.op_type == "Conv" else inshape[2:]) * (out[0] or 1)
        flops += 2.0 * float(pixels) * np.count_nonzero(weight)
    return float(flops)


def sgemm_gflops(n: int = 2048, repeats: int = 5) -> float:
    """numpy/BLAS float32 matrix multiply on this machine's cores, best of ``repeats``."""
    a = np.random.default_rng(0).random((n, n), dtype=np.float32)
    b = np.random.default_rng(1).random((n, n), dtype=np.float32)
    a @ b
    best = min(interleaved_times({"mm": lambda: a @ b}, repeats=repeats, warmup=0)["mm"])
    return 2.0 * n**3 / (best / 1000.0) / 1e9


def unet_efficiency(backend: Any, size: int = 1024, repeats: int = 7) -> dict[str, Any]:
    """Achieved GFLOP/s of the UNet on a ``size``² crop against sgemm, measured in turn."""
    flops = _conv_flops(backend.spec.path, size, size)
    x = np.random.default_rng(0).random((1, backend.spec.slices, size, size), dtype=np.float32)
    a = np.random.default_rng(0).random((2048, 2048), dtype=np.float32)
    times = interleaved_times({"unet": lambda: backend.infer(x), "sgemm": lambda: a @ a}, repeats=repeats,
                              settle_s=SETTLE_S)
    unet_ms, mm_ms = percentile(times["unet"], 50), min(times["sgemm"])
    gemm = 2.0 * 2048**3 / (mm_ms / 1000.0) / 1e9
    achieved = flops / (unet_ms / 1000.0) / 1e9
    return {"model": backend.spec.ident, "size": size, "gflop": round(flops / 1e9, 2), "unet_ms_p50": round(unet_ms, 1),
            "achieved_gflops": round(achieved, 1), "sgemm_gflops": round(gemm, 1),
            "efficiency": round(achieved / gemm, 3)}


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as fp:
            return int(fp.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return float("nan")


def _settled_rss_mb() -> float:
    """RSS after Python's and glibc's free memory went back to the system, so that a
    later difference is what was allocated since (quantizing and gating a model just
    before freed ~100 MB that glibc returned only during the next measurement)."""
    import gc

    from medrt.allocator import trim

    gc.collect()
    trim()
    return _rss_mb()


def _hardware(device: str) -> str:
    """The CPU with its INT8 kernel class (INT8 rows depend on it); on a GPU row the GPU too."""
    from medrt.engine.hardware import cpu_name, int8_kernels

    cpu = f"{cpu_name()} ({int8_kernels()})"
    if device == "cpu":
        return cpu
    torch = sys.modules.get("torch")  # a GPU row's backend imported it
    gpu = torch.cuda.get_device_name(device) if torch is not None and torch.cuda.is_available() else device
    return f"{gpu}, host {cpu}"


def engine_table(spec_name: str = "lesion_unet_dx", size: int = 1024, repeats: int = 15) -> list[dict[str, Any]]:
    """p50/p99 latency at ``size``² for each backend/precision available here. INT8 on
    the CPU is the gated twin (:func:`medrt.engine.int8cache.gated_int8`); a refused one
    is a row with the gate's figures as its error.

    ``memory_mb`` is what the row's backend took: an onnxruntime session here keeps an
    arena of its own (``shared_arena=False``), given back with it. In the process's one
    arena (medrt's default) a row took only what the rows and suites before it had not
    already grown it by: ``lesion_unet_dx`` at 1024², int8 +15.9 MB after fp32 against
    +351 MB on its own; ``lesion_unet`` at 512², the table again in the same process, fp32
    +25 MB against +69 (the times: within a few per cent either way, module docstring of
    :mod:`medrt.engine.backends.onnxrt`)."""
    from medrt.engine.registry import find_spec
    from medrt.engine.select import ALLOW_LIST, create_backend, probe

    found = probe()
    spec = find_spec(spec_name)
    rows = []
    x = np.random.default_rng(0).random((1, spec.slices, size, size), dtype=np.float32)
    for entry in ALLOW_LIST:
        backend, device, precision = entry.backend, entry.device, entry.precision
        if not found.supports(backend, device):
            continue
        try:
            if (backend, device, precision) == ("onnxruntime", "cpu", "int8"):
                from medrt.engine.int8cache import gated_int8

                gated_int8(spec)  # made (or found in the cache) before the memory is counted
            before = _settled_rss_mb()
            b = create_backend(spec, backend=backend, device=device, precision=precision,
                               options={"onnxruntime": {"shared_arena": False}})
        except Exception as exc:  # a runtime that is present but unusable: report, go on
            # with its size, so that --compare matches it to the row that ran in a baseline
            rows.append({"backend": backend, "device": device, "precision": precision, "size": size,
                         "error": str(exc)})
            continue
        times = interleaved_times({"x": lambda b=b: b.infer(x)}, repeats=repeats, warmup=2)["x"]
        info = b.info()
        rows.append({"backend": info.backend, "device": info.device, "precision": info.precision,
                     "model": b.spec.ident, "size": size, "p50_ms": round(percentile(times, 50), 1),
                     "p99_ms": round(percentile(times, 99), 1), "memory_mb": round(_rss_mb() - before, 1),
                     "hardware": _hardware(info.device)})
        del b  # freed before the next row's memory is counted, not during it
    return rows


def concat_rewrite(models: tuple[tuple[str, int], ...] = (("lesion_unet_lite", 512), ("lesion_unet_dx", 1024)),
                   repeats: int = 9) -> list[dict[str, Any]]:
    """Each UNet as ONNX Runtime loads it for the CPU (skip connections as sums of
    convolutions, :func:`medrt.engine.rewrite.concat_as_sum`) against its file as it is,
    interleaved at ``size``² on the default threads: medians, the ratio, and the largest
    difference in the outputs."""
    from medrt.engine.backends.onnxrt import OnnxRuntimeBackend
    from medrt.engine.registry import find_spec

    rows = []
    for name, size in models:
        spec = find_spec(name)
        split, plain = OnnxRuntimeBackend(spec), OnnxRuntimeBackend(spec, split_concats=False)
        x = np.random.default_rng(0).random((1, spec.slices, size, size), dtype=np.float32)
        diff = max(float(np.abs(a - b).max()) for a, b in zip(split.infer(x), plain.infer(x), strict=True))
        # two sessions, two thread pools: each call waits until the other's threads stop spinning
        times = interleaved_times({"file": lambda p=plain, x=x: p.infer(x), "rewritten": lambda s=split, x=x: s.infer(x)},
                                  repeats=repeats, warmup=2, settle_s=SETTLE_S)
        file_ms, rewritten_ms = statistics.median(times["file"]), statistics.median(times["rewritten"])
        rows.append({"model": spec.ident, "size": size, "threads": split.threads, "concats": len(split.rewritten),
                     "file_ms": round(file_ms, 1), "rewritten_ms": round(rewritten_ms, 1),
                     "speedup": round(file_ms / rewritten_ms, 3), "max_abs_diff": diff})
        del split, plain
    return rows
