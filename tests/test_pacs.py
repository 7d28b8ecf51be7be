"""The PACS face: spool, Storage SCP, the series worker and forwarding, with DCMTK as the real peer.

Orthanc's round trip (it pushes a series to ``medrt listen`` and gets SEG and SR back)
is in tests/test_pacs_orthanc.py.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pydicom
import pytest

from conftest import (
    SAMPLE_DIR,
    TWO_PASS_SLICES_FEET_FIRST,
    free_port,
    require_tool,
    two_pass_series,
)
from medrt.analyzer import load_analyzer
from medrt.cli import main
from medrt.pacs.scp import STATUS_DATASET_MISMATCH, STATUS_OUT_OF_RESOURCES, Listener
from medrt.pacs.scu import Destination, ForwardError, send
from medrt.pacs.service import PacsService, result_files
from medrt.pacs.spool import Spool, SpoolError

CT = sorted((SAMPLE_DIR / "ct_stream").glob("*.dcm"))[12:22]  # ten slices, lesions among them


@pytest.fixture(scope="module")
def analyzer():
    return load_analyzer(threads=1)


def storescu(port: int, files: list[Path], *extra: str) -> subprocess.CompletedProcess[str]:
    exe = require_tool("storescu")
    return subprocess.run([exe, "-aec", "MEDRT", "-xt", "-R", *extra, "127.0.0.1", str(port), *map(str, files)],
                          capture_output=True, text=True, timeout=60)


def c_store(port: int, datasets: list[pydicom.Dataset]) -> list[int]:
    """pynetdicom as the sender, for data sets that a file-based tool would not send."""
    from pynetdicom import AE

    ae = AE(ae_title="SCANNER")
    for ds in datasets:
        ae.add_requested_context(ds.SOPClassUID, ds.file_meta.TransferSyntaxUID)
    assoc = ae.associate("127.0.0.1", port, ae_title="MEDRT")
    assert assoc.is_established
    try:
        return [int(assoc.send_c_store(ds).Status) for ds in datasets]
    finally:
        assoc.release()


def fill(spool: Spool, files: list[Path], now: float = 1.0) -> None:
    """Files into the spool as the listener would have stored them."""
    for path in files:
        ds = pydicom.dcmread(path, stop_before_pixels=True)
        spool.store(path.read_bytes(), study_uid=ds.StudyInstanceUID, series_uid=ds.SeriesInstanceUID,
                    sop_uid=ds.SOPInstanceUID, now=now)


# -- the spool -----------------------------------------------------------------------------------------------------


def test_spool_files_by_uid_and_lists_a_series_once_it_is_quiet(tmp_path):
    spool = Spool(tmp_path / "spool")
    data = CT[0].read_bytes()
    ds = pydicom.dcmread(CT[0], stop_before_pixels=True)
    uids = dict(study_uid=ds.StudyInstanceUID, series_uid=ds.SeriesInstanceUID, sop_uid=ds.SOPInstanceUID)
    path = spool.store(data, **uids, modality="CT", calling_ae="SCANNER", now=100.0)
    assert path == spool.root / "inbox" / ds.SeriesInstanceUID / f"{ds.SOPInstanceUID}.dcm"
    assert path.read_bytes() == data and not list(path.parent.glob(".*.tmp"))
    assert spool.due(5.0, now=104.0) == []  # still arriving
    (state,) = spool.due(5.0, now=105.0)
    assert (state.series_uid, state.state, state.instances, state.calling_ae) == (ds.SeriesInstanceUID, "receiving",
                                                                                 1, "SCANNER")
    # An instance arriving between the listing and the claim: the claim fails, the series waits again.
    spool.store(data, **{**uids, "sop_uid": ds.SOPInstanceUID + ".1"}, now=106.0)
    assert not spool.claim(state.series_uid, expect_received=state.last_received, now=106.5)
    (state,) = spool.due(5.0, now=111.0)
    assert state.instances == 2
    assert spool.claim(state.series_uid, expect_received=state.last_received, now=111.0)
    assert spool.due(5.0, now=200.0) == []  # analysing: not listed again
    # More arrives while it is analysed: marking it done is refused, it goes round again.
    spool.store(data, **{**uids, "sop_uid": ds.SOPInstanceUID + ".2"}, now=112.0)
    assert not spool.mark(state.series_uid, "done", unless_received_after=state.last_received)
    assert spool.series(state.series_uid).state == "receiving"
    assert [p.name for p in spool.paths(state.series_uid)][-1] == f"{ds.SOPInstanceUID}.2.dcm"
    # The series is listed by its images' modality: an SR or a PDF filed in it does not rename it.
    spool.store(data, **{**uids, "sop_uid": ds.SOPInstanceUID + ".3"}, modality="SR", now=113.0)
    assert spool.series(state.series_uid).modality == "CT"
    other = {**uids, "series_uid": ds.SeriesInstanceUID + ".9", "sop_uid": ds.SOPInstanceUID + ".9"}
    spool.store(data, **other, modality="DOC", now=114.0)  # a document first, then the images
    assert spool.series(other["series_uid"]).modality == "DOC"
    spool.store(data, **{**other, "sop_uid": ds.SOPInstanceUID + ".10"}, modality="CT", now=115.0)
    assert spool.series(other["series_uid"]).modality == "CT"


@pytest.mark.parametrize("uids, message", [
    (dict(study_uid="1.2", series_uid="", sop_uid="1.2.3"), "no SeriesInstanceUID"),
    (dict(study_uid="1.2", series_uid="1.2/../../etc", sop_uid="1.2.3"), "SeriesInstanceUID is not a valid UID"),
    (dict(study_uid="1.2", series_uid="1.2.4", sop_uid="1." * 70), "SOPInstanceUID is not a valid UID"),
])
def test_spool_refuses_an_instance_it_cannot_file_and_writes_nothing(tmp_path, uids, message):
    spool = Spool(tmp_path / "spool")
    with pytest.raises(SpoolError, match=message):
        spool.store(b"DICM", **uids)
    assert not any(spool.inbox.iterdir()) and spool.all_series() == []


def test_an_index_an_earlier_medrt_made_is_brought_up_to_date_and_a_newer_ones_refused(tmp_path):
    """An upgraded listener opens the spool its predecessor ran on: ``CREATE TABLE IF NOT
    EXISTS`` left an older table as it was, and the first query naming a newer column
    failed; ``SELECT *`` would also have read the columns ALTER TABLE appends in the
    wrong places. An index of a later layout than this medrt's is refused by name."""
    import sqlite3

    from medrt.pacs.spool import SCHEMA_VERSION, SpoolIndexError

    root = tmp_path / "spool"
    (root / "inbox").mkdir(parents=True)
    db = sqlite3.connect(root / "index.sqlite3")  # a series table without four columns, no commitments
    db.executescript("""
        CREATE TABLE series (series_uid TEXT PRIMARY KEY, study_uid TEXT NOT NULL, modality TEXT NOT NULL DEFAULT '',
            state TEXT NOT NULL, instances INTEGER NOT NULL DEFAULT 0,
            first_received REAL NOT NULL, last_received REAL NOT NULL);
        CREATE TABLE instances (sop_uid TEXT PRIMARY KEY, series_uid TEXT NOT NULL, sop_class_uid TEXT NOT NULL
            DEFAULT '', transfer_syntax TEXT NOT NULL DEFAULT '', path TEXT NOT NULL, size INTEGER NOT NULL,
            received REAL NOT NULL);
        INSERT INTO series VALUES ('1.2.3.4', '1.2.3', 'CT', 'done', 3, 10.0, 12.0);
    """)
    db.commit()
    db.close()
    spool = Spool(root)
    assert spool.series("1.2.3.4") == spool.series("1.2.3.4").__class__(
        "1.2.3.4", "1.2.3", "CT", "", "done", 3, 10.0, 12.0, 0.0, 0, "")
    assert spool.all_commitments() == []
    spool.mark("1.2.3.4", "failed", "a note", attempted_at=20.0)
    assert (spool.series("1.2.3.4").detail, spool.series("1.2.3.4").last_attempt) == ("a note", 20.0)
    spool.close()
    db = sqlite3.connect(root / "index.sqlite3")
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    with pytest.raises(SpoolIndexError, match=r"index.sqlite3: written by a newer medrt"):
        Spool(root)
    assert main(["spool", str(root)]) == 2


