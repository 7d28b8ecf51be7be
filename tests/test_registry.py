"""Model specs (``medrt.engine.registry``) and ``medrt models list|verify``, on real ONNX files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import REPO, require_module
from medrt.engine.registry import (
    ModelError,
    ModelIntegrityError,
    find_spec,
    load_spec,
    sha256_file,
    shipped_models_dir,
)


def medrt(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "medrt", *args], cwd=REPO, capture_output=True, text=True, timeout=300
    )


def _save(graph_nodes: list, inputs: list, outputs: list, path: Path) -> Path:
    onnx = require_module("onnx")
    helper = onnx.helper
    graph = helper.make_graph(graph_nodes, "tiny", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def segmenter_onnx(path: Path) -> Path:
    """``foreground = Identity(image)``, [N, 1, H, W] float32."""
    onnx = require_module("onnx")
    h, F = onnx.helper, onnx.TensorProto.FLOAT
    return _save(
        [h.make_node("Identity", ["image"], ["foreground"])],
        [h.make_tensor_value_info("image", F, ["N", 1, "H", "W"])],
        [h.make_tensor_value_info("foreground", F, ["N", 1, "H", "W"])],
        path,
    )


def roi_onnx(path: Path) -> Path:
    """``heatmap`` = 4x4 average pool of the thumbnail; ``presence`` = its max, [N, 1]."""
    onnx = require_module("onnx")
    h, F = onnx.helper, onnx.TensorProto.FLOAT
    return _save(
        [
            h.make_node("AveragePool", ["image"], ["heatmap"], kernel_shape=[4, 4], strides=[4, 4]),
            h.make_node("GlobalMaxPool", ["heatmap"], ["pooled"]),
            h.make_node("Flatten", ["pooled"], ["presence"], axis=1),
        ],
        [h.make_tensor_value_info("image", F, ["N", 1, "H", "W"])],
        [
            h.make_tensor_value_info("presence", F, ["N", 1]),
            h.make_tensor_value_info("heatmap", F, ["N", 1, "h", "w"]),
        ],
        path,
    )


SEG_SPEC = """\
[model]
name = "tiny_seg"
version = "1.2.3"
task = "segmentation"
file = "{file}"
sha256 = "{sha}"
multiple_of = 16
description = "identity test model"
card = "tiny_seg.md"

[[inputs]]
name = "image"
shape = ["N", 1, "H", "W"]
dtype = "float32"
meaning = "normalised frame"

[[outputs]]
name = "{out}"
shape = ["N", 1, "H", "W"]
activation = "sigmoid"

[normalization]
method = "fixed_window"
center = 40
width = 400

[thresholds]
probability = 0.5

[training]
data = "none"
epochs = 0
"""

ROI_SPEC = """\
[model]
name = "tiny_roi"
version = "0.1"
task = "roi_classifier"
file = "roi.onnx"
sha256 = "{sha}"
thumbnail = 256
stride = 4

[[inputs]]
name = "image"
shape = ["N", 1, "H", "W"]

