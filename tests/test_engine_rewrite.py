"""medrt.engine.rewrite: PRelu -> LeakyRelu and ConvTranspose -> Conv + pixel shuffle are exact.

Every case runs the original and the rewritten graph in ONNX Runtime on the same
random input (odd sizes, so edge handling counts) and compares the outputs.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, require_module
from medrt.engine.rewrite import conv_transpose_as_conv, cpu_friendly

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

MODELS = REPO / "models"


def _model(nodes: list, inits: list, cin: int = 3) -> object:
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", cin, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", None, None, None])],
        inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model: object, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _conv_transpose(k: int, s: int, pads: list[int], out_pad: int, *, bias: bool = True, bn: bool = False,
                    group: int = 1, cin: int = 3, cout: int = 4) -> object:  # fmt: skip
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(k * 100 + s * 10 + sum(pads) + out_pad)
    w = rng.standard_normal((cin, cout // group, k, k)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w")]
    inputs = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), "b"))
        inputs.append("b")
    out = "t" if bn else "y"
    nodes = [helper.make_node("ConvTranspose", inputs, [out], name="up", kernel_shape=[k, k], strides=[s, s],
                              pads=pads, output_padding=[out_pad, out_pad], group=group)]  # fmt: skip
    if bn:
        for name, values in (("g", rng.random(cout) + 0.5), ("be", rng.standard_normal(cout)),
                             ("m", rng.standard_normal(cout)), ("v", rng.random(cout) + 0.1)):  # fmt: skip
            inits.append(numpy_helper.from_array(values.astype(np.float32), name))
        nodes.append(helper.make_node("BatchNormalization", ["t", "g", "be", "m", "v"], ["y"], name="bn", epsilon=1e-5))
    return _model(nodes, inits, cin)


@pytest.mark.parametrize(
    ("k", "s", "pads", "out_pad", "bias", "bn", "cout"),
    [
        (3, 2, [1, 1, 1, 1], 1, True, False, 4),  # MONAI UNet's up-sampling layer
        (3, 2, [1, 1, 1, 1], 1, True, True, 4),  # ... followed by its batch norm
        (2, 2, [0, 0, 0, 0], 0, False, False, 4),  # the classic 2x2 "deconvolution"
        (4, 2, [1, 1, 1, 1], 0, True, False, 4),
        (3, 3, [0, 0, 0, 0], 0, True, False, 4),  # stride 3
        (3, 2, [0, 0, 1, 1], 0, True, True, 4),  # asymmetric pads
        (5, 2, [2, 2, 2, 2], 1, True, False, 4),
        (3, 2, [1, 1, 1, 1], 1, True, False, 1),  # a UNet's last layer: one output channel
        (3, 3, [0, 0, 0, 0], 0, False, False, 1),
    ],
)
def test_conv_transpose_becomes_conv_and_pixel_shuffle(k: int, s: int, pads: list[int], out_pad: int,
                                                        bias: bool, bn: bool, cout: int) -> None:  # fmt: skip
    require_module("onnx")
    model = _conv_transpose(k, s, pads, out_pad, bias=bias, bn=bn, cout=cout)
    rewritten, report = cpu_friendly(model)
    assert report["conv_transpose"] == ["up"] and report["kept"] == {}
    assert report["batchnorm_folded"] == (["bn"] if bn else [])
    ops = Counter(n.op_type for n in rewritten.graph.node)
    assert ops["Conv"] == 1 and ops["ConvTranspose"] == 0, ops
    # One output channel: DepthToSpace, which leaves the result channels-first (through
    # channels-last, ORT did an elementwise op after it on (N, H, W, 1): an ensemble's
    # mean of logits took 5.9 instead of 0.1 ms at 512²); more: the channels-last shuffle.
    assert (ops["DepthToSpace"], ops["Transpose"]) == ((1, 0) if cout == 1 else (0, 3)), ops
    x = np.random.default_rng(1).standard_normal((1, 3, 7, 10)).astype(np.float32)
    ref, got = _run(model, x), _run(rewritten, x)
    assert got.shape == ref.shape == (1, cout, 7 * s, 10 * s)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"k": 3, "s": 2, "pads": [1, 1, 1, 1], "out_pad": 0}, "not stride"),  # 2n - 1 outputs
        ({"k": 3, "s": 1, "pads": [1, 1, 1, 1], "out_pad": 0}, "strides"),
        ({"k": 3, "s": 2, "pads": [1, 1, 1, 1], "out_pad": 1, "group": 2, "cin": 4}, "grouped"),
    ],
)
def test_conv_transpose_it_cannot_express_is_kept_with_the_reason(kwargs: dict, reason: str) -> None:
    require_module("onnx")
    model = _conv_transpose(**kwargs)
    rewritten, report = cpu_friendly(model)
    assert report["conv_transpose"] == [] and reason in report["kept"]["up"]
    assert [n.op_type for n in rewritten.graph.node] == ["ConvTranspose"]
    assert not report.changed


def test_single_slope_prelu_becomes_leaky_relu_and_per_channel_stays() -> None:
    require_module("onnx")
    from onnx import helper, numpy_helper

    inits = [numpy_helper.from_array(np.array([[[0.2]]], np.float32), "a1"),
             numpy_helper.from_array(np.array([[[0.1]], [[0.3]], [[-0.5]]], np.float32), "a3")]  # fmt: skip
    nodes = [helper.make_node("PRelu", ["x", "a1"], ["p"], name="scalar"),
             helper.make_node("PRelu", ["p", "a3"], ["y"], name="per_channel")]  # fmt: skip
    model = _model(nodes, inits)
    rewritten, report = cpu_friendly(model)
    assert report["prelu"] == ["scalar"] and "single constant" in report["kept"]["per_channel"]
    assert [n.op_type for n in rewritten.graph.node] == ["LeakyRelu", "PRelu"]
    x = np.random.default_rng(2).standard_normal((1, 3, 5, 6)).astype(np.float32)
    np.testing.assert_allclose(_run(rewritten, x), _run(model, x), rtol=1e-6)


@pytest.mark.parametrize(
    ("op", "kernel", "pads", "count_pad"),
    [
        ("AveragePool", [1, 31], [0, 15, 0, 15], 0),  # the contrast channel's box mean, along rows
        ("AveragePool", [31, 1], [15, 0, 15, 0], 0),  # ... and down columns
        ("AveragePool", [3, 1], [1, 0, 1, 0], 1),
        ("AveragePool", [1, 4], [0, 0, 0, 3], 0),  # even, one-sided
        ("MaxPool", [5, 1], [2, 0, 2, 0], None),
    ],
)
def test_one_channel_pooling_runs_rows_as_channels(op: str, kernel: list[int], pads: list[int],
                                                   count_pad: int | None) -> None:  # fmt: skip
    require_module("onnx")
    from onnx import helper

    attrs = {"kernel_shape": kernel, "pads": pads}
    if count_pad is not None:
        attrs["count_include_pad"] = count_pad
    model = _model([helper.make_node(op, ["x"], ["y"], name="pool", **attrs)], [], cin=1)
    rewritten, report = cpu_friendly(model)
    assert report["pool"] == ["pool"] and report.changed
    x = np.random.default_rng(3).standard_normal((2, 1, 9, 40)).astype(np.float32)  # batch 2: rows of both
    np.testing.assert_array_equal(_run(rewritten, x), _run(model, x))


@pytest.mark.parametrize(
    ("cin", "attrs", "reason"),
    [
        (3, {"kernel_shape": [1, 5], "pads": [0, 2, 0, 2]}, "one channel"),  # ORT spreads channels itself
        (1, {"kernel_shape": [1, 5], "strides": [1, 2]}, "strided"),
        (1, {"kernel_shape": [1, 5], "pads": [1, 2, 1, 2]}, "padded across"),
    ],
)
def test_pooling_it_does_not_rewrite_is_kept_with_the_reason(cin: int, attrs: dict, reason: str) -> None:
    require_module("onnx")
    from onnx import helper

    model = _model([helper.make_node("AveragePool", ["x"], ["y"], name="pool", **attrs)], [], cin=cin)
    rewritten, report = cpu_friendly(model)
    assert report["pool"] == [] and reason in report["kept"]["pool"]
    assert [n.op_type for n in rewritten.graph.node] == ["AveragePool"]


def test_phase_weights_of_the_unet_layer_hold_nine_of_sixteen_taps() -> None:
    """A 3x3 stride-2 layer: the four output phases read 1, 2, 2 and 4 taps; the rest are zero."""
    w = np.arange(1, 1 + 2 * 1 * 9, dtype=np.float32).reshape(2, 1, 3, 3)
    conv, bias, pads = conv_transpose_as_conv(w, np.array([5.0], np.float32), 2, (1, 1, 1, 1))
    assert conv.shape == (4, 2, 2, 2) and pads == [0, 0, 1, 1]
    assert [int(np.count_nonzero(conv[p])) // 2 for p in range(4)] == [1, 2, 2, 4]
    assert np.count_nonzero(conv) == w.size and bias.tolist() == [5.0] * 4
    assert conv[0, :, 0, 0].tolist() == w[:, 0, 1, 1].tolist()  # even/even: the centre tap


def _members(name: str) -> int:
    """How many networks a shipped model's graph holds (an ensemble's spec lists its members)."""
    from medrt.engine.registry import load_spec

    return max(1, len(load_spec(MODELS / f"{name}.toml").training.get("member_commands", [])))


@pytest.mark.parametrize("name", ["lesion_unet", "lesion_unet_dx", "lesion_unet_lite"])
def test_shipped_unets_are_exported_rewritten(name: str) -> None:
    """The shipped graphs have nothing left to rewrite: train.export applies it."""
    onnx = require_module("onnx")
    model = onnx.load(str(MODELS / f"{name}.onnx"))
    ops = Counter(n.op_type for n in model.graph.node)
    members = _members(name)  # lesion_unet_lite 4.x: two UNets in one graph
    assert ops["ConvTranspose"] == 0 and ops["PRelu"] == 0 and ops["Conv"] == 9 * members, ops
    # The contrast fronts' box means: 1-D pools with rows as channels (graphs exported
    # before box_mean), or 3x3 pools and running sums (models/networks.py box_mean).
    pools = [n for n in model.graph.node if n.op_type == "AveragePool"]
    two_d = [n for n in pools if [a.ints for a in n.attribute if a.name == "kernel_shape"][0] == [3, 3]]
    assert pools and all(n.name.endswith("/rows/pool") or n in two_d for n in pools)
    assert not two_d or ops["CumSum"] > 0
    assert not cpu_friendly(model)[1].changed


def test_benchmark_counts_the_flops_of_the_original_layer(tmp_path: Path) -> None:
    """UNet efficiency divides the model's FLOPs by its time: the rewritten layer's zero
    taps must not count as work."""
    onnx = require_module("onnx")
    from medrt.bench.engine import _conv_flops

    model = _conv_transpose(3, 2, [1, 1, 1, 1], 1, cin=8, cout=16)
    onnx.save(model, str(tmp_path / "a.onnx"))
    onnx.save(cpu_friendly(model)[0], str(tmp_path / "b.onnx"))
    expected = 2.0 * 32 * 32 * 8 * 16 * 9  # each input pixel scatters Cin x Cout x 3 x 3
    assert _conv_flops(tmp_path / "a.onnx", 32, 32) == _conv_flops(tmp_path / "b.onnx", 32, 32) == expected


def test_quantized_unet_keeps_activations_int8_between_convolutions(tmp_path: Path) -> None:
    """lesion_unet_lite in INT8: every convolution but each member's first and last has INT8 weights,
    the activations and up-sampling take Q/DQ pairs ORT fuses, and the contrast channel
    in front of the first convolution stays float."""
    onnx = require_module("onnx")
    from medrt.engine.quantize import quantize_int8
    from medrt.engine.registry import load_spec

    rng = np.random.default_rng(3)
    calib = [rng.random((3, 128, 128), dtype=np.float32)[None] for _ in range(3)]  # previous, this, next slice
    q = quantize_int8(load_spec(MODELS / "lesion_unet_lite.toml"), tmp_path, calibration=calib)
    graph = onnx.load(str(q.path)).graph
    produced_by = {o: n for n in graph.node for o in n.output}
    convs = [n for n in graph.node if n.op_type == "Conv"]
    quantized = [n for n in convs if produced_by.get(n.input[1]) is not None
                 and produced_by[n.input[1]].op_type == "DequantizeLinear"]  # fmt: skip
    members = _members("lesion_unet_lite")
    assert len(convs) == 9 * members and len(quantized) == 7 * members, [n.name for n in convs if n not in quantized]
    excluded = set(tomllib.loads(q.spec_path.read_text())["quantization"]["excluded_nodes"])
    # (under /front/ in the 2.5-D lite 2.x, one Concat with the neighbour-difference channels)
    assert any(n.endswith("/Concat") for n in excluded) and any(n.endswith("/contrast/Tanh") for n in excluded)
    for op in ("LeakyRelu", "Reshape", "Concat"):
        nodes = [n for n in graph.node if n.op_type == op and n.name not in excluded
                 and not n.name.endswith("/out_shape")]  # not the int64 shape arithmetic  # fmt: skip
        assert len(nodes) >= 3 and all(produced_by[n.input[0]].op_type == "DequantizeLinear" for n in nodes), op
    shapes = [n for n in graph.node if n.op_type == "Shape"]
    assert shapes and not any(produced_by[n.input[0]].op_type == "DequantizeLinear" for n in shapes if n.input[0] in produced_by)
    for node in graph.node:  # the float ends: the contrast channel, and the output's up-sampling
        if node.name in excluded and node.op_type != "Conv":
            assert all(produced_by.get(t) is None or produced_by[t].op_type != "DequantizeLinear"
                       for t in node.input), node.name  # fmt: skip


def test_unnamed_nodes_get_unique_replacements() -> None:
    """ONNX allows unnamed nodes; two unnamed up-sampling layers and two unnamed pools must
    not produce the same tensor names (a graph with two producers of one tensor is invalid)."""
    onnx = require_module("onnx")
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(rng.standard_normal((1, 1, 3, 3)).astype(np.float32), f"w{i}") for i in (1, 2)]
    nodes = [
        helper.make_node("AveragePool", ["x"], ["p1"], kernel_shape=[1, 5], pads=[0, 2, 0, 2]),
        helper.make_node("AveragePool", ["p1"], ["p2"], kernel_shape=[5, 1], pads=[2, 0, 2, 0]),
        helper.make_node("ConvTranspose", ["p2", "w1"], ["u1"], kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1], output_padding=[1, 1]),
        helper.make_node("ConvTranspose", ["u1", "w2"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1], output_padding=[1, 1]),
    ]  # fmt: skip
    model = _model(nodes, inits, cin=1)
    rewritten, report = cpu_friendly(model)
    assert len(report["conv_transpose"]) == 2 and len(report["pool"]) == 2
    outputs = [o for n in rewritten.graph.node for o in n.output]
    names = [n.name for n in rewritten.graph.node]
    assert len(outputs) == len(set(outputs)) and all(names) and len(names) == len(set(names))
    onnx.checker.check_model(rewritten, full_check=True)
    x = rng.standard_normal((1, 1, 6, 7)).astype(np.float32)
    ref = _run(model, x)
    np.testing.assert_allclose(_run(rewritten, x), ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


def _skip_block(*, shape_attrs: dict | None = None, group: int = 1, extra_user: bool = False) -> object:
    """x (3 ch) → conv a (4 ch), conv b (5 ch) → Concat → Conv 3x3 (9 → 6 ch) → y; with
    ``shape_attrs``, a Shape of the Concat feeds a Reshape of y (as a pixel shuffle's sizes do)."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(3)
    w = {name: numpy_helper.from_array(rng.normal(size=shape).astype(np.float32), name)
         for name, shape in (("wa", (4, 3, 3, 3)), ("wb", (5, 3, 1, 1)), ("wc", (6, 9 // group, 3, 3)))}
    bias = numpy_helper.from_array(rng.normal(size=6).astype(np.float32), "bc")
    nodes = [
        helper.make_node("Conv", ["x", "wa"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["x", "wb"], ["b0"]),
        helper.make_node("LeakyRelu", ["b0"], ["b"], alpha=0.1),
        helper.make_node("Concat", ["a", "b"], ["cat"], axis=1, name="skip/Concat"),
        helper.make_node("Conv", ["cat", "wc", "bc"], ["yc"], pads=[1, 1, 1, 1], group=group, name="up/Conv"),
    ]
    inits = [*w.values(), bias]
    if shape_attrs is None:
        nodes.append(helper.make_node("Identity", ["yc"], ["y"]))
    else:
        shape = numpy_helper.from_array(np.array([6], np.int64), "six")
        nodes += [helper.make_node("Shape", ["cat"], ["hw"], **shape_attrs),
                  helper.make_node("Concat", ["six", "hw"], ["to"], axis=0),
                  helper.make_node("Reshape", ["yc", "to"], ["y"])]
        inits.append(shape)
    if extra_user:
        nodes.append(helper.make_node("Relu", ["cat"], ["unused"]))
    return _model(nodes, inits)


@pytest.mark.parametrize("shape_attrs", [None, {"start": 2, "end": 4}, {"start": -2}])
def test_concat_convolution_becomes_a_sum_of_convolutions(shape_attrs: dict | None) -> None:
    require_module("onnx")
    from medrt.engine.rewrite import concat_as_sum

    model = _skip_block(shape_attrs=shape_attrs)
    rewritten, names = concat_as_sum(model)
    assert names == ["skip/Concat"]
    ops = Counter(n.op_type for n in rewritten.graph.node)
    assert ops["Conv"] == 4 and ops["Add"] == 1 and ops["Concat"] == (0 if shape_attrs is None else 1), ops
    x = np.random.default_rng(0).normal(size=(1, 3, 20, 24)).astype(np.float32)
    expected = _run(model, x)
    got = _run(rewritten, x)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs", [{"group": 3}, {"extra_user": True}, {"shape_attrs": {"start": 0}},
                                    {"shape_attrs": {"start": 1, "end": 2}}])
def test_concat_it_cannot_split_is_left_alone(kwargs: dict) -> None:
    """A grouped convolution, another reader of the Concat, or a Shape that reads its channel
    count: the model comes back unchanged."""
    require_module("onnx")
    from medrt.engine.rewrite import concat_as_sum

    model = _skip_block(**kwargs)
    rewritten, names = concat_as_sum(model)
    assert names == [] and rewritten is model


@pytest.mark.parametrize("name", ["lesion_unet", "lesion_unet_dx", "lesion_unet_lite"])
def test_cpu_backend_runs_the_shipped_unets_with_their_concats_as_sums(name: str) -> None:
    """Every skip connection of the shipped UNets is split when ORT loads them for the CPU
    in FP32, with the file's outputs (to float rounding); the file and its spec are as shipped."""
    onnx = require_module("onnx")
    from medrt.engine.backends.onnxrt import OnnxRuntimeBackend
    from medrt.engine.registry import load_spec

    spec = load_spec(MODELS / f"{name}.toml")
    split = OnnxRuntimeBackend(spec, threads=1)
    plain = OnnxRuntimeBackend(spec, threads=1, split_concats=False)
    assert len(split.rewritten) == 4 * _members(name) and plain.rewritten == ()
    ops = Counter(n.op_type for n in onnx.load(str(spec.path)).graph.node)
    assert ops["Concat"] >= len(split.rewritten)  # the file keeps its Concats
    x = np.random.default_rng(1).random((1, spec.slices, 256, 192), dtype=np.float32)
    np.testing.assert_allclose(split.infer(x)[0], plain.infer(x)[0], rtol=1e-4, atol=1e-4)
    spec.verify()
