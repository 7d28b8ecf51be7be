"""The shipped models: specs, integrity, ONNX against torch, and that they really work."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, require_module
from medrt.engine.backends.onnxrt import OnnxRuntimeBackend
from medrt.engine.registry import ModelIntegrityError, load_spec, shipped_specs

SHIPPED = ("roi_classifier", "lesion_unet", "lesion_unet_lite")
MODELS = REPO / "models"


def test_every_shipped_model_has_spec_card_and_matching_hash() -> None:
    specs = {s.name: s for s in shipped_specs()}  # verifies every sha256
    assert set(SHIPPED) <= set(specs)
    for name in SHIPPED:
        spec = specs[name]
        assert spec.card is not None and spec.card.is_file(), f"{name} has no model card"
        card = spec.card.read_text()
        assert "not for clinical use" in card.lower()
        assert "sensitivity" in card.lower() and "ms" in card
        assert spec.training.get("seconds", 0) > 0, "the spec records the measured training time"


def test_tampered_model_is_refused(tmp_path: Path) -> None:
    for name in ("lesion_unet_lite",):
        shutil.copy(MODELS / f"{name}.toml", tmp_path)
        shutil.copy(MODELS / f"{name}.onnx", tmp_path)
        load_spec(tmp_path / f"{name}.toml")
        with open(tmp_path / f"{name}.onnx", "ab") as fp:
            fp.write(b"\0")
        with pytest.raises(ModelIntegrityError, match=f"{name}.onnx"):
            load_spec(tmp_path / f"{name}.toml")


@pytest.mark.parametrize("name", SHIPPED)
def test_onnx_matches_torch(name: str) -> None:
    torch = require_module("torch")
    require_module("monai")
    from medrt.models.networks import RoiNet, build_unet

    net = RoiNet() if name == "roi_classifier" else build_unet(name)
    net.load_state_dict(torch.load(MODELS / f"{name}.pt", map_location="cpu", weights_only=True))
    net.eval()
    backend = OnnxRuntimeBackend(load_spec(MODELS / f"{name}.toml"))
    rng = np.random.default_rng(0)
    for shape in ((1, 1, 256, 256), (1, 1, 512, 384)):
        x = rng.random(shape, dtype=np.float32)
        with torch.no_grad():
            ref = net(torch.from_numpy(x))
        ref = ref if isinstance(ref, tuple) else (ref,)
        got = backend.infer(x)
        for a, b in zip(ref, got, strict=True):
            np.testing.assert_allclose(b, a.numpy(), atol=2e-3, rtol=1e-3)


def _near(les: object, t: object, spacing: float) -> bool:
    d = np.hypot(les.centroid[0] - t.center[0], les.centroid[1] - t.center[1]) * spacing  # type: ignore[attr-defined]
    return d <= max(2.0, t.diameter_mm / 2)  # type: ignore[attr-defined]


def test_lite_unet_finds_ct_lesions_on_a_held_out_series() -> None:
    """A model that was never trained fails this: clear CT lesions are found where the
    truth says, and lesion-free slices stay mostly clean."""
    from medrt.analysis.lesions import lesions_from_probability
    from medrt.analysis.segment import segment_crops
    from medrt.phantom import generate_ct_series
    from medrt.preprocess import normalize

    unet = OnnxRuntimeBackend(load_spec(MODELS / "lesion_unet_lite.toml"))
    frames = generate_ct_series(9901, n_frames=40)
    clear = [(f, t) for f in frames for t in f.lesions if t.diameter_mm >= 8 and abs(t.contrast) >= 40]
    blank = [f for f in frames if not f.lesions]
    assert len(clear) >= 4 and len(blank) >= 8
    found = 0
    for f, t in clear:
        prob = segment_crops(unet, normalize(f.pixels, *f.window), [(0, 0, f.shape[0], f.shape[1])])
        _, lesions = lesions_from_probability(prob, f.spacing_mm, 0.5)
        found += any(_near(les, t, f.spacing_mm[0]) for les in lesions)
    assert found >= 0.7 * len(clear), f"{found} of {len(clear)}"
    false = 0
    for f in blank[:8]:
        prob = segment_crops(unet, normalize(f.pixels, *f.window), [(0, 0, f.shape[0], f.shape[1])])
        false += len(lesions_from_probability(prob, f.spacing_mm, 0.5)[1])
    assert false <= 8, f"{false} false positives on 8 lesion-free slices"


def test_planned_crops_cover_every_proposal() -> None:
    from medrt.analysis.roi import plan_crops
    from medrt.types import RoiProposal

    shape = (4096, 4096)
    props = [RoiProposal((0, 0, 60, 60), 0.9), RoiProposal((4030, 4000, 4096, 4096), 0.8),  # far apart, at borders
             RoiProposal((100, 100, 300, 400), 0.7), RoiProposal((2000, 500, 3600, 900), 0.6)]  # the last > 1024 tall
    crops = plan_crops(props, shape)
    for p in props:
        r0, c0, r1, c1 = p.bbox
        for r in range(r0, r1, 16):
            for c in range(c0, c1, 16):
                assert any(cr[0] <= r < cr[2] and cr[1] <= c < cr[3] for cr in crops), (p, r, c)
    assert all(cr[2] - cr[0] == 1024 and cr[3] - cr[1] == 1024 for cr in crops)
    assert all(0 <= cr[0] and cr[2] <= 4096 and 0 <= cr[1] and cr[3] <= 4096 for cr in crops)
    assert len([c for c in crops if c[0] < 1024 and c[1] < 1024]) == 1, "near proposals share one crop"
    assert plan_crops(props, (512, 512)) == ((0, 0, 512, 512),)
    spread = [RoiProposal((r, c, r + 10, c + 10), 0.5) for r in (0, 1500, 3000) for c in (0, 1500, 3000)]
    spread.append(RoiProposal((4000, 700, 4010, 710), 0.5))
    assert len(plan_crops(spread, shape)) == 16, "more groups than max_crops: the frame is tiled"


def test_roi_classifier_runs_on_a_radiograph_thumbnail() -> None:
    from medrt.analysis.roi import classify
    from medrt.phantom import generate_radiograph

    roi = OnnxRuntimeBackend(load_spec(MODELS / "roi_classifier.toml"))
    f = generate_radiograph(9903, size=4096, index=0, n_lesions=2)
    res = classify(roi, f.pixels, f.window)
    assert 0.0 <= res.presence <= 1.0
    for r0, c0, r1, c1 in res.crops:
        assert (r1 - r0, c1 - c0) == (1024, 1024) and 0 <= r0 and r1 <= 4096 and 0 <= c0 and c1 <= 4096


def test_training_smoke(tmp_path: Path) -> None:
    """A few steps of the real training script, end to end: data, loop, ONNX, spec."""
    require_module("torch")
    require_module("monai")
    out = subprocess.run(
        [sys.executable, "-m", "medrt.models.train", "lesion_unet_lite", "--steps", "3", "--batch", "2",
         "--n-dx", "1", "--n-ct", "1", "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    spec = load_spec(tmp_path / "out" / "lesion_unet_lite.toml")
    assert spec.training["seconds"] > 0
    y = OnnxRuntimeBackend(spec).infer(np.zeros((1, 1, 64, 64), np.float32))[0]
    assert y.shape == (1, 1, 64, 64)