[[outputs]]
name = "presence"
shape = ["N", 1]
activation = "sigmoid"
{heatmap}
[thresholds]
presence = 0.5
heatmap = 0.5
"""

HEATMAP = '\n[[outputs]]\nname = "heatmap"\nshape = ["N", 1, "h", "w"]\nactivation = "sigmoid"\n'


def write_seg(tmp_path: Path, *, out: str = "foreground") -> Path:
    model = segmenter_onnx(tmp_path / "seg.onnx")
    spec = tmp_path / "tiny_seg.toml"
    spec.write_text(SEG_SPEC.format(file=model.name, sha=sha256_file(model), out=out))
    return spec


def test_load_spec_reads_every_field(tmp_path: Path) -> None:
    spec = load_spec(write_seg(tmp_path))
    assert (spec.name, spec.version, spec.task, spec.ident) == ("tiny_seg", "1.2.3", "segmentation", "tiny_seg@1.2.3")
    assert spec.path == (tmp_path / "seg.onnx").resolve() and spec.sha256 == sha256_file(spec.path)
    assert spec.inputs[0].shape == ("N", 1, "H", "W") and spec.inputs[0].dtype == "float32"
    assert spec.output("foreground").activation == "sigmoid"
    assert (spec.normalization, spec.window, spec.multiple_of) == ("fixed_window", (40.0, 400.0), 16)
    assert spec.thresholds == {"probability": 0.5} and spec.training == {"data": "none", "epochs": 0}
    assert spec.card == (tmp_path / "tiny_seg.md").resolve()
    with pytest.raises(ModelError, match="no output named 'mask'"):
        spec.output("mask")


def test_a_changed_model_file_is_refused(tmp_path: Path) -> None:
    spec_path = write_seg(tmp_path)
    with open(tmp_path / "seg.onnx", "ab") as fp:
        fp.write(b"\0")
    with pytest.raises(ModelIntegrityError, match=r"seg\.onnx: sha256 .* Refusing to load it"):
        load_spec(spec_path)
    assert load_spec(spec_path, verify=False).name == "tiny_seg"  # reading the spec alone still works

    out = medrt("models", "verify", str(spec_path))
    assert out.returncode == 1
    assert "FAIL" in out.stdout and "seg.onnx: sha256" in out.stdout and "1 failed" in out.stdout


def test_a_missing_model_file_names_it(tmp_path: Path) -> None:
    spec_path = write_seg(tmp_path)
    (tmp_path / "seg.onnx").unlink()
    with pytest.raises(ModelError, match=r"seg\.onnx does not exist"):
        load_spec(spec_path)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda s: s.replace('name = "tiny_seg"\n', ""), r"\[model\]: missing required key 'name'"),
        (lambda s: s.replace('file = "seg.onnx"\n', ""), r"missing required key 'file'"),
        (lambda s: s.replace("[[outputs]]", "[[unused]]"), r"\[\[outputs\]\]: must be a non-empty list"),
        (lambda s: s.replace('task = "segmentation"', 'task = "detector"'), r"task must be one of .* not 'detector'"),
        (lambda s: s.replace('method = "fixed_window"', 'method = "zscore"'), r"method must be one of"),
        (lambda s: s.replace("center = 40\n", ""), r"missing required key 'center'"),
        (lambda s: s.replace('activation = "sigmoid"', 'activation = "softmax"'), r"activation must be one of"),
        (lambda s: s.replace("[model]", "[model"), r"not valid TOML"),
        (lambda s: s.replace("[model]", "[model]\nneighbour_mm = 3.0"), r"neighbour_mm is for a 2.5-D model"),
        (lambda s: s.replace("[model]", "[model]\nneighbour_mm = -1"), r"neighbour_mm must be a distance"),
        (lambda s: s.replace("[model]", '[model]\nplanes = ["AXIAL", "OBLIQUE"]'), r"planes takes AXIAL, .* 'OBLIQUE'"),
        (lambda s: s.replace("[model]", '[model]\nbody_parts = "CHEST"'), r"body_parts must be a list"),
        # values of the wrong kind or range: a traceback, or silently wrong lesions, before
        (lambda s: s.replace("probability = 0.5", "probability = nan"), r"\[thresholds\] probability must be a "
                                                                          r"number from 0 to 1, not nan"),
        (lambda s: s.replace("probability = 0.5", "probability = 1.5"), r"probability must be a number from 0 to 1"),
        (lambda s: s.replace("probability = 0.5", 'probability = "high"'), r"not 'high'"),
        (lambda s: s.replace("probability = 0.5", "probabilty = 0.5"), r"'probabilty' is not a threshold medrt reads"),
        (lambda s: s.replace("center = 40", 'center = "soft tissue"'), r"\[normalization\] center must be a number"),
        (lambda s: s.replace("width = 400", "width = 0"), r"\[normalization\] width must be a number above 0"),
        (lambda s: s.replace("multiple_of = 16", 'multiple_of = "sixteen"'), r"multiple_of must be a whole number"),
        (lambda s: s.replace("multiple_of = 16", "multiple_of = 0"), r"multiple_of must be a whole number from 1"),
        (lambda s: s.replace('dtype = "float32"', 'dtype = "float"'), r"dtype must be one of"),
    ],
)
def test_bad_specs_name_the_file_and_the_reason(tmp_path: Path, edit, message: str) -> None:  # type: ignore[no-untyped-def]
    spec_path = write_seg(tmp_path)
    spec_path.write_text(edit(spec_path.read_text()))
    with pytest.raises(ModelError, match=message) as info:
        load_spec(spec_path)
    assert str(spec_path) in str(info.value)
    out = medrt("models", "verify", str(spec_path))
    assert out.returncode == 1 and str(spec_path) in out.stdout


def test_no_such_spec_and_no_such_shipped_model(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="no such model spec"):
        load_spec(tmp_path / "absent.toml")
    with pytest.raises(ModelError, match=r"no shipped model named 'no_such_model' \(shipped: "):
        find_spec("no_such_model")
    assert find_spec(write_seg(tmp_path)).name == "tiny_seg"


def test_verify_checks_names_against_the_onnx_graph(tmp_path: Path) -> None:
    good = write_seg(tmp_path)
    (tmp_path / "other").mkdir()
    bad = write_seg(tmp_path / "other", out="mask")
    out = medrt("models", "verify", "--json", str(good), str(bad))
    assert out.returncode == 1, out.stderr
    by_spec = {Path(m["spec"]).parent.name: m for m in json.loads(out.stdout)["models"]}
    assert by_spec[tmp_path.name]["ok"] and by_spec[tmp_path.name]["task"] == "segmentation"
    assert not by_spec["other"]["ok"]
    assert "'mask'" in by_spec["other"]["error"] and "not in the ONNX graph of seg.onnx" in by_spec["other"]["error"]

    ok = medrt("models", "verify", str(good))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.startswith("OK") and "tiny_seg@1.2.3" in ok.stdout


def test_verify_a_file_that_is_not_onnx(tmp_path: Path) -> None:
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    spec = tmp_path / "junk.toml"
    spec.write_text(SEG_SPEC.format(file=junk.name, sha=sha256_file(junk), out="foreground"))
    out = medrt("models", "verify", str(spec))
    assert out.returncode == 1 and "junk.onnx: onnxruntime cannot load the model" in out.stdout


def test_roi_classifier_contract(tmp_path: Path) -> None:
    model = roi_onnx(tmp_path / "roi.onnx")
    spec_path = tmp_path / "roi.toml"
    spec_path.write_text(ROI_SPEC.format(sha=sha256_file(model), heatmap=HEATMAP))
    spec = load_spec(spec_path)
    assert (spec.task, spec.thumbnail, spec.stride, spec.normalization) == ("roi_classifier", 256, 4, "window")
    assert spec.output("heatmap").shape == ("N", 1, "h", "w")
    assert medrt("models", "verify", str(spec_path)).returncode == 0

    spec_path.write_text(ROI_SPEC.format(sha=sha256_file(model), heatmap=""))
    out = medrt("models", "verify", str(spec_path))
    assert out.returncode == 1 and "a roi_classifier needs [[outputs]] named heatmap" in out.stdout

    spec_path.write_text(ROI_SPEC.format(sha=sha256_file(model), heatmap=HEATMAP).replace("thumbnail = 256\n", ""))
    with pytest.raises(ModelError, match="a roi_classifier needs \\[model\\] thumbnail"):
        load_spec(spec_path)


def test_models_list_reports_every_shipped_spec() -> None:
    shipped = sorted(shipped_models_dir().glob("*.toml"))
    out = medrt("models", "list", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    listed = json.loads(out.stdout)["models"]
    assert [Path(m["spec"]).name for m in listed] == [p.name for p in shipped]
    assert all(m["ok"] and m["size_bytes"] > 0 for m in listed)

    human = medrt("models", "list")
    assert human.returncode == 0
    if shipped:
        for m in listed:
            assert m["name"] in human.stdout and "sha256 ok" in human.stdout
    else:
        assert "no shipped models" in human.stdout


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda s: s.replace('shape = ["N", 1, "H", "W"]\ndtype', 'shape = ["N", 1, "H"]\ndtype'), "has rank 3"),
        (lambda s: s.replace('shape = ["N", 1, "H", "W"]\ndtype', 'shape = ["N", 3, "H", "W"]\ndtype'), "dimension 1 is 3 in the spec, 1 in the graph"),
        (lambda s: s.replace('dtype = "float32"', 'dtype = "float16"'), r"dtype float16 in the spec, tensor\(float\) in the graph"),
    ],
)
def test_verify_checks_shapes_and_dtypes(tmp_path: Path, edit, message: str) -> None:  # type: ignore[no-untyped-def]
    from medrt.commands.models import verify_model

    spec_path = write_seg(tmp_path)
    spec_path.write_text(edit(spec_path.read_text()))
    with pytest.raises(ModelError, match=message) as info:
        verify_model(spec_path)
    assert str(spec_path.resolve()) in str(info.value) and "'image'" in str(info.value)


def test_segmentation_spacing_is_read_and_checked(tmp_path: Path) -> None:
    spec_path = write_seg(tmp_path)
    assert load_spec(spec_path).spacing_mm is None  # optional: absent means native resolution
    text = spec_path.read_text()
    spec_path.write_text(text.replace("multiple_of = 16\n", "multiple_of = 16\nspacing_mm = 0.5\n"))
    assert load_spec(spec_path).spacing_mm == 0.5
    for bad in ("0", "-0.5", '"0.5"', "true", "inf"):
        spec_path.write_text(text.replace("multiple_of = 16\n", f"multiple_of = 16\nspacing_mm = {bad}\n"))
        with pytest.raises(ModelError, match="spacing_mm must be a positive number of mm") as info:
            load_spec(spec_path)
        assert str(spec_path) in str(info.value)


def _roi_spec_with(tmp_path: Path, line: str) -> Path:
    """A valid ROI classifier spec with one more ``[model]`` line."""
    model = roi_onnx(tmp_path / "roi.onnx")
    spec_path = tmp_path / "roi.toml"
    spec_path.write_text(ROI_SPEC.format(sha=sha256_file(model), heatmap=HEATMAP).replace(
        "stride = 4\n", f"stride = 4\n{line}\n"))
    return spec_path


@pytest.mark.parametrize("line, message", [("spacing_mm = 0.5", "spacing_mm applies to segmentation models only"),
                                           ("slices = 3", "has 1 channel")])
def test_segmentation_fields_are_refused_on_a_roi_classifier(tmp_path: Path, line: str, message: str) -> None:
    """spacing_mm is the segmenters' alone; a 2.5-D classifier's input needs its three channels."""
    with pytest.raises(ModelError, match=message):
        load_spec(_roi_spec_with(tmp_path, line))


def test_the_shipped_unet_names_its_spacing() -> None:
    """lesion_unet 2.x works at 0.5 mm; a segmenter without the field runs natively."""
    from medrt.engine.registry import shipped_specs

    specs = {s.name: s for s in shipped_specs(verify=False)}
    assert specs["lesion_unet"].spacing_mm == 0.5
    for spec in specs.values():
        assert spec.spacing_mm is None or (spec.task == "segmentation" and 0.1 <= spec.spacing_mm <= 2.0)


def test_slices_are_read_and_checked_against_the_input(tmp_path: Path) -> None:
    """``[model] slices = 3`` (2.5-D) needs three input channels when the spec names them."""
    spec_path = write_seg(tmp_path)
    text = spec_path.read_text()
    assert load_spec(spec_path).slices == 1  # absent: one slice
    for bad in ("2", "0", '"3"', "true"):
        spec_path.write_text(text.replace("multiple_of = 16\n", f"multiple_of = 16\nslices = {bad}\n"))
        with pytest.raises(ModelError, match="slices must be 1 or 3") as info:
            load_spec(spec_path)
        assert str(spec_path) in str(info.value)
    spec_path.write_text(text.replace("multiple_of = 16\n", "multiple_of = 16\nslices = 3\n"))
    with pytest.raises(ModelError, match="has 1 channel"):
        load_spec(spec_path, verify=False)
    spec_path.write_text(spec_path.read_text().replace('["N", 1, "H", "W"]', '["N", 3, "H", "W"]', 1))
    assert load_spec(spec_path, verify=False).slices == 3


def test_a_two_and_a_half_d_roi_classifier_gets_the_neighbouring_thumbnails(tmp_path: Path) -> None:
    """A classifier whose spec says ``slices = 3`` is fed the head-side, this and the
    feet-side slice's thumbnails (a missing one: this slice again)."""
    onnx = require_module("onnx")
    from medrt.analysis.roi import classify
    from medrt.engine.backends.onnxrt import OnnxRuntimeBackend
    from medrt.preprocess import normalize, thumbnail

    h, F = onnx.helper, onnx.TensorProto.FLOAT
    model = _save(
        [
            h.make_node("ReduceMax", ["image"], ["top"], axes=[1], keepdims=1),
            h.make_node("AveragePool", ["top"], ["heatmap"], kernel_shape=[4, 4], strides=[4, 4]),
            h.make_node("GlobalMaxPool", ["heatmap"], ["pooled"]),
            h.make_node("Flatten", ["pooled"], ["presence"], axis=1),
        ],
        [h.make_tensor_value_info("image", F, ["N", 3, "H", "W"])],
        [h.make_tensor_value_info("presence", F, ["N", 1]), h.make_tensor_value_info("heatmap", F, ["N", 1, "h", "w"])],
        tmp_path / "roi.onnx",
    )
    spec_path = tmp_path / "roi.toml"
    spec_path.write_text(ROI_SPEC.format(sha=sha256_file(model), heatmap=HEATMAP)
                         .replace("stride = 4\n", "stride = 4\nslices = 3\n").replace('["N", 1, "H", "W"]', '["N", 3, "H", "W"]', 1))
    spec = load_spec(spec_path)
    assert spec.slices == 3
    seen: list[np.ndarray] = []

    class Recording(OnnxRuntimeBackend):
        def infer(self, x: np.ndarray) -> Any:  # type: ignore[override]
            seen.append(x.copy())
            return super().infer(x)

    rng = np.random.default_rng(3)
    here, before, after = (rng.normal(40, 30, (512, 512)).astype(np.float32) for _ in range(3))
    window = (40.0, 400.0)
    model_b = Recording(spec)
    classify(model_b, here, window, neighbours=(before, after))
    classify(model_b, here, window)
    want = [normalize(thumbnail(a, spec.thumbnail)[0], *window) for a in (before, here, after)]
    assert seen[0].shape == (1, 3, 256, 256)
    for k in range(3):
        np.testing.assert_array_equal(seen[0][0, k], want[k])
        np.testing.assert_array_equal(seen[1][0, k], want[1])
    # A bright spot on the feet-side neighbour only reaches this classifier through it.
    after[100:110, 100:110] = 5000.0
    res = classify(model_b, here, window, neighbours=(before, after), heatmap_threshold=0.99)
    assert res.proposals and res.proposals[0].bbox[0] <= 100 < res.proposals[0].bbox[2]


