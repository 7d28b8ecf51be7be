"""INT8 on demand: each model's gated INT8 twin, made on first use and kept in a cache.

``--precision int8`` on the CPU runs a QDQ model. For an FP32 spec,
:func:`gated_int8` quantizes it (:func:`medrt.engine.quantize.quantize_int8`,
default calibration), compares it with FP32 (:func:`medrt.engine.gate.compare`)
and keeps the model and the verdict in ``cache_dir("int8")``, one folder per FP32
file, the files of the models it is gated with, ORT version, the CPU's integer kernel
class and recipe (:func:`cache_folder`). A refusal is kept too. This
module is the only one that knows that layout: ``medrt models int8`` lists and
clears it through :func:`entries` and :func:`clear`.

Needs ``onnx`` and ``onnxruntime.quantization`` (imported when a model is made).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from medrt.engine.hardware import cpu_name, int8_kernels
from medrt.engine.registry import ModelSpec, load_spec

__all__ = ["CACHE_FORMAT", "cache_folder", "cache_root", "clear", "entries", "gated_int8"]

log = logging.getLogger(__name__)

CACHE_FORMAT = 9  # 2: the gate routes radiograph crops; 3: it scores only the model's modalities;
# 4: ROI classifiers are calibrated on their modalities' thumbnails only; 5: the gate scores
# a segmenter on radiographs through the fine sweep over the whole frame, as the analyzer runs it;
# 6: about a hundred lesions per modality, and CT slices rechecked as the analyzer does;
# 7: the folder names the CPU's INT8 kernel class (medrt.engine.hardware.int8_kernels);
# 8: what feeds the FP32 input/output paths from shapes and constants stays FP32 too;
# 9: the folder also names how the models are read (thresholds, spacing, window), which
# the verdict was measured at
VERDICT = "verdict.json"


def cache_root(cache: str | Path | None = None) -> Path:
    """``cache`` or the default ``medrt.engine.cache.cache_dir("int8")``."""
    from medrt.engine.cache import cache_dir

    return Path(cache) if cache is not None else cache_dir("int8")


def cache_folder(spec: ModelSpec, root: Path) -> Path:
    """The folder of ``spec``'s INT8 twin under ``root``."""
    import onnxruntime as ort

    from medrt.engine.gate import default_partners

    # What the INT8 model and its verdict depend on: the FP32 file, the models the gate
    # scores it with (a classifier's segmenter; before the twentieth session a classifier
    # kept the verdict it got through the segmenter it was first gated with), the
    # quantizer (ORT's version), the CPU's integer kernels (the verdict holds for one
    # class: without VNNI the products are summed with saturation; a VM can change host)
    # and this recipe (calibration, rewrites, excluded layers, the gate's frames). The
    # ``with`` hash also covers how the model and its partners are read (thresholds,
    # spacing, window): a threshold tuned in the spec gets a verdict measured at it.
    partners = hashlib.sha256((_reading(spec) + "".join(p.sha256 + _reading(p) for p in default_partners(spec)))
                              .encode()).hexdigest()[:8]
    return root / (f"{spec.name}-{spec.sha256[:16]}-with{partners}-ort{ort.__version__}-{int8_kernels()}"
                   f"-v{CACHE_FORMAT}")


def _reading(spec: ModelSpec) -> str:
    """What, besides its file, decides what a model's outputs mean and how the gate scores
    them: its thresholds, spacing and input window."""
    return json.dumps({"thresholds": spec.thresholds, "spacing_mm": spec.spacing_mm,
                       "normalization": spec.normalization, "window": spec.window}, sort_keys=True)


def _make(spec: ModelSpec, folder: Path) -> None:
    """Quantize and gate ``spec`` into ``folder``: the model (only if it passed) and the verdict."""
    from medrt.engine.gate import compare
    from medrt.engine.quantize import quantize_int8

    reduced = quantize_int8(spec, folder)
    report = compare(spec, reduced)
    record = {"format": CACHE_FORMAT, "source": spec.ident, "sha256": spec.sha256, "cpu": cpu_name(),
              "int8_kernels": int8_kernels(), **report.to_json()}
    (folder / VERDICT).write_text(json.dumps(record, indent=1), encoding="utf-8")
    if not report.passed:  # keep the verdict, not the model
        for f in folder.glob(f"{spec.name}_int8.*"):
            f.unlink()


