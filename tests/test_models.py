"""The shipped models: specs, integrity, ONNX against torch, and that they really work."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, require_module
from medrt.engine.backends.onnxrt import OnnxRuntimeBackend
from medrt.engine.registry import ModelIntegrityError, load_spec, shipped_specs

SHIPPED = ("roi_classifier", "roi_classifier_dx", "lesion_unet", "lesion_unet_dx", "lesion_unet_lite")
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
    from medrt.models.networks import network_for

    net = network_for(name, torch.load(MODELS / f"{name}.pt", map_location="cpu", weights_only=True))
    backend = OnnxRuntimeBackend(load_spec(MODELS / f"{name}.toml"))
    rng = np.random.default_rng(0)
    c = backend.spec.slices  # a 2.5-D UNet takes three slices
    for shape in ((1, c, 256, 256), (1, c, 512, 384)):
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
    from medrt.analysis.slices import phantom_input
    from medrt.phantom import generate_ct_series

    unet = OnnxRuntimeBackend(load_spec(MODELS / "lesion_unet_lite.toml"))
    frames = generate_ct_series(9901, n_frames=40)
    clear = [(f, t) for f in frames for t in f.lesions if t.diameter_mm >= 8 and abs(t.contrast) >= 40]
    blank = [f for f in frames if not f.lesions]
    assert len(clear) >= 4 and len(blank) >= 8
    found = 0
    for f, t in clear:
        x = phantom_input(f, frames, unet.spec.slices, unet.spec.own_window)  # with its neighbours, in its window
        prob = segment_crops(unet, x, [(0, 0, f.shape[0], f.shape[1])])
        _, lesions = lesions_from_probability(prob, f.spacing_mm, 0.5)
        found += any(_near(les, t, f.spacing_mm[0]) for les in lesions)
    assert found >= 0.7 * len(clear), f"{found} of {len(clear)}"
    false = 0
    for f in blank[:8]:
        x = phantom_input(f, frames, unet.spec.slices, unet.spec.own_window)
        prob = segment_crops(unet, x, [(0, 0, f.shape[0], f.shape[1])])
        # at the model's own operating point, lesions from 1.5 mm, as the analyzer reports them
        false += len(lesions_from_probability(prob, f.spacing_mm, unet.spec.thresholds["probability"],
                                              min_diameter_mm=1.5)[1])
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


def test_radiograph_classifier_covers_nodules_the_ct_one_misses() -> None:
    """roi_classifier_dx (radiographs only) on held-out radiographs: its crops cover
    most nodules without tiling the frame; the CT classifier's do not (which is why its
    spec lists CT only).
    An untrained classifier fails this (no hot cells, or hot cells everywhere)."""
    from medrt.analysis.roi import classify
    from medrt.phantom import generate_radiograph
    from medrt.phantom.truth import FrameTruth

    dx = OnnxRuntimeBackend(load_spec(MODELS / "roi_classifier_dx.toml"))
    general = OnnxRuntimeBackend(load_spec(MODELS / "roi_classifier.toml"))
    assert dx.spec.modalities == ("DX", "CR") and general.spec.modalities == ("CT",)
    covered = {"dx": 0, "general": 0}
    lesions, crops = 0, []
    for i in range(4):
        f = generate_radiograph(9903, size=4096, index=i, n_lesions=3)
        scored = FrameTruth.from_phantom(f, f"dx{i}").scored_lesions
        lesions += len(scored)
        for name, model in (("dx", dx), ("general", general)):
            res = classify(model, f.pixels, f.window)
            covered[name] += sum(any(les.bbox[0] >= c[0] and les.bbox[1] >= c[1] and les.bbox[2] <= c[2]
                                     and les.bbox[3] <= c[3] for c in res.crops) for les in scored)
            if name == "dx":
                crops.append(len(res.crops))
    assert lesions >= 8
    assert covered["dx"] >= 0.5 * lesions and covered["dx"] > covered["general"], (covered, lesions)
    assert np.mean(crops) < 12, crops  # it proposes regions, it does not tile the 16-crop frame


@pytest.mark.parametrize("name, slices, window", [("lesion_unet_lite", 1, ""), ("lesion_unet_lite", 3, "-300,1400"),
                                                  ("lesion_unet_lite", 3, "two"),
                                                  ("roi_classifier", 3, "-300,1400"), ("lesion_unet_dx", 1, "dx")])
def test_training_smoke(tmp_path: Path, name: str, slices: int, window: str) -> None:
    """A few steps of the real training script, end to end: data (with the CT neighbours
    for a 2.5-D model), loop, ONNX, spec (a fixed CT window: ``fixed_window``)."""
    require_module("torch")
    require_module("monai")
    fixed = [f"--window={window}", "--data", "ct"] if window else []  # "=": the centre may be negative
    if window == "dx":  # the radiograph UNet: radiographs only, said before any work otherwise
        fixed = ["--data", "dx"]
        bad = subprocess.run([sys.executable, "-m", "medrt.models.train", name, "--steps", "1",
                              "--out", str(tmp_path / "bad")], capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert bad.returncode == 2 and "--data dx" in bad.stderr
    if window == "two":  # the two-window CT UNet (3.x), with lung nodules drawn in
        fixed = ["--two-windows", "--data", "ct", "--insert-lung", "0.5", "--insert-small", "0.5",
                 "--insert-small-mm", "5,10"]
        bad = subprocess.run([sys.executable, "-m", "medrt.models.train", name, "--two-windows", "--data", "all",
                              "--steps", "1", "--out", str(tmp_path / "bad")],
                             capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert bad.returncode == 2 and "--data ct" in bad.stderr  # CT only, said before any work
    out = subprocess.run(
        [sys.executable, "-m", "medrt.models.train", name, "--steps", "3", "--batch", "2",
         "--n-dx", "1", "--n-ct", "1", "--slices", str(slices), "--cache", str(tmp_path / "cache"),
         "--out", str(tmp_path / "out"), *fixed],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    spec = load_spec(tmp_path / "out" / f"{name}.toml")
    assert spec.training["seconds"] > 0 and spec.slices == slices
    assert ("--slices 3" in spec.training["command"]) == (slices == 3)
    if window == "two":
        assert spec.own_window == (-250.0, 1500.0)
        assert "--two-windows" in spec.training["command"] and "--insert-lung 0.5" in spec.training["command"]
        assert "--insert-small 0.5 --insert-small-mm 5,10" in spec.training["command"]
        assert "--window" not in spec.training["command"]  # implied by --two-windows
    elif window == "dx":
        assert spec.modalities == ("DX", "CR") and "lesion_unet_dx --steps 3" in spec.training["command"]
    else:
        assert spec.own_window == ((-300.0, 1400.0) if window else None)
        assert (f"--window={window}" in spec.training["command"]) == bool(window)
    y = OnnxRuntimeBackend(spec).infer(np.zeros((1, slices, 64, 64), np.float32))
    assert y[-1].shape == ((1, 1, 8, 8) if name == "roi_classifier" else (1, 1, 64, 64))  # heatmap / logits


def test_training_patches_are_resampled_like_inference() -> None:
    """Radiograph patches are made by the same area averaging as inference, the mask
    with them (as a lesion fraction), and batches keep to the modality and lesion mix."""
    from medrt.analysis.resample import area_downsample, resample_factors
    from medrt.models import data as phantom_data

    size = 2048
    rr, cc = np.ogrid[:size, :size]
    labels = (((rr - 1000) ** 2 + (cc - 900) ** 2) <= 60**2).astype(np.uint16)
    pixels = (1000.0 + 100.0 * labels + (rr % 7)).astype(np.float32)
    factors = resample_factors((0.125, 0.125), phantom_data.SEG_SPACING)
    assert factors == (4, 4)
    (patch, frac, window), = phantom_data._patches_from(
        pixels, labels, (1000.0, 400.0), np.random.default_rng(0), n_random=0, factors=factors)
    side = phantom_data.PATCH
    assert patch.shape == frac.shape == (side, side) and frac.dtype == np.uint8
    # Find where the patch came from: it is a block mean of the source at a 4-aligned offset.
    hits = np.argwhere(frac > 127)
    r0 = 1000 - 4 * int(round(hits[:, 0].mean())) - 2
    c0 = 900 - 4 * int(round(hits[:, 1].mean())) - 2
    found = False
    for dr in range(-4, 5):
        for dc in range(-4, 5):
            a, b = r0 + dr, c0 + dc
            if 0 <= a <= size - 4 * side and 0 <= b <= size - 4 * side:
                ref = area_downsample(pixels[a : a + 4 * side, b : b + 4 * side], factors)
                if np.allclose(ref, patch):
                    ref_mask = area_downsample((labels[a : a + 4 * side, b : b + 4 * side] > 0).astype(np.float32), factors)
                    assert np.abs(ref_mask * 255 - frac).max() <= 0.5 + 1e-3
                    found = True
    assert found, "the patch is not a block mean of the source"
    # The disc (120 px across at source) is 30 px across in the patch.
    assert 25 <= (frac > 127).any(axis=0).sum() <= 32

    seg = phantom_data.SegData(
        patches=np.stack([patch, np.full_like(patch, 1000.0)]), windows=np.array([window, window], np.float32),
        masks=np.stack([frac, np.zeros_like(frac)]), is_ct=np.array([False, True]))
    x, y = phantom_data.seg_batch(np.random.default_rng(1), seg, 32, ct_fraction=0.25, lesion_fraction=1.0)
    assert x.shape == y.shape == (32, 1, 256, 256) and 0.0 <= y.min() and y.max() <= 1.0
    with_lesion = (y.reshape(32, -1).max(axis=1) > 0.5).sum()
    assert 16 <= with_lesion <= 32, "most crops are radiograph crops that hold the lesion"


def test_lesion_unet_finds_radiograph_nodules_at_its_spacing() -> None:
    """The 1.x UNets found 0 of 63 held-out radiograph nodules. At its 0.5 mm spacing the
    shipped lesion_unet finds clear ones with few false positives; fed the 0.125 mm pixels
    as they are (no spacing given) it marks hundreds of spots per frame: the resampling is
    what makes it usable."""
    from medrt.analysis.lesions import lesions_from_probability
    from medrt.analysis.segment import sliding_window
    from medrt.phantom import generate_radiograph
    from medrt.preprocess import normalize

    unet = OnnxRuntimeBackend(load_spec(MODELS / "lesion_unet.toml"))
    thr = unet.spec.thresholds["probability"]
    found = {"resampled": 0, "native": 0}
    false = {"resampled": 0, "native": 0}
    total = frames = 0
    for index in (1, 2, 3, 7, 10, 11):  # frames whose truth holds clear nodules (>= 8 mm, >= 80 units)
        f = generate_radiograph(9906, size=4096, index=index, n_lesions=3)
        clear = [t for t in f.lesions if t.diameter_mm >= 8 and t.contrast >= 80]
        total += len(clear)
        frames += 1
        norm = normalize(f.pixels, *f.window)
        for key, spacing in (("resampled", f.spacing_mm), ("native", None)):
            prob = sliding_window(unet, norm, roi=1024, spacing_mm=spacing)
            _, lesions = lesions_from_probability(prob, f.spacing_mm, thr)
            found[key] += sum(any(_near(les, t, f.spacing_mm[0]) for les in lesions) for t in clear)
            false[key] += sum(not any(_near(les, t, f.spacing_mm[0]) for t in f.lesions) for les in lesions)
    assert total >= 6
    assert found["resampled"] >= 0.5 * total, (found, total)
    assert false["resampled"] <= 10 * frames, false
    assert false["native"] >= 10 * max(false["resampled"], frames), false


def test_small_lesions_weigh_like_large_ones_in_the_unet_loss() -> None:
    """--small-weight: each lesion's pixels get area_ref / area (1..16), so a small lesion
    adds about as much BCE as a large one; background and large lesions stay at 1."""
    require_module("torch")
    require_module("monai")
    from medrt.models.train import small_lesion_weights

    y = np.zeros((2, 1, 64, 64), np.float32)
    y[0, 0, 5:10, 5:10] = 1.0  # 25 pixels
    y[0, 0, 20:50, 20:50] = 1.0  # 900 pixels
    y[1, 0, 40:42, 40:42] = 0.4  # partial-volume edge only: not a lesion pixel
    w = small_lesion_weights(y, area=300.0)
    assert w[0, 0, 7, 7] == pytest.approx(12.0) and w[0, 0, 30, 30] == 1.0 and w[0, 0, 0, 0] == 1.0
    assert w[0, 0, 5:10, 5:10].sum() == pytest.approx(300.0)  # the small one now counts as 300 pixels
    assert np.all(w[1] == 1.0)
    assert small_lesion_weights(y, area=1e6).max() == 16.0  # capped


@pytest.mark.parametrize("k", [3, 5, 9, 15, 31])
def test_box_mean_is_the_mean_over_the_window_inside_the_frame(k: int) -> None:
    """models/networks.py box_mean (a 3x3 pool, 1-D pools, or running sums from 15 up)
    computes what the fronts computed with separable pools before: avg_pool2d without
    the padding, at the borders too, and on frames smaller than the window."""
    torch = require_module("torch")
    from medrt.models.networks import box_mean

    pool = torch.nn.functional.avg_pool2d
    for shape in ((2, 3, 37, 50), (1, 1, 7, 12)):
        x = torch.rand(*shape, generator=torch.Generator().manual_seed(k))
        want = pool(pool(x, (1, k), 1, (0, k // 2), count_include_pad=False), (k, 1), 1, (k // 2, 0),
                    count_include_pad=False)
        got = box_mean(x, k)
        assert got.shape == x.shape
        torch.testing.assert_close(got, want, rtol=0, atol=2e-6)
    with pytest.raises(ValueError, match="odd"):
        box_mean(x, 4)


def test_edge_channel_keeps_a_faint_rim_and_drops_smooth_texture() -> None:
    """Why lesion_unet 2.2 has it: a faint radiograph nodule (25 of ~3800 window units,
    sharp rim) and lung texture of the same amplitude on an ~8 mm scale look alike in the
    local-contrast channel; the edge channel tells them apart by the rim."""
    torch = require_module("torch")
    from medrt.models.networks import LocalContrast

    n, px_mm = 128, 0.5
    yy, xx = np.mgrid[:n, :n].astype(np.float32)
    amp = 25.0 / 3800.0
    nodule = amp * (np.hypot(yy - 64, xx - 64) <= 10.0)  # 10 mm across, sharp edge
    sigma = 8.0 / px_mm / 2.0  # texture bump ~8 mm across
    texture = amp * np.exp(-((yy - 64) ** 2 + (xx - 64) ** 2) / (2 * sigma**2))
    lc = LocalContrast(edge_gain=200.0).eval()
    with torch.no_grad():
        out = {k: lc(torch.from_numpy(0.4 + v)[None, None]).numpy()[0] for k, v in (("nodule", nodule), ("texture", texture))}
    contrast, edge = 1, 2
    # The local-contrast channel alone: comparable peaks.
    assert 0.5 < out["texture"][contrast].max() / out["nodule"][contrast].max() < 2.0
    # The edge channel: the rim stands out, the smooth bump much less (measured 0.45 vs 0.11).
    assert out["nodule"][edge].max() > 0.3
    assert out["texture"][edge].max() < out["nodule"][edge].max() / 3.0
    # Flat regions give zero in both extra channels (the bias of the box means is exact).
    assert abs(float(out["nodule"][edge][5:20, 5:20].max())) < 1e-5


def test_network_for_reads_the_input_channels_from_the_weights() -> None:
    """Weights from before the edge channel still load (the torch backend builds through
    this), and new ones get it."""
    torch = require_module("torch")
    require_module("monai")
    from medrt.models.networks import RoiNet, build_unet, network_for

    for edge in (False, True):
        unet = network_for("lesion_unet", build_unet("lesion_unet", edge=edge).state_dict())
        assert unet.contrast.edge_gain == (200.0 if edge else 0.0)
        roi = network_for("roi_classifier_dx", RoiNet(edge=edge).state_dict())
        assert roi.features[0].edge_gain == (200.0 if edge else 0.0)
    old_style = network_for("roi_classifier", RoiNet(local_contrast=False).state_dict())
    assert not isinstance(old_style.features[0], type(roi.features[0])) and old_style.pool == "mean+max"
    assert network_for("roi_classifier", RoiNet(pool="max").state_dict()).pool == "max"
    with torch.no_grad():
        assert unet(torch.zeros(1, 1, 64, 64)).shape == (1, 1, 64, 64)


def test_an_ensemble_averages_its_members_logits_and_rebuilds_from_its_weights() -> None:
    """lesion_unet_lite (4.0, 4.1) is an Ensemble: its output is the mean of its members' logits,
    and network_for rebuilds it (members and all) from the saved state dict."""
    torch = require_module("torch")
    require_module("monai")
    from medrt.models.networks import Ensemble, build_unet, network_for

    torch.manual_seed(0)
    members = [build_unet("lesion_unet_lite", slices=3, two_windows=True).eval() for _ in range(2)]
    net = Ensemble(members).eval()
    assert net.slices == 3 and net.fp32_input
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        want = (members[0](x) + members[1](x)) / 2
        assert torch.allclose(net(x), want, atol=1e-6)
        again = network_for("lesion_unet_lite", net.state_dict())
        assert isinstance(again, Ensemble) and len(again.members) == 2
        assert torch.allclose(again(x), want, atol=1e-6)
    with pytest.raises(ValueError, match="different numbers of slices"):
        Ensemble([members[0], build_unet("lesion_unet_lite")])
    shipped = network_for("lesion_unet_lite", torch.load(MODELS / "lesion_unet_lite.pt", weights_only=True))
    recorded = load_spec(MODELS / "lesion_unet_lite.toml").training["member_commands"]
    assert isinstance(shipped, Ensemble) and len(shipped.members) == len(recorded) == 2


def test_ensemble_script_combines_trained_members_into_one_checked_model(tmp_path: Path) -> None:
    """python -m medrt.models.ensemble on two members the real training script made (a few
    steps each, two recipes): one ONNX whose logits are the mean of the members' ONNX
    logits, a spec with the new version and threshold and each member's training record;
    members that read their input differently are refused, naming the member."""
    require_module("torch")
    require_module("monai")
    recipe = ["--steps", "2", "--batch", "2", "--n-dx", "0", "--n-ct", "1", "--data", "ct", "--slices", "3",
              "--two-windows", "--cache", str(tmp_path / "cache")]
    for i, extra in enumerate((["--insert-small", "0.5"], ["--insert-faint", "0.5"])):
        out = subprocess.run([sys.executable, "-m", "medrt.models.train", "lesion_unet_lite", *recipe, *extra,
                              "--seed", str(i), "--out", str(tmp_path / f"m{i}")],
                             capture_output=True, text=True, timeout=600, cwd=tmp_path)  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
    run = subprocess.run([sys.executable, "-m", "medrt.models.ensemble", "lesion_unet_lite", "m0", "m1",
                          "--out", "both", "--version", "9.1.0", "--threshold", "0.7", "--confirm", "0.9995"],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    spec = load_spec(tmp_path / "both" / "lesion_unet_lite.toml")  # its sha256 checked
    members = [load_spec(tmp_path / f"m{i}" / "lesion_unet_lite.toml") for i in range(2)]
    assert spec.version == "9.1.0" and spec.thresholds["probability"] == 0.7 and spec.thresholds["confirm"] == 0.9995
    assert spec.slices == 3 and spec.own_window == members[0].own_window and spec.modalities == ("CT",)
    t = spec.training
    assert t["member_commands"] == [m.training["command"] for m in members]
    assert t["member_sha256"] == [m.sha256 for m in members] and t["seconds"] == max(t["member_seconds"])
    assert "--insert-faint 0.5" in t["command"] and "--out m1; wait; python -m medrt.models.ensemble" in t["command"]
    assert t["command"].endswith("--threshold 0.7 --confirm 0.9995")
    x = np.random.default_rng(2).random((1, 3, 64, 96), dtype=np.float32)
    want = np.mean([OnnxRuntimeBackend(m).infer(x)[0] for m in members], axis=0)
    np.testing.assert_allclose(OnnxRuntimeBackend(spec).infer(x)[0], want, atol=2e-3)

    odd = tmp_path / "odd"
    shutil.copytree(tmp_path / "m1", odd)
    text = (odd / "lesion_unet_lite.toml").read_text()
    (odd / "lesion_unet_lite.toml").write_text(text.replace('modalities = ["CT"]', 'modalities = ["MR"]'))
    bad = subprocess.run([sys.executable, "-m", "medrt.models.ensemble", "lesion_unet_lite", "m0", "odd",
                          "--out", "bad", "--version", "9.2.0"], capture_output=True, text=True, timeout=600,
                         cwd=tmp_path)  # fmt: skip
    assert bad.returncode != 0 and "odd: [model] modalities" in bad.stderr and "same input" in bad.stderr
    assert not (tmp_path / "bad").exists()
    roi = subprocess.run([sys.executable, "-m", "medrt.models.ensemble", "roi_classifier", str(MODELS), str(MODELS),
                          "--out", "bad", "--version", "9.3.0"], capture_output=True, text=True, timeout=600,
                         cwd=tmp_path)  # fmt: skip
    assert roi.returncode != 0 and "only segmentation networks" in roi.stderr and not (tmp_path / "bad").exists()


def _drawn(insert, rng, stack, mask, tries):  # type: ignore[no-untyped-def]
    """The tries of a three-slice insertion (``insert(rng, stack, mask, 2)``) that drew
    something: (its mask, what it added to the stack, the new lesions labelled, how many)."""
    from scipy import ndimage

    for _ in range(tries):
        out, m = insert(rng, stack, mask, 2)
        added = (m == 255) & (mask == 0)
        if added.any():
            lab, n = ndimage.label(added)
            yield m, out - stack, lab, n


def test_training_caches_are_renamed_into_place_whole(tmp_path: Path) -> None:
    """Two trainings side by side share one cache: a cache file appears only whole, and a
    write that fails leaves the file that was there and no temporary beside it."""
    from medrt.models.data import _save_atomically

    path = tmp_path / "cache.npz"
    _save_atomically(path, a=np.arange(3))
    with np.load(path) as z:
        assert z["a"].tolist() == [0, 1, 2]
    class Broken:  # fails while the archive is being written, like a full disk
        def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        _save_atomically(path, a=np.arange(2), b=Broken())
    with np.load(path) as z:
        assert z["a"].tolist() == [0, 1, 2]
    assert [p.name for p in tmp_path.iterdir()] == ["cache.npz"]


def test_small_lesions_are_drawn_into_soft_tissue_only() -> None:
    """The CT training augmentation: 2-6 mm lesions land in homogeneous parenchyma (never in
    lung, fat or air), their masks come with them, and the cached patch is not modified."""
    from scipy import ndimage

    from medrt.models import data as phantom_data
    from medrt.phantom import generate_ct_series
    from medrt.phantom.ct_anatomy import TISSUE_HU, Tissue

    frame = generate_ct_series(4321, n_frames=40)[20]
    img = frame.pixels[96:416, 96:416].copy()
    mask = ((frame.labels[96:416, 96:416] > 0) * 255).astype(np.uint8)
    before = img.copy(), mask.copy()
    rng = np.random.default_rng(0)
    new_px = 0
    for _ in range(20):
        out, m = phantom_data.insert_small_lesions(rng, img, mask, 3)
        added = (m == 255) & (mask == 0)
        new_px += int(added.sum())
        if added.any():
            assert np.abs(out[added] - img[added]).min() > 0.0, "every new mask pixel holds lesion contrast"
            lab, n = ndimage.label(added)
            for k in range(1, n + 1):
                blob = lab == k
                ring = ndimage.binary_dilation(blob, iterations=3) & ~ndimage.binary_dilation(blob)
                level = float(np.median(img[ring]))
                assert 25.0 <= level <= 175.0, f"inserted into {level:.0f} HU (not parenchyma)"
                assert blob.sum() * 0.73**2 <= 30.0, "at most 6 mm across"
        untouched = m == mask
        assert np.array_equal(out[untouched & ~ndimage.binary_dilation(added, iterations=2)],
                              img[untouched & ~ndimage.binary_dilation(added, iterations=2)])
    assert new_px > 0
    assert np.array_equal(img, before[0]) and np.array_equal(mask, before[1])
    # A lung-only region gets nothing.
    lung = np.full((128, 128), TISSUE_HU[Tissue.LUNG], np.float32) + rng.normal(0, 12, (128, 128)).astype(np.float32)
    out, m = phantom_data.insert_small_lesions(rng, lung, np.zeros((128, 128), np.uint8), 3)
    assert not m.any() and np.array_equal(out, lung)
    tiny = np.full((10, 10), 60.0, np.float32)  # smaller than any lesion's box: left alone
    out, m = phantom_data.insert_small_lesions(rng, tiny, np.zeros((10, 10), np.uint8), 3)
    assert not m.any()
    # train.py --insert-small-mm 6,10: larger one-slice lesions, as the phantom's faint CT misses are
    areas = []
    for _ in range(10):
        _, m = phantom_data.insert_small_lesions(rng, img, mask, 3, sizes_mm=(6.0, 10.0))
        lab, n = ndimage.label((m == 255) & (mask == 0))
        areas += [float((lab == k).sum()) * 0.73**2 for k in range(1, n + 1)]
    assert areas and all(8.0 <= a <= 80.0 for a in areas) and max(areas) > 30.0


@pytest.mark.parametrize("name", SHIPPED)
def test_torch_backend_loads_every_shipped_model(name: str) -> None:
    """The torch backend builds each network from its weights (local contrast, edge channel,
    presence pooling as saved): it used to build today's default RoiNet and could not load
    roi_classifier 1.0.0 (seen in a GPU-check dry run). On the CPU it matches ONNX Runtime."""
    require_module("torch")
    require_module("monai")
    from medrt.engine.backends.torch_cuda import TorchCudaBackend

    spec = load_spec(MODELS / f"{name}.toml")
    x = np.random.default_rng(1).random((1, spec.slices, 128, 128), dtype=np.float32)
    got = TorchCudaBackend(spec, device="cpu").infer(x)
    want = OnnxRuntimeBackend(spec).infer(x)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize("name", ["lesion_unet", "roi_classifier_dx"])
def test_half_precision_keeps_the_fixed_front_in_float32(name: str) -> None:
    """The torch backend's fp16 on a phantom radiograph crop with a nodule gives the
    fp32 masks. The local-contrast front multiplies differences of a few thousandths by
    25-200; run in half precision it flipped 13 % of the nodule's pixels and lost lesions
    end to end (first seen on an H200: 1.1 lesions per frame in fp16 against 1.7). Torch
    runs half-precision convolutions on the CPU too, so this needs no GPU."""
    require_module("torch")
    require_module("monai")
    from medrt.engine.backends.torch_cuda import TorchCudaBackend
    from medrt.phantom import generate_radiograph
    from medrt.preprocess import normalize

    spec = load_spec(MODELS / f"{name}.toml")
    frame = generate_radiograph(1000, size=2048, index=0)
    r, c = (min(max(int(v) - 128, 0), 2048 - 256) for v in frame.lesions[0].center)
    crop = normalize(frame.pixels, *spec.input_window(frame.window))[r : r + 256, c : c + 256]
    x = np.ascontiguousarray(np.broadcast_to(crop, (1, spec.slices, 256, 256)))
    full = TorchCudaBackend(spec, device="cpu").infer(x)
    half = TorchCudaBackend(spec, device="cpu", precision="fp16").infer(x)
    masks = [(1.0 / (1.0 + np.exp(-o.astype(np.float64))) > 0.5) for o in (full[-1], half[-1])]
    assert masks[0].sum() > 0, "the crop should show the nodule"
    dice = 2 * (masks[0] & masks[1]).sum() / (masks[0].sum() + masks[1].sum())
    assert dice >= 0.98, f"fp16 mask Dice {dice:.3f} against fp32"
    for f, h in zip(full, half, strict=True):
        np.testing.assert_allclose(h, f, atol=0.5)  # logits; the old fp16 path was off by > 5


def test_two_and_a_half_d_inputs_show_what_is_on_this_slice_only() -> None:
    """The 2.5-D network's neighbour channels: a blob on the middle slice alone stands
    out, the same blob on all three (anatomy going on through the slices) gives ~0;
    training batches come in three slices with the lesions in the middle one."""
    torch = require_module("torch")
    require_module("monai")
    from medrt.models import data as d
    from medrt.models.networks import NeighbourDifference, build_unet, network_for

    net = build_unet("lesion_unet_lite", slices=3)
    front = net.front
    assert isinstance(front, NeighbourDifference) and front.channels == net.contrast.channels + 2
    yy, xx = np.mgrid[:64, :64]
    blob = (((yy - 32) ** 2 + (xx - 32) ** 2) < 16).astype(np.float32) * 0.1 + 0.5
    flat = np.full((64, 64), 0.5, np.float32)
    with torch.no_grad():
        only_here = front(torch.from_numpy(np.stack([flat, blob, flat])[None]))[0, -2:].numpy()
        goes_on = front(torch.from_numpy(np.stack([blob, blob, blob])[None]))[0, -2:].numpy()
    assert only_here[:, 32, 32].max() < -0.9  # the neighbours lack what this slice has
    assert np.abs(goes_on).max() < 1e-5
    assert network_for("lesion_unet_lite", net.state_dict()).slices == 3
    # Batches: (3, crop, crop) inputs; a patch without neighbours stands in for its own.
    rng = np.random.default_rng(0)
    n = 4
    patches = rng.normal(50, 10, (n, d.PATCH, d.PATCH)).astype(np.float32)
    nbs = (patches[:, None] + rng.normal(0, 5, (n, 2, d.PATCH, d.PATCH))).astype(np.int16)
    seg = d.SegData(patches, np.tile([[40.0, 400.0]], (n, 1)).astype(np.float32),
                    np.zeros((n, d.PATCH, d.PATCH), np.uint8), np.ones(n, bool), nbs)
    x, y = d.seg_batch(rng, seg, 6, crop=64, slices=3, neighbour_drop=0.0)
    assert x.shape == (6, 3, 64, 64) and y.shape == (6, 1, 64, 64)
    assert all(not np.array_equal(x[b, 0], x[b, 1]) for b in range(6))
    x, _ = d.seg_batch(rng, seg, 6, crop=64, slices=3, neighbour_drop=1.0)  # the middle slice again
    assert all(np.allclose(x[b, 0], x[b, 1], atol=0.06) and np.allclose(x[b, 2], x[b, 1], atol=0.06)
               for b in range(6))  # (up to the extra noise, drawn per channel)
    x, y = d.seg_batch(rng, seg, 8, crop=64, slices=3, insert_small=1.0, neighbour_drop=0.0)
    assert y.max() > 0.5  # lesions were drawn in, into the middle slice only
    drawn = y[:, 0] > 0.5
    assert np.abs(x[:, 1][drawn] - x[:, 0][drawn]).mean() > 3 * np.abs(x[:, 1][~drawn] - x[:, 0][~drawn]).mean()
    with pytest.raises(ValueError, match="neighbours"):
        d.seg_batch(rng, d.SegData(patches, seg.windows, seg.masks, seg.is_ct), 2, crop=64, slices=3)
    # A fixed window (--window): CT crops are normalised by it, not by their own 40/400.
    x, _ = d.seg_batch(rng, seg, 6, crop=64, slices=3, neighbour_drop=0.0, window=(50.0, 4000.0))
    assert abs(float(x.mean()) - 0.5) < 0.02 and float(x.std()) < 0.01  # 50 ± 10 HU in a 4000-wide window


def test_two_and_a_half_d_classifier_gets_each_slice_with_its_neighbours() -> None:
    """roi_classifier 2.x: the training thumbnails come with the slices before and after
    them in their series (never across two series), subsets keep that, and batches and
    the network take three channels; ``classify`` hands the model the neighbours' thumbnails."""
    torch = require_module("torch")
    require_module("monai")
    from medrt.models import data as d
    from medrt.models.networks import NeighbourDifference, RoiNet, network_for

    rng = np.random.default_rng(0)
    frames, n_dx = 3, 2  # two radiographs, then two CT series of three slices
    thumbs = [rng.normal(50, 10, (64, 64)).astype(np.float32) + k for k in range(n_dx + 2 * frames)]
    targets = [np.zeros((8, 8), np.uint8) for _ in thumbs]
    is_ct = np.arange(len(thumbs)) >= n_dx
    rows = np.arange(len(thumbs))
    pos = (rows - n_dx) % frames
    nb = np.stack([np.where(is_ct & (pos > 0), rows - 1, rows),
                   np.where(is_ct & (pos < frames - 1), rows + 1, rows)], axis=1)
    roi = d.RoiData(thumbs, np.tile([[40.0, 400.0]], (len(thumbs), 1)), targets, np.zeros(len(thumbs)), is_ct, nb)
    assert nb.tolist() == [[0, 0], [1, 1], [2, 3], [2, 4], [3, 4], [5, 6], [5, 7], [6, 7]]
    np.testing.assert_array_equal(roi.slices(3), np.stack([thumbs[2], thumbs[3], thumbs[4]]))
    sub = roi.subset(np.array([False, False, True, False, True, True, True, True]))
    assert sub.neighbours.tolist() == [[0, 0], [1, 1], [2, 3], [2, 4], [3, 4]]  # a dropped neighbour: itself
    x, y, p = d.roi_batch(rng, roi.subset(is_ct), 4, crop=64, slices=3, neighbour_drop=0.0, ct_fraction=1.0)
    assert x.shape == (4, 3, 64, 64) and y.shape == (4, 2, 8, 8) and p.shape == (4, 1)
    x, _, _ = d.roi_batch(rng, roi.subset(is_ct), 4, crop=64, slices=3, neighbour_drop=1.0, ct_fraction=1.0)
    assert all(np.array_equal(x[b, 0], x[b, 1]) and np.array_equal(x[b, 2], x[b, 1]) for b in range(4))
    net = RoiNet(slices=3)
    assert isinstance(net.features[0], NeighbourDifference)
    again = network_for("roi_classifier", net.state_dict())
    assert again.slices == 3 and isinstance(again.features[0], NeighbourDifference)
    with torch.no_grad():
        presence, heat = again(torch.from_numpy(x))
    assert presence.shape == (4, 1) and heat.shape == (4, 1, 8, 8)
    with pytest.raises(ValueError, match="slices"):
        RoiNet(slices=3, local_contrast=False)



