"""Exact ONNX graph rewrites that ONNX Runtime's CPU provider runs faster, and in INT8.

ORT's CPU provider has INT8 kernels for ``Conv``, ``LeakyRelu``, ``Concat`` and more,
but none for ``ConvTranspose`` or ``PRelu``: in a statically quantized MONAI UNet
those stay FP32 between a Dequantize and a Quantize, and the INT8 model ran 1.05×
its FP32 original on this machine. Both have exact equivalents that it can run:

* ``PRelu`` with a single slope (MONAI's ``Act.PRELU`` default, one parameter per
  layer) is ``LeakyRelu(alpha=slope)``.
* A 2-D ``ConvTranspose`` with stride ``s`` (the same on both axes) whose output is
  ``s`` times its input (``kernel + output_padding - pad_begin - pad_end == s``, true
  of every UNet up-sampling layer with kernel 3, padding 1, output padding 1) is a
  ``Conv`` with ``s² · C_out`` channels followed by a pixel shuffle: each of the
  ``s²`` output phases is an ordinary convolution of the input with the taps of the
  transposed kernel that land on it (the "sub-pixel convolution" identity). The
  shuffle is written channels-last (``Transpose`` to NHWC, ``Reshape``, ``Transpose``,
  ``Reshape``, ``Transpose`` back) rather than as ``DepthToSpace``: ORT runs its INT8
  convolutions channels-last, cancels the outer transposes against its own, and moves
  whole pixels' channels at once; ``DepthToSpace`` made it transpose to NCHW and back
  around every up-sampling layer (INT8 34.6 vs 29.0 ms for lesion_unet at 1024²).
  A ``BatchNormalization`` that only follows the layer is folded into the new weights.
* A 1-D pooling window (``AveragePool`` / ``MaxPool`` with kernel ``(1, k)`` or
  ``(k, 1)``, stride 1) over a one-channel tensor: ORT parallelises pooling over
  batch x channels, so one channel ran on one thread, and a ``(k, 1)`` window walked
  down columns. Reshaped so that every row is a channel (columns: transposed first),
  the same window runs on every core over contiguous memory (the 31-pixel box means
  of the UNets' contrast channel at 1024²: 7.5 → 0.9 ms). Only where shape inference
  shows one channel: with many channels ORT already spreads the work.

The rewritten model computes the same function (float rounding aside; tested against
the original) and is what :func:`medrt.engine.quantize.quantize_int8` quantizes.

:func:`concat_as_sum` is applied when ONNX Runtime loads an FP32 model for the CPU
(:class:`medrt.engine.backends.onnxrt.OnnxRuntimeBackend`), not at export: a UNet's
skip connection concatenates the encoder's features with the up-sampled ones and
convolves the result, and ``Conv(Concat(a, b), W) = Conv(a, W_a) + Conv(b, W_b)`` with
``W`` split along its input channels. ORT's CPU provider copies a ``Concat`` in plain
NCHW (the up-sampled half comes from the shuffle's transposes) and then reorders the
whole result into its blocked layout for the convolution; the sum instead keeps the
encoder's half in the blocked layout it already has, reorders only the other half, and
fuses the ``Add`` into the second convolution (``lesion_unet_lite`` at 512², one thread:
3-4 % less time; ``lesion_unet_dx`` at 1024²: 4-5 %; outputs within 1e-5). In INT8 the
``Concat`` has its own kernel and the split would add a quantized ``Add``, so
quantization keeps the original graph. No
library rewrites these: ORT's and onnxoptimizer's passes fuse, they do not replace
ConvTranspose, and ``onnxruntime.quantization`` only skips what it cannot quantize.

Needs ``onnx`` (imported when called).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover - typing only
    import onnx

__all__ = ["RewriteReport", "concat_as_sum", "cpu_friendly", "conv_transpose_as_conv"]


class RewriteReport(dict):
    """What :func:`cpu_friendly` changed: ``{"prelu": [names], "conv_transpose": [names],
    "batchnorm_folded": [names], "pool": [names], "kept": {name: reason}}``."""

    @property
    def changed(self) -> bool:
        return bool(self["prelu"] or self["conv_transpose"] or self["pool"])

    def summary(self) -> str:
        kept = "; ".join(f"{k}: {v}" for k, v in self["kept"].items()) or "none"
        return (f"{len(self['prelu'])} PRelu -> LeakyRelu, {len(self['conv_transpose'])} ConvTranspose -> "
                f"Conv + pixel shuffle ({len(self['batchnorm_folded'])} BatchNormalization folded), "
                f"{len(self['pool'])} one-channel 1-D pooling -> rows as channels; kept: {kept}")


def _prefix(node: Any) -> str:
    """A unique stem for the tensors and nodes that replace ``node``: its name, or, for an
    unnamed node (allowed in ONNX), its first output's name (tensor names are unique)."""
    return node.name or f"{node.output[0]}/rewritten"


