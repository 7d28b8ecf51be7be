"""Series grouping, slice ordering and volume building, on DICOM files written here.

The CT series are written with pydicom (explicit VR little endian, uncompressed),
so SimpleITK's own DICOM series reader can serve as an independent cross-check.
"""

from __future__ import annotations

import logging
import random
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian, generate_uid

from conftest import pydicom_test_dir
from medrt.errors import CorruptPixelDataError, UnsupportedImageError
from medrt.io.dicom import read_dataset, read_frames
from medrt.io.series import Series, SeriesItem, group_series, order_items, series_to_sitk
from medrt.types import Geometry

AXIAL = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0)
PIXEL_SPACING = (0.7, 0.8)  # (row spacing, column spacing)
SLICE_STEP = 2.5


def oblique_orientation() -> tuple[float, ...]:
    """Row and column cosines of a rotation about two axes: a non-trivial, orthonormal IOP."""
    a, b = np.deg2rad(20.0), np.deg2rad(-15.0)
    rz = np.array([[np.cos(a), -np.sin(a), 0], [np.sin(a), np.cos(a), 0], [0, 0, 1]])
    rx = np.array([[1, 0, 0], [0, np.cos(b), -np.sin(b)], [0, np.sin(b), np.cos(b)]])
    m = rz @ rx
    return tuple(float(v) for v in (*m[:, 0], *m[:, 1]))


def ct_dataset(
    *,
    study: str,
    series: str,
    index: int,
    orientation: Sequence[float] = AXIAL,
    position: Sequence[float] | None = None,
    instance: int | None = None,
    acquisition: int | None = 1,
    size: int = 32,
    rng: np.random.Generator | None = None,
) -> Dataset:
    """One CT Image Storage object; slice ``index`` has pixel values around ``100 * index``."""
    rng = rng if rng is not None else np.random.default_rng(index)
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID = CTImageStorage
    ds.SOPClassUID = CTImageStorage
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    ds.StudyInstanceUID, ds.SeriesInstanceUID = study, series
    ds.FrameOfReferenceUID = generate_uid(entropy_srcs=[study])
    ds.Modality = "CT"
    ds.PatientName, ds.PatientID = "Test^Series", "SERIES-TEST"
    ds.InstanceNumber = instance if instance is not None else index + 1
    if acquisition is not None:
        ds.AcquisitionNumber = acquisition
    if position is not None:
        ds.ImagePositionPatient = [f"{v:.6f}" for v in position]
        ds.ImageOrientationPatient = [f"{v:.8f}" for v in orientation]
    ds.PixelSpacing = list(PIXEL_SPACING)
    ds.SliceThickness = SLICE_STEP
    ds.Rows = ds.Columns = size
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 1
    ds.RescaleIntercept, ds.RescaleSlope, ds.RescaleType = -1024, 1, "HU"
    pixels = 100 * index + rng.integers(0, 50, size=(size, size))
    ds.PixelData = pixels.astype("<i2").tobytes()
    return ds


def write_series(
    folder: Path,
    n: int = 8,
    *,
    study: str | None = None,
    series: str | None = None,
    orientation: Sequence[float] = AXIAL,
    with_position: bool = True,
    instances: Sequence[int] | None = None,
    origin: Sequence[float] = (-12.0, 30.0, 100.0),
    steps: Sequence[float] | None = None,
) -> list[Dataset]:
    """Write ``n`` slices along the normal of ``orientation``; return them in spatial order."""
    folder.mkdir(parents=True, exist_ok=True)
    study, series = study or generate_uid(), series or generate_uid()
    normal = np.cross(orientation[:3], orientation[3:])
    offsets = np.cumsum([0.0, *(steps or [SLICE_STEP] * (n - 1))])
    out = []
    for k in range(n):
        position = np.asarray(origin) + offsets[k] * normal if with_position else None
        ds = ct_dataset(
            study=study, series=series, index=k, orientation=orientation, position=position,
            instance=instances[k] if instances is not None else None,
        )
        ds.save_as(folder / f"{ds.SOPInstanceUID}.dcm", enforce_file_format=True)
        out.append(ds)
    return out


def shuffled_files(folder: Path, seed: int = 7) -> list[Path]:
    files = sorted(folder.rglob("*.dcm"))
    random.Random(seed).shuffle(files)
    return files


def only_series(result_series: Sequence[Series]) -> Series:
    assert len(result_series) == 1, [s.series_instance_uid for s in result_series]
    return result_series[0]


# --------------------------------------------------------------------------- grouping and order


