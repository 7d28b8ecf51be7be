"""Spacing normalisation in the UNet path: resampling helpers, crops, sliding window, recheck.

The sparse resampling and the windowed recheck are checked against whole-frame
references (the code as it was before) on a real 4096² phantom radiograph with the
shipped lesion_unet.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import SimpleITK as sitk
from hypothesis import given, settings
from hypothesis import strategies as st

from medrt.analysis import recheck as recheck_module
from medrt.analysis.lesions import lesions_from_probability
from medrt.analysis.recheck import RecheckConfig, recheck
from medrt.analysis.resample import (
    Bilinear,
    area_downsample,
    recheck_factors,
    resample_factors,
    upsample_bilinear,
)
from medrt.analysis.segment import (
    CROP_CONTEXT,
    PROB_FLOOR,
    _blended_logits,
    _logits_at,
    _margin,
    _region,
    _sigmoid,
    model_factors,
    segment_crops,
    sliding_window,
)
from medrt.analyzer import AnalyzerConfig, load_analyzer
from medrt.bench.engine import phantom_frames


class Contrast:
    """A stand-in segmenter: logit = gain · (x - 0.5), so a bright disc comes back as a
    lesion where it is. Records the input shapes it was given."""

    def __init__(self, spacing_mm: float | None, multiple_of: int = 16) -> None:
        self.spec = SimpleNamespace(multiple_of=multiple_of, spacing_mm=spacing_mm)
        self.shapes: list[tuple[int, ...]] = []

    def infer(self, x: np.ndarray) -> list[np.ndarray]:
        self.shapes.append(x.shape)
        return [(20.0 * (x - 0.5)).astype(np.float32)]


def disc(shape: tuple[int, int], center: tuple[float, float], radius: float) -> np.ndarray:
    rr, cc = np.ogrid[: shape[0], : shape[1]]
    return (rr - center[0]) ** 2 + (cc - center[1]) ** 2 <= radius**2


def test_factors_follow_the_spacing() -> None:
    assert resample_factors((0.125, 0.125), 0.5) == (4, 4)  # DX against a 0.5 mm model
    assert resample_factors((0.147, 0.147), 0.5) == (3, 3)
    assert resample_factors((0.1, 0.1), 0.5) == (5, 5)
    assert resample_factors((0.7, 0.7), 0.5) == (1, 1)  # CT: native
    assert resample_factors((0.4, 0.4), 0.5) == (1, 1)  # not much finer than the target
    assert resample_factors((0.1, 0.7), 0.5) == (5, 1)  # per axis
    assert resample_factors(None, 0.5) == (1, 1) and resample_factors((0.125, 0.125), None) == (1, 1)
    assert recheck_factors((0.125, 0.125), 0.5) == (2, 2)  # twice the first pass's scale
    assert recheck_factors((0.7, 0.7), 0.5) is None  # native first pass: the recheck upsamples itself
    with pytest.raises(ValueError, match="spacing_mm"):
        resample_factors((0.0, 0.1), 0.5)


def test_area_downsample_is_a_block_mean_with_partial_edges() -> None:
    x = np.arange(7 * 5, dtype=np.float32).reshape(7, 5)
    y = area_downsample(x, (3, 2))
    assert y.shape == (3, 3) and y.dtype == np.float32
    assert y[0, 0] == pytest.approx(x[0:3, 0:2].mean())
    assert y[2, 2] == pytest.approx(x[6:7, 4:5].mean())  # the last blocks hold what they have
    assert y[1, 2] == pytest.approx(x[3:6, 4:5].mean())
    z = np.ones((8, 8), np.int16) * 3
    assert np.array_equal(area_downsample(z, (4, 4)), np.full((2, 2), 3.0, np.float32))
    assert area_downsample(x, (1, 1)) is not x or area_downsample(x, (1, 1)).dtype == np.float32


@given(rows=st.integers(1, 40), cols=st.integers(1, 40), fr=st.integers(1, 9), fc=st.integers(1, 9),
       dtype=st.sampled_from([np.float32, np.float64, np.int16, np.uint16]), seed=st.integers(0, 2**16))
@settings(max_examples=150, deadline=None)
def test_block_mean_matches_a_plain_block_average(rows, cols, fr, fc, dtype, seed) -> None:  # type: ignore[no-untyped-def]
    """The strided-slice block mean (used for thumbnails and radiograph resampling)
    against the obvious per-block average, partial edge blocks included."""
    from medrt.preprocess import block_mean, thumbnail

    x = (np.random.default_rng(seed).random((rows, cols)) * 1000).astype(dtype)
    got = block_mean(x, fr, fc)
    want = np.array([[x[i:i + fr, j:j + fc].astype(np.float64).mean() for j in range(0, cols, fc)]
                     for i in range(0, rows, fr)])
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3)
    thumb, f = thumbnail(x, max(1, max(rows, cols) // max(fr, fc)))
    np.testing.assert_allclose(thumb, block_mean(x, f, f), rtol=0, atol=0)


def test_upsample_aligns_pixel_centres() -> None:
    # A linear ramp on the coarse grid comes back as the same ramp at source pixel centres.
    coarse = np.arange(8, dtype=np.float32)[None, :].repeat(4, axis=0)
    up = upsample_bilinear(coarse, (4, 4), (16, 32))
    assert up.shape == (16, 32)
    centre = (np.arange(32) + 0.5) / 4 - 0.5  # coarse coordinate of each source column
    inside = (centre >= 0) & (centre <= 7)
    np.testing.assert_allclose(up[5, inside], centre[inside], atol=1e-5)
    assert up[0, 0] == up[0, 1] == 0.0  # held at the edge
    # Down then up keeps a smooth map.
    rr, cc = np.mgrid[:64, :64]
    smooth = np.sin(rr / 20.0) + np.cos(cc / 16.0)
    back = upsample_bilinear(area_downsample(smooth, (4, 4)), (4, 4), smooth.shape)
    assert np.abs(back - smooth)[4:-4, 4:-4].max() < 0.03


def test_crops_run_at_the_model_spacing_and_come_back_in_place() -> None:
    shape = (2048, 2048)
    truth = disc(shape, (1300.0, 700.0), 40.0)  # a 10 mm nodule at 0.125 mm
    norm = np.where(truth, 0.9, 0.1).astype(np.float32)
    model = Contrast(spacing_mm=0.5)
    crops = [(1000, 300, 2024, 1324)]
    prob = segment_crops(model, norm, crops, spacing_mm=(0.125, 0.125), context=0)
    assert model.shapes == [(1, 1, 256, 256)], "a 1024² crop at 0.125 mm is a 256² input at 0.5 mm"
    # With context: 32 model pixels above and on both sides, 6 below (the frame ends 24 px
    # under the crop), padded to the model's multiple of 16.
    with_context = Contrast(spacing_mm=0.5)
    np.testing.assert_array_equal(
        segment_crops(with_context, norm, crops, spacing_mm=(0.125, 0.125)), prob)
    assert with_context.shapes == [(1, 1, 304, 320)]
    assert prob.shape == shape and prob.dtype == np.float32
    _, lesions = lesions_from_probability(prob, (0.125, 0.125), 0.5)
    assert len(lesions) == 1
    les = lesions[0]
    assert les.centroid == pytest.approx((1300.0, 700.0), abs=0.5)
    got = prob >= 0.5
    assert (got & truth).sum() / ((got.sum() + truth.sum()) / 2) > 0.97  # Dice
    assert not prob[:1000].any(), "0 outside every crop"

    # Without the frame's spacing (or without a model spacing) nothing is resampled.
    native = Contrast(spacing_mm=0.5)
    segment_crops(native, norm, crops, context=0)
    assert native.shapes == [(1, 1, 1024, 1024)]
    unset = Contrast(spacing_mm=None)
    segment_crops(unset, norm, crops, spacing_mm=(0.125, 0.125), context=0)
    assert unset.shapes == [(1, 1, 1024, 1024)]
    ct = Contrast(spacing_mm=0.5)
    segment_crops(ct, norm[:512, :512], [(0, 0, 512, 512)], spacing_mm=(0.7, 0.7))
    assert ct.shapes == [(1, 1, 512, 512)], "CT slices run at native resolution"


class Neighbourhood(Contrast):
    """A stand-in with spatial context, like a UNet: logit = gain · (9×9 mean with zero
    padding − 0.5). Inside a flat 0.9 field it is positive everywhere; near an image edge
    the zeros beyond pull it down, as a UNet's padding does."""

    def infer(self, x: np.ndarray) -> list[np.ndarray]:
        from scipy import ndimage

        self.shapes.append(x.shape)
        mean = ndimage.uniform_filter(x[0, 0].astype(np.float64), 9, mode="constant", cval=0.0)
        return [(20.0 * (mean - 0.5)).astype(np.float32)[None, None]]


