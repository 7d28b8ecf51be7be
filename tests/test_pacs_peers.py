"""What medrt does for the peers it knows (``medrt listen --peer``): storage commitment
(PS3.4 Annex J: a sender asks whether medrt holds what it sent) and results sent back to
the sender.

pynetdicom plays the scanner here (it sends, asks, and takes reports and results on its
own listener); Orthanc, the real PACS, asks for storage commitment in
tests/test_pacs_orthanc.py.
"""

from __future__ import annotations

import queue
import time

import pydicom
from pydicom.dataset import Dataset
from test_pacs import CT

from conftest import free_port
from medrt.cli import main
from medrt.pacs.commitment import CommitmentReporter, event_report
from medrt.pacs.scp import (
    STATUS_INVALID_ARGUMENT,
    STATUS_NO_SUCH_ACTION,
    STATUS_PROCESSING_FAILURE,
    Listener,
)
from medrt.pacs.scu import Destination
from medrt.pacs.spool import Spool

COMMITMENT = "1.2.840.10008.1.20.1"
COMMITMENT_INSTANCE = "1.2.840.10008.1.20.1.1"


def request(transaction: str, refs: list[tuple[str, str]]) -> Dataset:
    ds = Dataset()
    ds.TransactionUID = transaction
    ds.ReferencedSOPSequence = []
    for sop_class, sop in refs:
        item = Dataset()
        item.ReferencedSOPClassUID, item.ReferencedSOPInstanceUID = sop_class, sop
        ds.ReferencedSOPSequence.append(item)
    return ds


class Scanner:
    """A modality: C-STOREs, then N-ACTIONs, and takes N-EVENT-REPORTs on its own port."""

    def __init__(self, ae_title: str = "SCANNER") -> None:
        from pynetdicom import AE

        self.ae_title = ae_title
        self.port = free_port()
        self.reports: queue.Queue[tuple[int, Dataset, str]] = queue.Queue()
        self.received: list[Dataset] = []  # what medrt C-STOREd back
        self._server = None
        self.ae = AE(ae_title=ae_title)

    def listen(self) -> None:
        from pynetdicom import AE, ALL_TRANSFER_SYNTAXES, AllStoragePresentationContexts, evt

        def on_report(event):  # type: ignore[no-untyped-def]
            self.reports.put((int(event.event_type), event.event_information, str(event.assoc.requestor.ae_title)))
            return 0x0000, None

        def on_store(event):  # type: ignore[no-untyped-def]
            self.received.append(event.dataset)
            return 0x0000

        ae = AE(ae_title=self.ae_title)
        ae.add_supported_context(COMMITMENT, scu_role=True, scp_role=True)
        for cx in AllStoragePresentationContexts:
            ae.add_supported_context(cx.abstract_syntax, ALL_TRANSFER_SYNTAXES)
        self._server = ae.start_server(("127.0.0.1", self.port), block=False,
                                       evt_handlers=[(evt.EVT_N_EVENT_REPORT, on_report), (evt.EVT_C_STORE, on_store)])

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server = None

    def send(self, port: int, datasets: list[Dataset], asks: list[tuple[int, Dataset]]) -> list[Dataset]:
        """C-STORE ``datasets``, then one N-ACTION per (action type, request); their statuses."""
        from pynetdicom import AE

        ae = AE(ae_title=self.ae_title)
        for ds in datasets:
            ae.add_requested_context(ds.SOPClassUID, ds.file_meta.TransferSyntaxUID)
        ae.add_requested_context(COMMITMENT)
        assoc = ae.associate("127.0.0.1", port, ae_title="MEDRT")
        assert assoc.is_established
        try:
            assert [int(assoc.send_c_store(ds).Status) for ds in datasets] == [0] * len(datasets)
            return [assoc.send_n_action(ds, action, COMMITMENT, COMMITMENT_INSTANCE)[0] for action, ds in asks]
        finally:
            assoc.release()


