"""Lesions from a probability map: components, measurements in mm, labels, speed."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import SAMPLE_DIR
from medrt.analysis.lesions import lesion_from_json, lesion_to_json, lesions_from_probability
from medrt.phantom import load_ground_truth, longest_diameter_mm

SPACING = (0.5, 0.8)  # anisotropic on purpose: (row, col) mm


def disc(shape: tuple[int, int], center: tuple[int, int], radius: float) -> np.ndarray:
    rr, cc = np.ogrid[: shape[0], : shape[1]]
    return (rr - center[0]) ** 2 + (cc - center[1]) ** 2 <= radius**2


def test_discs_are_counted_ordered_and_measured() -> None:
    shape = (200, 300)
    small, big = disc(shape, (40, 60), 5), disc(shape, (120, 200), 12)
    prob = np.where(small | big, 0.9, 0.05).astype(np.float32)

    labels, lesions = lesions_from_probability(prob, SPACING)

    assert labels.dtype == np.uint16 and labels.shape == shape
    assert [les.label for les in lesions] == [1, 2], "largest first"
    first, second = lesions
    assert np.array_equal(labels == 1, big) and np.array_equal(labels == 2, small)
    assert first.bbox == (108, 188, 133, 213)  # half-open
    assert second.bbox == (35, 55, 46, 66)
    assert first.centroid == pytest.approx((120.0, 200.0))
    assert second.centroid == pytest.approx((40.0, 60.0))
    assert first.area_mm2 == pytest.approx(big.sum() * 0.5 * 0.8)
    assert first.diameter_mm == pytest.approx(longest_diameter_mm(big, SPACING))
    assert second.diameter_mm == pytest.approx(longest_diameter_mm(small, SPACING))
    # The longest chord of a disc is along the coarser axis (cols, 0.8 mm): 24 px + 1 px.
    assert first.diameter_mm == pytest.approx(25 * 0.8)
    assert first.score == pytest.approx(0.9) and first.max_score == pytest.approx(0.9)
    assert not first.rechecked and not second.rechecked


def test_centroid_is_row_col_not_x_y() -> None:
    prob = np.zeros((50, 80), np.float32)
    prob[10:13, 60:70] = 1.0  # 3 rows x 10 cols: wide, near the right
    _, (les,) = lesions_from_probability(prob, (1.0, 1.0))
    assert les.centroid == pytest.approx((11.0, 64.5))
    assert les.bbox == (10, 60, 13, 70)


def test_score_is_mean_and_max_of_probability_inside() -> None:
    prob = np.zeros((20, 20), np.float32)
    prob[5, 5:9] = [0.6, 0.7, 0.8, 0.95]
    _, (les,) = lesions_from_probability(prob, None)
    assert les.score == pytest.approx(np.mean([0.6, 0.7, 0.8, 0.95]))
    assert les.max_score == pytest.approx(0.95)
    # Without spacing, sizes are in pixels.
    assert les.area_mm2 == pytest.approx(4.0) and les.diameter_mm == pytest.approx(4.0)


def test_threshold_is_inclusive_and_min_area_drops_specks() -> None:
    prob = np.zeros((30, 30), np.float32)
    prob[2, 2] = 0.5  # exactly at threshold: in
    prob[10:14, 10:14] = 0.7
    _, lesions = lesions_from_probability(prob, (1.0, 1.0), threshold=0.5)
    assert len(lesions) == 2
    labels, lesions = lesions_from_probability(prob, (1.0, 1.0), min_area_px=2)
    assert len(lesions) == 1 and lesions[0].bbox == (10, 10, 14, 14)
    assert labels[2, 2] == 0


def test_min_diameter_drops_short_components_and_relabels() -> None:
    """``min_diameter_mm`` (the analyzer's default 1.5 mm): a speck of a pixel or two is
    not reported, what is left is labelled 1..n, and 0 keeps everything."""
    prob = np.zeros((40, 40), np.float32)
    prob[2, 2] = prob[2, 3] = 0.9  # 2 px along the 0.8 mm columns: 1.6 mm longest diameter
    prob[10, 20] = 0.9  # one pixel
    prob[20:26, 20:26] = 0.9
    labels, lesions = lesions_from_probability(prob, SPACING, min_diameter_mm=1.5)
    assert [les.label for les in lesions] == [1, 2] and [les.bbox for les in lesions] == [(20, 20, 26, 26), (2, 2, 3, 4)]
    assert labels[10, 20] == 0 and set(np.unique(labels)) == {0, 1, 2}
    assert len(lesions_from_probability(prob, SPACING)[1]) == 3
    assert len(lesions_from_probability(prob, SPACING, min_diameter_mm=2.0)[1]) == 1
    with pytest.raises(ValueError, match='"min_diameter_mm"'):
        lesions_from_probability(prob, SPACING, min_diameter_mm=-1.0)


def test_eight_connectivity_joins_diagonal_pixels() -> None:
    prob = np.zeros((10, 10), np.float32)
    prob[2, 2] = prob[3, 3] = prob[4, 4] = 1.0
    prob[7, 1] = 1.0
    labels, lesions = lesions_from_probability(prob, (1.0, 1.0))
    assert len(lesions) == 2
    assert lesions[0].bbox == (2, 2, 5, 5) and labels[3, 3] == labels[4, 4] == 1
    # Single pixel: diameter is one pixel spacing; a diagonal of 3: 2*sqrt(2) + 1.
    assert lesions[1].diameter_mm == pytest.approx(1.0)
    assert lesions[0].diameter_mm == pytest.approx(2 * np.sqrt(2) + 1)


def test_border_touching_component_is_clipped() -> None:
    shape = (64, 64)
    corner = disc(shape, (0, 63), 6)  # a quarter disc in the top-right corner
    prob = corner.astype(np.float32)
    labels, (les,) = lesions_from_probability(prob, SPACING)
    assert les.bbox == (0, 57, 7, 64)
    rows, cols = np.nonzero(corner)
    assert les.centroid == pytest.approx((rows.mean(), cols.mean()))
    assert les.area_mm2 == pytest.approx(corner.sum() * 0.4)
    assert les.diameter_mm == pytest.approx(longest_diameter_mm(corner, SPACING))
    assert np.array_equal(labels == 1, corner)


def test_empty_map_gives_no_lesions() -> None:
    labels, lesions = lesions_from_probability(np.zeros((256, 256), np.float32), SPACING)
    assert lesions == [] and labels.shape == (256, 256) and not labels.any()
    _, lesions = lesions_from_probability(np.full((8, 8), 0.49, np.float32), SPACING)
    assert lesions == []


def test_rechecked_flag_from_mask() -> None:
    shape = (100, 100)
    a, b = disc(shape, (20, 20), 6), disc(shape, (70, 70), 4)
    rechecked = np.zeros(shape, bool)
    rechecked[70, 73] = True  # one pixel of b only
    _, lesions = lesions_from_probability(
        (a | b).astype(np.float32), SPACING, rechecked_mask=rechecked
    )
    assert [les.rechecked for les in lesions] == [False, True]


def test_equal_areas_are_ordered_top_then_left() -> None:
    prob = np.zeros((40, 40), np.float32)
    for r, c in [(30, 5), (5, 30), (5, 5), (30, 30)]:
        prob[r : r + 3, c : c + 3] = 1.0
    _, lesions = lesions_from_probability(prob, (1.0, 1.0))
    assert [les.bbox[:2] for les in lesions] == [(5, 5), (5, 30), (30, 5), (30, 30)]


def test_nested_and_interleaved_components_are_all_found() -> None:
    # A ring around a dot, and an L shape whose box overlaps another blob's box:
    # the row/column cut must not split or merge them.
    prob = np.zeros((60, 60), np.float32)
    ring = disc((60, 60), (20, 20), 10) & ~disc((60, 60), (20, 20), 7)
    prob[ring] = 1.0
    prob[20, 20] = 1.0
    prob[40:58, 40] = 1.0
    prob[57, 40:58] = 1.0
    prob[45:48, 50:53] = 1.0
    labels, lesions = lesions_from_probability(prob, (1.0, 1.0))
    assert len(lesions) == 4
    assert labels[20, 20] != labels[20, 10] and labels[40, 40] == labels[57, 57]
    assert sorted(int(np.count_nonzero(labels == les.label)) for les in lesions) == sorted(
        [int(ring.sum()), 1, 35, 9]
    )


@pytest.mark.parametrize("seed", range(12))
def test_diameter_equals_the_ground_truth_measure_on_irregular_masks(seed: int) -> None:
    rng = np.random.default_rng(seed)
    spacing = (float(rng.uniform(0.1, 2.0)), float(rng.uniform(0.1, 2.0)))
    shape = (int(rng.integers(20, 90)), int(rng.integers(20, 90)))
    blob = disc(shape, (shape[0] // 2, shape[1] // 2), min(shape) / 3)
    blob &= rng.random(shape) < 0.97  # holes and ragged edges
    blob[shape[0] // 2, :] = True  # and a bar to the borders
    labels, lesions = lesions_from_probability(blob.astype(np.float32), spacing)
    for les in lesions:
        mask = labels == les.label
        assert les.diameter_mm == pytest.approx(longest_diameter_mm(mask, spacing), abs=1e-9)


@pytest.mark.parametrize("line", ["row", "column", "diagonal"])
def test_diameter_of_a_component_that_is_one_line(line: str) -> None:
    """A long thin component has no 2-D convex hull (Qhull refuses it); it is measured on
    all its points and still equals the ground-truth measure."""
    mask = np.zeros((120, 120), bool)
    if line == "row":
        mask[60, 10:110] = True
    elif line == "column":
        mask[10:110, 60] = True
    else:
        mask[np.arange(10, 110), np.arange(10, 110)] = True
    spacing = (0.7, 0.5)
    labels, lesions = lesions_from_probability(mask.astype(np.float32), spacing)
    assert len(lesions) == 1
    assert lesions[0].diameter_mm == pytest.approx(longest_diameter_mm(mask, spacing), abs=1e-9)


def test_sample_ground_truth_masks_measure_like_their_truth() -> None:
    """Turned into probabilities, the committed masks give back their recorded truth."""
    checked = 0
    for folder in ("ct_stream", "radiographs"):
        for t in load_ground_truth(SAMPLE_DIR / folder).values():
            _, lesions = lesions_from_probability((t.mask > 0).astype(np.float32), t.spacing_mm)
            by_bbox = {les.bbox: les for les in lesions}
            for g in t.lesions:
                les = by_bbox.get(g.bbox)
                if les is None:  # a border nodule whose visible part is in two pieces
                    assert g.extras.get("border")
                    continue
                assert les.centroid == pytest.approx(g.center, abs=1e-4)
                assert les.area_mm2 == pytest.approx(g.area_mm2, abs=1e-3)
                assert les.diameter_mm == pytest.approx(g.diameter_mm, abs=1e-3)
                checked += 1
    assert checked >= 24


def test_max_lesions_keeps_the_largest(caplog: pytest.LogCaptureFixture) -> None:
    prob = np.zeros((40, 200), np.float32)
    for i in range(10):  # squares of side 1..10, left to right
        prob[5 : 6 + i, 20 * i : 20 * i + 1 + i] = 1.0
    labels, lesions = lesions_from_probability(prob, (1.0, 1.0), max_lesions=3)
    assert [round(les.area_mm2) for les in lesions] == [100, 81, 64]
    assert int(labels.max()) == 3 and np.count_nonzero(labels) == 245
    assert "keeping the 3 largest" in caplog.text


def test_speckle_map_is_capped_and_stays_usable() -> None:
    prob = np.random.default_rng(0).random((512, 512), dtype=np.float32)
    labels, lesions = lesions_from_probability(prob, (0.7, 0.7), threshold=0.6, max_lesions=50)
    assert len(lesions) == 50 and int(labels.max()) == 50
    areas = [les.area_mm2 for les in lesions]
    _, every = lesions_from_probability(prob, (0.7, 0.7), threshold=0.6, max_lesions=65535)
    assert len(every) > 1000 and areas == [les.area_mm2 for les in every[:50]]
    assert all(
        int(np.count_nonzero(labels == les.label)) * 0.49 == pytest.approx(les.area_mm2)
        for les in lesions
    )


def test_json_record_round_trips() -> None:
    prob = disc((50, 50), (25, 25), 8).astype(np.float32) * 0.8
    _, (les,) = lesions_from_probability(prob, SPACING)
    rec = lesion_to_json(les)
    assert set(rec) == {"id", "bbox", "centroid", "area_mm2", "diameter_mm", "score", "rechecked"}
    assert rec["bbox"] == [17, 17, 34, 34] and rec["id"] == 1
    back = lesion_from_json(rec)
    assert back.bbox == les.bbox and back.label == les.label
    assert back.diameter_mm == pytest.approx(les.diameter_mm, abs=1e-4)
    assert back.centroid == pytest.approx(les.centroid, abs=1e-3)
    # a frame without pixel spacing: the sizes are pixels, under names that say so
    _, (px,) = lesions_from_probability(prob, None)
    rec = lesion_to_json(px, in_mm=False)
    assert rec["diameter_mm"] is None and rec["area_mm2"] is None
    assert (rec["diameter_px"], rec["area_px"]) == (round(px.diameter_mm, 4), round(px.area_mm2, 4))
    assert lesion_from_json(rec).diameter_mm == pytest.approx(px.diameter_mm, abs=1e-4)


def test_bad_arguments_name_the_argument() -> None:
    with pytest.raises(ValueError, match='"prob"'):
        lesions_from_probability(np.zeros((2, 2, 2), np.float32), None)
    with pytest.raises(ValueError, match='"rechecked_mask"'):
        lesions_from_probability(
            np.zeros((4, 4), np.float32), None, rechecked_mask=np.zeros((3, 3))
        )


def test_large_map_with_few_components() -> None:
    """Speed is measured in benchmarks, not asserted here (timings flake on CI)."""
    size = 4096
    prob = np.zeros((size, size), np.float32)
    rng = np.random.default_rng(3)
    for _ in range(10):
        r, c = (int(v) for v in rng.integers(200, size - 200, 2))
        rad = int(rng.integers(4, 120))
        win = (slice(r - rad, r + rad + 1), slice(c - rad, c + rad + 1))
        prob[win] = np.maximum(prob[win], 0.9 * disc((2 * rad + 1, 2 * rad + 1), (rad, rad), rad))
    _, lesions = lesions_from_probability(prob, (0.125, 0.125))
    assert 1 <= len(lesions) <= 10


@pytest.mark.parametrize("seed", range(6))
def test_components_match_simpleitk(seed: int) -> None:
    """scipy.ndimage labelling (medrt.analysis.components) gives SimpleITK's 8-connected
    components, numbering, boxes and size order, which the analysis used before."""
    import SimpleITK as sitk

    from medrt.analysis.components import by_size, label

    rng = np.random.default_rng(seed)
    mask = rng.random((int(rng.integers(1, 90)), int(rng.integers(1, 90)))) < rng.uniform(0.05, 0.6)
    comps = label(mask)
    ref = sitk.ConnectedComponent(sitk.GetImageFromArray(mask.astype(np.uint8)), True)
    np.testing.assert_array_equal(comps.labels, sitk.GetArrayFromImage(ref))
    stats = sitk.LabelShapeStatisticsImageFilter()
    stats.Execute(ref)
    assert len(comps) == stats.GetNumberOfLabels()
    for k in stats.GetLabels():
        x, y, w, h = stats.GetBoundingBox(k)
        assert comps.box(k) == (y, x, y + h, x + w)
        assert comps.sizes[k - 1] == stats.GetNumberOfPixels(k) == comps.mask(k).sum()
    relabel = sitk.RelabelComponentImageFilter()
    relabel.SetMinimumObjectSize(3)
    relabel.SetSortByObjectSize(True)
    want = sitk.GetArrayFromImage(relabel.Execute(ref))
    got = by_size(comps, 3)
    assert list(got.sizes) == list(relabel.GetSizeOfObjectsInPixels())
    # Equal sizes may be numbered in either order; the partition and sizes must agree.
    for k in range(1, len(got) + 1):
        assert np.unique(want[got.labels == k]).size == 1
        assert (got.labels == k).sum() == got.sizes[k - 1]
    assert ((got.labels > 0) == (want > 0)).all()


def test_scanning_only_boxes_known_to_hold_the_foreground_gives_the_same_lesions() -> None:
    """``within`` (the fine sweep's kept components) skips the whole-frame scan: boxes
    that overlap are merged, and the lesions and label map are the whole scan's."""
    prob = np.zeros((600, 700), np.float32)
    rr, cc = np.ogrid[:600, :700]
    for r, c, rad, p in [(100, 100, 20, 0.9), (125, 125, 12, 0.8), (400, 600, 40, 0.95), (590, 5, 12, 0.7)]:
        prob[(rr - r) ** 2 + (cc - c) ** 2 <= rad**2] = p
    prob[300:303, 300:303] = 0.4  # under the threshold: in no box, and not needed
    labels, lesions = lesions_from_probability(prob, (0.5, 0.5), 0.5)
    assert len(lesions) == 4
    boxes = [les.bbox for les in lesions]
    a, b = sorted(boxes)[:2]  # two separate discs whose boxes overlap
    assert a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]
    for within in (boxes, boxes[::-1], [(-5, -5, 700, 800)], [*boxes, (90, 90, 140, 150)]):
        got_labels, got = lesions_from_probability(prob, (0.5, 0.5), 0.5, within=within)
        assert got == lesions
        np.testing.assert_array_equal(got_labels, labels)
    assert lesions_from_probability(prob, (0.5, 0.5), 0.5, within=[])[1] == []