def test_a_fixed_window_classifier_is_fed_its_own_window(tmp_path: Path) -> None:
    """``fixed_window`` reaches the classifier's thumbnail and its INT8 calibration
    inputs: the spec's window, not the frame's VOI window."""
    from medrt.analysis.roi import classify
    from medrt.engine.backends.onnxrt import OnnxRuntimeBackend
    from medrt.engine.calibration import calibration_inputs
    from medrt.preprocess import normalize, thumbnail

    model = roi_onnx(tmp_path / "roi.onnx")
    spec_path = tmp_path / "roi.toml"
    spec_path.write_text(ROI_SPEC.format(sha=sha256_file(model), heatmap=HEATMAP)
                         + '\n[normalization]\nmethod = "fixed_window"\ncenter = 0\nwidth = 4000\n')
    spec = load_spec(spec_path)
    assert spec.own_window == (0.0, 4000.0) and spec.input_window((40.0, 400.0)) == (0.0, 4000.0)
    seen: list[np.ndarray] = []

    class Recording(OnnxRuntimeBackend):
        def infer(self, x: np.ndarray) -> Any:  # type: ignore[override]
            seen.append(x.copy())
            return super().infer(x)

    pixels = np.random.default_rng(5).normal(40, 300, (512, 512)).astype(np.float32)
    classify(Recording(spec), pixels, (40.0, 400.0))
    np.testing.assert_array_equal(seen[0][0, 0], normalize(thumbnail(pixels, 256)[0], 0.0, 4000.0))
    # CT HU lie within -2000..2000: nothing clips, where the slices' own soft-tissue window
    # clips air, lung and bone (the first half of the inputs are CT).
    ct = calibration_inputs(spec, n=4)[:2]
    assert len(ct) == 2 and all(0.0 < float(x.min()) and float(x.max()) < 1.0 for x in ct)


