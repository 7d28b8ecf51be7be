"""Scoring predictions against the committed phantom ground truth, and ``medrt eval``."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, SAMPLE_DIR
from medrt.analysis.lesions import lesion_to_json
from medrt.cli import main
from medrt.errors import InputError
from medrt.evaluation import (
    FramePrediction,
    bucket_of,
    evaluate,
    iter_predictions,
    iter_seg_predictions,
    load_predictions,
    proportion_interval,
)
from medrt.phantom import FrameTruth, load_ground_truth
from medrt.types import Lesion, LesionTruth


@pytest.fixture(scope="module")
def truth() -> dict[str, FrameTruth]:
    out = load_ground_truth(SAMPLE_DIR / "ct_stream")
    out.update(load_ground_truth(SAMPLE_DIR / "radiographs"))
    return out


def as_lesion(
    g: LesionTruth, shift_mm: tuple[float, float] = (0.0, 0.0), t: FrameTruth | None = None
) -> Lesion:
    dr = shift_mm[0] / t.spacing_mm[0] if t else 0.0
    dc = shift_mm[1] / t.spacing_mm[1] if t else 0.0
    return Lesion(
        label=g.label,
        bbox=g.bbox,
        centroid=(g.center[0] + dr, g.center[1] + dc),
        area_mm2=g.area_mm2,
        diameter_mm=g.diameter_mm,
        score=1.0,
        max_score=1.0,
    )


def perfect(key: str, t: FrameTruth, drop: frozenset[int] = frozenset()) -> FramePrediction:
    """The ground truth itself as a prediction, less the lesions labelled in ``drop``."""
    labels = t.mask.copy()
    labels[np.isin(labels, list(drop))] = 0
    lesions = tuple(as_lesion(g) for g in t.lesions if g.label not in drop)
    return FramePrediction(key, lesions, labels)


def test_perfect_predictions_score_perfectly(truth: dict[str, FrameTruth]) -> None:
    report = evaluate([perfect(k, t) for k, t in truth.items()], truth)
    n = sum(len(t.scored_lesions) for t in truth.values())
    assert report.gt_lesions == report.detected == n == 25
    assert report.sensitivity == 1.0 and report.false_positives == 0 and report.fp_per_frame == 0.0
    assert report.dice_mean == 1.0 and report.dice_median == 1.0 and len(report.dices) == n
    assert report.frames == 43 and report.negative_frames == 25
    assert report.specificity == 1.0 and report.frames_without_prediction == 0
    expected = {name: 0 for name in ("2-5", "5-10", "10-30")}
    for t in truth.values():
        for g in t.scored_lesions:
            expected[bucket_of(g.diameter_mm)] += 1
    assert {b.name: b.gt for b in report.buckets} == expected
    assert all(b.sensitivity == 1.0 for b in report.buckets if b.gt)
    doc = report.to_json(per_lesion=True)
    json.dumps(doc)  # serialisable
    assert doc["sensitivity"] == 1.0 and len(doc["lesions"]) == n


def test_dropping_half_the_lesions_halves_sensitivity_as_counted(
    truth: dict[str, FrameTruth],
) -> None:
    dropped: dict[str, set[int]] = {}
    n = 0
    for k, t in truth.items():
        for g in t.scored_lesions:
            if n % 2 == 0:
                dropped.setdefault(k, set()).add(g.label)
            n += 1
    preds = [perfect(k, t, frozenset(dropped.get(k, ()))) for k, t in truth.items()]
    report = evaluate(preds, truth)
    missed = sum(len(v) for v in dropped.values())
    assert report.detected == n - missed
    assert report.sensitivity == pytest.approx((n - missed) / n)
    assert report.false_positives == 0 and report.dice_mean == 1.0
    for b in report.buckets:
        in_bucket = [(m.key, m.gt_label) for m in report.matches if m.bucket == b.name]
        gone = sum(1 for k, lab in in_bucket if lab in dropped.get(k, ()))
        assert b.detected == b.gt - gone


def add_blob(
    pred: FramePrediction, t: FrameTruth, label: int, at: tuple[int, int]
) -> FramePrediction:
    r, c = at
    assert not t.mask[r - 10 : r + 13, c - 10 : c + 13].any(), "blob must be away from lesions"
    labels = pred.labels.copy()
    labels[r : r + 3, c : c + 3] = label
    blob = Lesion(label, (r, c, r + 3, c + 3), (r + 1.0, c + 1.0), 1.0, 1.0, 0.9, 0.9)
    return FramePrediction(pred.key, (*pred.lesions, blob), labels)


def test_spurious_blobs_are_false_positives(truth: dict[str, FrameTruth]) -> None:
    preds, added, touched_negative = [], 0, 0
    for i, (k, t) in enumerate(truth.items()):
        p = perfect(k, t)
        if i % 3 == 0:
            for j in range(2):
                p = add_blob(p, t, 900 + j, (20 + 40 * j, 20))  # frame corner: outside the body
            added += 2
            touched_negative += int(not t.scored_lesions)
        preds.append(p)
    report = evaluate(preds, truth)
    assert report.false_positives == added == 30
    assert report.fp_per_frame == pytest.approx(added / 43)
    assert report.sensitivity == 1.0
    assert report.negative_frames_clean == report.negative_frames - touched_negative
    assert report.specificity == pytest.approx(1 - touched_negative / report.negative_frames)


def smallest_lesion(truth: dict[str, FrameTruth]) -> tuple[str, FrameTruth, LesionTruth]:
    return min(
        ((k, t, g) for k, t in truth.items() for g in t.scored_lesions),
        key=lambda x: x[2].diameter_mm,
    )


def test_centroid_fallback_matches_within_the_documented_distance(
    truth: dict[str, FrameTruth],
) -> None:
    key, t, g = smallest_lesion(truth)
    limit = max(2.0, 0.5 * g.diameter_mm)
    assert g.diameter_mm < 4.0 and limit == 2.0
    one = {key: t}
    for shift, found in [(limit - 0.01, True), (limit + 0.01, False)]:
        for direction in [(1.0, 0.0), (0.0, -1.0), (math.sqrt(0.5), math.sqrt(0.5))]:
            offset = (shift * direction[0], shift * direction[1])
            others = tuple(as_lesion(o) for o in t.scored_lesions if o.label != g.label)
            pred = FramePrediction(key, (as_lesion(g, offset, t), *others), None)  # no masks
            report = evaluate([pred], one)
            m = next(m for m in report.matches if m.gt_label == g.label)
            assert m.detected is found, (shift, direction)
            assert report.false_positives == (0 if found else 1)
            if found:
                assert m.distance_mm == pytest.approx(shift) and m.dice is None


def test_large_lesion_fallback_distance_is_half_its_diameter(truth: dict[str, FrameTruth]) -> None:
    key, t, g = max(
        ((k, t, g) for k, t in truth.items() for g in t.scored_lesions),
        key=lambda x: x[2].diameter_mm,
    )
    limit = 0.5 * g.diameter_mm
    for shift, found in [(limit - 0.01, True), (limit + 0.01, False)]:
        pred = FramePrediction(key, tuple(as_lesion(o, (shift, 0.0), t) for o in t.scored_lesions))
        m = next(m for m in evaluate([pred], {key: t}).matches if m.gt_label == g.label)
        assert m.detected is found


def test_dice_is_measured_against_a_shifted_mask(truth: dict[str, FrameTruth]) -> None:
    key, t = next((k, t) for k, t in truth.items() if t.rows == 4096 and t.scored_lesions)
    g = max(t.scored_lesions, key=lambda g: g.area_mm2)
    gt = t.mask == g.label
    moved = np.zeros_like(gt)
    moved[:, 2:] = gt[:, :-2]  # two columns to the right
    labels = np.zeros(t.mask.shape, np.uint16)
    labels[moved] = 7
    r0, c0, r1, c1 = g.bbox
    lesion = replace(as_lesion(g), label=7, bbox=(r0, c0 + 2, r1, min(c1 + 2, t.cols)))
    report = evaluate([FramePrediction(key, (lesion,), labels)], {key: t})
    expected = 2 * np.count_nonzero(gt & moved) / (gt.sum() + moved.sum())
    m = next(m for m in report.matches if m.gt_label == g.label)
    assert m.pred_label == 7 and m.dice == pytest.approx(expected)
    assert report.dice_mean == pytest.approx(expected)


def test_ignored_lesions_are_neither_hit_nor_false_positive(truth: dict[str, FrameTruth]) -> None:
    key, t = next((k, t) for k, t in truth.items() if len(t.scored_lesions) == 1)
    g = t.scored_lesions[0]
    flagged = replace(
        t, lesions=tuple(replace(x, extras={**x.extras, "ignore": 1.0}) for x in t.lesions)
    )
    report = evaluate([perfect(key, t)], {key: flagged})
    assert report.gt_lesions == 0 and report.false_positives == 0
    assert report.ignored_predictions == 1
    assert report.negative_frames == 1 and report.specificity == 1.0
    # Without a mask the centroid rule applies to ignored lesions too.
    report = evaluate([FramePrediction(key, (as_lesion(g),))], {key: flagged})
    assert report.false_positives == 0 and report.ignored_predictions == 1
    # A prediction far from it is still a false positive.
    far = FramePrediction(key, (as_lesion(g, (30.0, 0.0), t),))
    assert evaluate([far], {key: flagged}).false_positives == 1


@pytest.mark.parametrize(
    ("diameter", "bucket"),
    [
        (1.5, "2-5"),
        (2.0, "2-5"),
        (4.999, "2-5"),
        (5.0, "5-10"),
        (9.999, "5-10"),
        (10.0, "10-30"),
        (30.0, "10-30"),
        (45.0, "10-30"),
    ],
)
def test_bucket_edges(truth: dict[str, FrameTruth], diameter: float, bucket: str) -> None:
    assert bucket_of(diameter) == bucket
    key, t = next((k, t) for k, t in truth.items() if len(t.scored_lesions) == 1)
    sized = replace(t, lesions=(replace(t.lesions[0], diameter_mm=diameter),))
    report = evaluate([FramePrediction(key)], {key: sized})
    assert {b.name: b.gt for b in report.buckets}[bucket] == 1 and report.detected == 0


def test_input_errors(truth: dict[str, FrameTruth]) -> None:
    key, t = next(iter(truth.items()))
    with pytest.raises(InputError, match="none of 1 prediction keys"):
        evaluate([FramePrediction("1.2.3")], truth)
    with pytest.raises(InputError, match="same frame"):
        evaluate([FramePrediction(key), FramePrediction(f"{key}#0")], truth)
    with pytest.raises(InputError, match="label map shape"):
        evaluate([FramePrediction(key, (), np.zeros((3, 3), np.uint16))], truth)
    report = evaluate([FramePrediction(f"{key}#0"), FramePrediction("1.2.3")], truth)
    assert report.frames_without_prediction == 42 and report.unknown_prediction_keys == 1
    assert evaluate([], truth).frames_without_prediction == 43


def write_results(
    folder: Path, truth: dict[str, FrameTruth], skip: set[str], masks_for: str
) -> None:
    """A batch-style output folder: results.jsonl for every frame not in ``skip``, and
    masks.npz for frames whose file lies in the folder named ``masks_for``."""
    folder.mkdir(parents=True, exist_ok=True)
    masks = {}
    with (folder / "results.jsonl").open("w") as fh:
        for k, t in truth.items():
            if k in skip:
                continue
            rec = {
                "sop_instance_uid": k,
                "frame_index": 0,
                "lesions": [lesion_to_json(as_lesion(g)) for g in t.lesions],
            }
            fh.write(json.dumps(rec) + "\n")
            if t.file.parent.name == masks_for:
                masks[k] = t.mask
    np.savez_compressed(folder / "masks.npz", **masks)


def test_results_folder_round_trips(tmp_path: Path, truth: dict[str, FrameTruth]) -> None:
    write_results(tmp_path, truth, set(), "ct_stream")
    preds = load_predictions(tmp_path)
    assert len(preds) == 43 and sum(p.labels is not None for p in preds) == 40
    report = evaluate(iter_predictions(tmp_path / "results.jsonl"), truth)
    assert report.sensitivity == 1.0 and report.false_positives == 0
    assert len(report.dices) == 17 and report.dice_mean == 1.0


def medrt(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "medrt", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_eval_json(tmp_path: Path, truth: dict[str, FrameTruth]) -> None:
    positive = next(k for k, t in truth.items() if len(t.scored_lesions) == 2)
    negative = [k for k, t in truth.items() if not t.lesions][:2]
    write_results(tmp_path / "run", truth, {positive, *negative}, "ct_stream")
    out = medrt("eval", str(tmp_path / "run"), str(SAMPLE_DIR), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["frames"] == 43 and doc["frames_without_prediction"] == 3
    assert doc["gt_lesions"] == 25 and doc["detected"] == 23
    assert doc["sensitivity"] == pytest.approx(23 / 25)
    assert doc["false_positives"] == 0 and doc["specificity"] == 1.0
    lo, hi = doc["sensitivity_interval"]
    assert lo < 23 / 25 < hi <= 1.0
    groups = {g["name"]: g for g in doc["groups"]}
    large = [b for b in doc["buckets"] if b["name"] in ("5-10", "10-30")]
    assert groups[">=5"]["gt"] == sum(b["gt"] for b in large) and groups["2-5"]["gt"] == doc["buckets"][0]["gt"]
    assert groups[">=5"]["detected"] == sum(b["detected"] for b in large)
    assert doc["dice"]["mean"] == 1.0 and doc["dice"]["n"] == 17 - 2 * (
        truth[positive].file.parent.name == "ct_stream"
    )


def test_cli_eval_table_and_bad_inputs(
    tmp_path: Path, truth: dict[str, FrameTruth], capsys: pytest.CaptureFixture[str]
) -> None:
    write_results(tmp_path / "run", truth, set(), "none")
    assert main(["eval", str(tmp_path / "run" / "results.jsonl"), str(SAMPLE_DIR)]) == 0
    table = capsys.readouterr().out
    assert "sensitivity" in table and "all" in table and "100.0%" in table
    assert "95% interval" in table and ">=5" in table

    assert main(["eval", str(tmp_path / "nothing"), str(SAMPLE_DIR)]) == 2
    assert "no results.jsonl" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "run"), str(tmp_path)]) == 2
    assert "no ground_truth.json" in capsys.readouterr().err

    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "results.jsonl").write_text(
        json.dumps({"sop_instance_uid": "1.2.3", "frame_index": 0, "lesions": []}) + "\n"
    )
    out = medrt("eval", str(tmp_path / "other"), str(SAMPLE_DIR))
    assert out.returncode == 2 and "matches one of the 43 ground-truth frames" in out.stderr

    (tmp_path / "other" / "results.jsonl").write_text("{not json\n")
    assert main(["eval", str(tmp_path / "other"), str(SAMPLE_DIR)]) == 2
    assert "line 1" in capsys.readouterr().err

    np.savez_compressed(tmp_path / "masks.npz", x=np.zeros((4, 4), np.uint16))  # the run's other file as PRED
    assert main(["eval", str(tmp_path / "masks.npz"), str(SAMPLE_DIR)]) == 2  # was a UnicodeDecodeError
    assert "masks.npz: bad input: not a results.jsonl (not UTF-8 text at byte" in capsys.readouterr().err
    (tmp_path / "other" / "masks.npz").write_bytes(b"PK\x03\x04 cut short")
    assert main(["eval", str(tmp_path / "other"), str(SAMPLE_DIR)]) == 2
    assert "masks.npz: bad input: the label maps cannot be read" in capsys.readouterr().err


NODULE_RGB = (0, 160, 255)  # the colour another tool's SEG recommends for its "Nodule" segment


@pytest.fixture(scope="module")
def other_tools_seg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SEG as another tool might write it, of the 40-slice CT sample: segment 1 "Lung", a
    box over most of each slice that holds the lesions, with no recommended colour, and
    segment 2 "Nodule", the ground-truth lesions, on every slice, recommended in
    :data:`NODULE_RGB` (overlapping segments, empty frames left out)."""
    import highdicom as hd
    import pydicom
    from pydicom.sr.codedict import codes

    ct = load_ground_truth(SAMPLE_DIR / "ct_stream")
    ts = sorted(ct.values(), key=lambda t: t.file.name)
    sources = [pydicom.dcmread(t.file, stop_before_pixels=True) for t in ts]
    pixels = np.zeros((len(ts), ts[0].rows, ts[0].cols, 2), bool)
    pixels[:, 64:-64, 64:-64, 0] = True
    pixels[..., 1] = np.stack([t.mask > 0 for t in ts])
    algorithm = hd.AlgorithmIdentificationSequence(name="other", family=codes.cid7162.ArtificialIntelligence,
                                                   version="1")

    def segment(n: int, label: str, kind: object) -> hd.seg.SegmentDescription:
        return hd.seg.SegmentDescription(n, label, codes.SCT.Organ if n == 1 else codes.SCT.MorphologicallyAbnormalStructure,
                                         kind, hd.seg.SegmentAlgorithmTypeValues.AUTOMATIC, algorithm,
                                         display_color=hd.color.CIELabColor.from_rgb(*NODULE_RGB) if n == 2 else None)

    seg = hd.seg.Segmentation(
        source_images=sources, pixel_array=pixels, segmentation_type=hd.seg.SegmentationTypeValues.BINARY,
        segment_descriptions=[segment(1, "Lung", codes.SCT.Lung), segment(2, "Nodule", codes.SCT.Nodule)],
        series_instance_uid=hd.UID(), series_number=50, sop_instance_uid=hd.UID(), instance_number=1,
        manufacturer="other", manufacturer_model_name="other", software_versions="1", device_serial_number="1")
    path = tmp_path_factory.mktemp("other") / "nested" / "seg.dcm"
    path.parent.mkdir()
    seg.save_as(path)
    (path.parent.parent / "notes.txt").write_text("not DICOM")  # a folder of results holds other files too
    return path


