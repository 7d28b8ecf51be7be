"""Orthanc ↔ ``medrt listen`` round trip; run by tests/test_pacs_orthanc.py inside a
loopback-only network namespace (``unshare -n``), because Orthanc listens on every interface.

1. Orthanc starts with a throw-away database; the CT files are uploaded to it over REST.
2. ``medrt listen`` starts (a subprocess, as an operator would run it), forwarding to Orthanc.
3. Orthanc is asked to C-STORE the series to medrt (``POST /modalities/medrt/store``).
4. We wait until Orthanc holds the SEG and SR that medrt sent back.
5. Orthanc asks medrt for storage commitment of the CT images it sent (and, in a second
   request, of one more it never sent); medrt reports back to Orthanc's own DICOM port.
6. We print what Orthanc holds and what it was told as one JSON object on stdout (the
   test checks it).

With ``--stow`` (Orthanc with its DICOMweb plugin, and HTTP basic authentication), medrt
sends the results by STOW-RS to Orthanc's ``/dicom-web`` instead of C-STORE, and no
storage commitment is asked.

Usage: python pacs_orthanc_roundtrip.py WORKDIR [--stow] FILE.dcm...
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HTTP = 18042
ORTHANC_DICOM = 14242
MEDRT_PORT = 11112
USER, PASSWORD = "medrt", "s3cret-for-the-test"
AUTH = {"Authorization": "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}
DICOMWEB_PLUGIN = "/usr/share/orthanc/plugins/libOrthancDicomWeb.so"


def rest(method: str, path: str, body: bytes | None = None) -> object:
    req = urllib.request.Request(f"http://127.0.0.1:{HTTP}{path}", data=body, method=method, headers=AUTH)
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read() or b"null")


def wait_for(what: str, check, timeout_s: float, procs: list[subprocess.Popen]) -> object:  # type: ignore[no-untyped-def,type-arg]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise SystemExit(f"{p.args[0]} exited with {p.returncode} while waiting for {what}")
        try:
            value = check()
        except OSError:
            value = None
        if value:
            return value
        time.sleep(0.25)
    raise SystemExit(f"timed out after {timeout_s:.0f} s waiting for {what}")


def main() -> None:
    work = Path(sys.argv[1])
    stow = sys.argv[2] == "--stow"
    files = [Path(p) for p in sys.argv[3 if stow else 2:]]
    (work / "db").mkdir(parents=True)
    config = {
        "Name": "TestOrthanc", "StorageDirectory": str(work / "db"), "IndexDirectory": str(work / "db"),
        "HttpPort": HTTP, "RemoteAccessAllowed": False, "AuthenticationEnabled": True,
        "RegisteredUsers": {USER: PASSWORD},
        "DicomAet": "ORTHANC_T", "DicomPort": ORTHANC_DICOM, "DicomCheckCalledAet": True,
        "DicomAlwaysAllowStore": False, "StableAge": 3, "Plugins": [DICOMWEB_PLUGIN] if stow else [],
        "DicomWeb": {"Enable": True, "Root": "/dicom-web/"},
        "DicomModalities": {"medrt": ["MEDRT", "127.0.0.1", MEDRT_PORT]},
    }
    (work / "orthanc.json").write_text(json.dumps(config))
    procs: list[subprocess.Popen] = []  # type: ignore[type-arg]
    orthanc = subprocess.Popen(["Orthanc", str(work / "orthanc.json")], stdout=open(work / "orthanc.log", "wb"),
                               stderr=subprocess.STDOUT)
    procs.append(orthanc)
    listen = None
    try:
        wait_for("Orthanc's REST API", lambda: rest("GET", "/system"), 60, procs)
        ids = [rest("POST", "/instances", f.read_bytes())["ID"] for f in files]  # type: ignore[index]
        medrt = [sys.executable, "-m", "medrt", "listen", "--spool", str(work / "spool"), "--bind", "127.0.0.1",
                 "--port", str(MEDRT_PORT), "--idle", "2", "--threads", "1", "--workers", "1"]
        if stow:
            medrt += ["--forward", f"http://127.0.0.1:{HTTP}/dicom-web"]
        else:
            medrt += ["--forward", f"ORTHANC_T@127.0.0.1:{ORTHANC_DICOM}", "--peer", f"ORTHANC_T@127.0.0.1:{ORTHANC_DICOM}"]
        env = {**os.environ, "MEDRT_DICOMWEB_USER": USER, "MEDRT_DICOMWEB_PASSWORD": PASSWORD}
        listen = subprocess.Popen(medrt, stdout=open(work / "listen.log", "wb"), stderr=subprocess.STDOUT, env=env)
        procs.append(listen)
        wait_for("medrt listen", lambda: b"Ctrl-C stops" in (work / "listen.log").read_bytes(), 120, procs)
        job = rest("POST", "/modalities/medrt/store", json.dumps({"Resources": ids, "Synchronous": True}).encode())

        def results() -> list[dict[str, object]] | None:
            tags = [rest("GET", f"/instances/{i}/simplified-tags") for i in rest("GET", "/instances")]  # type: ignore[union-attr]
            return tags if sum(t["Modality"] in ("SEG", "SR") for t in tags) >= 2 else None  # type: ignore[index]

        tags = wait_for("the SEG and SR back in Orthanc", results, 180, procs)
        sent = [{"SOPClassUID": t["SOPClassUID"], "SOPInstanceUID": t["SOPInstanceUID"]}  # type: ignore[index]
                for t in tags if t["Modality"] == "CT"]  # type: ignore[index]
        never = {"SOPClassUID": sent[0]["SOPClassUID"], "SOPInstanceUID": "2.25.987654321"}
        commitments = {}
        for name, instances in () if stow else (("sent", sent), ("one_never_sent", [*sent, never])):
            asked = rest("POST", "/modalities/medrt/storage-commitment",
                         json.dumps({"DicomInstances": instances}).encode())
            commitments[name] = wait_for(
                f"Orthanc's storage commitment report {name}",
                lambda a=asked: (lambda r: r if r["Status"] != "Pending" else None)(rest("GET", a["Path"])),  # type: ignore[index]
                60, procs)
        listen.send_signal(signal.SIGTERM)
        rc = listen.wait(60)
        print(json.dumps({"job": job, "listen_rc": rc, "commitments": commitments, "listen_log": (work / "listen.log").read_text(errors="replace"),
                          "instances": [{k: t.get(k) for k in ("Modality", "SOPClassUID", "SOPInstanceUID",  # type: ignore[union-attr]
                                                               "SeriesInstanceUID", "StudyInstanceUID")}
                                        for t in tags]}))  # type: ignore[union-attr]
    finally:
        for p in (listen, orthanc):
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
        os.sync()


if __name__ == "__main__":
    main()
