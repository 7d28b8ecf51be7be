"""INT8 post-training quantization of a model spec (ONNX Runtime static quantization, QDQ).

``quantize_int8`` pre-processes the FP32 model (shape inference, basic graph
optimisation), calibrates activation ranges on phantom frames that include the
edge cases a lesion model must keep (tiny, faint and bright lesions, lesions
across the frame border, empty frames), and writes ``<name>_int8.onnx`` with a
spec next to it. The first and last convolutions stay FP32 by default, with
everything between them and the graph's inputs and outputs: the first sees the raw
intensities, the last makes the logits that get thresholded.

Before quantizing, :func:`medrt.engine.rewrite.cpu_friendly` replaces ``PRelu``
and ``ConvTranspose`` by exact equivalents that have INT8 kernels in ORT's CPU
provider (``LeakyRelu``; ``Conv`` + a channels-last pixel shuffle): without it a MONAI UNet's
activations and up-sampling stayed FP32 and its INT8 model ran 1.05× FP32.

Activations are QUInt8 and weights QInt8 (U8S8), the ORT choice for x86 CPUs;
with VNNI (AVX512-VNNI / AVX-VNNI) ``reduce_range`` is not needed. A quantized
model is not trusted until :mod:`medrt.engine.gate` has compared it with its
FP32 original on the validation phantoms.

Needs ``onnx`` and ``onnxruntime.quantization`` (imported when called).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from medrt.bundle import _toml
from medrt.engine.registry import ModelError, ModelSpec, load_spec, sha256_file
from medrt.engine.rewrite import cpu_friendly
from medrt.preprocess import normalize, pad_to_multiple

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

if TYPE_CHECKING:  # pragma: no cover - typing only
    import onnx

    from medrt.phantom.frame import PhantomFrame

__all__ = [
    "CALIBRATION_SEED",
    "COMPUTE_OPS",
    "FLOAT_OPS",
    "INT8_OPS",
    "calibration_inputs",
    "calibration_description",
    "first_last_compute_nodes",
    "move_quantized",
    "quantize_int8",
]

log = logging.getLogger(__name__)

# Calibration frames come from their own seed range: training starts at 1000 and the
# held-out validation (the gate) at 9000 (medrt.models.data).
CALIBRATION_SEED = 5000
# Ops that carry weights: "first" and "last" layers are the ones of these nearest the
# graph's inputs and outputs. ConvTranspose counts: MONAI's UNet ends with one.
COMPUTE_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
# Ops left in float: onnxruntime's CPU provider has no INT8 kernel for them, so quantizing
# them only wraps a float op in Dequantize/Quantize (measured: lesion_unet at 1024² runs
# faster with its ConvTranspose layers left alone).
FLOAT_OPS = ("ConvTranspose",)
# Ops quantized beyond onnxruntime's QDQ registry: ORT's CPU provider fuses them with their
# Q/DQ pairs into INT8 kernels (QLinearLeakyRelu, QLinearConcat) or runs them on the 8-bit
# tensor (DepthToSpace, like the registry's Transpose and Reshape of the rewritten
# up-sampling), so the activations stay 8-bit between convolutions.
INT8_OPS = ("LeakyRelu", "Concat", "DepthToSpace")
# Ops that read only a tensor's shape: no data flows through them, so they do not make a
# layer "first" or "last" (the rewritten up-sampling takes its output shape from its input).
SHAPE_OPS = ("Shape", "Size")
CROP = 1024  # the ROI path's crop side
_MARGIN = 64  # pixels kept around a lesion in a calibration crop
_TINY_MM = 5.0


# --------------------------------------------------------------------------- calibration


def _category(frame: PhantomFrame, region: tuple[int, int, int, int] | None = None) -> str:
    """The edge case a frame (or a crop of it) stands for: border, tiny, faint, bright, empty."""
    lesions = frame.lesions
    if region is not None:
        r0, c0, r1, c1 = region
        lesions = tuple(t for t in lesions if t.bbox[0] < r1 and t.bbox[2] > r0 and t.bbox[1] < c1 and t.bbox[3] > c0)
    if not lesions:
        return "empty"
    if any(t.extras.get("border") for t in lesions):
        return "border"
    if any(t.diameter_mm < _TINY_MM for t in lesions):
        return "tiny"
    if any(t.kind == "faint" for t in lesions):
        return "faint"
    return "bright"


def _crop(norm: np.ndarray, box: tuple[int, int, int, int]) -> np.ndarray:
    """``norm[box]``, zero-padded where the box reaches past the frame (as the ROI path pads)."""
    r0, c0, r1, c1 = box
    out = np.zeros((r1 - r0, c1 - c0), np.float32)
    rows, cols = norm.shape
    rr0, cc0, rr1, cc1 = max(r0, 0), max(c0, 0), min(r1, rows), min(c1, cols)
    out[rr0 - r0 : rr1 - r0, cc0 - c0 : cc1 - c0] = norm[rr0:rr1, cc0:cc1]
    return out


def _empty_box(frame: PhantomFrame) -> tuple[int, int, int, int] | None:
    rows, cols = frame.shape
    low_r, low_c = rows - CROP, cols - CROP
    for r0, c0 in ((low_r // 2, low_c // 2), (0, 0), (low_r, 0), (0, low_c), (low_r, low_c)):
        if r0 >= 0 and c0 >= 0 and not frame.labels[r0 : r0 + CROP, c0 : c0 + CROP].any():
            return (r0, c0, r0 + CROP, c0 + CROP)
    return None


def _segmentation_items(seed: int, n_ct: int, n_dx: int, spacing_mm: float | None,
                        slices: int = 1) -> Iterator[tuple[str, np.ndarray]]:
    """(category, normalised input): CT slices 512², then 1024² crops of 4096² radiographs,
    area-averaged to the model's ``spacing_mm`` as the analysis feeds them (a 0.5 mm
    model gets a 0.125 mm radiograph's crop as 256²). ``slices=3``: (3, H, W) stacks,
    a CT slice with its neighbours in the series and a radiograph as its own."""
    from medrt.analysis.resample import area_downsample, resample_factors
    from medrt.analysis.roi import plan_crops, proposals_from_boxes
    from medrt.analysis.slices import phantom_input
    from medrt.phantom import generate_ct_series, generate_radiograph

    for s in range(math.ceil(n_ct / 12)):
        series = generate_ct_series(seed + 100 + s, n_frames=40)
        for frame in series:
            yield "ct-" + _category(frame), phantom_input(frame, series, slices)
    for i in range(math.ceil(n_dx / 4)):
        frame = generate_radiograph(seed, size=4096, index=i, n_lesions=3, border_lesion=True, far_apart=i % 2 == 1)
        norm = normalize(frame.pixels, *frame.window)
        factors = resample_factors(frame.spacing_mm, spacing_mm)
        props = proposals_from_boxes([t.bbox for t in frame.lesions], frame.shape, _MARGIN)
        boxes = list(plan_crops(props, frame.shape, CROP)) if props else []
        empty = _empty_box(frame)
        if empty is not None:
            boxes.append(empty)
        for box in boxes:
            x = area_downsample(_crop(norm, box), factors)
            yield "dx-" + _category(frame, box), (np.stack([x] * 3) if slices == 3 else x)


def _roi_items(thumb: int, seed: int, n: int, slices: int = 1) -> Iterator[tuple[str, np.ndarray]]:
    """(category, normalised thumbnail) of CT slices and 4096² radiographs; ``slices=3``:
    (3, h, w) stacks, a CT slice's thumbnail with its neighbours' and a radiograph's
    thrice, as :func:`medrt.analysis.roi.classify` feeds a 2.5-D classifier."""
    from medrt.analysis.roi import thumbnail_input
    from medrt.analysis.slices import phantom_sides
    from medrt.phantom import generate_ct_series, generate_radiograph

    series = [generate_ct_series(seed + 100 + s, n_frames=40) for s in range(math.ceil(n / 24))]
    frames: Iterable[tuple[PhantomFrame, Any]] = ((f, ser) for ser in series for f in ser)
    for kind, frame_iter in (("ct", frames), ("dx", (
        (generate_radiograph(seed, size=4096, index=i, border_lesion=i % 2 == 0, n_lesions=i % 3), ())
        for i in range(max(2, n // 4))
    ))):  # fmt: skip
        for frame, ser in frame_iter:
            sides = phantom_sides(frame, ser) if slices == 3 else (None, None)
            x, _ = thumbnail_input(frame.pixels, frame.window, thumb, slices, sides)
            yield f"{kind}-{_category(frame)}", x  # padded to ``mult`` by _cached_inputs


def _balanced(items: Iterable[tuple[str, np.ndarray]], n: int, ct_share: float = 0.5) -> list[np.ndarray]:
    """Up to ``n`` inputs, ``ct_share`` of them CT and the rest DX (topped up from the other
    where one runs short), each picked round-robin over the edge-case categories."""
    pools: dict[str, dict[str, list[np.ndarray]]] = {"ct": {}, "dx": {}}
    for cat, x in items:
        kind, sub = cat.split("-", 1)
        pools[kind].setdefault(sub, []).append(x)

    def pick(cats: dict[str, list[np.ndarray]], k: int) -> list[np.ndarray]:
        out: list[np.ndarray] = []
        while len(out) < k and any(cats.values()):
            for sub in ("border", "tiny", "faint", "bright", "empty"):
                if cats.get(sub) and len(out) < k:
                    out.append(cats[sub].pop(0))
        return out

    n_ct = round(n * ct_share)
    chosen = pick(pools["ct"], n_ct) + pick(pools["dx"], n - n_ct)
    return chosen + pick(pools["ct"], n - len(chosen))


@functools.lru_cache(maxsize=4)
def _cached_inputs(task: str, thumb: int, mult: int, seed: int, n: int,
                   spacing_mm: float | None, slices: int = 1, ct_share: float = 0.5) -> tuple[np.ndarray, ...]:
    if task == "roi_classifier":
        items = _roi_items(thumb, seed, n, slices)
    else:
        n_ct = round(n * ct_share)
        items = _segmentation_items(seed, n_ct, max(n - n_ct, 0), spacing_mm, slices)
    out = []
    for x in _balanced(items, n, ct_share):
        x = pad_to_multiple(np.ascontiguousarray(x, np.float32), mult)[0]
        x = x[None] if x.ndim == 3 else x[None, None]
        x.flags.writeable = False
        out.append(x)
    return tuple(out)


def _ct_share(spec: ModelSpec) -> float:
    modalities = set(getattr(spec, "modalities", ()) or ())
    if not modalities or spec.task == "roi_classifier":
        return 0.5
    return 1.0 if modalities <= {"CT"} else 0.0 if "CT" not in modalities else 0.5


def calibration_inputs(spec: ModelSpec, seed: int = CALIBRATION_SEED, n: int | None = None) -> list[np.ndarray]:
    """``n`` NCHW float32 inputs the model sees at run time, edge cases included
    (default 24; 48 for a CT-only model, see below).

    Segmentation: half CT slices (512², normalised by their window, as the analysis
    does), half 1024² crops of 4096² radiographs around lesions (border-crossing
    ones at the crop edge, tiny and faint ones) and lesion-free crops, resampled to
    the spec's ``spacing_mm`` when it names one (as the analysis does); each half
    is picked round-robin over border / tiny / faint / bright / empty. A model whose
    spec lists only CT (``[model] modalities``) is calibrated on CT slices alone (with
    their neighbours for a 2.5-D one), one that lists only radiographs on radiograph
    crops alone: the inputs it will see. A CT-only model gets 48 slices from two
    series by default: the 2.5-D ``lesion_unet_lite`` 2.0 calibrated on 24 slices of one
    series lost one of the gate's 29 lesions (refused), on 48 it lost none. An ROI
    classifier gets the thumbnails of CT slices and radiographs instead. The same
    ``(spec kind, seed, n)`` gives the same arrays (cached, read-only).
    """
    ct_share = _ct_share(spec)
    if n is None:
        n = 48 if ct_share == 1.0 else 24
    if n < 1:
        raise ValueError(f'Argument "n" must be >= 1, got {n}')
    mult = max(1, spec.multiple_of, spec.stride if spec.task == "roi_classifier" else 1)
    return list(_cached_inputs(spec.task, spec.thumbnail, mult, seed, n, getattr(spec, "spacing_mm", None),
                               getattr(spec, "slices", 1), ct_share))


def calibration_description(spec: ModelSpec, seed: int = CALIBRATION_SEED, n: int = 24) -> str:
    share = _ct_share(spec)
    parts = {1.0: "CT slices 512²", 0.0: "1024² crops of 4096² radiographs"}.get(
        share, "CT slices 512² + 1024² crops of 4096² radiographs")
    if getattr(spec, "slices", 1) == 3 and share > 0:
        parts += " (each slice with its neighbours)"
    what = (
        "thumbnails of CT slices" + (" (each with its neighbours')" if getattr(spec, "slices", 1) == 3 else "")
        + " and 4096² radiographs"
        if spec.task == "roi_classifier"
        else parts + (f" at {spec.spacing_mm:g} mm" if getattr(spec, "spacing_mm", None) else "")
    )
    return (
        f"medrt.phantom, seeds from {seed}: {n} inputs, {what}, round-robin over "
        "border-crossing, tiny (< 5 mm), faint, bright lesions and empty frames"
    )


def _as_nchw(x: np.ndarray, multiple_of: int, channels: int = 1) -> np.ndarray:
    x = np.asarray(x, np.float32)
    if x.ndim == 2:
        x = np.broadcast_to(x, (1, channels, *x.shape))
    elif x.ndim == 3:
        x = x[:, None] if channels == 1 else x[None]
    if x.ndim != 4 or x.shape[1] != channels:
        raise ValueError(f"a calibration input must be (H, W), (N, H, W) or (N, C, H, W) with C = {channels}"
                         f" (the model's input channels), got {x.shape}")
    return np.ascontiguousarray(pad_to_multiple(x, max(1, multiple_of))[0])


def _reader(name: str, inputs: list[np.ndarray]) -> Any:
    """An onnxruntime ``CalibrationDataReader`` over the inputs, one batch each."""
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter(inputs)

        def get_next(self) -> dict[str, np.ndarray] | None:
            x = next(self.items, None)
            return None if x is None else {name: x}

        def rewind(self) -> None:
            self.items = iter(inputs)

    return Reader()


# --------------------------------------------------------------------------- graph


def first_last_compute_nodes(graph: onnx.GraphProto, ops: tuple[str, ...] = COMPUTE_OPS,
                             with_paths: bool = False) -> list[str]:  # fmt: skip
    """Names of the weight-carrying nodes nearest the graph inputs and outputs.

    "First": reached from a graph input through weightless nodes only; "last": a
    graph output is reached from it through weightless nodes only (a UNet's final
    ConvTranspose, both heads of the ROI classifier). ``with_paths`` adds the
    weightless nodes on those paths (an input's normalisation or contrast channel,
    an output's activation), in graph order.
    """
    consumers: dict[str, list[Any]] = {}
    producer: dict[str, Any] = {}
    for node in graph.node:
        for t in node.input:
            consumers.setdefault(t, []).append(node)
        for t in node.output:
            producer[t] = node
    inits = {i.name for i in graph.initializer}

    def walk(starts: list[str], forward: bool) -> set[str]:
        found: set[str] = set()
        seen: set[str] = set()
        if with_paths:
            found = seen
        stack = list(starts)
        while stack:
            t = stack.pop()
            nodes = consumers.get(t, []) if forward else ([producer[t]] if t in producer else [])
            for node in nodes:
                if node.name in seen or node.op_type in SHAPE_OPS:
                    continue
                seen.add(node.name)
                if node.op_type in ops:
                    found.add(node.name)
                else:
                    stack += list(node.output if forward else node.input)
        return found

    ends = walk([i.name for i in graph.input if i.name not in inits], True) | walk([o.name for o in graph.output], False)
    names = [n.name for n in graph.node if n.name in ends]
    if any(not n for n in names):
        raise ModelError("the graph has unnamed nodes; they cannot be excluded from quantization")
    return names


def _dump_spec(doc: dict[str, Any], header: str) -> str:
    """A spec document as TOML (values written as ``medrt.bundle`` writes them)."""
    lines = [header]

    def table(name: str, items: dict[str, Any]) -> None:
        lines.append(f"\n{name}")
        nested = {k: v for k, v in items.items() if isinstance(v, dict)}
        lines.extend(f"{k} = {_toml(v)}" for k, v in items.items() if k not in nested)
        for k, v in nested.items():
            table(f"{name[:-1]}.{k}]", v)

    for key, value in doc.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for item in value:
                table(f"[[{key}]]", item)
        elif isinstance(value, dict):
            table(f"[{key}]", value)
    return "\n".join(lines) + "\n"


def _card_from(card: Path | None, folder: Path) -> str | None:
    if card is None:
        return None
    try:
        return os.path.relpath(card, folder)
    except ValueError:  # another drive
        return str(card)


def _write_spec(doc: dict[str, Any], card: Path | None, spec_path: Path) -> None:
    doc = {**doc, "model": {k: v for k, v in doc["model"].items() if k != "card"}}
    rel = _card_from(card, spec_path.parent)
    if rel is not None:
        doc["model"]["card"] = rel
    source = doc.get("quantization", {}).get("source", "an FP32 model")
    header = (
        f"# INT8 (ONNX Runtime QDQ) of {source}, written by `medrt models quantize`.\n"
        "# Check it with the accuracy gate (medrt.engine.gate) before use. Format: models/README.md"
    )
    spec_path.write_text(_dump_spec(doc, header), encoding="utf-8")


def move_quantized(spec: ModelSpec, out_dir: str | Path) -> ModelSpec:
    """Move a quantized model and its spec to ``out_dir`` (the card path is rewritten); return it."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = tomllib.loads(spec.spec_path.read_text(encoding="utf-8"))
    os.replace(spec.path, out_dir / spec.path.name)
    _write_spec(doc, spec.card, out_dir / spec.spec_path.name)
    if spec.spec_path.parent.resolve() != out_dir.resolve():
        spec.spec_path.unlink()
    return load_spec(out_dir / spec.spec_path.name)


# --------------------------------------------------------------------------- quantize


def _remove_shape_debris(since: float) -> None:
    """onnxruntime's symbolic shape inference, when it fails, leaves its partial model in the
    working directory (``sym_shape_infer_temp.onnx`` + an external-data file): remove them."""
    import onnx

    debris = Path("sym_shape_infer_temp.onnx")
    if not debris.is_file() or debris.stat().st_mtime < since - 1:
        return
    try:
        model = onnx.load(str(debris), load_external_data=False)
        for t in model.graph.initializer:
            for entry in t.external_data:
                if entry.key == "location":
                    Path(entry.value).unlink(missing_ok=True)
    finally:
        debris.unlink(missing_ok=True)


def _shapes_from_quantized(graph: onnx.GraphProto) -> int:
    """Let each ``Shape`` read the 8-bit tensor a ``DequantizeLinear`` would have expanded
    (same shape), and drop dequantizations nothing reads any more; return how many Shapes
    moved. The quantizer puts a DequantizeLinear in front of every float consumer, and
    ORT ran a full-size one per up-sampling layer only to take its shape."""
    producer = {o: n for n in graph.node for o in n.output}
    moved = 0
    for node in graph.node:
        src = producer.get(node.input[0]) if node.op_type == "Shape" else None
        if src is not None and src.op_type == "DequantizeLinear":
            node.input[0] = src.input[0]
            moved += 1
    if moved:
        read = {t for n in graph.node for t in n.input} | {o.name for o in graph.output}
        keep = [n for n in graph.node if n.op_type != "DequantizeLinear" or any(o in read for o in n.output)]
        del graph.node[:]
        graph.node.extend(keep)
    return moved


def _pre_process(quant_pre_process: Any, src: Path, dst: Path) -> None:
    """ORT's pre-processing; symbolic shape inference merges dynamic H/W (a UNet's skip
    concatenations need it) and, where it still fails, ONNX's own shape inference is used."""
    started = time.time()
    try:
        quant_pre_process(str(src), str(dst), auto_merge=True)
        return
    except Exception as exc:  # the ORT/onnx tools raise many types
        log.info("symbolic shape inference failed on %s (%s); using ONNX shape inference", src.name, exc)
        _remove_shape_debris(started)
    try:
        quant_pre_process(str(src), str(dst), skip_symbolic_shape=True)
    except Exception as exc:
        raise ModelError(f"{src}: quantization pre-processing failed ({exc})") from exc


def quantize_int8(
    spec: ModelSpec,
    out_dir: str | Path,
    *,
    calibration: Iterable[np.ndarray] | None = None,
    exclude_first_last: bool = True,
    per_channel: bool = True,
    reduce_range: bool = False,
    calibration_note: str | None = None,
) -> ModelSpec:
    """Quantize ``spec``'s model to INT8 (static, QDQ, U8S8) into ``out_dir``; return the new spec.

    ``calibration``: normalised inputs ((H, W), (N, H, W) or NCHW arrays); the
    default is :func:`calibration_inputs`. ``exclude_first_last`` keeps the first
    and last weight layers FP32. Writes ``<name>_int8.onnx`` and ``<name>_int8.toml``
    (the original spec with the new file, sha256, version ``+int8`` and a
    ``[quantization]`` table) and returns :func:`load_spec` of it.
    """
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.registry import QDQRegistry
    from onnxruntime.quantization.shape_inference import quant_pre_process

    spec.verify()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if calibration is None:
        inputs = calibration_inputs(spec)
        described = calibration_description(spec, n=len(inputs))
    else:
        inputs = [_as_nchw(x, spec.multiple_of, getattr(spec, "slices", 1)) for x in calibration]
        described = calibration_note or f"caller-supplied, {len(inputs)} inputs"
    if not inputs:
        raise ModelError(f"{spec.spec_path}: no calibration inputs to quantize {spec.name} with")
    onnx_path, spec_path = out_dir / f"{spec.name}_int8.onnx", out_dir / f"{spec.name}_int8.toml"
    with tempfile.TemporaryDirectory(prefix="medrt-quant-") as tmp:
        pre, rewritten = Path(tmp) / "pre.onnx", Path(tmp) / "rewritten.onnx"
        model, report = cpu_friendly(onnx.load(str(spec.path)))
        onnx.save(model, str(rewritten))
        if report.changed:
            log.info("%s: %s", spec.ident, report.summary())
        _pre_process(quant_pre_process, rewritten, pre)
        excluded = first_last_compute_nodes(onnx.load(str(pre)).graph, with_paths=True) if exclude_first_last else []
        log.info("quantizing %s: %d calibration inputs, FP32 nodes %s", spec.ident, len(inputs), excluded)
        quantize_static(
            str(pre),
            str(onnx_path),
            _reader(spec.inputs[0].name, inputs),
            quant_format=QuantFormat.QDQ,
            per_channel=per_channel,
            reduce_range=reduce_range,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            nodes_to_exclude=excluded,
            op_types_to_quantize=[op for op in QDQRegistry if op not in FLOAT_OPS] + list(INT8_OPS),
            calibrate_method=CalibrationMethod.MinMax,
            # Not CalibMaxIntermediateOutputs: onnxruntime 1.32 drops, not merges, each full
            # chunk. MinMax collects per-tensor ReduceMin/ReduceMax, so memory stays small.
        )
        quantized = onnx.load(str(onnx_path))
        if _shapes_from_quantized(quantized.graph):
            onnx.save(quantized, str(onnx_path))
    quant = {
        "method": "onnxruntime static quantization, QDQ, activations QUInt8 (asymmetric), weights QInt8, MinMax",
        "per_channel": per_channel,
        "reduce_range": reduce_range,
        "calibration": described,
        "calibration_inputs": len(inputs),
        "excluded_nodes": excluded,
        "float_ops": list(FLOAT_OPS),
        "rewritten": report.summary() if report.changed else "nothing to rewrite",
        "source": f"{spec.ident} sha256 {spec.sha256}",
    }
    doc = tomllib.loads(spec.spec_path.read_text(encoding="utf-8"))
    doc["model"] = {**doc["model"], "file": onnx_path.name, "sha256": sha256_file(onnx_path),
                    "version": f"{spec.version}+int8"}  # fmt: skip
    doc["quantization"] = quant
    _write_spec(doc, spec.card, spec_path)
    log.info("wrote %s and %s", onnx_path, spec_path)
    return load_spec(spec_path)

