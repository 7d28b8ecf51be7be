"""docs/conformance.md, the DICOM Conformance Statement, says what the code does.

Hospital IT reads the statement before connecting a scanner or a PACS; these checks fail
when a transfer syntax, a status, a created SOP class or the implementation identity
changes in the code and not in the statement (or the other way round).
"""

from __future__ import annotations

import re
from pathlib import Path

import pydicom
import pytest

import medrt
from conftest import SAMPLE_DIR, free_port
from medrt.pacs import commitment, scp, scu

STATEMENT = (Path(__file__).parent.parent / "docs" / "conformance.md").read_text()


def test_every_transfer_syntax_the_listener_accepts_is_listed_and_no_other():
    table = STATEMENT.split("#### 3.2.1")[1].split("#### 3.2.2")[0]
    listed = set(re.findall(r"\| (1\.2\.840\.10008\.1\.2[0-9.]*) \|", table))
    assert listed == set(scp.ACCEPTED_TRANSFER_SYNTAXES)
    from pydicom.pixels import get_decoder

    # offered only what can be read: no Part 2 multi-component JPEG 2000, which nothing here decodes
    assert all(get_decoder(ts).is_available for ts in scp.ACCEPTED_TRANSFER_SYNTAXES)
    assert "1.2.840.10008.1.2.4.92" not in listed and "1.2.840.10008.1.2.4.110" in listed


@pytest.mark.parametrize("status", [scp.STATUS_OUT_OF_RESOURCES, scp.STATUS_DATASET_MISMATCH,
                                    scp.STATUS_CANNOT_UNDERSTAND, scp.STATUS_PROCESSING_FAILURE,
                                    scp.STATUS_INVALID_ARGUMENT, scp.STATUS_NO_SUCH_ACTION,
                                    scp.STATUS_RESOURCE_LIMITATION, 0x0112, 0x0119])
def test_every_status_and_failure_reason_medrt_sends_is_explained(status):
    assert f"0x{status:04X}" in STATEMENT


def test_the_implementation_identity_and_sop_classes_are_the_codes():
    from pynetdicom import AllStoragePresentationContexts

    assert scu.IMPLEMENTATION_CLASS_UID in STATEMENT
    assert f"`{scu.IMPLEMENTATION_VERSION_NAME}`" in STATEMENT and medrt.__version__ in scu.IMPLEMENTATION_VERSION_NAME
    assert f"({len(AllStoragePresentationContexts)} in pynetdicom" in STATEMENT
    assert commitment.STORAGE_COMMITMENT_CLASS in STATEMENT and commitment.STORAGE_COMMITMENT_INSTANCE in STATEMENT


def test_the_listener_introduces_itself_as_stated(tmp_path):
    """What a PACS sees in the A-ASSOCIATE-AC: medrt's implementation class UID and version."""
    from pynetdicom import AE
    from pynetdicom.sop_class import Verification

    from medrt.pacs.spool import Spool

    with scp.Listener(Spool(tmp_path / "spool"), host="127.0.0.1", port=free_port()) as listener:
        ae = AE(ae_title="PACS")
        ae.add_requested_context(Verification)
        assoc = ae.associate("127.0.0.1", listener.port, ae_title="MEDRT")
        assert assoc.is_established
        try:
            assert assoc.acceptor.implementation_class_uid == scu.IMPLEMENTATION_CLASS_UID
            assert assoc.acceptor.implementation_version_name == scu.IMPLEMENTATION_VERSION_NAME
            assert int(assoc.send_c_echo().Status) == 0
        finally:
            assoc.release()


def test_created_objects_are_the_sop_classes_and_transfer_syntaxes_stated(tmp_path):
    """One small batch run with --sc: each object's SOP class and transfer syntax are in
    the statement's table of what medrt sends (3.3.1)."""
    from medrt.cli import main

    table = STATEMENT.split("#### 3.3.1")[1].split("####")[0]
    rows = set(re.findall(r"\((1\.2\.840\.10008\.5\.1\.4\.1\.1[0-9.]*)\)[^|]*\| [^(]*\((1\.2\.840\.10008\.1\.2[0-9.]*)\)",
                          table))
    src = tmp_path / "in"
    src.mkdir()
    for path in sorted((SAMPLE_DIR / "ct_stream").glob("*.dcm"))[12:15]:
        (src / path.name).write_bytes(path.read_bytes())
    assert main(["batch", str(src), "--out", str(tmp_path / "out"), "--sc", "--quiet", "--threads", "1",
                 "--workers", "1"]) == 0
    made = {(str(d.SOPClassUID), str(d.file_meta.TransferSyntaxUID))
            for d in (pydicom.dcmread(p, stop_before_pixels=True) for p in (tmp_path / "out").rglob("*.dcm"))}
    assert len(made) == 3 and made == rows
    source = pydicom.dcmread(next(src.iterdir()), stop_before_pixels=True)
    for path in (tmp_path / "out").rglob("*.dcm"):
        assert pydicom.dcmread(path, stop_before_pixels=True).SpecificCharacterSet == source.SpecificCharacterSet


def test_the_media_role_is_stated():
    from medrt.io import media

    section = STATEMENT.split("## 8. Media interchange")[1]
    assert "File-set Reader (FSR)" in section and media.MEDIA_STORAGE_DIRECTORY in section
