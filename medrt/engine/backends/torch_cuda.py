"""torch CUDA backend: the training network with its weights resident in VRAM.

On a CUDA machine without TensorRT this is the fast path that can still be
measured. The network comes from :mod:`medrt.models.networks` (the definitions
the shipped ONNX files were exported from) and its weights from the ``.pt``
state dict shipped next to the ONNX file. Weights are loaded and moved to the
GPU once; per input shape the backend keeps a pinned host input buffer, a
device input buffer and pinned host output buffers, so a frame costs one
non-blocking H2D copy, the network, one non-blocking D2H copy per output and
one stream synchronisation. With ``cuda_graph=True`` the network is captured
once per input shape (up to ``max_graphs``) and replayed.

``device="cpu"`` runs the same code without pinned memory, streams or graphs.
It exists to check this backend's logic (and ``benchmarks/gpu_check.py
--dry-run``) on machines without a GPU; it is not in the selection allow-list.

torch is imported in the constructor (the ``train``/``gpu`` extra), never at
module level.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from medrt.engine.backends.base import Backend, BackendInfo
from medrt.engine.registry import ModelError, ModelSpec

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["TorchCudaBackend", "require_cuda", "weights_path"]

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "fp16")


def import_torch() -> Any:
    """The torch module, or a ModelError that says which extra to install."""
    try:
        import torch
    except ImportError as exc:
        raise ModelError(f"the torch backend needs torch with CUDA (pip install 'medrt[train]'): {exc}") from None
    return torch


def require_cuda(torch: Any, device: str) -> torch.device:
    """``device`` ("cuda" or "cuda:N") as a torch device, or a clear ModelError without CUDA."""
    if not str(device).startswith("cuda"):
        raise ModelError(f"Argument \"device\" must be 'cuda' or 'cuda:N' for this backend, not {device!r}")
    if not torch.cuda.is_available():
        build = f"torch {torch.__version__}" + ("" if torch.version.cuda else " (a CPU-only build)")
        raise ModelError(f"no CUDA device is available to {build}; use the onnxruntime backend on the CPU")
    dev = torch.device(device)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise ModelError(f"CUDA device {index} does not exist ({torch.cuda.device_count()} found)")
    return torch.device("cuda", index)


def weights_path(spec: ModelSpec, weights: str | Path | None = None) -> Path:
    """The ``.pt`` state dict: ``weights`` if given, else ``<onnx stem>.pt`` or ``<name>.pt`` beside the ONNX."""
    candidates = [Path(weights)] if weights else [spec.path.with_suffix(".pt"), spec.path.parent / f"{spec.name}.pt"]
    for path in candidates:
        if path.is_file():
            return path
    raise ModelError(
        f"{spec.ident}: torch weights not found (looked for {', '.join(str(p) for p in candidates)}); "
        "the torch backend needs the .pt state dict saved by models/train.py"
    )


def build_network(spec: ModelSpec, path: Path) -> Any:
    """The torch module for a spec with the weights at ``path`` loaded: RoiNet for a
    roi_classifier, the MONAI UNet variant by name; its inputs (local contrast, edge
    channel) and presence pooling as the saved weights say, so every shipped version loads."""
    from medrt.models.networks import UNET_VARIANTS, network_for

    if spec.task != "roi_classifier" and spec.name not in UNET_VARIANTS:
        raise ModelError(
            f"{spec.ident}: no torch network definition for this model (known: roi_classifier, "
            f"{', '.join(UNET_VARIANTS)}); run it with onnxruntime or tensorrt"
        )
    torch = import_torch()
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        return network_for(spec.name, state, roi=spec.task == "roi_classifier")
    except Exception as exc:  # torch raises RuntimeError/UnpicklingError/KeyError here
        raise ModelError(f"{path}: cannot load these weights into {spec.ident}'s network ({exc})") from exc


@dataclass(slots=True)
class _Slot:
    """Buffers (and optionally a captured graph) for one input shape."""

    host_in: Any  # pinned float32
    dev_in: Any  # float32 on the device
    host_out: list[Any] = field(default_factory=list)  # pinned float32, one per output
    graph: Any = None  # torch.cuda.CUDAGraph
    graph_out: list[Any] = field(default_factory=list)  # the graph's static outputs


def to_host(torch: Any, outs: list[Any], slot_out: list[Any], stream: Any, reuse: bool) -> list[np.ndarray]:
    """Copy device outputs into pinned buffers (allocated on first use), wait, return numpy.

    ``stream`` None means the CPU: plain buffers, nothing to wait for."""
    if not slot_out:
        pinned = stream is not None
        slot_out.extend(torch.empty(tuple(o.shape), dtype=torch.float32, pin_memory=pinned) for o in outs)
    for host, dev in zip(slot_out, outs, strict=True):
        host.copy_(dev, non_blocking=stream is not None)
    if stream is not None:
        stream.synchronize()
    arrays = [h.numpy() for h in slot_out]
    return arrays if reuse else [a.copy() for a in arrays]


class TorchCudaBackend(Backend):
    """The torch network on one CUDA device, weights resident, fp32 or fp16.

    ``reuse_outputs=True`` returns the pinned output buffers themselves (valid
    until the next call with the same input shape); the default returns copies
    that the caller may keep. Not for concurrent calls from several threads: a
    lock serialises them (one backend serves one pipeline stage).
    """

    name = "torch"

    def __init__(
        self,
        spec: ModelSpec,
        *,
        device: str = "cuda",
        precision: str = "fp32",
        weights: str | Path | None = None,
        channels_last: bool = True,
        cuda_graph: bool = False,
        max_graphs: int = 8,
        max_shapes: int = 32,
        max_batch: int = 8,
        cudnn_benchmark: bool = True,
        reuse_outputs: bool = False,
        # onnxruntime's CPU threads: taken (and unused) so that every backend accepts
        # create_backend's common options.
        threads: int | None = None,
    ) -> None:
        if precision not in PRECISIONS:
            raise ModelError(f"Argument \"precision\" must be one of {PRECISIONS} for the torch backend, not {precision!r}")
        super().__init__(spec)
        torch = import_torch()
        self._torch = torch
        on_cpu = device == "cpu"
        if on_cpu and cuda_graph:
            raise ModelError("CUDA graphs need a CUDA device; cuda_graph=True with device='cpu'")
        self.device = torch.device("cpu") if on_cpu else require_cuda(torch, device)
        path = weights_path(spec, weights)
        net = build_network(spec, path)
        self.precision = precision
        self.dtype = torch.float16 if precision == "fp16" else torch.float32
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.channels_last = channels_last
        # cudnn picks the fastest convolution per input shape (a process-wide setting; shapes
        # here are few and warmed up, so the one-off search is paid before the first frame).
        if not on_cpu:
            torch.backends.cudnn.benchmark = cudnn_benchmark
        vram = torch.cuda.memory_allocated if not on_cpu else (lambda _device: 0)
        before = vram(self.device)
        self.net = net.eval().to(self.device, dtype=self.dtype, memory_format=self.memory_format)
        self.stream = None if on_cpu else torch.cuda.Stream(self.device)
        if self.stream is not None:
            torch.cuda.synchronize(self.device)
        self.vram_bytes = int(vram(self.device) - before)
        self.weights = path
        self.cuda_graph = cuda_graph
        self.max_graphs = max_graphs
        self.max_shapes = max(1, max_shapes)
        self.max_batch = max(1, max_batch)  # the network takes any batch; the analysis stacks views
        self.few_shapes = not on_cpu
        self.reuse_outputs = reuse_outputs
        self._slots: OrderedDict[tuple[int, ...], _Slot] = OrderedDict()
        self._lock = threading.Lock()
        log.info(
            "%s on %s (%s, %s, weights %.1f MiB resident, %s)",
            spec.ident, "CPU" if on_cpu else torch.cuda.get_device_name(self.device), precision,
            "channels_last" if channels_last else "contiguous", self.vram_bytes / 2**20,
            "CUDA graphs" if cuda_graph else "eager",
        )

    def _forward(self, x: Any) -> list[Any]:
        # A network whose fixed front must see float32 (networks.LocalContrastUNet) casts
        # to its weights' precision itself, after the front.
        dtype = self._torch.float32 if getattr(self.net, "fp32_input", False) else self.dtype
        out = self.net(x.to(dtype, memory_format=self.memory_format))
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if len(outs) != len(self.output_names):
            raise ModelError(f"{self.spec.ident}: the network gives {len(outs)} outputs, the spec names {self.output_names}")
        return [o.float() for o in outs]

    def _capture(self, slot: _Slot) -> None:
        torch = self._torch
        for _ in range(2):  # let cudnn choose kernels and allocate outside the capture
            self._forward(slot.dev_in)
        self.stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=self.stream):
            slot.graph_out = self._forward(slot.dev_in)
        slot.graph = graph

    def _slot(self, shape: tuple[int, ...]) -> _Slot:
        slot = self._slots.get(shape)
        if slot is not None:
            self._slots.move_to_end(shape)
            return slot
        torch = self._torch
        slot = _Slot(
            host_in=torch.empty(shape, dtype=torch.float32, pin_memory=self.stream is not None),
            dev_in=torch.empty(shape, dtype=torch.float32, device=self.device),
        )
        self._slots[shape] = slot
        while len(self._slots) > self.max_shapes:
            self._slots.popitem(last=False)
        return slot

    def infer(self, x: np.ndarray) -> list[np.ndarray]:
        torch = self._torch
        x = np.ascontiguousarray(x, dtype=np.float32)
        on_stream = torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()
        with self._lock, torch.inference_mode(), on_stream:
            slot = self._slot(tuple(x.shape))
            np.copyto(slot.host_in.numpy(), x)
            slot.dev_in.copy_(slot.host_in, non_blocking=self.stream is not None)
            if self.cuda_graph and slot.graph is None and self.graphs < self.max_graphs:
                self._capture(slot)
            if slot.graph is not None:
                slot.graph.replay()
                outs = slot.graph_out
            else:
                outs = self._forward(slot.dev_in)
            return to_host(torch, outs, slot.host_out, self.stream, self.reuse_outputs)

    @property
    def graphs(self) -> int:
        """How many input shapes have a captured CUDA graph."""
        return sum(1 for s in self._slots.values() if s.graph is not None)

    def info(self) -> BackendInfo:
        return BackendInfo(self.name, str(self.device), self.precision, self.spec.ident, None)