def test_an_up_to_date_index_opens_while_another_process_writes_and_a_locked_one_is_not_called_damaged(tmp_path):
    """Opening the spool took a write lock every time (to check the layout), so ``medrt
    spool`` run beside a listener in the middle of a write waited SQLite's 5 s and then
    called the sound index "not a readable spool index. Move it aside": every series
    analysed and sent again. An index already up to date opens without a lock; one that
    must be brought up to date while locked is named as locked, not as damaged."""
    import sqlite3

    from medrt.pacs.spool import SpoolIndexError

    spool = Spool(tmp_path / "spool")
    fill(spool, CT[:2])
    spool.close()
    index = spool.root / "index.sqlite3"
    writer = sqlite3.connect(index, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # another process, mid-write
    try:
        again = Spool(spool.root, create=False)
        assert [s.instances for s in again.all_series()] == [2]
        again.close()
    finally:
        writer.execute("ROLLBACK")
    writer.execute("PRAGMA user_version = 0")  # an earlier medrt's index: to be brought up to date
    writer.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(SpoolIndexError, match="locked") as caught:
            Spool(spool.root, create=False)
        assert "Move it aside" not in str(caught.value) and "do not move it aside" in str(caught.value)
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    assert [s.instances for s in Spool(spool.root, create=False).all_series()] == [2]


def test_a_damaged_index_is_named_and_the_images_are_indexed_again_once_it_is_moved_aside(tmp_path, capsys):
    """A spool index that is not SQLite (a disk fault, a copy gone wrong) was a traceback at
    start-up; now the listener and ``medrt spool`` name it and say what to do, and doing it
    loses no image: the next open indexes the inbox from the files' headers."""
    from medrt.pacs.spool import SpoolIndexError

    spool = Spool(tmp_path / "spool")
    fill(spool, CT[:3])
    spool.close()
    index = spool.root / "index.sqlite3"
    for extra in (index.with_name("index.sqlite3-wal"), index.with_name("index.sqlite3-shm")):
        extra.unlink(missing_ok=True)
    index.write_bytes(b"not a database, but a sector of something else" * 100)
    with pytest.raises(SpoolIndexError, match=r"index.sqlite3: not a readable spool index .*Move it aside"):
        Spool(spool.root)
    assert main(["listen", "--spool", str(spool.root), "--port", "0"]) == 2
    assert "not a readable spool index" in capsys.readouterr().err
    index.rename(index.with_name("index.damaged"))
    again = Spool(spool.root)
    again.recover()
    (state,) = again.all_series()
    assert (state.instances, state.state) == (3, "receiving")


def test_recover_requeues_interrupted_work_indexes_strays_and_drops_temporaries(tmp_path):
    spool = Spool(tmp_path / "spool")
    first = pydicom.dcmread(CT[0], stop_before_pixels=True)
    spool.store(CT[0].read_bytes(), study_uid=first.StudyInstanceUID, series_uid=first.SeriesInstanceUID,
                sop_uid=first.SOPInstanceUID, now=10.0)
    (state,) = spool.due(0.0, now=11.0)
    assert spool.claim(state.series_uid, expect_received=state.last_received, now=11.0)
    spool.close()
    # The crash: one file renamed into place but never indexed, one write that never finished.
    second = pydicom.dcmread(CT[1], stop_before_pixels=True)
    stray = spool.inbox / second.SeriesInstanceUID / f"{second.SOPInstanceUID}.dcm"
    stray.write_bytes(CT[1].read_bytes())
    (spool.inbox / second.SeriesInstanceUID / ".half.dcm.x.tmp").write_bytes(b"DI")
    (spool.inbox / second.SeriesInstanceUID / "junk.dcm").write_bytes(b"not dicom")
    again = Spool(tmp_path / "spool")
    done = again.recover()
    assert done == {"requeued": 1, "indexed": 1, "unreadable": 1, "temporaries": 1}
    state = again.series(first.SeriesInstanceUID)
    assert (state.state, state.instances) == ("receiving", 2)
    assert (spool.inbox / second.SeriesInstanceUID / "junk.dcm").exists()  # never deleted, only logged


def test_a_series_still_receiving_waits_its_quiet_time_again_after_a_restart(tmp_path):
    """No sender could reach a listener that was down: the downtime is no quiet time. A
    series cut off mid-receive was due at once after a restart, and half of it analysed
    and its results sent before the sender sent the rest."""
    spool = Spool(tmp_path / "spool")
    first = pydicom.dcmread(CT[0], stop_before_pixels=True)
    spool.store(CT[0].read_bytes(), study_uid=first.StudyInstanceUID, series_uid=first.SeriesInstanceUID,
                sop_uid=first.SOPInstanceUID, now=time.time() - 3600)  # the crash was an hour ago
    spool.close()
    again = Spool(tmp_path / "spool")
    again.recover()
    assert again.due(30.0) == []  # --idle 30 starts again at the restart
    assert [s.series_uid for s in again.due(30.0, now=time.time() + 31)] == [first.SeriesInstanceUID]
    again.close()


def test_one_listener_per_spool(tmp_path, capsys):
    """A second `medrt listen` on a spool in use (a manual run beside the service) recovered
    it as after a crash, putting the running listener's series back to be analysed and sent
    again, even when it then failed to start. It is now refused before it changes anything."""
    from medrt.pacs.spool import SpoolInUseError

    owner = Spool(tmp_path / "spool")
    owner.take_ownership()
    first = pydicom.dcmread(CT[0], stop_before_pixels=True)
    owner.store(CT[0].read_bytes(), study_uid=first.StudyInstanceUID, series_uid=first.SeriesInstanceUID,
                sop_uid=first.SOPInstanceUID, now=10.0)
    (state,) = owner.due(0.0, now=11.0)
    assert owner.claim(state.series_uid, expect_received=state.last_received, now=11.0)  # being analysed
    other = Spool(tmp_path / "spool")
    with pytest.raises(SpoolInUseError, match=rf"in use by medrt listen, pid {os.getpid()}"):
        other.take_ownership()
    other.close()
    assert main(["listen", "--spool", str(tmp_path / "spool"), "--port", str(free_port())]) == 2
    assert "one medrt listen per spool" in capsys.readouterr().err
    assert owner.series(first.SeriesInstanceUID).state == "analysing"  # untouched
    owner.close()
    mine = Spool(tmp_path / "spool")
    mine.take_ownership()  # free once the owner is gone
    mine.close()


def test_one_listener_per_results_folder_and_keep_days_checked(tmp_path, capsys):
    """Two listeners (two spools) writing one results folder each see only their own series,
    so one's --keep-results-days would delete the other's results while they wait to be
    sent: the second is refused, naming the first. --keep-days NaN or negative is refused
    (NaN read as "keep everything", a negative value as 0)."""
    from medrt.pacs.spool import SpoolInUseError

    out = tmp_path / "results"
    first = Spool(tmp_path / "a")
    first.take_ownership()
    first.hold_results(out)
    second = Spool(tmp_path / "b")
    second.take_ownership()  # its own spool: fine
    with pytest.raises(SpoolInUseError, match=rf"{out} is in use by medrt listen, pid {os.getpid()}: give each"):
        second.hold_results(out)
    second.close()
    import socket

    with socket.socket() as taken:  # should a check fail to refuse, the listener stops at its port
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = ["--bind", "127.0.0.1", "--port", str(taken.getsockname()[1])]
        assert main(["listen", "--spool", str(tmp_path / "b"), "--out", str(out), *busy]) == 2
        assert "give each medrt listen its own --out" in capsys.readouterr().err
        for days in ("nan", "-1"):
            assert main(["listen", "--spool", str(tmp_path / "c"), "--keep-days", days, *busy]) == 2
            assert "--keep-days takes days >= 0" in capsys.readouterr().err
    first.close()
    again = Spool(tmp_path / "b")
    again.hold_results(out)  # free once the first is gone
    again.close()


def test_a_compressed_seg_reaches_a_peer_that_takes_it_only_uncompressed(tmp_path):
    """--seg-compression jpeg2000 writes the SEG as JPEG 2000 Lossless. DCMTK's storescp
    takes only uncompressed objects by default: it gets the same SEG decoded (its bits packed
    as in an uncompressed BINARY SEG), and the RLE secondary capture decoded too; with +xa
    it takes the files as they are. A peer that
    takes the SEG class in neither refuses that file alone (0x0122) and takes the rest."""
    from pynetdicom import AE, evt

    from conftest import run_storescp
    from medrt.bench.outputs import truth_result
    from medrt.export import build_sc, build_seg, build_sr, write_dataset
    from medrt.io.dicom import read_frames
    from medrt.phantom import load_ground_truth, write_radiographs

    (image,) = write_radiographs(tmp_path / "dx", 5, count=1, size=1024, compress="none")
    truth = load_ground_truth(tmp_path / "dx")
    results = [truth_result(f, truth[f.sop_instance_uid].mask) for f in read_frames(image)]
    seg = build_seg(results, compression="jpeg2000")
    plain = build_seg(results, sop_instance_uid=seg.SOPInstanceUID, series_instance_uid=seg.SeriesInstanceUID)
    seg_file, sr_file = tmp_path / "seg.dcm", tmp_path / "sr.dcm"
    write_dataset(seg, seg_file)
    sr = build_sr(results, seg=seg)
    write_dataset(sr, sr_file)
    sc = build_sc(results[0])  # --sc: RLE Lossless, and the same rule
    write_dataset(sc, tmp_path / "sc.dcm")

    for options, syntax in (((), pydicom.uid.ExplicitVRLittleEndian), (("+xa",), pydicom.uid.JPEG2000Lossless)):
        folder = tmp_path / f"pacs{len(options)}"
        with run_storescp(folder, *options) as dest:
            statuses = send([seg_file, sr_file, tmp_path / "sc.dcm"], dest)
        assert list(statuses.values()) == [0, 0, 0], statuses
        (got_sc,) = [pydicom.dcmread(p) for p in folder.iterdir() if p.name.startswith("SC.")]
        assert got_sc.file_meta.TransferSyntaxUID == (pydicom.uid.RLELossless if options else syntax)
        assert np.array_equal(got_sc.pixel_array, sc.pixel_array)
        (got,) = [pydicom.dcmread(p) for p in folder.iterdir() if p.name.startswith("SG.")]
        assert got.file_meta.TransferSyntaxUID == syntax and got.SOPInstanceUID == seg.SOPInstanceUID
        if syntax == pydicom.uid.ExplicitVRLittleEndian:
            assert got.PixelData == plain.PixelData  # exactly what an uncompressed SEG would hold
        assert np.array_equal(got.pixel_array, plain.pixel_array)

    received: list[str] = []

    def on_store(event):  # type: ignore[no-untyped-def]
        received.append(str(event.dataset.SOPClassUID))
        return 0x0000

    ae = AE(ae_title="SRONLY")
    ae.add_supported_context(sr.SOPClassUID)
    port = free_port()
    server = ae.start_server(("127.0.0.1", port), block=False, evt_handlers=[(evt.EVT_C_STORE, on_store)])
    try:
        statuses = send([seg_file, sr_file], Destination("SRONLY", "127.0.0.1", port))
    finally:
        server.shutdown()
    assert statuses == {seg_file: 0x0122, sr_file: 0} and received == [sr.SOPClassUID]


def test_a_file_that_cannot_be_encoded_is_refused_alone(tmp_path):
    """pydicom's SC_rgb_jpeg.dcm names JPEG Baseline (explicit VR) in its meta header but its
    data set turns to implicit VR part way (pydicom warns on reading it): pynetdicom will not
    encode it. That file gets 0x0110 (processing failure) and the association goes on."""
    from pydicom.data import get_testdata_file

    from conftest import run_storescp

    bad = Path(get_testdata_file("SC_rgb_jpeg.dcm"))
    good = SAMPLE_DIR / "ct_stream" / "ct_0001.dcm"
    folder = tmp_path / "pacs"
    with run_storescp(folder, "+xa") as dest:
        statuses = send([bad, good, bad], dest)
    assert statuses == {bad: 0x0110, good: 0}
    (got,) = folder.iterdir()
    assert pydicom.dcmread(got).SOPInstanceUID == pydicom.dcmread(good).SOPInstanceUID
    # A file that is not DICOM at all is named before any association is tried.
    notes = tmp_path / "notes.txt"
    notes.write_text("not DICOM")
    with pytest.raises(ForwardError, match=r"notes\.txt: cannot be sent"):
        send([good, notes], Destination("NOBODY", "127.0.0.1", free_port()))


# -- the listener ----------------------------------------------------------------------------------------------------


def test_dcmtk_sends_a_series_and_the_seg_and_sr_reach_the_pacs(tmp_path, analyzer, storescp):
    dest, pacs = storescp
    spool = Spool(tmp_path / "spool")
    service = PacsService(spool, tmp_path / "out", analyzer, forward=dest, idle_s=0.0)
    with Listener(spool, host="127.0.0.1", port=0, on_stored=service.notify) as listener:
        sent = storescu(listener.port, CT)
        assert sent.returncode == 0, sent.stderr
        assert listener.counts == {"stored": len(CT), "refused": 0, "failed": 0, "commitments": 0}
        # Acknowledged means on disk, byte for byte the file storescu read (-R: no transcoding).
        for src in CT:
            ds = pydicom.dcmread(src, stop_before_pixels=True)
            stored = spool.inbox / ds.SeriesInstanceUID / f"{ds.SOPInstanceUID}.dcm"
            assert pydicom.dcmread(stored).PixelData == pydicom.dcmread(src).PixelData
        (outcome,) = service.run_once()
    assert (outcome.state, outcome.frames, outcome.errors) == ("done", len(CT), 0)
    assert outcome.lesions > 0
    assert spool.series(outcome.series_uid).state == "done"
    received = {pydicom.dcmread(p).Modality: p for p in pacs.iterdir()}
    assert sorted(received) == ["SEG", "SR"] and sorted(outcome.forwarded) == ["seg.dcm", "sr.dcm"]
    seg = pydicom.dcmread(received["SEG"])
    source = pydicom.dcmread(CT[0], stop_before_pixels=True)
    assert seg.StudyInstanceUID == source.StudyInstanceUID and seg.SeriesInstanceUID != source.SeriesInstanceUID
    referenced = {item.ReferencedSOPInstanceUID for item in seg.ReferencedSeriesSequence[0].ReferencedInstanceSequence}
    assert referenced == {pydicom.dcmread(p, stop_before_pixels=True).SOPInstanceUID for p in CT}
    dciodvfy = require_tool("dciodvfy")
    for path in received.values():
        check = subprocess.run([dciodvfy, str(path)], capture_output=True, text=True)
        assert "Error" not in check.stderr + check.stdout, check.stderr
    assert service.run_once() == []  # done is done


def test_a_series_of_two_whole_acquisitions_sent_over_dicom_gets_a_seg_per_pass(tmp_path, analyzer, storescp):
    """A pre- and a post-contrast pass in one series, sent by storescu: the listener's series
    is analysed through the batch, each pass with its own neighbours (a pass of three 5 mm
    slices ends within reach of the next's first), so each pass finds what the other does;
    a SEG per pass, each of its own images, one SR over both, and each lesion in
    lesions.json names its pass; the PACS gets them all."""
    import highdicom as hd

    first, second = two_pass_series(tmp_path / "scanner", TWO_PASS_SLICES_FEET_FIRST)
    uid = {p: str(pydicom.dcmread(p, stop_before_pixels=True).SOPInstanceUID) for p in (*first, *second)}
    twin = {uid[b]: uid[a] for a, b in zip(first, second, strict=True)}
    dest, pacs = storescp
    spool = Spool(tmp_path / "spool")
    service = PacsService(spool, tmp_path / "out", analyzer, forward=dest, idle_s=0.0)
    with Listener(spool, host="127.0.0.1", port=0, on_stored=service.notify) as listener:
        sent = storescu(listener.port, [*first, *second])
        assert sent.returncode == 0, sent.stderr
        (outcome,) = service.run_once()
    assert (outcome.state, outcome.frames, outcome.errors, outcome.skipped) == ("done", 6, 0, 0)
    (folder,) = (outcome.out / "series").iterdir()
    lesions = json.loads((folder / "lesions.json").read_text())["lesions"]
    n = len(lesions) // 2
    assert n > 0 and outcome.lesions == 2 * n
    assert [les["acquisition"] for les in lesions] == [1] * n + [2] * n

    def seen(les: dict) -> tuple:  # where and how large, the second pass's images named as the first's
        return (twin.get(les["largest"]["sop_instance_uid"], les["largest"]["sop_instance_uid"]),
                les["slices"], les["diameter_mm"])

    assert [seen(les) for les in lesions[:n]] == [seen(les) for les in lesions[n:]]
    segs = sorted(folder.glob("seg_*.dcm"))
    assert [p.name for p in segs] == ["seg_1.dcm", "seg_2.dcm"]
    covered = [{str(ref.ReferencedSOPInstanceUID) for ref in
                pydicom.dcmread(p).ReferencedSeriesSequence[0].ReferencedInstanceSequence} for p in segs]
    assert covered == [{uid[p] for p in first}, {uid[p] for p in second}]
    groups = hd.sr.srread(folder / "sr.dcm").content.get_planar_roi_measurement_groups()
    assert {str(g.tracking_uid) for g in groups} == {les["tracking_uid"] for les in lesions}
    received = sorted(pydicom.dcmread(p).Modality for p in pacs.iterdir())
    assert received == ["SEG", "SEG", "SR"] and sorted(outcome.forwarded) == ["seg_1.dcm", "seg_2.dcm", "sr.dcm"]


def test_listener_refuses_what_it_cannot_file_or_store_and_keeps_serving(tmp_path, caplog):
    caplog.set_level("DEBUG", logger="medrt")
    spool = Spool(tmp_path / "spool")
    good = pydicom.dcmread(CT[0])
    good.PatientName, good.PatientID = "DOE^JANE", "PID-314159"
    no_series = pydicom.dcmread(CT[1])
    no_series.PatientName, no_series.PatientID = good.PatientName, good.PatientID
    del no_series.SeriesInstanceUID
    other = pydicom.dcmread(CT[2])
    other.SeriesInstanceUID = "1.2.826.0.1.3680043.8.498.1"
    (spool.inbox / other.SeriesInstanceUID).write_bytes(b"")  # a file where the series folder must go
    with Listener(spool, host="127.0.0.1", port=0) as listener:
        statuses = c_store(listener.port, [no_series, other, good])
        assert statuses == [STATUS_DATASET_MISMATCH, STATUS_OUT_OF_RESOURCES, 0x0000]
        assert listener.counts == {"stored": 1, "refused": 1, "failed": 1, "commitments": 0}
        echo = subprocess.run([require_tool("echoscu"), "-aec", "MEDRT", "127.0.0.1", str(listener.port)],
                              capture_output=True, text=True, timeout=30)
        assert echo.returncode == 0, echo.stderr
    assert [s.series_uid for s in spool.all_series()] == [good.SeriesInstanceUID]  # nothing half-indexed
    assert "DOE" not in caplog.text and "314159" not in caplog.text  # peers by AE title, images by UID
    assert good.SOPInstanceUID in caplog.text and "SCANNER" in caplog.text


def test_a_series_sent_in_jpeg_xl_is_taken_as_sent_and_decodes(tmp_path):
    """JPEG XL is newer than pydicom 3.0; a scanner that proposes only it is still taken
    (and what it sent is filed as it was sent)."""
    import imagecodecs
    from pydicom.encaps import encapsulate

    spool = Spool(tmp_path / "spool")
    sent = []
    for path in CT[:3]:
        ds = pydicom.dcmread(path)
        ds.PixelData = encapsulate([imagecodecs.jpegxl_encode(ds.pixel_array, lossless=True)])
        ds["PixelData"].VR = "OB"
        ds.file_meta.TransferSyntaxUID = "1.2.840.10008.1.2.4.110"
        sent.append(ds)
    with Listener(spool, host="127.0.0.1", port=0) as listener:
        assert c_store(listener.port, sent) == [0, 0, 0]
    (series,) = spool.all_series()
    stored = sorted(spool.paths(series.series_uid))
    assert len(stored) == 3
    from medrt.io.dicom import read_frames

    by_uid = {pydicom.dcmread(p, stop_before_pixels=True).SOPInstanceUID: p for p in stored}
    for original, ds in zip(CT[:3], sent, strict=True):
        (frame,) = read_frames(by_uid[ds.SOPInstanceUID])
        assert frame.source.transfer_syntax_uid == "1.2.840.10008.1.2.4.110"
        assert np.array_equal(frame.pixels, read_frames(original)[0].pixels)


def test_allow_from_closes_connections_from_other_networks(tmp_path, caplog):
    """--allow-from: the site's scanners' and PACS' networks only; any other address has its
    TCP connection closed before any DICOM (a calling AE title is easy to copy, an address
    on the hospital network less so)."""
    from pynetdicom import AE
    from pynetdicom.sop_class import Verification

    def echo(port: int) -> bool:
        ae = AE(ae_title="SCANNER")
        ae.add_requested_context(Verification)
        assoc = ae.associate("127.0.0.1", port, ae_title="MEDRT")
        established = assoc.is_established
        if established:
            assert int(assoc.send_c_echo().Status) == 0
            assoc.release()
        return established

    spool = Spool(tmp_path / "spool")
    with Listener(spool, host="127.0.0.1", port=0, allowed_networks=["10.0.0.0/8", "fd00::/8"]) as listener:
        assert not echo(listener.port)
        assert listener.connections_refused == 1
    with Listener(spool, host="127.0.0.1", port=0, allowed_networks=["10.0.0.0/8", "127.0.0.1"]) as listener:
        assert echo(listener.port) and listener.connections_refused == 0
    assert "connection from 127.0.0.1 refused: not in --allow-from" in caplog.text
    with pytest.raises(SystemExit) as exc:
        main(["listen", "--spool", str(tmp_path / "cli"), "--allow-from", "hospital.lan"])
    assert exc.value.code == 2 and not (tmp_path / "cli").exists()


def test_a_spool_short_of_disk_refuses_images_until_there_is_room(tmp_path, caplog):
    """Below --min-free the listener answers 0xA700 before writing anything (the sender keeps
    the image), instead of filling the disk the index and results share; with room again, the
    same images are taken."""
    spool = Spool(tmp_path / "spool")
    spool.min_free_bytes = spool.free_bytes() + 2**40  # a real statvfs, a watermark above it
    images = [pydicom.dcmread(p) for p in CT[:2]]
    with Listener(spool, host="127.0.0.1", port=0) as listener:
        assert c_store(listener.port, images) == [STATUS_OUT_OF_RESOURCES] * 2
        assert not any(spool.inbox.rglob("*")) and spool.all_series() == []  # nothing written, nothing indexed
        assert "spool disk low" in caplog.text
        spool.min_free_bytes = 2**20
        assert c_store(listener.port, images) == [0x0000, 0x0000]
    assert [s.instances for s in spool.all_series()] == [2]
    with pytest.raises(ValueError, match="min_free_bytes"):
        Spool(tmp_path / "other", min_free_bytes=-1)
    assert main(["listen", "--spool", str(tmp_path / "cli"), "--min-free", "-1"]) == 2


def test_a_broken_image_is_named_and_the_rest_of_its_series_is_analysed(tmp_path, analyzer):
    spool = Spool(tmp_path / "spool")
    datasets = [pydicom.dcmread(p) for p in CT[:4]]
    bad = datasets[1]
    bad.PixelData = bad.PixelData[: len(bad.PixelData) // 3]  # truncated in transit upstream: still encodes
    with Listener(spool, host="127.0.0.1", port=0) as listener:
        assert c_store(listener.port, datasets) == [0, 0, 0, 0]  # all on disk, so all acknowledged
    service = PacsService(spool, tmp_path / "out", analyzer, idle_s=0.0)
    (outcome,) = service.run_once()
    assert (outcome.state, outcome.frames, outcome.errors) == ("done", 3, 1)
    rows = list(csv.DictReader((outcome.out / "errors.csv").open()))
    assert [(r["file"], r["kind"]) for r in rows] == [(f"{bad.SOPInstanceUID}.dcm", "error")]
    assert rows[0]["reason"]


def test_a_finished_series_leaves_nothing_of_its_analysis_behind(tmp_path, analyzer):
    """Series after series, the listener keeps none of a finished series' frames, results
    or pipeline: reference counting frees them as it ends (the collector is off here). A
    cycle through each series' pipeline kept them until a full collection, which a process
    the listener's size runs every several series (+9-15 MB resident per 40-slice series
    meanwhile, session 41)."""
    import gc

    from medrt.pipeline.graph import Pipeline
    from medrt.types import Frame, FrameResult

    sent: set[str] = set()  # this test's series: other tests' objects may be alive in one test run

    def alive() -> dict[str, int]:
        found = {"Frame": 0, "FrameResult": 0, "Pipeline": 0}
        for obj in gc.get_objects():
            if isinstance(obj, Frame) and obj.series_instance_uid in sent:
                found["Frame"] += 1
            elif isinstance(obj, FrameResult) and obj.frame.series_instance_uid in sent:
                found["FrameResult"] += 1
            elif isinstance(obj, Pipeline) and id(obj) not in before:
                found["Pipeline"] += 1
        return found

    spool = Spool(tmp_path / "spool")
    service = PacsService(spool, tmp_path / "out", analyzer, idle_s=0.0)
    enabled = gc.isenabled()
    gc.collect()  # what earlier tests left for the collector
    before = {id(obj) for obj in gc.get_objects() if isinstance(obj, Pipeline)}  # held by others, e.g. fixtures
    gc.disable()
    try:
        with Listener(spool, host="127.0.0.1", port=0) as listener:
            for n in range(4):
                datasets = [pydicom.dcmread(p) for p in CT[:3]]
                study, series = pydicom.uid.generate_uid(), pydicom.uid.generate_uid()
                sent.add(series)
                for ds in datasets:
                    ds.StudyInstanceUID, ds.SeriesInstanceUID = study, series
                    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = pydicom.uid.generate_uid()
                datasets[1].PixelData = datasets[1].PixelData[:100]  # an image that fails: its error is kept too
                assert c_store(listener.port, datasets) == [0, 0, 0]
                del datasets, ds
                (outcome,) = service.run_once()
                assert (outcome.state, outcome.frames, outcome.errors) == ("done", 2, 1)
                assert alive() == {"Frame": 0, "FrameResult": 0, "Pipeline": 0}, f"after series {n + 1}"
    finally:
        if enabled:
            gc.enable()


def test_results_that_cannot_be_written_leave_the_series_failed_and_retried(tmp_path, analyzer):
    """A full disk while a series' results were written left it 'done' with its lesions
    lost (its manifest was written anyway, SEG missing, the SR empty). Now it is 'failed',
    said why, and analysed whole at the next try (here: its results folder could not be
    made, a file in its place, until that was cleared)."""
    spool = Spool(tmp_path / "spool")
    fill(spool, CT[:4])
    uid = pydicom.dcmread(CT[0], stop_before_pixels=True).SeriesInstanceUID
    service = PacsService(spool, tmp_path / "out", analyzer, idle_s=0.0, retry_s=0.0)
    blocker = tmp_path / "out" / uid / "series"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("")
    (outcome,) = service.run_once()
    assert outcome.state == "failed" and "its outputs could not be written" in outcome.detail
    assert spool.series(uid).state == "failed"
    blocker.unlink()
    (outcome,) = service.run_once()
    assert (outcome.state, outcome.frames) == ("done", 4) and outcome.lesions > 0


def test_a_series_left_analysing_by_a_lost_outcome_is_analysed_again(tmp_path, analyzer):
    """The outcome of an analysis could not be recorded (the index's disk full): the series
    stayed 'analysing' until a restart, and `medrt spool --requeue` refused it. The next
    pass makes it 'failed', analysed again after --retry."""
    spool = Spool(tmp_path / "spool")
    fill(spool, CT[:2])
    (state,) = spool.due(0.0, now=100.0)
    assert spool.claim(state.series_uid, expect_received=state.last_received, now=100.0)
    service = PacsService(spool, tmp_path / "out", analyzer, idle_s=0.0, retry_s=60.0)
    assert service.run_once(now=200.0) == []  # released, not yet due again
    left = spool.series(state.series_uid)
    assert (left.state, left.last_attempt) == ("failed", 200.0) and "could not be recorded" in left.detail
    (outcome,) = service.run_once(now=261.0)
    assert (outcome.state, outcome.frames) == ("done", 2)

    # the same for a send whose end could not be recorded: 'forwarding' with no lane on it
    spool.mark(state.series_uid, "analysed")
    assert spool.claim_send(state.series_uid, expect_received=state.last_received, now=300.0)
    assert service.forwarder.run_once(now=400.0) == []
    left = spool.series(state.series_uid)
    assert (left.state, left.last_attempt) == ("unsent", 400.0) and "could not be recorded" in left.detail


def test_a_series_none_of_whose_images_could_be_read_says_nothing_was_analysed(tmp_path, analyzer):
    """Every image cut short upstream: each is acknowledged (it is on disk) and named in
    errors.csv, and the series is done with "nothing analysed" beside it in the log and the
    spool, never as a series analysed and found clean; no SR says "0 lesions" for it."""
    spool = Spool(tmp_path / "spool")
    datasets = [pydicom.dcmread(p) for p in CT[:3]]
    for ds in datasets:
        ds.PixelData = ds.PixelData[: len(ds.PixelData) // 3]
    with Listener(spool, host="127.0.0.1", port=0) as listener:
        assert c_store(listener.port, datasets) == [0, 0, 0]
    service = PacsService(spool, tmp_path / "out", analyzer, idle_s=0.0)
    (outcome,) = service.run_once()
    assert (outcome.state, outcome.frames, outcome.errors) == ("done", 0, 3)
    assert outcome.detail == "nothing analysed (3 error(s), 0 passed over)"
    assert spool.series(outcome.series_uid).detail == outcome.detail
    assert result_files(outcome.out) == []
    assert len(list(csv.DictReader((outcome.out / "errors.csv").open()))) == 3


def test_results_a_pacs_cannot_take_are_kept_and_sent_on_retry(tmp_path, analyzer, storescp):
    dest, pacs = storescp
    spool = Spool(tmp_path / "spool")
    fill(spool, CT[:3])
    down = Destination("PACS", "127.0.0.1", free_port())
    service = PacsService(spool, tmp_path / "out", analyzer, forward=down, idle_s=0.0, retry_s=60.0)
    (outcome,) = service.run_once()
    assert outcome.state == "unsent" and str(down) in outcome.detail and outcome.forwarded == []
    assert outcome.analysed and outcome.frames == 3
    assert spool.series(outcome.series_uid).state == "unsent"  # for the forwarder, not the analysis worker
    assert spool.due(0.0, retry_s=0.0) == []
    assert [p.name for p in result_files(outcome.out)] == ["seg.dcm", "sr.dcm"]  # kept for the retry
    before = (outcome.out / "results.jsonl").read_bytes()
    assert service.run_once() == []  # not before retry_s
    service.forward = dest
    (again,) = service.run_once(now=time.time() + 61.0)
    assert again.state == "done" and sorted(again.forwarded) == ["seg.dcm", "sr.dcm"]
    assert not again.analysed and again.frames == 3  # sent again, not analysed again (counts from its report)
    assert (outcome.out / "results.jsonl").read_bytes() == before
    assert len(list(pacs.iterdir())) == 2

    # Another image comes: new results, so the PACS is sent them although it took the old ones.
    seg = next(p for p in result_files(again.out) if p.name == "seg.dcm")
    held = spool.deliveries(again.series_uid, str(dest))
    assert sorted(held) == ["series/" + seg.parent.name + "/seg.dcm", "series/" + seg.parent.name + "/sr.dcm"]
    fill(spool, CT[3:4])
    (more,) = service.run_once(now=time.time() + 61.0)
    assert more.state == "done" and more.frames == 4 and more.sent == {str(dest): 2}
    assert spool.deliveries(again.series_uid, str(dest)) != held


class SilentPeer:
    """A host that takes TCP connections and never says a word (a hung PACS, or a proxy in
    front of one that is gone): counts the connections it got."""

    def __init__(self) -> None:
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        try:
            while True:
                conn, _ = self.sock.accept()
                self.accepted.append(conn)
        except OSError:
            return

    def close(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            conn.close()


def test_a_destination_that_never_answers_holds_up_one_series_not_each(tmp_path, analyzer, storescp):
    """Three series due and the PACS hung: the first waits for --forward-timeout, the other two
    are failed at once (not tried before --retry), and all three go out once it is back."""
    dest, pacs = storescp
    silent = SilentPeer()
    spool = Spool(tmp_path / "spool")
    for n in range(3):
        for path in CT[3 * n:3 * n + 3]:
            ds = pydicom.dcmread(path, stop_before_pixels=True)
            spool.store(path.read_bytes(), study_uid=ds.StudyInstanceUID, series_uid=f"1.2.826.0.1.3680043.8.498.5{n}",
                        sop_uid=ds.SOPInstanceUID, now=1.0)
    hung = Destination("PACS", "127.0.0.1", silent.port)
    service = PacsService(spool, tmp_path / "out", analyzer, forward=hung, idle_s=0.0, retry_s=60.0,
                          forward_timeout_s=1.0)
    try:
        outcomes = service.run_once()
        assert [o.state for o in outcomes] == ["unsent"] * 3
        assert len(silent.accepted) == 1  # asked once, not once per series
        assert all(f"{hung} not tried: it took nothing" in o.detail for o in outcomes[1:])
        assert all(o.refused == {str(hung): 2} for o in outcomes)
    finally:
        silent.close()
    service.forward = dest  # back, at its address
    later = service.run_once(now=time.time() + 61.0)
    assert [o.state for o in later] == ["done"] * 3 and len(list(pacs.iterdir())) == 6


def running(tmp_path: Path, analyzer, forward) -> tuple[Spool, PacsService, list]:
    """A listener's worker and forwarder on their threads, as ``medrt listen`` runs them
    (retries far off, a long forward timeout): the spool, the service, and its outcomes.
    A series is due a second after its last image: with no quiet time at all, the worker's
    tick could take a series :func:`arrive` was still storing (a loaded machine: a CI
    clone beside the tests) and analyse it twice, with one slice and then three."""
    spool = Spool(tmp_path / "spool")
    service = PacsService(spool, tmp_path / "out", analyzer, forward=forward, idle_s=1.0, retry_s=600.0,
                          forward_timeout_s=120.0)
    done: list = []
    service.on_outcome = done.append
    service.start(tick_s=0.1)
    return spool, service, done


def arrive(spool: Spool, service: PacsService, uid: str, files: list[Path]) -> None:
    """A series sent as a scanner would, under a UID of its own, and the worker told."""
    for n, path in enumerate(files):
        ds = pydicom.dcmread(path, stop_before_pixels=True)
        spool.store(path.read_bytes(), study_uid=ds.StudyInstanceUID, series_uid=uid, sop_uid=f"{uid}.{n + 1}")
    service.notify()


def test_the_wait_after_a_dead_peer_counts_from_its_failure(tmp_path, analyzer):
    """--forward-timeout longer than --retry: the series queued behind the one that timed
    out is not sent to the dead peer again at once (the wait counts from the failure, not
    from when the first send began)."""
    silent = SilentPeer()
    hung = Destination("PACS", "127.0.0.1", silent.port)
    spool = Spool(tmp_path / "spool")
    service = PacsService(spool, tmp_path / "out", analyzer, forward=hung, idle_s=0.0, retry_s=3.0,
                          forward_timeout_s=4.0)  # the next send starts well inside 3 s of the failure
    try:
        arrive(spool, service, "1.2.826.0.1.3680043.8.498.91", CT[:3])
        arrive(spool, service, "1.2.826.0.1.3680043.8.498.92", CT[3:6])
        outcomes = service.run_once()
    finally:
        silent.close()
    assert [o.state for o in outcomes] == ["unsent", "unsent"] and len(silent.accepted) == 1
    assert "not tried: it took nothing" in outcomes[1].detail


def test_an_unsent_series_is_tried_again_retry_after_its_send_failed(tmp_path, analyzer):
    """The spool dated an unsent series' retry from when its send began, the destination's
    from when it failed (a --forward-timeout later): each retry in between was "not tried",
    so a PACS that came back waited twice --retry. Both now count from the failure."""
    silent = SilentPeer()
    hung = Destination("PACS", "127.0.0.1", silent.port)
    spool = Spool(tmp_path / "spool")
    service = PacsService(spool, tmp_path / "out", analyzer, forward=hung, idle_s=0.0, retry_s=1.5,
                          forward_timeout_s=1.5)
    uid = "1.2.826.0.1.3680043.8.498.93"
    try:
        arrive(spool, service, uid, CT[:2])
        (first,) = service.run_once()
        failed = time.time()
        assert first.state == "unsent" and len(silent.accepted) == 1
        assert spool.series(uid).last_attempt >= failed - 1.0  # the failure, not the claim 1.5 s before it
        deadline = time.monotonic() + 30
        while not spool.to_send(retry_s=1.5) and time.monotonic() < deadline:
            time.sleep(0.1)
        (second,) = service.run_once()
    finally:
        silent.close()
    assert "not tried" not in second.detail and len(silent.accepted) == 2, second.detail


def test_a_series_the_forwarder_claims_the_moment_it_is_analysed_keeps_its_analysis(tmp_path, analyzer, storescp):
    """The forwarder's thread may claim a series between the worker's mark and its next
    line: the outcome it reports is still the analysis' (frames, lesions counted once by
    the monitor), not a resend's."""
    dest, pacs = storescp

    class RacingSpool(Spool):
        forwarder = None

        def mark(self, series_uid, state, *args, **kwargs):
            marked = super().mark(series_uid, state, *args, **kwargs)
            if state == "analysed" and self.forwarder is not None:
                self.forwarder.run_once(wait=True)  # the forwarder's thread, the instant it is marked
            return marked

    spool = RacingSpool(tmp_path / "spool")
    fill(spool, CT[:3])
    service = PacsService(spool, tmp_path / "out", analyzer, forward=dest, idle_s=0.0)
    spool.forwarder = service.forwarder
    service.run_once()
    (outcome,) = service.outcomes
    assert outcome.state == "done" and outcome.analysed and outcome.frames == 3
    assert outcome.sent == {str(dest): 2} and len(list(pacs.iterdir())) == 2


def wait_for(what, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout_s} s")


def test_a_hung_pacs_does_not_hold_up_the_analysis_of_the_next_series(tmp_path, analyzer):
    """The worker and the forwarder on their threads, as ``medrt listen`` runs them: while the
    forwarder waits on a PACS that accepted the connection and says nothing, the next series
    is analysed (and waits in the PACS's lane); each is left ``unsent`` once the PACS goes,
    and nothing is analysed twice."""
    silent = SilentPeer()
    hung = Destination("PACS", "127.0.0.1", silent.port)
    spool, service, done = running(tmp_path, analyzer, hung)
    first, second = "1.2.826.0.1.3680043.8.498.61", "1.2.826.0.1.3680043.8.498.62"
    try:
        arrive(spool, service, first, CT[:3])
        wait_for(lambda: silent.accepted and spool.series(first).state == "forwarding")  # hung on the PACS
        arrive(spool, service, second, CT[3:6])
        # analysed while the first is being sent, then queued behind it
        wait_for(lambda: spool.series(second).state == "forwarding")
        assert spool.series(first).state == "forwarding" and done == []
        assert (tmp_path / "out" / second / "results.jsonl").is_file() and service.forwarder.busy(second)
        silent.close()  # the PACS goes away: the forwarder's association ends
        wait_for(lambda: len(done) == 2)
    finally:
        silent.close()
        service.stop()
    assert [(o.series_uid, o.state) for o in done] == [(first, "unsent"), (second, "unsent")]
    assert all(o.analysed and o.frames == 3 and o.refused == {str(hung): 2} for o in done)
    assert "not tried: it took nothing" in done[1].detail  # the second did not wait for a timeout of its own
    assert [s.attempts for s in spool.all_series()] == [2, 2]  # analysed once, sent once


def test_a_hung_archive_does_not_hold_back_the_workstation(tmp_path, analyzer, storescp):
    """Two destinations, the archive hung: the workstation (DCMTK's storescp) has both
    series' results while the archive still holds its association open on the first; each
    series is ``unsent`` for the archive alone, and the workstation is never sent one twice."""
    workstation, received = storescp
    silent = SilentPeer()
    archive = Destination("ARCHIVE", "127.0.0.1", silent.port)
    spool, service, done = running(tmp_path, analyzer, [archive, workstation])
    first, second = "1.2.826.0.1.3680043.8.498.71", "1.2.826.0.1.3680043.8.498.72"
    try:
        arrive(spool, service, first, CT[:3])
        arrive(spool, service, second, CT[3:6])
        wait_for(lambda: len(list(received.iterdir())) == 4)  # SEG and SR of each at the workstation...
        assert len(silent.accepted) == 1 and done == []  # ...the archive hung on the first
        # the workstation's lane drains; the archive's holds both series (one being sent)
        wait_for(lambda: service.forwarder.backlog() == {str(archive): 2, str(workstation): 0})
        assert [spool.series(uid).state for uid in (first, second)] == ["forwarding", "forwarding"]
        silent.close()
        wait_for(lambda: len(done) == 2)
    finally:
        silent.close()
        service.stop()
    assert [(o.series_uid, o.state) for o in done] == [(first, "unsent"), (second, "unsent")]
    for outcome in done:
        assert outcome.sent == {str(archive): 0, str(workstation): 2}
        assert outcome.refused == {str(archive): 2, str(workstation): 0} and str(archive) in outcome.detail
        assert str(workstation) not in outcome.detail
        assert len(spool.deliveries(outcome.series_uid, str(workstation))) == 2
    assert "not tried: it took nothing" in done[1].detail  # the archive's lane did not wait out a second timeout


def test_late_images_take_a_series_out_of_a_hung_archives_queue(tmp_path, analyzer, storescp):
    """A series waiting in the archive's lane behind a hung send gets a late slice: it is
    analysed again at once and the workstation has the new results while the archive is
    still hung (not once the archive's queue reaches it), and the archive is sent only the
    new version."""
    workstation, received = storescp
    silent = SilentPeer()
    archive = Destination("ARCHIVE", "127.0.0.1", silent.port)
    spool, service, done = running(tmp_path, analyzer, [archive, workstation])
    first, second = "1.2.826.0.1.3680043.8.498.73", "1.2.826.0.1.3680043.8.498.74"
    try:
        arrive(spool, service, first, CT[:3])
        arrive(spool, service, second, CT[3:6])
        wait_for(lambda: len(list(received.iterdir())) == 4)  # the workstation has both...
        wait_for(lambda: service.forwarder.backlog()[str(archive)] == 2)  # ...the archive hung on the first
        ds = pydicom.dcmread(CT[6], stop_before_pixels=True)  # a late slice of the second
        spool.store(CT[6].read_bytes(), study_uid=ds.StudyInstanceUID, series_uid=second, sop_uid=f"{second}.4")
        service.notify()
        recalled = wait_for(lambda: next((o for o in done if o.series_uid == second), None), timeout_s=30.0)
        assert recalled.state == "receiving" and str(archive) in recalled.detail and recalled.forwarded == []
        assert recalled.sent == {str(archive): 0, str(workstation): 2}
        # analysed again with four slices, its new SEG and SR at the workstation; the archive still hung
        wait_for(lambda: len(list(received.iterdir())) == 6, timeout_s=30.0)
        assert len(silent.accepted) == 1 and not [o for o in done if o.series_uid == first]
        assert service.forwarder.backlog()[str(archive)] == 2  # the first, and the second's new version
        assert json.loads((tmp_path / "out" / second / "report.json").read_text())["counts"]["frames"] == 4
        silent.close()
        wait_for(lambda: len(done) == 3)
    finally:
        silent.close()
        service.stop()
    assert [(o.series_uid, o.state) for o in done] == [(second, "receiving"), (first, "unsent"), (second, "unsent")]
    assert done[2].frames == 4 and done[2].sent == {str(archive): 0, str(workstation): 2}


def test_a_series_waiting_in_a_lane_at_stop_is_sent_at_the_next_start(tmp_path, analyzer, storescp):
    """Stopped while a series waits behind a hung PACS: it is left ``analysed`` (not
    ``unsent`` for --retry, not ``forwarding``), and the next start sends it at once."""
    dest, pacs = storescp
    silent = SilentPeer()
    spool, service, _ = running(tmp_path, analyzer, Destination("PACS", "127.0.0.1", silent.port))
    first, second = "1.2.826.0.1.3680043.8.498.81", "1.2.826.0.1.3680043.8.498.82"
    try:
        arrive(spool, service, first, CT[:3])
        arrive(spool, service, second, CT[3:6])
        wait_for(lambda: silent.accepted and spool.series(second).state == "forwarding")
        service.stop(timeout_s=0.5)  # the send to the hung PACS goes on past the stop...
        silent.close()  # ...until the PACS goes; the series behind it is not sent
        wait_for(lambda: spool.series(second).state == "analysed")
        wait_for(lambda: not service.forwarder.busy(second))
    finally:
        silent.close()
        service.stop()
    assert spool.series(first).state == "unsent" and "stopped before" in spool.series(second).detail
    again = PacsService(spool, tmp_path / "out", analyzer, forward=dest, idle_s=0.0, retry_s=600.0)
    (outcome,) = again.run_once()  # the unsent first waits for --retry; the second goes now
    assert (outcome.series_uid, outcome.state, outcome.analysed) == (second, "done", False)
    assert len(list(pacs.iterdir())) == 2


def test_a_send_that_outlives_the_stop_ends_quietly_and_is_sent_at_the_next_start(tmp_path, analyzer, storescp,
                                                                                   caplog):
    """``medrt listen`` closes the spool once the stop's wait is over; a send to a hung PACS
    that ends after that cannot record anything: one warning (no traceback), and the next
    start finds both series ``analysed`` and sends them."""
    import logging

    dest, pacs = storescp
    silent = SilentPeer()
    spool, service, _ = running(tmp_path, analyzer, Destination("PACS", "127.0.0.1", silent.port))
    first, second = "1.2.826.0.1.3680043.8.498.83", "1.2.826.0.1.3680043.8.498.84"
    try:
        arrive(spool, service, first, CT[:3])
        arrive(spool, service, second, CT[3:6])
        wait_for(lambda: silent.accepted and spool.series(second).state == "forwarding")
        service.stop(timeout_s=0.5)
        spool.close()
        with caplog.at_level(logging.WARNING, logger="medrt"):
            silent.close()  # the send fails now, against a closed spool
            wait_for(lambda: not service.forwarder.busy(first) and not service.forwarder.busy(second))
    finally:
        silent.close()
        service.stop()
    ours = [r for r in caplog.records if r.name.startswith("medrt")]
    assert not [r for r in ours if r.exc_info or r.levelno >= logging.ERROR], "noise after the stop"
    ended = [r.getMessage() for r in ours if "the next start sends it" in r.getMessage()]
    assert any(first in m for m in ended) and any(second in m for m in ended)
    spool = Spool(tmp_path / "spool")
    assert spool.recover()["requeued"] == 2
    assert spool.series(first).state == spool.series(second).state == "analysed"
    again = PacsService(spool, tmp_path / "out", analyzer, forward=dest, idle_s=0.0, retry_s=600.0)
    outcomes = again.run_once()
    assert sorted((o.series_uid, o.state, o.analysed) for o in outcomes) == [(first, "done", False),
                                                                           (second, "done", False)]
    assert len(list(pacs.iterdir())) == 4
    spool.close()


def test_a_series_caught_being_sent_is_sent_again_after_a_restart_not_analysed_again(tmp_path, analyzer, storescp):
    dest, pacs = storescp
    spool = Spool(tmp_path / "spool")
    fill(spool, CT[:3])
    uid = pydicom.dcmread(CT[0], stop_before_pixels=True).SeriesInstanceUID
    service = PacsService(spool, tmp_path / "out", analyzer, idle_s=0.0)
    (outcome,) = service.run_once()  # nowhere to send: done
    assert outcome.state == "done" and outcome.destinations == []
    spool.mark(uid, "forwarding")  # as a process killed while sending would have left it
    spool.close()

    spool = Spool(tmp_path / "spool")
    assert spool.recover()["requeued"] == 1 and spool.series(uid).state == "analysed"
    before = (outcome.out / "results.jsonl").read_bytes()
    service = PacsService(spool, tmp_path / "out", analyzer, forward=dest, idle_s=0.0)
    (again,) = service.run_once()
    assert again.state == "done" and not again.analysed and again.frames == 3 and again.sent == {str(dest): 2}
    assert (outcome.out / "results.jsonl").read_bytes() == before and len(list(pacs.iterdir())) == 2

    # Its results gone meanwhile (a results disk replaced): analysed again, not "done" with nothing sent.
    import shutil

    spool.mark(uid, "analysed")
    shutil.rmtree(outcome.out / "series")
    (missing,) = service.run_once()
    assert missing.state == "receiving" and "no results" in missing.detail
    (redone,) = service.run_once()
    assert redone.state == "done" and redone.analysed and redone.sent == {str(dest): 2}


def test_a_host_that_drops_connections_times_out_as_asked(tmp_path):
    """A peer whose host drops SYNs (here: a full accept queue) fails after the timeout given,
    not the two minutes of the OS's connect retries."""
    import socket

    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    port = full.getsockname()[1]
    queued = []
    for _ in range(3):  # fill the accept queue; later SYNs are dropped
        c = socket.socket()
        c.setblocking(False)
        c.connect_ex(("127.0.0.1", port))
        queued.append(c)
    time.sleep(0.2)
    t0 = time.monotonic()
    try:
        with pytest.raises(ForwardError, match=r"PACS@127\.0\.0\.1:\d+: no answer within 2 s \(--forward-timeout"):
            send([CT[0]], Destination("PACS", "127.0.0.1", port), timeout_s=2.0)
        assert time.monotonic() - t0 < 60.0  # two minutes without connection_timeout; 2 s with it
    finally:
        for c in queued:
            c.close()
        full.close()


def test_a_dicomweb_server_with_a_request_size_limit_is_sent_one_object_per_request(tmp_path, analyzer):
    """HTTP 413 for the series in one request: medrt sends the objects one per request; one
    too large even alone is refused and named, and the others are taken."""
    import email
    import io
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from medrt.pacs.stow import StowDestination, send_stow

    requests_seen: list[int] = []  # objects per request that the server read
    limit = {"bytes": 0}

    class Limited(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if len(body) > limit["bytes"]:
                self.send_response(413, "Payload Too Large")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            message = email.message_from_bytes(b"Content-Type: " + self.headers["Content-Type"].encode() + b"\r\n\r\n"
                                               + body)
            uids = [pydicom.dcmread(io.BytesIO(part.get_payload(decode=True))).SOPInstanceUID
                    for part in message.get_payload()]
            requests_seen.append(len(uids))
            reply = json.dumps({"00081199": {"vr": "SQ", "Value": [
                {"00081155": {"vr": "UI", "Value": [str(u)]}} for u in uids]}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/dicom+json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Limited)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        spool = Spool(tmp_path / "spool")
        fill(spool, CT[:3])
        web = StowDestination.parse(f"http://127.0.0.1:{server.server_address[1]}/dicom-web")
        service = PacsService(spool, tmp_path / "out", analyzer, idle_s=0.0)
        (analysed,) = service.run_once()
        files = result_files(analysed.out)
        sizes = sorted(p.stat().st_size for p in files)
        assert len(files) == 2 and sizes[0] < sizes[1]
        limit["bytes"] = sizes[1] + 4096  # each alone fits, both together do not
        assert send_stow(files, web) == dict.fromkeys(files, 0)
        assert requests_seen == [1, 1]
        limit["bytes"] = sizes[0] + 4096  # the larger one never fits
        with pytest.raises(ForwardError, match=r"HTTP 413: too large for the server even alone: \S+\.dcm \(") as info:
            send_stow(files, web)
        assert sorted(info.value.statuses.values()) == [0, 0xA700] and requests_seen == [1, 1, 1]
    finally:
        server.shutdown()


def test_a_dicomweb_server_that_refuses_us_is_named_with_the_reason(tmp_path, analyzer, monkeypatch):
    """STOW-RS to a server that answers 401: the series fails saying which credentials medrt
    reads; a URL with credentials in it is refused before anything starts."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from medrt.pacs.stow import StowDestination

    seen: list[str] = []

    class Refuse(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            seen.append(self.headers.get("Authorization", ""))
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(401, "Unauthorized")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("MEDRT_DICOMWEB_TOKEN", "not-a-real-token")
    try:
        spool = Spool(tmp_path / "spool")
        fill(spool, CT[:3])
        web = StowDestination.parse(f"http://127.0.0.1:{server.server_address[1]}/dicom-web/")
        assert str(web).endswith("/dicom-web")
        service = PacsService(spool, tmp_path / "out", analyzer, forward=web, idle_s=0.0)
        (outcome,) = service.run_once()
    finally:
        server.shutdown()
    assert outcome.state == "unsent" and outcome.refused == {str(web): 2}
    assert f"{web}: HTTP 401 Unauthorized (credentials: MEDRT_DICOMWEB_TOKEN" in outcome.detail
    assert seen == ["Bearer not-a-real-token"]  # the token from the environment, on the one request
    for bad, why in (("https://user:pw@pacs/dicom-web", "no credentials in the URL"),
                     ("https://pacs/dicom-web?x=1", "no query"), ("ftp://pacs/x", "expected a DICOMweb URL")):
        with pytest.raises(ValueError, match=why):
            StowDestination.parse(bad)
    run = subprocess.run([sys.executable, "-m", "medrt", "listen", "--spool", str(tmp_path / "s"), "--forward",
                          "https://user:hunter2@pacs/dicom-web"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "no credentials in the URL" in run.stderr and "hunter2" not in run.stderr


def test_medrt_spool_lists_the_queue_and_requeues_by_hand(tmp_path, analyzer, storescp, capsys):
    """What the people running the listener see, and "send those results again" after a PACS lost them."""
    import json

    dest, pacs = storescp
    root = tmp_path / "spool"
    spool = Spool(root)
    fill(spool, CT[:3])
    uid = pydicom.dcmread(CT[0], stop_before_pixels=True).SeriesInstanceUID
    for other, state, detail in (("1.2.826.0.1.3680043.8.498.2", "unsent", "forwarding failed: the PACS was down"),
                                 ("1.2.826.0.1.3680043.8.498.3", "analysing", "")):
        ds = pydicom.dcmread(CT[3], stop_before_pixels=True)
        spool.store(CT[3].read_bytes(), study_uid=ds.StudyInstanceUID, series_uid=other,
                    sop_uid=f"{other}.1", modality="CT", calling_ae="SCANNER", now=2.0)
        assert spool.claim(other, expect_received=2.0)  # tried just now ...
        if state == "unsent":
            spool.mark(other, state, detail)  # ... and the PACS said no
    service = PacsService(spool, tmp_path / "out", analyzer, forward=dest, idle_s=0.0, retry_s=1e9)
    (first,) = service.run_once()
    assert first.state == "done" and sorted(first.forwarded) == ["seg.dcm", "sr.dcm"]
    # the pass released the series no analysis held (failed, due after retry_s); the listener
    # analysing it now, as `medrt spool` in another shell sees it:
    assert spool.series("1.2.826.0.1.3680043.8.498.3").state == "failed"
    assert spool.claim("1.2.826.0.1.3680043.8.498.3", expect_received=2.0)
    capsys.readouterr()

    assert main(["spool", str(root)]) == 0
    table = capsys.readouterr().out
    assert "done             3      " in table and uid in table
    assert f"sent: {dest} (2)" in table  # the PACS took the SEG and SR
    assert "unsent" in table and "forwarding failed: the PACS was down" in table and "SCANNER" in table
    assert "3 series (1 analysing, 1 unsent, 1 done), 5 image(s)" in table and "MiB free on its disk" in table
    assert main(["spool", str(root), "--state", "unsent"]) == 0
    assert uid not in capsys.readouterr().out

    assert main(["spool", str(root), "--requeue", uid, "1.2.826.0.1.3680043.8.498.3", "1.2.3"]) == 1
    out, err = capsys.readouterr()
    assert f"series {uid}: done -> requeued" in out
    assert "series 1.2.826.0.1.3680043.8.498.3 is analysing now; not requeued" in err
    assert "series 1.2.3: not in this spool" in err
    results = first.out / "results.jsonl"
    before = results.read_bytes()
    (again,) = service.run_once()  # the requeued series only; the unsent one waits for retry_s
    assert again.series_uid == uid and again.state == "done" and sorted(again.forwarded) == ["seg.dcm", "sr.dcm"]
    assert results.read_bytes() == before and again.frames == 3  # resumed, not analysed again; sent again
    assert again.sent == {str(dest): 2}  # a requeue forgets what the PACS took: it lost them
    assert len(list(pacs.iterdir())) >= 2

    assert spool.claim("1.2.826.0.1.3680043.8.498.3", expect_received=2.0)  # being analysed again
    assert main(["spool", str(root), "--requeue-failed", "--json"]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    states = {r["series_uid"]: r["state"] for r in report["series"]}
    assert {r["series_uid"]: r["delivered"] for r in report["series"]}[uid] == {str(dest): 2}  # sent again
    assert states == {uid: "done", "1.2.826.0.1.3680043.8.498.2": "receiving", "1.2.826.0.1.3680043.8.498.3":
                      "analysing"}
    assert "unsent -> requeued" in err and report["totals"]["instances"] == 5 and report["free_bytes"] > 0
    assert spool.due(0.0)[0].series_uid == "1.2.826.0.1.3680043.8.498.2"  # due now, not after retry_s

    assert main(["spool", str(tmp_path / "elsewhere")]) == 2
    assert "not a medrt spool" in capsys.readouterr().err and not (tmp_path / "elsewhere").exists()


def test_forward_error_names_the_destination_and_what_went_wrong(tmp_path):
    """IT reads these in the log and in `medrt spool`: a refused connection, a peer that never
    answers and a rejected association each say so (all three read "association aborted
    (is MEDRT known to it, and is it listening?)" before)."""
    port = free_port()
    with pytest.raises(ForwardError, match=rf"NOBODY@127\.0\.0\.1:{port}: cannot connect to 127\.0\.0\.1:{port}: "
                                           r"connection refused \(is it listening\?\)"):
        send([CT[0]], Destination.parse(f"NOBODY@127.0.0.1:{port}"))
    silent = SilentPeer()
    try:
        with pytest.raises(ForwardError, match=r"no answer within 1 s \(--forward-timeout"):
            send([CT[0]], Destination("HUNG", "127.0.0.1", silent.port), timeout_s=1.0)
    finally:
        silent.close()
    spool = Spool(tmp_path / "spool")
    with Listener(spool, host="127.0.0.1", port=0, allowed_callers=["SCANNER"]) as listener:
        with pytest.raises(ForwardError, match=r"association rejected \(is MEDRT known to it as a calling AE title"):
            send([CT[0]], Destination("MEDRT", "127.0.0.1", listener.port))
    assert Destination.parse("ORTHANC@[::1]:4242") == Destination("ORTHANC", "::1", 4242)
    for text in ("ORTHANC@host", "@host:1", "A@h:99999"):
        with pytest.raises(ValueError, match="AET@HOST:PORT"):
            Destination.parse(text)


def test_medrt_listen_finishes_what_a_crash_left_in_the_spool(tmp_path, storescp):
    """Stored and acknowledged, then the process died mid-analysis: the next start does it."""
    import signal
    import sys

    dest, pacs = storescp
    spool = Spool(tmp_path / "spool")
    fill(spool, CT[:3])
    (state,) = spool.due(0.0)
    assert spool.claim(state.series_uid, expect_received=state.last_received)  # ... and then the crash
    spool.close()
    cmd = [sys.executable, "-m", "medrt", "listen", "--spool", str(tmp_path / "spool"), "--bind", "127.0.0.1",
           "--port", "0", "--idle", "0", "--forward", str(dest), "--threads", "1", "--workers", "1",
           "--min-free", str(2**40),  # more than any disk: new images would be refused, stored ones go on
           "--seg-compression", "jpeg2000"]  # storescp takes it only uncompressed: it gets it so
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if line.startswith(f"series {state.series_uid}:"):
                break
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    text = "".join(lines) + rest
    assert proc.returncode == 0, text
    assert "(1 series to finish, 1 resumed)" in text and "MiB free on the spool's disk" in text
    assert "below --min-free 1099511627776 MiB: images are refused" in text
    assert f"series {state.series_uid}: done, 3 frame(s)" in text and "2 object(s) forwarded" in text
    assert "medrt listen: stopped; 0 image(s) stored" in text and "1 series outcome(s) (1 done)" in text
    assert len(list(pacs.iterdir())) == 2
    results = tmp_path / "spool" / "results" / state.series_uid
    assert (results / "results.jsonl").is_file()
    (kept,), (sent,) = ([pydicom.dcmread(p) for p in folder.rglob(name)] for folder, name in
                        ((results, "seg.dcm"), (pacs, "SG.*")))
    assert kept.file_meta.TransferSyntaxUID == pydicom.uid.JPEG2000Lossless
    assert sent.file_meta.TransferSyntaxUID == pydicom.uid.ExplicitVRLittleEndian
    assert np.array_equal(sent.pixel_array, kept.pixel_array)


def test_medrt_listen_explains_a_bad_destination(tmp_path):
    import sys

    run = subprocess.run([sys.executable, "-m", "medrt", "listen", "--spool", str(tmp_path / "s"), "--forward",
                          "pacs.local:4242"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "expected AET@HOST:PORT" in run.stderr
    assert not (tmp_path / "s").exists()


def test_purge_deletes_the_images_of_done_series_only_once_they_are_old(tmp_path, analyzer):
    spool = Spool(tmp_path / "spool")
    fill(spool, CT[:2], now=1.0)
    other = pydicom.dcmread(CT[2])
    other.SeriesInstanceUID = "1.2.826.0.1.3680043.8.498.2"
    spool.store(CT[2].read_bytes(), study_uid=other.StudyInstanceUID, series_uid=other.SeriesInstanceUID,
                sop_uid=other.SOPInstanceUID, now=1.0)
    spool.mark(other.SeriesInstanceUID, "failed", "the PACS was down")
    service = PacsService(spool, tmp_path / "out", analyzer, idle_s=0.0, retry_s=1e9, keep_s=100.0)
    (outcome,) = service.run_once(now=50.0)  # the failed one is not due (retry_s)
    assert outcome.state == "done" and spool.series_dir(outcome.series_uid).is_dir()  # 49 s old: kept
    assert spool.deliveries(outcome.series_uid, "PACS@pacs:104") == {}
    spool.record_deliveries(outcome.series_uid, "PACS@pacs:104", {"series/1/seg.dcm": "ab"})
    assert spool.deliveries(outcome.series_uid, "PACS@pacs:104") == {"series/1/seg.dcm": "ab"}
    service.run_once(now=102.0)
    assert spool.deliveries(outcome.series_uid, "PACS@pacs:104") == {}  # forgotten with the series
    assert spool.series(outcome.series_uid) is None and not spool.series_dir(outcome.series_uid).exists()
    assert spool.paths(outcome.series_uid) == []
    assert (outcome.out / "results.jsonl").is_file() and result_files(outcome.out)  # results stay
    assert spool.series(other.SeriesInstanceUID).state == "failed"  # never purged before it is done
    assert spool.series_dir(other.SeriesInstanceUID).is_dir()


def test_two_scanners_at_once_each_series_whole(tmp_path):
    import threading

    spool = Spool(tmp_path / "spool")
    a = [pydicom.dcmread(p) for p in CT[:5]]
    b = [pydicom.dcmread(p) for p in CT[5:10]]
    for i, ds in enumerate(b):
        ds.SeriesInstanceUID = "1.2.826.0.1.3680043.8.498.3"
        ds.SOPInstanceUID = f"1.2.826.0.1.3680043.8.498.3.{i + 1}"
    with Listener(spool, host="127.0.0.1", port=0) as listener:
        statuses: dict[str, list[int]] = {}
        threads = [threading.Thread(target=lambda k, d: statuses.__setitem__(k, c_store(listener.port, d)),
                                    args=(k, d)) for k, d in (("a", a), ("b", b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert statuses == {"a": [0] * 5, "b": [0] * 5}
    assert sorted((s.series_uid, s.instances) for s in spool.all_series()) == sorted(
        [(a[0].SeriesInstanceUID, 5), (b[0].SeriesInstanceUID, 5)])


def test_dicom_over_tls_from_dcmtk_and_forwarded_over_tls(tmp_path, analyzer):
    """storescu +tls to the listener, which checks the sender's certificate; the results go
    to a second TLS listener, whose certificate the forward checks. Without a client
    certificate the association fails; nothing is stored."""
    from conftest import pynetdicom_test_dir
    from medrt.pacs.scp import server_tls
    from medrt.pacs.scu import client_tls

    certs = pynetdicom_test_dir().parent / "cert_files"
    server = server_tls(certs / "server.crt", certs / "server.key", ca=certs / "client.crt")
    spool, pacs_spool = Spool(tmp_path / "spool"), Spool(tmp_path / "pacs")
    with Listener(spool, host="127.0.0.1", port=0, tls=server) as listener, \
            Listener(pacs_spool, ae_title="PACS", host="127.0.0.1", port=0, tls=server_tls(
                certs / "server.crt", certs / "server.key")) as pacs:
        tls = ["+tls", str(certs / "client.key"), str(certs / "client.crt"), "+cf", str(certs / "server.crt")]
        sent = storescu(listener.port, CT[:3], *tls)
        assert sent.returncode == 0, sent.stderr
        refused = storescu(listener.port, CT[3:4], "+tla", "+cf", str(certs / "server.crt"))  # no client certificate
        assert refused.returncode != 0
        plain = storescu(listener.port, CT[3:4])  # not TLS at all
        assert plain.returncode != 0
        assert listener.counts["stored"] == 3 and len(spool.paths(pydicom.dcmread(CT[0]).SeriesInstanceUID)) == 3
        forward = client_tls(ca=certs / "server.crt", cert=certs / "client.crt", key=certs / "client.key")
        service = PacsService(spool, tmp_path / "out", analyzer, idle_s=0.0,
                              forward=Destination("PACS", "127.0.0.1", pacs.port), forward_tls=forward)
        (outcome,) = service.run_once()
        assert outcome.state == "done" and sorted(outcome.forwarded) == ["seg.dcm", "sr.dcm"]
        assert pacs.counts["stored"] == 2
        untrusted = client_tls()  # the system's CAs do not know the test certificate
        with pytest.raises(ForwardError, match="association"):
            send(result_files(outcome.out), Destination("PACS", "127.0.0.1", pacs.port), tls=untrusted)


# -- results retention (--keep-results-days) ---------------------------------------------------------------------

DAY = 86400.0


def other_series(spool: Spool, files: list[Path], uid: str, now: float = 1.0) -> str:
    """``files`` stored as a series of their own (``uid``)."""
    import io

    for i, path in enumerate(files):
        ds = pydicom.dcmread(path)
        ds.SeriesInstanceUID, ds.SOPInstanceUID = uid, f"{uid}.{i + 1}"
        buf = io.BytesIO()
        ds.save_as(buf, enforce_file_format=True)
        spool.store(buf.getvalue(), study_uid=ds.StudyInstanceUID, series_uid=uid, sop_uid=ds.SOPInstanceUID,
                    now=now)
    return uid


def tree(folder: Path) -> dict[str, str]:
    """Every entry under ``folder`` (links not followed): what it is, and a link's target."""
    return {p.relative_to(folder).as_posix(): f"-> {os.readlink(p)}" if p.is_symlink() else
            "dir" if p.is_dir() else "file" for p in sorted(folder.rglob("*"))}


def test_keep_results_deletes_what_medrt_wrote_days_after_the_series_was_done(tmp_path, analyzer, caplog):
    """Every output a series can have goes; files and folders an administrator put in the
    results folder stay, links are neither followed nor removed. The clock is when the
    results were written, not when the last image came (here long before)."""
    import logging
    import shutil

    from medrt.batch import OutputOptions
    from medrt.pacs.monitor import Monitor

    caplog.set_level(logging.DEBUG, logger="medrt.pacs.retention")
    spool, out = Spool(tmp_path / "spool"), tmp_path / "out"
    stream = sorted((SAMPLE_DIR / "ct_stream").glob("*.dcm"))
    fill(spool, stream[10:22], now=1.0)  # twelve slices: past the latency histogram's warm-up
    b = other_series(spool, CT[:2], "1.2.826.0.1.3680043.8.498.41")
    service = PacsService(spool, out, analyzer, idle_s=0.0, retry_s=1e9, keep_results_s=3 * DAY,
                          outputs=OutputOptions(png="all", sc=True))
    t0 = time.time()
    outcomes = {o.series_uid: o for o in service.run_once(now=t0)}
    a = next(uid for uid in outcomes if uid != b)
    assert {o.state for o in outcomes.values()} == {"done"}
    every = {"latency.png", "report.md", "report.json", "results.jsonl", "errors.csv", "lesions.csv", "masks.npz",
             f"series/{a}/sr.dcm", f"series/{a}/seg.dcm", f"series/{a}/sc/00001.dcm", f"series/{a}/png/00001.png",
             f"series/{a}/masks.npz", f"series/{a}/lesions.json", f"series/{a}/frames.jsonl",
             f"series/{a}/manifest.json"}
    assert every <= set(tree(out / a))
    (out / a / ".results.jsonl.k2j4x9_q.tmp").write_bytes(b"")  # a write cut short: medrt's too
    # What an administrator put there: beside the series, and inside one of them.
    (out / "README.txt").write_text("results of the medrt listener\n")
    (out / "exports").mkdir()
    shutil.copy(out / a / "report.json", out / "exports" / "report.json")
    (out / "1.2.826.0.1.3680043.8.498.99").mkdir()  # named like a series, but not medrt's results
    (out / "1.2.826.0.1.3680043.8.498.99" / "notes.txt").write_text("kept\n")
    shutil.copytree(out / a, tmp_path / "copy")
    (out / "1.2.826.0.1.3680043.8.498.98").symlink_to(tmp_path / "copy")  # results elsewhere, linked in
    (out / b / "reviewed.txt").write_text("read by the radiologist\n")
    (tmp_path / "outside.md").write_text("an administrator's report\n")
    (out / b / "report.md").unlink()
    (out / b / "report.md").symlink_to(tmp_path / "outside.md")  # medrt's name, but a link: not medrt's file
    (out / b / "series" / b / "notes").mkdir()
    copy = tree(tmp_path / "copy")

    service.run_once(now=t0 + 2 * DAY)  # the last image came long ago; the results were written 2 days ago
    assert (out / a / "report.json").is_file() and (out / b / "report.json").is_file()
    assert service.results_purged == 0

    service.run_once(now=t0 + 4 * DAY)
    assert not (out / a).exists()
    assert tree(out / b) == {"reviewed.txt": "file", "report.md": f"-> {tmp_path / 'outside.md'}", "series": "dir",
                             f"series/{b}": "dir", f"series/{b}/notes": "dir"}
    assert (tmp_path / "outside.md").read_text() == "an administrator's report\n"
    assert (out / "README.txt").is_file() and (out / "exports" / "report.json").is_file()
    assert (out / "1.2.826.0.1.3680043.8.498.99" / "notes.txt").is_file()
    assert (out / "1.2.826.0.1.3680043.8.498.98").is_symlink() and tree(tmp_path / "copy") == copy
    assert service.results_purged == 2
    assert [s.value for family in Monitor(spool, service=service).registry.collect()
            if family.name == "medrt_results_purged" for s in family.samples] == [2.0]
    assert {s.series_uid: s.state for s in spool.all_series()} == {a: "done", b: "done"}  # --keep-days' business
    logged = [r.getMessage() for r in caplog.records if r.name == "medrt.pacs.retention"]
    assert "listener: purged the results of 2 series done over 3.0 day(s) ago" in logged
    assert f"listener: 1 purged results folder(s) hold files medrt did not write, left in place: {b}" in logged
    assert not any(str(tmp_path) in text for text in logged)  # UIDs, never paths

    service.run_once(now=t0 + 30 * DAY)  # what is left is not medrt's: left alone at every pass
    assert service.results_purged == 2 and (out / b / "reviewed.txt").is_file()


def test_keep_results_never_deletes_the_results_of_a_series_not_done(tmp_path, analyzer):
    from medrt.pacs.retention import purge_results

    spool, out = Spool(tmp_path / "spool"), tmp_path / "out"
    fill(spool, CT[:2])
    (outcome,) = PacsService(spool, out, analyzer, idle_s=0.0).run_once(now=10.0)
    later = time.time() + 30 * DAY
    for state in ("receiving", "analysing", "analysed", "forwarding", "unsent", "failed"):
        spool.mark(outcome.series_uid, state, "")
        assert purge_results(out, spool, DAY, now=later) == [], state
        assert (outcome.out / "report.json").is_file() and result_files(outcome.out), state
    spool.mark(outcome.series_uid, "done")
    assert purge_results(out, spool, DAY, now=later) == [outcome.series_uid]
    assert not outcome.out.exists() and list(out.iterdir()) == []


def test_results_are_kept_the_days_asked_after_a_late_send_also_once_the_images_are_gone(tmp_path, analyzer):
    """A PACS down for five days: the series is sent then, and its images (older than
    --keep-days) purged at once; its results stay three days after the send, not after the
    analysis."""
    from conftest import free_port

    spool, out = Spool(tmp_path / "spool"), tmp_path / "out"
    t0 = time.time()
    fill(spool, CT[:2], now=t0)
    service = PacsService(spool, out, analyzer, idle_s=0.0, retry_s=60.0, keep_s=4 * DAY, keep_results_s=3 * DAY,
                          forward=Destination("PACS", "127.0.0.1", free_port()), forward_timeout_s=5.0)
    (outcome,) = service.run_once(now=t0)
    assert outcome.state == "unsent"
    service.run_once(now=t0 + 4 * DAY)  # still down: written 4 days ago, but not sent
    assert spool.series(outcome.series_uid).state == "unsent" and (outcome.out / "report.json").is_file()
    with Listener(Spool(tmp_path / "pacs"), ae_title="PACS", host="127.0.0.1", port=0) as pacs:
        service.forward = Destination("PACS", "127.0.0.1", pacs.port)
        (sent,) = service.run_once(now=t0 + 5 * DAY)
        assert sent.state == "done" and pacs.counts["stored"] == 2
    assert spool.series(outcome.series_uid) is None  # its images went with --keep-days at once
    service.run_once(now=t0 + 7 * DAY)  # written 7 days ago, sent 2 days ago
    assert (outcome.out / "report.json").is_file() and service.results_purged == 0
    service.run_once(now=t0 + 8.5 * DAY)
    assert not outcome.out.exists() and service.results_purged == 1


def test_a_series_that_comes_back_after_its_results_were_purged_is_analysed_again_as_new(tmp_path, analyzer, caplog):
    """More images for a series whose results are gone: analysed again whole; its new SR has
    no earlier SR to name, names none, and nothing warns about one."""
    spool, out = Spool(tmp_path / "spool"), tmp_path / "out"
    fill(spool, CT[:2], now=1.0)
    service = PacsService(spool, out, analyzer, idle_s=0.0, keep_results_s=DAY)
    t0 = time.time()
    (first,) = service.run_once(now=t0)
    assert "PredecessorDocumentsSequence" not in pydicom.dcmread(result_files(first.out)[-1])
    service.run_once(now=t0 + 2 * DAY)
    assert not first.out.exists() and spool.series(first.series_uid).state == "done"
    fill(spool, CT[2:3], now=t0 + 2 * DAY)  # the rest of the series, late
    (again,) = service.run_once(now=t0 + 2 * DAY + 1)
    assert again.state == "done" and again.frames == 3
    sr = pydicom.dcmread(again.out / "series" / again.series_uid / "sr.dcm")
    assert "PredecessorDocumentsSequence" not in sr
    assert "predecessor" not in caplog.text and "earlier SR" not in caplog.text
    service.run_once(now=t0 + 2 * DAY + 2)  # analysed again just now: kept
    assert (again.out / "report.json").is_file()


def test_medrt_listen_refuses_a_results_retention_it_cannot_keep(tmp_path, capsys):
    for value in ("-1", "nan"):
        assert main(["listen", "--spool", str(tmp_path / "cli"), "--keep-results-days", value]) == 2
        assert "--keep-results-days takes days >= 0" in capsys.readouterr().err
    assert not (tmp_path / "cli").exists()


def test_damaged_headers_and_pixels_in_one_association_are_each_named_and_the_good_images_analysed(
        tmp_path, analyzer, capfd):
    """The fuzz audit's leftovers, sent by DCMTK in one association with good slices of the
    same series: each damaged image is stored and named in errors.csv with its reason (or
    analysed, in pixels or as MONOCHROME2, with the log saying so), the good ones are
    analysed, and neither the association nor the listener breaks (nor does a Rust panic
    trace reach stderr)."""
    from test_io_dicom import _claiming, _overrunning_rle, _with_raw_value

    src = tmp_path / "sent"
    src.mkdir()
    datasets = [pydicom.dcmread(p) for p in CT[:8]]
    for ds in datasets[:7]:
        ds.decompress()  # explicit VR little endian, to damage byte by byte
    files = {}

    def write(name: str, data: bytes | pydicom.Dataset) -> None:
        path = files[name] = src / f"{name}.dcm"
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            data.save_as(path)

    write("good0", datasets[0])
    write("good1", datasets[1])
    write("frames", _with_raw_value(datasets[2], "NumberOfFrames", "abc"))
    write("spacing", _with_raw_value(datasets[3], "PixelSpacing", "1e300\\1e300"))
    datasets[4].PhotometricInterpretation = "PALETTE COLOR"
    write("palette", datasets[4])
    datasets[5].PhotometricInterpretation = ""
    write("photometric", datasets[5])
    write("syntax", _claiming(datasets[6], pydicom.uid.JPEGBaseline8Bit))
    datasets[7].decompress()
    datasets[7].compress(pydicom.uid.RLELossless)
    write("rle", _overrunning_rle(datasets[7]))

    spool = Spool(tmp_path / "spool")
    with Listener(spool, host="127.0.0.1", port=0) as listener:
        # DCMTK will not send a file whose pixel data is not encapsulated as its syntax says, and
        # proposes one compressed syntax at a time: pynetdicom sends those two as they are, by path
        by_pynetdicom = ("syntax", "rle")
        sent = storescu(listener.port, [p for n, p in files.items() if n not in by_pynetdicom])
        assert sent.returncode == 0, sent.stderr
        from pynetdicom import AE

        ae = AE(ae_title="SCANNER")
        for syntax in (pydicom.uid.JPEGBaseline8Bit, pydicom.uid.RLELossless):
            ae.add_requested_context(pydicom.uid.CTImageStorage, syntax)
        assoc = ae.associate("127.0.0.1", listener.port, ae_title="MEDRT")
        assert assoc.is_established
        try:
            assert [int(assoc.send_c_store(files[n]).Status) for n in by_pynetdicom] == [0, 0]
        finally:
            assoc.release()
        assert listener.counts == {"stored": len(files), "refused": 0, "failed": 0, "commitments": 0}
    service = PacsService(spool, tmp_path / "out", analyzer, idle_s=0.0)
    (outcome,) = service.run_once()
    # analysed: good0, good1, spacing (in pixels, left out of the SEG) and photometric (as MONOCHROME2)
    assert (outcome.state, outcome.frames, outcome.errors) == ("done", 4, 5)
    uid_of = {name: pydicom.dcmread(path, stop_before_pixels=True, force=True).SOPInstanceUID
              for name, path in files.items()}
    rows = {r["file"]: r for r in csv.DictReader((outcome.out / "errors.csv").open())}
    reasons = {name: rows[f"{uid_of[name]}.dcm"]["reason"] for name in ("frames", "palette", "syntax", "rle", "spacing")}
    assert "(its PixelSpacing cannot be a length in mm)" in reasons["spacing"]
    assert "Number of Frames (0028,0008) is 'abc'" in reasons["frames"]
    assert "PALETTE COLOR but the Palette Color Lookup Table" in reasons["palette"]
    assert "says JPEG Baseline" in reasons["syntax"] and "not encapsulated" in reasons["syntax"]
    assert "RLE Lossless pixel data could not be decoded" in reasons["rle"]
    results = [json.loads(line) for line in (outcome.out / "results.jsonl").read_text().splitlines()]
    analysed = {r["sop_instance_uid"]: r for r in results}
    assert set(analysed) == {uid_of[n] for n in ("good0", "good1", "spacing", "photometric")}
    assert "panicked" not in capfd.readouterr().err