def test_orders_by_position_along_oblique_normal_not_instance_number(tmp_path: Path) -> None:
    instances = [5, 3, 8, 1, 7, 2, 6, 4]  # deliberately not the spatial order
    written = write_series(tmp_path, orientation=oblique_orientation(), instances=instances)
    result = group_series(shuffled_files(tmp_path))

    series = only_series(result.series)
    assert series.ordered_by == "position"
    assert [i.sop_instance_uid for i in series.items] == [d.SOPInstanceUID for d in written]
    assert [i.instance_number for i in series.items] == instances
    positions = np.array([i.position for i in series.items])
    np.testing.assert_allclose(np.diff(positions), SLICE_STEP, atol=1e-4)
    assert series.modality == "CT" and series.frames == 8 and not series.duplicates_dropped
    assert not result.errors and not result.non_images


def test_folder_input_groups_like_file_list(tmp_path: Path) -> None:
    write_series(tmp_path, n=4)
    by_folder = only_series(group_series(tmp_path).series)
    by_files = only_series(group_series(shuffled_files(tmp_path)).series)
    assert [i.sop_instance_uid for i in by_folder.items] == [i.sop_instance_uid for i in by_files.items]
    # A file given twice (alone and in its folder) is one item; the other copy is reported.
    twice = only_series(group_series([by_folder.items[1].path, tmp_path]).series)  # type: ignore[list-item]
    assert [i.sop_instance_uid for i in twice.items] == [i.sop_instance_uid for i in by_folder.items]
    assert [d.sop_instance_uid for d in twice.duplicates_dropped] == [by_folder.items[1].sop_instance_uid]


