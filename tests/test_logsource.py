"""pydicom's warnings about a damaged header name the file, once per file."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pydicom
import pytest

from conftest import pydicom_test_dir
from medrt.io.dicom import read_frames
from medrt.io.series import group_series
from medrt.privacy import install_log_redaction


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def console() -> _Records:
    """A handler set up as the command line sets up its console's."""
    handler = _Records()
    root = logging.getLogger()
    root.addHandler(handler)
    install_log_redaction([handler])
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        logging.captureWarnings(False)


def _bad_instance_number(path: Path, value: str) -> Path:
    """CT_small with an InstanceNumber pydicom warns about as it reads it."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_io_dicom import _with_raw_value

    ds = pydicom.dcmread(pydicom_test_dir() / "CT_small.dcm")
    ds.SOPInstanceUID = pydicom.uid.generate_uid()
    path.write_bytes(_with_raw_value(ds, "InstanceNumber", value))
    return path


def test_pydicom_warnings_name_the_file_once_per_file(tmp_path: Path, console: _Records) -> None:
    """A batch over bad files printed "WARNING pydicom: Invalid value for VR IS: '…'. Please
    see <https://dicom.nema.org/...> for allowed values for each VR." for every element of
    every file, on every pass over the header (the scan, then the decode), naming no file."""
    files = [_bad_instance_number(tmp_path / f"bad{i}.dcm", "1.5") for i in range(2)]
    group_series(tmp_path)  # the scan reads each header...
    for path in files:  # ...and the decode reads it again
        read_frames(path)
        read_frames(path)
    lines = [r.getMessage() for r in console.records if r.name in ("pydicom", "py.warnings")]
    assert lines, "pydicom no longer warns about an IS of 1.5: pick another damage"
    for path in files:
        mine = [line for line in lines if line.startswith(f"{path}: ")]
        assert mine and len(mine) == len(set(mine)), lines  # named, and each message once
    assert len(lines) == sum(1 for line in lines if line.startswith(tuple(f"{p}: " for p in files)))
    assert not any("Please see <" in line for line in lines)  # pydicom's link to the VR table


def test_records_outside_a_read_pass_unchanged(console: _Records) -> None:
    logging.getLogger("pydicom").warning("a message about no file")
    logging.getLogger("pydicom").warning("a message about no file")
    assert [r.getMessage() for r in console.records] == ["a message about no file"] * 2


def test_a_second_handler_names_the_file_once(tmp_path: Path) -> None:
    """install_log_redaction puts the filters on each of the root's handlers (a console and
    a log file). The record is one object, so the second handler's filter found the first's
    "path: message" and named the file again: "path: path: message"."""
    handlers = [_Records(), _Records()]
    root = logging.getLogger()
    for handler in handlers:
        root.addHandler(handler)
    install_log_redaction(handlers)
    try:
        path = _bad_instance_number(tmp_path / "bad.dcm", "1.5")
        group_series(tmp_path)
        read_frames(path)
    finally:
        for handler in handlers:
            root.removeHandler(handler)
        logging.captureWarnings(False)
    for handler in handlers:
        lines = [r.getMessage() for r in handler.records if r.name in ("pydicom", "py.warnings")]
        assert lines, "pydicom no longer warns about an IS of 1.5: pick another damage"
        assert all(line.startswith(f"{path}: ") and f"{path}: {path}" not in line for line in lines), lines


def _implicit_body_under_explicit_meta(uid: str) -> bytes:
    """CT_small whose file meta says Explicit VR Little Endian and whose data set is written
    implicit: pydicom warns "Expected explicit VR, but found implicit VR" as it parses it."""
    from pydicom.filebase import DicomBytesIO
    from pydicom.filewriter import write_dataset, write_file_meta_info

    ds = pydicom.dcmread(pydicom_test_dir() / "CT_small.dcm")
    ds.SOPInstanceUID = uid
    head, body = DicomBytesIO(), DicomBytesIO()
    head.write(b"\0" * 128 + b"DICM")
    write_file_meta_info(head, ds.file_meta)
    body.is_little_endian, body.is_implicit_VR = True, True
    write_dataset(body, ds)
    return head.getvalue() + body.getvalue()


@pytest.mark.parametrize("wrap", [bytes, io.BytesIO], ids=["bytes", "BytesIO"])
def test_two_inputs_read_from_memory_are_not_taken_for_one(console: _Records, wrap: type) -> None:
    """Messages were passed once per input's name, and an input read from memory is named
    "<BytesIO>" or "<39198 bytes>": the second of two such (as the listener or viewer may
    read) lost its warning, as if it were the first file read again."""
    blobs = [_implicit_body_under_explicit_meta(pydicom.uid.generate_uid()) for _ in range(2)]
    assert len(blobs[0]) == len(blobs[1])  # the same name for both, as bytes too
    for blob in blobs:
        read_frames(wrap(blob))
    lines = [r.getMessage() for r in console.records if r.name == "pydicom"]  # its logger: once per input
    found = [line for line in lines if "Expected explicit VR, but found implicit VR" in line]
    assert len(found) == 2, lines
    assert all(line.startswith(("<BytesIO>: ", f"<{len(blobs[0])} bytes>: ")) for line in found)


def test_an_open_file_is_named_by_its_path(tmp_path: Path, console: _Records) -> None:
    """A data set read from an open file (``read_frames(open(path, "rb"))``, as a library user
    may) was named "<BufferedReader>" in pydicom's lines, and each message was let through
    once per read, as for an input known by nothing unique. Now the file's ``name`` names it,
    once per path as a path does; a BytesIO, which has no name, stays "<BytesIO>"."""
    from medrt.errors import source_name
    from medrt.logsource import current_source, reading

    path = tmp_path / "implicit.dcm"
    path.write_bytes(_implicit_body_under_explicit_meta(pydicom.uid.generate_uid()))
    for _ in range(2):
        with path.open("rb") as fh:
            read_frames(fh)
    lines = [r.getMessage() for r in console.records if r.name == "pydicom"]
    found = [line for line in lines if "Expected explicit VR, but found implicit VR" in line]
    assert found == [f"{path}: {found[0].partition(': ')[2]}"], lines  # named by its path, once for both reads
    with path.open("rb") as fh, reading(fh):
        assert current_source() == str(path) and source_name(fh) == str(path)
    blob = io.BytesIO(path.read_bytes())
    with reading(blob):
        assert current_source() == "<BytesIO>" and source_name(blob) is blob
    with path.open("rb") as fh, open(fh.fileno(), "rb", closefd=False) as by_number:  # its name is a number
        assert source_name(by_number) is by_number


def test_an_error_about_an_open_file_names_its_path(tmp_path: Path) -> None:
    """``InputError(fh, ...)`` raised anywhere named an open file "<BufferedReader>"; it names
    the file's path, and a BytesIO (no name) or a file opened from a descriptor (a number for
    a name) by its kind."""
    from medrt.errors import InputError, describe_source

    path = tmp_path / "x.dcm"
    path.write_bytes(b"not DICOM")
    with path.open("rb") as fh:
        assert str(InputError(fh, "damaged header")) == f"{path}: bad input: damaged header"
        with open(fh.fileno(), "rb", closefd=False) as by_number:
            assert describe_source(by_number) == "<BufferedReader>"
    assert describe_source(io.BytesIO(b"x")) == "<BytesIO>"
