"""The fine sweep (medrt.analysis.sweep): radiographs segmented again at twice the UNet's
scale, each component kept only when it survives flipped views of the input.

The logic is pinned with small stand-in networks whose answers are known (one that a
flip does not change, one that it does); the shipped ``lesion_unet`` then shows the
sweep finding a nodule the first pass missed, and taking false marks off, on two
validation radiographs (seed 5000, neither training nor held-out)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from medrt.analysis.lesions import lesions_from_probability
from medrt.analysis.segment import sliding_window
from medrt.analysis.sweep import SweepConfig, _flipped_views, sweep, view_window
from medrt.analyzer import AnalyzerConfig, load_analyzer
from medrt.evaluation import FramePrediction, evaluate
from medrt.phantom import generate_radiograph
from medrt.phantom.truth import FrameTruth
from medrt.preprocess import Windowed, normalize

SPACING = (0.125, 0.125)  # a radiograph against a 0.5 mm model: first pass /4, sweep /2


class Pixelwise:
    """logit = 20 · (x - 0.5): a bright disc comes back where it is, from any view."""

    def __init__(self) -> None:
        self.spec = SimpleNamespace(multiple_of=16, spacing_mm=0.5)
        self.shapes: list[tuple[int, ...]] = []

    def infer(self, x: np.ndarray) -> list[np.ndarray]:
        self.shapes.append(x.shape)
        return [(20.0 * (x - 0.5)).astype(np.float32)]


class RisingEdge(Pixelwise):
    """Answers to intensity rising from left to right: what it marks in a view is not
    what it marks in the view mirrored left to right (a false mark's behaviour)."""

    def infer(self, x: np.ndarray) -> list[np.ndarray]:
        self.shapes.append(x.shape)
        d = np.zeros_like(x)
        d[..., 1:] = x[..., 1:] - x[..., :-1]
        return [(50.0 * (d - 0.1)).astype(np.float32)]


def disc(shape: tuple[int, int], center: tuple[float, float], radius: float) -> np.ndarray:
    rr, cc = np.ogrid[: shape[0], : shape[1]]
    return (rr - center[0]) ** 2 + (cc - center[1]) ** 2 <= radius**2


def frame_with(*discs: tuple[float, float, float], shape: tuple[int, int] = (1024, 1024)) -> np.ndarray:
    norm = np.full(shape, 0.1, np.float32)
    for r, c, radius in discs:
        norm[disc(shape, (r, c), radius)] = 0.9
    return norm


def test_a_frame_at_the_models_own_scale_is_not_swept() -> None:
    norm = frame_with((200, 200, 5))
    assert sweep(Pixelwise(), norm, (0.7, 0.7), 0.5) is None  # CT
    assert sweep(Pixelwise(), norm, None, 0.5) is None


def test_a_lesion_seen_the_same_in_every_view_is_kept_at_the_fine_scale() -> None:
    """A 3 mm and a 6 mm disc: both kept, masks from the fine map."""
    norm = frame_with((300, 200, 12), (700, 650, 24))
    model = Pixelwise()
    prob, swept, views, kept = sweep(model, norm, SPACING, 0.5)
    assert swept.all() and views == 2 * 2  # two components, flipped two ways
    assert model.shapes[0][2:] == (512, 512)  # the whole frame at 0.25 mm, one window
    _, lesions = lesions_from_probability(prob, SPACING, 0.5)
    assert sorted(round(les.diameter_mm) for les in lesions) == [3, 6]
    assert sorted(kept) == sorted(les.bbox for les in lesions)  # every pixel >= threshold lies in one
    # the fine map, exact from the threshold up (the sweep reads nothing below it)
    ref = sliding_window(Pixelwise(), norm, roi=2048, factors=(2, 2))
    np.testing.assert_array_equal(prob[ref >= 0.5], ref[ref >= 0.5])
    assert (prob[ref < 0.5] <= ref[ref < 0.5]).all() and (prob[ref < 0.5] < 0.5).all()


def test_components_that_a_flip_changes_are_dropped() -> None:
    model = RisingEdge()
    norm = frame_with((300, 200, 40), (700, 650, 60))
    fine = sliding_window(model, norm, roi=2048, factors=(2, 2))
    strong = [les for les in lesions_from_probability(fine, SPACING, 0.5)[1]
              if les.max_score >= 0.999 and les.diameter_mm >= 1.5]
    assert len(strong) >= 2  # pieces of the left rims that could pass
    prob, _, views, kept = sweep(model, norm, SPACING, 0.5)
    assert views == 2 * len(strong) and not (prob >= 0.5).any() and kept == ()
    # With only the top-bottom flip, which a left-right edge does not notice, they stay.
    prob, _, _, _ = sweep(RisingEdge(), norm, SPACING, 0.5, SweepConfig(flips=("v",)))
    assert len(lesions_from_probability(prob, SPACING, 0.5)[1]) == len(strong)


def test_components_need_a_minimum_diameter_and_a_confirmed_peak() -> None:
    norm = frame_with((300, 200, 4))  # 1 mm across at 0.125 mm
    prob, _, views, _ = sweep(Pixelwise(), norm, SPACING, 0.5)
    assert views == 0 and not (prob >= 0.5).any()
    prob, _, views, _ = sweep(Pixelwise(), norm, SPACING, 0.5, SweepConfig(min_diameter_mm=0.5))
    assert views == 2 and (prob >= 0.5).any()
    # A peak under confirm is not even checked: no view can lift the least above it.
    faint = np.where(disc(norm.shape, (300, 200), 20), 0.6, 0.1).astype(np.float32)  # logit 2: p 0.88
    prob, _, views, _ = sweep(Pixelwise(), faint, SPACING, 0.5)
    assert views == 0 and not (prob >= 0.5).any()
    prob, _, views, _ = sweep(Pixelwise(), faint, SPACING, 0.5, SweepConfig(confirm=0.8))
    assert views == 2 and (prob >= 0.5).any()
    # confirm None (the default): the network's own, from its spec's [thresholds], else 0.999
    sure = Pixelwise()
    sure.spec.thresholds = {"probability": 0.5, "confirm": 0.8}
    prob, _, views, _ = sweep(sure, faint, SPACING, 0.5)
    assert SweepConfig().confirm is None and views == 2 and (prob >= 0.5).any()
    prob, _, views, _ = sweep(sure, faint, SPACING, 0.5, SweepConfig(confirm=0.999))  # a setting wins over the spec
    assert views == 0 and not (prob >= 0.5).any()
    # Past max_views, the weakest are dropped unchecked.
    two = frame_with((300, 200, 20), (700, 650, 20))
    two[disc(two.shape, (700, 650), 20)] = 0.85  # the weaker one
    prob, _, views, _ = sweep(Pixelwise(), two, SPACING, 0.5, SweepConfig(max_views=1))
    _, kept = lesions_from_probability(prob, SPACING, 0.5)
    assert views == 2 and [les.centroid for les in kept] == [pytest.approx((300.0, 200.0), abs=0.5)]


@pytest.mark.parametrize("bucket", [0, 64])
def test_flipped_views_are_aligned_with_the_fine_grid(bucket: int) -> None:
    """A pixelwise network sees in a mirrored window exactly the blocks it saw in the
    sweep, so the view mirrored back is the fine map there, up to float rounding, for
    any box, at the frame's edges too, with the window in buckets or not."""
    rng = np.random.default_rng(3)
    norm = rng.random((1000, 1000), dtype=np.float32)
    fine = sliding_window(Pixelwise(), norm, roi=2048, factors=(2, 2))
    for box in ((0, 0, 37, 51), (421, 13, 470, 90), (950, 977, 1000, 1000), (500, 500, 501, 501)):
        r0, c0, r1, c1 = box
        window = view_window(box, (40, 40), (2, 2), 16, bucket, norm.shape)
        for view in _flipped_views(Pixelwise(), norm, box, window, (2, 2), [-1, -2]):
            np.testing.assert_allclose(view, fine[r0:r1, c0:c1], atol=1e-5)


@pytest.mark.parametrize(("shape", "spacing", "fast"), [
    ((1024, 1024), SPACING, True),  # on whole (2, 2) blocks: views cut from the sweep's block means
    ((1001, 999), SPACING, False),  # ragged edge blocks: views normalised and averaged again
    ((1020, 1020), (0.083, 0.083), False),  # (3, 3): three values summed in another order when mirrored
])
def test_a_windowed_frame_sweeps_as_the_normalised_one_bit_for_bit(
    shape: tuple[int, int], spacing: tuple[float, float], fast: bool
) -> None:
    """What the analyzer hands the whole-frame sweep (medrt.preprocess.Windowed: the pixels
    and their window, normalised only where read) gives the very map, views and kept boxes
    of the normalised frame; the network sees the same inputs. Where the views can be cut
    from the block means, no region is normalised again; nowhere is the whole frame."""
    window = (500.0, 1000.0)
    pixels = np.full(shape, 100.0, np.float32)
    for r, c, radius in ((300, 200, 12), (700, 650, 24), (60, 900, 9), (990, 15, 30)):
        pixels[disc(shape, (r, c), radius)] = 900.0
    pixels += np.random.default_rng(5).normal(0.0, 20.0, shape).astype(np.float32)
    runs = []
    for norm in (normalize(pixels, *window), Counting(pixels, *window)):
        model = Recording()
        runs.append((sweep(model, norm, spacing, 0.5), model.inputs))
    (want, want_inputs), (got, got_inputs) = runs
    np.testing.assert_array_equal(got.prob, want.prob)
    assert got.views == want.views > 0 and got.kept == want.kept
    assert len(got_inputs) == len(want_inputs)
    for a, b in zip(got_inputs, want_inputs, strict=True):
        np.testing.assert_array_equal(a, b)
    assert norm._whole is None  # type: ignore[attr-defined]
    assert (norm.regions == 0) is fast  # type: ignore[attr-defined]


class Counting(Windowed):
    """Counts the regions normalised again."""

    regions = 0

    def region(self, r0: int, c0: int, r1: int, c1: int) -> np.ndarray:
        self.regions += 1
        return super().region(r0, c0, r1, c1)


class Recording(Pixelwise):
    def __init__(self) -> None:
        super().__init__()
        self.inputs: list[np.ndarray] = []

    def infer(self, x: np.ndarray) -> list[np.ndarray]:
        self.inputs.append(np.array(x))
        return super().infer(x)


@pytest.mark.parametrize("box", [(0, 0, 37, 51), (421, 13, 470, 90), (3950, 3977, 4000, 4000),
                                 (2000, 4090, 2300, 4096), (1, 1, 2, 2)])
def test_views_come_in_whole_buckets_inside_the_frame(box: tuple[int, int, int, int]) -> None:
    """Bucketed windows hold the margin around the box, start on the model's grid, are
    whole buckets, and lie inside the frame (moved, not cut, at its edges): the sides a
    GPU backend warms up cover them."""
    cfg = SweepConfig()
    margin = (256, 256)  # 32 mm at 0.125 mm
    w0, v0, w1, v1 = view_window(box, margin, (2, 2), 16, 64, (4000, 4096))
    r0, c0, r1, c1 = box
    assert w0 <= max(r0 - margin[0], 0) and v0 <= max(c0 - margin[1], 0)
    assert w1 >= min(r1 + margin[0], 4000) and v1 >= min(c1 + margin[1], 4096)
    assert w0 % 32 == 0 and v0 % 32 == 0 and 0 <= w0 and w1 <= 4000 and 0 <= v0 and v1 <= 4096
    sides = ((w1 - w0) // 2, (v1 - v0) // 2)  # network pixels at the fine scale
    assert all(side % 64 == 0 and side in cfg.view_sides(0.5, 16) for side in sides)


class Batching(Pixelwise):
    """Pixelwise, taking up to 8 inputs per call and keeping to few input shapes, as the
    torch backend on a GPU does."""

    max_batch = 8
    few_shapes = True


def test_flipped_views_go_as_one_batch_where_the_backend_takes_one() -> None:
    norm = frame_with((300, 200, 24), (700, 650, 24))
    single, batched = Pixelwise(), Batching()
    one, _, views, _ = sweep(single, norm, SPACING, 0.5)
    two, _, views2, _ = sweep(batched, norm, SPACING, 0.5)
    assert views == views2 == 4
    np.testing.assert_array_equal(one, two)
    assert [s[0] for s in single.shapes] == [1] * 5  # the sweep's window, then 4 views
    assert [s[0] for s in batched.shapes] == [1, 2, 2]  # the two flips of each component together
    assert {s[-2:] for s in batched.shapes[1:]} == {(320, 320)}  # one bucket size, warmed up on a GPU
    assert (320, 320) not in {s[-2:] for s in single.shapes[1:]}  # on the CPU: the margin alone


def test_on_the_roi_path_only_the_crops_are_swept() -> None:
    norm = frame_with((300, 200, 24), (700, 650, 24))
    crops = [(100, 0, 500, 400)]
    prob, swept, _, kept = sweep(Pixelwise(), norm, SPACING, 0.5, crops=crops)
    assert swept[100:500, 0:400].all() and swept.sum() == 400 * 400
    assert not prob[~swept].any()
    _, lesions = lesions_from_probability(prob, SPACING, 0.5)
    assert [les.centroid for les in lesions] == [pytest.approx((300.0, 200.0), abs=0.5)]
    assert sweep(Pixelwise(), norm, SPACING, 0.5, crops=[]) is None  # a negative frame: nothing to sweep


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="flips"):
        SweepConfig(flips=("x",))
    with pytest.raises(ValueError, match="flips"):
        SweepConfig(flips=())
    with pytest.raises(ValueError, match="confirm"):
        SweepConfig(confirm=0.0)
    with pytest.raises(ValueError, match="view_bucket"):
        SweepConfig(view_bucket=-1)


@pytest.fixture(scope="module")
def analyzers():  # type: ignore[no-untyped-def]
    """lesion_unet without and with the sweep."""
    return [load_analyzer(AnalyzerConfig(seg_model="lesion_unet", warmup_shapes=((256, 256),), sweep=cfg))
            for cfg in (None, SweepConfig())]


@pytest.mark.parametrize(("index", "before", "after"), [
    (29, (1, 2, 0), (2, 2, 0)),  # a 3.5 mm nodule the first pass gave p = 0 is found
    (26, (3, 3, 2), (3, 3, 0)),  # two false marks of the first pass are not flip-stable
])
def test_the_shipped_unet_finds_more_and_marks_less_with_the_sweep(analyzers, index, before, after):  # type: ignore[no-untyped-def]
    """Validation radiographs (seed 5000) through the analyzer over the whole frame, without
    and with the sweep: (nodules found, nodules, false positives)."""
    phantom = generate_radiograph(5000, size=4096, index=index)
    frame = phantom.as_frame(f"dx{index}")
    truth = {frame.sop_instance_uid: FrameTruth.from_phantom(phantom, frame.sop_instance_uid)}
    scores = []
    for analyzer in analyzers:
        result = analyzer.analyze(frame)
        assert result.mode == "full"  # auto, for a radiograph
        rep = evaluate([FramePrediction(frame.sop_instance_uid, result.lesions, result.labels)], truth)
        scores.append((rep.detected, rep.gt_lesions, rep.false_positives))
    assert scores == [before, after]
    assert all(les.rechecked for les in result.lesions)  # every pixel was swept