def test_falls_back_to_instance_number_without_position(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    instances = [4, 2, 6, 1, 3, 5]
    written = write_series(tmp_path, n=6, with_position=False, instances=instances)
    with caplog.at_level(logging.INFO, logger="medrt.io.series"):
        series = only_series(group_series(shuffled_files(tmp_path)).series)
    assert series.ordered_by == "instance"
    assert [i.instance_number for i in series.items] == [1, 2, 3, 4, 5, 6]
    by_instance = sorted(written, key=lambda d: d.InstanceNumber)
    assert [i.sop_instance_uid for i in series.items] == [d.SOPInstanceUID for d in by_instance]
    assert all(i.position is None for i in series.items)
    assert "lack ImagePositionPatient" in caplog.text


def test_falls_back_when_one_slice_lacks_position_or_orientations_differ(tmp_path: Path) -> None:
    written = write_series(tmp_path, n=5, instances=[5, 4, 3, 2, 1])
    odd = written[2]
    del odd.ImagePositionPatient
    odd.save_as(tmp_path / f"{odd.SOPInstanceUID}.dcm", enforce_file_format=True)
    series = only_series(group_series(shuffled_files(tmp_path)).series)
    assert series.ordered_by == "instance"
    assert [i.instance_number for i in series.items] == [1, 2, 3, 4, 5]

    # Two slices with different orientations: positions along "the" normal mean nothing.
    items = [
        SeriesItem(None, "1.2.3", 2, 1, 0.0, geometry=Geometry((0.0, 0.0, 0.0), AXIAL)),
        SeriesItem(None, "1.2.4", 1, 1, 5.0, geometry=Geometry((0.0, 0.0, 5.0), oblique_orientation())),  # type: ignore[arg-type]
    ]
    ordered, dropped, ordered_by = order_items(items)
    assert ordered_by == "instance" and not dropped
    assert [i.sop_instance_uid for i in ordered] == ["1.2.4", "1.2.3"]


def test_duplicate_position_keeps_higher_acquisition_number(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    written = write_series(tmp_path, n=5)
    base = written[2]
    redo = ct_dataset(
        study=base.StudyInstanceUID, series=base.SeriesInstanceUID, index=2,
        position=[float(v) + 0.001 for v in base.ImagePositionPatient], instance=40,
    )
    redo.AcquisitionNumber = 2
    redo.save_as(tmp_path / "redo.dcm", enforce_file_format=True)
    # A tie on AcquisitionNumber falls to the higher InstanceNumber.
    tie = ct_dataset(
        study=base.StudyInstanceUID, series=base.SeriesInstanceUID, index=4,
        position=[float(v) for v in written[4].ImagePositionPatient], instance=2,
    )
    tie.save_as(tmp_path / "tie.dcm", enforce_file_format=True)

    with caplog.at_level(logging.WARNING, logger="medrt.io.series"):
        series = only_series(group_series(shuffled_files(tmp_path)).series)
    assert series.ordered_by == "position"
    assert len(series.items) == 5
    assert series.items[2].sop_instance_uid == redo.SOPInstanceUID
    assert series.items[2].acquisition_number == 2
    assert series.items[4].sop_instance_uid == written[4].SOPInstanceUID  # instance 5 beats 2
    assert {d.sop_instance_uid for d in series.duplicates_dropped} == {base.SOPInstanceUID, tie.SOPInstanceUID}
    assert base.SOPInstanceUID in caplog.text
    assert "Test^Series" not in caplog.text and "SERIES-TEST" not in caplog.text


def _second_pass(folder: Path, written: Sequence[Dataset], acquisition: int = 2) -> list[Dataset]:
    """The slices of ``written`` again, at the same positions in the same series, as another
    whole acquisition (a post-contrast pass): new SOPInstanceUIDs, InstanceNumber + 100."""
    out = []
    for k, base in enumerate(written):
        ds = ct_dataset(study=base.StudyInstanceUID, series=base.SeriesInstanceUID, index=k + 50,
                        position=[float(v) for v in base.ImagePositionPatient], instance=int(base.InstanceNumber) + 100,
                        acquisition=acquisition)
        ds.save_as(folder / f"pass{acquisition}_{k}.dcm", enforce_file_format=True)
        out.append(ds)
    return out


def test_two_whole_acquisitions_at_the_same_positions_are_two_stacks(tmp_path: Path) -> None:
    """A pre- and a post-contrast pass stored in one series: each whole acquisition is kept,
    as a stack of its own (lower AcquisitionNumber first), in one Series; keeping one image
    per position dropped the first pass whole."""
    first = write_series(tmp_path, n=6)
    second = _second_pass(tmp_path, first)
    series = only_series(group_series(shuffled_files(tmp_path)).series)
    assert not series.duplicates_dropped
    assert series.acquisitions == 2 and series.acquisition_numbers == (1, 2)
    assert [[i.sop_instance_uid for i in stack] for stack in series.stacks] == [
        [d.SOPInstanceUID for d in first], [d.SOPInstanceUID for d in second]]
    assert series.items == (*series.stacks[0], *series.stacks[1]) and series.frames == 12
    ordered, dropped, _ = order_items(list(series.items))
    assert ordered == series.items and not dropped
    with pytest.raises(UnsupportedImageError, match="2 acquisitions at the same slice positions"):
        series_to_sitk(series)
    plain = only_series(group_series(sorted(tmp_path.glob("1*.dcm"))).series)  # the first pass alone
    assert plain.acquisitions == 1 and plain.stacks == ()


def test_a_slice_or_two_re_acquired_within_a_pass_keep_the_later(tmp_path: Path) -> None:
    """A motion repeat of a few slices (fewer than medrt.io.stacks.MIN_STACK) is not a pass
    of its own: one stack, the higher AcquisitionNumber kept, the rest dropped as before."""
    written = write_series(tmp_path, n=8)
    redo = [ct_dataset(study=written[k].StudyInstanceUID, series=written[k].SeriesInstanceUID, index=k + 50,
                       position=[float(v) for v in written[k].ImagePositionPatient], instance=90 + k, acquisition=2)
            for k in (2, 5)]
    for ds in redo:
        ds.save_as(tmp_path / f"redo{ds.InstanceNumber}.dcm", enforce_file_format=True)
    series = only_series(group_series(shuffled_files(tmp_path)).series)
    assert series.acquisitions == 1 and series.stacks == () and len(series.items) == 8
    assert {series.items[k].sop_instance_uid for k in (2, 5)} == {d.SOPInstanceUID for d in redo}
    assert {d.sop_instance_uid for d in series.duplicates_dropped} == {written[k].SOPInstanceUID for k in (2, 5)}


def test_a_sequential_ct_with_an_acquisition_number_per_slice_is_one_stack(tmp_path: Path) -> None:
    """Sequential (axial) CT often numbers every slice as an acquisition of its own; two
    passes of it cannot be told apart from re-acquired slices, so it stays one stack, each
    position's later image kept."""
    first = write_series(tmp_path, n=6)
    for k, ds in enumerate(first):
        ds.AcquisitionNumber = k + 1
        ds.save_as(tmp_path / f"{ds.SOPInstanceUID}.dcm", enforce_file_format=True)
    second = [ds for k, base in enumerate(first) for ds in _second_pass(tmp_path, [base], acquisition=k + 7)]
    series = only_series(group_series(shuffled_files(tmp_path)).series)
    assert series.acquisitions == 1 and series.stacks == ()
    assert [i.sop_instance_uid for i in series.items] == [d.SOPInstanceUID for d in second]
    assert len(series.duplicates_dropped) == 6


def test_mixed_folder_separates_series_and_reports_bad_and_non_image_inputs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    study = generate_uid()
    a = write_series(tmp_path / "a", n=4, study=study)
    b = write_series(tmp_path / "b", n=3, study=study, orientation=oblique_orientation())
    c = write_series(tmp_path / "c", n=2)  # another study
    (tmp_path / "noise.dcm").write_bytes(np.random.default_rng(0).bytes(3000))
    whole = (tmp_path / "a" / f"{a[0].SOPInstanceUID}.dcm").read_bytes()
    (tmp_path / "truncated.dcm").write_bytes(whole[:200])
    (tmp_path / "empty.dcm").write_bytes(b"")
    shutil.copy(pydicom_test_dir() / "test-SR.dcm", tmp_path / "report.dcm")

    with caplog.at_level(logging.DEBUG, logger="medrt.io.series"):
        result = group_series(shuffled_files(tmp_path))
    assert str(tmp_path) not in caplog.text  # paths may hold names: logs carry UIDs and counts

    got = {(s.study_instance_uid, s.series_instance_uid): len(s.items) for s in result.series}
    assert got == {
        (study, a[0].SeriesInstanceUID): 4,
        (study, b[0].SeriesInstanceUID): 3,
        (c[0].StudyInstanceUID, c[0].SeriesInstanceUID): 2,
    }
    assert all(s.ordered_by == "position" for s in result.series)
    assert result.get(b[0].SeriesInstanceUID).items[0].sop_instance_uid == b[0].SOPInstanceUID  # type: ignore[union-attr]
    bad = {Path(e.source).name: e.reason for e in result.errors}
    assert set(bad) == {"noise.dcm", "truncated.dcm", "empty.dcm"}
    assert all(reason for reason in bad.values())
    assert [Path(n.source).name for n in result.non_images] == ["report.dcm"]
    assert "SR" in result.non_images[0].kind


def test_a_bad_inputs_reason_is_kept_without_the_frames_that_met_it(tmp_path: Path) -> None:
    """A bad input's error is kept without its traceback: that held the frame of
    group_series and, through each frame's caller, the caller's locals (a batch run's
    pipeline and every frame it analysed), in a cycle with the error list itself, freed
    only by a full collection. Reference counting alone (the collector off) frees them."""
    import gc
    import weakref

    (tmp_path / "notes.txt").write_text("not DICOM")

    class Held:
        pass

    def caller() -> tuple[object, weakref.ref[Held]]:
        held = Held()  # a local of the caller, as run_batch's pipeline is
        return group_series(tmp_path), weakref.ref(held)

    enabled = gc.isenabled()
    gc.disable()
    try:
        result, held = caller()
        assert held() is None
        (bad,) = result.errors  # type: ignore[attr-defined]
        assert "notes.txt" in bad.source and bad.reason and bad.error.__traceback__ is None
    finally:
        if enabled:
            gc.enable()


def test_accepts_datasets_and_frames(tmp_path: Path) -> None:
    write_series(tmp_path, n=4, instances=[4, 3, 2, 1])
    files = shuffled_files(tmp_path)
    from_files = only_series(group_series(files).series)
    from_datasets = only_series(group_series([read_dataset(f) for f in files]).series)
    from_frames = only_series(group_series([fr for f in files for fr in read_frames(f)]).series)
    expected = [i.sop_instance_uid for i in from_files.items]
    assert [i.sop_instance_uid for i in from_datasets.items] == expected
    assert [i.sop_instance_uid for i in from_frames.items] == expected
    assert all(isinstance(i.source, Dataset) for i in from_datasets.items)
    np.testing.assert_array_equal(
        sitk_array(series_to_sitk(from_frames)), sitk_array(series_to_sitk(from_files))
    )


def test_multi_frame_object_is_one_item(tmp_path: Path) -> None:
    slices = write_series(tmp_path / "src", n=3)
    ds = slices[0]
    ds.NumberOfFrames = 3
    ds.PixelData = b"".join(s.PixelData for s in slices)
    ds.save_as(tmp_path / "multi.dcm", enforce_file_format=True)
    series = only_series(group_series(tmp_path / "multi.dcm").series)
    assert len(series.items) == 1 and series.items[0].frames == 3 and series.frames == 3


# --------------------------------------------------------------------------- volumes


def sitk_array(image: sitk.Image) -> np.ndarray:
    return sitk.GetArrayFromImage(image)


@pytest.mark.parametrize("orientation", [AXIAL, oblique_orientation()], ids=["axial", "oblique"])
def test_series_to_sitk_matches_simpleitk_reader(tmp_path: Path, orientation: Sequence[float]) -> None:
    written = write_series(tmp_path, orientation=orientation, instances=[3, 8, 1, 6, 2, 7, 4, 5])
    series = only_series(group_series(shuffled_files(tmp_path)).series)
    ours = series_to_sitk(series)

    reader = sitk.ImageSeriesReader()
    names = reader.GetGDCMSeriesFileNames(str(tmp_path), written[0].SeriesInstanceUID)
    assert len(names) == 8
    reader.SetFileNames(names)
    theirs = reader.Execute()

    assert ours.GetSize() == theirs.GetSize() == (32, 32, 8)
    np.testing.assert_allclose(ours.GetSpacing(), theirs.GetSpacing(), atol=1e-4)
    np.testing.assert_allclose(ours.GetSpacing(), (PIXEL_SPACING[1], PIXEL_SPACING[0], SLICE_STEP), atol=1e-4)
    np.testing.assert_allclose(ours.GetOrigin(), theirs.GetOrigin(), atol=1e-4)
    np.testing.assert_allclose(ours.GetDirection(), theirs.GetDirection(), atol=1e-5)
    assert ours.GetPixelID() == sitk.sitkFloat32
    ours_px, theirs_px = sitk_array(ours), sitk_array(theirs).astype(np.float32)
    np.testing.assert_array_equal(ours_px, theirs_px)
    assert ours_px.min() >= -1024 and 700 - 1024 <= ours_px[7].min()  # HU, slice 7 last


def test_single_slice_takes_its_slice_thickness(tmp_path: Path) -> None:
    write_series(tmp_path, n=1)
    image = series_to_sitk(only_series(group_series(tmp_path).series))
    assert image.GetSize() == (32, 32, 1)
    np.testing.assert_allclose(image.GetSpacing(), (0.8, 0.7, SLICE_STEP))


def _different_size(folder: Path) -> None:
    written = write_series(folder, n=4)
    odd = ct_dataset(
        study=written[0].StudyInstanceUID, series=written[0].SeriesInstanceUID, index=9, size=16,
        position=(-12.0, 30.0, 100.0 + 4 * SLICE_STEP),
    )
    odd.save_as(folder / "odd.dcm", enforce_file_format=True)


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda d: write_series(d, n=5, steps=[2.5, 2.5, 5.0, 2.5]), "non-uniform slice spacing"),
        (_different_size, "differ in size"),
        (lambda d: write_series(d, n=3, with_position=False), "no geometry"),
    ],
    ids=["gap", "size", "no-geometry"],
)
def test_series_to_sitk_refuses_inconsistent_series(tmp_path: Path, make: object, reason: str) -> None:
    make(tmp_path)  # type: ignore[operator]
    series = only_series(group_series(tmp_path).series)
    with pytest.raises(UnsupportedImageError, match=reason) as info:
        series_to_sitk(series)
    assert info.value.source == series.series_instance_uid