def test_a_classifier_with_probability_outputs_in_any_order_is_read_by_name(tmp_path: Path) -> None:
    """``activation = "none"``: the outputs are probabilities already, and are not put
    through a sigmoid again; outputs are found by name, whatever their order in the spec."""
    from medrt.analysis.roi import classify
    from medrt.engine.backends.onnxrt import OnnxRuntimeBackend

    model = roi_onnx(tmp_path / "roi.onnx")  # heatmap = 4x4 mean of the thumbnail, presence = its max
    spec_path = tmp_path / "roi.toml"
    spec_path.write_text(ROI_SPEC.format(sha=sha256_file(model), heatmap="")
                         .replace('[[outputs]]\nname = "presence"', HEATMAP.strip() + '\n\n[[outputs]]\nname = "presence"', 1)
                         .replace('activation = "sigmoid"', 'activation = "none"'))
    spec = load_spec(spec_path)
    assert [o.name for o in spec.outputs] == ["heatmap", "presence"]
    assert {o.activation for o in spec.outputs} == {"none"}
    pixels = np.zeros((512, 512), np.float32)
    pixels[200:232, 300:332] = 1000.0  # white in the window below; the rest black
    res = classify(OnnxRuntimeBackend(spec), pixels, (500.0, 1000.0), heatmap_threshold=0.9, presence_threshold=0.9)
    assert res.presence == pytest.approx(1.0)
    (prop,) = res.proposals  # with a sigmoid on top, every cell would be >= 0.5
    assert prop.bbox[0] <= 200 and prop.bbox[2] >= 232 and prop.bbox[1] <= 300 and prop.bbox[3] >= 332
    blank = classify(OnnxRuntimeBackend(spec), np.zeros((512, 512), np.float32), (500.0, 1000.0),
                     heatmap_threshold=0.4, presence_threshold=0.4)
    assert blank.negative and blank.presence == pytest.approx(0.0)