def test_storage_commitment_is_recorded_then_reported_on_an_association_of_its_own(tmp_path, caplog):
    caplog.set_level("INFO", logger="medrt")
    scanner = Scanner()
    scanner.listen()
    spool = Spool(tmp_path / "spool")
    peers = {"SCANNER": Destination("SCANNER", "127.0.0.1", scanner.port)}
    reporter = CommitmentReporter(spool, peers, retry_s=60.0)
    images = [pydicom.dcmread(p) for p in CT[:3]]
    held = [(ds.SOPClassUID, ds.SOPInstanceUID) for ds in images]
    never_sent = (images[0].SOPClassUID, "2.25.123456789")
    other_class = ("1.2.840.10008.5.1.4.1.1.1", images[1].SOPInstanceUID)  # CR, but it came as a CT image
    reporter.start(tick_s=0.2)
    try:
        with Listener(spool, host="127.0.0.1", port=0, peers=peers, on_commitment=reporter.notify) as listener:
            all_held = request("2.25.1", held)
            some_not = request("2.25.2", [*held, never_sent, other_class])
            bad = request("2.25.3", held)
            del bad.ReferencedSOPSequence
            statuses = scanner.send(listener.port, images, [(1, all_held), (1, some_not), (1, bad), (2, all_held)])
            assert [int(s.Status) for s in statuses] == [0, 0, STATUS_INVALID_ARGUMENT, STATUS_NO_SUCH_ACTION]
            assert "no Referenced SOP Sequence" in statuses[2].ErrorComment
            reports = {str(info.TransactionUID): (kind, info, caller) for kind, info, caller in
                       (scanner.reports.get(timeout=30) for _ in range(2))}

            stranger = Scanner("STRANGER")  # asks, but medrt has no address to report to
            (refused,) = stranger.send(listener.port, [], [(1, request("2.25.4", held))])
            assert int(refused.Status) == STATUS_PROCESSING_FAILURE
            assert "no address for AE STRANGER" in refused.ErrorComment
            assert listener.counts["commitments"] == 2
    finally:
        reporter.stop()
    kind, info, caller = reports["2.25.1"]
    assert kind == 1 and caller == "MEDRT" and "FailedSOPSequence" not in info
    assert [(i.ReferencedSOPClassUID, i.ReferencedSOPInstanceUID) for i in info.ReferencedSOPSequence] == held
    kind, info, _ = reports["2.25.2"]
    assert kind == 2
    assert [(i.ReferencedSOPClassUID, i.ReferencedSOPInstanceUID) for i in info.ReferencedSOPSequence] == held
    assert [(i.ReferencedSOPInstanceUID, i.FailureReason) for i in info.FailedSOPSequence] == [
        (never_sent[1], 0x0112), (other_class[1], 0x0119)]
    assert scanner.reports.empty()
    assert {c.transaction_uid: (c.state, c.detail) for c in spool.all_commitments()} == {
        "2.25.1": ("reported", "3 of 3 held"), "2.25.2": ("reported", "3 of 5 held, 2 not")}
    assert "storage commitment request 2.25.4 from STRANGER refused" in caplog.text

    # A held image whose file is gone is not committed to.
    spool.paths(images[2].SeriesInstanceUID)[2].unlink()
    assert spool.held(held) == [None, None, 0x0112]
    scanner.close()


def test_a_report_the_sender_cannot_take_is_kept_and_sent_after_a_restart(tmp_path, capsys):
    scanner = Scanner()  # not listening yet: the scanner's receiver is down
    spool = Spool(tmp_path / "spool")
    peers = {"SCANNER": Destination("SCANNER", "127.0.0.1", scanner.port)}
    images = [pydicom.dcmread(p) for p in CT[:2]]
    held = [(ds.SOPClassUID, ds.SOPInstanceUID) for ds in images]
    with Listener(spool, host="127.0.0.1", port=0, peers=peers) as listener:
        assert [int(s.Status) for s in scanner.send(listener.port, images, [(1, request("2.25.7", held))])] == [0]
    reporter = CommitmentReporter(spool, peers, retry_s=60.0)
    ((commitment, outcome),) = reporter.run_once()
    assert commitment.transaction_uid == "2.25.7" and f"SCANNER@127.0.0.1:{scanner.port}: cannot connect to " in outcome
    assert reporter.run_once() == []  # not before retry_s
    assert main(["spool", str(tmp_path / "spool")]) == 0
    assert "storage commitment: 0 report(s) sent, 0 pending, 1 failed (retried)" in capsys.readouterr().out
    spool.close()

    scanner.listen()  # the scanner is back; medrt restarts
    again = Spool(tmp_path / "spool")
    reporter = CommitmentReporter(again, peers, retry_s=60.0)
    ((commitment, outcome),) = reporter.run_once(now=time.time() + 61.0)
    assert outcome == "reported" and commitment.attempts == 1
    kind, info, _ = scanner.reports.get(timeout=30)
    assert kind == 1 and str(info.TransactionUID) == "2.25.7" and len(info.ReferencedSOPSequence) == 2
    assert [c.state for c in again.all_commitments()] == ["reported"]
    again.add_commitment("2.25.8", "SCANNER", held, now=10.0)  # a report never delivered, for days
    again.mark_commitment("2.25.8", "failed", "report not delivered: ...", now=11.0)
    again.purge(7 * 86400.0, now=10.0 + 8 * 86400.0)
    assert [c.transaction_uid for c in again.all_commitments()] == ["2.25.7"]  # the recent one stays
    scanner.close()


