"""SEG, SR and SC export on real DICOM: phantom series written to disk and read back,
a bundled multi-frame ultrasound, a legacy-converted multi-frame CT, and the real
analyzer on the committed CT sample. Every object written is checked by dciodvfy
and read back with highdicom."""

from __future__ import annotations

import copy
import dataclasses
import os
import subprocess
import warnings
from pathlib import Path

import highdicom as hd
import numpy as np
import pydicom
import pytest
from pydicom.dataset import Dataset
from pydicom.sr.codedict import codes

import medrt
from conftest import pydicom_test_dir, require_tool
from medrt.analysis.tracking import link_series
from medrt.bench.outputs import TRUTH_MODELS as MODELS
from medrt.bench.outputs import truth_result
from medrt.export import (
    ExportError,
    build_sc,
    build_sc_series,
    build_seg,
    build_sr,
    plan_segs,
    seg_frame_numbers,
    seg_left_out,
    segment_numbers,
    split_for_seg,
    write_dataset,
)
from medrt.export.common import algorithm_parts, frame_number
from medrt.export.sc import patient_orientation
from medrt.export.sr import CALIBRATION_METHOD
from medrt.io.dicom import read_frames
from medrt.overlay import render
from medrt.phantom import load_ground_truth, write_ct_series, write_radiographs
from medrt.types import (
    Frame,
    FrameResult,
    Geometry,
    SourceRef,
    SpacingSource,
    StageTimings,
    Window,
)

CT_SEED, DX_SEED = 11, 5


# --------------------------------------------------------------------------- helpers


def dciodvfy(ds: Dataset, path: Path) -> Path:
    """Write ``ds`` with write_dataset and assert dciodvfy reports no error."""
    tool = require_tool("dciodvfy")
    write_dataset(ds, path)
    proc = subprocess.run([tool, str(path)], capture_output=True, text=True, timeout=120)
    lines = (proc.stdout + proc.stderr).splitlines()
    errors = [ln for ln in lines if "Error" in ln]
    for ln in lines:
        if "Warning" in ln:
            print(f"dciodvfy {path.name}: {ln}")  # shown with -s: warnings are allowed, but read them
    assert not errors, f"dciodvfy {path.name}:\n" + "\n".join(errors)
    return path


def seg_labels(seg: hd.seg.Segmentation, frame: Frame) -> np.ndarray:
    """The segment numbers of ``seg`` on the source frame (0: none), read back through highdicom."""
    if frame.source.number_of_frames > 1:
        arr = seg.get_pixels_by_source_frame(frame.sop_instance_uid, [frame.frame_index + 1],
                                             combine_segments=True, assert_missing_frames_are_empty=True)
    else:
        arr = seg.get_pixels_by_source_instance([frame.sop_instance_uid], combine_segments=True,
                                                assert_missing_frames_are_empty=True)
    return arr[0]


def check_seg_round_trip(path: Path, results: list[FrameResult], all_results: list[FrameResult] | None = None,
                         ) -> hd.seg.Segmentation:
    """Each series lesion of ``results`` (numbered in ``all_results``, the whole series) is
    one segment, "Lesion <n>" with the lesion's Tracking UID and exactly its pixels."""
    back = hd.seg.segread(path)
    lesions, numbers = link_series(all_results or results)
    present = sorted({numbers[(r.frame.key, les.label)] for r in results for les in r.lesions})
    segments = {int(d.SegmentNumber): d for d in back.SegmentSequence}
    assert sorted(segments) == list(range(1, len(present) + 1))
    segment_of = {}
    for k, n in enumerate(present, start=1):
        d = segments[k]
        assert (d.SegmentLabel, d.TrackingID, d.TrackingUID) == (f"Lesion {n}", f"Lesion {n}", lesions[n - 1].uid)
        assert d.SegmentedPropertyTypeCodeSequence[0].CodeValue == codes.SCT.Lesion.value
        assert len(d.RecommendedDisplayCIELabValue) == 3
        segment_of[n] = k
    for r in results:
        got = seg_labels(back, r.frame)
        want = np.zeros_like(got)
        for les in r.lesions:
            want[r.labels == les.label] = segment_of[numbers[(r.frame.key, les.label)]]
        assert np.array_equal(got, want), f"SEG segments differ on {r.frame.key}"
    return back


def check_identity(ds: Dataset, results: list[FrameResult]) -> None:
    assert ds.Manufacturer == "medrt" and ds.ManufacturerModelName == "medrt"
    assert ds.SoftwareVersions == medrt.__version__
    assert ds.StudyInstanceUID == results[0].frame.study_instance_uid
    assert ds.SeriesInstanceUID not in {r.frame.series_instance_uid for r in results}


def check_sr(path: Path, results: list[FrameResult], seg: Dataset | list[Dataset] | None) -> None:
    """One planar group per lesion section with its values, referencing its SEG frame (or a
    box), numbered as its series lesion; one volume group per CT lesion; the count."""
    sr = hd.sr.srread(path)
    groups = sr.content.get_planar_roi_measurement_groups()
    lesions, numbers = link_series(results)
    expected = {(r.frame.sop_instance_uid, frame_number(r.frame), round(les.area_mm2, 3)): (r, les)
                for r in results for les in r.lesions}
    assert len(groups) == len(expected) == len(numbers)
    segs = [] if seg is None else [seg] if isinstance(seg, Dataset) else seg
    segment = {uid: (s.SOPInstanceUID, k) for s in segs for uid, k in segment_numbers(s).items()}
    frames = {(uid, at, s.SOPInstanceUID, k): n for s in segs for (uid, at, k), n in seg_frame_numbers(s).items()}
    for g in groups:
        (area,) = g.get_measurements(name=codes.SCT.Area)
        (diameter,) = g.get_measurements(name=codes.SCT.LongAxis)
        source = (g.referenced_segmentation_frame[1] if segs else g.roi.ContentSequence[0]).ReferencedSOPSequence[0]
        at = int(source.ReferencedFrameNumber) if "ReferencedFrameNumber" in source else None
        r, les = expected.pop((source.ReferencedSOPInstanceUID, at, round(area.value, 3)))
        n = numbers[(r.frame.key, les.label)]
        assert g.tracking_identifier == f"Lesion {n}" and g.tracking_uid == lesions[n - 1].uid
        mm = r.frame.spacing_mm is not None
        assert area.value == pytest.approx(les.area_mm2, rel=1e-6)
        assert diameter.value == pytest.approx(les.diameter_mm, rel=1e-6)
        assert area.unit.value == ("mm2" if mm else "{pixels}")
        assert diameter.unit.value == ("mm" if mm else "{pixels}")
        number = r.frame.frame_index + 1 if r.frame.source.number_of_frames > 1 else None
        if segs:
            ref = g.referenced_segmentation_frame
            assert ref is not None
            item = ref[0].ReferencedSOPSequence[0]
            sop, k = segment[lesions[n - 1].uid]  # the lesion's own segment
            assert item.ReferencedSOPInstanceUID == sop
            assert int(item.ReferencedFrameNumber) == frames[(r.frame.sop_instance_uid, number, sop, k)]
            src = ref[1].ReferencedSOPSequence[0]
            assert src.ReferencedSOPInstanceUID == r.frame.sop_instance_uid
        else:
            roi = g.roi
            assert roi is not None
            r0, c0, r1, c1 = les.bbox
            data = roi.value
            assert data.min(axis=0).tolist() == [c0, r0] and data.max(axis=0).tolist() == [c1, r1]
            src = roi.ContentSequence[0].ReferencedSOPSequence[0]
            assert src.ReferencedSOPInstanceUID == r.frame.sop_instance_uid
        if number is not None:
            assert int(src.ReferencedFrameNumber) == number
    assert not expected
    image_groups = {g.tracking_identifier: g for g in sr.content.get_image_measurement_groups()}
    summary = image_groups.pop("Lesion count")
    volumetric = {g.tracking_identifier: g for g in sr.content.get_volumetric_roi_measurement_groups()}
    volumes = [les for les in lesions if les.volume_mm3 is not None]
    # with a SEG a CT lesion's volume group (TID 1411) is on its segment, else (TID 1501) on its images
    assert sorted(volumetric if segs else image_groups) == sorted(f"Lesion {les.number}" for les in volumes)
    assert not (image_groups if segs else volumetric)
    for les in volumes:
        g = (volumetric if segs else image_groups)[f"Lesion {les.number}"]
        (volume,) = g.get_measurements(name=codes.SCT.Volume)
        (longest,) = g.get_measurements(name=codes.SCT.LongAxis)
        assert g.tracking_uid == les.uid and volume.unit.value == "mm3"
        assert volume.value == pytest.approx(les.volume_mm3, rel=1e-6)
        assert longest.value == pytest.approx(les.diameter_mm, rel=1e-6)
        if segs:
            ref = g.referenced_segment
            assert (ref.referenced_sop_instance_uid, ref.referenced_segment_numbers) == \
                (segment[les.uid][0], [segment[les.uid][1]])
            images = [i.referenced_sop_instance_uid for i in ref.source_images_for_segmentation]
        else:
            images = [s.referenced_sop_instance_uid for s in g.source_images]
        assert images == [s.sop_instance_uid for s in les.sections]
    (count,) = summary.get_measurements(name=codes.SCT.NumberOfLesions)
    assert count.value == len(lesions) <= sum(len(r.lesions) for r in results)
    evaluated = {(s.referenced_sop_instance_uid, f) for s in summary.source_images
                 for f in (s.referenced_frame_numbers or [None])}
    assert evaluated == {(r.frame.sop_instance_uid, r.frame.frame_index + 1
                          if r.frame.source.number_of_frames > 1 else None) for r in results}
    evidence = {i.ReferencedSOPInstanceUID
                for s in sr.CurrentRequestedProcedureEvidenceSequence
                for se in s.ReferencedSeriesSequence for i in se.ReferencedSOPSequence}
    assert {r.frame.sop_instance_uid for r in results} <= evidence
    assert {s.SOPInstanceUID for s in segs} <= evidence