@pytest.mark.parametrize("image, out, message", [
    (["N", 1, 256, 256], ["N", 1, 256, 256], r"input of seg.onnx is fixed at 256x256; .* needs dynamic H and W"),
    (["N", 1, "H", "W"], ["N", 2, "H", "W"], r"output 'foreground' of seg.onnx has 2 channels; .* \[N, 1, H, W\]"),
])
def test_a_segmenter_medrt_cannot_feed_or_read_is_refused_at_load(tmp_path: Path, image, out, message) -> None:  # type: ignore[no-untyped-def]
    """Both passed the spec checks and batch ran them: a fixed 256x256 input crashed every
    run with onnxruntime's traceback, a two-channel output had its background channel read
    as a 549 mm lesion on every slice."""
    from medrt.engine.backends.onnxrt import OnnxRuntimeBackend

    onnx = require_module("onnx")
    h, F = onnx.helper, onnx.TensorProto.FLOAT
    node = (h.make_node("Identity", ["image"], ["foreground"]) if out[1] == 1 else
            h.make_node("Concat", ["image", "image"], ["foreground"], axis=1))
    model = _save([node], [h.make_tensor_value_info("image", F, image)],
                  [h.make_tensor_value_info("foreground", F, out)], tmp_path / "seg.onnx")
    spec_path = tmp_path / "tiny_seg.toml"
    spec_path.write_text(SEG_SPEC.format(file=model.name, sha=sha256_file(model), out="foreground"))
    with pytest.raises(ModelError, match=message):
        OnnxRuntimeBackend(load_spec(spec_path))


