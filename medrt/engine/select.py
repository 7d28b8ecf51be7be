"""Which backend runs a model here: probe the machine, pick from an allow-list, log any fallback.

:func:`probe` looks at what is installed and present (never raises).
:data:`ALLOW_LIST` is the table of (backend, device, precision) combinations
that are tested, each with what it needs from the probe. :func:`select` turns a
request ("auto" or a name; a device; a precision) into a :class:`Choice`: the
first allowed, available combination in :data:`PREFERENCE` order that meets the
request, or else the best one that does not, with one WARNING line saying what
was asked for, why it cannot be had, and what is used instead.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import importlib.metadata
import importlib.util
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

from medrt.engine.backends import BACKENDS, create
from medrt.engine.backends.base import Backend
from medrt.engine.registry import ModelError, ModelSpec

__all__ = ["Probe", "Choice", "Combo", "ALLOW_LIST", "PREFERENCE", "probe", "select", "rank", "create_backend",
           "installed_version"]

log = logging.getLogger(__name__)

DEVICES = ("cpu", "cuda")
PRECISIONS = ("fp32", "fp16", "int8")
LABELS = MappingProxyType({"tensorrt": "TensorRT", "torch": "torch", "onnxruntime": "onnxruntime"})


@dataclass(frozen=True, slots=True)
class Probe:
    """What this machine offers. Built by :func:`probe`, or by hand in tests (it is plain data)."""

    ort_providers: tuple[str, ...] = ()
    gpu_count: int = 0  # from the NVIDIA driver (NVML), without torch
    gpu_name: str | None = None
    gpu_capability: tuple[int, int] | None = None
    torch_version: str | None = None
    torch_cuda: bool = False
    tensorrt_version: str | None = None
    notes: tuple[str, ...] = ()  # why something was not found

    @property
    def cuda(self) -> bool:
        return self.gpu_count > 0 or self.torch_cuda

    def supports(self, backend: str, device: str, precision: str | None = None) -> bool:
        """Whether the allow-list has (backend, device, precision) and this machine meets its
        needs; with ``precision`` None, whether any allowed precision of the pair runs here."""
        precisions = PRECISIONS if precision is None else (precision,)
        return any((backend, device, p) in ALLOW_LIST and unmet(backend, device, p, self) is None for p in precisions)

    def summary(self) -> str:
        gpu = f"{self.gpu_name} (sm {self.gpu_capability})" if self.cuda else "no CUDA device"
        return (
            f"{gpu}; onnxruntime providers {list(self.ort_providers)}; "
            f"torch {self.torch_version or 'absent'}{' +CUDA' if self.torch_cuda else ''}; "
            f"TensorRT {self.tensorrt_version or 'absent'}"
        )


class Combo(NamedTuple):
    """An allow-list key: a plain (backend, device, precision) tuple with names."""

    backend: str
    device: str
    precision: str


@dataclass(frozen=True, slots=True)
class Choice:
    backend: str
    device: str
    precision: str
    fallback_reason: str | None = None

    def __str__(self) -> str:
        return f"{self.backend} on {self.device.upper()} ({self.precision})"


# ---- probing -----------------------------------------------------------------------------
def _nvml() -> tuple[int | None, str | None, tuple[int, int] | None, str | None]:
    """(GPU count, name and capability of GPU 0, note) from the driver's NVML; count None
    when NVML cannot answer (Jetson has CUDA without NVML), 0 on Linux when neither NVML
    nor the CUDA driver library is there. Creates no
    CUDA context, so it is safe before a fork and costs milliseconds."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        if sys.platform.startswith("linux") and not _loadable("libcuda.so.1"):
            # no driver at all (a CPU server): no CUDA device can be used, so torch and
            # tensorrt need not be imported to ask (seconds and ~300 MB resident)
            return 0, None, None, "no NVIDIA driver (neither libnvidia-ml.so.1 nor libcuda.so.1 found)"
        return None, None, None, "no NVIDIA driver (libnvidia-ml.so.1 not found)"
    try:
        if lib.nvmlInit_v2() != 0:
            return None, None, None, "the NVIDIA driver did not initialise (nvmlInit failed)"
        count = ctypes.c_uint(0)
        if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0 or count.value == 0:
            return 0, None, None, "the NVIDIA driver reports no GPU"
        handle = ctypes.c_void_p()
        lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle))
        name = ctypes.create_string_buffer(96)
        lib.nvmlDeviceGetName(handle, name, 96)
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        lib.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor))
        return int(count.value), name.value.decode(errors="replace"), (major.value, minor.value), None
    except Exception as exc:  # a driver/library mismatch must not stop the probe
        return None, None, None, f"NVML query failed ({exc})"
    finally:
        try:
            lib.nvmlShutdown()
        except Exception:  # pragma: no cover
            pass