def test_faint_lesions_are_drawn_into_parenchyma_across_the_slices() -> None:
    """The CT training augmentation for faint lesions (``--insert-faint``): 5-15 mm lesions
    (this slice shows a section of each) land in homogeneous parenchyma at 1.5-3x the noise (15-42 HU), with this slice's mask;
    the neighbouring slices get the same ellipsoid's smaller sections or nothing; lung
    gets none; the inputs stay as they were, and training batches get them on CT crops."""
    from scipy import ndimage

    from medrt.models import data as phantom_data
    from medrt.phantom import generate_ct_series
    from medrt.phantom.ct_anatomy import TISSUE_HU, Tissue

    series = generate_ct_series(4321, n_frames=40)
    stack = np.stack([f.pixels[96:416, 96:416] for f in series[19:22]])
    mask = ((series[20].labels[96:416, 96:416] > 0) * 255).astype(np.uint8)
    before = stack.copy(), mask.copy()
    rng = np.random.default_rng(0)
    drawn = 0
    for m, step, lab, n in _drawn(phantom_data.insert_faint_lesions, rng, stack, mask, tries=20):
        drawn += n
        for k in range(1, n + 1):
            blob = lab == k
            ring = ndimage.binary_dilation(blob, iterations=3) & ~ndimage.binary_dilation(blob)
            assert 25.0 <= float(np.median(stack[1][ring])) <= 175.0, "drawn into parenchyma"
            assert 15.0 <= float(np.abs(step[1][blob]).max()) <= 42.0, "faint: 1.5-3x the noise"
            assert blob.sum() * 0.73**2 <= np.pi * 7.5**2, "at most 15 mm across (a section of it, maybe less)"
            near = ndimage.binary_dilation(blob, iterations=3)
            for side in (0, 2):  # a smaller section, or none
                assert (np.abs(step[side]) > 5.0)[near].sum() <= (np.abs(step[1]) > 5.0)[near].sum()
        assert not np.any(step[:, ~ndimage.binary_dilation(m > 0, iterations=30)]), "only at the lesions"
    assert drawn > 0
    assert np.array_equal(stack, before[0]) and np.array_equal(mask, before[1])
    lung = np.full((3, 128, 128), TISSUE_HU[Tissue.LUNG], np.float32)
    lung += rng.normal(0, 12, lung.shape).astype(np.float32)
    out, m = phantom_data.insert_faint_lesions(rng, lung, np.zeros((128, 128), np.uint8), 2)
    assert not m.any() and np.array_equal(out, lung)
    # seg_batch: every CT crop gets them with insert_faint=1 (flat 60 HU parenchyma here)
    n = 4
    patches = (60.0 + rng.normal(0, 12, (n, phantom_data.PATCH, phantom_data.PATCH))).astype(np.float32)
    seg = phantom_data.SegData(patches, np.tile([[40.0, 400.0]], (n, 1)).astype(np.float32),
                               np.zeros((n, phantom_data.PATCH, phantom_data.PATCH), np.uint8), np.ones(n, bool))
    _, y = phantom_data.seg_batch(rng, seg, 6, crop=128, insert_faint=1.0)
    assert all(y[b].max() > 0.5 for b in range(6))
    _, y = phantom_data.seg_batch(rng, seg, 6, crop=128)
    assert y.max() == 0.0


