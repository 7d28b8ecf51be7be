"""Model specs: each shipped or user-supplied ONNX model is described by a TOML file.

The spec carries what a runtime needs to feed the model and read its outputs
(names, shapes, normalisation, thresholds) and the file's sha256: loading refuses
a model file whose hash differs from its spec. The format is documented in
``models/README.md`` ("bring your own model").
"""

from __future__ import annotations

import hashlib
import math
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from medrt.errors import MedrtError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "ModelError",
    "ModelIntegrityError",
    "ModelSpec",
    "TensorSpec",
    "load_spec",
    "shipped_models_dir",
    "shipped_specs",
    "find_spec",
    "resolve_spec_path",
    "sha256_file",
    "size_text",
]

TASKS = ("segmentation", "roi_classifier")
NORMALIZATIONS = ("window", "fixed_window")
ACTIVATIONS = ("sigmoid", "none")  # the analysis reads logits; "none": the output is a probability


class ModelError(MedrtError):
    """A model or its spec cannot be used; the message names the file and the reason."""


class ModelIntegrityError(ModelError):
    """A model file's sha256 differs from the one in its spec (tampered or stale)."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    shape: tuple[int | str, ...]
    dtype: str = "float32"
    meaning: str = ""
    activation: str = "none"  # "sigmoid" when the output is a logit


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A model file and what it needs. ``path`` is the resolved ONNX file."""

    name: str
    version: str
    task: str
    path: Path
    sha256: str
    spec_path: Path
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    normalization: str = "window"
    window: tuple[float, float] | None = None  # (center, width) for fixed_window
    multiple_of: int = 1
    thumbnail: int = 0  # roi_classifier: longest thumbnail side
    stride: int = 1  # roi_classifier: heatmap cell size in thumbnail pixels
    # segmentation: the pixel spacing (mm) the network was trained at; much finer frames
    # are area-averaged to it first (medrt.analysis.resample). None: always native.
    spacing_mm: float | None = None
    # the DICOM Modality values the model was trained for (e.g. ("CT",)); () = any.
    modalities: tuple[str, ...] = ()
    # the BodyPartExamined and ViewPosition values it takes (e.g. ("CHEST",), ("PA", "AP"));
    # () = any, and a header that names none is taken too (medrt.engine.routing.fits)
    body_parts: tuple[str, ...] = ()
    views: tuple[str, ...] = ()
    # the anatomical planes it takes (("AXIAL",) for a CT model trained on axial slices)
    planes: tuple[str, ...] = ()
    # 3 = 2.5-D, the input's channels are the slice before, this slice and the slice
    # after (medrt.analysis.slices; an ROI classifier: their thumbnails); 1 = this slice alone.
    slices: int = 1
    # 2.5-D: the distance (mm) of the neighbouring slices the model learnt; the slice
    # nearest it on each side is taken (a thin-slice series' next slice is almost this
    # one). None: the next slice, whatever its distance.
    neighbour_mm: float | None = None
    thresholds: dict[str, float] = field(default_factory=dict)
    description: str = ""
    card: Path | None = None
    training: dict[str, Any] = field(default_factory=dict)
    # [quantization]: how an INT8 model was made from its FP32 original (medrt.engine.quantize)
    quantization: dict[str, Any] = field(default_factory=dict)

    @property
    def ident(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def own_window(self) -> tuple[float, float] | None:
        """(center, width) of a ``fixed_window`` model; None for one normalised by each
        frame's VOI window."""
        return self.window if self.normalization == "fixed_window" else None

    def input_window(self, window: Any) -> tuple[float, float]:
        """The (center, width) this model's input is normalised by: :attr:`own_window`,
        else ``window``, the frame's VOI window (a ``Window`` or a pair)."""
        if self.own_window is not None:
            return self.own_window
        if hasattr(window, "center"):
            return (float(window.center), float(window.width))
        return (float(window[0]), float(window[1]))

    def output(self, name: str) -> TensorSpec:
        for out in self.outputs:
            if out.name == name:
                return out
        raise ModelError(f"{self.spec_path}: no output named {name!r}")

    def verify(self) -> None:
        """Raise :class:`ModelIntegrityError` unless the file's sha256 matches the spec."""
        if not self.path.exists():
            raise ModelError(f"{self.spec_path}: model file {self.path} does not exist")
        if not self.path.is_file():
            raise ModelError(f"{self.spec_path}: model file {self.path} is not a regular file")
        try:
            actual = sha256_file(self.path)
        except OSError as exc:  # unreadable (permissions): one line naming it, not a traceback
            raise ModelError(f"{self.spec_path}: model file {self.path} cannot be read: "
                             f"{exc.strerror or exc}") from None
        if actual != self.sha256:
            raise ModelIntegrityError(
                f"{self.path}: sha256 {actual[:16]}… does not match {self.sha256[:16]}… in "
                f"{self.spec_path.name}; the file was changed or the spec is stale. "
                "Refusing to load it."
            )


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fp:
        for chunk in iter(lambda: fp.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


THRESHOLD_KEYS = ("probability", "confirm", "presence", "heatmap")
TENSOR_DTYPES = ("float32", "float16")


def _number(value: Any, what: str, where: str, *, integer: bool = False, low: float | None = None,
            high: float | None = None, low_open: bool = False) -> Any:
    """``value`` as a finite float (or int), within [low, high] (``low_open``: above low);
    else a ModelError naming the spec and the key (a bare float() gave a traceback)."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if ok and integer:
        ok = float(value).is_integer()
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        kind = "a whole number" if integer else "a number"
        bounds = ("" if low is None and high is None else
                  f" {'above' if low_open else 'from'} {low:g}" + (f" to {high:g}" if high is not None else ""))
        raise ModelError(f"{where}: {what} must be {kind}{bounds}, not {value!r}")
    return int(value) if integer else float(value)


def _thresholds(doc: dict[str, Any], where: str) -> dict[str, float]:
    """``[thresholds]``: probabilities in [0, 1], by known name (a misspelt key was silently
    replaced by the default before)."""
    table = doc.get("thresholds", {})
    if not isinstance(table, dict):
        raise ModelError(f"{where}: [thresholds] must be a table, not {table!r}")
    unknown = [k for k in table if k not in THRESHOLD_KEYS]
    if unknown:
        raise ModelError(f"{where}: [thresholds] {unknown[0]!r} is not a threshold medrt reads "
                         f"({', '.join(THRESHOLD_KEYS)})")
    return {k: _number(v, f"[thresholds] {k}", where, low=0.0, high=1.0) for k, v in table.items()}


def _require(table: dict[str, Any], key: str, where: str) -> Any:
    if key not in table:
        raise ModelError(f"{where}: missing required key {key!r}")
    return table[key]


def _tensors(items: Any, where: str) -> tuple[TensorSpec, ...]:
    if not isinstance(items, list) or not items:
        raise ModelError(f"{where}: must be a non-empty list of tables")
    out = []
    for i, item in enumerate(items):
        loc = f"{where}[{i}]"
        shape = tuple(_require(item, "shape", loc))
        activation = str(item.get("activation", "none"))
        if activation not in ACTIVATIONS:
            raise ModelError(f"{loc}: activation must be one of {ACTIVATIONS} (a logit, or already a "
                             f"probability), not {activation!r}")
        dtype = str(item.get("dtype", "float32"))
        if dtype not in TENSOR_DTYPES:
            raise ModelError(f"{loc}: dtype must be one of {TENSOR_DTYPES}, not {dtype!r}")
        out.append(
            TensorSpec(
                name=str(_require(item, "name", loc)),
                shape=shape,
                dtype=dtype,
                meaning=str(item.get("meaning", "")),
                activation=activation,
            )
        )
    return tuple(out)


def _spacing(model: dict[str, Any], task: str, where: str) -> float | None:
    """``[model] spacing_mm``: a positive number of mm, for segmentation models only."""
    if "spacing_mm" not in model:
        return None
    value = model["spacing_mm"]
    if task != "segmentation":
        raise ModelError(f"{where}: [model] spacing_mm applies to segmentation models only, not {task!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < float(value) < float("inf"):
        raise ModelError(f"{where}: [model] spacing_mm must be a positive number of mm, not {value!r}")
    return float(value)


def _terms(model: dict[str, Any], key: str, what: str, where: str) -> tuple[str, ...]:
    """``[model] modalities`` (DICOM Modality values: ``["CT"]``, ``["DX", "CR"]``),
    ``body_parts`` (BodyPartExamined: ``["CHEST"]``) or ``views`` (ViewPosition:
    ``["PA", "AP"]``); absent = any."""
    value = model.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ModelError(f"{where}: [model] {key} must be a list of {what} values, not {value!r}")
    return tuple(" ".join(v.split()).upper() for v in value)  # "dx  for processing" = "DX FOR PROCESSING"


def _planes(model: dict[str, Any], where: str) -> tuple[str, ...]:
    """``[model] planes``: AXIAL, CORONAL and/or SAGITTAL (:attr:`medrt.types.Geometry.plane`)."""
    planes = _terms(model, "planes", "anatomical plane", where)
    wrong = [p for p in planes if p not in ("AXIAL", "CORONAL", "SAGITTAL")]
    if wrong:
        raise ModelError(f"{where}: [model] planes takes AXIAL, CORONAL and SAGITTAL, not {wrong[0]!r}")
    return planes


def _neighbour_mm(model: dict[str, Any], where: str) -> float | None:
    """``[model] neighbour_mm``: a positive distance, for a 2.5-D model (``slices = 3``)."""
    value = model.get("neighbour_mm")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < float(value) <= 10.0:
        raise ModelError(f"{where}: [model] neighbour_mm must be a distance in mm (0-10), not {value!r}")
    if model.get("slices", 1) != 3:
        raise ModelError(f"{where}: [model] neighbour_mm is for a 2.5-D model (slices = 3)")
    return float(value)


def _slices(model: dict[str, Any], task: str, inputs: tuple[TensorSpec, ...], where: str) -> int:
    """``[model] slices``: 1 (default) or 3 (2.5-D), for segmentation models and ROI
    classifiers; with 3, the input's channel dimension, when the spec gives a number,
    must be 3 (other mismatches with the graph are ``medrt models verify``'s to find)."""
    value = model.get("slices", 1)
    if isinstance(value, bool) or value not in (1, 3):
        raise ModelError(f"{where}: [model] slices must be 1 or 3, not {value!r}")
    if value != 1 and task not in ("segmentation", "roi_classifier"):
        raise ModelError(f"{where}: [model] slices applies to segmentation models and ROI classifiers only, "
                         f"not {task!r}")
    shape = inputs[0].shape
    if value == 3 and len(shape) == 4 and isinstance(shape[1], int) and shape[1] != value:
        raise ModelError(f"{where}: the input has {shape[1]} channel(s) but [model] slices is {value}")
    return int(value)


def load_spec(spec_path: str | Path, *, verify: bool = True) -> ModelSpec:
    """Read a model spec TOML; with ``verify`` (the default) check the model's sha256."""
    spec_path = Path(spec_path)
    try:
        doc = tomllib.loads(spec_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelError(f"{spec_path}: no such model spec") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelError(f"{spec_path}: cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ModelError(f"{spec_path}: not valid TOML ({exc})") from None
    where = str(spec_path)
    model = _require(doc, "model", where)
    task = str(_require(model, "task", f"{where} [model]"))
    if task not in TASKS:
        raise ModelError(f"{where}: [model] task must be one of {TASKS}, not {task!r}")
    norm = doc.get("normalization", {})
    method = str(norm.get("method", "window"))
    if method not in NORMALIZATIONS:
        raise ModelError(f"{where}: [normalization] method must be one of {NORMALIZATIONS}, not {method!r}")
    window = None
    if method == "fixed_window":
        window = (_number(_require(norm, "center", where), "[normalization] center", where),
                  _number(_require(norm, "width", where), "[normalization] width", where, low=0.0, low_open=True))
    card = model.get("card")
    inputs = _tensors(doc.get("inputs"), f"{where} [[inputs]]")
    spec = ModelSpec(
        name=str(_require(model, "name", f"{where} [model]")),
        version=str(_require(model, "version", f"{where} [model]")),
        task=task,
        path=(spec_path.parent / str(_require(model, "file", f"{where} [model]"))).resolve(),
        sha256=str(_require(model, "sha256", f"{where} [model]")).lower(),
        spec_path=spec_path.resolve(),
        inputs=inputs,
        outputs=_tensors(doc.get("outputs"), f"{where} [[outputs]]"),
        normalization=method,
        window=window,
        multiple_of=_number(model.get("multiple_of", 1), "[model] multiple_of", where, integer=True, low=1),
        thumbnail=_number(model.get("thumbnail", 0), "[model] thumbnail", where, integer=True, low=0),
        stride=_number(model.get("stride", 1), "[model] stride", where, integer=True, low=1),
        spacing_mm=_spacing(model, task, where),
        modalities=_terms(model, "modalities", "DICOM Modality", where),
        body_parts=_terms(model, "body_parts", "BodyPartExamined", where),
        views=_terms(model, "views", "ViewPosition", where),
        planes=_planes(model, where),
        slices=_slices(model, task, inputs, where),
        neighbour_mm=_neighbour_mm(model, where),
        thresholds=_thresholds(doc, where),
        description=str(model.get("description", "")),
        card=(spec_path.parent / str(card)).resolve() if card else None,
        training=dict(doc.get("training", {})),
        quantization=dict(doc.get("quantization", {})),
    )
    if task == "roi_classifier" and spec.thumbnail <= 0:
        raise ModelError(f"{where}: a roi_classifier needs [model] thumbnail (longest side, pixels)")
    if verify:
        spec.verify()
    return spec


def shipped_models_dir() -> Path:
    """The folder of the models shipped with medrt (``models/``, installed as ``medrt.models``)."""
    return Path(str(resources.files("medrt.models")))


def shipped_specs(*, verify: bool = True) -> list[ModelSpec]:
    return [load_spec(p, verify=verify) for p in sorted(shipped_models_dir().glob("*.toml"))]


def resolve_spec_path(name_or_path: str | Path) -> Path:
    """The spec file a path (a ``.toml`` file) or a shipped model's name stands for."""
    candidate = Path(name_or_path)
    if candidate.suffix == ".toml" or candidate.exists():
        return candidate
    path = shipped_models_dir() / f"{name_or_path}.toml"
    if not path.is_file():
        names = ", ".join(p.stem for p in sorted(shipped_models_dir().glob("*.toml"))) or "none"
        raise ModelError(f"no shipped model named {name_or_path!r} (shipped: {names})")
    return path


def find_spec(name_or_path: str | Path, *, verify: bool = True) -> ModelSpec:
    """A spec by path (a ``.toml`` file) or by the name of a shipped model."""
    return load_spec(resolve_spec_path(name_or_path), verify=verify)


def size_text(n_bytes: int | None) -> str:
    """A model file's size as every command prints it: binary units, MiB from 0.1 MiB, else KiB."""
    if n_bytes is None:
        return "-"
    return f"{n_bytes / 2**20:.1f} MiB" if n_bytes >= 2**20 // 10 else f"{n_bytes / 2**10:.1f} KiB"
