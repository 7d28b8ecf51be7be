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
) -> Any:
    """Write a tiny MONAI UNet bundle to ``root`` and return the network (eval mode)."""
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
    channel_def = {"0": "background", "1": "lesion"} if out_channels > 1 else {"0": "lesion"}
    image: dict[str, Any] = {"type": "image", "num_channels": 1, "dtype": "float32", "value_range": [0, 1]}
    if spatial_dims_in_metadata:
        image["spatial_shape"] = [64] * spatial_dims
    metadata = {
        "name": "Tiny Lesion Seg",
        "version": "0.3.1",
        "description": "A tiny test bundle.",
        "network_data_format": {
            "inputs": {"image": image},
            "outputs": {"pred": {"type": "image", "num_channels": out_channels, "channel_def": channel_def}},
        },
    }
    inference = {
        "bundle_root": ".",
        "dims": spatial_dims,
        "network_def": {"_target_": "UNet", **arch, "spatial_dims": "@dims"},
        "preprocessing": {
            "_target_": "Compose",
            "transforms": [
                {"_target_": "LoadImaged", "keys": "image"},
                {
                    "_target_": "ScaleIntensityRanged", "keys": "image", "a_min": -100, "a_max": 300,
                    "b_min": b_range[0], "b_max": b_range[1], "clip": True,
                },
            ],
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
