"""No patient names, IDs or birth dates in what medrt prints, logs or reports."""

from __future__ import annotations

import logging
import subprocess
import sys
import warnings
from pathlib import Path

import pydicom
import pytest

from conftest import REPO, SAMPLE_DIR
from medrt.errors import CorruptDicomError
from medrt.privacy import (
    EchoFilter,
    RedactFilter,
    describe_exception,
    install_log_redaction,
    redact,
)

NAME, PATIENT_ID, BIRTH_DATE, PHYSICIAN = "Zzyzxname", "PIDSECRET123", "1970-01-01", "Drsoloname"


def test_quoted_values_are_taken_out() -> None:
    assert redact("Invalid value for VR DA: '1970-01-01'.") == "Invalid value for VR DA: '…'."
    assert redact('The string "DOE" is unlikely to represent') == 'The string "…" is unlikely to represent'
    assert redact("no quotes here: 1.2.3") == "no quotes here: 1.2.3"


def test_third_party_records_are_redacted_and_medrt_records_are_not() -> None:
    flt = RedactFilter()

    def message(name: str, msg: str, *args: object) -> str:
        record = logging.LogRecord(name, logging.WARNING, __file__, 1, msg, args, None)
        assert flt.filter(record)
        return record.getMessage()

    assert NAME not in message("highdicom.base", 'value of argument "patient_name" is invalid: "%s"', NAME)
    assert BIRTH_DATE not in message("pydicom", "Invalid value for VR DA: %r.", BIRTH_DATE)
    assert NAME not in message("py.warnings", f'highdicom/base.py:199: UserWarning: The string "{NAME}" ...')
    assert message("pydicom", "%d bad %s", "x") == "%d bad %s"  # a bad format string does not raise
    kept = "series 1.2.3: 'roi' mode"
    assert message("medrt.batch", kept) == kept
    assert message("pydicomish", kept) == kept  # a prefix is not a parent logger


def test_warnings_go_through_the_redacting_handler(caplog: pytest.LogCaptureFixture) -> None:
    # An in-process CLI run earlier in the session may have left logging believing it
    # captures warnings while pytest has since put its own showwarning back: start afresh.
    logging.captureWarnings(False)
    install_log_redaction([caplog.handler])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn(f'The string "{NAME}" is unlikely to represent the intended person name', UserWarning,
                          stacklevel=1)
    finally:
        logging.captureWarnings(False)
    assert caplog.records and NAME not in caplog.text and "unlikely to represent" in caplog.text


def test_a_warning_pydicom_also_logged_is_printed_once(caplog: pytest.LogCaptureFixture) -> None:
    """pydicom's warn_and_log logs and then warns with the same text: with warnings routed
    into logging, each such message came out twice. The logged record stays, the echo goes;
    a warning nobody logged still comes through."""
    from pydicom.data import get_testdata_file

    class Seen(logging.Handler):  # what reached logging as a warning, before any handler filter
        def __init__(self) -> None:
            super().__init__()
            self.texts: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.texts.append(record.getMessage())

    seen = Seen()
    logging.getLogger("py.warnings").addHandler(seen)
    logging.captureWarnings(False)
    install_log_redaction([caplog.handler])
    try:
        with warnings.catch_warnings(), caplog.at_level(logging.WARNING):
            warnings.simplefilter("always")
            pydicom.dcmread(get_testdata_file("SC_rgb_jpeg.dcm"))  # explicit VR announced, implicit found
            warnings.warn("a warning of our own", UserWarning, stacklevel=1)
    finally:
        logging.captureWarnings(False)
        logging.getLogger("py.warnings").removeHandler(seen)
    assert any("found implicit VR" in text for text in seen.texts), "pydicom did warn: there was an echo to drop"
    vr = [r for r in caplog.records if "found implicit VR" in r.getMessage()]
    assert [r.name for r in vr] == ["pydicom"], [(r.name, r.getMessage()) for r in vr]
    assert any(r.name == "py.warnings" and "a warning of our own" in r.getMessage() for r in caplog.records)
    flt = EchoFilter(remember=1)
    record = logging.LogRecord("pydicom", logging.WARNING, __file__, 1, "first", None, None)
    assert flt.filter(record)
    assert flt.filter(logging.LogRecord("pydicom", logging.WARNING, __file__, 1, "second", None, None))
    assert flt.filter(logging.LogRecord("py.warnings", logging.WARNING, __file__, 1, "x.py:1: first", None, None))


def test_exceptions_described_for_reports() -> None:
    assert describe_exception(ValueError(f"Unable to convert '{BIRTH_DATE}' to 'DA' object")) == (
        "ValueError: Unable to convert '…' to '…' object")
    own = CorruptDicomError("a.dcm", "no 'DICM' prefix")  # medrt's own messages stay whole
    assert "'DICM'" in describe_exception(own)
    # a missing attribute is named (a class and a keyword, no value), anything else quoted is not
    assert describe_exception(AttributeError("'Dataset' object has no attribute 'PixelSpacing'")) == (
        "AttributeError: 'Dataset' object has no attribute 'PixelSpacing'")
    assert describe_exception(AttributeError(f"'Dataset' object has no attribute '{NAME}'")) == (
        "AttributeError: '…' object has no attribute '…'")  # not a DICOM keyword
    assert describe_exception(AttributeError("'Dataset' object has no attribute 'X' (was 'DOE^JOHN')")) == (
        "AttributeError: '…' object has no attribute '…' (was '…')")


def test_batch_never_prints_or_reports_patient_data_and_survives_bad_header_dates(tmp_path: Path) -> None:
    """CT slices whose header holds a single-component patient name (highdicom warns with
    it), an ID and a birth date pydicom cannot read (highdicom's SR used to fail on it
    and the report quoted it): the batch writes SEG and SR, and no value shows on the
    console or in any report file."""
    folder = tmp_path / "in"
    folder.mkdir()
    for n in range(14, 18):  # slices with lesions, so a SEG is written too
        ds = pydicom.dcmread(SAMPLE_DIR / "ct_stream" / f"ct_{n:04d}.dcm")
        with warnings.catch_warnings():  # pydicom warns (quoting it) about the bad date
            warnings.simplefilter("ignore")
            ds.PatientName, ds.PatientID, ds.PatientBirthDate = NAME, PATIENT_ID, BIRTH_DATE
        ds.ReferringPhysicianName = PHYSICIAN
        ds.save_as(folder / f"{n}.dcm")
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "medrt", "batch", str(folder), "--out", str(out)],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "PatientBirthDate not a valid DICOM DA" in run.stderr  # named, not quoted
    texts = [run.stdout, run.stderr] + [p.read_text() for p in out.rglob("*")
                                        if p.suffix in (".md", ".csv", ".json", ".jsonl")]
    for value in (NAME, PATIENT_ID, BIRTH_DATE, PHYSICIAN):
        assert not any(value in text for text in texts), value
    (series,) = (out / "series").iterdir()
    seg, sr = pydicom.dcmread(series / "seg.dcm"), pydicom.dcmread(series / "sr.dcm")
    for obj in (seg, sr):
        assert obj.PatientBirthDate == "" and obj.PatientID == PATIENT_ID  # the object keeps its patient
