"""The ``medrt`` command line, run as a user would run it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO, SAMPLE_DIR, pydicom_test_dir


def medrt(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "medrt", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_info_on_a_folder_with_a_mix_of_good_and_bad_files(tmp_path: Path) -> None:
    folder = tmp_path / "mix"
    (folder / "sub").mkdir(parents=True)
    shutil.copy(pydicom_test_dir() / "CT_small.dcm", folder / "ct.dcm")
    shutil.copy(pydicom_test_dir() / "MR_small_jpeg_ls_lossless.dcm", folder / "sub" / "mr_jls.dcm")
    shutil.copy(pydicom_test_dir() / "test-SR.dcm", folder / "report.dcm")
    shutil.copy(pydicom_test_dir() / "MR_truncated.dcm", folder / "sub" / "truncated.dcm")
    (folder / "notes.txt").write_text("not an image\n")
    (folder / "noise.bin").write_bytes(bytes(range(256)) * 8)

    out = medrt("info", "--json", str(folder))
    assert out.returncode == 1, "completed with errors"
    doc = json.loads(out.stdout)
    by_name = {Path(f["path"]).name: f for f in doc["files"]}
    assert doc["summary"] == {"files": 6, "decoded": 2, "errors": 1, "skipped": 3}
    assert by_name["ct.dcm"]["ok"] and by_name["ct.dcm"]["transfer_syntax"] == "Explicit VR Little Endian"
    assert by_name["ct.dcm"]["spacing_source"] == "PixelSpacing"
    assert by_name["mr_jls.dcm"]["transfer_syntax"] == "JPEG-LS Lossless Image Compression"
    assert by_name["report.dcm"]["error_kind"] == "NotAnImageError" and by_name["report.dcm"]["skipped"]
    assert by_name["truncated.dcm"]["error_kind"] == "CorruptPixelDataError"
    assert by_name["notes.txt"]["error_kind"] == "NotDicomError" and by_name["notes.txt"]["skipped"]
    assert by_name["noise.bin"]["error_kind"] == "NotDicomError" and by_name["noise.bin"]["skipped"]

    human = medrt("info", str(folder))
    assert "6 file(s): 2 decoded, 1 with errors, 3 skipped (not DICOM, or not an image)" in human.stdout
    assert "truncated.dcm" in human.stdout and "ERROR (CorruptPixelDataError)" in human.stdout

    # A patient disc: its DICOMDIR inside the folder is passed over, not an error (exit 0).
    from pydicom import dcmread
    from pydicom.fileset import FileSet

    disc = tmp_path / "disc"
    fs = FileSet()
    for slice_ in sorted((SAMPLE_DIR / "ct_stream").glob("*.dcm"))[:2]:
        fs.add(dcmread(slice_))
    fs.write(disc)
    out = medrt("info", "--json", str(disc))
    doc = json.loads(out.stdout)
    assert out.returncode == 0 and doc["summary"]["errors"] == 0, doc["summary"]
    assert any(Path(f["path"]).name == "DICOMDIR" and f["skipped"] for f in doc["files"])


def test_info_route_says_which_model_takes_each_image_or_why_none_does(tmp_path: Path) -> None:
    """``medrt info --route``: what IT checks before pointing a modality at the listener,
    with the same routing options batch and listen take, and no model run."""
    import pydicom

    ct = SAMPLE_DIR / "ct_stream" / "ct_0001.dcm"
    ds = pydicom.dcmread(SAMPLE_DIR / "radiographs" / "dx_0001.dcm")
    ds.BodyPartExamined = "Torax"
    ds.save_as(tmp_path / "torax.dcm")
    del ds.BodyPartExamined
    ds.save_as(tmp_path / "blank.dcm")
    files = [str(ct), str(tmp_path / "torax.dcm"), str(tmp_path / "blank.dcm"), str(pydicom_test_dir() / "MR_small.dcm")]

    def routes(*options: str) -> list[tuple[str | None, str | None]]:
        out = medrt("info", "--json", "--route", *options, *files)
        assert out.returncode == 0, out.stderr
        return [(f["route"], f["passed_over"]) for f in json.loads(out.stdout)["files"]]

    got = routes()
    assert got[0] == ("lesion_unet_lite@4.1.1", None) and got[2] == ("lesion_unet_dx@1.2.0", None)
    assert got[1][0] is None and "BodyPartExamined TORAX" in got[1][1] and "--body-part-alias TORAX=CHEST" in got[1][1]
    assert got[3][0] is None and got[3][1].startswith("MR frame, but ")
    got = routes("--body-part-alias", "TORAX=CHEST", "--strict-routing")
    assert got[1] == ("lesion_unet_dx@1.2.0", None)
    assert got[2][0] is None and "names no BodyPartExamined, and with --strict-routing" in got[2][1]
    text = medrt("info", "--route", str(tmp_path / "torax.dcm")).stdout
    assert "\n  -> passed over: DX frame of BodyPartExamined TORAX" in text
    assert "route" in medrt("info", "--json", str(ct)).stdout and "-> " not in medrt("info", str(ct)).stdout


def test_info_never_prints_patient_names() -> None:
    import pydicom

    path = pydicom_test_dir() / "CT_small.dcm"
    name = str(pydicom.dcmread(path).PatientName)
    out = medrt("info", "--json", str(path))
    assert out.returncode == 0
    assert name not in out.stdout and name not in out.stderr


def test_info_ok_exit_code_and_missing_path(tmp_path: Path) -> None:
    assert medrt("info", str(pydicom_test_dir() / "MR_small.dcm")).returncode == 0
    missing = medrt("info", str(tmp_path / "nope.dcm"))
    assert missing.returncode == 1 and "no such file" in missing.stdout
    text = tmp_path / "named.txt"
    text.write_text("hello")
    named = medrt("info", str(text))  # named on the command line: an error, not a skip
    assert named.returncode == 1 and "ERROR (NotDicomError)" in named.stdout


def test_info_says_why_a_spacing_in_the_header_is_not_used(tmp_path: Path) -> None:
    """A PixelSpacing of 0\\0 read "no spacing", as a header without one does; the analysis
    and the log say why it is not used, and so does medrt info now."""
    import pydicom

    ds = pydicom.dcmread(pydicom_test_dir() / "CT_small.dcm")
    ds.PixelSpacing = ["0", "0"]
    ds.save_as(tmp_path / "zero.dcm")
    del ds.PixelSpacing
    ds.save_as(tmp_path / "none.dcm")
    zero, none = medrt("info", str(tmp_path / "zero.dcm")), medrt("info", str(tmp_path / "none.dcm"))
    assert r"no usable spacing (PixelSpacing 0\0 is not a length in mm)" in zero.stdout, zero.stdout
    assert "| no spacing |" in none.stdout, none.stdout
    (row,) = json.loads(medrt("info", "--json", str(tmp_path / "zero.dcm")).stdout)["files"]
    assert row["spacing_mm"] is None and row["spacing_problem"] == r"PixelSpacing 0\0 is not a length in mm"


def test_info_says_a_series_holds_two_whole_acquisitions(tmp_path: Path) -> None:
    """Two passes at the same positions in one series (pre- and post-contrast) are each
    analysed; medrt info says so, where it would otherwise look like 4 duplicates."""
    import pydicom
    from pydicom.uid import generate_uid

    for path in sorted((SAMPLE_DIR / "ct_stream").glob("*.dcm"))[:4]:
        ds = pydicom.dcmread(path)
        ds.AcquisitionNumber = 1
        ds.save_as(tmp_path / path.name, enforce_file_format=True)
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
        ds.AcquisitionNumber = 2
        ds.save_as(tmp_path / f"post_{path.name}", enforce_file_format=True)
    out = medrt("info", "--json", str(tmp_path))
    assert out.returncode == 0, out.stdout[-2000:]
    (found,) = json.loads(out.stdout)["several_acquisitions"]
    assert found["acquisition_numbers"] == [1, 2] and found["images"] == [4, 4]
    assert "2 acquisitions at the same slice positions (AcquisitionNumber 1, 2; 4 + 4 images)" in \
        medrt("info", str(tmp_path)).stdout


def test_info_on_the_samples_succeeds(sample_dir: Path) -> None:
    out = medrt("info", "--json", str(sample_dir))
    assert out.returncode == 0, out.stdout[-2000:]
    doc = json.loads(out.stdout)
    assert doc["summary"]["decoded"] == 43 and doc["summary"]["errors"] == 0


def test_usage_error_exit_code() -> None:
    out = medrt("no-such-command")
    assert out.returncode == 2
    out = medrt("batch", str(SAMPLE_DIR / "radiographs"), "--out", "unused", "--min-diameter", "-1")
    assert out.returncode == 2 and "--min-diameter: must be >= 0 mm" in out.stderr


def test_a_corrupt_compressed_frame_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """pydicom logs each decoder plugin's traceback before giving up; medrt reports the
    file and the reason once, so a console user does not read a crash (-vv shows them)."""
    import pydicom
    from pydicom.encaps import encapsulate, generate_frames

    ds = pydicom.dcmread(pydicom_test_dir() / "JPEG2000.dcm")
    frame = next(generate_frames(ds.PixelData, number_of_frames=1))
    ds.PixelData = encapsulate([frame[: len(frame) // 3] + b"\0" * 64])
    bad = tmp_path / "cut_j2k.dcm"
    ds.save_as(bad)

    out = medrt("info", str(bad))
    assert out.returncode == 1 and "cut_j2k.dcm" in out.stdout and "CorruptPixelDataError" in out.stdout
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    loud = medrt("-vv", "info", str(bad))
    assert "Traceback" in loud.stderr  # still there for whoever debugs a codec


def test_a_reader_that_stops_early_gets_no_traceback() -> None:
    """``medrt info ... | head -1``: the pipe closes while medrt still writes; it stops
    quietly with 141 (128 + SIGPIPE, as a shell reports it), not with a traceback."""
    import fcntl

    proc = subprocess.Popen([sys.executable, "-m", "medrt", "info", str(SAMPLE_DIR), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    assert proc.stdout is not None and proc.stderr is not None
    fcntl.fcntl(proc.stdout.fileno(), 1031, 4096)  # F_SETPIPE_SZ: ~40 KB of JSON will not fit
    assert proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_info_names_a_file_whose_header_has_an_unreadable_element_and_goes_on(tmp_path: Path) -> None:
    """A byte flipped in an element's VR (here SOP Instance UID's, 'UI' to 'TI') made
    ``medrt info`` stop with a traceback, and the files after it were never shown."""
    data = (pydicom_test_dir() / "CT_small.dcm").read_bytes()
    element = b"\x08\x00\x18\x00UI"  # (0008,0018) in explicit VR little endian
    assert element in data
    (tmp_path / "a_damaged.dcm").write_bytes(data.replace(element, b"\x08\x00\x18\x00TI", 1))
    shutil.copy(pydicom_test_dir() / "CT_small.dcm", tmp_path / "b_good.dcm")
    out = medrt("info", "--json", str(tmp_path))
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.returncode == 1
    by_name = {Path(f["path"]).name: f for f in json.loads(out.stdout)["files"]}
    assert by_name["b_good.dcm"]["ok"]
    damaged = by_name["a_damaged.dcm"]
    assert damaged["error_kind"] == "CorruptDicomError" and "header attribute cannot be read" in damaged["error"]


def test_verbose_is_taken_after_every_command_too() -> None:
    """``medrt batch IN --out OUT -v`` was a usage error: -v was the top parser's alone, and
    people type it at the end of the command that needs a closer look."""
    import argparse

    from medrt.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["info", "x"]).verbose == 0
    assert parser.parse_args(["-v", "info", "x"]).verbose == 1  # not reset by the command's own -v
    assert parser.parse_args(["info", "x", "-vv"]).verbose == 2
    assert parser.parse_args(["models", "list", "-v"]).verbose == 1
    # before and after add up, as -v -v does: the command's parser reset the count before it
    assert parser.parse_args(["-v", "info", "x", "-v"]).verbose == 2
    assert parser.parse_args(["-v", "models", "list", "-v"]).verbose == 2

    def commands(p: argparse.ArgumentParser):  # every command and sub-command, by its prog
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sp in set(action.choices.values()):
                    yield sp
                    yield from commands(sp)

    progs = [sp.prog for sp in commands(parser)]
    assert len(progs) > 10
    for sp in commands(parser):
        assert any("--verbose" in a.option_strings for a in sp._actions), sp.prog
    for tail, shown in (([], False), (["-v"], True)):
        run = subprocess.run([sys.executable, "-m", "medrt", "info", str(SAMPLE_DIR / "ct_stream"), *tail],
                             capture_output=True, text=True, cwd=REPO)
        assert run.returncode == 0, run.stderr
        assert (" INFO medrt." in run.stderr) is shown, run.stderr[-2000:]
