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

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.input_name = spec.inputs[0].name
        self.output_names = [o.name for o in spec.outputs]

    @abc.abstractmethod
    def infer(self, x: np.ndarray) -> list[np.ndarray]:
        """Run the model on one NCHW float32 batch; outputs in the spec's order."""

    @abc.abstractmethod
    def info(self) -> BackendInfo: ...

    def warmup(self, shapes: list[tuple[int, int]], repeats: int = 2) -> None:
        """Run the real input shapes before the first real frame (no cold start)."""
        for h, w in shapes:
            x = np.zeros((1, getattr(self.spec, "slices", 1), h, w), np.float32)
            for _ in range(repeats):
                self.infer(x)
