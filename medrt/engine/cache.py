"""The TensorRT engine cache: where engines live, what they are keyed by, when one is stale.

Pure Python (no ``tensorrt`` import), so the key and the staleness rules are
tested on machines without a GPU. An engine is only valid for the exact ONNX
file, TensorRT version, GPU model, compute capability, precision, optimisation
profile and per-layer precision setting it was built with; all of these go into
the key, and a JSON sidecar next to each engine records them in the clear so a
mismatch can be named field by field.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from medrt.engine.registry import ModelError, ModelSpec
from medrt.io.atomic import atomic_write_bytes

__all__ = [
    "EngineKey",
    "get_or_build",
    "Profile",
    "cache_dir",
    "default_profile",
    "engine_files",
    "stale_fields",
    "describe_stale",
    "write_engine",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
Shape = tuple[int, ...]
# One entry per network input: (name, min shape, opt shape, max shape).
Profile = tuple[tuple[str, Shape, Shape, Shape], ...]

SIDECAR_FORMAT = 1


def cache_dir(kind: str = "trt") -> Path:
    """``$MEDRT_CACHE/<kind>`` if set, else ``$XDG_CACHE_HOME/medrt/<kind>`` (default ``~/.cache``)."""
    root = os.environ.get("MEDRT_CACHE")
    if root:
        return Path(root).expanduser() / kind
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "medrt" / kind


FP32_LAYER_RULE = "front+first+last conv"  # see backends.tensorrt.fp32_layers


@dataclass(frozen=True, slots=True)
class EngineKey:
    """Everything a serialized engine depends on. Two equal keys give interchangeable engines."""

    onnx_sha256: str
    tensorrt_version: str
    gpu_name: str
    compute_capability: str  # "9.0"
    precision: str
    profile: Profile
    keep_io_layers_fp32: bool

    def fields(self) -> dict[str, Any]:
        """The key's fields as JSON values (the sidecar's content)."""
        return {
            "onnx_sha256": self.onnx_sha256,
            "tensorrt_version": self.tensorrt_version,
            "gpu_name": self.gpu_name,
            "compute_capability": self.compute_capability,
            "precision": self.precision,
            "profile": {name: [list(mn), list(opt), list(mx)] for name, mn, opt, mx in self.profile},
            # what "keep" covers changed (front layers too, medrt 0.1): a new value, so
            # engines built under the old rule are stale rather than silently reused
            "keep_io_layers_fp32": FP32_LAYER_RULE if self.keep_io_layers_fp32 else False,
        }

    @property
    def digest(self) -> str:
        blob = json.dumps(self.fields(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _round_up(n: int, m: int) -> int:
    return int(math.ceil(n / m) * m)


def default_profile(spec: ModelSpec, opt: tuple[int, int] | None = None, max_side: int | None = None) -> Profile:
    """Min/opt/max input shapes for the model's one image input.

    A roi_classifier sees thumbnails: up to ``thumbnail``² (rounded to the model's
    multiple). A segmentation model sees 1024² crops (opt), down to small recheck
    regions and up to 2048² (a 2×-upsampled recheck of a large region). Fixed
    dimensions in the spec (batch, channels) stay fixed; a named batch is 1.
    """
    inp = spec.inputs[0]
    if len(inp.shape) != 4:
        raise ModelError(f"{spec.spec_path}: input {inp.name!r} must be NCHW, not {inp.shape}")
    n, c = (d if isinstance(d, int) else 1 for d in inp.shape[:2])
    m = max(1, spec.multiple_of, spec.stride if spec.task == "roi_classifier" else 1)
    lo = _round_up(32, m)
    if spec.task == "roi_classifier":
        hi = _round_up(max_side or spec.thumbnail, m)
        best = opt or (hi, hi)
    else:
        hi = _round_up(max_side or 2048, m)
        best = opt or (1024, 1024)
    fixed = {i: d for i, d in enumerate(inp.shape) if isinstance(d, int)}
    if 2 in fixed or 3 in fixed:  # a fixed-size model: one shape only
        h, w = fixed.get(2, best[0]), fixed.get(3, best[1])
        return ((inp.name, (n, c, h, w), (n, c, h, w), (n, c, h, w)),)
    if not (lo <= best[0] <= hi and lo <= best[1] <= hi):
        raise ModelError(f"optimisation shape {best} is outside {lo}..{hi} for {spec.ident}")
    return ((inp.name, (n, c, lo, lo), (n, c, best[0], best[1]), (n, c, hi, hi)),)


def engine_files(key: EngineKey, folder: Path | None = None) -> tuple[Path, Path]:
    """``(<key>.engine, <key>.json)`` in ``folder`` (default: :func:`cache_dir`)."""
    folder = folder if folder is not None else cache_dir("trt")
    return folder / f"{key.digest}.engine", folder / f"{key.digest}.json"


def sidecar_for(engine: Path) -> Path:
    return engine.with_suffix(".json")


def stale_fields(sidecar: Path, expected: EngineKey) -> dict[str, tuple[Any, Any]]:
    """Fields whose recorded value differs from ``expected``: ``{name: (engine's, now)}``.

    Empty means the engine was built for exactly this model, machine and setting.
    A missing, unreadable or malformed sidecar is stale as a whole (key ``"sidecar"``).
    """
    want = expected.fields()
    try:
        doc = json.loads(sidecar.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {"sidecar": ("missing", str(sidecar))}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return {"sidecar": (f"unreadable ({exc})", "valid JSON")}
    if not isinstance(doc, dict) or not isinstance(doc.get("fields"), dict):
        return {"sidecar": ("malformed", "a JSON object with 'fields'")}
    have = doc["fields"]
    out = {name: (have.get(name, "<absent>"), value) for name, value in want.items() if have.get(name) != value}
    if not out and doc.get("key") != expected.digest:
        out["key"] = (doc.get("key"), expected.digest)
    return out


def describe_stale(mismatch: Mapping[str, tuple[Any, Any]]) -> str:
    """One line naming each mismatched field: ``precision: engine 'fp32', now 'fp16'; …``."""
    return "; ".join(f"{name}: engine {old!r}, now {new!r}" for name, (old, new) in mismatch.items())


def write_engine(engine: Path, data: bytes, key: EngineKey) -> None:
    """Write the engine, then its sidecar, each atomically (a reader never sees half a file)."""
    atomic_write_bytes(engine, data)
    doc = {"format": SIDECAR_FORMAT, "key": key.digest, "fields": key.fields(), "bytes": len(data)}
    atomic_write_bytes(sidecar_for(engine), json.dumps(doc, indent=2, sort_keys=True).encode("utf-8"))


def get_or_build(
    engine: Path,
    key: EngineKey,
    deserialize: Callable[[bytes], T | None],
    build: Callable[[], bytes],
    *,
    rebuild_stale: bool = True,
    what: str = "model",
) -> T:
    """The engine at ``engine`` if it is valid for ``key``, else a freshly built (and stored) one.

    An engine is stale when its sidecar is missing, unreadable or records other
    fields, or when ``deserialize`` fails on it (returns None or raises). A stale
    engine is rebuilt when ``rebuild_stale`` (with a WARNING naming the fields),
    else a :class:`ModelError` names them. No engine at all is simply built.
    """
    if engine.is_file():
        mismatch = stale_fields(sidecar_for(engine), key)
        if not mismatch:
            try:
                loaded = deserialize(engine.read_bytes())
                why = "does not deserialize"
            except Exception as exc:  # TensorRT raises RuntimeError/TypeError on foreign bytes
                loaded, why = None, f"does not deserialize ({exc})"
            if loaded is not None:
                log.info("%s: TensorRT engine from cache %s", what, engine)
                return loaded
            mismatch = {"engine": (why, f"an engine for TensorRT {key.tensorrt_version}")}
        detail = describe_stale(mismatch)
        if not rebuild_stale:
            raise ModelError(
                f"{engine}: stale TensorRT engine for {what} ({detail}); delete it, or allow a rebuild "
                "(rebuild_stale=True)"
            )
        log.warning("%s: rebuilding stale TensorRT engine %s (%s)", what, engine.name, detail)
    data = build()
    write_engine(engine, data, key)
    loaded = deserialize(data)
    if loaded is None:
        raise ModelError(f"{what}: TensorRT built an engine it cannot deserialize")
    return loaded
