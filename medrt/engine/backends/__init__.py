"""One module per runtime, each behind :class:`medrt.engine.backends.base.Backend`.

:data:`BACKENDS` maps a backend name to ``"module:Class"``; a module is imported
only when its backend is created, so naming a runtime that is not installed
costs nothing until it is asked for (and then gives a clear ModelError). The
table is read-only.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from medrt.engine.backends.base import Backend, BackendInfo
from medrt.engine.registry import ModelError, ModelSpec

__all__ = ["BACKENDS", "Backend", "BackendInfo", "backend_class", "create"]

BACKENDS: Mapping[str, str] = MappingProxyType(
    {
        "onnxruntime": "medrt.engine.backends.onnxrt:OnnxRuntimeBackend",
        "tensorrt": "medrt.engine.backends.tensorrt:TensorRTBackend",
        "torch": "medrt.engine.backends.torch_cuda:TorchCudaBackend",
    }
)


def backend_class(name: str) -> type[Backend]:
    """The class registered as ``name`` (imports its module, which imports no runtime)."""
    try:
        target = BACKENDS[name]
    except KeyError:
        raise ModelError(f"no backend named {name!r} (known: {', '.join(BACKENDS)})") from None
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)  # type: ignore[no-any-return]


def create(name: str, spec: ModelSpec, **options: Any) -> Backend:
    """Load ``spec`` with backend ``name``; ``options`` go to its constructor."""
    return backend_class(name)(spec, **options)  # type: ignore[call-arg]