def _attrs(node: Any) -> dict[str, Any]:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _phase_taps(k: int, s: int, pad_begin: int) -> tuple[int, int, list[list[tuple[int, int]]]]:
    """For one axis: the input offsets ``d`` (relative to ``m``) that output ``s·m + r``
    reads, as ``(d, kernel index)`` per phase ``r``, and the smallest and largest ``d``.

    ``y[o] = Σ_i x[i] · w[o + pad_begin - s·i]``; with ``o = s·m + r`` and ``i = m + d``
    the kernel index is ``r + pad_begin - s·d``.
    """
    taps = [[(d, r + pad_begin - s * d) for d in range(-k, k + 1) if 0 <= r + pad_begin - s * d < k] for r in range(s)]
    ds = [d for phase in taps for d, _ in phase]
    return min(ds), max(ds), taps


def conv_transpose_as_conv(
    weight: np.ndarray, bias: np.ndarray | None, stride: int, pads: tuple[int, int, int, int]
) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """The ``Conv`` weight, bias and pads whose output, pixel-shuffled, equals a 2-D
    ``ConvTranspose`` (``weight``: ONNX layout ``(C_in, C_out, kH, kW)``, group 1,
    dilation 1; ``pads``: ``(top, left, bottom, right)``).

    Output channels are phase-major: channel ``(i·s + j)·C_out + c`` holds channel ``c``
    of output pixel ``(s·y + i, s·x + j)`` (``DepthToSpace``'s "DCR" order). Raises
    ``ValueError`` when the equivalent convolution would need a negative pad.
    """
    c_in, c_out, kh, kw = weight.shape
    s = stride
    lo_y, hi_y, taps_y = _phase_taps(kh, s, pads[0])
    lo_x, hi_x, taps_x = _phase_taps(kw, s, pads[1])
    if lo_y > 0 or hi_y < 0 or lo_x > 0 or hi_x < 0:
        raise ValueError("the equivalent convolution would need a negative pad")
    ky, kx = hi_y - lo_y + 1, hi_x - lo_x + 1
    w = np.zeros((s, s, c_out, c_in, ky, kx), dtype=weight.dtype)
    wt = weight.transpose(1, 0, 2, 3)  # (C_out, C_in, kH, kW)
    for ry in range(s):
        for dy, iy in taps_y[ry]:
            for rx in range(s):
                for dx, ix in taps_x[rx]:
                    w[ry, rx, :, :, dy - lo_y, dx - lo_x] = wt[:, :, iy, ix]
    b = np.zeros(c_out, dtype=weight.dtype) if bias is None else bias
    return w.reshape(s * s * c_out, c_in, ky, kx), np.tile(b, s * s).astype(weight.dtype), [-lo_y, -lo_x, hi_y, hi_x]


