"""``medrt models import-bundle``: real MONAI bundles, built here, converted and run with onnxruntime."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import REPO, require_module
from medrt.bundle import BundleTrustError, import_bundle
from medrt.engine.registry import ModelError, load_spec


def medrt(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "medrt", *args], cwd=REPO, capture_output=True, text=True, timeout=300
    )


def make_bundle(
    root: Path,
    *,
    torchscript: bool = False,
    out_channels: int = 2,
    spatial_dims: int = 2,
    spatial_dims_in_metadata: bool = True,
    b_range: tuple[float, float] = (0.0, 1.0),
    window: tuple[float, float] | None = (-100.0, 300.0),
    before_window: tuple[dict[str, Any], ...] = (),
    after_window: tuple[dict[str, Any], ...] = (),
    channel_def: dict[str, str] | None = None,
    num_channels_in_metadata: bool = True,
) -> Any:
    """Write a tiny MONAI UNet bundle to ``root`` and return the network (eval mode).

    Its preprocessing loads the image, then ``before_window``, a ``ScaleIntensityRanged``
    from ``window`` to ``b_range`` (none when ``window`` is None), then ``after_window``."""
    torch = require_module("torch")
    nets = require_module("monai.networks.nets")
    torch.manual_seed(0)
    arch = {"spatial_dims": spatial_dims, "in_channels": 1, "out_channels": out_channels, "channels": [4, 8], "strides": [2]}
    net = nets.UNet(**arch).eval()
    (root / "configs").mkdir(parents=True)
    (root / "models").mkdir()
    if torchscript:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.jit's deprecation and tracer notes
            traced = torch.jit.trace(net, torch.rand(1, 1, *([16] * spatial_dims)))
            torch.jit.save(traced, str(root / "models" / "model.ts"))
    else:
        torch.save(net.state_dict(), root / "models" / "model.pt")
    if channel_def is None:
        channel_def = {"0": "background", "1": "lesion"} if out_channels > 1 else {"0": "lesion"}
    pred: dict[str, Any] = {"type": "image", "num_channels": out_channels, "channel_def": channel_def}
    if not num_channels_in_metadata:
        del pred["num_channels"]
    image: dict[str, Any] = {"type": "image", "num_channels": 1, "dtype": "float32", "value_range": [0, 1]}
    if spatial_dims_in_metadata:
        image["spatial_shape"] = [64] * spatial_dims
    metadata = {
        "name": "Tiny Lesion Seg",
        "version": "0.3.1",
        "description": "A tiny test bundle.",
        "network_data_format": {
            "inputs": {"image": image},
            "outputs": {"pred": pred},
        },
    }
    scaler = [] if window is None else [{
        "_target_": "ScaleIntensityRanged", "keys": "image", "a_min": window[0], "a_max": window[1],
        "b_min": b_range[0], "b_max": b_range[1], "clip": True,
    }]
    inference = {
        "bundle_root": ".",
        "dims": spatial_dims,
        "network_def": {"_target_": "UNet", **arch, "spatial_dims": "@dims"},
        "preprocessing": {
            "_target_": "Compose",
            "transforms": [{"_target_": "LoadImaged", "keys": "image"}, *before_window, *scaler, *after_window],
        },
    }  # fmt: skip
    (root / "configs" / "metadata.json").write_text(json.dumps(metadata, indent=2))
    (root / "configs" / "inference.json").write_text(json.dumps(inference, indent=2))
    return net


def run_onnx(path: Path, x: np.ndarray) -> np.ndarray:
    ort = require_module("onnxruntime")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(["foreground"], {"image": x})[0]


def lesion_probability(net: Any, x: np.ndarray) -> np.ndarray:
    torch = require_module("torch")
    with torch.no_grad():
        return torch.softmax(net(torch.from_numpy(x)), dim=1)[:, 1:2].numpy()


def test_state_dict_bundle_becomes_a_matching_onnx_model(tmp_path: Path) -> None:
    net = make_bundle(tmp_path / "bundle")
    spec = import_bundle(tmp_path / "bundle", tmp_path / "out", trust=True)
    assert spec == load_spec(tmp_path / "out" / "tiny_lesion_seg.toml")
    assert spec.path == (tmp_path / "out" / "tiny_lesion_seg.onnx").resolve()
    assert (spec.name, spec.version, spec.task, spec.multiple_of) == ("tiny_lesion_seg", "0.3.1", "segmentation", 2)
    assert (spec.normalization, spec.window) == ("fixed_window", (100.0, 400.0))
    assert spec.output("foreground").activation == "none" and "'lesion'" in spec.outputs[0].meaning
    assert spec.thresholds == {"probability": 0.5}
    assert spec.training["source"] == "MONAI bundle Tiny Lesion Seg 0.3.1"
    assert not list((tmp_path / "out").glob(".*")), "no temporary file left behind"

    x = np.random.default_rng(1).random((2, 1, 40, 58), dtype=np.float32)  # not the export size
    got = run_onnx(spec.path, x)
    assert got.shape == (2, 1, 40, 58)
    np.testing.assert_allclose(got, lesion_probability(net, x), atol=1e-4)


def test_an_imported_bundle_gives_its_own_probabilities_through_the_analysis(tmp_path: Path) -> None:
    """End to end: medrt's analysis feeds the imported model what the bundle's
    preprocessing would (its ScaleIntensityRange window, not the frame's VOI window) and
    reads its softmax channel as the probability it is (``activation = "none"``), so
    the probability map medrt thresholds is the bundle's own."""
    from dataclasses import replace

    from medrt.analyzer import AnalyzerConfig, load_analyzer
    from medrt.phantom import generate_ct_series
    from medrt.types import Window

    torch = require_module("torch")
    net = make_bundle(tmp_path / "bundle")
    spec = import_bundle(tmp_path / "bundle", tmp_path / "out", trust=True)
    analyzer = load_analyzer(AnalyzerConfig(seg_model=str(spec.spec_path), mode="full", recheck=False,
                                            warmup_shapes=((128, 128),)))
    ct = generate_ct_series(4242, n_frames=1, size=128)[0]
    frame = replace(ct.as_frame("bundle0"), window=Window(-600.0, 1500.0), spacing_mm=None)
    prob = analyzer.segment(analyzer.prepare(frame)).prob
    x = np.clip((frame.pixels - -100.0) / 400.0, 0.0, 1.0).astype(np.float32)  # the bundle's a_min/a_max
    with torch.no_grad():
        want = torch.softmax(net(torch.from_numpy(x)[None, None]), dim=1)[0, 1].numpy()
    assert prob is not None and prob.shape == want.shape
    np.testing.assert_allclose(prob, np.where(want >= 0.01, want, prob), atol=2e-3)  # below 0.01: floored
    assert float(np.abs(prob - want).max()) < 0.02


def test_torchscript_bundle_through_the_cli(tmp_path: Path) -> None:
    net = make_bundle(tmp_path / "bundle", torchscript=True)
    out = medrt("models", "import-bundle", str(tmp_path / "bundle"), "--out", str(tmp_path / "out"), "--name", "mine", "--trust")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "as trusted" in out.stderr and "wrote" in out.stdout
    spec = load_spec(tmp_path / "out" / "mine.toml")
    assert spec.training["network_from"] == "models/model.ts"
    x = np.random.default_rng(2).random((1, 1, 64, 32), dtype=np.float32)
    np.testing.assert_allclose(run_onnx(spec.path, x), lesion_probability(net, x), atol=1e-4)

    verified = medrt("models", "verify", str(tmp_path / "out" / "mine.toml"))
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_single_channel_bundle_exports_the_logit_and_bakes_the_rescale(tmp_path: Path) -> None:
    torch = require_module("torch")
    net = make_bundle(tmp_path / "bundle", out_channels=1, b_range=(-1.0, 1.0))
    spec = import_bundle(tmp_path / "bundle", tmp_path / "out", trust=True)
    assert spec.outputs[0].activation == "sigmoid"
    assert spec.training["input_rescale"] == "x * 2 + -1 baked into the graph"
    x = np.random.default_rng(3).random((1, 1, 32, 48), dtype=np.float32)
    with torch.no_grad():
        expected = net(torch.from_numpy(x) * 2.0 - 1.0).numpy()  # what the bundle's b_min/b_max give
    np.testing.assert_allclose(run_onnx(spec.path, x), expected, atol=1e-4)


def test_refused_without_trust(tmp_path: Path) -> None:
    make_bundle(tmp_path / "bundle")
    with pytest.raises(BundleTrustError, match="refusing to import without --trust") as info:
        import_bundle(tmp_path / "bundle", tmp_path / "out")
    assert "imports and calls UNet" in str(info.value) and "model.pt" in str(info.value)
    assert not (tmp_path / "out").exists()

    make_bundle(tmp_path / "ts", torchscript=True)
    with pytest.raises(BundleTrustError, match="TorchScript program .*model.ts"):
        import_bundle(tmp_path / "ts", tmp_path / "out")

    out = medrt("models", "import-bundle", str(tmp_path / "bundle"), "--out", str(tmp_path / "out"))
    assert out.returncode == 2
    assert "refusing to import without --trust" in out.stderr and "trust" in out.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("in_metadata", [True, False], ids=["metadata-says-3d", "network-shows-3d"])
def test_3d_bundle_is_refused(tmp_path: Path, in_metadata: bool) -> None:
    make_bundle(tmp_path / "bundle", spatial_dims=3, spatial_dims_in_metadata=in_metadata)
    with pytest.raises(ModelError, match="only 2-D networks are supported"):
        import_bundle(tmp_path / "bundle", tmp_path / "out", trust=True)
    assert not (tmp_path / "out").exists()


def test_missing_or_broken_metadata_names_the_file(tmp_path: Path) -> None:
    make_bundle(tmp_path / "bundle")
    meta = tmp_path / "bundle" / "configs" / "metadata.json"
    meta.write_text("{ not json")
    with pytest.raises(ModelError, match="metadata.json: not valid JSON"):
        import_bundle(tmp_path / "bundle", tmp_path / "out", trust=True)
    meta.unlink()
    with pytest.raises(ModelError, match=r"configs/metadata\.json: missing") as info:
        import_bundle(tmp_path / "bundle", tmp_path / "out", trust=True)
    assert str(meta) in str(info.value)
    with pytest.raises(ModelError, match="not a folder"):
        import_bundle(tmp_path / "nowhere", tmp_path / "out", trust=True)


def test_a_pickled_module_in_model_pt_is_not_unpickled(tmp_path: Path) -> None:
    torch = require_module("torch")
    net = make_bundle(tmp_path / "bundle")
    torch.save(net, tmp_path / "bundle" / "models" / "model.pt")  # a whole pickled object
    with pytest.raises(ModelError, match="not a plain state dict that loads with weights_only=True"):
        import_bundle(tmp_path / "bundle", tmp_path / "out", trust=True)


def test_importing_the_command_pulls_in_no_torch(tmp_path: Path) -> None:
    code = (
        "import argparse, sys, medrt.bundle, medrt.commands.models\n"
        "medrt.commands.models.register(argparse.ArgumentParser().add_subparsers())\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'monai', 'onnx', 'onnxruntime'))\n"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


def test_without_torch_the_error_says_what_to_install(tmp_path: Path) -> None:
    make_bundle(tmp_path / "bundle")
    code = (
        "import sys\n"
        "sys.modules['torch'] = None  # as if torch were not installed\n"
        "from medrt.bundle import import_bundle\n"
        "from medrt.engine.registry import ModelError\n"
        "try:\n"
        f"    import_bundle({str(tmp_path / 'bundle')!r}, {str(tmp_path / 'out')!r}, trust=True)\n"
        "except ModelError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "pip install 'medrt[train]'" in out.stdout, out.stdout + out.stderr


def _zscore(subtrahend: Any = None, divisor: Any = None, **more: Any) -> dict[str, Any]:
    literal = {k: v for k, v in (("subtrahend", subtrahend), ("divisor", divisor)) if v is not None}
    return {"_target_": "NormalizeIntensityd", "keys": "image", **literal, **more}


def _monai_preprocessing(bundle: Path, hu: np.ndarray) -> Any:
    """The bundle's own preprocessing (after LoadImaged), run by MONAI on one image."""
    transforms = require_module("monai.transforms")
    steps = json.loads((bundle / "configs" / "inference.json").read_text())["preprocessing"]["transforms"][1:]
    data = {"image": require_module("torch").from_numpy(hu[None])}
    for step in steps:
        data = getattr(transforms, step["_target_"])(**{k: v for k, v in step.items() if k != "_target_"})(data)
    return data["image"]


@pytest.mark.parametrize(
    "bundle_kw",
    [
        {"after_window": (_zscore([0.25], [0.5], channel_wise=True),)},  # the window's [0, 1], fixed statistics
        {"before_window": (_zscore(100, 200),), "window": (-1.0, 1.0)},  # HU z-scored, then a window on that
    ],
    ids=["after-the-window", "before-the-window"],
)
def test_a_zscore_by_fixed_statistics_is_reproduced_as_monai_runs_it(tmp_path: Path, bundle_kw: dict) -> None:
    """What MONAI's own transforms feed the network is what medrt's window plus the graph feed it."""
    torch = require_module("torch")
    from medrt.preprocess import normalize

    net = make_bundle(tmp_path / "bundle", **bundle_kw)
    spec = import_bundle(tmp_path / "bundle", tmp_path / "out", trust=True)
    assert (spec.normalization, spec.window) == ("fixed_window", (100.0, 400.0))  # -100..300 HU both ways
    assert "notes" not in spec.training
    hu = np.random.default_rng(4).uniform(-400, 600, (40, 58)).astype(np.float32)
    with torch.no_grad():
        want = torch.softmax(net(_monai_preprocessing(tmp_path / "bundle", hu)[None]), dim=1)[:, 1:2].numpy()
    got = run_onnx(spec.path, normalize(hu, *spec.window)[None, None])
    np.testing.assert_allclose(got, want, atol=1e-4)


@pytest.mark.parametrize(
    "bundle_kw, message",
    [
        ({"after_window": (_zscore(),)}, r"NormalizeIntensityd \(subtrahend None, divisor None\) z-scores each "
                                         r"image by its own mean and standard deviation"),
        ({"after_window": (_zscore(0.25, 0.5, nonzero=True),)}, "NormalizeIntensityd .* nonzero=True leaves zero"),
        ({"window": None, "before_window": (_zscore(100, 200),)}, r"NormalizeIntensity \(x - 100\) / 200 .* no "
                                                                  "ScaleIntensityRange window"),
    ],
    ids=["per-image-statistics", "nonzero", "no-window"],
)
def test_a_zscore_medrt_cannot_reproduce_is_refused_before_any_bundle_code_runs(
    tmp_path: Path, bundle_kw: dict, message: str
) -> None:
    make_bundle(tmp_path / "bundle", **bundle_kw)
    with pytest.raises(ModelError, match=message) as info:
        import_bundle(tmp_path / "bundle", tmp_path / "out")  # without trust: read as JSON only
    assert not isinstance(info.value, BundleTrustError)
    assert "Refusing the import" in str(info.value) or "refusing the import" in str(info.value)
    assert not (tmp_path / "out").exists()


def test_a_per_image_zscore_is_refused_by_the_cli(tmp_path: Path) -> None:
    make_bundle(tmp_path / "bundle", after_window=(_zscore(),))
    out = medrt("models", "import-bundle", str(tmp_path / "bundle"), "--out", str(tmp_path / "out"), "--trust")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "NormalizeIntensityd" in out.stderr and "own mean and standard deviation" in out.stderr
    assert not (tmp_path / "out").exists()


def test_steps_not_reproduced_are_named_in_warnings_and_spacing_becomes_spacing_mm(tmp_path: Path) -> None:
    spacing = {"_target_": "Spacingd", "keys": "image", "pixdim": [0.8, 0.8], "mode": "bilinear"}
    orientation = {"_target_": "Orientationd", "keys": "image", "axcodes": "RA"}
    make_bundle(tmp_path / "bundle", before_window=(spacing, orientation),
                after_window=({"_target_": "EnsureTyped", "keys": "image"},))  # fmt: skip
    out = medrt("models", "import-bundle", str(tmp_path / "bundle"), "--out", str(tmp_path / "out"), "--trust")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "WARNING: Spacingd resamples every image to 0.8 mm pixels; medrt reproduces it only in part" in out.stdout
    assert "WARNING: bundle preprocessing Orientationd is not reproduced" in out.stdout
    assert "EnsureTyped" not in out.stdout  # what medrt's input already is goes unmentioned
    spec = load_spec(tmp_path / "out" / "tiny_lesion_seg.toml")
    assert spec.spacing_mm == 0.8 and len(spec.training["notes"]) == 2

    spacing["pixdim"] = [0.8, 1.2]  # anisotropic: no one spacing_mm stands for it
    make_bundle(tmp_path / "aniso", before_window=(spacing,))
    spec = import_bundle(tmp_path / "aniso", tmp_path / "out2", trust=True)
    assert spec.spacing_mm is None
    assert spec.training["notes"] == [
        "Spacingd pixdim [0.8, 1.2] is not reproduced: medrt runs each frame at its own pixel spacing, "
        "not resampled as the bundle does"
    ]


def test_a_channel_def_that_does_not_fit_num_channels_is_refused_before_any_bundle_code_runs(tmp_path: Path) -> None:
    three = {"0": "background", "1": "liver", "2": "lesion"}
    make_bundle(tmp_path / "bundle", channel_def=three)  # metadata num_channels 2, as the network
    with pytest.raises(ModelError, match=r"channel_def names 3 channel\(s\) \(0: 'background', 1: 'liver', "
                                         r"2: 'lesion'\), but its num_channels says 2 output") as info:
        import_bundle(tmp_path / "bundle", tmp_path / "out")
    assert not isinstance(info.value, BundleTrustError) and "metadata.json" in str(info.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "out_channels, channel_def",
    [(2, {"0": "background", "1": "liver", "2": "lesion"}), (1, {"0": "background", "1": "lesion"})],
    ids=["three-names-two-channels", "two-names-one-channel"],
)
def test_a_channel_def_that_does_not_fit_the_network_is_refused(
    tmp_path: Path, out_channels: int, channel_def: dict[str, str]
) -> None:
    make_bundle(tmp_path / "bundle", out_channels=out_channels, channel_def=channel_def,
                num_channels_in_metadata=False)  # fmt: skip
    with pytest.raises(ModelError, match=f"but the network gives {out_channels} output channel"):
        import_bundle(tmp_path / "bundle", tmp_path / "out", trust=True)
    assert not (tmp_path / "out").exists()


def test_a_channel_def_keyed_by_name_is_refused(tmp_path: Path) -> None:
    make_bundle(tmp_path / "bundle", channel_def={"background": "0", "lesion": "1"})
    with pytest.raises(ModelError, match=r"metadata\.json: outputs channel_def must map channel indices"):
        import_bundle(tmp_path / "bundle", tmp_path / "out", trust=True)


def test_an_existing_model_is_replaced_only_with_force(tmp_path: Path) -> None:
    make_bundle(tmp_path / "bundle")
    out_dir = tmp_path / "out"
    first = import_bundle(tmp_path / "bundle", out_dir, trust=True)
    before = {p.name: p.read_bytes() for p in out_dir.iterdir()}
    meta = tmp_path / "bundle" / "configs" / "metadata.json"
    meta.write_text(meta.read_text().replace('"0.3.1"', '"0.4.0"'))

    refused = medrt("models", "import-bundle", str(tmp_path / "bundle"), "--out", str(out_dir), "--trust")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"{first.spec_path.parent / 'tiny_lesion_seg.toml'}" in refused.stderr
    assert "already exist" in refused.stderr and "--force" in refused.stderr
    assert {p.name: p.read_bytes() for p in out_dir.iterdir()} == before  # nothing touched

    (out_dir / "tiny_lesion_seg.toml").unlink()  # a model file alone is also an existing model
    with pytest.raises(ModelError, match=r"tiny_lesion_seg\.onnx already exists: refusing to replace"):
        import_bundle(tmp_path / "bundle", out_dir, trust=True)

    forced = medrt("models", "import-bundle", str(tmp_path / "bundle"), "--out", str(out_dir), "--trust", "--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert load_spec(out_dir / "tiny_lesion_seg.toml").version == "0.4.0"
    assert sorted(p.name for p in out_dir.iterdir()) == ["tiny_lesion_seg.onnx", "tiny_lesion_seg.toml"]