def test_a_slice_whose_spacing_is_not_a_length_is_named_as_such_for_a_volume(tmp_path: Path) -> None:
    """"no pixel spacing on every frame" was said also of a slice whose PixelSpacing was
    there but 0\\0: the reason now says which slice and what its header gave."""
    written = write_series(tmp_path, n=3)
    path = tmp_path / f"{written[1].SOPInstanceUID}.dcm"
    written[1].PixelSpacing = ["0", "0"]
    written[1].save_as(path, enforce_file_format=True)
    series = only_series(group_series(tmp_path).series)
    with pytest.raises(UnsupportedImageError) as info:
        series_to_sitk(series)
    assert f"1 of 3 frame(s) have no usable pixel spacing (the first, {path}: PixelSpacing 0\\0 is not a length" in (
        info.value.reason)


def test_truncated_pixel_data_groups_but_fails_to_decode(tmp_path: Path) -> None:
    written = write_series(tmp_path, n=3)
    path = tmp_path / f"{written[1].SOPInstanceUID}.dcm"
    path.write_bytes(path.read_bytes()[:-500])
    result = group_series(tmp_path)
    series = only_series(result.series)
    assert len(series.items) == 3 and not result.errors  # grouping reads headers only
    with pytest.raises(CorruptPixelDataError, match="truncated") as info:
        series_to_sitk(series)
    assert info.value.source == str(path)