def test_faint_nodules_are_drawn_into_radiograph_crops_as_the_phantom_draws_them() -> None:
    """The radiograph training augmentation for faint small nodules (``--insert-faint-dx``):
    2-6 mm nodules of the phantom's faint class (at most 25-50 units over the anatomy,
    less where area-averaging spreads a small one) land away from the crop's lesions with
    their lesion-fraction mask; the inputs stay as they were, a crop that is all lesion
    gets none, and training batches get them on radiograph crops only."""
    from scipy import ndimage

    from medrt.analysis.resample import area_downsample
    from medrt.models import data as phantom_data
    from medrt.phantom import generate_radiograph

    frame = generate_radiograph(4321, size=4096, index=0)
    f = round(phantom_data.SEG_SPACING / frame.spacing_mm[0])
    side = phantom_data.PATCH * f  # a cached training patch's region
    region = frame.pixels[1024 : 1024 + side, 1024 : 1024 + side].astype(np.float32)
    patch = area_downsample(region, (f, f))
    mask = np.zeros(patch.shape, np.uint8)
    before = patch.copy()
    rng = np.random.default_rng(0)
    drawn = 0
    for _ in range(10):
        out, m = phantom_data.insert_faint_nodules(rng, patch, mask, 3)
        step = out - patch
        lab, n = ndimage.label(m > 0)
        assert 1 <= n <= 3
        drawn += n
        for k in range(1, n + 1):
            blob = lab == k
            d_mm = 2.0 * np.sqrt(blob.sum() / np.pi) * phantom_data.SEG_SPACING
            assert 1.0 <= d_mm <= 7.5, d_mm
            assert 5.0 <= float(step[blob].max()) <= 50.0 + 1e-3, "faint: 25-50 units at the most"
            assert m[blob].max() >= 128, "the nodule's own pixels are mostly lesion"
        assert not np.any(step[~ndimage.binary_dilation(m > 0, iterations=3)]), "only at the nodules"
    assert drawn >= 10
    assert np.array_equal(patch, before) and not mask.any()
    full = np.full(patch.shape, 255, np.uint8)
    out, m = phantom_data.insert_faint_nodules(rng, patch, full, 3)
    assert np.array_equal(out, patch) and np.array_equal(m, full)
    # seg_batch: every radiograph crop gets them with insert_faint_dx=1, no CT crop does
    n = 4
    tiles = np.stack([patch] * n).astype(np.float32)
    windows = np.tile([[float(patch.mean()), 1500.0]], (n, 1)).astype(np.float32)
    empty = np.zeros((n, *patch.shape), np.uint8)
    dx = phantom_data.SegData(tiles, windows, empty, np.zeros(n, bool))
    _, y = phantom_data.seg_batch(rng, dx, 6, crop=128, insert_faint_dx=1.0)
    assert all(y[b].max() > 0.5 for b in range(6))
    ct = phantom_data.SegData(tiles, windows, empty, np.ones(n, bool))
    _, y = phantom_data.seg_batch(rng, ct, 6, crop=128, insert_faint_dx=1.0)
    assert y.max() == 0.0