def image_library(path: Path) -> dict[str, bool]:
    """The SR's Image Library (TID 1600, DCM 111028): ``{SOPInstanceUID: whether its entry
    has descriptors}``; an empty dict when there is no library."""
    found: dict[str, bool] = {}
    for item in pydicom.dcmread(path).ContentSequence:
        if item.ConceptNameCodeSequence[0].CodeValue == "111028":
            for group in item.ContentSequence:
                for entry in group.ContentSequence:
                    if entry.ValueType == "IMAGE":
                        uid = entry.ReferencedSOPSequence[0].ReferencedSOPInstanceUID
                        found[uid] = len(entry.get("ContentSequence", [])) > 0
    return found


def check_image_library(path: Path, results: list[FrameResult], described: bool = True) -> None:
    """Every evaluated image has an entry, with descriptors (geometry, spacing) exactly
    when it holds a lesion (``described``: when highdicom can describe the header)."""
    with_lesions = {r.frame.sop_instance_uid for r in results if r.lesions}
    assert image_library(path) == {r.frame.sop_instance_uid: described and r.frame.sop_instance_uid in with_lesions
                                   for r in results}


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def ct(tmp_path_factory: pytest.TempPathFactory) -> list[FrameResult]:
    """A 12-slice 256² CT phantom (RLE) read back from disk: slices 8-11 hold lesions."""
    folder = tmp_path_factory.mktemp("ct")
    paths = write_ct_series(folder, CT_SEED, n_frames=12, size=256, compress="rle")
    truth = load_ground_truth(folder)
    results = [truth_result(f, truth[f.sop_instance_uid].mask) for p in paths for f in read_frames(p)]
    assert any(r.lesions for r in results) and not all(r.lesions for r in results)
    return results


@pytest.fixture(scope="module")
def dx(tmp_path_factory: pytest.TempPathFactory) -> list[FrameResult]:
    """Two 1024² chest radiographs (no patient geometry, ImagerPixelSpacing): the second is
    stored MONOCHROME1 and has a nodule across the image border."""
    folder = tmp_path_factory.mktemp("dx")
    paths = write_radiographs(folder, DX_SEED, count=2, size=1024, compress="none")
    truth = load_ground_truth(folder)
    results = [truth_result(f, truth[f.sop_instance_uid].mask) for p in paths for f in read_frames(p)]
    assert [r.frame.photometric for r in results] == ["MONOCHROME2", "MONOCHROME1"]
    assert all(r.frame.geometry is None and r.lesions for r in results)
    assert all(r.frame.spacing_source == SpacingSource.IMAGER_PIXEL_SPACING for r in results)
    return results


# --------------------------------------------------------------------------- CT series


@pytest.mark.parametrize("omit", [None, False, True], ids=["default", "all-frames", "omit-empty"])
def test_ct_series_seg_and_sr_pass_dciodvfy_and_round_trip(ct, tmp_path, omit) -> None:  # type: ignore[no-untyped-def]
    before = [copy.deepcopy(r.frame.source.dataset) for r in ct]
    seg = build_seg(ct, omit_empty_frames=omit)
    assert seg is not None
    check_identity(seg, ct)
    assert seg.SeriesNumber == 9001 and seg.SOPClassUID == pydicom.uid.SegmentationStorage
    assert seg.SegmentationType == "BINARY"
    lesions, numbers = link_series(ct)
    assert len(seg.SegmentSequence) == len(lesions) > 1
    on = {(r.frame.key, numbers[(r.frame.key, les.label)]) for r in ct for les in r.lesions}
    # several segments: by default only each lesion's own frames, not every image once per lesion
    assert int(seg.NumberOfFrames) == (len(ct) * len(lesions) if omit is False else len(on))
    for segment in seg.SegmentSequence:
        assert segment.SegmentedPropertyCategoryCodeSequence[0].CodeValue == \
            codes.SCT.MorphologicallyAbnormalStructure.value
        assert segment.SegmentAlgorithmType == "AUTOMATIC"
        algo = segment.SegmentationAlgorithmIdentificationSequence[0]
        assert algo.AlgorithmName == "roi_classifier+lesion_unet_lite"
        assert algo.AlgorithmFamilyCodeSequence[0].CodeValue == \
            codes.cid7162.ArtificialIntelligence.value
    path = dciodvfy(seg, tmp_path / "seg.dcm")
    check_seg_round_trip(path, ct)

    sr = build_sr(ct, seg=seg)
    check_identity(sr, ct)
    assert any(les.slices > 1 for les in link_series(ct)[0])  # so lesions counted once and volumes are checked
    check_sr(dciodvfy(sr, tmp_path / "sr.dcm"), ct, seg)
    check_image_library(tmp_path / "sr.dcm", ct)
    build_sc(ct[-1])
    # The headers are shared by every frame of an object: the builders must not touch them.
    assert all(r.frame.source.dataset == b for r, b in zip(ct, before, strict=True))


def test_ct_sr_without_seg_references_lesion_boxes(ct, tmp_path) -> None:  # type: ignore[no-untyped-def]
    sr = build_sr(ct)
    check_sr(dciodvfy(sr, tmp_path / "sr.dcm"), ct, None)


