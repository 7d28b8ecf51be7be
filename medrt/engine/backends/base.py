"""The interface every runtime implements: load once, warm up, infer, describe itself."""

from __future__ import annotations

import abc
from dataclasses import dataclass

import numpy as np

from medrt.engine.registry import ModelSpec

__all__ = ["Backend", "BackendInfo"]


@dataclass(frozen=True, slots=True)
class BackendInfo:
    backend: str
    device: str
    precision: str
    model: str
    threads: int | None = None


class Backend(abc.ABC):
    """A loaded model on one device. Created once per process; serves every frame."""

    name = "base"
    # The most inputs of one shape that one ``infer`` call takes stacked on the batch axis
    # (the analysis batches the fine sweep's views up to it). 1: one input per call, as
    # the shipped ONNX graphs (batch fixed at 1) need.
    max_batch = 1
    # True where a new input shape is costly (cudnn's algorithm search, a CUDA graph
    # capture, a TensorRT profile): the analysis then keeps its inputs to a few sizes
    # and warms them up (the fine sweep's views, medrt.analysis.sweep). On the CPU a new
    # shape costs little, and larger inputs cost time.
    few_shapes = False

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.input_name = spec.inputs[0].name
        self.output_names = [o.name for o in spec.outputs]

    @abc.abstractmethod
    def infer(self, x: np.ndarray) -> list[np.ndarray]:
        """Run the model on one NCHW float32 batch; outputs in the spec's order."""

    @abc.abstractmethod
    def info(self) -> BackendInfo: ...

    def warmup(self, shapes: list[tuple[int, int]], repeats: int = 2, batch: int = 1) -> None:
        """Run the real input shapes before the first real frame (no cold start); ``batch``
        inputs per call (at most ``max_batch``)."""
        for h, w in shapes:
            x = np.zeros((min(batch, self.max_batch), getattr(self.spec, "slices", 1), h, w), np.float32)
            for _ in range(repeats):
                self.infer(x)
