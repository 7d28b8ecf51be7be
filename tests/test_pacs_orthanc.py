"""Orthanc, the real PACS, pushes a CT series to ``medrt listen`` by C-STORE and receives
the SEG and SR it sends back (by C-STORE, or by STOW-RS to its DICOMweb plugin); then it
asks medrt for storage commitment of what it sent. Both run inside a loopback-only network namespace
(``unshare -n``; Orthanc cannot bind to one address), which needs root: CI runs as root.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pydicom
from pacs_orthanc_roundtrip import DICOMWEB_PLUGIN

from conftest import SAMPLE_DIR, missing, require_tool

HERE = Path(__file__).parent


FILES = sorted((SAMPLE_DIR / "ct_stream").glob("*.dcm"))[12:20]


def round_trip(tmp_path: Path, *mode: str) -> tuple[dict, dict[str, list[dict[str, str]]]]:  # type: ignore[type-arg]
    """pacs_orthanc_roundtrip.py in a loopback-only namespace: its result, and what Orthanc
    holds at the end by modality."""
    require_tool("Orthanc")
    unshare = require_tool("unshare")
    require_tool("ip")
    if os.geteuid() != 0:
        missing("a network namespace for Orthanc needs root (CI runs as root)")
    script = (f"ip link set lo up && exec {sys.executable} {HERE / 'pacs_orthanc_roundtrip.py'} {tmp_path / 'work'} "
              + " ".join([*mode, *map(str, FILES)]))
    run = subprocess.run([unshare, "-n", "sh", "-c", script], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(HERE.parent)})
    logs = "".join(f"\n--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in (tmp_path / "work").glob("*.log"))
    assert run.returncode == 0, run.stderr[-3000:] + logs
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["listen_rc"] == 0, result["listen_log"]
    by_modality: dict[str, list[dict[str, str]]] = {}
    for inst in result["instances"]:
        by_modality.setdefault(inst["Modality"], []).append(inst)
    assert sorted((k, len(v)) for k, v in by_modality.items()) == [("CT", len(FILES)), ("SEG", 1), ("SR", 1)]
    source = pydicom.dcmread(FILES[0], stop_before_pixels=True)
    for kind in ("SEG", "SR"):
        (inst,) = by_modality[kind]
        assert inst["StudyInstanceUID"] == source.StudyInstanceUID
        assert inst["SeriesInstanceUID"] != source.SeriesInstanceUID
    assert f"series {source.SeriesInstanceUID}: done, {len(FILES)} frame(s)" in result["listen_log"]
    assert "2 object(s) forwarded" in result["listen_log"]
    return result, by_modality


def test_orthanc_takes_the_results_over_dicomweb_stow_rs(tmp_path):
    """Orthanc's DICOMweb plugin, behind HTTP basic authentication: medrt --forward URL."""
    if not Path(DICOMWEB_PLUGIN).is_file():
        missing(f"Orthanc's DICOMweb plugin ({DICOMWEB_PLUGIN}; Debian package orthanc-dicomweb)")
    result, _ = round_trip(tmp_path, "--stow")
    assert "forwarding to http://127.0.0.1:18042/dicom-web" in result["listen_log"]


def test_orthanc_pushes_a_series_and_gets_seg_and_sr_back(tmp_path):
    result, by_modality = round_trip(tmp_path)
    # Storage commitment: Orthanc asks, medrt reports on an association to Orthanc's port.
    sent = sorted(i["SOPInstanceUID"] for i in by_modality["CT"])
    all_sent, one_not = result["commitments"]["sent"], result["commitments"]["one_never_sent"]
    assert all_sent["Status"] == "Success" and all_sent["RemoteAET"] == "MEDRT", all_sent
    assert sorted(i["SOPInstanceUID"] for i in all_sent["Success"]) == sent and not all_sent.get("Failures")
    assert one_not["Status"] == "Failure" and sorted(i["SOPInstanceUID"] for i in one_not["Success"]) == sent
    assert [(f["SOPInstanceUID"], f["FailureReason"]) for f in one_not["Failures"]] == [("2.25.987654321", 0x0112)]
    assert "2 storage commitment request(s), 2 reported" in result["listen_log"]