def _pixel_shuffle(prefix: str, conv_in: str, conv_out: str, out: str, s: int) -> tuple[list[Any], list[Any]]:
    """Nodes and constants taking ``conv_out`` (N, s²·C, H, W; phase-major channels) to
    ``out`` (N, C, s·H, s·W) through channels-last: NHWC, split the channels into
    (s, s, C), interleave the phases with the rows and columns, back to NCHW. The
    output shape comes from ``conv_in``'s (same N, H, W)."""
    from onnx import helper, numpy_helper

    consts = [numpy_helper.from_array(np.array([0, 0, 0, s, s, -1], np.int64), f"{prefix}/split"),
              numpy_helper.from_array(np.array([s, s], np.int64), f"{prefix}/stride"),
              numpy_helper.from_array(np.array([-1], np.int64), f"{prefix}/rest")]  # fmt: skip
    t = f"{prefix}/"
    nodes = [
        helper.make_node("Transpose", [conv_out], [t + "nhwc"], perm=[0, 2, 3, 1], name=t + "to_nhwc"),
        helper.make_node("Reshape", [t + "nhwc", t + "split"], [t + "phases"], name=t + "split_phases"),
        helper.make_node("Transpose", [t + "phases"], [t + "interleaved"], perm=[0, 1, 3, 2, 4, 5], name=t + "interleave"),
        helper.make_node("Shape", [conv_in], [t + "n"], start=0, end=1, name=t + "batch"),
        helper.make_node("Shape", [conv_in], [t + "hw"], start=2, end=4, name=t + "size"),
        helper.make_node("Mul", [t + "hw", t + "stride"], [t + "hw_out"], name=t + "out_size"),
        helper.make_node("Concat", [t + "n", t + "hw_out", t + "rest"], [t + "shape"], axis=0, name=t + "out_shape"),
        helper.make_node("Reshape", [t + "interleaved", t + "shape"], [t + "merged"], name=t + "merge"),
        helper.make_node("Transpose", [t + "merged"], [out], perm=[0, 3, 1, 2], name=t + "to_nchw"),
    ]
    return nodes, consts