def test_event_report_lists_successes_and_failures_apart():
    refs = [("1.2.3", "1.2.3.1"), ("1.2.3", "1.2.3.2")]
    kind, ds = event_report("2.25.9", refs, [None, None])
    assert kind == 1 and len(ds.ReferencedSOPSequence) == 2 and "FailedSOPSequence" not in ds
    kind, ds = event_report("2.25.9", refs, [0x0112, 0x0112])
    assert kind == 2 and "ReferencedSOPSequence" not in ds and len(ds.FailedSOPSequence) == 2
    assert main(["listen", "--spool", "/nonexistent/x", "--peer", "A@h:1", "--peer", "A@h:2"]) == 2


def test_listen_says_when_a_peer_could_never_connect(tmp_path, capsys):
    """--allow without the peer's AE title: its requests could never arrive; said at start."""
    assert main(["listen", "--spool", str(tmp_path / "s"), "--allow", "CT1", "--peer", "PACS@127.0.0.1:1",
                 "--forward-to-sender", "--min-free", "-1"]) == 2  # stops at the next check, after the warning
    assert "--peer PACS: not in --allow, so it cannot connect" in capsys.readouterr().err


def test_results_go_back_to_the_sender_and_to_every_destination(tmp_path, storescp):
    """Two PACS send to one medrt: each gets its own series' results back at its --peer
    address, the central archive (--forward) gets both; a sender without an address is
    named, and the other destinations are served all the same."""
    from medrt.analyzer import load_analyzer
    from medrt.pacs.service import PacsService

    dest, archive = storescp
    site_a, site_b = Scanner("SITE_A"), Scanner("SITE_B")
    site_a.listen()
    spool = Spool(tmp_path / "spool")
    first = [pydicom.dcmread(p) for p in CT[:2]]
    second = [pydicom.dcmread(p) for p in CT[2:4]]
    for n, ds in enumerate(second):
        ds.SeriesInstanceUID, ds.SOPInstanceUID = "1.2.826.0.1.3680043.8.498.77", f"1.2.826.0.1.3680043.8.498.77.{n}"
    with Listener(spool, host="127.0.0.1", port=0) as listener:
        site_a.send(listener.port, first, [])
        site_b.send(listener.port, second, [])
    peers = {"SITE_A": Destination("SITE_A", "127.0.0.1", site_a.port)}
    service = PacsService(spool, tmp_path / "out", load_analyzer(threads=1), forward=[dest, dest], peers=peers,
                          to_sender=True, idle_s=0.0)
    outcomes = {o.series_uid: o for o in service.run_once()}
    a, b = outcomes[first[0].SeriesInstanceUID], outcomes["1.2.826.0.1.3680043.8.498.77"]
    assert a.state == "done" and sorted(a.forwarded) == ["seg.dcm", "sr.dcm"]
    assert a.destinations == [str(dest), str(peers["SITE_A"])]  # the archive once, though given twice
    assert sorted(ds.Modality for ds in site_a.received) == ["SEG", "SR"]
    assert {str(ds.SeriesInstanceUID) for ds in site_a.received} != {first[0].SeriesInstanceUID}
    assert {str(ds.StudyInstanceUID) for ds in site_a.received} == {first[0].StudyInstanceUID}
    assert b.state == "unsent" and "no address for the sender, AE SITE_B" in b.detail
    assert sorted(b.forwarded) == ["seg.dcm", "sr.dcm"] and b.destinations == [str(dest)]  # the archive has them
    assert len(list(archive.iterdir())) == 4 and len(site_a.received) == 2
    assert spool.series(b.series_uid).detail.startswith("forwarding failed: no address for the sender")

    # SITE_B gets an address; the retry sends it its results, and not the archive a second copy.
    site_b.listen()
    service.peers["SITE_B"] = Destination("SITE_B", "127.0.0.1", site_b.port)
    (retry,) = service.run_once(now=time.time() + service.retry_s + 1)
    assert retry.series_uid == b.series_uid and retry.state == "done" and sorted(retry.forwarded) == ["seg.dcm", "sr.dcm"]
    assert retry.sent == {str(dest): 0, f"SITE_B@127.0.0.1:{site_b.port}": 2}
    assert sorted(ds.Modality for ds in site_b.received) == ["SEG", "SR"]
    assert len(list(archive.iterdir())) == 4  # storescp would have written the two objects again
    from medrt.commands.listen import _line
    assert f"({dest} had them already)" in _line(retry)
    site_a.close()
    site_b.close()
    assert main(["listen", "--spool", str(tmp_path / "s2"), "--forward-to-sender"]) == 2