def gated_int8(spec: ModelSpec, cache: str | Path | None = None) -> ModelSpec:
    """The INT8 twin of ``spec`` that passed the accuracy gate, made on first use.

    A spec that already is a quantized model is returned as it is. Otherwise the model
    is quantized and gated once and the result kept under ``cache`` (default
    :func:`cache_root`): later runs load it in milliseconds. A refusal is kept too, and
    raises :class:`medrt.engine.gate.AccuracyGateError` with the figures every time;
    delete the folder named in the message to measure again. When the cache cannot be
    written the twin is made in a temporary folder for this process only.
    """
    from medrt.engine.gate import AccuracyGateError

    if spec.quantization:
        return spec
    folder = cache_folder(spec, cache_root(cache))
    verdict_path = folder / VERDICT
    kept = True
    if not verdict_path.is_file():
        log.info("%s: no INT8 model in %s yet; quantizing and gating it (once, about a minute)", spec.ident, folder)
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
            # Staged beside the final folder (same depth: the spec's relative card path
            # holds) and renamed into place, so another process sees all of it or nothing.
            staged = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
        except OSError as exc:  # a read-only home, a full disk: still run, without the cache
            folder = Path(tempfile.mkdtemp(prefix=f"medrt-{folder.name}-"))
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
            log.warning("%s: cannot write the INT8 cache (%s); making the INT8 model in %s for this process"
                        " only (set MEDRT_CACHE to a writable folder to keep it)", spec.ident, exc, folder)
            verdict_path, kept = folder / VERDICT, False
            _make(spec, folder)
        else:
            try:
                _make(spec, staged)
                try:
                    os.replace(staged, folder)
                except OSError:  # another process got there first; its result is as good
                    if not verdict_path.is_file():
                        raise
            finally:
                shutil.rmtree(staged, ignore_errors=True)
    verdict = json.loads(verdict_path.read_text(encoding="utf-8"))
    if not verdict.get("passed"):
        where = f"verdict kept in {folder}; delete it to measure again" if kept else "not cached"
        raise AccuracyGateError(f"{verdict.get('message', spec.ident + ' int8 refused')} [{where}]")
    # Which frames a model is for, and which neighbours it gets, are the current spec's
    # word, not the copy cached with the twin (a spec edited since, or one from before
    # [model] body_parts existed).
    reduced = replace(load_spec(folder / f"{spec.name}_int8.toml"), modalities=spec.modalities,
                      body_parts=spec.body_parts, views=spec.views, planes=spec.planes,
                      neighbour_mm=spec.neighbour_mm)
    log.info("%s: INT8 from %s (%s)", spec.ident, folder, verdict.get("message", "gate passed"))
    return reduced


def _folders(root: Path) -> list[Path]:
    """The cache's model folders (not the hidden ones still being staged)."""
    return sorted(p for p in root.glob("*") if p.is_dir() and not p.name.startswith("."))


def entries(cache: str | Path | None = None) -> list[dict[str, Any]]:
    """One dict per cached twin: ``folder``, ``source``, ``passed``, ``message``; or
    ``folder`` and ``error`` where the verdict cannot be read."""
    out: list[dict[str, Any]] = []
    for folder in _folders(cache_root(cache)):
        try:
            verdict = json.loads((folder / VERDICT).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            out.append({"folder": str(folder), "error": f"no readable {VERDICT} ({exc})"})
            continue
        out.append({"folder": str(folder), "source": verdict.get("source", "?"), "passed": bool(verdict.get("passed")),
                    "message": verdict.get("message", "")})
    return out


def clear(specs: Sequence[ModelSpec] = (), cache: str | Path | None = None) -> list[str]:
    """Remove the twins of ``specs`` (all when empty) so the next use measures again;
    return the folders removed."""
    root = cache_root(cache)
    # all: staging folders a killed process left behind go too
    folders = [cache_folder(s, root) for s in specs] if specs else sorted(p for p in root.glob("*") if p.is_dir())
    removed = [str(f) for f in folders if f.exists()]
    for f in folders:
        shutil.rmtree(f, ignore_errors=True)
    return removed