def test_lung_nodules_are_drawn_into_lung_across_the_slices() -> None:
    """The CT training augmentation for lung nodules (``--insert-lung``): nodules land in
    lung parenchyma clear of vessels, 600-820 HU above it, with this slice's mask; the
    slices before and after get the same ellipsoid's smaller sections or nothing (a
    vessel would run on); soft tissue gets none, and the inputs stay as they were."""
    from scipy import ndimage

    from medrt.models import data as phantom_data
    from medrt.phantom import generate_ct_series

    series = generate_ct_series(4321, n_frames=40)
    stack = np.stack([f.pixels for f in series[1:4]])  # lung bases: slices 1-3
    mask = ((series[2].labels > 0) * 255).astype(np.uint8)
    before = stack.copy(), mask.copy()
    rng = np.random.default_rng(0)
    drawn = 0
    for m, step, lab, n in _drawn(phantom_data.insert_lung_nodules, rng, stack, mask, tries=10):
        drawn += n
        for k in range(1, n + 1):
            blob = lab == k
            ring = ndimage.binary_dilation(blob, iterations=4) & ~ndimage.binary_dilation(blob, iterations=2)
            assert float(np.median(stack[1][ring])) < -700.0, "drawn into lung"
            assert 600.0 <= float(step[1][blob].max()) <= 820.0
            near = ndimage.binary_dilation(blob, iterations=3)
            for side in (0, 2):  # a smaller section, or none, where this slice has the nodule
                assert (np.abs(step[side]) > 300.0)[near].sum() <= (step[1] > 300.0)[near].sum()
        assert not np.any(step[:, ~ndimage.binary_dilation(m > 0, iterations=40)]), "only near the nodules"
    assert drawn > 0
    assert np.array_equal(stack, before[0]) and np.array_equal(mask, before[1])
    soft = np.full((3, 128, 128), 60.0, np.float32) + rng.normal(0, 12, (3, 128, 128)).astype(np.float32)
    out, m = phantom_data.insert_lung_nodules(rng, soft, np.zeros((128, 128), np.uint8), 2)
    assert not m.any() and np.array_equal(out, soft)
    # Classifier batches: windows with nodules drawn in hold lesion cells where the wide
    # window shows them (thumbnails of CT slices are the slices themselves).
    frames = [f for f in series]
    thumbs = [f.pixels for f in frames]
    roi = phantom_data.RoiData(thumbs, np.tile([[40.0, 400.0]], (len(frames), 1)).astype(np.float32),
                               [phantom_data.heatmap_target(f.labels, 1, phantom_data.STRIDE) for f in frames],
                               np.array([int(bool(f.lesions)) for f in frames]), np.ones(len(frames), bool))
    assert len(roi.lung_rows) and set(roi.lung_rows) <= set(range(12))  # the lung bases come first
    x, y, p = phantom_data.roi_batch(rng, roi, 8, window=(-250.0, 1500.0), insert_lung=1.0)
    assert p.all()  # every window holds a lesion cell: a nodule drawn in (or a lesion there already)
    cells = np.kron(y[:, 0], np.ones((phantom_data.STRIDE, phantom_data.STRIDE)))
    for b in range(8):  # a nodule (-260..-40 HU: 0.49-0.64 in the wide window) in lung (-860 HU: 0.09)
        assert x[b, 0][cells[b] > 0].max() > 0.45