def test_verify_takes_a_shipped_models_name() -> None:
    out = medrt("models", "verify", "lesion_unet_lite", "no_such_model")
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"OK    {shipped_models_dir() / 'lesion_unet_lite.toml'}  (lesion_unet_lite@" in out.stdout
    assert "FAIL  no_such_model\n      no shipped model named 'no_such_model' (shipped: " in out.stdout
    assert "2 spec(s): 1 ok, 1 failed" in out.stdout


def test_model_sizes_read_the_same_in_list_verify_and_checks(capsys) -> None:  # type: ignore[no-untyped-def]
    """One unit everywhere: MiB (2**20 bytes), KiB below 0.1 MiB, as the other commands print sizes."""
    from medrt.cli import main

    folder = shipped_models_dir()
    big, small = (folder / "lesion_unet_dx.onnx").stat().st_size, (folder / "roi_classifier.onnx").stat().st_size
    assert big >= 2**20 and small < 2**20 // 10  # one of each unit
    big_text, small_text = f"{big / 2**20:.1f} MiB", f"{small / 2**10:.1f} KiB"
    assert main(["models", "list"]) == 0
    listed = capsys.readouterr().out
    assert main(["models", "verify", "lesion_unet_dx", "roi_classifier"]) == 0
    verified = capsys.readouterr().out
    assert main(["checks", "--model", "lesion_unet_dx,roi_classifier"]) == 0
    checked = "\n".join(line for line in capsys.readouterr().out.splitlines() if "sha256 matches" in line)
    for text in (listed, verified, checked):
        assert big_text in text and small_text in text, text
        assert " MB" not in text and " kB" not in text, text
