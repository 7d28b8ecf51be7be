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

import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from medrt.bundle import _toml
from medrt.engine.calibration import CALIBRATION_SEED, calibration_description, calibration_inputs
from medrt.engine.registry import ModelError, ModelSpec, load_spec, sha256_file
from medrt.engine.rewrite import cpu_friendly
from medrt.preprocess import pad_to_multiple

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

if TYPE_CHECKING:  # pragma: no cover - typing only
    import onnx


__all__ = [
    "CALIBRATION_SEED",
    "COMPUTE_OPS",
    "FLOAT_OPS",
    "INT8_OPS",
    "calibration_inputs",
    "calibration_description",
    "check_int8_target",
    "dump_spec",
    "first_last_compute_nodes",
    "int8_paths",
    "move_quantized",
    "quantize_int8",
]

log = logging.getLogger(__name__)

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
    an output's activation), and the nodes that feed them from the input's shape and
    constants alone (a box mean's count of pixels inside the frame, ``ones_like(x)``
    through a running sum: quantized, 8 bits over 0..543 turned counts of 16-31 into
    steps of 2, and ``lesion_unet_lite`` 4.1.1's twin lost 7.6 points of
    sensitivity), in graph order.
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
    if with_paths:  # the walks do not go through SHAPE_OPS (see there); what they start stays with the paths
        shaped = set(inits)  # tensors computed from constants and shapes only
        for node in graph.node:  # ONNX keeps nodes in topological order
            if node.op_type in (*SHAPE_OPS, "Constant") or (node.input and all(not t or t in shaped for t in node.input)):
                shaped.update(node.output)
        stack = [t for n in graph.node if n.name in ends for t in n.input]
        while stack:
            node = producer.get(stack.pop())
            if node is None or node.name in ends or node.op_type in SHAPE_OPS or not set(node.output) <= shaped:
                continue
            ends.add(node.name)
            stack += list(node.input)
    names = [n.name for n in graph.node if n.name in ends]
    if any(not n for n in names):
        raise ModelError("the graph has unnamed nodes; they cannot be excluded from quantization")
    return names


def dump_spec(doc: dict[str, Any], header: str) -> str:
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


def _spec_text(doc: dict[str, Any], card: Path | None, folder: Path) -> str:
    """The spec as written into ``folder`` (its card path relative to that folder)."""
    doc = {**doc, "model": {k: v for k, v in doc["model"].items() if k != "card"}}
    rel = _card_from(card, folder)
    if rel is not None:
        doc["model"]["card"] = rel
    source = doc.get("quantization", {}).get("source", "an FP32 model")
    header = (
        f"# INT8 (ONNX Runtime QDQ) of {source}, written by `medrt models quantize`.\n"
        "# Check it with the accuracy gate (medrt.engine.gate) before use. Format: models/README.md"
    )
    return dump_spec(doc, header)


def int8_paths(spec: ModelSpec, out_dir: str | Path) -> tuple[Path, Path]:
    """Where :func:`quantize_int8` writes ``spec``'s INT8 model and its spec in ``out_dir``."""
    out_dir = Path(out_dir)
    return out_dir / f"{spec.name}_int8.onnx", out_dir / f"{spec.name}_int8.toml"


def _refuse_existing(paths: Iterable[Path], name: str, force: bool) -> None:
    existing = [str(p) for p in paths if p.exists()]
    if existing and not force:
        raise ModelError(
            f"{' and '.join(existing)} already exist{'s' if len(existing) == 1 else ''}: refusing to replace "
            f"the INT8 model of {name!r}; pass --force to replace it, or --out another folder"
        )


def check_int8_target(spec: ModelSpec, out_dir: str | Path, *, force: bool = False) -> None:
    """Refuse (:class:`ModelError`, naming the files) an ``out_dir`` where quantizing ``spec``
    would write over its own model or spec (a model already quantized, quantized again into
    its own folder keeps its name: ``NAME_int8``), whatever ``force`` says; or, without
    ``force``, over an INT8 model already there. Checked before the minutes of quantization."""
    onnx_path, spec_path = int8_paths(spec, out_dir)
    targets = (spec_path, onnx_path)  # named as import-bundle names them
    sources = {spec.path.resolve(), spec.spec_path.resolve()}
    own = [str(p) for p in targets if p.resolve() in sources]
    if own:
        raise ModelError(
            f"{' and '.join(own)}: that is the model being quantized ({spec.spec_path}); "
            "refusing to write over it, --force or not: choose another --out"
        )
    _refuse_existing(targets, spec.name, force)


def move_quantized(spec: ModelSpec, out_dir: str | Path, *, force: bool = False) -> ModelSpec:
    """Move a quantized model and its spec to ``out_dir`` (the card path is rewritten); return it.

    A model or spec already in ``out_dir`` under those names is replaced only with ``force``
    (:class:`ModelError` naming them otherwise). The spec is written beside its final name
    first and both are renamed into place, the spec last: a failure on the way leaves no
    half-written spec, and never a new spec beside an old model."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    onnx_path, spec_path = out_dir / spec.path.name, out_dir / spec.spec_path.name
    if spec.spec_path.parent.resolve() != out_dir.resolve():
        _refuse_existing((spec_path, onnx_path), spec.name, force)
    doc = tomllib.loads(spec.spec_path.read_text(encoding="utf-8"))
    staged = out_dir / f".{spec_path.name}.tmp"
    try:
        staged.write_text(_spec_text(doc, spec.card, out_dir), encoding="utf-8")
        os.replace(spec.path, onnx_path)
        os.replace(staged, spec_path)
    finally:
        staged.unlink(missing_ok=True)
    if spec.spec_path.parent.resolve() != out_dir.resolve():
        spec.spec_path.unlink()
    return load_spec(spec_path)


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
    check_int8_target(spec, out_dir, force=True)  # ``out_dir`` is the caller's; the source is not
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
    onnx_path, spec_path = int8_paths(spec, out_dir)
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
    spec_path.write_text(_spec_text(doc, spec.card, spec_path.parent), encoding="utf-8")
    log.info("wrote %s and %s", onnx_path, spec_path)
    return load_spec(spec_path)