def _loadable(library: str) -> bool:
    """Whether the shared ``library`` loads (the CUDA driver's ``libcuda.so.1`` is on every
    machine that can run CUDA, Jetson's too, which has no NVML)."""
    try:
        ctypes.CDLL(library)
    except OSError:
        return False
    return True


def _module(name: str) -> tuple[Any | None, str | None]:
    if importlib.util.find_spec(name) is None:
        return None, f"{name} is not installed"
    try:
        return importlib.import_module(name), None
    except Exception as exc:  # e.g. tensorrt without libnvinfer: an OSError
        return None, f"{name} is installed but does not import ({type(exc).__name__}: {exc})"


def installed_version(dist: str) -> str | None:
    """The installed version of distribution ``dist`` (e.g. "torch"), or None; imports nothing."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def probe() -> Probe:
    """Look at the runtimes and GPUs this process can use. Never raises.

    Done once per process (``probe.cache_clear()`` to look again). When the driver
    says there is no GPU, torch and tensorrt are not imported (seconds and hundreds
    of MB saved on CPU-only machines): only their installed versions are noted.
    """
    notes: list[str] = []
    ort, note = _module("onnxruntime")
    providers = tuple(ort.get_available_providers()) if ort is not None else ()
    count, name, cap, note_gpu = _nvml()
    if count == 0:
        return Probe(
            ort_providers=providers, torch_version=installed_version("torch"), tensorrt_version=None,
            notes=tuple(n for n in (note, note_gpu) if n),
        )
    torch, note_torch = _module("torch")
    torch_cuda = False
    if torch is not None:
        try:
            torch_cuda = bool(torch.cuda.is_available())
            if torch_cuda and name is None:
                name, cap = torch.cuda.get_device_name(0), tuple(torch.cuda.get_device_capability(0))
        except Exception as exc:
            notes.append(f"torch.cuda failed ({exc})")
    trt, note_trt = _module("tensorrt")
    notes += [n for n in (note, note_gpu, note_torch, note_trt) if n]
    return Probe(
        ort_providers=providers,
        gpu_count=count or 0,
        gpu_name=name,
        gpu_capability=cap,  # type: ignore[arg-type]
        torch_version=str(torch.__version__) if torch is not None else None,
        torch_cuda=torch_cuda,
        tensorrt_version=str(getattr(trt, "__version__", "?")) if trt is not None else None,
        notes=tuple(notes),
    )


_probe = probe  # the functions below take a ``probe`` argument that shadows the name


# ---- the allow-list ----------------------------------------------------------------------
Check = Callable[[Probe], "str | None"]  # None when met, else why not


def _cuda_device(p: Probe) -> str | None:
    return None if p.cuda else "no CUDA device found"


def _ort(provider: str) -> Check:
    def check(p: Probe) -> str | None:
        if provider in p.ort_providers:
            return None
        hint = "" if provider.startswith("CPU") else " (install onnxruntime-gpu: pip install 'medrt[gpu]')"
        return f"onnxruntime has no {provider}{hint}"

    return check


def _tensorrt(p: Probe) -> str | None:
    return None if p.tensorrt_version else "the tensorrt package is not importable (pip install 'medrt[trt]')"


def _torch_cuda(p: Probe) -> str | None:
    if p.torch_cuda:
        return None
    return "torch is not installed" if p.torch_version is None else f"torch {p.torch_version} cannot use CUDA"


_CPU = (_ort("CPUExecutionProvider"),)
_TRT = (_cuda_device, _tensorrt, _torch_cuda)  # device buffers are torch CUDA tensors
_TORCH = (_cuda_device, _torch_cuda)

ALLOW_LIST: Mapping[Combo, tuple[Check, ...]] = MappingProxyType(
    {
        Combo("onnxruntime", "cpu", "fp32"): _CPU,
        Combo("onnxruntime", "cpu", "int8"): _CPU,  # a QDQ-quantized model
        Combo("onnxruntime", "cuda", "fp32"): (_cuda_device, _ort("CUDAExecutionProvider")),
        Combo("onnxruntime", "cuda", "fp16"): (
            _cuda_device, _ort("TensorrtExecutionProvider"), _ort("CUDAExecutionProvider"),
        ),
        Combo("tensorrt", "cuda", "fp32"): _TRT,
        Combo("tensorrt", "cuda", "fp16"): _TRT,
        Combo("tensorrt", "cuda", "int8"): _TRT,
        Combo("torch", "cuda", "fp32"): _TORCH,
        Combo("torch", "cuda", "fp16"): _TORCH,
    }
)
# Best first: what "auto" prefers among what the probe found.
PREFERENCE: tuple[tuple[str, str], ...] = (
    ("tensorrt", "cuda"), ("torch", "cuda"), ("onnxruntime", "cuda"), ("onnxruntime", "cpu"),
)


def unmet(backend: str, device: str, precision: str, found: Probe) -> str | None:
    """Why (backend, device, precision) cannot run here, or None when it can."""
    checks = ALLOW_LIST.get((backend, device, precision))
    if checks is None:
        return f"{precision} is not a tested precision for {LABELS[backend]} on {device.upper()}"
    return next((why for why in (c(found) for c in checks) if why), None)


def _describe(backend: str, device: str, precision: str) -> str:
    """The request in words: "TensorRT", "TensorRT on CPU (fp16)", "fp16 on CPU"."""
    where = f" on {device.upper()}" if device != "auto" else ""
    if backend == "auto":
        return f"{precision}{where}"
    return LABELS[backend] + where + (f" ({precision})" if precision != "fp32" else "")


def _check_args(backend: str, device: str, precision: str) -> None:
    for arg, value, allowed in (
        ("backend", backend, ("auto", *BACKENDS)), ("device", device, ("auto", *DEVICES)),
        ("precision", precision, PRECISIONS),
    ):
        if value not in allowed:
            raise ModelError(f"Argument \"{arg}\" must be one of {allowed}, not {value!r}")


def rank(backend: str = "auto", device: str = "auto", precision: str = "fp32", found: Probe | None = None) -> list[Choice]:
    """Every combination that can run here, best first. The first meets the request if
    anything does; otherwise all carry the reason the request could not be met."""
    _check_args(backend, device, precision)
    found = _probe() if found is None else found
    wanted = [(b, d) for b, d in PREFERENCE if backend in ("auto", b) and device in ("auto", d)]
    met = [Choice(b, d, precision) for b, d in wanted if unmet(b, d, precision, found) is None]
    if wanted:
        reason = unmet(*wanted[0], precision, found)
    else:
        reason = f"{LABELS[backend]} does not run on {device.upper()}"
    order = [(b, d, p) for p in dict.fromkeys((precision, "fp32")) for b, d in wanted]
    order += [(b, d, p) for p in dict.fromkeys((precision, "fp32")) for b, d in PREFERENCE]
    fallback = []
    for b, d, p in dict.fromkeys(order):
        if unmet(b, d, p, found) is None and Choice(b, d, p) not in met:
            fallback.append(Choice(b, d, p, reason))
    return met + fallback


def _fallback_line(asked: str, choice: Choice) -> str:
    return f"{asked} requested but {choice.fallback_reason}; using {choice}"


def select(
    backend: str = "auto", device: str = "auto", precision: str = "fp32", probe: Probe | None = None
) -> Choice:
    """The best allowed combination for the request; a fallback is logged in one WARNING line."""
    choices = rank(backend, device, precision, probe)
    if not choices:
        raise ModelError(f"no backend can run here: {(probe or _probe()).summary()}")
    choice = choices[0]
    if choice.fallback_reason:
        log.warning(_fallback_line(_describe(backend, device, precision), choice))
    return choice


def create_backend(
    spec: ModelSpec,
    backend: str = "auto",
    device: str = "auto",
    precision: str = "fp32",
    *,
    probe: Probe | None = None,
    warmup_shapes: Sequence[tuple[int, int]] | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    **common: Any,
) -> Backend:
    """Select a backend, load ``spec`` on it, and warm it up on ``warmup_shapes``.

    ``common`` options go to whichever backend is chosen; every backend takes
    ``reuse_outputs`` and ``threads`` (CPU threads, used by onnxruntime only);
    ``options[name]`` only to backend ``name`` (e.g. ``{"torch": {"cuda_graph": True}}``).
    With ``backend="auto"``, a backend that fails to load (e.g. no torch definition
    for a user's model) is logged and the next best is tried.
    """
    found = _probe() if probe is None else probe
    choices = rank(backend, device, precision, found)
    if not choices:
        raise ModelError(f"no backend can run {spec.ident} here: {found.summary()}")
    if choices[0].fallback_reason:
        log.warning(_fallback_line(_describe(backend, device, precision), choices[0]))
    options = options or {}
    for i, choice in enumerate(choices):
        try:
            model = create(
                choice.backend, spec, device=choice.device, precision=choice.precision,
                **common, **options.get(choice.backend, {}),
            )
        except ModelError as exc:
            if backend != "auto" or i + 1 == len(choices):
                raise
            log.warning("%s could not load %s (%s); trying %s", choice, spec.ident, exc, choices[i + 1])
            continue
        if warmup_shapes:
            model.warmup(list(warmup_shapes))
        log.info("%s: %s", spec.ident, model.info())
        return model
    raise AssertionError("unreachable")  # pragma: no cover
