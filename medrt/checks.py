"""``medrt checks``: whether this installation can do its work, item by item.

What a site's IT runs after installing medrt on a new machine (or after an upgrade, or
when something behaves oddly), before any image arrives: the runtime and device the
analysis will use and why, each model file against its spec's sha256, a decoder for
every common transfer syntax, the encoders the outputs need, the optional parts (viewer,
Ray, TensorRT…) and the cache folder. Each row says what was found and, where something
is missing, what to install. Like ``yolo checks`` (ultralytics) or ``nvidia-smi``, it
only looks: it loads no model into a runtime and reads no patient data.

A row is *required* when the analysis or its outputs cannot work without it (a model
that fails its sha256, a transfer syntax with no decoder, no runtime); the others are
reported and do not fail the check.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pydicom import uid

__all__ = ["DECODED_SYNTAXES", "OPTIONAL_PARTS", "Row", "run_checks", "failed"]

OK, MISSING, FAILED, INFO = "ok", "missing", "FAILED", "info"

#: The transfer syntaxes medrt decodes (README, DICOM input), by name.
DECODED_SYNTAXES: tuple[tuple[str, str], ...] = (
    ("Implicit VR Little Endian", uid.ImplicitVRLittleEndian),
    ("Explicit VR Little Endian", uid.ExplicitVRLittleEndian),
    ("Explicit VR Big Endian", uid.ExplicitVRBigEndian),
    ("Deflated Explicit VR Little Endian", uid.DeflatedExplicitVRLittleEndian),
    ("RLE Lossless", uid.RLELossless),
    ("JPEG Baseline", uid.JPEGBaseline8Bit),
    ("JPEG Extended (12-bit)", uid.JPEGExtended12Bit),
    ("JPEG Lossless", uid.JPEGLossless),
    ("JPEG Lossless SV1", uid.JPEGLosslessSV1),
    ("JPEG-LS Lossless", uid.JPEGLSLossless),
    ("JPEG-LS Near-lossless", uid.JPEGLSNearLossless),
    ("JPEG 2000 Lossless", uid.JPEG2000Lossless),
    ("JPEG 2000", uid.JPEG2000),
    ("HTJ2K Lossless", uid.HTJ2KLossless),
    ("HTJ2K Lossless RPCL", uid.HTJ2KLosslessRPCL),
    ("HTJ2K", uid.HTJ2K),
    # newer than pydicom 3.0 (medrt.io.codecs.register_newer_syntaxes)
    ("JPEG XL Lossless", uid.UID("1.2.840.10008.1.2.4.110")),
    ("JPEG XL JPEG Recompression", uid.UID("1.2.840.10008.1.2.4.111")),
    ("JPEG XL", uid.UID("1.2.840.10008.1.2.4.112")),
    ("Encapsulated Uncompressed Explicit VR Little Endian", uid.UID("1.2.840.10008.1.2.1.98")),
    ("Deflated Image Frame Compression", uid.UID("1.2.840.10008.1.2.8.1")),
)

#: The encoders medrt's outputs use: what needs each, and whether it is needed by default.
ENCODED_SYNTAXES: tuple[tuple[str, str, str, bool], ...] = (
    ("RLE Lossless", uid.RLELossless, "Secondary Capture overlays (--sc) a PACS takes compressed", True),
    ("JPEG 2000 Lossless", uid.JPEG2000Lossless, "--seg-compression jpeg2000", False),
)

#: Optional parts: (distribution, import name, what it is for, how to install).
OPTIONAL_PARTS: tuple[tuple[str, str, str, str], ...] = (
    ("PySide6-Essentials", "PySide6", "the desktop viewer (medrt view)", "pip install 'medrt[gui]'"),
    ("ray", "ray", "batch work past one machine (medrt batch --ray)", "pip install 'medrt[ray]'"),
    ("matplotlib", "matplotlib", "finer latency histograms (--histogram, report.md; PIL draws them otherwise)",
     "pip install matplotlib"),
    ("onnxruntime-gpu", "onnxruntime", "ONNX Runtime on CUDA / TensorRT-EP", "pip install 'medrt[gpu]'"),
    ("tensorrt", "tensorrt", "native TensorRT engines (--backend tensorrt)", "pip install 'medrt[trt]'"),
    ("torch", "torch", "the torch CUDA backend and training", "pip install 'medrt[train]'"),
)


@dataclass(frozen=True)
class Row:
    """One thing checked: where (``area``), what (``item``), the ``status`` (ok, missing,
    FAILED, info), what was found (``detail``) and whether the work needs it."""

    area: str
    item: str
    status: str
    detail: str
    required: bool = True

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def failed(rows: Sequence[Row]) -> list[Row]:
    """The required rows that did not pass."""
    return [r for r in rows if r.required and r.status in (MISSING, FAILED)]


def _system() -> list[Row]:
    from medrt import __version__
    from medrt.engine.hardware import cpu_name, int8_kernels

    rows = [
        Row("system", "medrt", INFO, __version__, False),
        Row("system", "python", INFO, f"{platform.python_version()} ({sys.executable})", False),
        Row("system", "platform", INFO, platform.platform(), False),
        Row("system", "cpu", INFO, f"{cpu_name() or platform.machine()}, {os.cpu_count() or '?'} logical cores, "
            f"INT8 kernels: {int8_kernels()}", False),
    ]
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        rows.append(Row("system", "memory", INFO, f"{total / 2**30:.1f} GiB", False))
    except (ValueError, OSError, AttributeError):  # not on every platform
        pass
    return rows


def _runtime(backend: str, device: str, precision: str) -> list[Row]:
    from medrt.engine.select import installed_version, probe, rank

    found = probe()
    ort = installed_version("onnxruntime") or installed_version("onnxruntime-gpu")
    rows = [Row("runtime", "onnxruntime", OK if ort else MISSING,
                f"{ort}, providers {', '.join(found.ort_providers)}" if ort else "pip install onnxruntime")]
    gpu = f"{found.gpu_name} (compute capability {found.gpu_capability})" if found.cuda else "none"
    notes = "; ".join(found.notes)
    rows.append(Row("runtime", "GPU", INFO, gpu + (f" ({notes})" if notes and not found.cuda else ""), False))
    asked = f"--backend {backend} --device {device} --precision {precision}"
    choices = rank(backend, device, precision, found)  # what select() takes, without its warning
    if not choices:
        rows.append(Row("runtime", "analysis runs on", FAILED, f"{asked}: no backend can run here ({found.summary()})"))
        return rows
    choice = choices[0]
    why = f" (asked {asked}, but {choice.fallback_reason})" if choice.fallback_reason else ""
    rows.append(Row("runtime", "analysis runs on", OK, f"{choice}{why}"))
    return rows


def _models(names: Sequence[str]) -> list[Row]:
    from medrt.engine import int8cache
    from medrt.engine.registry import find_spec, size_text
    from medrt.errors import MedrtError

    rows = []
    for name in dict.fromkeys(names):
        try:
            spec = find_spec(name, verify=True)
        except (MedrtError, OSError) as exc:
            rows.append(Row("models", str(name), FAILED, str(exc)))
            continue
        size = size_text(spec.path.stat().st_size)
        rows.append(Row("models", spec.name, OK, f"{spec.version}, {spec.task}, {size}, sha256 matches its spec"))
    cached = int8cache.entries()
    if cached:
        passed = sum(1 for e in cached if e.get("passed"))
        rows.append(Row("models", "INT8 cache", INFO, f"{len(cached)} twin(s) in {int8cache.cache_root()}: "
                        f"{passed} passed the gate, {len(cached) - passed} run in FP32", False))
    else:
        rows.append(Row("models", "INT8 cache", INFO, "empty (--precision int8 makes each twin on first use; "
                        "medrt models int8 NAME... makes them ahead)", False))
    return rows


def _decoders() -> list[Row]:
    from pydicom.pixels import get_decoder

    import medrt.io.dicom  # noqa: F401  (registers medrt's imagecodecs plugins with pydicom)
    from medrt.io.codecs import decoder_packages, preferred_plugins

    rows = []
    for name, ts in DECODED_SYNTAXES:
        if not ts.is_compressed:
            rows.append(Row("decoders", name, OK, f"{ts}: numpy"))
            continue
        decoder = get_decoder(ts)
        plugins = list(decoder.available_plugins)
        if not plugins:
            need = " ".join(decoder_packages(ts)) or "a pydicom pixel data plugin"
            rows.append(Row("decoders", name, MISSING, f"{ts}: no decoder installed (pip install {need})"))
            continue
        first = next((p for p in preferred_plugins(ts) if p in plugins), None)
        others = ", ".join(p for p in plugins if p != first)
        found = f"{first} first, then {others}" if first and others else first or others
        rows.append(Row("decoders", name, OK, f"{ts}: {found}"))
    return rows


def _encoders() -> list[Row]:
    from pydicom.pixels import get_encoder

    rows = []
    for name, ts, use, required in ENCODED_SYNTAXES:
        plugins = list(get_encoder(ts).available_plugins)
        if plugins:
            rows.append(Row("encoders", name, OK, f"{ts}: {', '.join(plugins)} ({use})", required))
        else:
            rows.append(Row("encoders", name, MISSING, f"{ts}: no encoder installed, needed for {use}", required))
    return rows


def _optional() -> list[Row]:
    import importlib.util

    from medrt.engine.select import installed_version

    rows = []
    for dist, module, use, install in OPTIONAL_PARTS:
        version = installed_version(dist)
        if version is None or importlib.util.find_spec(module) is None:
            rows.append(Row("optional", dist, MISSING, f"for {use}: {install}", False))
        elif module == "torch" and "+cpu" in version:
            rows.append(Row("optional", dist, OK, f"{version}, for training (a CPU build: the torch backend needs "
                            "a CUDA build)", False))
        else:
            rows.append(Row("optional", dist, OK, f"{version}, for {use}", False))
    return rows


def _paths() -> list[Row]:
    from medrt.engine.cache import cache_dir

    root = cache_dir("int8").parent
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".medrt-check-"):
            pass
        free = shutil.disk_usage(root).free / 2**30
        return [Row("paths", "cache", OK, f"{root} writable, {free:.1f} GiB free (INT8 twins, TensorRT engines; "
                    "$MEDRT_CACHE moves it)", False)]
    except OSError as exc:
        return [Row("paths", "cache", FAILED, f"{root}: {exc} (INT8 twins and TensorRT engines are kept there; "
                    "set $MEDRT_CACHE to a writable folder)", False)]


def run_checks(models: Sequence[str] | None = None, backend: str = "auto", device: str = "auto",
               precision: str = "fp32") -> list[Row]:
    """Every check, in the order :func:`medrt.commands.checks` prints them. ``models``:
    names or spec paths (default: the analyzer's default classifiers and segmenters)."""
    if models is None:
        from medrt.analysis.config import AnalyzerConfig

        config = AnalyzerConfig()
        models = [m.strip() for m in f"{config.roi_model},{config.seg_model}".split(",") if m.strip()]
    return [*_system(), *_runtime(backend, device, precision), *_models([str(m) for m in models]), *_decoders(),
            *_encoders(), *_optional(), *_paths()]