def test_two_windows_front_shows_lung_nodules_the_soft_tissue_window_clips() -> None:
    """lesion_unet_lite 3.x reads CT in one wide window; its front cuts the soft-tissue
    window out of it (the 2.x channels, exactly), and adds the wide window and its
    neighbour differences, where a lung nodule on this slice only stands out and a
    vessel running through the slices does not. The windows travel with the weights."""
    torch = require_module("torch")
    require_module("monai")
    from medrt.models.networks import SOFT_WINDOW, WIDE_WINDOW, TwoWindows, build_unet, network_for
    from medrt.preprocess import normalize

    net = build_unet("lesion_unet_lite", slices=3, two_windows=True)
    front = net.front
    assert isinstance(front, TwoWindows) and front.channels == net.contrast.channels + 2 + 3
    yy, xx = np.mgrid[:64, :64]
    spot = ((yy - 32) ** 2 + (xx - 32) ** 2) < 25
    lung = np.full((64, 64), -860.0, np.float32)
    nodule, vessel = np.where(spot, -120.0, lung), np.where(spot, 40.0, lung)
    hu = np.stack([lung, nodule, lung])
    wide = normalize(hu, *WIDE_WINDOW)
    with torch.no_grad():
        out = front(torch.from_numpy(wide[None]))[0].numpy()
        runs_on = front(torch.from_numpy(normalize(np.stack([vessel] * 3), *WIDE_WINDOW)[None]))[0].numpy()
    np.testing.assert_allclose(out[0], normalize(nodule, *SOFT_WINDOW), atol=1e-5)  # the 2.x input channel
    assert out[0][spot].max() < 0.11  # -120 HU: near the soft-tissue window's floor (-160)
    np.testing.assert_allclose(out[4], wide[1], atol=1e-6)
    assert out[4][spot].mean() - out[4][~spot].mean() > 0.45  # 740 HU of 1500
    assert out[5][32, 32] < -0.9 and out[6][32, 32] < -0.9  # neighbours lack it
    assert np.abs(runs_on[5:]).max() < 1e-5  # a vessel goes on
    again = network_for("lesion_unet_lite", net.state_dict())
    assert isinstance(again.front, TwoWindows) and again.front.offset == front.offset
    odd = build_unet("lesion_unet_lite", slices=3, two_windows=True, windows=((-500.0, 2000.0), (50.0, 350.0)))
    assert network_for("lesion_unet_lite", odd.state_dict()).front.windows.tolist() == [-500.0, 2000.0, 50.0, 350.0]
    flat = build_unet("lesion_unet_lite", slices=1, two_windows=True)  # 2-D: the two windows alone
    assert flat.front.channels == flat.contrast.channels + 1
    assert network_for("lesion_unet_lite", flat.state_dict()).front.slices == 1
    # The CT classifier's form (roi_classifier 2.x): 2-D, its windows from the weights.
    from medrt.models.networks import RoiNet

    roi = RoiNet(two_windows=True)
    assert isinstance(roi.features[0], TwoWindows) and roi.fp32_input
    again = network_for("roi_classifier", roi.state_dict())
    assert isinstance(again.features[0], TwoWindows) and again.slices == 1
    with torch.no_grad():
        presence, heat = again(torch.from_numpy(wide[1:2][None]))
    assert presence.shape == (1, 1) and heat.shape == (1, 1, 8, 8)