def test_crops_see_the_frame_around_them() -> None:
    """A crop edge inside the frame is not an image edge: with context the crop's pixels
    come out as the whole-frame run gives them; without, the edge rows change. Crops
    that reach the frame's edge get no context there (nothing to see), and a crop over
    the whole frame costs nothing extra."""
    norm = np.full((256, 256), 0.9, np.float32)
    whole = segment_crops(Neighbourhood(spacing_mm=None), norm, [(0, 0, 256, 256)])
    crop = (64, 64, 192, 192)
    with_ctx = segment_crops(Neighbourhood(spacing_mm=None), norm, [crop], context=8)
    bare = segment_crops(Neighbourhood(spacing_mm=None), norm, [crop], context=0)
    inside = (slice(64, 192), slice(64, 192))
    np.testing.assert_allclose(with_ctx[inside], whole[inside], atol=1e-6)
    assert (bare[64, 64:192] < whole[64, 64:192] - 0.1).all(), "without context the crop edge darkens"
    assert not with_ctx[:64].any() and not with_ctx[192:].any(), "only the crop's own pixels are written"
    model = Neighbourhood(spacing_mm=None)
    segment_crops(model, norm, [(0, 0, 256, 256), (-32, -32, 288, 288), (-32, 128, 224, 384)], context=8)
    assert model.shapes[:2] == [(1, 1, 256, 256), (1, 1, 320, 320)], "no context past the frame's edges"
    assert model.shapes[2] == (1, 1, 272, 272), "8 px left and below (264), none above or right; to 16"
    # CT: a 1024² crop planned around a 512² slice runs as before.
    ct = Contrast(spacing_mm=0.5)
    segment_crops(ct, np.zeros((512, 512), np.float32), [(-256, -256, 768, 768)], spacing_mm=(0.7, 0.7))
    assert ct.shapes == [(1, 1, 1024, 1024)]


