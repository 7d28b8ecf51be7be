"""Series geometry the sample CT does not have, made from it by editing headers only (the
pixels stay): a feet-first scan, a gantry tilt, an enhanced CT whose frames are stored out
of position order. Each must give the findings of the plain series; an audit found each
changed them (the 2.5-D model's neighbours swapped or taken from elsewhere, a tilted
lesion counted once per slice)."""

from __future__ import annotations

import csv
import json
import math
import random
from collections.abc import Callable
from pathlib import Path

import pydicom
import pytest
from pydicom.uid import generate_uid

from conftest import SAMPLE_DIR
from medrt.analyzer import load_analyzer
from medrt.batch import BatchConfig, run_batch

SLICES = sorted((SAMPLE_DIR / "ct_stream").glob("*.dcm"))[8:28]  # twenty slices, lesions on several


@pytest.fixture(scope="module")
def analyzer():
    return load_analyzer(threads=1)


@pytest.fixture(scope="module")
def plain(tmp_path_factory, analyzer):
    """The twenty slices as they are (a series of their own), analysed."""
    src = _variant(tmp_path_factory.mktemp("plain"), lambda ds, i: None)
    return _run(src, analyzer)


def _variant(folder: Path, edit: Callable[[pydicom.Dataset, int], None]) -> Path:
    src = folder / "in"
    src.mkdir()
    series = generate_uid()
    for i, path in enumerate(SLICES):
        ds = pydicom.dcmread(path)
        ds.SeriesInstanceUID = series
        edit(ds, i)
        ds.save_as(src / path.name, enforce_file_format=True)
    return src


def _run(src: Path, analyzer) -> dict:  # type: ignore[no-untyped-def]
    out = src.parent / "out"
    summary = run_batch(BatchConfig(src, out), analyzer=analyzer)
    assert summary.exit_code == 0
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
    return {
        "sections": {r["sop_instance_uid"]: sorted(tuple(les["bbox"]) for les in r["lesions"]) for r in records},
        "lesions": list(csv.DictReader((out / "lesions.csv").open())),
    }


def _feet_first(ds: pydicom.Dataset, i: int) -> None:
    """As a feet-first supine scanner writes it: rows run to the patient's right, so row ×
    column points to the feet. The first pixel moves; the pixels and z positions stay."""
    ipp = [float(v) for v in ds.ImagePositionPatient]
    ipp[0] += (ds.Columns - 1) * float(ds.PixelSpacing[1])
    ds.ImagePositionPatient = ipp
    ds.ImageOrientationPatient = [-1, 0, 0, 0, 1, 0]
    ds.PatientPosition = "FFS"


def test_a_feet_first_series_gets_the_findings_of_a_head_first_one(plain, analyzer, tmp_path):
    """Row × column points to the feet on a feet-first scan: the model was given the slice
    below as the one above and found dozens of false lesions (9 lesions became 57 on the
    sample). Its neighbours now go head side first, whichever way the normal points."""
    ffs = _run(_variant(tmp_path, _feet_first), analyzer)
    assert sum(map(len, plain["sections"].values())) > 3  # lesions to find
    assert ffs["sections"] == plain["sections"]


def test_a_gantry_tilted_series_counts_each_lesion_once_with_its_volume(plain, analyzer, tmp_path):
    """A tilted gantry steps its slices along the table, so each lies a little further along
    the tilted column direction (3 mm × sin 10° ≈ 0.7 pixel): compared pixel for pixel,
    every lesion was split into its sections, none with a volume."""
    tilt = math.radians(10)

    def tilted(ds: pydicom.Dataset, i: int) -> None:
        ds.ImageOrientationPatient = [1, 0, 0, 0, round(math.cos(tilt), 6), round(math.sin(tilt), 6)]
        ds.GantryDetectorTilt = 10

    got = _run(_variant(tmp_path, tilted), analyzer)
    assert any(int(row["slices"]) > 1 for row in plain["lesions"])  # a lesion over several slices
    assert [r["slices"] for r in got["lesions"]] == [r["slices"] for r in plain["lesions"]]
    assert all(r["volume_mm3"] for r in got["lesions"])


