"""What this machine's CPU is, for the records whose figures depend on it.

:func:`cpu_name` names the processor in benchmark rows (``platform.processor()`` is
empty or just ``x86_64`` on Linux). :func:`int8_kernels` names the class of integer
kernels ONNX Runtime's MLAS picks for a QDQ model (U8S8) on this CPU, which decides
more than its speed: on AVX2 and AVX-512 without VNNI the products are summed in pairs
into 16 bits with saturation (``VPMADDUBSW``; ORT's quantization guide warns of it),
while VNNI, AMX and Arm's dot-product instructions add them exactly in 32 bits. So an
INT8 model's accuracy, and the gate's verdict on it, hold for one kernel class only
(:func:`medrt.engine.int8cache.cache_folder` keys its cache by it), and so do INT8
speed-ups. A machine moved to another host (a VM) may change class between runs.

The flags come from ``/proc/cpuinfo`` (Linux, which is what medrt's CPU figures are
measured on): ORT does not expose which kernels it picked, and a CPUID library
(py-cpuinfo) would be a dependency, and about a second per call, for one flags line.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

__all__ = ["cpu_flags", "cpu_name", "cpu_layout", "int8_kernels", "on_gpu"]

_CPUINFO = Path("/proc/cpuinfo")


@functools.cache
def _cpuinfo(path: Path = _CPUINFO) -> dict[str, str]:
    """The first processor's ``key: value`` lines of ``path`` ({} where there is none)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if out:
                break  # the first processor is enough: they are alike
            continue
        key, sep, value = line.partition(":")
        if sep:
            out.setdefault(key.strip().lower(), value.strip())
    return out


def cpu_flags(path: Path = _CPUINFO) -> frozenset[str]:
    """The CPU's feature flags (x86 ``flags``, Arm ``features``), lower case."""
    info = _cpuinfo(path)
    return frozenset((info.get("flags") or info.get("features") or "").lower().split())


def cpu_name(path: Path = _CPUINFO) -> str:
    """The processor's name, e.g. ``AMD EPYC`` or ``Intel(R) Xeon(R) Platinum 8480+``."""
    info = _cpuinfo(path)
    return (info.get("model name") or info.get("hardware") or platform.processor() or platform.machine()
            or "unknown CPU")


def int8_kernels(path: Path = _CPUINFO) -> str:
    """The class of ORT's U8S8 kernels on this CPU: ``amx``, ``vnni`` (exact 32-bit
    sums), ``avx512`` or ``avx2`` (16-bit pair sums that saturate), ``arm-dot``
    (exact), ``arm``, or the machine's name where the flags are unknown."""
    flags = cpu_flags(path)
    if {"amx_int8", "amx_tile"} <= flags:
        return "amx"
    if flags & {"avx512_vnni", "avx_vnni"}:
        return "vnni"
    if "avx512bw" in flags:
        return "avx512"
    if "avx2" in flags:
        return "avx2"
    if "asimddp" in flags:
        return "arm-dot"
    if "asimd" in flags:
        return "arm"
    return (platform.machine() or "cpu").lower()


def on_gpu(backend: str = "auto", device: str = "auto") -> bool:
    """Whether these engine options put the models on a GPU (a CUDA device, TensorRT, torch)."""
    return device == "cuda" or backend in ("tensorrt", "torch")


def cpu_layout(cores: int, *, gpu: bool, workers: int | None = None,
               threads: int | None = None) -> tuple[int | None, int]:
    """(threads per model session, inference workers) for ``cores`` cores; ``workers`` and
    ``threads`` as asked, where asked (None: threads for a GPU backend are its own).

    Measured on the 2-core CI machine: ORT sessions with one intra-op thread and
    one inference worker per core beat one worker whose session spreads each
    512² frame over both cores (the per-op thread hand-off costs more than it
    gains on small frames). On a GPU one worker feeds the device.
    """
    cores = max(1, cores)
    if workers is None:
        workers = 1 if gpu else min(cores, 4)
    if threads is None and not gpu:
        threads = max(1, cores // workers)
    return threads, workers