def test_slice_mean_channel_shows_a_faint_lesion_on_three_slices_more_clearly() -> None:
    """``slice_mean`` (train.py --slice-mean): one more channel, the local contrast of
    the three slices' mean, where a faint lesion going on through them stands sqrt(3)
    times as far out of the noise as on one slice. The weights say it is there."""
    torch = require_module("torch")
    require_module("monai")
    from medrt.models.networks import WIDE_WINDOW, TwoWindows, build_unet, network_for
    from medrt.preprocess import normalize

    net = build_unet("lesion_unet_lite", slices=3, two_windows=True, slice_mean=True)
    front = net.front
    assert isinstance(front, TwoWindows) and front.channels == net.contrast.channels + 2 + 3 + 1
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[:192, :192]
    spot = ((yy - 96) ** 2 + (xx - 96) ** 2) < 36
    ring = (((yy - 96) ** 2 + (xx - 96) ** 2) > 400) & (((yy - 96) ** 2 + (xx - 96) ** 2) < 3600)
    hu = 40.0 + np.where(spot, 15.0, 0.0)[None] + rng.normal(0.0, 12.0, (3, 192, 192))  # 1.25 x the noise
    with torch.no_grad():
        out = front(torch.from_numpy(normalize(hu.astype(np.float32), *WIDE_WINDOW)[None]))[0].numpy()

    def snr(channel: np.ndarray) -> float:
        return float((channel[spot].mean() - channel[ring].mean()) / channel[ring].std())

    assert snr(out[-1]) > 1.4 * snr(out[1])  # the mean's local contrast against this slice's
    again = network_for("lesion_unet_lite", net.state_dict())
    assert again.front.mean and again.front.channels == front.channels
    assert not network_for("lesion_unet_lite", build_unet("lesion_unet_lite", slices=3, two_windows=True)
                           .state_dict()).front.mean
    with pytest.raises(ValueError, match="slice_mean"):
        build_unet("lesion_unet_lite", slices=1, two_windows=True, slice_mean=True)