def test_an_enhanced_ct_stored_out_of_position_order_gets_the_findings_of_a_sorted_one(analyzer, tmp_path):
    """Frame order is not slice order in an enhanced CT (legal, and what a conversion may
    give): each frame's neighbours were taken in frame order, from elsewhere in the volume."""
    import highdicom as hd

    from medrt.phantom.folders import write_ct_series

    slices = write_ct_series(tmp_path / "phantom", seed=25, n_frames=20, compress="none")  # a series the audit used

    def enhanced(folder: Path, shuffle: bool) -> Path:
        datasets = [pydicom.dcmread(p) for p in slices]
        if shuffle:
            random.Random(5).shuffle(datasets)
        src = folder / "in"
        src.mkdir(parents=True)
        hd.legacy.LegacyConvertedEnhancedCTImage(
            legacy_datasets=datasets, series_instance_uid=generate_uid(), series_number=9,
            sop_instance_uid=generate_uid(), instance_number=1,
            include_dimension_index=False,  # with one, highdicom puts the frames in order
        ).save_as(src / "ct.dcm", enforce_file_format=True)
        return src

    def findings(src: Path) -> list[tuple[str, str]]:
        return sorted((r["slices"], r["diameter_mm"]) for r in _run(src, analyzer)["lesions"])

    assert findings(enhanced(tmp_path / "shuffled", True)) == findings(enhanced(tmp_path / "sorted", False))


def test_an_enhanced_phantom_scores_as_the_single_frame_phantom_of_its_seed(analyzer, tmp_path, capsys):
    """``medrt phantom ct --enhanced`` writes the series of a seed as one multi-frame object,
    its ground truth one entry per frame (``UID#n``). ``medrt batch`` then ``medrt eval`` score
    it as they score the single-frame series of the seed: the same pixels, positions and
    lesions, so the same detections, false positives and Dice, from results.jsonl and from
    the SEG."""
    from medrt.cli import main
    from medrt.io.dicom import read_frames

    scores = {}
    for name, extra in (("enhanced", ["--enhanced"]), ("single", [])):
        src, out = tmp_path / name / "in", tmp_path / name / "out"
        assert main(["phantom", "ct", "--out", str(src), "--seed", "25", "--frames", "20", *extra]) == 0
        assert run_batch(BatchConfig(src, out), analyzer=analyzer).exit_code == 0
        capsys.readouterr()
        for seg in ([], ["--seg"]):
            assert main(["eval", str(out), str(src), "--json", *seg]) == 0
            scores[name, bool(seg)] = json.loads(capsys.readouterr().out)
    (path,) = (tmp_path / "enhanced" / "in").glob("*.dcm")
    assert len(read_frames(path)) == 20  # one object, every slice a frame
    single = scores["single", False]
    assert single["detected"] > 0 and single["dice"]["n"] > 0 and single["frames"] == 20  # lesions found
    assert scores["enhanced", False] == single
    # A SEG of a multi-frame source holds only the frames it segments: eval cannot tell the
    # others from frames it was not given (counted as predicted empty, as they are)
    for name in ("enhanced", "single"):
        scores[name, True].pop("frames_without_prediction")
    assert scores["enhanced", True] == scores["single", True]


def test_a_slice_without_its_position_costs_neither_the_series_seg_nor_its_lesion_count(plain, analyzer, tmp_path):
    """One slice lacking ImagePositionPatient (a damaged or hand-edited header) cost the whole
    series its SEG (highdicom copies the position from every source image), and split each
    lesion through that slice in two. Now the SEG covers the other slices, errors.csv names
    the one left out, the SR locates its lesion by outline, and the slice takes its place by
    InstanceNumber in the gap it leaves, so every lesion is counted once."""
    import subprocess

    import highdicom as hd

    from conftest import require_tool

    damaged = 11  # ct_0020: a section of a lesion that spans four slices
    assert plain["sections"][str(pydicom.dcmread(SLICES[damaged]).SOPInstanceUID)]

    def no_position(ds: pydicom.Dataset, i: int) -> None:
        if i == damaged:
            del ds.ImagePositionPatient

    src = _variant(tmp_path, no_position)
    out = tmp_path / "out"
    summary = run_batch(BatchConfig(src, out), analyzer=analyzer)
    assert summary.exit_code == 1  # errors.csv has a row
    rows = list(csv.DictReader((out / "errors.csv").open()))
    assert [(r["file"], r["kind"], r["stage"]) for r in rows] == [(SLICES[damaged].name, "error", "seg-coverage")]
    assert "ImagePositionPatient" in rows[0]["reason"] and "in the SR" in rows[0]["reason"]
    got = list(csv.DictReader((out / "lesions.csv").open()))
    assert [r["slices"] for r in got] == [r["slices"] for r in plain["lesions"]]
    folder = next((out / "series").iterdir())
    seg = hd.seg.segread(folder / "seg.dcm")
    sources = {str(ref.ReferencedSOPInstanceUID) for ref in seg.ReferencedSeriesSequence[0].ReferencedInstanceSequence}
    lacking = str(pydicom.dcmread(src / SLICES[damaged].name).SOPInstanceUID)
    assert lacking not in sources and len(sources) == len(SLICES) - 1
    tool = require_tool("dciodvfy")
    for path in (folder / "seg.dcm", folder / "sr.dcm"):
        proc = subprocess.run([tool, str(path)], capture_output=True, text=True, timeout=120)
        assert "Error" not in proc.stdout + proc.stderr, path.name
    report = hd.sr.srread(folder / "sr.dcm")
    regions = report.content.get_planar_roi_measurement_groups()
    on_damaged = [g for g in regions if g.roi is not None
                  and str(g.roi.ContentSequence[0].ReferencedSOPSequence[0].ReferencedSOPInstanceUID) == lacking]
    assert on_damaged and all(g.referenced_segmentation_frame is None for g in on_damaged)
    assert len(regions) == sum(map(len, plain["sections"].values()))