def test_the_sr_is_made_without_a_copy_of_its_content_tree(ct, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """highdicom's SR constructor deep-copies the content it is given and parses the copy
    back: two items per evaluated image, 0.8 s of a 500-slice series' 1.2 s SR. build_sr gives
    it the report's root alone and then the tree itself. The document is what highdicom
    makes of the whole report, element for element, and its ``content`` is the whole tree."""
    import highdicom.sr.sop as sop

    copied: list[int] = []
    deepcopy = sop.deepcopy

    def items(ds: Dataset) -> int:
        return sum(1 + items(child) for child in ds.get("ContentSequence", ()))

    def counted(value, *args):  # type: ignore[no-untyped-def]
        if isinstance(value, Dataset):
            copied.append(items(value))
        return deepcopy(value, *args)

    seg = build_seg(ct)
    monkeypatch.setattr(sop, "deepcopy", counted)
    sr = build_sr(ct, seg=seg, sop_instance_uid="1.2.826.0.1.3680043.10.999.1",
                  series_instance_uid="1.2.826.0.1.3680043.10.999.2")
    assert copied and sum(copied) < len(ct), f"highdicom copied {sum(copied)} content items of {items(sr)}"
    monkeypatch.setattr(sop, "deepcopy", deepcopy)
    check_sr(dciodvfy(sr, tmp_path / "sr.dcm"), ct, seg)
    # the same document as highdicom's constructor makes of the whole report
    root = Dataset()
    for keyword in ("ValueType", "ConceptNameCodeSequence", "ContinuityOfContent", "ContentTemplateSequence",
                    "ContentSequence"):
        root.add(copy.deepcopy(sr[keyword]))
    whole = hd.sr.Comprehensive3DSR(
        evidence=[r.frame.source.dataset for r in ct] + [seg], content=root,
        series_instance_uid=sr.SeriesInstanceUID, series_number=int(sr.SeriesNumber),
        sop_instance_uid=sr.SOPInstanceUID, instance_number=int(sr.InstanceNumber), manufacturer=sr.Manufacturer,
        manufacturer_model_name=sr.ManufacturerModelName, software_versions=sr.SoftwareVersions,
        device_serial_number=sr.DeviceSerialNumber, series_description=sr.SeriesDescription, is_complete=True)
    stamps = {"ContentDate", "ContentTime", "InstanceCreationDate", "InstanceCreationTime", "SeriesDate",
              "SeriesTime", "ContributionDateTime"}
    for ds in (sr, whole):
        for elem in list(ds.iterall()):
            if elem.keyword in stamps:
                elem.value = ""
    assert sorted(sr.keys()) == sorted(whole.keys())
    for keyword in ("ContentSequence", "CurrentRequestedProcedureEvidenceSequence", "ContentTemplateSequence",
                    "ConceptNameCodeSequence", "ContributingEquipmentSequence"):
        assert sr[keyword] == whole[keyword], keyword
    assert len(sr.content) == 1 and items(sr.content[0]) == items(sr) > 2 * len(ct)
    assert sr.content[0].ContentSequence == sr.ContentSequence


def test_ct_sc_burns_in_the_rendered_overlay(ct, tmp_path) -> None:  # type: ignore[no-untyped-def]
    lesion_frames = [r for r in ct if r.lesions]
    scs = build_sc_series(lesion_frames[:2])
    assert len({sc.SeriesInstanceUID for sc in scs}) == 1
    assert [sc.InstanceNumber for sc in scs] == [1, 2]
    for i, (sc, r) in enumerate(zip(scs, lesion_frames, strict=False)):
        check_identity(sc, ct)
        back = pydicom.dcmread(dciodvfy(sc, tmp_path / f"sc{i}.dcm"))
        assert back.BurnedInAnnotation == "YES"
        assert back.PatientOrientation == ["L", "P"]  # axial, IOP 1\0\0\0\1\0
        assert [float(v) for v in back.PixelSpacing] == pytest.approx(r.frame.spacing_mm)
        assert back.SourceImageSequence[0].ReferencedSOPInstanceUID == r.frame.sop_instance_uid
        assert np.array_equal(back.pixel_array, render(r))


# --------------------------------------------------------------------------- radiographs


def test_radiographs_seg_sr_sc_without_patient_geometry(dx, tmp_path) -> None:  # type: ignore[no-untyped-def]
    for i, r in enumerate(dx):
        seg = build_seg([r])
        assert seg is not None and "FrameOfReferenceUID" not in seg
        assert list(seg.PatientOrientation) == list(r.frame.source.dataset.PatientOrientation)
        check_seg_round_trip(dciodvfy(seg, tmp_path / f"seg{i}.dcm"), [r])
        check_sr(dciodvfy(build_sr([r], seg=seg), tmp_path / f"sr{i}.dcm"), [r], seg)
        check_image_library(tmp_path / f"sr{i}.dcm", [r])  # a group without a Frame of Reference
        sc = pydicom.dcmread(dciodvfy(build_sc(r), tmp_path / f"sc{i}.dcm"))
        assert "PixelSpacing" not in sc  # ImagerPixelSpacing is not patient-plane spacing
        assert np.array_equal(sc.pixel_array, render(r))
    # MONOCHROME1: the SC shows display semantics (lungs dark), like the MONOCHROME2 one.
    mono1 = render(dx[1], labels=False)[..., 0].astype(float)
    mono2 = render(dx[0], labels=False)[..., 0].astype(float)
    assert abs(mono1.mean() - mono2.mean()) < 40


def test_an_sr_without_a_seg_outlines_each_lesion_not_its_box(ct, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Without a SEG the SR places each lesion by an image region: its bounding box enclosed
    1.3-1.5 times the area the SR reports, so a viewer measuring the region disagreed. It is
    now the lesion's outline along its pixels' edges: the area it encloses is the pixel count."""
    from medrt.export.sr import outline

    results = [r for r in ct if r.lesions]
    path = dciodvfy(build_sr(results), tmp_path / "sr.dcm")

    def scoords(item):  # type: ignore[no-untyped-def]
        for child in item.get("ContentSequence", []):
            if child.ValueType == "SCOORD":
                yield child
            yield from scoords(child)

    found = list(scoords(pydicom.dcmread(path)))
    assert len(found) == sum(len(r.lesions) for r in results)
    pixels = sorted(int(np.count_nonzero(r.labels == les.label)) for r in results for les in r.lesions)
    areas = []
    for item in found:
        xy = np.asarray(item.GraphicData, dtype=float).reshape(-1, 2)
        assert item.GraphicType == "POLYLINE" and np.array_equal(xy[0], xy[-1])  # closed
        areas.append(round(abs(np.sum(xy[:-1, 0] * xy[1:, 1] - xy[1:, 0] * xy[:-1, 1])) / 2))
    assert sorted(areas) == pixels
    # a region of two parts touching at a corner, or with a hole, has no single outline
    corner = np.zeros((4, 4), bool)
    corner[0, 0] = corner[1, 1] = True
    ring = np.ones((5, 5), bool)
    ring[2, 2] = False
    assert outline(corner) is None and outline(ring) is None


def test_a_radiograph_with_pixel_spacing_gets_a_seg_highdicom_reads_back(dx, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Many DX/CR vendors write PixelSpacing beside ImagerPixelSpacing: highdicom copied it
    into the SEG's shared Pixel Measures without a SliceThickness, and its own reader (so
    ``medrt eval --seg`` and the viewer) refused the SEG, dciodvfy clean as it was."""
    from medrt.io.seg import read_seg

    r = dx[0]
    header = copy.deepcopy(r.frame.source.dataset)
    header.PixelSpacing = list(header.ImagerPixelSpacing)
    frame = dataclasses.replace(r.frame, source=dataclasses.replace(r.frame.source, dataset=header))
    r = dataclasses.replace(r, frame=frame)
    seg = build_seg([r])
    assert seg is not None
    path = dciodvfy(seg, tmp_path / "seg.dcm")
    check_seg_round_trip(path, [r])  # highdicom's segread
    assert np.array_equal(read_seg(path).masks[r.frame.sop_instance_uid] > 0, r.labels > 0)


def _header_edited(r: FrameResult, edit) -> FrameResult:  # type: ignore[no-untyped-def]
    """``r`` with ``edit`` applied to a deep copy of its header (the pixels and geometry stay)."""
    header = copy.deepcopy(r.frame.source.dataset)
    edit(header)
    return dataclasses.replace(r, frame=dataclasses.replace(
        r.frame, source=dataclasses.replace(r.frame.source, dataset=header)))


def _no_thickness(header: Dataset, spacing: str | None = None) -> None:
    """SliceThickness empty (Type 2 in the CT Image module), SpacingBetweenSlices ``spacing``
    or absent: as some anonymisers and older scanners write a CT."""
    header.SliceThickness = None
    header.pop("SpacingBetweenSlices", None)
    if spacing is not None:
        header.SpacingBetweenSlices = spacing


def pixel_measures(path: Path) -> Dataset:
    return pydicom.dcmread(path).SharedFunctionalGroupsSequence[0].PixelMeasuresSequence[0]


def library_thickness(path: Path) -> dict[str, float | None]:
    """``{SOP Instance UID: its Slice Thickness descriptor}`` for the Image Library entries of
    the SR at ``path`` that carry descriptors (TID 1602), None where one lacks it."""
    sr = pydicom.dcmread(path)
    (library,) = [item for item in sr.ContentSequence
                  if item.ConceptNameCodeSequence[0].CodeValue == codes.DCM.ImageLibrary.value]
    out: dict[str, float | None] = {}
    for group in library.ContentSequence:
        for entry in group.ContentSequence:
            if entry.ValueType != "IMAGE" or "ContentSequence" not in entry:
                continue
            found = [float(d.MeasuredValueSequence[0].NumericValue) for d in entry.ContentSequence
                     if d.ConceptNameCodeSequence[0].CodeValue == codes.DCM.SliceThickness.value]
            out[str(entry.ReferencedSOPSequence[0].ReferencedSOPInstanceUID)] = found[0] if found else None
    return out


def test_a_ct_whose_slices_leave_slice_thickness_empty_gets_a_seg_with_it_inferred(ct, tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    """SliceThickness is Type 2 in the CT Image module: a series with it empty on every
    slice is legal, but the SEG's Pixel Measures need one (Type 1C). Such a series got no
    SEG (before that, one dciodvfy refused). Now the SEG carries SpacingBetweenSlices where
    the slices give one, else the step between their positions (the phantom's 3 mm), says
    so in the log with the series UID, passes dciodvfy and reads back; the SR does too."""
    import logging

    from medrt.export import inferred_slice_thickness

    assert {float(r.frame.source.dataset.SliceThickness) for r in ct} == {3.0}
    for spacing, source, mm in ((None, "slice positions", 3.0), ("2.5", "SpacingBetweenSlices", 2.5)):
        blank = [_header_edited(r, lambda h, s=spacing: _no_thickness(h, s)) for r in ct]
        assert inferred_slice_thickness(blank) == (mm, source, "empty")
        assert split_for_seg(blank) == [blank]  # no slice is "damaged" where none has a thickness
        with caplog.at_level(logging.WARNING, logger="medrt.export.seg"):
            seg = build_seg(blank)
        assert seg is not None
        assert any(ct[0].frame.series_instance_uid in m and f"{mm:g} mm, inferred from {source}" in m
                   for m in caplog.messages)
        path = dciodvfy(seg, tmp_path / f"seg_{source[:5]}.dcm")
        measures = pixel_measures(path)
        assert float(measures.SliceThickness) == mm
        assert [float(v) for v in measures.PixelSpacing] == list(ct[0].frame.spacing_mm)
        check_seg_round_trip(path, blank)  # highdicom's segread
        sr_path = dciodvfy(build_sr(blank, seg=seg), tmp_path / f"sr_{source[:5]}.dcm")
        check_sr(sr_path, blank, seg)
        # the lesions' slices are described in the SR's Image Library, with the SEG's thickness
        # (they had no descriptors at all: highdicom's need a SliceThickness), with or without a SEG
        described = {r.frame.sop_instance_uid for r in blank if r.lesions}
        assert library_thickness(sr_path) == dict.fromkeys(described, mm)
        no_seg = dciodvfy(build_sr(blank), tmp_path / f"sr_noseg_{source[:5]}.dcm")
        assert library_thickness(no_seg) == dict.fromkeys(described, mm)
        assert not any("SliceThickness" in r.frame.source.dataset and r.frame.source.dataset.SliceThickness
                       for r in blank)  # the source headers are not edited
    # an image with its own thickness: nothing inferred, the SEG carries the source's
    assert inferred_slice_thickness(ct) is None
    assert set(library_thickness(dciodvfy(build_sr(ct), tmp_path / "sr.dcm")).values()) == {3.0}
    assert float(pixel_measures(dciodvfy(build_seg(ct), tmp_path / "seg.dcm")).SliceThickness) == 3.0


def test_no_slice_thickness_to_infer_still_means_no_seg_and_says_why(ct) -> None:  # type: ignore[no-untyped-def]
    """A lone slice without SliceThickness or SpacingBetweenSlices has no step to measure,
    and slices around a missing one are no regular stack: no SEG, and the error says why."""
    from medrt.export import inferred_slice_thickness

    blank = [_header_edited(r, _no_thickness) for r in ct]
    lone = [next(r for r in blank if r.lesions)]
    assert inferred_slice_thickness(lone) is None
    with pytest.raises(ExportError, match="no SliceThickness and none can be inferred.*a lone slice"):
        build_seg(lone)
    with_spacing = [_header_edited(lone[0], lambda h: _no_thickness(h, "3"))]
    assert inferred_slice_thickness(with_spacing) == (3.0, "SpacingBetweenSlices", "empty")
    assert build_seg(with_spacing) is not None
    gap = blank[:5] + blank[6:]  # the sixth slice missing: steps of 3 and 6 mm
    assert inferred_slice_thickness(gap) is None
    with pytest.raises(ExportError, match="none can be inferred.*not a regular stack"):
        build_seg(gap)


@pytest.mark.parametrize(("kind", "description"), [("FIDUCIAL", "Ruler at the patient's skin"), ("GEOMETRY", ""),
                                                   ("", "Against a 25 mm sphere"), ("", "")])
def test_a_calibrated_radiographs_sc_keeps_its_pixel_spacing_and_how(dx, tmp_path, kind, description) -> None:  # type: ignore[no-untyped-def]
    """A radiograph's PixelSpacing calibrated at the modality (GEOMETRY) or against an object
    of known size (FIDUCIAL, or a description of how) is in the patient: the SC carries it
    with its calibration type and a description (the SC Image module's Basic Pixel Spacing
    Calibration Macro: dciodvfy wants both or neither); one whose calibration the
    header does not give is not carried."""
    from medrt.io.header import pixel_spacing

    r = dx[0]
    header = copy.deepcopy(r.frame.source.dataset)
    mm = tuple(v / 1.1 for v in r.frame.spacing_mm)
    header.PixelSpacing = [f"{v:.6f}" for v in mm]
    if kind:
        header.PixelSpacingCalibrationType = kind
    if description:
        header.PixelSpacingCalibrationDescription = description
    source = {"FIDUCIAL": SpacingSource.CALIBRATED, "GEOMETRY": SpacingSource.GEOMETRY}.get(
        kind, SpacingSource.CALIBRATED if description else SpacingSource.UNKNOWN_CALIBRATION)
    assert pixel_spacing(header) == (tuple(float(v) for v in header.PixelSpacing), source)
    frame = dataclasses.replace(r.frame, spacing_mm=tuple(float(v) for v in header.PixelSpacing),
                                spacing_source=source, source=dataclasses.replace(r.frame.source, dataset=header))
    sc = pydicom.dcmread(dciodvfy(build_sc(dataclasses.replace(r, frame=frame)), tmp_path / "sc.dcm"))
    if kind or description:
        assert [float(v) for v in sc.PixelSpacing] == pytest.approx(mm, rel=1e-5)
        assert sc.get("PixelSpacingCalibrationType", "") == kind
        # the macro has the description if and only if it has the type
        assert sc.get("PixelSpacingCalibrationDescription", "") == (
            (description or f"As calibrated in the source image ({kind})") if kind else "")
    else:
        assert "PixelSpacing" not in sc and "PixelSpacingCalibrationType" not in sc


def measured_at(path: Path) -> list[tuple[str, str | None, tuple[float, ...]]]:
    """Each mm or pixel measurement of the SR's planar groups (TID 300 under TID 1410) as
    ``(name, Calibration Method code "SCHEME:value" or None, the pixel spacing it was
    inferred from: (horizontal, vertical), or ())``, read back through highdicom."""
    out = []
    for g in hd.sr.srread(path).content.get_planar_roi_measurement_groups():
        for name in (codes.SCT.Area, codes.SCT.LongAxis):
            (m,) = g.get_measurements(name=name)
            method = [i for i in m[0].ContentSequence
                      if i.ConceptNameCodeSequence[0].CodeValue == CALIBRATION_METHOD.value]
            assert len(method) <= 1 and all(i.RelationshipType == "HAS CONCEPT MOD" for i in method)
            code = method[0].ConceptCodeSequence[0] if method else None
            spacing = {i.ConceptNameCodeSequence[0].CodeValue: float(i.MeasuredValueSequence[0].NumericValue)
                       for i in m[0].ContentSequence if i.RelationshipType == "INFERRED FROM" and i.ValueType == "NUM"}
            for i in m[0].ContentSequence:
                if i.RelationshipType == "INFERRED FROM" and i.ValueType == "NUM":
                    assert i.MeasuredValueSequence[0].MeasurementUnitsCodeSequence[0].CodeValue == "mm/{pixel}"
            out.append((name.meaning, f"{code.CodingSchemeDesignator}:{code.CodeValue}" if code else None,
                        tuple(spacing[k] for k in ("111026", "111066") if k in spacing)))
    return out


def library_spacing(path: Path) -> set[tuple[float, float]]:
    """The (horizontal, vertical) Pixel Spacing of each described Image Library entry (TID 1602)."""
    found = set()
    for item in pydicom.dcmread(path).ContentSequence:
        if item.ConceptNameCodeSequence[0].CodeValue == "111028":
            for group in item.ContentSequence:
                for entry in group.ContentSequence:
                    values = {d.ConceptNameCodeSequence[0].CodeValue: float(d.MeasuredValueSequence[0].NumericValue)
                              for d in entry.get("ContentSequence", []) if d.ValueType == "NUM"}
                    if "111026" in values:
                        found.add((values["111026"], values["111066"]))
    return found


@pytest.mark.parametrize(("case", "edit", "source", "method"), [
    ("detector", {}, SpacingSource.IMAGER_PIXEL_SPACING, "SCT:260413007"),  # None: at the detector
    ("ermf", {"EstimatedRadiographicMagnificationFactor": "1.15"}, SpacingSource.ERMF, "DCM:122487"),
    ("fiducial", {"PixelSpacingCalibrationType": "FIDUCIAL", "PixelSpacingCalibrationDescription": "Ruler"},
     SpacingSource.CALIBRATED, "DCM:122488"),  # Calibration Object Used
    ("geometry", {"PixelSpacingCalibrationType": "GEOMETRY"}, SpacingSource.GEOMETRY, "DCM:122487"),
    ("described", {"PixelSpacingCalibrationDescription": "Against a 25 mm sphere"}, SpacingSource.CALIBRATED,
     "SCT:261665006"),  # Unknown: calibrated, but not by a type PS3.3 defines
    ("unknown", {"PixelSpacingCalibrationType": None}, SpacingSource.UNKNOWN_CALIBRATION, "SCT:261665006"),
], ids=["detector", "ermf", "fiducial", "geometry", "described", "unknown"])
def test_a_radiographs_sr_says_where_its_sizes_were_measured(dx, tmp_path, case, edit, source, method) -> None:  # type: ignore[no-untyped-def]
    """A radiograph's sizes are at the detector plane (ImagerPixelSpacing, 10-20 % larger
    than in the patient for a chest PA), or at the patient plane by its ERMF or a calibrated
    PixelSpacing: each mm value in the SR carries a Calibration Method (DCM 122422: CID 3452,
    or SCT None / Unknown) and the pixel spacing it used, while the Image Library keeps the
    ImagerPixelSpacing (Horizontal/Vertical Pixel Spacing are at the image receptor for
    projection radiography). dciodvfy clean; highdicom reads it back."""
    from medrt.io.header import pixel_spacing

    r = dx[0]
    header = copy.deepcopy(r.frame.source.dataset)
    imager = tuple(float(v) for v in header.ImagerPixelSpacing)
    if case in ("fiducial", "geometry", "described", "unknown"):
        header.PixelSpacing = [f"{v / 1.1:.6f}" for v in imager]
    for key, value in edit.items():
        if value is not None:
            setattr(header, key, value)
    spacing, found = pixel_spacing(header)
    assert found == source
    frame = dataclasses.replace(r.frame, spacing_mm=spacing, spacing_source=source,
                                source=dataclasses.replace(r.frame.source, dataset=header))
    result = truth_result(frame, r.labels > 0)
    path = dciodvfy(build_sr([result]), tmp_path / f"sr_{case}.dcm")
    check_sr(path, [result], None)  # sizes measured with the corrected spacing, as lesions.csv
    hd.sr.Comprehensive3DSR.from_dataset(pydicom.dcmread(path))
    got = measured_at(path)
    assert len(got) == 2 * len(result.lesions) > 0
    assert {m for _, m, _ in got} == {method}
    for _, _, used in got:  # DS: 16 characters
        assert used == pytest.approx((spacing[1], spacing[0]), rel=1e-12)
    assert library_spacing(path) == {(imager[1], imager[0])}  # the header's, at the detector


def test_ct_and_pixel_sized_srs_say_nothing_of_calibration(ct, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Sizes in the patient (CT PixelSpacing) or in pixels have no Calibration Method or
    spacing items: the CT SR stays as it was."""
    path = dciodvfy(build_sr(ct), tmp_path / "sr.dcm")
    assert {(m, s) for _, m, s in measured_at(path)} == {(None, ())}
    r = next(r for r in ct if r.lesions)
    pixels = dataclasses.replace(r, frame=dataclasses.replace(r.frame, spacing_mm=None,
                                                              spacing_source=SpacingSource.NONE))
    assert {(m, s) for _, m, s in measured_at(dciodvfy(build_sr([pixels]), tmp_path / "px.dcm"))} == {(None, ())}


def test_a_jpeg2000_seg_is_the_same_seg_far_smaller(dx, ct, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """--seg-compression jpeg2000: JPEG 2000 Lossless, the one compressed syntax a BINARY
    SEG may use; the same segments and pixels, valid, and a radiograph's a fraction of the size."""
    for name, results in (("dx", [dx[1]]), ("ct", ct)):
        plain, small = (build_seg(results, compression=c) for c in ("none", "jpeg2000"))
        assert plain is not None and small is not None
        assert small.file_meta.TransferSyntaxUID == pydicom.uid.JPEG2000Lossless
        path = dciodvfy(small, tmp_path / f"{name}_j2k.dcm")
        check_seg_round_trip(path, results)
        size = path.stat().st_size
        full = dciodvfy(plain, tmp_path / f"{name}.dcm").stat().st_size
        assert size < full / 4, (name, size, full)
        assert np.array_equal(pydicom.dcmread(path).pixel_array, pydicom.dcmread(tmp_path / f"{name}.dcm").pixel_array)
    with pytest.raises(ValueError, match='"compression"'):
        build_seg(ct, compression="rle")
    # OpenJPEG encodes nothing under 32 pixels each way: such a SEG is written uncompressed.
    tiny = pydicom.dcmread(pydicom_test_dir() / "rtdose_1frame.dcm")  # 10×10, in patient space
    tiny.SOPClassUID = tiny.file_meta.MediaStorageSOPClassUID = pydicom.uid.CTImageStorage
    tiny.Modality, tiny.SliceThickness = "CT", 2.0  # as a CT slice has it
    # its own UIDs: pydicom's file has made-up roots, which dciodvfy 2026 calls errors where the SEG references them
    tiny.SOPInstanceUID = tiny.file_meta.MediaStorageSOPInstanceUID = pydicom.uid.generate_uid()
    tiny.FrameOfReferenceUID = pydicom.uid.generate_uid()
    tiny.save_as(tmp_path / "tiny.dcm")
    (frame,) = read_frames(tmp_path / "tiny.dcm")
    mask = np.zeros(frame.shape, np.uint8)
    mask[2:6, 3:7] = 1
    seg = build_seg([truth_result(frame, mask)], compression="jpeg2000")
    assert seg is not None and seg.file_meta.TransferSyntaxUID == pydicom.uid.ExplicitVRLittleEndian
    check_seg_round_trip(dciodvfy(seg, tmp_path / "tiny_seg.dcm"), [truth_result(frame, mask)])


def _moved(r: FrameResult, study: str, series: str, sop: str | None = None) -> FrameResult:
    """``r`` with its header (a deep copy) moved into another study and series (and given
    another SOP Instance UID)."""
    f = r.frame
    sop = sop or f.sop_instance_uid
    ds = copy.deepcopy(f.source.dataset)
    ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.SOPInstanceUID = study, series, sop
    frame = Frame(pixels=f.pixels, spacing_mm=f.spacing_mm, spacing_source=f.spacing_source,
                  window=f.window, photometric=f.photometric, sop_class_uid=f.sop_class_uid,
                  sop_instance_uid=sop, series_instance_uid=series,
                  study_instance_uid=study, frame_of_reference_uid=f.frame_of_reference_uid,
                  modality=f.modality, frame_index=f.frame_index,
                  source=SourceRef(ds, f.source.path, f.source.transfer_syntax_uid,
                                   f.source.number_of_frames),
                  geometry=f.geometry, inverted=f.inverted)
    return FrameResult(frame=frame, lesions=r.lesions, labels=r.labels, presence=r.presence,
                       proposals=r.proposals, crops=r.crops, mode=r.mode, timings=r.timings,
                       backend=r.backend, precision=r.precision, models=r.models)


def test_two_view_radiograph_series_gets_one_seg_per_image(dx, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Without patient geometry highdicom relates a SEG to one image only: split_for_seg
    cuts the series, and the SR references both SEGs."""
    pa, lateral = dx[0], _moved(dx[1], dx[0].frame.study_instance_uid,
                                dx[0].frame.series_instance_uid)
    with pytest.raises(ExportError, match='"results"'):
        build_seg([pa, lateral])
    groups = split_for_seg([pa, lateral])
    assert [[r.frame.key for r in g] for g in groups] == [[pa.frame.key], [lateral.frame.key]]
    linked = link_series([pa, lateral])  # the lateral view's lesions keep their series numbers
    lateral_numbers = sorted({linked[1][(lateral.frame.key, les.label)] for les in lateral.lesions})
    assert lateral_numbers and lateral_numbers[0] > 1  # so numbering its SEG alone would differ
    segs = [build_seg(g, linked=linked) for g in groups]
    for i, (g, seg) in enumerate(zip(groups, segs, strict=True)):
        check_seg_round_trip(dciodvfy(seg, tmp_path / f"seg{i}.dcm"), g, [pa, lateral])
    sr = build_sr([pa, lateral], seg=segs, linked=linked)
    check_sr(dciodvfy(sr, tmp_path / "sr.dcm"), [pa, lateral], segs)
    assert split_for_seg(dx[:1]) == [dx[:1]]


# --------------------------------------------------------------------------- multi-frame


@pytest.fixture(scope="module")
def enhanced_ct(ct, tmp_path_factory) -> list[FrameResult]:  # type: ignore[no-untyped-def]
    """The CT phantom as one Legacy Converted Enhanced CT (multi-frame, with geometry)."""
    folder = tmp_path_factory.mktemp("enhanced")
    datasets = [pydicom.dcmread(r.frame.source.path) for r in ct]
    mf = hd.legacy.LegacyConvertedEnhancedCTImage(
        datasets, series_instance_uid=hd.UID(), series_number=2, sop_instance_uid=hd.UID(),
        instance_number=1)
    path = folder / "enhanced.dcm"
    mf.save_as(path, enforce_file_format=True)
    by_z = {round(r.frame.geometry.position[2], 3): r.labels for r in ct}
    frames = read_frames(path)
    assert len(frames) == len(ct) and frames[0].number_of_frames == len(ct)
    return [truth_result(f, by_z[round(f.geometry.position[2], 3)]) for f in frames]


def test_multi_frame_source_seg_and_sr_reference_frames(enhanced_ct, tmp_path) -> None:  # type: ignore[no-untyped-def]
    seg = build_seg(enhanced_ct)
    assert seg is not None
    check_seg_round_trip(dciodvfy(seg, tmp_path / "seg.dcm"), enhanced_ct)
    # medrt's own reader (the viewer's SEG overlay, eval of SEGs): a frame number alone is one IS
    from medrt.io.seg import read_seg

    masks = read_seg(tmp_path / "seg.dcm").masks
    uid = enhanced_ct[0].frame.sop_instance_uid
    for r in enhanced_ct:
        key = f"{uid}#{r.frame.frame_index}"
        assert np.array_equal(masks[key] > 0, r.labels > 0) if r.lesions else key not in masks or not masks[key].any()
    check_sr(dciodvfy(build_sr(enhanced_ct, seg=seg), tmp_path / "sr.dcm"), enhanced_ct, seg)
    # one entry for the one object; highdicom cannot describe an enhanced header's planes
    check_image_library(tmp_path / "sr.dcm", enhanced_ct[:1], described=False)
    r = next(r for r in enhanced_ct if r.lesions)
    sc = pydicom.dcmread(dciodvfy(build_sc(r), tmp_path / "sc.dcm"))
    assert sc.SourceImageSequence[0].ReferencedFrameNumber == r.frame.frame_index + 1
    # the frame's anatomy (Frame Anatomy: abdomen, unpaired), not an empty Laterality, which
    # dciodvfy warns is only for a body part not known
    anatomy = r.frame.source.dataset.SharedFunctionalGroupsSequence[0].FrameAnatomySequence[0]
    assert sc.ImageLaterality == anatomy.FrameLaterality == "U" and "Laterality" not in sc
    assert sc.AnatomicRegionSequence[0].CodeValue == anatomy.AnatomicRegionSequence[0].CodeValue
    with pytest.raises(ValueError, match='"results" must cover every frame'):
        build_seg(enhanced_ct[:-1])


def _pixel_measures_edited(enhanced: list[FrameResult], path: Path,
                           measures: dict[int, tuple[str | None, str | None]], *, shared: bool) -> list[FrameResult]:
    """``enhanced`` (the :func:`enhanced_ct` results) written again to ``path`` with frame ``i``'s
    own Pixel Measures ``measures[i]`` (PixelSpacing, SliceThickness; None for none), the
    shared ones kept or taken away (``shared``), and read back, each frame with its old labels:
    as a scanner that writes Pixel Measures per frame, or a damaged one, would."""
    ds = pydicom.dcmread(enhanced[0].frame.source.path)
    for i, (spacing, thickness) in measures.items():
        pm = Dataset()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pydicom's own about a NaN DS: the damage wanted
            if spacing is not None:
                pm.PixelSpacing = spacing.split("\\")
            if thickness is not None:
                pm.SliceThickness = thickness
        ds.PerFrameFunctionalGroupsSequence[i].PixelMeasuresSequence = [pm]
    if not shared:
        del ds.SharedFunctionalGroupsSequence[0].PixelMeasuresSequence
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.save_as(path, enforce_file_format=True)
    labels = {r.frame.frame_index: r for r in enhanced}
    return [dataclasses.replace(labels[f.frame_index], frame=f) for f in read_frames(path)]


def _kept_frames(seg: Dataset) -> list[int]:
    """The source frame numbers the SEG's frames derive from."""
    return sorted({number for (_, number, _) in seg_frame_numbers(seg)})


def test_per_frame_pixel_measures_alone_give_a_seg(enhanced_ct, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A scanner that writes each frame's Pixel Measures and no shared ones (many enhanced
    MR, some CT): highdicom 0.28 reads the shared ones only, and the series' SEG was an
    AttributeError ("'Dataset' object has no attribute 'PixelMeasuresSequence'"). Now the
    frames' common Pixel Measures are the SEG's; it passes dciodvfy and reads back."""
    good = pixel_measures(enhanced_ct[0].frame.source.path)
    spacing, thickness = "\\".join(str(v) for v in good.PixelSpacing), str(good.SliceThickness)
    results = _pixel_measures_edited(enhanced_ct, tmp_path / "own.dcm",
                                     {i: (spacing, thickness) for i in range(len(enhanced_ct))}, shared=False)
    assert split_for_seg(results) == [results]
    seg = build_seg(results, omit_empty_frames=False)
    assert seg is not None
    path = dciodvfy(seg, tmp_path / "seg.dcm")
    check_seg_round_trip(path, results)  # highdicom's segread
    measures = pixel_measures(path)
    assert [float(v) for v in measures.PixelSpacing] == [float(v) for v in good.PixelSpacing]
    assert float(measures.SliceThickness) == float(good.SliceThickness)
    assert _kept_frames(seg) == list(range(1, len(results) + 1))
    # the source header is not changed
    assert "PixelMeasuresSequence" not in results[0].frame.source.dataset.SharedFunctionalGroupsSequence[0]


def test_frames_whose_own_pixel_measures_are_rejected_are_left_out_of_the_seg(  # type: ignore[no-untyped-def]
        enhanced_ct, tmp_path, caplog) -> None:
    """Good shared Pixel Measures overridden on some frames by values medrt does not take
    (0, NaN, 1e300, a negative or a one-value PixelSpacing, a NaN SliceThickness): the SEG
    claimed the shared spacing for those frames too. Now they are left out of it, as a
    single-frame slice that bad is left out of its series' SEG, with a reason that names the
    frame; the SEG of the others passes dciodvfy and reads back, and the SR places a lesion
    on a left-out frame by its outline. Frames with only their own Pixel Measures, the same."""
    good = pixel_measures(enhanced_ct[0].frame.source.path)
    spacing, thickness = "\\".join(str(v) for v in good.PixelSpacing), str(good.SliceThickness)
    lesion = next(r.frame.frame_index for r in enhanced_ct if r.lesions)
    empty = [r.frame.frame_index for r in enhanced_ct if not r.lesions]
    bad = {lesion: ("0\\0", thickness), empty[0]: ("NaN\\NaN", thickness), empty[1]: ("1e300\\1e300", thickness),
           empty[2]: ("-0.5\\-0.5", thickness), empty[3]: ("0.7", thickness), empty[4]: (spacing, "NaN")}
    n = len(enhanced_ct)
    for shared in (True, False):
        own = {i: bad.get(i, (spacing, thickness)) for i in range(n)} if not shared else bad
        results = _pixel_measures_edited(enhanced_ct, tmp_path / f"bad_{shared}.dcm", own, shared=shared)
        with caplog.at_level("WARNING", logger="medrt.export.seg"):
            (group,) = split_for_seg(results)
        left_out = sorted(set(r.frame.frame_index for r in results) - {r.frame.frame_index for r in group})
        assert left_out == sorted(bad)
        uid = results[0].frame.sop_instance_uid
        reason = seg_left_out(results)[f"{uid}#{lesion}"]
        assert reason.startswith(f"frame {lesion + 1} of {n} of this multi-frame image has no PixelSpacing in its "
                                 "Pixel Measures (its PixelSpacing cannot be a length in mm)"), reason
        assert f"while the other {n - len(bad)} frame(s) carry them" in reason
        assert f"{uid}#{empty[4]} left out: frame {empty[4] + 1} of {n}" in caplog.text
        assert "no SliceThickness" in seg_left_out(results)[f"{uid}#{empty[4]}"]
        with pytest.raises(ExportError, match=rf"frames .* of {n} of \S*bad_{shared}\.dcm have no "
                                              "PixelSpacing or SliceThickness a SEG can use"):
            build_seg(results)  # the whole object: those frames cannot be placed
        seg = build_seg(group, linked=link_series(results), omit_empty_frames=False)
        assert seg is not None
        path = dciodvfy(seg, tmp_path / f"seg_{shared}.dcm")
        check_seg_round_trip(path, group, results)
        assert _kept_frames(seg) == [i + 1 for i in range(n) if i not in bad]
        assert [float(v) for v in pixel_measures(path).PixelSpacing] == [float(v) for v in good.PixelSpacing]
        sr = dciodvfy(build_sr(results, seg=seg, plan=plan_segs(results, warn=False)), tmp_path / f"sr_{shared}.dcm")
        outlined, in_seg = [], []
        for g in hd.sr.srread(sr).content.get_planar_roi_measurement_groups():
            ref = g.referenced_segmentation_frame
            if ref is None:  # the left-out frame's lesion: its outline on that frame
                outlined.append(int(g.roi.ContentSequence[0].ReferencedSOPSequence[0].ReferencedFrameNumber))
            else:
                in_seg.append(int(ref[1].ReferencedSOPSequence[0].ReferencedFrameNumber))
        assert outlined == [lesion + 1] * len(next(r for r in results if r.frame.frame_index == lesion).lesions)
        assert sorted(in_seg) == sorted(r.frame.frame_index + 1 for r in group for _ in r.lesions)


def test_a_frames_own_pixel_measures_lacking_what_the_shared_give_take_the_shared_value(  # type: ignore[no-untyped-def]
        enhanced_ct, tmp_path) -> None:
    """Pixel Measures both shared and per frame, a frame's own item without the PixelSpacing
    (or the SliceThickness) the shared one gives, as some conversions write them: the frame was
    read without a spacing (its sizes in pixels) and left out of the SEG, the lesion on it
    placed by its outline only. A reader such as OHIF takes the shared value; now medrt does
    too, attribute by attribute, for the reading and the SEG alike: every frame is kept, and
    the SEG carries the measures the frames were measured with (it passes dciodvfy)."""
    good = pixel_measures(enhanced_ct[0].frame.source.path)
    spacing, thickness = "\\".join(str(v) for v in good.PixelSpacing), str(good.SliceThickness)
    lesion = next(r.frame.frame_index for r in enhanced_ct if r.lesions)
    empty = next(r.frame.frame_index for r in enhanced_ct if not r.lesions)
    results = _pixel_measures_edited(enhanced_ct, tmp_path / "gaps.dcm",
                                     {lesion: (None, thickness), empty: (spacing, None)}, shared=True)
    expected = (float(good.PixelSpacing[0]), float(good.PixelSpacing[1]))
    assert {r.frame.spacing_mm for r in results} == {expected}
    assert seg_left_out(results) == {} and split_for_seg(results) == [results]
    seg = build_seg(results, omit_empty_frames=False)
    assert seg is not None
    path = dciodvfy(seg, tmp_path / "seg.dcm")
    check_seg_round_trip(path, results)
    assert _kept_frames(seg) == list(range(1, len(results) + 1))
    measures = pixel_measures(path)
    assert tuple(float(v) for v in measures.PixelSpacing) == expected
    assert float(measures.SliceThickness) == float(good.SliceThickness)
    # every frame's own item without SliceThickness: the shared one is the SEG's, not one
    # inferred from the slice positions (as where no Pixel Measures give one)
    results = _pixel_measures_edited(enhanced_ct, tmp_path / "thin.dcm",
                                     {i: (spacing, None) for i in range(len(enhanced_ct))}, shared=True)
    assert plan_segs(results).thickness == {}
    seg = build_seg(results)
    assert seg is not None
    assert float(pixel_measures(dciodvfy(seg, tmp_path / "thin_seg.dcm")).SliceThickness) == float(
        good.SliceThickness)


def test_frames_of_different_spacings_get_no_seg_and_the_error_names_them(  # type: ignore[no-untyped-def]
        enhanced_ct, tmp_path) -> None:
    """Where the frames' own Pixel Measures really differ, one SEG's shared Pixel Measures
    would be wrong for some of them: no SEG, and the error names the file, each spacing and
    its frames (not a raw AttributeError)."""
    n = len(enhanced_ct)
    own = {i: ("0.5\\0.5" if i < 4 else "0.7\\0.7", "3") for i in range(n)}
    results = _pixel_measures_edited(enhanced_ct, tmp_path / "mixed.dcm", own, shared=False)
    assert split_for_seg(results) == [results]
    with pytest.raises(ExportError) as caught:
        build_seg(results)
    text = str(caught.value)
    assert str(tmp_path / "mixed.dcm") in text
    assert f"PixelSpacing 0.5\\0.5, SliceThickness 3 on frames 1, 2, 3, 4 of {n}" in text
    assert f"PixelSpacing 0.7\\0.7, SliceThickness 3 on frames 5, 6, 7, 8, 9, 10 and 2 more of {n}" in text
    # no frame with a spacing a SEG can carry: no SEG either, and the error says so
    zero = _pixel_measures_edited(enhanced_ct, tmp_path / "zero.dcm", {i: ("0\\0", "3") for i in range(n)},
                                  shared=False)
    assert split_for_seg(zero) == [zero]
    with pytest.raises(ExportError, match=r"zero\.dcm has a Frame of Reference UID but no frame with PixelSpacing "
                                          r"in its Pixel Measures \(absent, or not a length in mm\)"):
        build_seg(zero)


def test_frames_without_slice_thickness_get_a_seg_with_it_inferred(enhanced_ct, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Every frame's Pixel Measures without SliceThickness: as for single-frame slices that
    all leave theirs empty, the SEG's is inferred from the step between the frames."""
    from medrt.export import inferred_slice_thickness

    good = pixel_measures(enhanced_ct[0].frame.source.path)
    spacing = "\\".join(str(v) for v in good.PixelSpacing)
    results = _pixel_measures_edited(enhanced_ct, tmp_path / "thin.dcm",
                                     {i: (spacing, None) for i in range(len(enhanced_ct))}, shared=False)
    inferred = inferred_slice_thickness(results)
    assert inferred is not None and inferred[:2] == (3.0, "slice positions")
    assert plan_segs(results).thickness == {results[0].frame.sop_instance_uid: inferred}
    seg = build_seg(results)
    assert seg is not None
    path = dciodvfy(seg, tmp_path / "seg.dcm")
    check_seg_round_trip(path, results)
    assert float(pixel_measures(path).SliceThickness) == 3.0


@pytest.mark.filterwarnings("ignore:The string \"PLA\":UserWarning")  # the bundled file's name
def test_multi_frame_ultrasound_gets_sr_and_sc_but_no_seg(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A bundled 30-frame US cine: no Frame of Reference, no pixel spacing."""
    frames = read_frames(pydicom_test_dir() / "examples_ybr_color.dcm")
    assert len(frames) > 1 and frames[0].spacing_mm is None
    results = []
    for f in frames:
        mask = np.zeros(f.shape, np.uint8)
        if f.frame_index in (3, 7):
            mask[50:80, 60:100] = 1
        results.append(truth_result(f, mask))
    with pytest.raises(ExportError, match="Frame of Reference"):
        build_seg(results)
    check_sr(dciodvfy(build_sr(results), tmp_path / "sr.dcm"), results, None)  # sizes in pixels
    sc = pydicom.dcmread(dciodvfy(build_sc(results[3]), tmp_path / "sc.dcm"))
    assert sc.SourceImageSequence[0].ReferencedFrameNumber == 4
    assert np.array_equal(sc.pixel_array, render(results[3]))


# --------------------------------------------------------------------------- no lesions


def test_no_lesion_gives_no_seg_and_an_sr_that_says_zero(ct, tmp_path) -> None:  # type: ignore[no-untyped-def]
    empty = [r for r in ct if not r.lesions]
    assert build_seg(empty) is None
    path = dciodvfy(build_sr(empty), tmp_path / "sr.dcm")
    check_sr(path, empty, None)
    sr = hd.sr.srread(path)
    assert sr.content.get_planar_roi_measurement_groups() == []
    check_image_library(path, empty)  # every slice listed as evaluated, none described


# --------------------------------------------------------------------------- real analyzer


def test_real_analyzer_on_sample_ct_exports_seg_sr_sc(sample_dir, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from medrt.analyzer import load_analyzer

    truth = load_ground_truth(sample_dir / "ct_stream")

    def clear(t):  # type: ignore[no-untyped-def]
        return max([les.diameter_mm for les in t.scored_lesions if 40 <= abs(les.contrast) <= 200],
                   default=0.0)

    picks = sorted(truth.values(), key=lambda t: (-clear(t), t.file.name))[:3]
    analyzer = load_analyzer(seg_model="lesion_unet_lite", warmup_shapes=((512, 512),))
    results = [analyzer.analyze(read_frames(t.file)[0]) for t in picks]
    # the models that ran: a CT slice fits in one crop, so auto runs it whole, without a classifier
    assert all(r.models == (analyzer.seg.spec.ident,) and r.mode == "full" for r in results)
    seg = build_seg(results)
    assert seg is not None, "the analyzer found no lesion on the three clearest slices"
    back = check_seg_round_trip(dciodvfy(seg, tmp_path / "seg.dcm"), results)
    for t, r in zip(picks, results, strict=True):
        got = seg_labels(back, r.frame) > 0
        hit = np.count_nonzero(got & (t.mask > 0))
        assert hit >= 0.5 * np.count_nonzero(t.mask), f"{t.file.name}: SEG misses the lesion"
    check_sr(dciodvfy(build_sr(results, seg=seg), tmp_path / "sr.dcm"), results, seg)
    dciodvfy(build_sc(results[0]), tmp_path / "sc.dcm")


# --------------------------------------------------------------------------- bad arguments


def _headerless(r: FrameResult) -> FrameResult:
    f = r.frame
    frame = Frame(pixels=f.pixels, spacing_mm=f.spacing_mm, spacing_source=f.spacing_source,
                  window=Window(0, 400), photometric="MONOCHROME2", sop_class_uid="",
                  sop_instance_uid="x", series_instance_uid="", study_instance_uid="",
                  frame_of_reference_uid=None, modality="CT", frame_index=0,
                  source=SourceRef(Dataset()))
    return FrameResult(frame=frame, lesions=r.lesions, labels=r.labels, presence=1.0, proposals=(),
                       crops=(), mode="full", timings=StageTimings(), backend="truth",
                       precision="fp32", models=MODELS)


def test_bad_arguments_raise_value_errors_naming_them(ct, dx, tmp_path) -> None:  # type: ignore[no-untyped-def]
    lesion = next(r for r in ct if r.lesions)
    for builder in (build_seg, build_sr, build_sc_series):
        with pytest.raises(ValueError, match='"results".*at least one'):
            builder([])
        with pytest.raises(ValueError, match='"results".*more than once'):
            builder([lesion, lesion])
        with pytest.raises(ValueError, match='"results".*no DICOM header'):
            builder([_headerless(lesion)])
        with pytest.raises(ValueError, match='"results".*one study'):
            builder([lesion, dx[0]])
        with pytest.raises(TypeError, match='"results"'):
            builder(lesion)  # type: ignore[arg-type]
    assert split_for_seg(ct) == [ct]
    other_series = _moved(ct[1], ct[1].frame.study_instance_uid, hd.UID())
    for builder in (build_seg, split_for_seg, build_sc_series):
        with pytest.raises(ValueError, match='"results".*one series'):
            builder([ct[0], other_series])
    with pytest.raises(ExportError, match='"results".*same plane'):
        build_seg([lesion, _moved(lesion, lesion.frame.study_instance_uid,
                                  lesion.frame.series_instance_uid, hd.UID())])
    with pytest.raises(ValueError, match='"results".*one set of models'):
        build_seg([ct[0], truth_result(ct[1].frame, ct[1].labels, models=("other@2",))])
    with pytest.raises(ValueError, match='"series_number"'):
        build_seg(ct, series_number=0)
    others = [r for r in ct if r.lesions and r is not lesion]
    for build in (build_seg, build_sr):
        with pytest.raises(ValueError, match='"linked" does not number lesion'):
            build([lesion, *others], linked=link_series(others))
    unrecorded = FrameResult(frame=lesion.frame, lesions=lesion.lesions[1:], labels=lesion.labels, presence=1.0,
                             proposals=(), crops=(), mode="full", timings=StageTimings(), backend="x",
                             precision="fp32", models=MODELS)
    with pytest.raises(ValueError, match='"results".*without a lesion record'):
        build_seg([unrecorded])
    with pytest.raises(ValueError, match='"seg"'):
        build_sr(ct, seg=Dataset())
    dx_seg = build_seg([dx[0]])
    with pytest.raises(ValueError, match='"seg".*another study'):
        build_sr(ct, seg=dx_seg)
    seg_one = build_seg([lesion])
    other = next(r for r in ct if r.lesions and r is not lesion)
    with pytest.raises(ValueError, match='"seg" has no frame'):
        build_sr([lesion, other], seg=seg_one)
    with pytest.raises(ValueError, match='"results".*labels'):
        bad = FrameResult(frame=lesion.frame, lesions=(), labels=np.zeros((3, 3), np.uint16),
                          presence=1.0, proposals=(), crops=(), mode="full",
                          timings=StageTimings(), backend="x", precision="fp32", models=MODELS)
        build_sr([bad])
    with pytest.raises(TypeError, match='"ds"'):
        write_dataset(np.zeros(3), tmp_path / "x.dcm")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match='"ds"'):
        write_dataset(Dataset(), tmp_path / "x.dcm")
    assert os.listdir(tmp_path) == []


def test_uids_can_be_given_so_a_resent_object_replaces_the_first(ct) -> None:  # type: ignore[no-untyped-def]
    series, sop = hd.UID(), hd.UID()
    for build in (build_seg, build_sr):
        ds = build(ct, series_instance_uid=series, sop_instance_uid=sop, series_number=7)
        assert (ds.SeriesInstanceUID, ds.SOPInstanceUID, ds.SeriesNumber) == (series, sop, 7)
        assert ds.file_meta.MediaStorageSOPInstanceUID == sop
    sc = build_sc(ct[-1], series_instance_uid=series, sop_instance_uid=sop, instance_number=3)
    assert (sc.SeriesInstanceUID, sc.SOPInstanceUID, sc.InstanceNumber) == (series, sop, 3)
    with pytest.raises(ValueError, match='"sop_instance_uid"'):
        build_sc_series(ct[-2:], sop_instance_uid=sop)


def test_patient_orientation_from_geometry_or_header(ct, dx) -> None:  # type: ignore[no-untyped-def]
    assert patient_orientation(ct[0].frame) == ("L", "P")
    assert patient_orientation(dx[0].frame) == ("L", "F")  # DX header PatientOrientation
    f = ct[0].frame
    tilted = Frame(pixels=f.pixels, spacing_mm=f.spacing_mm, spacing_source=f.spacing_source,
                   window=f.window, photometric=f.photometric, sop_class_uid=f.sop_class_uid,
                   sop_instance_uid=f.sop_instance_uid, series_instance_uid=f.series_instance_uid,
                   study_instance_uid=f.study_instance_uid,
                   frame_of_reference_uid=f.frame_of_reference_uid, modality=f.modality,
                   frame_index=0, source=f.source,
                   geometry=Geometry(f.geometry.position, (0.8, -0.6, 0.0, 0.0, 0.0, -1.0)))
    assert patient_orientation(tilted) == ("LA", "F")


def test_algorithm_identification_names_the_models() -> None:
    assert algorithm_parts(MODELS) == ("roi_classifier+lesion_unet_lite", "1.0.0+1.0.0",
                                       {"roi_classifier": "1.0.0", "lesion_unet_lite": "1.0.0"})
    name, version, params = algorithm_parts(())
    assert (name, version, params) == ("medrt", medrt.__version__, {})
    long = tuple(f"model_with_a_rather_long_name_{i}@1" for i in range(4))
    name, _, params = algorithm_parts(long)
    assert name == "medrt" and len(params) == 4


def test_unreadable_header_dates_are_left_empty_in_a_copy() -> None:
    """readable_header: a header whose dates and times pydicom reads comes back as it is;
    one with an unreadable date comes back as a copy with that value empty (Type 2), and
    the source header is not changed."""
    import warnings

    from pydicom.dataset import Dataset

    from medrt.export.common import readable_header

    good = Dataset()
    good.SOPInstanceUID, good.PatientBirthDate, good.StudyTime = "1.2.3", "19700101", "101500"
    assert readable_header(good) is good
    bad = Dataset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bad.SOPInstanceUID, bad.PatientBirthDate, bad.StudyDate, bad.StudyTime = "1.2.4", "1970-01-01", "20260101", "1o:15"
    fixed = readable_header(bad)
    assert fixed is not bad and fixed.PatientBirthDate == "" and fixed.StudyTime == ""
    assert fixed.StudyDate == "20260101" and bad.PatientBirthDate == "1970-01-01"


@pytest.mark.parametrize("name", ["CT_small.dcm", "MR_small_implicit.dcm"])
def test_readable_header_parses_only_the_dates_and_times_of_a_header_read_from_a_file(tmp_path, name) -> None:
    """pydicom parses an element of a file when it is first asked for. readable_header walked
    every element, so every value of every header of a series was parsed for the SEG and the
    SR (0.65 s for 1,200 slices), most of them read by nothing; now only the dates and times
    are. In an implicit VR file (no VR in the file) too, where an unreadable date is still
    found by its dictionary VR."""
    import warnings

    from pydicom.dataelem import RawDataElement

    from medrt.export.common import readable_header

    ds = pydicom.dcmread(pydicom_test_dir() / name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.PatientBirthDate = "1970-01-01"
        ds.save_as(tmp_path / name)
    untouched = ("ImagePositionPatient", "PatientName", "InstanceNumber")
    good = pydicom.dcmread(pydicom_test_dir() / name, stop_before_pixels=True)
    assert readable_header(good) is good
    bad = pydicom.dcmread(tmp_path / name, stop_before_pixels=True)
    fixed = readable_header(bad)
    assert fixed is not bad and fixed.PatientBirthDate == "" and fixed.StudyDate == good.StudyDate != ""
    for header in (good, bad):
        for keyword in untouched:
            assert isinstance(header.get_item(keyword), RawDataElement), f"{name}: {keyword} was parsed"