def test_cards_are_what_metrics_json_says(tmp_path: Path) -> None:
    """Every shipped model card is rendered from ``models/metrics.json`` (the raw figures of
    the held-out run that wrote them): rendering it again gives the same bytes, so no card
    holds a figure that was not measured or was edited by hand. Rates carry their 95 %
    Wilson interval."""
    for path in MODELS.iterdir():
        if path.suffix in (".toml", ".onnx"):
            shutil.copy(path, tmp_path)
    out = subprocess.run(
        [sys.executable, "-m", "medrt.models.evaluate", "--models", str(tmp_path),
         "--cards-from", str(MODELS / "metrics.json")],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "metrics.json").read_text() == (MODELS / "metrics.json").read_text()
    for name in SHIPPED:
        card = (tmp_path / f"{name}.md").read_text(encoding="utf-8")
        assert card == (MODELS / f"{name}.md").read_text(encoding="utf-8"), f"{name}.md differs from metrics.json"
        assert "95 % Wilson interval" in card


def test_ct_ceiling_is_the_ideal_observer_figure(capsys) -> None:
    """``python -m medrt.models.ceiling``: the CNR and threshold follow their formulas, the
    ceiling counts every scored section of the series once, faint lesions (1.5-3x the
    noise) sit under bright ones (4-9x), an observer that adds a lesion's slices finds at
    least as much as one that reads each slice alone, and a looser classifier covers more."""
    from medrt.models import ceiling as ce
    from medrt.phantom import generate_ct_series
    from medrt.phantom.ct import noise_sigma

    assert ce.threshold_z(0.2, 512 * 512) == pytest.approx(4.37, abs=0.01)
    assert ce.threshold_z(0.02, 512 * 512) > ce.threshold_z(0.2, 512 * 512)
    assert ce.section_cnr(-30.0, 4 * ce.SAMPLE_PX, 10.0) == pytest.approx(6.0)
    assert ce.section_cnr(60.0, 16 * ce.SAMPLE_PX, 10.0) == pytest.approx(24.0)
    assert 10.0 <= noise_sigma(5100) <= 14.0
    with pytest.raises(ValueError, match="specificity"):
        ce.ceiling(n_series=1, specificity=1.0)

    out = ce.ceiling(seed=5000, n_series=1, n_frames=40)
    scored = [les for f in generate_ct_series(5100, n_frames=40) for les in f.lesions if not les.extras.get("ignore")]
    for observer in ("slice", "series"):
        got = out[observer]
        buckets = {r["name"]: r for r in got["sections"]}
        assert sum(buckets[b]["lesions"] for b in ("2-5", "5-10", "10-30")) == len(scored) > 10
        for r in got["sections"] + got["lesions"] + got["kinds"]:
            assert r["lesions"] == 0 or 0.0 <= r["ceiling"] <= r["lesions"]
        kinds = {r["name"]: r["rate"] for r in got["kinds"]}
        assert kinds["faint"] < kinds["bright"]
        assert got["coverage"]["lesions"] == len(scored)
    for one, both in zip(out["slice"]["sections"], out["series"]["sections"], strict=True):
        assert both["ceiling"] >= one["ceiling"]
    looser = ce.ceiling(seed=5000, n_series=1, n_frames=40, specificity=0.3)["series"]["coverage"]
    assert 0.0 < out["series"]["coverage"]["rate"] < looser["rate"] <= 1.0
    assert ce.main(["--series", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["z"] == out["z"]


def test_cards_count_the_fixed_channels_of_single_networks_and_ensembles() -> None:
    """The card's input line comes from the graph: lesion_unet 2.2 (one network) and
    lesion_unet_dx 1.2 (two, whose export keeps one copy of their shared fixed channels)
    both compute the local-contrast and the edge channel; the lite UNets only the first,
    beside their neighbour differences."""
    require_module("onnx")
    from medrt.models.cards import _contrast_channels

    channels = {name: _contrast_channels(load_spec(MODELS / f"{name}.toml"))
                for name in ("lesion_unet", "lesion_unet_dx", "lesion_unet_lite")}
    assert channels == {"lesion_unet": 2, "lesion_unet_dx": 2, "lesion_unet_lite": 1}
    assert "an edge channel" in (MODELS / "lesion_unet_dx.md").read_text()


def test_bf16_training_is_refused_where_the_cpu_would_emulate_it(tmp_path: Path) -> None:
    """Without oneDNN's BF16 kernels (an AVX2 CPU) torch emulates BF16 at about a quarter
    of FP32's steps, so a ``--minutes`` run would stop undertrained: the script says so
    before any work. Where the CPU has them, the same command goes on (here: builds data)."""
    require_module("torch")
    from medrt.models.train import native_bf16

    out = subprocess.run([sys.executable, "-m", "medrt.models.train", "lesion_unet_lite", "--amp", "bf16",
                          "--data", "ct", "--n-dx", "0", "--n-ct", "1", "--build-only",
                          "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    if native_bf16():
        assert out.returncode == 0, out.stderr[-3000:]
    else:
        assert out.returncode == 2 and "--amp bf16: this CPU has no BF16 kernels" in out.stderr, out.stderr[-3000:]
        assert not (tmp_path / "cache").exists()


def test_export_only_re_exports_an_ensemble_and_raises_its_patch_version(tmp_path: Path) -> None:
    """``--export-only`` (a new graph for the same weights, e.g. after an export rewrite):
    the spec gets the next patch version, the new file's sha256 and the export note (an
    ensemble keeps its members' note); thresholds and the training record stay."""
    require_module("torch")
    require_module("monai")
    from medrt.models.train import ENSEMBLE_NOTE, EXPORT_NOTE, export_only

    name = "lesion_unet_lite"
    for suffix in (".pt", ".toml"):
        shutil.copy(MODELS / f"{name}{suffix}", tmp_path)
    old = load_spec(MODELS / f"{name}.toml")
    major, minor, patch = (int(v) for v in old.version.split("."))
    spec_path = export_only(name, tmp_path)
    new = load_spec(spec_path)  # checks the sha256 against the new file
    assert new.version == f"{major}.{minor}.{patch + 1}"
    assert spec_path.read_text().startswith(f"# {name} {new.version}:")
    text = spec_path.read_text()
    assert f'export = "{EXPORT_NOTE}; {ENSEMBLE_NOTE.format(n=2)}"' in text
    assert new.thresholds == old.thresholds and new.training == old.training
    assert load_spec(export_only(name, tmp_path, version="9.0.0")).version == "9.0.0"


@pytest.mark.parametrize("name", ["lesion_unet", "lesion_unet_dx", "lesion_unet_lite"])
def test_shipped_weights_export_under_the_current_network_code(name: str, tmp_path: Path) -> None:
    """``train.export`` checks the ONNX graph against torch (1e-3 on the logits): the
    shipped weights must still pass it with today's fronts, or ``--export-only`` and every
    retraining of that model would stop at the export (running sums for the edge
    channel's 9-px window once put lesion_unet_dx at 1.3e-3)."""
    torch = require_module("torch")
    require_module("monai")
    from medrt.models.networks import network_for
    from medrt.models.train import export

    net = network_for(name, torch.load(MODELS / f"{name}.pt", map_location="cpu", weights_only=True))
    path = export(net, name, tmp_path, roi=False)  # raises when ONNX and torch differ
    if name == "lesion_unet_lite":  # exported with this code (4.1.1): the same function as shipped
        ort = require_module("onnxruntime")
        x = np.random.default_rng(0).random((1, 3, 128, 96), dtype=np.float32)
        got, want = (ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, {"image": x})[0]
                     for p in (path, MODELS / f"{name}.onnx"))
        np.testing.assert_array_equal(got, want)


def test_a_resumed_runs_card_command_carries_the_options_that_resumed_it() -> None:
    """The command a resumed training writes on its card reruns it: with ``--resume``,
    ``--prior-steps`` and ``--prior-seconds`` (it read as a fresh run from random weights), and
    the first run's command after it."""
    import shlex

    from medrt.models.train import _resumed, build_parser

    first = "python -m medrt.models.train roi_classifier_dx --steps 9 --lr 0.003 --data dx"
    second = ["roi_classifier_dx", "--steps", "9", "--lr", "0.001", "--data", "dx", "--resume", "w/first.pt",
              "--prior-steps", "8038", "--prior-seconds", "960.1", "--prior-command", first]
    args = build_parser().parse_args(second)
    said = f"roi_classifier_dx --steps 9{_resumed(args)}"
    rerun, _, rest = said.partition("; ")
    again = build_parser().parse_args(shlex.split(rerun))
    assert (again.resume, again.prior_steps, again.prior_seconds) == ("w/first.pt", 8038, 960.1)
    assert rest.endswith(f": {first}")
    args.prior_command = ""
    again = build_parser().parse_args(shlex.split(f"roi_classifier_dx{_resumed(args)}".partition(", ")[0]))
    assert again.resume == "w/first.pt" and again.prior_steps == 8038
