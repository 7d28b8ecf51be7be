"""INT8 against FP32 on the CPU: the quantized model must pass the accuracy gate."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from medrt.bench import SETTLE_S, interleaved_times, percentile

__all__ = ["int8_vs_fp32"]


def int8_vs_fp32(model: str = "lesion_unet_dx", size: int = 1024, repeats: int = 9) -> dict[str, Any]:
    """Quantize ``model`` (static QDQ, first/last layers FP32), gate it, and time both
    at ``size``² in turn on ONNX Runtime CPU."""
    from medrt.engine.backends.onnxrt import OnnxRuntimeBackend
    from medrt.engine.gate import compare
    from medrt.engine.quantize import quantize_int8
    from medrt.engine.registry import find_spec

    fp32 = find_spec(model)
    with tempfile.TemporaryDirectory(prefix="medrt-int8-") as tmp:
        int8 = quantize_int8(fp32, Path(tmp))
        gate = compare(fp32, int8)
        a = OnnxRuntimeBackend(fp32)
        b = OnnxRuntimeBackend(int8, precision="int8")
        x = np.random.default_rng(0).random((1, fp32.slices, size, size), dtype=np.float32)
        t = interleaved_times({"fp32": lambda: a.infer(x), "int8": lambda: b.infer(x)}, repeats=repeats, warmup=2,
                              settle_s=SETTLE_S)
    f, i = percentile(t["fp32"], 50), percentile(t["int8"], 50)
    return {"model": fp32.ident, "size": size, "fp32_ms_p50": round(f, 1), "int8_ms_p50": round(i, 1),
            "speedup": round(f / i, 2), "gate_passed": gate.passed, "gate": gate.message}