def _one_channel(model: onnx.ModelProto) -> set[str]:
    """Names of the 4-D tensors that shape inference shows to have exactly one channel."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - onnx raises several types; no shapes, no rewrite
        return set()
    found = set()
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input):
        dims = vi.type.tensor_type.shape.dim
        if len(dims) == 4 and dims[1].HasField("dim_value") and dims[1].dim_value == 1:
            found.add(vi.name)
    return found


def _pool_reason(node: Any, attrs: dict[str, Any], single: set[str]) -> str | None:
    """Why ``node`` (a pooling op) is not a one-channel 1-D window we rewrite, or None."""
    k = list(attrs.get("kernel_shape", []))
    if len(k) != 2 or (k[0] != 1 and k[1] != 1) or k == [1, 1]:
        return "not a 1-D window"
    if any(v != 1 for v in attrs.get("strides", [1, 1])) or any(v != 1 for v in attrs.get("dilations", [1, 1])):
        return "strided or dilated"
    if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET") or attrs.get("ceil_mode", 0):
        return "auto_pad / ceil_mode"
    pads = list(attrs.get("pads", [0, 0, 0, 0]))
    axis = 0 if k[1] == 1 else 1  # the pooled axis (0: rows of H, 1: W)
    if pads[1 - axis] or pads[3 - axis]:
        return "padded across the window"
    if len([o for o in node.output if o]) != 1:
        return "MaxPool indices"
    if node.input[0] not in single:
        return "not known to have one channel"
    return None


def _rows_as_channels(node: Any, attrs: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    """Nodes and constants for a 1-D pooling window (see :func:`_pool_reason`) with every
    row (or column) of the tensor as its own channel."""
    from onnx import helper, numpy_helper

    k = list(attrs["kernel_shape"])
    pads = list(attrs.get("pads", [0, 0, 0, 0]))
    along_h = k[1] == 1
    t = f"{_prefix(node)}/rows/"
    src, out = node.input[0], node.output[0]
    consts = [numpy_helper.from_array(np.array([1, -1, 1, 0], np.int64), t + "as_rows")]
    pool_attrs = {a: v for a, v in attrs.items() if a not in ("kernel_shape", "pads", "strides")}
    nodes = []
    if along_h:  # columns become rows first
        nodes.append(helper.make_node("Transpose", [src], [t + "columns"], perm=[0, 1, 3, 2], name=t + "transpose"))
        src = t + "columns"
    length, before, after = (k[0], pads[0], pads[2]) if along_h else (k[1], pads[1], pads[3])
    nodes += [
        helper.make_node("Reshape", [src, t + "as_rows"], [t + "rows"], name=t + "split"),
        helper.make_node(node.op_type, [t + "rows"], [t + "pooled"], name=t + "pool", kernel_shape=[1, length],
                         pads=[0, before, 0, after], strides=[1, 1], **pool_attrs),
        helper.make_node("Shape", [src], [t + "shape"], name=t + "shape_of"),
        helper.make_node("Reshape", [t + "pooled", t + "shape"], [t + "merged" if along_h else out], name=t + "merge"),
    ]  # fmt: skip
    if along_h:
        nodes.append(helper.make_node("Transpose", [t + "merged"], [out], perm=[0, 1, 3, 2], name=t + "transpose_back"))
    return nodes, consts


def _replace_nodes(model: onnx.ModelProto, nodes: list[Any], inits: list[Any]) -> None:
    """Give ``model``'s graph ``nodes`` in place of its own and ``inits`` beside its
    initializers, drop the initializers nothing reads any more, and check the model."""
    import onnx

    graph = model.graph
    outputs = {o.name for o in graph.output}
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(inits)
    used = {t for n in graph.node for t in n.input}
    keep = [i for i in graph.initializer if i.name in used or i.name in outputs]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    del graph.value_info[:]  # stale shapes of removed tensors; shape inference redoes them
    onnx.checker.check_model(model)


def cpu_friendly(model: onnx.ModelProto) -> tuple[onnx.ModelProto, RewriteReport]:
    """A copy of ``model`` with single-slope ``PRelu`` as ``LeakyRelu``, eligible 2-D
    ``ConvTranspose`` layers as ``Conv`` + pixel shuffle and one-channel 1-D pooling
    windows with rows as channels (see the module docstring), and a report of what
    changed and what was kept and why. Unnamed nodes are named ``OpType:output``
    (quantization keeps layers FP32 by name)."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    taken = {n.name for n in graph.node}
    for node in graph.node:  # quantization excludes layers by name: every node gets one
        if not node.name:
            node.name = name = next(c for c in (f"{node.op_type}:{node.output[0]}", *(
                f"{node.op_type}:{node.output[0]}:{i}" for i in range(1, len(taken) + 2))) if c not in taken)
            taken.add(name)
    inits = {i.name: i for i in graph.initializer}
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for t in node.input:
            consumers.setdefault(t, []).append(node)
    outputs = {o.name for o in graph.output}
    report = RewriteReport(prelu=[], conv_transpose=[], batchnorm_folded=[], pool=[], kept={})
    single = _one_channel(model) if any(n.op_type in ("AveragePool", "MaxPool") for n in graph.node) else set()
    new_nodes: list[Any] = []
    folded: set[str] = set()  # outputs of the BatchNormalization nodes folded away
    new_inits: list[Any] = []

    def array(name: str) -> np.ndarray | None:
        return numpy_helper.to_array(inits[name]) if name in inits else None

    for node in graph.node:
        if node.op_type == "BatchNormalization" and node.output[0] in folded:
            continue
        if node.op_type == "PRelu":
            slope = array(node.input[1])
            if slope is None or slope.size != 1:
                report["kept"][node.name] = "PRelu slope is not a single constant"
                new_nodes.append(node)
                continue
            new_nodes.append(helper.make_node("LeakyRelu", [node.input[0]], list(node.output), name=node.name,
                                              alpha=float(slope.reshape(-1)[0])))  # fmt: skip
            report["prelu"].append(node.name)
            continue
        if node.op_type in ("AveragePool", "MaxPool"):
            attrs = _attrs(node)
            reason = _pool_reason(node, attrs, single)
            if reason is None:
                nodes, consts = _rows_as_channels(node, attrs)
                new_nodes += nodes
                new_inits += consts
                report["pool"].append(node.name)
            else:
                new_nodes.append(node)
                if reason != "not a 1-D window":
                    report["kept"][node.name] = reason
            continue
        if node.op_type != "ConvTranspose":
            new_nodes.append(node)
            continue
        a = _attrs(node)
        weight = array(node.input[1])
        bias = array(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        strides = list(a.get("strides", [1, 1]))
        k = list(a.get("kernel_shape", [] if weight is None else weight.shape[2:]))
        pads = list(a.get("pads", [0, 0, 0, 0]))
        out_pad = list(a.get("output_padding", [0, 0]))
        reason = None
        if weight is None or weight.ndim != 4:
            reason = "weight is not a 2-D constant"
        elif a.get("group", 1) != 1 or any(d != 1 for d in a.get("dilations", [1, 1])):
            reason = "grouped or dilated"
        elif "output_shape" in a or a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            reason = "output_shape / auto_pad"
        elif strides[0] != strides[1] or strides[0] < 2:
            reason = f"strides {strides}"
        elif any(k[i] + out_pad[i] - pads[i] - pads[i + 2] != strides[i] for i in (0, 1)):
            reason = "output is not stride × input"
        if reason is None:
            try:
                w, b, conv_pads = conv_transpose_as_conv(weight, bias, strides[0], tuple(pads))
            except ValueError as exc:
                reason = str(exc)
        if reason is not None:
            report["kept"][node.name] = reason
            new_nodes.append(node)
            continue
        out = node.output[0]
        users = consumers.get(out, [])
        if (len(users) == 1 and users[0].op_type == "BatchNormalization" and out not in outputs
                and len([o for o in users[0].output if o]) == 1
                and all(t in inits for t in users[0].input[1:5])):  # fmt: skip
            bn = users[0]
            gamma, beta, mean, var = (array(t).astype(np.float64) for t in bn.input[1:5])
            scale = gamma / np.sqrt(var + _attrs(bn).get("epsilon", 1e-5))
            s2 = strides[0] ** 2  # phase-major channels: the per-channel factors repeat per phase
            w = (w * np.tile(scale, s2)[:, None, None, None]).astype(w.dtype)
            b = ((b - np.tile(mean, s2)) * np.tile(scale, s2) + np.tile(beta, s2)).astype(w.dtype)
            out = bn.output[0]
            folded.add(bn.output[0])
            report["batchnorm_folded"].append(bn.name)
        base = _prefix(node)
        w_name, b_name, mid = f"{base}/as_conv/W", f"{base}/as_conv/B", f"{base}/as_conv/out"
        new_inits += [numpy_helper.from_array(w, w_name), numpy_helper.from_array(b, b_name)]
        new_nodes.append(helper.make_node("Conv", [node.input[0], w_name, b_name], [mid], name=f"{base}/as_conv",
                                          kernel_shape=list(w.shape[2:]), pads=conv_pads, strides=[1, 1]))  # fmt: skip
        if w.shape[0] == strides[0] ** 2:  # one output channel: nothing to move per pixel (module docstring)
            new_nodes.append(helper.make_node("DepthToSpace", [mid], [out], name=f"{base}/depth_to_space",
                                              blocksize=strides[0], mode="DCR"))
        else:
            shuffle, consts = _pixel_shuffle(f"{base}/pixel_shuffle", node.input[0], mid, out, strides[0])
            new_nodes += shuffle
            new_inits += consts
        report["conv_transpose"].append(node.name)

    _replace_nodes(model, new_nodes, new_inits)
    return model, report


# Elementwise ops a tensor's channel count passes through unchanged, back to the Conv
# that made it (when shape inference cannot give it: after a reshaping pixel shuffle).
_SAME_CHANNELS = ("LeakyRelu", "Relu", "PRelu", "Sigmoid", "Tanh", "Clip", "BatchNormalization", "Add", "Mul")


def _channels(tensor: str, static: dict[str, int], producer: dict[str, Any], inits: dict[str, Any]) -> int | None:
    """``tensor``'s channel count: from shape inference, else from the weight of the
    ``Conv`` it comes from through channel-preserving ops; None when unknown."""
    for _ in range(16):
        if tensor in static:
            return static[tensor]
        node = producer.get(tensor)
        if node is None:
            return None
        if node.op_type == "Conv" and node.input[1] in inits:
            return int(inits[node.input[1]].dims[0])
        if node.op_type not in _SAME_CHANNELS:
            return None
        tensor = node.input[0]
    return None


def _shape_skips_channels(node: Any) -> bool:
    """Whether a ``Shape`` node of a 4-D tensor leaves out dimension 1 (its ``start``/``end``)."""
    a = _attrs(node)
    start, end = int(a.get("start", 0)), int(a.get("end", 4))
    start, end = (start + 4 if start < 0 else start), (end + 4 if end < 0 else end)
    return not start <= 1 < end


def concat_as_sum(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of ``model`` in which each ``Conv`` of a channel ``Concat`` is the sum of
    one ``Conv`` per concatenated tensor (module docstring), and the names of the
    ``Concat`` nodes replaced; ``model`` itself when none qualifies.

    A ``Concat`` qualifies when it joins 4-D tensors along axis 1, is not a graph output,
    and feeds one ungrouped ``Conv`` with a constant weight and otherwise only ``Shape``
    nodes that leave out the channel count (a pixel shuffle's sizes; they read the first
    input instead), and every input's channel count is known."""
    import onnx
    from onnx import helper, numpy_helper, shape_inference

    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for t in node.input:
            consumers.setdefault(t, []).append(node)
    outputs = {o.name for o in graph.output}
    candidates = [n for n in graph.node if n.op_type == "Concat" and len(n.input) > 1 and _attrs(n).get("axis") == 1
                  and n.output[0] not in outputs]
    if not candidates:
        return model, []
    static: dict[str, int] = {}
    try:
        inferred = shape_inference.infer_shapes(model)
        for vi in (*inferred.graph.value_info, *inferred.graph.input):
            dims = vi.type.tensor_type.shape.dim
            if len(dims) == 4 and dims[1].HasField("dim_value"):
                static[vi.name] = dims[1].dim_value
    except Exception:  # noqa: BLE001 - shape inference is a help, not a need
        pass
    plans: dict[str, tuple[Any, list[int]]] = {}  # the Conv's name -> (its Concat, the inputs' channels)
    for cat in candidates:
        users = consumers.get(cat.output[0], [])
        convs = [u for u in users if u.op_type == "Conv"]
        shapes = [u for u in users if u.op_type == "Shape"]
        if len(convs) != 1 or len(convs) + len(shapes) != len(users) or not all(map(_shape_skips_channels, shapes)):
            continue
        conv = convs[0]
        if (conv.input[0] != cat.output[0] or conv.input[1] not in inits or len(inits[conv.input[1]].dims) != 4
                or _attrs(conv).get("group", 1) != 1):  # fmt: skip
            continue
        total = int(inits[conv.input[1]].dims[1])
        channels = [_channels(t, static, producer, inits) for t in cat.input]
        unknown = [i for i, c in enumerate(channels) if c is None]
        if len(unknown) == 1:
            channels[unknown[0]] = total - sum(c for c in channels if c is not None)
        if any(c is None or c <= 0 for c in channels) or sum(channels) != total:  # type: ignore[operator]
            continue
        plans[conv.name or conv.output[0]] = (cat, channels)  # type: ignore[assignment]
    if not plans:
        return model, []
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    new_nodes: list[Any] = []
    new_inits: list[Any] = []
    dropped = {cat.name or cat.output[0] for cat, _ in plans.values()}
    rewire = {cat.output[0]: cat.input[0] for cat, _ in plans.values()}  # Shape readers: the same N, H and W
    for node in graph.node:
        key = node.name or node.output[0]
        if node.op_type == "Concat" and key in dropped:
            continue
        if node.op_type == "Shape" and node.input[0] in rewire:
            node.input[0] = rewire[node.input[0]]
        plan = plans.get(key) if node.op_type == "Conv" else None
        if plan is None:
            new_nodes.append(node)
            continue
        cat, channels = plan
        weight = numpy_helper.to_array(inits[node.input[1]])
        attrs = _attrs(node)
        base = _prefix(node)
        partial: list[str] = []
        start = 0
        for i, (tensor, c) in enumerate(zip(cat.input, channels, strict=True)):
            w_name, out = f"{base}/part{i}/W", f"{base}/part{i}/out"
            new_inits.append(numpy_helper.from_array(np.ascontiguousarray(weight[:, start:start + c]), w_name))
            start += c
            inputs = [tensor, w_name] + (list(node.input[2:]) if i == 0 else [])  # the bias once
            new_nodes.append(helper.make_node("Conv", inputs, [out], name=f"{base}/part{i}", **attrs))
            partial.append(out)
        running = partial[0]
        for i, part in enumerate(partial[1:], 1):
            summed = node.output[0] if i == len(partial) - 1 else f"{base}/sum{i}"
            new_nodes.append(helper.make_node("Add", [running, part], [summed], name=f"{base}/sum{i}"))
            running = summed
    _replace_nodes(model, new_nodes, new_inits)
    return model, [cat.name or cat.output[0] for cat, _ in plans.values()]