def test_sliding_window_resamples_the_whole_frame() -> None:
    shape = (2048, 1536)
    truth = disc(shape, (400.0, 1000.0), 24.0)
    norm = np.where(truth, 0.9, 0.1).astype(np.float32)
    model = Contrast(spacing_mm=0.5)
    prob = sliding_window(model, norm, roi=256, overlap=0.25, spacing_mm=(0.125, 0.125))
    assert prob.shape == shape
    assert {s[2:] for s in model.shapes} == {(256, 256)}  # windows tile the 512x384 resampled frame
    assert len(model.shapes) == 3 * 2
    _, lesions = lesions_from_probability(prob, (0.125, 0.125), 0.5)
    assert len(lesions) == 1 and lesions[0].centroid == pytest.approx((400.0, 1000.0), abs=0.5)


def test_recheck_runs_at_half_the_first_pass_factor() -> None:
    shape = (1024, 1024)
    truth = disc(shape, (500.0, 300.0), 14.0)  # 3.5 mm at 0.125 mm: a small lesion
    norm = np.where(truth, 0.9, 0.1).astype(np.float32)
    model = Contrast(spacing_mm=0.5)
    spacing = (0.125, 0.125)
    prob = segment_crops(model, norm, [(0, 0, 1024, 1024)], spacing_mm=spacing)
    labels, lesions = lesions_from_probability(prob, spacing, 0.5)
    assert len(lesions) == 1 and lesions[0].diameter_mm < 5.0
    model.shapes.clear()
    out, touched, runs = recheck(model, norm, prob, labels, lesions, spacing, 0.5)
    assert runs == 1 and touched.any() and out.shape == shape
    assert out is prob, "the first pass is updated in place"
    side = model.shapes[0][2]
    # The window (>= 8 mm = 64 px at source) is area-averaged by 2, in whole blocks of 16.
    assert model.shapes[0][2:] == (side, side) and side % 16 == 0 and 32 <= side <= 64
    _, again = lesions_from_probability(out, spacing, 0.5, rechecked_mask=touched)
    assert len(again) == 1 and again[0].rechecked
    assert again[0].centroid == pytest.approx((500.0, 300.0), abs=0.5)

    # A native first pass (CT) keeps the 2x upsampled recheck.
    ct = Contrast(spacing_mm=0.5)
    small = np.where(disc((400, 400), (200.0, 150.0), 2.5), 0.9, 0.1).astype(np.float32)  # 3.5 mm at 0.7 mm
    p0 = segment_crops(ct, small, [(0, 0, 400, 400)], spacing_mm=(0.7, 0.7))
    lab0, les0 = lesions_from_probability(p0, (0.7, 0.7), 0.5)
    ct.shapes.clear()
    recheck(ct, small, p0, lab0, les0, (0.7, 0.7), 0.5)
    assert len(les0) == 1 and len(ct.shapes) == 1
    assert ct.shapes[0][2] % 16 == 0 and ct.shapes[0][2] >= 2 * 8 / 0.7  # 2x the >= 8 mm window


