"""Storage commitment (PS3.4 Annex J, Push Model): a sender asks whether medrt holds what it sent.

A scanner or PACS that sent images by C-STORE may then ask, by N-ACTION (action type 1),
that medrt commit to them under a Transaction UID. The listener records the request in
the spool's index, durably, before it answers Success (:meth:`Spool.add_commitment`).
:class:`CommitmentReporter` then tells the sender which of those instances the spool
holds (indexed, and the file on disk at the size it was stored with) by N-EVENT-REPORT:

- event type 1: all of them, listed in the Referenced SOP Sequence;
- event type 2: some failed, each in the Failed SOP Sequence with its Failure Reason
  (0x0112 no such instance, 0x0119 held under another SOP class).

The report goes on an association of medrt's own to the sender's address, which the
listener knows from its peer table (``medrt listen --peer AET@HOST:PORT``), with
SCP/SCU role selection (medrt is the SCP of the SOP class while requesting the
association). That is how IHE RAD-10 and Orthanc expect it: most senders release their
association as soon as the N-ACTION is answered. A sender not in the table gets its
N-ACTION refused (0x0110, with the reason), rather than a promise of a report that
could never arrive. A report that cannot be delivered (the sender is down) is kept and
sent again after ``retry_s``, also after a restart, until the spool's purge gives it up
(``--keep-days``).

What medrt commits to: it holds the images in its spool until their series is done and
``--keep-days`` have passed. It is an analysis node, not an archive; a scanner that
deletes its copies once a commitment succeeds should ask its PACS, not medrt.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Mapping
from typing import Any

from medrt.pacs.loop import BackgroundLoop
from medrt.pacs.scu import Destination, ForwardError, associate
from medrt.pacs.spool import Commitment, Spool, check_uid

__all__ = ["CommitmentReporter", "parse_request", "event_report", "send_report", "STORAGE_COMMITMENT_CLASS",
           "STORAGE_COMMITMENT_INSTANCE", "REQUEST_STORAGE_COMMITMENT"]

log = logging.getLogger(__name__)

STORAGE_COMMITMENT_CLASS = "1.2.840.10008.1.20.1"  # Storage Commitment Push Model SOP Class
STORAGE_COMMITMENT_INSTANCE = "1.2.840.10008.1.20.1.1"  # its well-known SOP Instance
REQUEST_STORAGE_COMMITMENT = 1  # Action Type ID (PS3.4 J.3.2.1)


def parse_request(ds: Any) -> tuple[str, list[tuple[str, str]]]:
    """(Transaction UID, [(SOP Class UID, SOP Instance UID), ...]) from an N-ACTION's
    Action Information; ``ValueError`` saying what is missing or malformed."""
    try:
        transaction = check_uid("Transaction UID", ds.get("TransactionUID"))
    except ValueError as exc:
        raise ValueError(str(exc)) from None
    items = ds.get("ReferencedSOPSequence") or []
    if not items:
        raise ValueError("no Referenced SOP Sequence: nothing to commit")
    refs = []
    for n, item in enumerate(items, 1):
        try:
            refs.append((check_uid("Referenced SOP Class UID", item.get("ReferencedSOPClassUID")),
                         check_uid("Referenced SOP Instance UID", item.get("ReferencedSOPInstanceUID"))))
        except ValueError as exc:
            raise ValueError(f"Referenced SOP Sequence item {n}: {exc}") from None
    return transaction, refs


def event_report(transaction_uid: str, refs: tuple[tuple[str, str], ...] | list[tuple[str, str]],
                 reasons: list[int | None]) -> tuple[int, Any]:
    """(Event Type ID, Event Information) for the N-EVENT-REPORT of one request (PS3.4 J.3.3)."""
    from pydicom.dataset import Dataset

    def item(sop_class: str, sop: str, reason: int | None = None) -> Dataset:
        d = Dataset()
        d.ReferencedSOPClassUID = sop_class
        d.ReferencedSOPInstanceUID = sop
        if reason is not None:
            d.FailureReason = reason
        return d

    ds = Dataset()
    ds.TransactionUID = transaction_uid
    ok = [item(c, i) for (c, i), r in zip(refs, reasons, strict=True) if r is None]
    failed = [item(c, i, r) for (c, i), r in zip(refs, reasons, strict=True) if r is not None]
    if ok:
        ds.ReferencedSOPSequence = ok
    if failed:
        ds.FailedSOPSequence = failed
    return (2 if failed else 1), ds


def send_report(dest: Destination, event_type: int, info: Any, *, calling_ae: str = "MEDRT",
                timeout_s: float = 30.0, tls: ssl.SSLContext | None = None) -> None:
    """Send one N-EVENT-REPORT to ``dest`` on a new association, medrt in the SCP role
    (SCP/SCU role selection); :class:`ForwardError` unless the peer answers Success."""
    from pynetdicom import build_role

    role = build_role(STORAGE_COMMITMENT_CLASS, scu_role=False, scp_role=True)
    assoc = associate(dest, [(STORAGE_COMMITMENT_CLASS, None)], calling_ae=calling_ae, timeout_s=timeout_s, tls=tls,
                      ext_neg=[role])
    try:
        try:
            status, _ = assoc.send_n_event_report(info, event_type, STORAGE_COMMITMENT_CLASS,
                                                  STORAGE_COMMITMENT_INSTANCE)
        except ValueError as exc:  # no context with medrt as SCP: the peer refused the role
            raise ForwardError(f"{dest}: did not accept medrt as the storage commitment SCP ({exc})") from None
        if "Status" not in status:
            raise ForwardError(f"{dest}: no reply to the N-EVENT-REPORT (association lost or timed out)")
        if int(status.Status) != 0x0000:
            raise ForwardError(f"{dest}: N-EVENT-REPORT answered 0x{int(status.Status):04X} "
                               f"{status.get('ErrorComment', '')}".rstrip())
    finally:
        if assoc.is_established:
            assoc.release()


class CommitmentReporter(BackgroundLoop):
    """Sends the report of each storage commitment request in ``spool`` to its sender.

    ``peers`` maps a calling AE title to the address its reports go to. Run
    :meth:`run_once` by hand, or :meth:`start` a thread that runs it whenever
    :meth:`notify` is called (the listener does, after each request) and every
    ``tick_s``.
    """

    thread_name = "medrt-commitment"

    def __init__(self, spool: Spool, peers: Mapping[str, Destination], *, ae_title: str = "MEDRT",
                 retry_s: float = 60.0, tls: ssl.SSLContext | None = None, timeout_s: float = 30.0) -> None:
        self.spool = spool
        self.timeout_s = timeout_s
        self.peers = dict(peers)
        self.ae_title = ae_title
        self.retry_s = retry_s
        self.tls = tls
        self.reported = 0
        super().__init__()

    def run_once(self, now: float | None = None) -> list[tuple[Commitment, str]]:
        """Report every request due now; returns each with ``"reported"`` or the reason it failed."""
        done = []
        for request in self.spool.commitments_due(retry_s=self.retry_s, now=now):
            if self._stop.is_set():
                break
            done.append((request, self._report(request, now)))
        return done

    def _report(self, request: Commitment, now: float | None) -> str:
        dest = self.peers.get(request.calling_ae)
        reasons = self.spool.held(request.refs)
        event_type, info = event_report(request.transaction_uid, request.refs, reasons)
        missing = sum(r is not None for r in reasons)
        try:
            if dest is None:  # the table changed since the request was taken
                raise ForwardError(f"no address for AE {request.calling_ae} (medrt listen --peer "
                                   f"{request.calling_ae}@HOST:PORT)")
            send_report(dest, event_type, info, calling_ae=self.ae_title, tls=self.tls, timeout_s=self.timeout_s)
        except (ForwardError, OSError) as exc:
            detail = f"report not delivered: {exc}"
            log.error("commitment: transaction %s from %s: %s (retried in %.0f s)", request.transaction_uid,
                      request.calling_ae, detail, self.retry_s)
            self.spool.mark_commitment(request.transaction_uid, "failed", detail, now=now)
            return detail
        detail = f"{len(reasons) - missing} of {len(reasons)} held" + (f", {missing} not" if missing else "")
        self.spool.mark_commitment(request.transaction_uid, "reported", detail, now=now)
        self.reported += 1
        log.info("commitment: transaction %s reported to %s: %s", request.transaction_uid, dest, detail)
        return "reported"
