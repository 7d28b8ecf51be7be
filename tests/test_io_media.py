"""DICOM media: a DICOMDIR opens as the images it lists, in every face that takes paths.

The file-sets are made by DCMTK's ``dcmmkdir`` (the real tool a CD burner runs) over
sample CT slices, and pydicom's own DICOMDIR test files cover the odd encodings."""

from __future__ import annotations

import csv
import json
import logging
import os
import shutil
import subprocess
from pathlib import Path

import pydicom
import pytest
from pydicom.dataset import Dataset

from conftest import SAMPLE_DIR, pydicom_test_dir, require_tool
from medrt.batch import EXIT_ERRORS
from medrt.cli import main
from medrt.io.media import is_dicomdir, read_dicomdir
from medrt.io.scan import iter_files
from medrt.io.series import group_series
from medrt.io.sources import FileReplay

SLICES = sorted((SAMPLE_DIR / "ct_stream").glob("*.dcm"))[14:20]  # six slices with lesions


@pytest.fixture
def disc(tmp_path: Path) -> Path:
    """A patient disc as a CD burner writes one: IMAGES/IM000001… (ISO 9660 names, no
    extension) and the DICOMDIR that dcmmkdir makes for them. Returns the DICOMDIR."""
    dcmmkdir = require_tool("dcmmkdir")
    root = tmp_path / "disc"
    (root / "IMAGES").mkdir(parents=True)
    for i, src in enumerate(SLICES, 1):
        shutil.copy(src, root / "IMAGES" / f"IM{i:06d}")
    # -Nxc: the samples are JPEG-LS, which the general-purpose CD profile does not list
    done = subprocess.run([dcmmkdir, "-Nxc", "+r", "+id", str(root), "+D", str(root / "DICOMDIR"), "IMAGES"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return root / "DICOMDIR"


def _records(dicomdir: Path) -> list[str]:
    return ["/".join(r.ReferencedFileID) for r in pydicom.dcmread(dicomdir).DirectoryRecordSequence
            if "ReferencedFileID" in r]


def test_a_dicomdir_opens_as_the_images_it_lists(disc: Path) -> None:
    root = disc.parent
    assert is_dicomdir(disc) and not is_dicomdir(SLICES[0]) and not is_dicomdir(root)
    listing = read_dicomdir(disc)
    # in the DICOMDIR's record order, each file as it is on disk
    assert [p.relative_to(root).as_posix() for p in listing.files] == _records(disc)
    assert sorted(listing.files) == sorted((root / "IMAGES").iterdir())
    assert listing.missing == [] and listing.refused == []
    assert listing.summary() == f"DICOMDIR {disc}: 1 patient, 1 study, 1 series, 6 images; 6 file(s) referenced"
    assert list(iter_files([disc])) == listing.files
    # a DICOMDIR met inside a walked folder is left to the walk (which finds its files anyway)
    assert disc in list(iter_files([root]))

    via_dir, originals = group_series([disc]), group_series(SLICES)
    assert len(via_dir.series) == 1 and not via_dir.errors
    assert ([i.sop_instance_uid for i in via_dir.series[0].items]
            == [i.sop_instance_uid for i in originals.series[0].items])  # slice order, not record order


def test_a_folder_holding_a_dicomdir_reads_each_image_once(disc: Path, tmp_path: Path, caplog) -> None:
    """A disc opened at its folder: the walk finds the images, and the DICOMDIR beside them
    is a non-image, not a second copy of each (every image was dropped as its own
    duplicate before group_series was told its inputs were a walk's)."""
    root = disc.parent
    grouped = group_series(list(iter_files([root])), dicomdir=False)
    assert len(grouped.series) == 1 and len(grouped.series[0].items) == 6
    assert not grouped.series[0].duplicates_dropped
    assert [n.kind for n in grouped.non_images] == ["Media Storage Directory Storage"]
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING):
        assert main(["batch", str(root), "--out", str(out), "--quiet", "--workers", "1", "--png", "none"]) == 0
    assert "given twice" not in caplog.text
    rows = list(csv.DictReader((out / "errors.csv").open()))
    assert [(r["file"], r["kind"], r["reason"]) for r in rows] == [
        ("DICOMDIR", "skipped", "not an image (Media Storage Directory Storage)")]
    assert len((out / "results.jsonl").read_text().splitlines()) == 6


def test_a_disc_mounted_in_lower_case_still_opens(disc: Path) -> None:
    """Linux mounts an ISO 9660 disc without Rock Ridge in lower case (map=normal), some
    mounts keep the version suffix (;1) or a trailing dot: the DICOMDIR still says IMAGES\\IM000001."""
    root = disc.parent
    (root / "IMAGES").rename(root / "images")
    names = sorted((root / "images").iterdir())
    for i, p in enumerate(names):
        p.rename(p.with_name(p.name.lower() + (";1" if i == 0 else "." if i == 1 else "")))
    listing = read_dicomdir(disc)
    assert listing.missing == [] and len(listing.files) == 6
    assert sorted(listing.files) == sorted((root / "images").iterdir())
    assert {p.name for p in listing.files} >= {"im000001;1", "im000002."}
    assert len(group_series([disc]).series[0].items) == 6


def _record(template: Dataset, *parts: str, in_use: bool = True) -> Dataset:
    rec = Dataset()
    rec.update(template)
    rec.ReferencedFileID = list(parts)
    if not in_use:
        rec.RecordInUseFlag = 0
    return rec


@pytest.mark.filterwarnings("ignore:Invalid value for VR CS")  # "..": the point of the test
def test_missing_outside_and_inactive_references(disc: Path, tmp_path: Path, caplog, capsys) -> None:
    root = disc.parent
    ds = pydicom.dcmread(disc)
    image = next(r for r in ds.DirectoryRecordSequence if r.DirectoryRecordType == "IMAGE")
    (tmp_path / "secret.dcm").write_bytes(SLICES[0].read_bytes())  # exists, outside the disc
    shutil.copy(SLICES[0], root / "IMAGES" / "EXTRA")  # exists, named by an inactive record only
    ds.DirectoryRecordSequence.extend([_record(image, "..", "secret.dcm"), _record(image, "IMAGES", "EXTRA", in_use=False)])
    ds.save_as(disc)
    (root / "IMAGES" / "IM000002").unlink()

    with caplog.at_level(logging.WARNING, logger="medrt.io.media"):
        listing = read_dicomdir(disc)
    assert listing.missing == [root / "IMAGES" / "IM000002"]
    assert listing.refused == ["..\\secret.dcm"]
    assert root / "IMAGES" / "EXTRA" not in listing.files and len(listing.files) == 6  # the missing one listed
    assert f"{disc}: 1 of 6 referenced file(s) are not on the media" in caplog.text
    assert "leave its folder" in caplog.text

    # batch: the five images analysed, the missing one reported by name, nothing outside read
    out = tmp_path / "out"
    assert main(["batch", str(disc), "--out", str(out), "--quiet", "--workers", "1", "--png", "none"]) == EXIT_ERRORS
    rows = {r["file"]: r for r in csv.DictReader((out / "errors.csv").open())}
    assert rows["IMAGES/IM000002"]["kind"] == "error" and "no such file" in rows["IMAGES/IM000002"]["reason"]
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(results) == 5 and sum(len(r["lesions"]) for r in results) > 0
    assert not any("secret" in json.dumps(r) for r in results)

    capsys.readouterr()
    main(["info", str(disc), "--json"])
    media = json.loads(capsys.readouterr().out)["media"]
    assert media[0]["missing"] == [str(root / "IMAGES" / "IM000002")] and media[0]["refused"] == ["..\\secret.dcm"]
    assert media[0]["records"] == {"PATIENT": 1, "STUDY": 1, "SERIES": 1, "IMAGE": 7}  # the inactive one not counted


def test_pydicoms_dicomdirs_in_every_encoding() -> None:
    """Big-endian, implicit VR, no offsets, reordered records, and one without PATIENT
    records (pydicom's FileSet refuses that one; its images are still read)."""
    folder = pydicom_test_dir() / "dicomdirtests"
    expected = sorted(p for p in folder.glob("[0-9]*/**/*") if p.is_file())
    assert len(expected) == 31
    for name in ("DICOMDIR", "DICOMDIR-bigEnd", "DICOMDIR-implicit", "DICOMDIR-nooffset", "DICOMDIR-reordered",
                 "DICOMDIR-nopatient"):
        listing = read_dicomdir(folder / name)
        assert sorted(listing.files) == expected, name
        assert not listing.missing, name
    assert read_dicomdir(folder / "DICOMDIR-empty.dcm").files == []
    assert len(read_dicomdir(folder / "TINY_ALPHA" / "DICOMDIR").files) == 50


def test_a_damaged_dicomdir_is_named_and_read_as_itself(disc: Path, caplog) -> None:
    data = disc.read_bytes()
    meta_end = 132 + 12 + int.from_bytes(data[140:144], "little")  # preamble, DICM, (0002,0000) UL, its value
    disc.write_bytes(data[:meta_end] + b"\x04\x00\x20\x12SQ\x00\x00" + b"\xff" * 7)  # a sequence cut short
    assert is_dicomdir(disc)
    with pytest.raises(ValueError, match=f"^{disc}: DICOMDIR"):
        read_dicomdir(disc)
    with caplog.at_level(logging.WARNING, logger="medrt.io.scan"):
        assert list(iter_files([disc])) == [disc]  # the reader then reports the file
    assert str(disc) in caplog.text


def test_replay_of_a_dicomdir_keeps_its_order(disc: Path, tmp_path: Path) -> None:
    assert FileReplay.from_path(disc, fps=0).paths == read_dicomdir(disc).files
    assert FileReplay.from_path(disc.parent, fps=0).paths == sorted(iter_files([disc.parent]))
    assert FileReplay.from_path(SLICES[0], fps=0).paths == [SLICES[0]]
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        FileReplay.from_path(tmp_path / "absent")
    empty = pydicom_test_dir() / "dicomdirtests" / "DICOMDIR-empty.dcm"
    with pytest.raises(FileNotFoundError, match="references no files"):
        FileReplay.from_path(empty)
    assert os.path.exists(empty)
