"""ONNX Runtime backend (CPU here; CUDA and TensorRT execution providers where installed)."""

from __future__ import annotations

import logging
import os

import numpy as np

from medrt.engine.backends.base import Backend, BackendInfo
from medrt.engine.registry import ModelError, ModelSpec

__all__ = ["OnnxRuntimeBackend"]

log = logging.getLogger(__name__)


class OnnxRuntimeBackend(Backend):
    """One InferenceSession per model, created once, with explicit providers and threads."""

    name = "onnxruntime"

    def __init__(self, spec: ModelSpec, *, providers: list[str] | None = None, threads: int | None = None) -> None:
        import onnxruntime as ort

        super().__init__(spec)
        opts = ort.SessionOptions()
        self.threads = threads or os.cpu_count() or 1
        opts.intra_op_num_threads = self.threads
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.providers = providers or ["CPUExecutionProvider"]
        try:
            self.session = ort.InferenceSession(str(spec.path), opts, providers=self.providers)
        except Exception as exc:  # onnxruntime raises its own exception types
            raise ModelError(f"{spec.path}: onnxruntime cannot load the model ({exc})") from exc
        graph_inputs = {i.name for i in self.session.get_inputs()}
        graph_outputs = {o.name for o in self.session.get_outputs()}
        missing = [n for n in [self.input_name] if n not in graph_inputs] + [
            n for n in self.output_names if n not in graph_outputs
        ]
        if missing:
            raise ModelError(f"{spec.spec_path}: names {missing} are not in the ONNX graph of {spec.path.name}")

    def infer(self, x: np.ndarray) -> list[np.ndarray]:
        return self.session.run(self.output_names, {self.input_name: np.ascontiguousarray(x, dtype=np.float32)})

    def info(self) -> BackendInfo:
        device = "cuda" if any("CUDA" in p or "Tensorrt" in p for p in self.providers) else "cpu"
        return BackendInfo(self.name, device, "fp32", self.spec.ident, self.threads)