def test_a_series_of_two_whole_acquisitions_gets_the_findings_of_one_for_each(plain, analyzer, tmp_path):
    """A pre- and a post-contrast pass stored in one series (the same positions, each its own
    AcquisitionNumber): the second pass alone was analysed and the first listed as skipped
    duplicates. Now each pass gets the findings of the single pass, its own SEG, its
    lesions marked with its acquisition; the SR covers both and stays dciodvfy-clean."""
    import subprocess

    import highdicom as hd

    from conftest import require_tool

    src = _variant(tmp_path, lambda ds, i: setattr(ds, "AcquisitionNumber", 1))
    twin: dict[str, str] = {}  # the second pass's SOPInstanceUID -> the first's
    for path in sorted(src.glob("*.dcm")):
        ds = pydicom.dcmread(path)
        first = str(ds.SOPInstanceUID)
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
        ds.AcquisitionNumber, ds.InstanceNumber = 2, int(ds.InstanceNumber) + 100
        ds.save_as(src / f"post_{path.name}", enforce_file_format=True)
        twin[str(ds.SOPInstanceUID)] = first
    got = _run(src, analyzer)
    out = tmp_path / "out"
    assert not list(csv.DictReader((out / "errors.csv").open()))  # nothing skipped
    assert {uid: got["sections"][uid] for uid in plain["sections"]} == plain["sections"]
    assert {first: got["sections"][uid] for uid, first in twin.items()} == plain["sections"]

    def findings(rows: list[dict], acquisition: str) -> list[tuple[str, str]]:
        return [(r["slices"], r["diameter_mm"]) for r in rows if r["acquisition"] == acquisition]

    assert len(got["lesions"]) == 2 * len(plain["lesions"])
    assert findings(got["lesions"], "1") == findings(got["lesions"], "2") == findings(plain["lesions"], "")
    report = json.loads((out / "report.json").read_text())
    (series,) = report["series"]
    n = len(plain["lesions"])
    assert series["acquisitions"] == 2 and series["lesions_by_acquisition"] == {"1": n, "2": n}
    assert "2 acquisitions" in (out / "report.md").read_text()

    folder = next((out / "series").iterdir())
    segs = sorted(folder.glob("seg_*.dcm"))
    assert [p.name for p in segs] == ["seg_1.dcm", "seg_2.dcm"]
    covered = []
    for path in segs:
        seg = hd.seg.segread(path)
        covered.append({str(ref.ReferencedSOPInstanceUID)
                        for ref in seg.ReferencedSeriesSequence[0].ReferencedInstanceSequence})
    assert covered == [set(plain["sections"]), set(twin)]
    tool = require_tool("dciodvfy")
    for path in (*segs, folder / "sr.dcm"):
        proc = subprocess.run([tool, str(path)], capture_output=True, text=True, timeout=120)
        assert "Error" not in proc.stdout + proc.stderr, path.name
    regions = hd.sr.srread(folder / "sr.dcm").content.get_planar_roi_measurement_groups()
    assert len(regions) == 2 * sum(map(len, plain["sections"].values()))
