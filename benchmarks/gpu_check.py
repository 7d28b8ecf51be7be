"""GPU check: the torch CUDA (and TensorRT) backends on the shipped models, in one short run.

On a lent CUDA machine (e.g. an H200, ~10 minutes), from the repository root::

    python3 -m pip install -q --no-deps --no-build-isolation -e . && python3 benchmarks/gpu_check.py

It installs nothing and finishes in under 5 minutes on an H200 (``--budget-s``
skips the sections that would not fit). Besides torch with CUDA it imports what
medrt's ROI path and phantoms import: numpy, SimpleITK, pydicom and MONAI (for
the UNet definition); on a machine without them, carry their wheels and install
them with ``--no-deps`` first. Results go to ``$OUT`` (default ``./gpu_out``):
``gpu_check.json`` (everything) and ``gpu_check.md`` (the tables), and a
one-screen summary is printed.

What it measures:

1. lesion_unet_dx (the radiograph UNet) on a 1024² crop with its weights resident in VRAM: fp32 vs fp16,
   contiguous vs channels_last, CUDA graph off/on; p50/p99 latency per call
   (host array in, host arrays out), VRAM held by the weights and peak VRAM, and
   the largest probability difference from fp32.
2. End to end per 4096² phantom radiograph through the ROI path (normalise, ROI
   classifier on the thumbnail, 1024² crops, UNet; decode skipped), both models
   on the torch backend, fp32 and fp16: p50/p99 over ``--frames`` frames after
   warm-up.
3. The full-frame sliding window (1024² windows, overlap 0.25) on the same
   backend, and its ratio to the ROI path. Both run the UNet at its trained 0.5 mm
   (a 0.125 mm radiograph area-averaged 4×), as the analysis does.
3b. What a user's run does: ``load_analyzer`` and ``Analyzer.analyze`` per 4096²
   frame (roi_classifier_dx, lesion_unet_dx, the fine sweep), torch on CUDA, fp32 and fp16.
3c. The same on a 512² CT series (the 2.5-D lite UNet with its neighbours), torch on
   CUDA against onnxruntime on the CPU, with the slices whose lesions differ; and a
   cProfile of the host during 3b's default run (``profile``).
4. TensorRT fp16 on 1024² crops, if ``import tensorrt`` works; onnxruntime's
   CUDA provider, if present.

Without a GPU, ``--dry-run`` runs the same code on the CPU at tiny sizes to check
the logic end to end (seconds)::

    .venv/bin/python benchmarks/gpu_check.py --dry-run
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("gpu_check")


@dataclass(frozen=True)
class Sizes:
    device: str
    frame: int
    crop: int
    frames: int
    warmup: int
    unique: int
    repeats: int
    sliding_frames: int


GPU = Sizes("cuda", 4096, 1024, 50, 5, 8, 100, 3)
DRY = Sizes("cpu", 512, 128, 4, 1, 2, 5, 1)


def _stats(ms: list[float]) -> dict[str, float]:
    a = np.asarray(ms, dtype=np.float64)
    return {"p50_ms": round(float(np.percentile(a, 50)), 3), "p99_ms": round(float(np.percentile(a, 99)), 3),
            "mean_ms": round(float(a.mean()), 3), "n": int(a.size)}


def _timed(fn: Callable[[], Any], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000.0)
    return out


def _prob(a: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-a.astype(np.float64)))


def _dice(a: np.ndarray, b: np.ndarray) -> float:
    inter, total = np.logical_and(a, b).sum(), a.sum() + b.sum()
    return 1.0 if total == 0 else float(2.0 * inter / total)


class Run:
    """Sections share the models, the frames, a time budget and the result document."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        from medrt.engine.registry import find_spec, load_spec

        self.torch = torch
        self.sizes = DRY if args.dry_run else GPU
        if args.frames:
            self.sizes = Sizes(**{**self.sizes.__dict__, "frames": args.frames})
        self.t0 = time.perf_counter()
        self.budget_s = args.budget_s
        find = (lambda n: load_spec(Path(args.models) / f"{n}.toml")) if args.models else find_spec
        # the radiograph models, as the analyzer routes 4096² DX frames
        self.unet, self.roi = find("lesion_unet_dx"), find("roi_classifier_dx")
        self.doc: dict[str, Any] = {"dry_run": args.dry_run, "sizes": self.sizes.__dict__, "skipped": []}
        self.frames: list[Any] = []
        self.crop_x: np.ndarray | None = None
        self.last_unet: Any = None  # the ROI path's UNet backend, reused by the sliding window

    def left_s(self) -> float:
        return self.budget_s - (time.perf_counter() - self.t0)

    def section(self, name: str, fn: Callable[[], Any], needs_s: float) -> None:
        if self.left_s() < needs_s:
            self.doc["skipped"].append(f"{name}: {self.left_s():.0f} s of budget left, needs ~{needs_s:.0f} s")
            log.warning("skipping %s (budget)", name)
            return
        t = time.perf_counter()
        try:
            self.doc[name] = fn()
        except Exception as exc:  # one failed section must not lose the others' results
            log.exception("%s failed", name)
            self.doc[name] = {"error": f"{type(exc).__name__}: {exc}"}
        log.info("%s done in %.1f s", name, time.perf_counter() - t)

    def free(self) -> None:
        gc.collect()
        if self.sizes.device == "cuda":
            self.torch.cuda.empty_cache()
            self.torch.cuda.reset_peak_memory_stats()

    def peak_mib(self) -> float | None:
        if self.sizes.device != "cuda":
            return None
        return round(self.torch.cuda.max_memory_allocated() / 2**20, 1)

    # ---- inputs ------------------------------------------------------------------------
    def env(self) -> dict[str, Any]:
        import medrt

        torch = self.torch
        info: dict[str, Any] = {"python": platform.python_version(), "medrt": medrt.__version__,
                                "torch": torch.__version__, "torch_cuda": torch.version.cuda,
                                "cuda_available": torch.cuda.is_available(), "cpus": os.cpu_count(),
                                "unet": self.unet.ident, "roi": self.roi.ident}
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
            info["cudnn"] = torch.backends.cudnn.version()
            info["cudnn_allow_tf32"] = torch.backends.cudnn.allow_tf32  # fp32 convs use TF32 when True
        try:
            import onnxruntime

            info["onnxruntime"] = f"{onnxruntime.__version__} {onnxruntime.get_available_providers()}"
        except ImportError:
            info["onnxruntime"] = None
        try:
            import tensorrt

            info["tensorrt"] = tensorrt.__version__
        except Exception as exc:
            info["tensorrt"] = f"absent ({type(exc).__name__})"
        try:  # what `medrt checks` says of this machine: the runtime the analysis picks, what fails
            from medrt.checks import failed, run_checks

            rows = run_checks()
            info["checks"] = {"runs_on": next(r.detail for r in rows if r.item == "analysis runs on"),
                              "failed": [f"{r.area} {r.item}: {r.detail}" for r in failed(rows)]}
        except Exception as exc:
            info["checks"] = f"did not run ({type(exc).__name__}: {exc})"
        return info

    def make_frames(self) -> dict[str, Any]:
        from medrt.phantom import generate_radiograph
        from medrt.preprocess import normalize

        s = self.sizes
        t = time.perf_counter()
        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
            self.frames = list(pool.map(lambda i: generate_radiograph(1000 + i, size=s.frame, index=i), range(s.unique)))
        # A crop around the first frame's first lesion (or the centre): real content for the UNet.
        f = self.frames[0]
        r, c = (int(v) for v in (f.lesions[0].center if f.lesions else (s.frame // 2, s.frame // 2)))
        r0 = min(max(r - s.crop // 2, 0), s.frame - s.crop)
        c0 = min(max(c - s.crop // 2, 0), s.frame - s.crop)
        norm = normalize(f.pixels, *self.unet.input_window(f.window))
        crop = norm[r0 : r0 + s.crop, c0 : c0 + s.crop]  # a radiograph is its own neighbours (2.5-D UNet)
        self.crop_x = np.ascontiguousarray(np.broadcast_to(crop, (1, self.unet.slices, *crop.shape)))
        return {"frames": len(self.frames), "size": s.frame, "seconds": round(time.perf_counter() - t, 1),
                "lesions": [len(fr.lesions) for fr in self.frames]}

    # ---- sections ----------------------------------------------------------------------
    def backend(self, spec: Any, **opts: Any) -> Any:
        from medrt.engine.backends.torch_cuda import TorchCudaBackend

        return TorchCudaBackend(spec, device=self.sizes.device, **opts)

    def unet_crop(self) -> list[dict[str, Any]]:
        s, x = self.sizes, self.crop_x
        assert x is not None
        configs = [("fp32", False, False), ("fp32", True, False), ("fp32", True, True),
                   ("fp16", False, False), ("fp16", True, False), ("fp16", True, True)]
        if s.device == "cpu":  # graphs need CUDA; half convolutions on the CPU are not the point
            configs = [c for c in configs if c[0] == "fp32" and not c[2]]
        rows, ref = [], None
        for precision, cl, graph in configs:
            self.free()
            b = self.backend(self.unet, precision=precision, channels_last=cl, cuda_graph=graph)
            b.warmup([(s.crop, s.crop)], repeats=3)
            out = b.infer(x)[0]
            ref = _prob(out) if ref is None else ref
            ms = _timed(lambda b=b: b.infer(x), s.repeats)
            p = _prob(out)
            rows.append({"precision": precision, "channels_last": cl, "cuda_graph": graph, **_stats(ms),
                         "weights_mib": round(b.vram_bytes / 2**20, 2), "peak_mib": self.peak_mib(),
                         "max_prob_diff": round(float(np.abs(p - ref).max()), 5),
                         "mask_dice_vs_fp32": round(_dice(p > 0.5, ref > 0.5), 4)})
            del b
        return rows

    def _roi_path(self, precision: str) -> dict[str, Any]:
        from medrt.analysis.roi import classify
        from medrt.analysis.segment import segment_crops
        from medrt.preprocess import normalize

        s = self.sizes
        graph = s.device == "cuda"
        roi = self.backend(self.roi, precision=precision, cuda_graph=graph)
        unet = self.backend(self.unet, precision=precision, cuda_graph=graph)
        total, t_roi, t_seg, crops = [], [], [], []
        warmup = max(s.warmup, len(self.frames))  # every frame's crop sizes seen once: steady state
        for i in range(warmup + s.frames):
            f = self.frames[i % len(self.frames)]
            t0 = time.perf_counter()
            norm = normalize(f.pixels, *self.unet.input_window(f.window))
            result = classify(roi, f.pixels, f.window, crop=s.crop)
            t1 = time.perf_counter()
            if not result.negative:  # at the model's 0.5 mm, as the analysis runs it
                segment_crops(unet, norm, result.crops, spacing_mm=f.spacing_mm)
            t2 = time.perf_counter()
            if i >= warmup:
                total.append((t2 - t0) * 1000)
                t_roi.append((t1 - t0) * 1000)
                t_seg.append((t2 - t1) * 1000)
                crops.append(len(result.crops))
        self.last_unet = unet
        return {"precision": precision, **_stats(total), "normalise+roi_p50_ms": _stats(t_roi)["p50_ms"],
                "unet_p50_ms": _stats(t_seg)["p50_ms"], "crops_mean": round(float(np.mean(crops)), 2),
                "peak_mib": self.peak_mib()}

    def roi_path(self) -> list[dict[str, Any]]:
        rows = []
        for precision in ("fp32", "fp16") if self.sizes.device == "cuda" else ("fp32",):
            self.free()
            rows.append(self._roi_path(precision))
        return rows

    def sliding(self) -> dict[str, Any]:
        from medrt.analysis.segment import sliding_window
        from medrt.preprocess import normalize

        s = self.sizes
        unet = self.last_unet or self.backend(self.unet)
        frames = self.frames[: max(1, s.sliding_frames)]
        norms = [normalize(f.pixels, *self.unet.input_window(f.window)) for f in frames]
        sliding_window(unet, norms[0], roi=s.crop, spacing_mm=frames[0].spacing_mm)  # warm-up
        ms = [t for n, f in zip(norms, frames, strict=True)
              for t in _timed(lambda n=n, f=f: sliding_window(unet, n, roi=s.crop, spacing_mm=f.spacing_mm), 1)]
        out: dict[str, Any] = {"precision": unet.precision, **_stats(ms)}
        roi_rows = [r for r in self.doc.get("roi_path", []) if isinstance(r, dict) and r.get("precision") == unet.precision]
        if roi_rows:
            out["ratio_vs_roi_path"] = round(out["p50_ms"] / roi_rows[0]["p50_ms"], 2)
        return out

    def dx_config(self, precision: str, options: dict[str, Any], **fields: Any) -> Any:
        """The analyzer settings of the radiograph rows: the radiograph models, torch on
        CUDA with ``options`` (the dry run: onnxruntime on the CPU), ``fields`` on top."""
        from medrt.analyzer import AnalyzerConfig

        cuda = self.sizes.device == "cuda"
        return AnalyzerConfig(backend="torch" if cuda else "onnxruntime", device=self.sizes.device,
                              precision=precision, roi_model=self.roi.spec_path.as_posix(),
                              seg_model=self.unet.spec_path.as_posix(), backend_options={"torch": options}, **fields)

    def analyzer(self) -> list[dict[str, Any]]:
        """What a user's run does: ``medrt.load_analyzer`` (the radiograph models, the
        recheck on) and ``Analyzer.analyze`` on each 4096² frame, decode skipped; torch
        on CUDA in fp32 and fp16 (the dry run: onnxruntime on the CPU). The default
        ``auto`` mode runs a radiograph over the whole frame with the fine sweep at
        0.25 mm (tenth session); one more row forces the ROI path (the sweep then covers
        the crops)."""
        from medrt import bands
        from medrt.analysis.sweep import SweepConfig
        from medrt.analyzer import load_analyzer

        s = self.sizes
        frames = [f.as_frame(f"gpu{i}") for i, f in enumerate(self.frames)]
        # Side by side (the band pool on; one band thread was 2.1x slower on the H200 host):
        # eager vs CUDA graphs (captured per input size, up to max_graphs), fp32 vs fp16.
        # The timed frames start after a pass over every frame, so the rows are steady
        # state; that first pass, where new input sizes meet cudnn's algorithm search (and
        # graph captures), is reported beside them. (A try that zero-padded the UNet's
        # inputs to x64 size buckets cut p99 from 158 to 112 ms but changed the recheck's
        # findings, 3.6 lesions per frame against 1.9: benchmarks/results/h200_2026-11-30.md.)
        # The fine sweep's flipped views go as one batch per component, in a few bucket
        # sizes that warm-up covers (twelfth session); one row runs them as before, one
        # call per view, each window its own size.
        # And one whose backend hands back its pinned output buffers instead of copies
        # (reuse_outputs): what the copy of the 2048² map costs. Safe for the sweep, which
        # reads each output before the next call; not for the ROI path or the recheck,
        # which keep several, so it is a measurement, not a setting to ship.
        runs = [("fp32", "eager", {}, "auto", None), ("fp32", "CUDA graphs", GRAPHS, "auto", None),
                ("fp32", "CUDA graphs, outputs not copied", {**GRAPHS, "reuse_outputs": True}, "auto", None),
                ("fp32", "CUDA graphs, views one by one, unbucketed", {**GRAPHS, "max_batch": 1}, "auto",
                 SweepConfig(view_bucket=0)),
                ("fp16", "CUDA graphs", GRAPHS, "auto", None), ("fp32", "CUDA graphs, ROI path", GRAPHS, "roi", None)]
        if s.device != "cuda":
            runs = [("fp32", "onnxruntime", {}, "auto", None), ("fp32", "onnxruntime, ROI path", {}, "roi", None)]
        warmup = max(s.warmup, len(frames))
        rows = []
        for precision, label, options, mode, sweep in runs:
            self.free()
            config = self.dx_config(precision, options, warmup_shapes=((320, 320), (256, 256)), mode=mode,
                                    **({"sweep": sweep} if sweep is not None else {}))
            t_load = time.perf_counter()
            an = load_analyzer(config)
            load_s = time.perf_counter() - t_load
            ms, first, lesions, stages = [], [], 0, []
            for i in range(warmup + s.frames):
                t0 = time.perf_counter()
                result = an.analyze(frames[i % len(frames)])
                took = (time.perf_counter() - t0) * 1000.0
                if i < len(frames):
                    first.append(took)
                if i >= warmup:
                    ms.append(took)
                    lesions += len(result.lesions)
                    stages.append(result.timings.as_dict())
            # where a frame's time goes: the median of each stage the analysis timed itself
            per_stage = {f"{k}_p50_ms": round(float(np.median([st[k] for st in stages])), 2)
                         for k in ("preprocess", "roi", "segment", "recheck", "postprocess")}
            rows.append({"precision": precision, "backend": an.backend_name, "setting": label, "mode": result.mode,
                         "band_threads": bands.threads(), **_stats(ms), **per_stage,
                         "first_pass_max_ms": round(max(first), 1), "load_and_warmup_s": round(load_s, 1),
                         "lesions_per_frame": round(lesions / max(len(ms), 1), 2), "peak_mib": self.peak_mib()})
            del an
        return rows

    def ct(self) -> list[dict[str, Any]]:
        """A 512² CT series as a user's stream or batch runs it: ``load_analyzer`` with the
        default models (the 2.5-D ``lesion_unet_lite`` on whole slices with the recheck),
        each slice with its neighbours; torch on CUDA in fp32 and fp16 (CUDA graphs)
        against onnxruntime on the host's CPU. Per slice p50/p99 over two passes after a
        warm-up pass, lesions found, and the slices whose lesions differ from
        onnxruntime's (count or a centroid more than a pixel away)."""
        from medrt.analysis.slices import series_neighbours
        from medrt.analyzer import AnalyzerConfig, load_analyzer
        from medrt.phantom import generate_ct_series

        s = self.sizes
        series = generate_ct_series(9902, n_frames=40 if s.device == "cuda" else 6)
        frames = [p.as_frame(f"ct{p.index}") for p in series]
        around = series_neighbours(frames)  # the slice before and after each, as a series is read
        runs = [("onnxruntime", "cpu", "fp32", {})]
        if s.device == "cuda":
            runs += [("torch", "cuda", "fp32", GRAPHS), ("torch", "cuda", "fp16", GRAPHS)]
        rows, reference = [], None
        for backend, device, precision, options in runs:
            self.free()
            an = load_analyzer(AnalyzerConfig(backend=backend, device=device, precision=precision,
                                              backend_options={"torch": options}))
            ms, found = [], []
            for rep in range(3):
                for frame, sides in zip(frames, around, strict=True):
                    t0 = time.perf_counter()
                    result = an.analyze(frame, neighbours=sides)
                    took = (time.perf_counter() - t0) * 1000.0
                    if rep:
                        ms.append(took)
                    else:
                        found.append(sorted(les.centroid for les in result.lesions))
            row: dict[str, Any] = {"backend": an.backend_name, "device": device, "precision": precision,
                                   "model": an.seg.spec.ident, **_stats(ms),
                                   "lesions": sum(len(f) for f in found), "peak_mib": self.peak_mib()}
            if reference is None:
                reference = found
            else:
                row["slices_differing_from_onnxruntime"] = sum(
                    len(a) != len(b) or any(abs(p[0] - q[0]) > 1 or abs(p[1] - q[1]) > 1 for p, q in zip(a, b, strict=False))
                    for a, b in zip(found, reference, strict=True))
            rows.append(row)
            del an
        return rows

    def profile(self) -> dict[str, Any]:
        """Where the host's time goes in the default run (fp32, CUDA graphs, auto mode):
        cProfile over ``frames`` frames after a warm-up pass, the top functions by own
        time and by cumulative time (the GPU's share shows in the synchronising copies)."""
        import cProfile
        import io
        import pstats

        from medrt.analyzer import load_analyzer

        s = self.sizes
        frames = [f.as_frame(f"prof{i}") for i, f in enumerate(self.frames)]
        self.free()
        options = GRAPHS if s.device == "cuda" else {}
        an = load_analyzer(self.dx_config("fp32", options))
        for f in frames:
            an.analyze(f)
        n = min(s.frames, 2 * len(frames))
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        for i in range(n):
            an.analyze(frames[i % len(frames)])
        prof.disable()
        took = (time.perf_counter() - t0) * 1000.0 / n
        out: dict[str, Any] = {"frames": n, "mean_ms": round(took, 2)}
        for key in ("tottime", "cumulative"):
            text = io.StringIO()
            pstats.Stats(prof, stream=text).strip_dirs().sort_stats(key).print_stats(35)
            out[key] = text.getvalue()
        del an
        return out

    def tensorrt(self) -> dict[str, Any]:
        try:
            import tensorrt  # noqa: F401
        except Exception as exc:
            return {"skipped": f"tensorrt not importable ({type(exc).__name__}: {exc})"}
        from medrt.engine.backends.tensorrt import TensorRTBackend

        s, x = self.sizes, self.crop_x
        self.free()
        shape = (1, self.unet.slices, s.crop, s.crop)
        with tempfile.TemporaryDirectory(prefix="medrt-trt-") as folder:
            t = time.perf_counter()
            b = TensorRTBackend(self.unet, precision="fp16", profile={"image": (shape, shape, shape)},
                                cache_folder=folder)
            build_s = time.perf_counter() - t
            b.warmup([(s.crop, s.crop)], repeats=3)
            ref = _prob(self.backend(self.unet, precision="fp32").infer(x)[0])
            p = _prob(b.infer(x)[0])
            ms = _timed(lambda: b.infer(x), s.repeats)
        return {"precision": "fp16", "build_s": round(build_s, 1), **_stats(ms), "peak_mib": self.peak_mib(),
                "max_prob_diff_vs_torch_fp32": round(float(np.abs(p - ref).max()), 5),
                "mask_dice_vs_torch_fp32": round(_dice(p > 0.5, ref > 0.5), 4)}

    def ort_cuda(self) -> dict[str, Any]:
        import onnxruntime as ort

        if "CUDAExecutionProvider" not in ort.get_available_providers():
            return {"skipped": "onnxruntime has no CUDAExecutionProvider"}
        from medrt.engine.backends.onnxrt import OnnxRuntimeBackend

        s, x = self.sizes, self.crop_x
        b = OnnxRuntimeBackend(self.unet, device="cuda")
        b.warmup([(s.crop, s.crop)], repeats=3)
        return {"providers": b.providers, **_stats(_timed(lambda: b.infer(x), s.repeats))}


# CUDA graphs, captured per input size: room for the sweep's window and its view buckets
GRAPHS = {"cuda_graph": True, "max_graphs": 64}

# The sections after the phantoms, in order, with the seconds each needs of the budget.
SECTIONS = {"unet_crop": 40, "roi_path": 40, "sliding": 20, "analyzer": 40, "profile": 20, "ct": 30,
            "tensorrt": 90, "ort_cuda": 20}


def _table(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    cols = list(dict.fromkeys(k for r in rows for k in r))
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows]
    return out


def markdown(doc: dict[str, Any]) -> str:
    lines = ["# medrt GPU check" + (" (DRY RUN on the CPU, tiny sizes)" if doc["dry_run"] else ""), ""]
    env = doc.get("env", {})
    lines += [f"- {k}: {v}" for k, v in env.items()] + [""]
    titles = {"unet_crop": "UNet on one crop (torch backend, per call incl. H2D/D2H)",
              "roi_path": "ROI path per frame, models only (normalise, classifier, UNet on the crops at 0.5 mm)",
              "analyzer": "End to end per frame: load_analyzer + analyze (recheck included, decode skipped)",
              "sliding": "Full-frame sliding window (reference)",
              "ct": "512² CT series, per slice: load_analyzer + analyze with neighbours (default models)",
              "tensorrt": "TensorRT",
              "ort_cuda": "onnxruntime CUDA provider"}
    for key, title in titles.items():
        if key in doc:
            rows = doc[key] if isinstance(doc[key], list) else [doc[key]]
            lines += [f"## {title}", "", *_table(rows), ""]
    if isinstance(doc.get("profile"), dict) and "tottime" in doc["profile"]:
        prof = doc["profile"]
        lines += [f"## Host profile, default run ({prof['frames']} frames, {prof['mean_ms']} ms each under cProfile)",
                  "", "```", prof["tottime"].strip(), "```", "", "```", prof["cumulative"].strip(), "```", ""]
    if doc["skipped"]:
        lines += ["## Skipped", "", *[f"- {s}" for s in doc["skipped"]], ""]
    lines.append(f"Total {doc.get('seconds', '?')} s.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes: check the logic without a GPU")
    p.add_argument("--out", default=os.environ.get("OUT", "gpu_out"), help="output folder (default $OUT or ./gpu_out)")
    p.add_argument("--models", help="folder with lesion_unet_dx and roi_classifier_dx .onnx/.toml/.pt (default: shipped)")
    p.add_argument("--frames", type=int, help="timed frames for the ROI path (default 50; dry run 4)")
    p.add_argument("--budget-s", type=float, default=270.0, help="skip sections that would end past this")
    p.add_argument("--only", help=f"comma-separated sections to run (default all: {','.join(SECTIONS)})")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        import torch
    except ImportError:
        print("gpu_check needs torch (with CUDA, or any build for --dry-run)", file=sys.stderr)
        return 2
    import importlib.util

    absent = [m for m in ("SimpleITK", "pydicom", "monai", "medrt.models") if importlib.util.find_spec(m) is None]
    if absent:
        print(f"missing Python packages: {', '.join(absent)} (install their wheels with --no-deps; "
              "medrt.models comes from `pip install --no-deps --no-build-isolation -e .`)", file=sys.stderr)
        return 2
    if not args.dry_run and not torch.cuda.is_available():
        print(f"no CUDA device for torch {torch.__version__}; use --dry-run to check the logic on the CPU",
              file=sys.stderr)
        return 2
    if args.dry_run:
        torch.set_num_threads(min(2, torch.get_num_threads()))
    only = set(args.only.split(",")) if args.only else set(SECTIONS)
    if only - set(SECTIONS):
        print(f"unknown sections: {', '.join(sorted(only - set(SECTIONS)))} (known: {', '.join(SECTIONS)})",
              file=sys.stderr)
        return 2
    run = Run(args)
    run.section("env", run.env, 0)
    run.section("phantoms", run.make_frames, 30)
    for name, needs_s in SECTIONS.items():
        if name in only:
            run.section(name, getattr(run, name), needs_s)
    run.doc["seconds"] = round(time.perf_counter() - run.t0, 1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(run.doc, indent=2, default=str))
    text = markdown(run.doc)
    (out / "gpu_check.md").write_text(text)
    print(text)
    print(f"wrote {out / 'gpu_check.json'} and {out / 'gpu_check.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
