"""ONNX Runtime backend: CPU, and CUDA or the TensorRT execution provider where installed.

Providers are chosen explicitly and checked against what this onnxruntime build
offers (``onnxruntime`` is CPU-only; ``onnxruntime-gpu``, the ``gpu`` extra,
adds CUDA and TensorRT). Inference goes through IO binding: per input shape the
backend keeps a binding whose outputs are preallocated numpy buffers, so a frame
allocates nothing. The first call for a new shape runs the session once to learn
the output shapes (the models have dynamic H/W), then binds buffers of those
shapes for every later call.

Threads: ``intra_op_num_threads`` = the cores this process may use (one
convolution uses them all; a model serves one frame at a time),
``inter_op_num_threads`` = 1 (the networks are chains, so a second pool would
only compete with the pipeline's decode and pre-processing threads). An ROI
classifier's pool does not spin-wait for more work after a run (ORT's
``session.intra_op.allow_spinning``): its run is always followed at once by the
segmenter's in another session, whose threads the spinning ones starved. On this
2-core machine a CT slice on the ROI path took 23.6 ms with it and 11.6 ms without
(segment stage 15.4 → 6.9 ms); turning it off for the segmenters too cost them more
than it gave back (12.7 ms).

Memory: on the CPU every session takes its buffers from one arena for the process
(:func:`shared_cpu_arena`: ORT's environment allocator, ``session.use_env_allocators``).
Each session kept an arena of its own, grown to its own peak over the shapes it had seen,
and none gave any back, though the models run one after another: the listener held
1,560 MB after 8 series with them and 1,227 MB with one (``medrt bench --only
listener_memory --series 8``), and each model ran within a few per cent of its time
with its own (``benchmarks/ort_arena.py``: both kinds side by side, three runs; a 1024²
crop 1-3 % slower, small shapes either way by noise). ``shared_arena=False`` gives a
session its own. ORT's BFC arena allocates, frees and shrinks under one lock, so sessions
run at once from any threads with the outputs of their own arenas, bit for bit (tests).
Over many frame sizes it stays bounded, like an arena each (``benchmarks/ort_arena_shapes.py``);
ORT's per-run ``memory.enable_memory_arena_shrinkage`` works on it, but shrinking every run
cost changing shapes 12-19 % (docs/performance-log.md, session 44), so it is not used.
ORT's memory pattern (``SessionOptions.enable_mem_pattern``), which from a shape's second
run takes that run's buffers as one block planned on its first, is off on the CPU: over 30
frame sizes it grew the arena again on the second pass (+173 MB, 950 -> 1,123; off +11), and
it held more on one shape too (``lesion_unet_dx`` at 1024² 315 against 227 MB,
``lesion_unet_lite`` at 512² 145 against 126), at no speed measurable here: off/on 0.93-1.04
on one shape, 0.99-1.04 over the sizes (``benchmarks/ort_mem_pattern.py``; docs/performance-log.md,
session 44). ``mem_pattern=True`` turns it back on; a GPU provider keeps ORT's default (on),
not measured there.

Graph: an FP32 model on the CPU is loaded with each convolution of a channel
``Concat`` written as a sum of convolutions (:func:`medrt.engine.rewrite.concat_as_sum`:
the same function, float rounding aside; 2-6 % faster for the UNets here), in memory:
the file, its sha256 and the spec stay as they are. ``split_concats=False`` loads the
file as it is.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from medrt.bands import usable_cores
from medrt.engine.backends.base import Backend, BackendInfo
from medrt.engine.registry import ModelError, ModelSpec

__all__ = ["OnnxRuntimeBackend", "providers_for", "shared_cpu_arena"]

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "fp16", "int8")
CPU, CUDA, TRT = "CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider"
GPU_HINT = "install onnxruntime-gpu (pip install 'medrt[gpu]') on a machine with an NVIDIA driver"

ProviderArg = str | tuple[str, dict[str, Any]]

_ARENA_LOCK = threading.Lock()
_arena_registered = False
# OrtArenaCfg's arena_extend_strategy: 0 kNextPowerOfTwo (ORT's default), 1 kSameAsRequested
# (which held 1,281 MB in the listener against 1,227 MB, and ran small shapes 5-12 % slower)
NEXT_POWER_OF_TWO = 0


def shared_cpu_arena() -> bool:
    """Register, once per process, the CPU arena every session made with
    ``shared_arena=True`` takes its buffers from (ORT's environment allocator: no
    limit, grown as ORT grows its own). Returns False where this onnxruntime cannot
    (the session then keeps an arena of its own)."""
    global _arena_registered
    import onnxruntime as ort

    with _ARENA_LOCK:
        if not _arena_registered:
            try:
                cfg = ort.OrtArenaCfg(0, NEXT_POWER_OF_TWO, -1, -1)
                info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
                ort.create_and_register_allocator(info, cfg)
            except Exception as exc:  # an onnxruntime without environment allocators
                log.info("onnxruntime %s: no shared CPU arena (%s); each model keeps its own", ort.__version__, exc)
                return False
            _arena_registered = True
        return True


def providers_for(device: str, precision: str) -> list[ProviderArg]:
    """The provider list for a device and precision.

    ``cpu`` runs fp32, or int8 for a QDQ-quantized model (the backend swaps an FP32
    spec for its gated INT8 twin, :func:`medrt.engine.int8cache.gated_int8`). ``cuda`` runs fp32 on
    the CUDA provider; fp16 and int8 on CUDA go through the TensorRT provider
    (its engines cached under :func:`medrt.engine.cache.cache_dir` ``("ort-trt")``),
    with CUDA then CPU behind it for the nodes TensorRT does not take.
    """
    from medrt.engine.cache import cache_dir

    kind, _, index = device.partition(":")
    if kind == "cpu":
        if precision == "fp16":
            raise ModelError("onnxruntime on the CPU runs fp32 or int8 (a QDQ model), not fp16")
        return [CPU]
    if kind != "cuda":
        raise ModelError(f"Argument \"device\" must be 'cpu', 'cuda' or 'cuda:N', not {device!r}")
    dev = int(index or 0)
    cuda: ProviderArg = (CUDA, {"device_id": dev})
    if precision == "fp32":
        return [cuda, CPU]
    trt_opts = {
        "device_id": dev,
        "trt_fp16_enable": True,
        "trt_int8_enable": precision == "int8",
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": str(cache_dir("ort-trt")),
    }
    return [(TRT, trt_opts), cuda, CPU]


def _name(p: ProviderArg) -> str:
    return p if isinstance(p, str) else p[0]


def _cpu_graph(spec: ModelSpec) -> tuple[str | bytes, tuple[str, ...]]:
    """``spec``'s model for ORT's CPU provider: serialized with
    :func:`~medrt.engine.rewrite.concat_as_sum` applied, or its path where nothing changes
    (or the file keeps its weights outside it, or cannot be read here: ORT then says why)."""
    import onnx

    from medrt.engine.rewrite import concat_as_sum

    try:
        model = onnx.load(str(spec.path), load_external_data=False)
    except Exception:  # noqa: BLE001 - InferenceSession reports an unreadable file
        return str(spec.path), ()
    if any(i.data_location == onnx.TensorProto.EXTERNAL for i in model.graph.initializer):
        return str(spec.path), ()
    try:
        rewritten, names = concat_as_sum(model)
    except Exception as exc:  # noqa: BLE001 - a speed-up must never stop a model that loads as it is
        log.warning("%s: loaded as it is (the Concat rewrite failed: %s)", spec.ident, exc)
        return str(spec.path), ()
    if not names:
        return str(spec.path), ()
    log.debug("%s: %d Concat -> Conv as sums of convolutions", spec.ident, len(names))
    return rewritten.SerializeToString(), tuple(names)


class OnnxRuntimeBackend(Backend):
    """One InferenceSession per model, created once, with explicit providers and threads.

    ``providers`` (names or ``(name, options)`` pairs) overrides what ``device``
    and ``precision`` would choose. ``reuse_outputs=True`` returns the bound
    output buffers themselves (valid until the next call with the same input
    shape on the same thread); the default returns copies the caller may keep.
    ``profile_prefix`` turns on ORT's per-node profiler, its chrome trace written under
    that prefix when ``session.end_profiling()`` is called (:mod:`medrt.bench.profile`).
    ``mem_pattern`` sets ORT's memory pattern (None: off on the CPU; with a GPU provider
    ORT's default, on: module docstring); ``shared_arena=False`` gives the session a CPU
    arena of its own.

    Calls from several threads run at once: ONNX Runtime's ``Run`` is thread-safe
    and releases the GIL, and each thread has its own IO bindings and output
    buffers. (A lock around one shared binding made a pipeline's inference workers
    take turns: two threads ran 0.98x the frames of one.)
    """

    name = "onnxruntime"

    def __init__(
        self,
        spec: ModelSpec,
        *,
        providers: Sequence[ProviderArg] | None = None,
        device: str = "cpu",
        precision: str = "fp32",
        threads: int | None = None,
        io_binding: bool = True,
        reuse_outputs: bool = False,
        max_shapes: int = 16,
        split_concats: bool = True,
        shared_arena: bool = True,
        profile_prefix: str | None = None,
        mem_pattern: bool | None = None,
    ) -> None:
        import onnxruntime as ort

        if precision not in PRECISIONS:
            raise ModelError(f"Argument \"precision\" must be one of {PRECISIONS}, not {precision!r}")
        chosen = list(providers) if providers else providers_for(device, precision)
        if precision == "int8" and _name(chosen[0]) == CPU and not spec.quantization:
            # INT8 on the CPU runs a QDQ model: an FP32 spec gets its gated twin, made on
            # first use and cached (refused with the figures if it loses accuracy).
            from medrt.engine.int8cache import gated_int8

            spec = gated_int8(spec)
        super().__init__(spec)
        self.precision = precision
        available = ort.get_available_providers()
        missing = [_name(p) for p in chosen if _name(p) not in available]
        if missing:
            raise ModelError(
                f"onnxruntime {ort.__version__} here has no {', '.join(missing)} "
                f"(available: {', '.join(available)}); {GPU_HINT}"
            )
        if precision == "fp16" and not any(_name(p) == TRT for p in chosen):
            raise ModelError("fp16 with onnxruntime needs the TensorrtExecutionProvider (the model file is fp32)")
        opts = ort.SessionOptions()
        self.threads = threads or usable_cores()  # ORT's intra-op threads by default: every usable core
        opts.intra_op_num_threads = self.threads
        opts.inter_op_num_threads = 1
        if spec.task == "roi_classifier":  # another session runs right after it (module docstring)
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # ORT's memory pattern: off on the CPU, ORT's default (on) on a GPU (module docstring)
        self.mem_pattern = _name(chosen[0]) != CPU if mem_pattern is None else mem_pattern
        opts.enable_mem_pattern = self.mem_pattern
        # the process's one CPU arena (module docstring); a GPU provider's memory is its own
        self.shared_arena = shared_arena and _name(chosen[0]) == CPU and shared_cpu_arena()
        if self.shared_arena:
            opts.add_session_config_entry("session.use_env_allocators", "1")
        if profile_prefix is not None:  # medrt bench --profile-layers: this very session, its graph and options
            opts.enable_profiling = True
            opts.profile_file_prefix = profile_prefix
        source: str | bytes = str(spec.path)
        self.rewritten: tuple[str, ...] = ()  # the Concat nodes concat_as_sum replaced
        if split_concats and _name(chosen[0]) == CPU and precision == "fp32" and not spec.quantization:
            source, self.rewritten = _cpu_graph(spec)
        try:
            self.session = ort.InferenceSession(source, opts, providers=chosen)
        except Exception as exc:  # onnxruntime raises its own exception types
            raise ModelError(f"{spec.path}: onnxruntime cannot load the model ({exc})") from exc
        self.providers = list(self.session.get_providers())
        self.few_shapes = self.providers[0] != "CPUExecutionProvider"
        if _name(chosen[0]) not in self.providers:  # ORT falls back silently when a provider fails to start
            raise ModelError(
                f"{spec.ident}: onnxruntime could not start {_name(chosen[0])} (active: {self.providers}); "
                "are the CUDA/cuDNN/TensorRT libraries it needs installed?"
            )
        graph_inputs = {i.name for i in self.session.get_inputs()}
        graph_outputs = {o.name for o in self.session.get_outputs()}
        missing = [n for n in [self.input_name] if n not in graph_inputs] + [
            n for n in self.output_names if n not in graph_outputs
        ]
        if missing:
            raise ModelError(f"{spec.spec_path}: names {missing} are not in the ONNX graph of {spec.path.name}")
        _check_graph_shapes(spec, self.session)
        self.io_binding = io_binding
        self.reuse_outputs = reuse_outputs
        self.max_shapes = max(1, max_shapes)
        self._local = threading.local()  # per thread: {input shape: (binding, output buffers)}

    @property
    def _bound(self) -> OrderedDict[tuple[int, ...], tuple[Any, list[np.ndarray]]]:
        """This thread's bindings, least recently used first."""
        bound = getattr(self._local, "bound", None)
        if bound is None:
            bound = self._local.bound = OrderedDict()
        return bound

    def _run(self, x: np.ndarray) -> list[np.ndarray]:
        return self.session.run(self.output_names, {self.input_name: x})

    def _bind(self, x: np.ndarray) -> tuple[Any, list[np.ndarray], list[np.ndarray] | None]:
        """The binding and output buffers for ``x.shape``; for a new shape also this run's result."""
        shape = tuple(x.shape)
        bound = self._bound
        entry = bound.get(shape)
        if entry is not None:
            bound.move_to_end(shape)
            return entry[0], entry[1], None
        first = self._run(x)
        buffers = [np.empty(a.shape, a.dtype) for a in first]
        binding = self.session.io_binding()
        for name, buf in zip(self.output_names, buffers, strict=True):
            binding.bind_output(name, "cpu", 0, buf.dtype, list(buf.shape), buf.ctypes.data)
        bound[shape] = (binding, buffers)
        while len(bound) > self.max_shapes:
            bound.popitem(last=False)
        for buf, a in zip(buffers, first, strict=True):
            np.copyto(buf, a)
        return binding, buffers, first

    def infer(self, x: np.ndarray) -> list[np.ndarray]:
        x = np.ascontiguousarray(x, dtype=np.float32)
        if not self.io_binding:
            return self._run(x)
        binding, buffers, first = self._bind(x)
        if first is None:
            binding.bind_cpu_input(self.input_name, x)
            self.session.run_with_iobinding(binding)
            binding.clear_binding_inputs()  # drop the reference to the caller's array
        elif not self.reuse_outputs:
            return first
        return buffers if self.reuse_outputs else [b.copy() for b in buffers]

    def info(self) -> BackendInfo:
        device = "cuda" if any(p in (CUDA, TRT) for p in self.providers[:1]) else "cpu"
        return BackendInfo(self.name, device, self.precision, self.spec.ident, self.threads)


def _check_graph_shapes(spec: Any, session: Any) -> None:
    """What medrt feeds and reads, against the graph, at load (``medrt models verify`` did
    some of it, batch none: a fixed-size input crashed every run with onnxruntime's
    traceback, a two-channel output had its background channel read as lesions)."""
    if spec.task != "segmentation":
        return
    node = next(i for i in session.get_inputs() if i.name == spec.inputs[0].name)
    dims = list(node.shape)
    if len(dims) == 4 and isinstance(dims[2], int) and isinstance(dims[3], int):
        raise ModelError(f"{spec.spec_path}: the input of {spec.path.name} is fixed at {dims[2]}x{dims[3]}; medrt "
                         "feeds crops and frames of many sizes, so a segmentation model needs dynamic H and W "
                         "(export it with dynamic axes)")
    for out in session.get_outputs():
        if out.name in {t.name for t in spec.outputs}:
            shape = list(out.shape)
            if len(shape) == 4 and isinstance(shape[1], int) and shape[1] != 1:
                raise ModelError(f"{spec.spec_path}: output {out.name!r} of {spec.path.name} has {shape[1]} channels; "
                                 "a segmentation output must be one lesion channel [N, 1, H, W] (export the "
                                 "lesion channel alone, or its probability)")
