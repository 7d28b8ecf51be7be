"""INT8 quantization and the accuracy gate, on real models and phantoms (no mocks).

The structure test quantizes a small convolution network built here with
``onnx.helper``; the accuracy tests use the shipped ``lesion_unet`` (accepted) and
``lesion_unet_lite`` (its INT8 twin badly calibrated on purpose: refused) on the
held-out phantoms. The shipped lite 4.0's own INT8 twin loses one of the gate's 29
lesions and is refused (README, Performance): a verdict one lesion decides, so no test
leans on it either way.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, missing, require_module
from medrt.cli import main
from medrt.engine.gate import AccuracyGateError, compare, validation_frames
from medrt.engine.quantize import calibration_inputs, quantize_int8
from medrt.engine.registry import ModelError, ModelSpec, load_spec, sha256_file

LITE = REPO / "models" / "lesion_unet_lite.toml"
UNET = REPO / "models" / "lesion_unet.toml"


def _tiny_model(folder: Path) -> ModelSpec:
    """Conv(1->8) -> Relu -> Conv(8->8) -> Relu -> Conv(8->8) -> Relu -> Conv(8->1), dynamic H/W."""
    onnx = require_module("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "image"
    for i, (cin, cout) in enumerate([(1, 8), (8, 8), (8, 8), (8, 1)]):
        w = (rng.standard_normal((cout, cin, 3, 3)) / np.sqrt(9 * cin)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(np.zeros(cout, np.float32), f"b{i}")]
        out = "logits" if i == 3 else f"c{i}"
        nodes.append(helper.make_node("Conv", [prev, f"w{i}", f"b{i}"], [out], name=f"conv{i}", pads=[1, 1, 1, 1]))
        if i < 3:
            nodes.append(helper.make_node("Relu", [out], [f"r{i}"], name=f"relu{i}"))
            prev = f"r{i}"
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 1, "H", "W"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1, "H", "W"])],
        inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tiny.onnx"
    onnx.save(model, str(path))
    (folder / "tiny.md").write_text("card\n")
    (folder / "tiny.toml").write_text(
        f'[model]\nname = "tiny"\nversion = "1.0"\ntask = "segmentation"\nfile = "tiny.onnx"\n'
        f'sha256 = "{sha256_file(path)}"\nmultiple_of = 1\ncard = "tiny.md"\n\n'
        '[[inputs]]\nname = "image"\nshape = [1, 1, "H", "W"]\n\n'
        '[[outputs]]\nname = "logits"\nshape = [1, 1, "H", "W"]\nactivation = "sigmoid"\n\n'
        '[thresholds]\nprobability = 0.5\n\n[training]\ndata = "none: random weights"\n'
    )
    return load_spec(folder / "tiny.toml")


def _run(spec: ModelSpec, x: np.ndarray) -> np.ndarray:
    from medrt.engine.backends.onnxrt import OnnxRuntimeBackend

    return OnnxRuntimeBackend(spec, threads=1).infer(x)[0]


def test_quantize_writes_a_qdq_model_whose_first_and_last_layers_stay_fp32(tmp_path: Path) -> None:
    onnx = require_module("onnx")
    spec = _tiny_model(tmp_path / "fp32")
    rng = np.random.default_rng(1)
    calib = [rng.random((64, 64), dtype=np.float32) for _ in range(6)]
    q = quantize_int8(spec, tmp_path / "out", calibration=calib)

    # The spec: a copy with the new file, its sha256 (load_spec checks it), version and card.
    assert q.path == (tmp_path / "out" / "tiny_int8.onnx").resolve()
    assert q.spec_path.name == "tiny_int8.toml"
    assert q.sha256 == sha256_file(q.path) and load_spec(q.spec_path).sha256 == q.sha256
    assert q.version == "1.0+int8" and q.task == spec.task and q.thresholds == spec.thresholds
    assert q.card == spec.card and q.inputs == spec.inputs and q.outputs == spec.outputs
    text = q.spec_path.read_text()
    assert "[quantization]" in text and 'excluded_nodes = ["conv0", "conv3"]' in text
    assert "caller-supplied, 6 inputs" in text

    graph = onnx.load(str(q.path)).graph
    ops = Counter(n.op_type for n in graph.node)
    assert ops["QuantizeLinear"] >= 2 and ops["DequantizeLinear"] >= 4, ops
    produced_by = {o: n for n in graph.node for o in n.output}
    convs = {n.name: n for n in graph.node if n.op_type == "Conv"}
    float_inits = {i.name for i in graph.initializer if i.data_type == onnx.TensorProto.FLOAT}
    for name in ("conv0", "conv3"):  # excluded: float weights straight from an initializer
        weight = convs[name].input[1]
        assert weight in float_inits and weight not in produced_by, name
    assert convs["conv0"].input[0] == "image", "the graph input must reach the first conv unquantized"
    assert "logits" in convs["conv3"].output, "the last conv must write the output in float"
    for name in ("conv1", "conv2"):  # quantized: int8 weights through DequantizeLinear
        assert produced_by[convs[name].input[1]].op_type == "DequantizeLinear", name

    # Close to FP32 on an input like the calibration ones.
    x = calib[0][None, None]
    ref, got = _run(spec, x), _run(q, x)
    assert float(np.abs(ref - got).max()) < 0.05 * float(np.abs(ref).max())

    # Everything quantized: no float weight left on any conv.
    everything = quantize_int8(spec, tmp_path / "all", calibration=calib, exclude_first_last=False)
    graph = onnx.load(str(everything.path)).graph
    produced_by = {o: n for n in graph.node for o in n.output}
    assert all(produced_by[n.input[1]].op_type == "DequantizeLinear" for n in graph.node if n.op_type == "Conv")


def test_what_feeds_the_fp32_input_path_from_shapes_and_constants_stays_fp32() -> None:
    """A box mean's count of pixels inside the frame comes from ``ones_like(x)`` (Shape,
    ConstantOfShape, running sums): computed from the input's shape alone, it feeds the
    FP32 front but is not reached by walking the data from the input. Quantized, 8 bits
    over its range cost ``lesion_unet_lite`` 4.1.1's twin 7.6 points of sensitivity."""
    require_module("onnx")
    from onnx import TensorProto, helper, numpy_helper

    from medrt.engine.quantize import first_last_compute_nodes

    w = [numpy_helper.from_array(np.ones((1, 1, 3, 3), np.float32), f"w{i}") for i in range(3)]
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("ConstantOfShape", ["shape"], ["ones"], name="ones",
                         value=numpy_helper.from_array(np.ones(1, np.float32))),
        helper.make_node("CumSum", ["ones", "axis"], ["run"], name="running_sum"),
        helper.make_node("Div", ["x", "run"], ["mean"], name="mean"),
        helper.make_node("Conv", ["mean", "w0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
        helper.make_node("Conv", ["r0", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, "H", "W"])],
        [*w, numpy_helper.from_array(np.array(3, np.int64), "axis")],
    )  # fmt: skip
    assert first_last_compute_nodes(graph) == ["conv0", "conv2"]
    assert first_last_compute_nodes(graph, with_paths=True) == ["ones", "running_sum", "mean", "conv0", "conv2"]


