"""Native TensorRT backend (TensorRT 10): an engine built from the model's ONNX file.

The engine is built once per (model, TensorRT version, GPU, precision, profile,
per-layer setting) and cached in :func:`medrt.engine.cache.cache_dir` (see
:mod:`medrt.engine.cache` for the key and the staleness rules). Device buffers
are torch CUDA tensors (torch with CUDA is the ``gpu``/``train`` extra and is
already there for the torch backend; it saves a second CUDA binding such as
cuda-python), fed through pinned host buffers like the torch backend.

Precision: ``fp16`` sets ``BuilderFlag.FP16``; ``int8`` needs an explicitly
quantized (QDQ) ONNX file and sets ``INT8`` (with ``FP16`` for the layers that
are not quantized). With ``keep_io_layers_fp32`` the layers up to the first
convolution and the last convolution are constrained to fp32
(``PREFER_PRECISION_CONSTRAINTS``, see :func:`fp32_layers`): they see raw
intensities and produce the logits, where half precision costs the most.
These weakly-typed flags exist in TensorRT 10 and were removed in 11; a TensorRT
without them gets a clear error.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from medrt.engine import cache
from medrt.engine.backends.base import Backend, BackendInfo
from medrt.engine.backends.torch_cuda import _Slot, import_torch, require_cuda, to_host
from medrt.engine.registry import ModelError, ModelSpec, sha256_file

__all__ = ["TensorRTBackend"]

log = logging.getLogger(__name__)

# precision -> builder flags (names in trt.BuilderFlag)
PRECISION_FLAGS: Mapping[str, tuple[str, ...]] = {"fp32": (), "fp16": ("FP16",), "int8": ("INT8", "FP16")}
WORKSPACE_BYTES = 4 << 30


def _import_tensorrt() -> Any:
    try:
        import tensorrt as trt
    except Exception as exc:  # ImportError, or an OSError from a missing libnvinfer
        raise ModelError(f"the tensorrt backend needs TensorRT 10 (pip install 'medrt[trt]'): {exc}") from None
    return trt


def _profile_arg(spec: ModelSpec, profile: Mapping[str, Sequence[Sequence[int]]] | None) -> cache.Profile:
    if profile is None:
        return cache.default_profile(spec)
    out = []
    for name, shapes in profile.items():
        if len(shapes) != 3:
            raise ModelError(f"Argument \"profile\" must map an input name to (min, opt, max), not {shapes!r}")
        mn, opt, mx = (tuple(int(d) for d in s) for s in shapes)
        out.append((name, mn, opt, mx))
    return tuple(out)


def fp32_layers(trt: Any, layers: Sequence[Any]) -> list[Any]:
    """The layers ``keep_io_layers_fp32`` keeps in float32: every float layer up to and
    including the first convolution (the shipped networks' fixed local-contrast front
    amplifies differences of a few thousandths by 25-200 there, which half precision
    turns into noise: in torch, fp16 flipped 13 % of a nodule's pixels), and the last
    convolution, which produces the logits. Layers are in topological order."""
    convs = [i for i, layer in enumerate(layers) if layer.type == trt.LayerType.CONVOLUTION]
    if not convs:
        return []
    front = [layer for layer in layers[: convs[0] + 1]
             if layer.num_outputs and layer.get_output(0).dtype in (trt.float32, trt.float16)]
    return list({id(layer): layer for layer in [*front, layers[convs[-1]]]}.values())


class TensorRTBackend(Backend):
    """A TensorRT engine for one model on one CUDA device.

    ``profile`` maps the input name to (min, opt, max) NCHW shapes (default:
    :func:`medrt.engine.cache.default_profile`). The engine lives in
    ``cache_folder`` (default :func:`medrt.engine.cache.cache_dir`) under its key,
    or at ``engine_path`` when one is pinned; a stale engine is rebuilt when
    ``rebuild_stale``, else refused with a ModelError naming what differs.
    ``reuse_outputs`` as for the other backends.
    """

    name = "tensorrt"

    def __init__(
        self,
        spec: ModelSpec,
        *,
        device: str = "cuda",
        precision: str = "fp32",
        profile: Mapping[str, Sequence[Sequence[int]]] | None = None,
        keep_io_layers_fp32: bool = True,
        cache_folder: str | Path | None = None,
        engine_path: str | Path | None = None,
        rebuild_stale: bool = True,
        workspace_bytes: int = WORKSPACE_BYTES,
        max_shapes: int = 16,
        reuse_outputs: bool = False,
        # onnxruntime's CPU threads: taken (and unused) so that every backend accepts
        # create_backend's common options.
        threads: int | None = None,
    ) -> None:
        if precision not in PRECISION_FLAGS:
            raise ModelError(f"Argument \"precision\" must be one of {tuple(PRECISION_FLAGS)}, not {precision!r}")
        super().__init__(spec)
        torch = import_torch()
        self._torch = torch
        self.device = require_cuda(torch, device)
        trt = _import_tensorrt()
        self._trt = trt
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)  # kept: it must outlive the engines it made
        self.precision = precision
        self.few_shapes = True  # a shape outside the engine's profile is refused
        self.keep_io_layers_fp32 = keep_io_layers_fp32
        self.workspace_bytes = workspace_bytes
        major, minor = torch.cuda.get_device_capability(self.device)
        self.key = cache.EngineKey(
            onnx_sha256=sha256_file(spec.path),
            tensorrt_version=str(trt.__version__),
            gpu_name=torch.cuda.get_device_name(self.device),
            compute_capability=f"{major}.{minor}",
            precision=precision,
            profile=_profile_arg(spec, profile),
            keep_io_layers_fp32=keep_io_layers_fp32 and precision != "fp32",  # no-op at fp32
        )
        if engine_path is not None:
            self.engine_path = Path(engine_path)
        else:
            folder = Path(cache_folder) if cache_folder is not None else None
            self.engine_path = cache.engine_files(self.key, folder)[0]
        with torch.cuda.device(self.device):
            self.engine = self._load_or_build(rebuild_stale)
            self.context = self.engine.create_execution_context()
            self.stream = torch.cuda.Stream(self.device)
        self._check_io()
        self.max_shapes = max(1, max_shapes)
        self.reuse_outputs = reuse_outputs
        self._slots: OrderedDict[tuple[int, ...], tuple[_Slot, list[Any]]] = OrderedDict()
        self._lock = threading.Lock()

    # ---- engine ------------------------------------------------------------------------
    def _load_or_build(self, rebuild_stale: bool) -> Any:
        return cache.get_or_build(
            self.engine_path, self.key, self._runtime.deserialize_cuda_engine, self._build,
            rebuild_stale=rebuild_stale, what=self.spec.ident,
        )

    def _build(self) -> bytes:
        trt = self._trt
        missing = [f for f in PRECISION_FLAGS[self.precision] if not hasattr(trt.BuilderFlag, f)]
        if missing:
            raise ModelError(
                f"TensorRT {trt.__version__} has no BuilderFlag {missing}; medrt builds {self.precision} "
                "engines with TensorRT 10.x"
            )
        log.info("%s: building a TensorRT %s engine (takes a minute or so, once)", self.spec.ident, self.precision)
        builder = trt.Builder(self._logger)
        network = builder.create_network(0)  # explicit batch is the only mode in TensorRT 10
        parser = trt.OnnxParser(network, self._logger)
        if not parser.parse_from_file(str(self.spec.path)):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise ModelError(f"{self.spec.path}: TensorRT cannot parse the ONNX file ({errors})")
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, self.workspace_bytes)
        profile = builder.create_optimization_profile()
        for name, mn, opt, mx in self.key.profile:
            profile.set_shape(name, mn, opt, mx)
        config.add_optimization_profile(profile)
        for flag in PRECISION_FLAGS[self.precision]:
            config.set_flag(getattr(trt.BuilderFlag, flag))
        layers = [network.get_layer(i) for i in range(network.num_layers)]
        if self.precision == "int8" and not any(
            layer.type in (trt.LayerType.QUANTIZE, trt.LayerType.DEQUANTIZE) for layer in layers
        ):
            raise ModelError(
                f"{self.spec.path}: int8 needs a QDQ-quantized ONNX file (explicit quantization); "
                "this one has no QuantizeLinear/DequantizeLinear nodes"
            )
        if self.keep_io_layers_fp32 and self.precision != "fp32":
            for layer in fp32_layers(trt, layers):
                layer.precision = trt.float32
                layer.set_output_type(0, trt.float32)
            config.set_flag(trt.BuilderFlag.PREFER_PRECISION_CONSTRAINTS)
        serialized = builder.build_serialized_network(network, config)
        if serialized is None:
            raise ModelError(f"{self.spec.ident}: TensorRT failed to build a {self.precision} engine (see its log)")
        return bytes(serialized)

    def _check_io(self) -> None:
        trt = self._trt
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        outputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        if inputs != [self.input_name] or sorted(outputs) != sorted(self.output_names):
            raise ModelError(
                f"{self.spec.spec_path}: the engine's tensors (inputs {inputs}, outputs {outputs}) differ "
                f"from the spec's ({self.input_name}, {self.output_names})"
            )

    # ---- inference ---------------------------------------------------------------------
    def _slot(self, shape: tuple[int, ...]) -> tuple[_Slot, list[Any]]:
        entry = self._slots.get(shape)
        if entry is not None:
            self._slots.move_to_end(shape)
            return entry
        torch, trt = self._torch, self._trt
        _, mn, _, mx = next(p for p in self.key.profile if p[0] == self.input_name)
        if len(shape) != len(mn) or any(not lo <= d <= hi for d, lo, hi in zip(shape, mn, mx, strict=False)):
            raise ModelError(f"{self.spec.ident}: input shape {shape} is outside the engine's profile {mn}..{mx}")
        if not self.context.set_input_shape(self.input_name, shape):
            raise ModelError(f"{self.spec.ident}: TensorRT rejects input shape {shape}")
        dev_out = []
        for name in self.output_names:
            dtype = torch.from_numpy(np.empty(0, trt.nptype(self.engine.get_tensor_dtype(name)))).dtype
            dev_out.append(torch.empty(tuple(self.context.get_tensor_shape(name)), dtype=dtype, device=self.device))
        slot = _Slot(
            host_in=torch.empty(shape, dtype=torch.float32, pin_memory=True),
            dev_in=torch.empty(shape, dtype=torch.float32, device=self.device),
        )
        self._slots[shape] = (slot, dev_out)
        while len(self._slots) > self.max_shapes:
            self._slots.popitem(last=False)
        return slot, dev_out

    def infer(self, x: np.ndarray) -> list[np.ndarray]:
        torch = self._torch
        x = np.ascontiguousarray(x, dtype=np.float32)
        with self._lock, torch.cuda.stream(self.stream):
            slot, dev_out = self._slot(tuple(x.shape))
            np.copyto(slot.host_in.numpy(), x)
            slot.dev_in.copy_(slot.host_in, non_blocking=True)
            self.context.set_input_shape(self.input_name, tuple(x.shape))
            self.context.set_tensor_address(self.input_name, slot.dev_in.data_ptr())
            for name, out in zip(self.output_names, dev_out, strict=True):
                self.context.set_tensor_address(name, out.data_ptr())
            if not self.context.execute_async_v3(self.stream.cuda_stream):
                raise ModelError(f"{self.spec.ident}: TensorRT execution failed for shape {x.shape}")
            return to_host(torch, dev_out, slot.host_out, self.stream, self.reuse_outputs)

    def info(self) -> BackendInfo:
        return BackendInfo(self.name, str(self.device), self.precision, self.spec.ident, None)