def test_recheck_context_is_seen_but_not_written() -> None:
    """``RecheckConfig.context_mm``: the network sees that much more of the frame around
    each window, and the recheck still writes the same window. With a pixelwise stand-in
    model the written values are the same as without context (exactly on a native CT
    first pass; away from the window's edge where a radiograph's logits are interpolated
    back), so the context is cut away at the right offsets."""
    for spacing, shape, centre, radius, exact in (((0.7, 0.7), (400, 400), (200.0, 150.0), 2.5, True),
                                                  ((0.125, 0.125), (1024, 1024), (500.0, 300.0), 14.0, False)):
        norm = np.where(disc(shape, centre, radius), 0.9, 0.1).astype(np.float32)
        runs = {}
        for ctx in (0.0, 6.0):
            model = Contrast(spacing_mm=0.5)
            prob = segment_crops(model, norm, [(0, 0, *shape)], spacing_mm=spacing)
            labels, lesions = lesions_from_probability(prob, spacing, 0.5)
            model.shapes.clear()
            out, touched, n = recheck(model, norm, prob, labels, lesions, spacing, 0.5, RecheckConfig(context_mm=ctx))
            runs[ctx] = (out, touched, model.shapes[0][2])
        (plain, t0, side0), (wide, t1, side1) = runs[0.0], runs[6.0]
        assert n == 1 and side1 > side0, "the network sees more"
        np.testing.assert_array_equal(t0, t1)  # the same window is written
        if exact:
            np.testing.assert_array_equal(wide, plain)
        else:
            inner = disc(shape, centre, 3 * radius)
            np.testing.assert_allclose(wide[inner], plain[inner], atol=1e-5)