def test_another_tools_seg_is_scored_by_the_segment_asked_for(other_tools_seg: Path, truth: dict[str, FrameTruth],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    ct = {k: t for k, t in truth.items() if t.file.parent.name == "ct_stream"}
    for chosen in (["Nodule"], [2], ["nodule"]):
        report = evaluate(iter_seg_predictions(other_tools_seg, chosen), ct)
        assert report.frames == 40 and report.frames_without_prediction == 0  # empty frames read as empty
        assert report.detected == report.gt_lesions == sum(len(t.scored_lesions) for t in ct.values())
        assert report.false_positives == 0 and report.dice_mean == pytest.approx(1.0)
    # every segment: the lung box swallows the nodules, as the SEG says (so --segment matters)
    merged = evaluate(iter_seg_predictions(other_tools_seg.parent.parent), ct)
    assert merged.false_positives > 0 and merged.detected < merged.gt_lesions
    # the command: a SEG file, or a folder searched for SEGs
    assert main(["eval", str(other_tools_seg.parent.parent), str(SAMPLE_DIR / "ct_stream"),
                 "--segment", "Nodule", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["sensitivity"] == 1.0 and doc["false_positives"] == 0
    assert main(["eval", str(other_tools_seg), str(SAMPLE_DIR / "ct_stream"), "--segment", "Liver"]) == 2
    err = capsys.readouterr().err
    assert "seg.dcm" in err and "no segment 'Liver'" in err and "2 'Nodule'" in err
    assert main(["eval", str(SAMPLE_DIR / "ct_stream" / "ct_0001.dcm"), str(SAMPLE_DIR), "--seg"]) == 2
    assert "ct_0001.dcm" in (err := capsys.readouterr().err) and "not a readable DICOM SEG" in err
    empty = other_tools_seg.parent.parent.parent / "empty"
    empty.mkdir(exist_ok=True)
    assert main(["eval", str(empty), str(SAMPLE_DIR)]) == 2
    assert "no results.jsonl in it, and no DICOM SEG" in capsys.readouterr().err


def test_a_seg_read_back_keeps_each_segments_label_and_recommended_colour(
        other_tools_seg: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import pydicom

    from medrt.io.seg import read_seg

    seg = read_seg(other_tools_seg)
    assert seg.colors == {2: NODULE_RGB}  # "Lung" recommends none
    assert (seg.label_of(1), seg.label_of(2), seg.label_of(3)) == ("Lung", "Nodule", "segment 3")
    # A malformed colour is named and left out; the SEG still reads.
    ds = pydicom.dcmread(other_tools_seg)
    ds.SegmentSequence[1].RecommendedDisplayCIELabValue = [100, 200]
    bad = tmp_path / "bad_colour.dcm"
    ds.save_as(bad)
    with caplog.at_level("WARNING", logger="medrt.io.seg"):
        again = read_seg(bad)
    assert again.colors == {} and len(again.masks) == len(seg.masks)
    assert "bad_colour.dcm: segment 2 has an unusable Recommended Display CIELab Value" in caplog.text


def test_a_lesion_segmented_in_pieces_is_one_hit_and_no_false_positive(truth: dict[str, FrameTruth]) -> None:
    """Through the real component extraction: a perfect probability map of a frame whose
    border-crossing nodule's mask is in two pieces gives one hit per lesion, no FP."""
    from medrt.analysis.lesions import lesions_from_probability

    key, t = next((k, t) for k, t in truth.items() if t.file.name == "dx_0002.dcm")
    labels, lesions = lesions_from_probability((t.mask > 0).astype(np.float32), t.spacing_mm)
    assert len(lesions) > len(t.scored_lesions), "the sample has a lesion whose mask is in pieces"
    report = evaluate([FramePrediction(key, tuple(lesions), labels)], {key: t})
    assert report.sensitivity == 1.0
    assert report.false_positives == 0
    assert report.ignored_predictions == len(lesions) - len(t.scored_lesions)


def test_each_ct_lesion_counts_once_across_its_slices(truth: dict[str, FrameTruth]) -> None:
    """by_lesion: the sections of one lesion in one series are one lesion, sized by its
    longest section and found when any section is found; a radiograph's lesions are each
    one lesion already. Kept on one slice only, a CT lesion is found; dropped on every
    slice, it is missed, whatever its sections' count."""
    ct = {k: t for k, t in truth.items() if t.volume}
    assert ct and all(t.file.parent.name == "ct_stream" for t in ct.values())
    assert {t.volume for t in ct.values()} == {str(SAMPLE_DIR / "ct_stream" / "ground_truth.json")}
    assert not any(t.volume for k, t in truth.items() if k not in ct)  # radiographs
    sections: dict[int, list[tuple[str, float]]] = {}
    for k, t in sorted(ct.items(), key=lambda kv: kv[1].slice_location or 0.0):
        for g in t.scored_lesions:
            sections.setdefault(g.label, []).append((k, g.diameter_mm))
    multi = next(label for label, s in sections.items() if len(s) >= 3)  # shown on three slices or more
    other = next(label for label in sections if label != multi)
    keep = sections[multi][1][0]  # the multi-slice lesion is found on its second slice only
    drop: dict[str, set[int]] = {}
    for label, secs in sections.items():
        for k, _ in secs:
            if (label == multi and k != keep) or label == other:
                drop.setdefault(k, set()).add(label)
    report = evaluate([perfect(k, t, frozenset(drop.get(k, ()))) for k, t in truth.items()], truth)
    lesions, groups = report.by_lesion, report.lesion_groups
    assert lesions is not None and groups is not None
    n_dx = sum(len(t.scored_lesions) for k, t in truth.items() if k not in ct)
    assert sum(b.gt for b in lesions) == len(sections) + n_dx < report.gt_lesions
    assert sum(b.detected for b in lesions) == len(sections) + n_dx - 1  # only `other` is missed
    assert report.detected == report.gt_lesions - (len(sections[multi]) - 1) - len(sections[other])
    biggest = {label: max(d for _, d in secs) for label, secs in sections.items()}
    dx_sizes = [g.diameter_mm for k, t in truth.items() if k not in ct for g in t.scored_lesions]
    for b in lesions:
        assert b.gt == sum(bucket_of(d) == b.name for d in [*biggest.values(), *dx_sizes]), b.name
    assert {g.name: g.gt for g in groups} == {"2-5": lesions[0].gt, ">=5": lesions[1].gt + lesions[2].gt}
    doc = report.to_json()
    assert doc["by_lesion"]["gt_lesions"] == sum(b.gt for b in lesions)
    assert doc["by_lesion"]["groups"][1]["name"] == ">=5"
    only_dx = {k: t for k, t in truth.items() if k not in ct}
    dx_report = evaluate([perfect(k, t) for k, t in only_dx.items()], only_dx)
    assert dx_report.by_lesion is None and "by_lesion" not in dx_report.to_json()


def test_proportion_interval_is_wilsons() -> None:
    """Checked against the Wilson score formula written out, and its edges: a rate of 0
    or 1 keeps an interval on one side, and no trials give none."""
    for k, n in ((40, 43), (17, 20), (6, 11), (0, 6), (12, 12)):
        lo, hi = proportion_interval(k, n)
        z, p = 1.959963984540054, k / n
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
        assert lo == pytest.approx(centre - half, abs=1e-9) and hi == pytest.approx(centre + half, abs=1e-9)
        assert 0.0 <= lo <= p <= hi <= 1.0
    assert proportion_interval(0, 6)[0] == 0.0 and proportion_interval(0, 6)[1] > 0.3
    assert proportion_interval(12, 12)[1] == pytest.approx(1.0) and proportion_interval(12, 12)[0] < 0.8
    assert proportion_interval(0, 0) is None
    # more lesions, the same rate: a narrower interval
    small, large = proportion_interval(17, 20), proportion_interval(170, 200)
    assert large[1] - large[0] < (small[1] - small[0]) / 2


def test_the_ground_truth_of_a_multi_frame_object_keeps_every_frame(tmp_path: Path) -> None:
    """An enhanced CT holds its slices as frames of one SOP instance: its ground truth lists
    one UID with frame_index 0..n-1. Each frame was kept under the UID, so each overwrote
    the one before: ``medrt eval`` of a batch's results.jsonl stopped at "two predictions for
    the same frame", and of its SEG looked for a mask the .npz did not hold (KeyError)."""
    single = load_ground_truth(SAMPLE_DIR / "ct_stream")
    doc = json.loads((SAMPLE_DIR / "ct_stream" / "ground_truth.json").read_text())
    uid = "1.2.826.0.1.3680043.8.498.1"
    masks = {}
    for i, fr in enumerate(doc["frames"]):
        masks[f"{uid}#{i}"] = single[fr["sop_instance_uid"]].mask
        fr.update(file="enhanced.dcm", sop_instance_uid=uid, frame_index=i)
    (tmp_path / "ground_truth.json").write_text(json.dumps(doc))
    np.savez_compressed(tmp_path / "ground_truth_masks.npz", **masks)
    truth = load_ground_truth(tmp_path)
    assert len(truth) == len(single) == 40
    assert list(truth) == [uid] + [f"{uid}#{i}" for i in range(1, 40)] == [t.key for t in truth.values()]
    expected = sum(len(t.scored_lesions) for t in single.values())
    # keyed as a batch's results.jsonl keys them (frame 0 the bare UID), and as a SEG's are
    for keys in ([t.key for t in truth.values()], [f"{uid}#{i}" for i in range(40)]):
        report = evaluate([perfect(k, t) for k, t in zip(keys, truth.values(), strict=True)], truth)
        assert report.frames == 40 and report.frames_without_prediction == 0
        assert report.gt_lesions == report.detected == expected and report.dice_mean == 1.0
    doc["frames"].append(doc["frames"][5])
    (tmp_path / "ground_truth.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=f"frame 5 of {uid} is listed twice"):
        load_ground_truth(tmp_path)


def test_the_seg_of_an_enhanced_ct_is_scored_on_every_frame_as_its_results_are(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A SEG names a multi-frame source as a whole and holds frames only where a segment is
    (highdicom's default, and ``medrt batch``'s): its other frames are predicted empty, as a
    SEG of single-frame slices means. ``medrt eval --seg`` took them for frames without a
    prediction (12 of 20 on ``medrt phantom ct --enhanced``, where the results.jsonl had 0),
    stored in position order or shuffled."""
    import highdicom as hd
    import pydicom
    from pydicom.sr.codedict import codes

    from medrt.evaluation import multi_frame_counts
    from medrt.io.seg import read_seg
    from medrt.phantom.enhanced import write_enhanced_ct

    algorithm = hd.AlgorithmIdentificationSequence(name="other", family=codes.cid7162.ArtificialIntelligence,
                                                   version="1")
    nodule = hd.seg.SegmentDescription(1, "Nodule", codes.SCT.MorphologicallyAbnormalStructure, codes.SCT.Nodule,
                                       hd.seg.SegmentAlgorithmTypeValues.AUTOMATIC, algorithm)
    for shuffle in (False, True):
        gt = tmp_path / f"gt_{shuffle}"
        [path] = write_enhanced_ct(gt, seed=1, n_frames=12, size=128, compress="none", shuffle_frames=shuffle)
        truth = load_ground_truth(gt)
        ts = sorted(truth.values(), key=lambda t: t.frame_index)  # as stored
        assert 0 < sum(bool(t.lesions) for t in ts) < len(ts), "frames with lesions and without"
        seg = hd.seg.Segmentation(
            source_images=[pydicom.dcmread(path)], pixel_array=np.stack([t.mask > 0 for t in ts]),
            segmentation_type=hd.seg.SegmentationTypeValues.BINARY, segment_descriptions=[nodule],
            series_instance_uid=hd.UID(), series_number=50, sop_instance_uid=hd.UID(), instance_number=1,
            manufacturer="other", manufacturer_model_name="other", software_versions="1", device_serial_number="1")
        seg_path = tmp_path / f"seg_{shuffle}.dcm"
        seg.save_as(seg_path)
        assert int(seg.NumberOfFrames) < len(ts)  # the empty frames left out
        counts = multi_frame_counts(truth)
        assert counts == {ts[0].sop_instance_uid: len(ts)}
        masks = read_seg(seg_path, source_frames=counts).masks
        assert set(masks) == {f"{t.sop_instance_uid}#{t.frame_index}" for t in ts}
        for t in ts:
            assert np.array_equal(masks[f"{t.sop_instance_uid}#{t.frame_index}"] > 0, t.mask > 0), t.frame_index
        from_seg = evaluate(iter_seg_predictions(seg_path, None, counts), truth)
        from_results = evaluate([perfect(k, t) for k, t in truth.items()], truth)  # keyed as results.jsonl is
        for r in (from_seg, from_results):
            assert r.frames == len(ts) and r.frames_without_prediction == 0
            assert r.detected == r.gt_lesions > 0 and r.false_positives == 0
        assert [(m.key, m.gt_label) for m in from_seg.matches] == [(m.key, m.gt_label) for m in from_results.matches]
        assert from_seg.negative_frames == from_results.negative_frames == from_seg.negative_frames_clean
        # the command finds the frame counts in the ground truth
        assert main(["eval", "--seg", str(seg_path), str(gt), "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["frames"] == len(ts) and doc["frames_without_prediction"] == 0 and doc["sensitivity"] == 1.0


def test_each_kind_is_scored_on_the_predictions_of_its_own_objects(tmp_path: Path) -> None:
    """``medrt eval`` on a tree mixing an enhanced CT and radiographs reports each kind apart.
    A prediction goes to the kind of the object its key names (``UID`` or ``UID#frame``), so
    frame 0 of the CT keyed ``UID#0`` (as a SEG's frames are) is a CT frame, and one of a
    frame the ground truth lacks counts in its kind's "not in the ground truth" as in the
    pooled report: it went to no kind where the truth lacked the object's frame 0, whose bare
    UID the kind was once found by."""
    from medrt.commands.eval import by_kind, load_truth_tree
    from medrt.phantom.enhanced import write_enhanced_ct

    write_enhanced_ct(tmp_path / "ct", seed=1, n_frames=12, size=128, compress="none")
    truth = load_truth_tree([str(tmp_path / "ct"), str(SAMPLE_DIR / "radiographs")])
    ct = {k: t for k, t in truth.items() if t.kind == "ct"}
    assert len(ct) == 12 and len(truth) == 15 and any(t.lesions for t in ct.values())
    # keyed as a SEG's frames are: every frame of the multi-frame object UID#n, frame 0 too
    preds = [perfect(f"{t.sop_instance_uid}#{t.frame_index}" if t.kind == "ct" else k, t) for k, t in truth.items()]
    pooled = evaluate(preds, truth)
    parts = by_kind(lambda: preds, truth)
    assert sorted(parts) == ["CT", "radiographs"]
    assert (parts["CT"].frames, parts["radiographs"].frames) == (12, 3)
    assert parts["CT"].gt_lesions == sum(len(t.scored_lesions) for t in ct.values()) == parts["CT"].detected
    assert parts["radiographs"].gt_lesions == pooled.gt_lesions - parts["CT"].gt_lesions > 0
    for r in (pooled, *parts.values()):
        assert r.frames_without_prediction == 0 and r.unknown_prediction_keys == 0 and r.false_positives == 0
    # a ground truth without the CT's frame 0: its prediction is the CT's, not in its truth
    first = next(k for k, t in ct.items() if t.frame_index == 0)
    del truth[first]
    pooled = evaluate(preds, truth)
    parts = by_kind(lambda: preds, truth)
    assert pooled.unknown_prediction_keys == parts["CT"].unknown_prediction_keys == 1
    assert parts["radiographs"].unknown_prediction_keys == 0
    assert (parts["CT"].frames, parts["CT"].frames_without_prediction) == (11, 0)


def test_a_kind_whose_predictions_all_name_frames_its_truth_lacks_is_scored_not_refused(tmp_path: Path) -> None:
    """The pooled report matched the run, so ``by_kind`` scores a kind whose every prediction
    names a frame the ground truth lacks (its frames predicted empty, those predictions counted
    as not in the ground truth) instead of failing the whole ``medrt eval`` with "none of N
    prediction keys matches"."""
    from medrt.commands.eval import by_kind, load_truth_tree

    truth = load_truth_tree([str(SAMPLE_DIR / "radiographs"), str(SAMPLE_DIR / "ct_stream")])
    ct = {k: t for k, t in truth.items() if t.kind == "ct"}
    assert ct and len(ct) < len(truth)
    preds = [perfect(k, t) for k, t in truth.items() if t.kind != "ct"]
    # a CT prediction for a frame of a CT object the ground truth does not hold
    first = next(iter(ct.values()))
    preds.append(perfect(f"{first.sop_instance_uid}#7", first))
    pooled = evaluate(preds, truth)
    assert pooled.unknown_prediction_keys == 1
    parts = by_kind(lambda: preds, truth)
    assert parts["CT"].unknown_prediction_keys == 1
    assert parts["CT"].frames_without_prediction == len(ct) and parts["CT"].detected == 0
    assert parts["radiographs"].detected == parts["radiographs"].gt_lesions > 0