def test_quantize_refuses_a_model_whose_file_changed(tmp_path: Path) -> None:
    spec = _tiny_model(tmp_path)
    spec.path.write_bytes(spec.path.read_bytes() + b"\0")
    with pytest.raises(ModelError, match="sha256"):
        quantize_int8(spec, tmp_path / "out", calibration=[np.zeros((32, 32), np.float32)])
    assert not (tmp_path / "out" / "tiny_int8.onnx").exists()


def _quantize_cli(spec: Path, out: Path, calib: Path, *more: str) -> int:
    return main(["models", "quantize", str(spec), "--out", str(out), "--no-gate", "--calibration", str(calib), *more])


def _contents(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones and scratch folders too), with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_cli_quantize_replaces_an_int8_model_only_with_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Like import-bundle: an INT8 model already in --out (perhaps the one that passed the
    gate last week) is not replaced silently; the error names the files, before any work."""
    spec = _tiny_model(tmp_path / "fp32")
    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(2).random((4, 32, 32), dtype=np.float32))
    out = tmp_path / "out"
    assert _quantize_cli(spec.spec_path, out, calib) == 0
    capsys.readouterr()
    before = _contents(out)
    assert sorted(before) == ["tiny_int8.onnx", "tiny_int8.toml"]

    assert _quantize_cli(spec.spec_path, out, calib) == 2
    err = capsys.readouterr().err
    assert f"{out / 'tiny_int8.toml'} and {out / 'tiny_int8.onnx'} already exist" in err
    assert "--force" in err
    assert _contents(out) == before, "a refused run must leave the folder as it was"

    (out / "tiny_int8.toml").unlink()  # one of the pair left: still refused, and named alone
    assert _quantize_cli(spec.spec_path, out, calib) == 2
    assert f"{out / 'tiny_int8.onnx'} already exists" in capsys.readouterr().err

    assert _quantize_cli(spec.spec_path, out, calib, "--force") == 0
    capsys.readouterr()
    after = _contents(out)
    assert sorted(after) == ["tiny_int8.onnx", "tiny_int8.toml"], "no scratch or staged file left behind"
    assert load_spec(out / "tiny_int8.toml").sha256 == sha256_file(out / "tiny_int8.onnx")


def test_cli_quantize_never_writes_over_the_model_it_quantizes(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """An INT8 model keeps its source's name, so quantizing it again into its own folder
    would write NAME_int8.onnx/.toml over itself: refused, --force or not."""
    spec = _tiny_model(tmp_path / "fp32")
    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(2).random((4, 32, 32), dtype=np.float32))
    out = tmp_path / "out"
    assert _quantize_cli(spec.spec_path, out, calib) == 0
    capsys.readouterr()
    before = _contents(out)
    for force in ((), ("--force",)):
        assert _quantize_cli(out / "tiny_int8.toml", out, calib, *force) == 2
        err = capsys.readouterr().err
        assert "that is the model being quantized" in err and str(out / "tiny_int8.onnx") in err
        assert _contents(out) == before
    with pytest.raises(ModelError, match="the model being quantized"):  # the library call too
        quantize_int8(load_spec(out / "tiny_int8.toml"), out, calibration=[np.zeros((32, 32), np.float32)])
    assert _contents(out) == before


# --------------------------------------------------------------------------- the shipped model


def _shipped(spec: Path) -> ModelSpec:
    if not spec.is_file():
        missing(f"the shipped {spec.stem} is not there yet (python -m medrt.models.train {spec.stem})")
    return load_spec(spec)


@pytest.fixture(scope="module")
def lite() -> ModelSpec:
    return _shipped(LITE)


@pytest.fixture(scope="module")
def lite_int8(lite: ModelSpec, tmp_path_factory: pytest.TempPathFactory) -> ModelSpec:
    return quantize_int8(lite, tmp_path_factory.mktemp("int8"))


@pytest.fixture(scope="module")
def unet() -> ModelSpec:
    return _shipped(UNET)


@pytest.fixture(scope="module")
def unet_int8(unet: ModelSpec, tmp_path_factory: pytest.TempPathFactory) -> ModelSpec:
    return quantize_int8(unet, tmp_path_factory.mktemp("int8"))


@pytest.fixture(scope="module")
def frames() -> list:
    return validation_frames()


def test_int8_lite_follows_fp32_on_calibration_frames(lite: ModelSpec, lite_int8: ModelSpec) -> None:
    onnx = require_module("onnx")
    ops = Counter(n.op_type for n in onnx.load(str(lite_int8.path)).graph.node)
    assert ops["QuantizeLinear"] > 0 and ops["DequantizeLinear"] > 0, ops
    for x in calibration_inputs(lite)[:4]:
        p_ref = 1 / (1 + np.exp(-_run(lite, x)))
        p_got = 1 / (1 + np.exp(-_run(lite_int8, x)))
        assert float(np.abs(p_ref - p_got).mean()) < 0.01
        ref, got = p_ref >= 0.5, p_got >= 0.5
        if ref.sum() > 50:
            assert 2 * (ref & got).sum() / (ref.sum() + got.sum()) > 0.9


def test_gate_accepts_a_good_int8_model(unet: ModelSpec, unet_int8: ModelSpec, frames: list) -> None:
    report = compare(unet, unet_int8, frames=frames)
    assert report.fp32.sensitivity > 0.25 and report.fp32.dice > 0.5, "the FP32 model must find lesions"
    assert report.passed, report.message
    assert report.drop_points.dice <= 1.0 and report.drop_points.sensitivity <= 1.0
    assert report.message.startswith("lesion_unet int8 accepted")
    report.enforce()  # does not raise
    # lesion_unet is made for CT and radiographs (its spec lists both): every frame is scored.
    assert report.frames == len(frames) and {f.modality for f in frames} == {"CT", "DX"}


def test_gate_refuses_a_badly_calibrated_model(
    lite: ModelSpec, frames: list, tmp_path: Path
) -> None:
    # Calibrated on empty frames only, every layer quantized: lesions saturate the ranges.
    poor = quantize_int8(lite, tmp_path, calibration=[np.zeros((512, 512), np.float32)], exclude_first_last=False)
    report = compare(lite, poor, frames=frames)
    assert not report.passed
    # lesion_unet_lite is made for CT (its spec lists it): the radiographs are not scored.
    assert report.frames == sum(f.modality == "CT" for f in frames) < len(frames)
    assert max(report.drop_points.dice, report.drop_points.sensitivity) > 1.0
    msg = report.message
    assert msg.startswith("lesion_unet_lite int8 refused: Dice ")
    assert f"{report.fp32.dice:.3f} -> {report.reduced.dice:.3f}" in msg
    assert f"{report.fp32.sensitivity:.3f} -> {report.reduced.sensitivity:.3f}" in msg
    assert "the limit is 1 point" in msg
    # false positives are reported beside the figures, not gated
    fp32_fp, reduced_fp = report.false_positives
    assert f"false positives {fp32_fp} -> {reduced_fp}, not gated ({report.frames} validation frames" in msg
    with pytest.raises(AccuracyGateError, match="refused") as info:
        report.enforce()
    assert isinstance(info.value, ModelError)


def test_cli_quantize_writes_an_accepted_model_and_refuses_a_bad_one(
    unet: ModelSpec, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # medrt.cli.main is what `python -m medrt` runs; in-process it reuses the phantoms
    # cached by the tests above (a subprocess would spend 15 s regenerating them).
    ok = main(["models", "quantize", str(UNET), "--out", str(tmp_path / "ok")])
    out = capsys.readouterr()
    assert ok == 0, out.err
    assert "lesion_unet int8 accepted" in out.out and "sensitivity" in out.out
    spec = load_spec(tmp_path / "ok" / "lesion_unet_int8.toml")
    assert spec.version == f"{unet.version}+int8"
    names = sorted(p.name for p in (tmp_path / "ok").iterdir())
    assert names == ["lesion_unet_int8.onnx", "lesion_unet_int8.toml"]

    zeros = tmp_path / "empty.npy"
    np.save(zeros, np.zeros((2, 512, 512), np.float32))
    bad = main(["models", "quantize", str(LITE), "--out", str(tmp_path / "bad"), "--quantize-all",
                "--calibration", str(zeros)])  # fmt: skip
    out = capsys.readouterr()
    assert bad == 1, out.out + out.err
    assert "lesion_unet_lite int8 refused" in out.err and "the limit is 1 point" in out.err
    assert list((tmp_path / "bad").iterdir()) == [], "a refused model must leave nothing behind"


def test_cli_quantize_is_a_medrt_command() -> None:
    run = subprocess.run([sys.executable, "-m", "medrt", "models", "quantize", "--help"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0 and "--keep-first-last" in run.stdout and "--quantize-all" in run.stdout


# --------------------------------------------------------------------------- INT8 on demand


def test_int8_precision_runs_the_gated_twin_made_once(unet: ModelSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    """--precision int8 on the CPU with an FP32 spec: the backend quantizes and gates it on
    first use, keeps the result in the cache, and loads it from there afterwards."""
    import json
    import logging

    from medrt.engine.backends.onnxrt import OnnxRuntimeBackend

    monkeypatch.setenv("MEDRT_CACHE", str(tmp_path))
    with caplog.at_level(logging.INFO, logger="medrt.engine.int8cache"):
        first = OnnxRuntimeBackend(unet, precision="int8", threads=1)
    assert "quantizing and gating" in caplog.text
    assert first.spec.quantization and first.spec.version == f"{unet.version}+int8" and first.info().precision == "int8"
    (folder,) = (tmp_path / "int8").iterdir()
    assert unet.sha256[:16] in folder.name and first.spec.path.parent == folder
    verdict = json.loads((folder / "verdict.json").read_text())
    assert verdict["passed"] and verdict["sha256"] == unet.sha256 and "accepted" in verdict["message"]
    assert not [p for p in tmp_path.joinpath("int8").iterdir() if p.name.startswith(".")], "staging folder left behind"
    assert first.spec.card == unet.card  # the relative card path survived the move into place

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="medrt.engine.int8cache"):
        again = OnnxRuntimeBackend(unet, precision="int8", threads=1)
    assert "quantizing" not in caplog.text and "INT8 from" in caplog.text
    assert again.spec.sha256 == first.spec.sha256
    x = calibration_inputs(unet, n=2)[0]
    ref, got = OnnxRuntimeBackend(unet, threads=1).infer(x)[0], again.infer(x)[0]
    p_ref, p_got = 1 / (1 + np.exp(-ref)), 1 / (1 + np.exp(-got))
    assert float(np.abs(p_ref - p_got).mean()) < 0.01  # the twin follows FP32: the gated INT8, not another model
    ref_mask, got_mask = p_ref >= 0.5, p_got >= 0.5
    assert 2 * (ref_mask & got_mask).sum() >= 0.9 * (ref_mask.sum() + got_mask.sum())


def test_a_refused_int8_twin_is_remembered_and_the_analyzer_runs_that_model_in_fp32(
    lite: ModelSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import json
    import logging

    from medrt.analyzer import AnalyzerConfig, load_analyzer
    from medrt.engine.backends.onnxrt import OnnxRuntimeBackend
    from medrt.engine.int8cache import cache_folder
    from medrt.engine.registry import find_spec

    monkeypatch.setenv("MEDRT_CACHE", str(tmp_path))
    specs = [lite, find_spec("roi_classifier")]
    for spec in specs:  # the verdicts a failed gate leaves (the gate itself is tested above)
        folder = cache_folder(spec, tmp_path / "int8")
        folder.mkdir(parents=True)
        message = f"{spec.name} int8 refused: Dice 0.800 -> 0.700 (-10.0 points); the limit is 1 point"
        (folder / "verdict.json").write_text(json.dumps({"passed": False, "message": message}))
    with pytest.raises(AccuracyGateError, match=r"lesion_unet_lite int8 refused: Dice 0\.800 .*delete it"):
        OnnxRuntimeBackend(lite, precision="int8")
    for backend in ("auto", "onnxruntime"):  # auto: the selector's next choice; named: the analyzer's fallback
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            analyzer = load_analyzer(AnalyzerConfig(seg_model=str(LITE), roi_model="roi_classifier",
                                                    precision="int8", backend=backend))  # fmt: skip
        assert analyzer.seg.info().precision == "fp32" and analyzer.rois[0].info().precision == "fp32", backend
        assert "lesion_unet_lite int8 refused: Dice 0.800" in caplog.text and "fp32" in caplog.text, backend
        assert "roi_classifier int8 refused" in caplog.text, backend


def test_gate_plans_radiograph_crops_with_the_classifier_the_analyzer_would_use(frames: list) -> None:
    """Radiographs go to roi_classifier_dx (its spec lists DX), CT slices to roi_classifier,
    as the analyzer routes them; the gate's crops are the ones a user's run would get."""
    from medrt.engine.backends.onnxrt import OnnxRuntimeBackend
    from medrt.engine.gate import ROI_CLASSIFIERS, _Router
    from medrt.engine.registry import find_spec

    general, dx = (OnnxRuntimeBackend(find_spec(name), threads=1) for name in ROI_CLASSIFIERS)
    router = _Router([general, dx])
    kinds = {f.modality: f for f in frames}
    assert set(kinds) == {"CT", "DX"}
    assert router.pick(kinds["DX"]) is dx and router.pick(kinds["CT"]) is general


def test_gate_scores_radiographs_through_the_fine_sweep_as_the_analyzer_runs_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """A radiograph is much finer than the UNet: the analyzer segments it whole with the fine
    sweep, so the gate does too (the ROI path's first pass, which it scored before, is not
    what a user's run gets). The sweep is the real one, counted on its way through."""
    import medrt.engine.gate as gate
    from medrt.engine.registry import find_spec

    calls: list[float] = []
    real = gate.sweep

    def counted(model, norm, spacing_mm, threshold, cfg, crops=None):  # type: ignore[no-untyped-def]
        calls.append(cfg.min_diameter_mm)
        return real(model, norm, spacing_mm, threshold, cfg, crops)

    monkeypatch.setattr(gate, "sweep", counted)
    spec = find_spec("lesion_unet_dx")
    report = compare(spec, spec, frames=validation_frames(n_ct_series=0, n_dx=1))
    assert calls == [1.5, 1.5]  # fp32 and the twin, with the analyzer's least length
    assert report.passed and report.drop_points.sensitivity == 0.0 and report.lesions > 0
    assert report.fp32.sensitivity > 0.0  # the sweep found the frame's nodules


def test_gate_rechecks_ct_slices_as_the_analyzer_does(lite: ModelSpec, frames: list,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The analyzer rechecks a CT slice's small and faint candidates at 2x and reports
    lesions from its least length; the gate scores CT the same way (before: the first
    pass alone). The recheck is the real one, counted on its way through."""
    import medrt.engine.gate as gate
    from medrt.analyzer import AnalyzerConfig

    seen: list[object] = []
    real = gate.recheck_map

    def counted(model, norm, prob, spacing_mm, threshold, cfg):  # type: ignore[no-untyped-def]
        seen.append(cfg)
        return real(model, norm, prob, spacing_mm, threshold, cfg)

    monkeypatch.setattr(gate, "recheck_map", counted)
    ct = [f for f in frames if f.modality == "CT"]
    report = compare(lite, lite, frames=ct)
    assert len(seen) == 2 * len(ct)  # every slice, for the FP32 model and its "twin"
    assert set(seen) == {AnalyzerConfig().recheck_config}
    assert report.passed and report.drop_points == gate.Figures(0.0, 0.0) and report.fp32.sensitivity > 0.5


def test_gate_default_set_comes_one_series_or_radiograph_at_a_time_of_the_models_modalities() -> None:
    """The default set is generated lazily, a CT series (the slices a 2.5-D model needs
    together) or a radiograph at a time, and only of the modalities the model is for."""
    from medrt.engine.gate import GateSet

    chosen = GateSet(ct_series=2, ct_slices=3, radiographs=2, nodules=3)
    ct = list(chosen.groups({"CT"}))
    assert [len(g) for g in ct] == [3, 3] and [{f.seed for f in g} for g in ct] == [{9100}, {9101}]
    assert all(f.modality == "CT" for g in ct for f in g)
    dx = list(chosen.groups({"DX", "CR"}))
    assert [len(g) for g in dx] == [1, 1] and all(g[0].modality == "DX" and g[0].shape == (4096, 4096) for g in dx)
    assert [len(g[0].lesions) for g in dx] == [3, 4]  # three nodules, and one across the border on every other
    assert len(list(chosen.groups(set()))) == 4  # a spec that lists no modality: both


def test_gate_refuses_to_judge_a_model_for_a_modality_it_has_no_phantoms_of(lite: ModelSpec) -> None:
    """The phantoms are CT slices and radiographs: an MR model gets a clear error, not a verdict."""
    from dataclasses import replace

    mr = replace(lite, modalities=("MR",))
    with pytest.raises(ModelError, match=r"no validation frame of \['MR'\] for lesion_unet_lite@"):
        compare(mr, mr)


def test_int8_runs_without_a_writable_cache(unet: ModelSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    """A cache that cannot be written (here a file where the folder should be; a
    read-only home on a locked-down workstation) costs the cache, not the run."""
    import logging

    from medrt.engine.int8cache import gated_int8

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("MEDRT_CACHE", str(blocker))
    with caplog.at_level(logging.WARNING, logger="medrt.engine.int8cache"):
        reduced = gated_int8(unet)
    assert reduced.quantization and reduced.path.is_file() and "cannot write the INT8 cache" in caplog.text
    assert blocker.is_file() and not reduced.path.is_relative_to(tmp_path)


def test_cli_models_int8_makes_lists_and_clears_the_cache(unet: ModelSpec, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # fmt: skip
    """IT can make the INT8 twins at install time, see the verdicts and clear them."""
    import json

    monkeypatch.setenv("MEDRT_CACHE", str(tmp_path))
    assert main(["models", "int8"]) == 0
    assert "no INT8 models" in capsys.readouterr().out
    assert main(["models", "int8", str(UNET), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    (entry,) = listed["models"]
    assert entry["source"] == unet.ident and entry["passed"] and "accepted" in entry["message"]
    assert main(["models", "int8"]) == 0
    assert f"ok       {unet.ident}" in capsys.readouterr().out
    assert main(["models", "int8", "--clear", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["removed"] == [entry["folder"]]
    assert not any((tmp_path / "int8").iterdir())


def test_a_model_with_unnamed_nodes_quantizes_with_its_ends_in_fp32(tmp_path: Path) -> None:
    """Other exporters leave nodes unnamed; the first/last layers are excluded by name,
    so the rewrite names them first (before: 'the graph has unnamed nodes')."""
    onnx = require_module("onnx")
    spec = _tiny_model(tmp_path / "fp32")
    model = onnx.load(str(spec.path))
    for node in model.graph.node:
        node.name = ""
    onnx.save(model, str(spec.path))
    text = spec.spec_path.read_text().replace(spec.sha256, sha256_file(spec.path))
    spec.spec_path.write_text(text)
    spec = load_spec(spec.spec_path)
    rng = np.random.default_rng(1)
    q = quantize_int8(spec, tmp_path / "out", calibration=[rng.random((64, 64), dtype=np.float32) for _ in range(4)])
    excluded = q.quantization["excluded_nodes"]
    assert excluded == ["Conv:c0", "Conv:logits"], excluded


def test_roi_classifiers_are_calibrated_on_the_modalities_their_specs_list() -> None:
    """The CT-only ``roi_classifier`` is calibrated on CT thumbnails alone and
    ``roi_classifier_dx`` on radiograph thumbnails alone (the CT one used to get half
    radiographs, which widened its INT8 ranges for inputs it never sees); a classifier
    that lists no modality gets both."""
    from itertools import islice

    from medrt.engine.calibration import _ct_share, _roi_items, calibration_description
    from medrt.engine.registry import find_spec

    ct, dx = find_spec("roi_classifier"), find_spec("roi_classifier_dx")
    assert (_ct_share(ct), _ct_share(dx)) == (1.0, 0.0)
    assert "radiograph" not in calibration_description(ct) and "CT" not in calibration_description(dx)
    kinds = {share: {cat.split("-")[0] for cat, _ in islice(_roi_items(64, 7000, 4, ct_share=share), 60)}
             for share in (1.0, 0.0)}
    assert kinds == {1.0: {"ct"}, 0.0: {"dx"}}
    both = [cat.split("-")[0] for cat, _ in _roi_items(64, 7000, 4, ct_share=0.5)]
    assert set(both) == {"ct", "dx"}


def test_a_twins_cache_folder_names_the_models_it_is_gated_with(tmp_path: Path) -> None:
    """A classifier's verdict is measured through a segmenter: put another segmenter
    beside it (a user's own, a new version) and its twin is gated again, not served from
    the verdict the old segmenter gave."""
    import shutil

    from medrt.engine.gate import default_partners
    from medrt.engine.int8cache import cache_folder

    shipped = REPO / "models"
    own = tmp_path / "models"
    own.mkdir()
    for f in ("roi_classifier.toml", "roi_classifier.onnx", "roi_classifier.md"):
        shutil.copy(shipped / f, own / f)
    spec = load_spec(own / "roi_classifier.toml")
    assert [p.name for p in default_partners(spec)] == ["lesion_unet_lite"]  # the shipped one: CT, like the classifier
    before = cache_folder(spec, tmp_path / "int8")
    # a segmenter named lesion_unet_lite beside it, here lesion_unet's files: it is gated with that one now
    shutil.copy(shipped / "lesion_unet.toml", own / "lesion_unet_lite.toml")
    shutil.copy(shipped / "lesion_unet.onnx", own / "lesion_unet.onnx")
    shutil.copy(shipped / "lesion_unet.md", own / "lesion_unet.md")
    partner, = default_partners(spec)
    assert partner.sha256 == load_spec(shipped / "lesion_unet.toml").sha256
    after = cache_folder(spec, tmp_path / "int8")
    assert after != before and after.name.startswith(f"roi_classifier-{spec.sha256[:16]}-with")
    assert before.name.split("-with")[0] == after.name.split("-with")[0]
    # a threshold tuned in the spec (its own or its partner's): gated again at it
    from dataclasses import replace

    tuned = replace(spec, thresholds={**spec.thresholds, "heatmap": 0.2})
    assert cache_folder(tuned, tmp_path / "int8") != after
    assert cache_folder(replace(spec), tmp_path / "int8") == after
    # the CPU's integer kernels: a verdict on VNNI (exact sums) does not hold on AVX2 (saturating)
    from medrt.engine.hardware import int8_kernels

    assert f"-{int8_kernels()}-v" in after.name