def test_bilinear_blocks_are_the_whole_grid_values() -> None:
    rng = np.random.default_rng(3)
    for factors, shape in (((4, 4), (203, 150)), ((3, 3), (100, 98)), ((5, 1), (97, 40))):
        coarse = rng.standard_normal((-(-shape[0] // factors[0]), -(-shape[1] // factors[1]))).astype(np.float32)
        whole = upsample_bilinear(coarse, factors, shape)
        up = Bilinear(coarse, factors, shape)
        for r0, c0, r1, c1 in ((0, 0, *shape), (0, 0, 1, 1), (7, 13, 61, 29), (shape[0] - 5, shape[1] - 9, *shape)):
            assert np.array_equal(up.block(r0, c0, r1, c1), whole[r0:r1, c0:c1])
        assert up.block(4, 4, 4, 9).shape == (0, 5)


# -- the whole-frame references ------------------------------------------------------------


def faint_peaks_reference(prob: np.ndarray, low: float, high: float, labels: np.ndarray) -> list:
    """Faint peaks from one labelling of the whole frame."""
    band = prob >= low
    if not band.any():
        return []
    comps = sitk.ConnectedComponent(sitk.GetImageFromArray(band.astype(np.uint8)), True)
    stats = sitk.LabelShapeStatisticsImageFilter()
    stats.Execute(comps)
    lab = sitk.GetArrayViewFromImage(comps)
    out = []
    for k in stats.GetLabels():
        x0, y0, w, h = stats.GetBoundingBox(k)
        inside = lab[y0 : y0 + h, x0 : x0 + w] == k
        peak = float(prob[y0 : y0 + h, x0 : x0 + w][inside].max())
        if peak < high and not labels[y0 : y0 + h, x0 : x0 + w][inside].any():
            cx, cy = stats.GetCentroid(k)
            out.append((cy, cx, peak))
    return out


def recheck_reference(model, norm, prob, labels, lesions, spacing, threshold, monkeypatch):  # type: ignore[no-untyped-def]
    """The recheck on a copy of the map, large lesions protected by one np.isin over the
    frame, faint peaks from one labelling of the frame."""
    cfg = RecheckConfig()
    factors = recheck_factors(spacing, model.spec.spacing_mm)
    assert factors is not None
    multiple = max(factors) * max(8, model.spec.multiple_of)
    big = [les.label for les in lesions if les.diameter_mm >= cfg.max_diameter_mm]
    protected = np.isin(labels, big)
    out, touched = prob.copy(), np.zeros(prob.shape, bool)
    with monkeypatch.context() as m:
        m.setattr(recheck_module, "_faint_peaks", faint_peaks_reference)
        cands = recheck_module.candidates(prob, labels, lesions, threshold, cfg)
    for r, c, diameter, _ in cands:
        side = int(np.ceil(max(cfg.min_window_mm, cfg.window_factor * diameter) / min(spacing) / multiple) * multiple)
        side = max(side, 2 * multiple)
        r0, c0 = int(round(r)) - side // 2, int(round(c)) - side // 2
        back = _sigmoid(_logits_at(model, _region(norm, r0, c0, r0 + side, c0 + side), factors))
        rr0, cc0 = max(r0, 0), max(c0, 0)
        rr1, cc1 = min(r0 + side, prob.shape[0]), min(c0 + side, prob.shape[1])
        keep = protected[rr0:rr1, cc0:cc1]
        view = out[rr0:rr1, cc0:cc1]
        view[...] = np.where(keep, view, back[rr0 - r0 : rr1 - r0, cc0 - c0 : cc1 - c0])
        touched[rr0:rr1, cc0:cc1] |= ~keep
    return out, touched, len(cands)


def test_faint_peaks_match_one_labelling_of_the_whole_frame() -> None:
    shape = (700, 900)
    prob = np.zeros(shape, np.float32)
    labels = np.zeros(shape, np.uint16)
    assert recheck_module._faint_peaks(prob, 0.25, 0.6, labels) == []  # an empty map
    for (r, c), radius, peak in (
        ((100, 100), 9, 0.4), ((90, 400), 9, 0.4),  # equal peaks: raster order, not the XY cut's
        ((300, 120), 5, 0.3),
        ((650, 880), 30, 0.45),  # cut by the frame's edge
        ((500, 500), 20, 0.55), ((515, 525), 12, 0.35),  # two that touch: one region
        ((300, 700), 25, 0.9),  # reaches the threshold: a lesion, not faint
    ):
        d = disc(shape, (r, c), radius)
        prob[d] = np.maximum(prob[d], peak)
    rim = disc(shape, (150, 700), 30)  # a faint rim around a labelled lesion
    core = disc(shape, (150, 700), 12)
    prob[rim] = np.maximum(prob[rim], 0.3)
    prob[core], labels[core] = 0.55, 1  # labelled, though below this call's threshold
    got = recheck_module._faint_peaks(prob, 0.25, 0.6, labels)
    assert got == faint_peaks_reference(prob, 0.25, 0.6, labels)
    assert [round(p, 2) for _, _, p in got] == [0.4, 0.4, 0.3, 0.55, 0.45]


@pytest.fixture(scope="module")
def radiograph():  # type: ignore[no-untyped-def]
    """The shipped lesion_unet and one 4096² phantom radiograph with its ROI crops."""
    from medrt.analysis.roi import plan_crops, proposals_from_boxes

    analyzer = load_analyzer(AnalyzerConfig(warmup_shapes=((256, 256),)))
    ((frame, truth),) = phantom_frames(1)
    work = analyzer.prepare(frame)
    # Crops around the true nodules (the shipped classifier misses most radiograph
    # nodules, and crops with nothing in them would test nothing).
    boxes = [les.bbox for les in truth.scored_lesions]
    crops = plan_crops(proposals_from_boxes(boxes, frame.shape), frame.shape, 1024)
    return analyzer, replace(work, crops=crops)


@pytest.mark.parametrize("mode", ["full", "roi"])
def test_sparse_resampling_and_recheck_match_the_whole_frame(radiograph, mode, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    analyzer, work = radiograph
    # A threshold over the spec's, so the recheck surely has faint candidates to run on.
    seg, norm, spacing, thr = work.seg, work.norm, work.frame.spacing_mm, 0.97  # lesion_unet_dx, routed
    assert seg.spec.name == "lesion_unet_dx"
    factors = model_factors(seg, spacing)
    assert factors != (1, 1) and norm.shape == (4096, 4096)
    if mode == "full":
        prob = sliding_window(seg, norm, roi=1024, overlap=0.25, spacing_mm=spacing)
        small = area_downsample(norm, factors)
        dense = _sigmoid(upsample_bilinear(_blended_logits(seg, small, 1024, 0.25), factors, norm.shape))
    else:
        assert work.crops
        prob = segment_crops(seg, norm, work.crops, spacing_mm=spacing)
        dense = np.zeros(norm.shape, np.float32)
        rows, cols = norm.shape
        for r0, c0, r1, c1 in work.crops:  # each crop with its context, dense, then cut to the crop
            up, left = _margin(r0, CROP_CONTEXT, factors[0]), _margin(c0, CROP_CONTEXT, factors[1])
            down, right = _margin(rows - r1, CROP_CONTEXT, factors[0]), _margin(cols - c1, CROP_CONTEXT, factors[1])
            p = _sigmoid(_logits_at(seg, _region(norm, r0 - up, c0 - left, r1 + down, c1 + right), factors))
            p = p[up : up + r1 - r0, left : left + c1 - c0]
            rr0, cc0 = max(r0, 0), max(c0, 0)
            view = dense[rr0:r1, cc0:c1]
            np.maximum(view, p[rr0 - r0 : rr0 - r0 + view.shape[0], cc0 - c0 : cc0 - c0 + view.shape[1]], out=view)
    high = (prob >= PROB_FLOOR) | (dense >= PROB_FLOOR)
    assert (dense >= 0.25).any(), "the model marks something on this frame"
    assert np.array_equal(prob[high], dense[high]), "exact from the floor up"
    assert (prob <= dense).all()
    assert np.count_nonzero(prob) < 0.05 * prob.size, "only blocks near something are resampled"

    labels, lesions = lesions_from_probability(prob, spacing, thr)
    ref_labels, ref_lesions = lesions_from_probability(dense, spacing, thr)
    assert np.array_equal(labels, ref_labels) and lesions == ref_lesions

    # A caller that reads the map only from its threshold up (the fine sweep) moves the
    # floor there: exact from it up, fewer pixels resampled, the same lesions.
    if mode == "full":
        at_thr = sliding_window(seg, norm, roi=1024, overlap=0.25, spacing_mm=spacing, floor=thr)
    else:
        at_thr = segment_crops(seg, norm, work.crops, spacing_mm=spacing, floor=thr)
    high = (at_thr >= thr) | (dense >= thr)
    assert np.array_equal(at_thr[high], dense[high]) and (at_thr <= dense).all()
    assert np.count_nonzero(at_thr) < np.count_nonzero(prob)
    thr_labels, thr_lesions = lesions_from_probability(at_thr, spacing, thr)
    assert np.array_equal(thr_labels, ref_labels) and thr_lesions == ref_lesions

    ref_out, ref_touched, ref_runs = recheck_reference(seg, norm, dense, ref_labels, ref_lesions, spacing, thr,
                                                       monkeypatch)
    out, touched, runs = recheck(seg, norm, prob, labels, lesions, spacing, thr)
    assert runs == ref_runs > 0
    assert np.array_equal(touched, ref_touched)
    high = (out >= PROB_FLOOR) | (ref_out >= PROB_FLOOR)
    assert np.array_equal(out[high], ref_out[high])
    final = lesions_from_probability(out, spacing, thr, rechecked_mask=touched)
    ref_final = lesions_from_probability(ref_out, spacing, thr, rechecked_mask=ref_touched)
    assert np.array_equal(final[0], ref_final[0]) and final[1] == ref_final[1]
