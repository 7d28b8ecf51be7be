"""The Storage SCP: receives images by C-STORE into a :class:`~medrt.pacs.spool.Spool`.

An image is acknowledged (status 0x0000) only after :meth:`Spool.store` returned, i.e.
after its bytes and its index row are on disk. Otherwise the peer gets a failure status
and an ``ErrorComment`` saying why, so it keeps the image and can send it again:

- ``0xA700`` (refused: out of resources) when the disk refuses the write;
- ``0xA900`` (data set does not match SOP class) for a missing or malformed Study,
  Series or SOP Instance UID (the spool files by them);
- ``0xC000`` (cannot understand) for a data set that does not decode.

The bytes stored are those the peer sent (``event.encoded_dataset()``), not re-encoded.

With a peer table (``peers``: calling AE title → its address), the listener is also the
SCP of the Storage Commitment Push Model (:mod:`medrt.pacs.commitment`): an N-ACTION
is answered Success once the request is on disk in the spool's index, and reported later
on an association of medrt's own. It answers 0x0110 (processing failure) to a sender
not in the table, 0x0115 (invalid argument) to a malformed request, 0x0123 to another
action type, and 0x0213 (resource limitation) when the disk refuses.

Logs name instances by UID and peers by AE title, never by patient.
"""

from __future__ import annotations

import ipaddress
import logging
import sqlite3
import ssl
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from medrt.pacs.spool import Spool, SpoolError

__all__ = ["Listener", "server_tls", "ACCEPTED_TRANSFER_SYNTAXES", "STATUS_OUT_OF_RESOURCES", "STATUS_DATASET_MISMATCH",
           "STATUS_CANNOT_UNDERSTAND"]

log = logging.getLogger(__name__)

STATUS_SUCCESS = 0x0000
STATUS_OUT_OF_RESOURCES = 0xA700
STATUS_DATASET_MISMATCH = 0xA900
STATUS_CANNOT_UNDERSTAND = 0xC000
STATUS_PROCESSING_FAILURE = 0x0110
STATUS_INVALID_ARGUMENT = 0x0115
STATUS_NO_SUCH_ACTION = 0x0123
STATUS_RESOURCE_LIMITATION = 0x0213


def _accepted_transfer_syntaxes() -> list[str]:
    """Every transfer syntax ``medrt.read_frames`` can decode here: uncompressed (incl.
    deflated and big endian), JPEG, JPEG-LS, JPEG 2000 (incl. HTJ2K), RLE and those newer
    than pydicom 3.0 (JPEG XL, encapsulated uncompressed, deflated image frames), each
    only while its decoder is installed: a sender offered no other can send uncompressed
    instead of filing images nothing here could read. Video is not accepted, nor JPEG 2000
    Part 2 (multi-component), which no decoder here reads."""
    import pydicom.uid as u
    from pydicom.pixels import get_decoder

    from medrt.io.codecs import NEWER_SYNTAXES, register_newer_syntaxes

    register_newer_syntaxes()
    seen: dict[str, None] = {}
    for group in (u.UncompressedTransferSyntaxes, u.JPEGTransferSyntaxes, u.JPEGLSTransferSyntaxes,
                  u.JPEG2000TransferSyntaxes, u.RLETransferSyntaxes, list(NEWER_SYNTAXES)):
        for ts in group:
            try:
                if get_decoder(ts).is_available:
                    seen[str(ts)] = None
            except NotImplementedError:
                continue
    return list(seen)


ACCEPTED_TRANSFER_SYNTAXES = _accepted_transfer_syntaxes()


def server_tls(cert: str | Path, key: str | Path, ca: str | Path | None = None) -> ssl.SSLContext:
    """A TLS context for the listener (DICOM over TLS, PS3.15 B.1): our certificate and key;
    with ``ca``, peers must present a certificate it signed (mutual authentication)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(certfile=str(cert), keyfile=str(key))
    if ca is not None:
        ctx.load_verify_locations(cafile=str(ca))
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def _failure(status: int, comment: str) -> Any:
    from pydicom.dataset import Dataset

    ds = Dataset()
    ds.Status = status
    ds.ErrorComment = comment[:64]  # LO
    return ds


class Listener:
    """A C-STORE (and C-ECHO) SCP that files what it receives in ``spool``.

    ``port=0`` takes a free port (:attr:`port` says which). ``allowed_callers``, when not
    empty, is the list of calling AE titles accepted (others are rejected at association).
    ``on_stored(series_uid)`` is called after each acknowledged image (from the
    association's thread; keep it short). ``tls`` (:func:`server_tls`) makes it accept
    DICOM over TLS only. ``peers`` (calling AE title → :class:`~medrt.pacs.scu.Destination`)
    turns on storage commitment for those callers; ``on_commitment()`` is called after
    each request recorded (wake the :class:`~medrt.pacs.commitment.CommitmentReporter`).
    ``allowed_networks`` (CIDR strings), when not empty, are the addresses connections are
    taken from; any other is closed at once (TCP, before any DICOM).
    """

    def __init__(self, spool: Spool, *, ae_title: str = "MEDRT", host: str = "0.0.0.0", port: int = 11112,
                 allowed_callers: Sequence[str] = (), on_stored: Callable[[str], None] | None = None,
                 require_called_aet: bool = True, tls: ssl.SSLContext | None = None,
                 peers: Mapping[str, Any] | None = None, on_commitment: Callable[[], None] | None = None,
                 allowed_networks: Sequence[str] = ()) -> None:
        self.spool = spool
        self.peers = dict(peers or {})
        self.on_commitment = on_commitment
        self.tls = tls
        self.ae_title = ae_title
        self.host = host
        self.requested_port = port
        self.allowed_callers = list(allowed_callers)
        self.on_stored = on_stored
        self.require_called_aet = require_called_aet
        self.counts = {"stored": 0, "refused": 0, "failed": 0, "commitments": 0}
        self.allowed_networks = [ipaddress.ip_network(n, strict=False) for n in allowed_networks]
        self.connections_refused = 0
        self._lock = threading.Lock()
        self._server: Any = None
        self._accept: threading.Thread | None = None

    @property
    def serving(self) -> bool:
        """Whether the port is open and its accept loop runs."""
        return self._server is not None and self._accept is not None and self._accept.is_alive()

    @property
    def port(self) -> int:
        if self._server is None:
            return self.requested_port
        return int(self._server.server_address[1])

    def start(self) -> None:
        from pynetdicom import AllStoragePresentationContexts, evt
        from pynetdicom.sop_class import Verification  # type: ignore[attr-defined]

        from medrt.pacs.scu import new_ae

        ae = new_ae(self.ae_title)
        for cx in AllStoragePresentationContexts:
            ae.add_supported_context(cx.abstract_syntax, ACCEPTED_TRANSFER_SYNTAXES)
        ae.add_supported_context(Verification)
        if self.peers:
            from medrt.pacs.commitment import STORAGE_COMMITMENT_CLASS

            ae.add_supported_context(STORAGE_COMMITMENT_CLASS)
        ae.require_called_aet = self.require_called_aet
        if self.allowed_callers:
            ae.require_calling_aet = self.allowed_callers
        ae.maximum_pdu_size = 0  # no limit on what a peer may send per P-DATA
        handlers = [(evt.EVT_C_STORE, self._on_store), (evt.EVT_C_ECHO, lambda event: STATUS_SUCCESS),
                    (evt.EVT_CONN_OPEN, self._on_open), (evt.EVT_N_ACTION, self._on_action)]
        from pynetdicom.transport import ThreadedAssociationServer

        server = ae.make_server((self.host, self.requested_port), evt_handlers=handlers, ssl_context=self.tls,
                                server_class=ThreadedAssociationServer)
        # socketserver asks verify_request before a connection gets a handler: one from an
        # address outside allowed_networks is closed there, before any DICOM exchange (over TLS,
        # pynetdicom has done the handshake by then: it wraps the socket as it accepts it).
        server.verify_request = self._verify_address
        ae._servers.append(server)  # as AE.start_server does: the server's shutdown() removes it there
        self._accept = threading.Thread(target=server.serve_forever, name="medrt-listener-accept", daemon=True)
        self._accept.start()
        self._server = server
        log.info("listener: %s listening on %s:%d%s (spool %s)", self.ae_title, self.host, self.port,
                 " over TLS" if self.tls is not None else "", self.spool.root)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server = None
            log.info("listener: stopped (%s)", ", ".join(f"{v} {k}" for k, v in self.counts.items()))

    def __enter__(self) -> Listener:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _count(self, what: str) -> None:
        with self._lock:
            self.counts[what] += 1

    def _verify_address(self, request: Any, client_address: tuple[Any, ...]) -> bool:
        if not self.allowed_networks:
            return True
        address = ipaddress.ip_address(str(client_address[0]).split("%")[0])
        mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:a.b.c.d on a dual-stack socket
        if any(address in net or (mapped is not None and mapped in net) for net in self.allowed_networks):
            return True
        with self._lock:
            self.connections_refused += 1
        log.warning("listener: connection from %s refused: not in --allow-from", address)
        return False

    @staticmethod
    def _on_open(event: Any) -> None:
        log.debug("listener: connection from %s:%s", *event.address)

    def _on_store(self, event: Any) -> Any:
        calling = str(event.assoc.requestor.ae_title).strip()
        sop_in_request = str(event.request.AffectedSOPInstanceUID or "")
        try:
            ds = event.dataset
            study, series, sop = (ds.get("StudyInstanceUID"), ds.get("SeriesInstanceUID"), ds.get("SOPInstanceUID"))
            modality = str(ds.get("Modality", "") or "")
        except Exception as exc:  # noqa: BLE001 - a peer's undecodable data set is its error, not ours
            self._count("refused")
            log.error("listener: from %s, instance %s does not decode (%s); refused", calling, sop_in_request,
                      type(exc).__name__)
            return _failure(STATUS_CANNOT_UNDERSTAND, f"data set does not decode: {type(exc).__name__}")
        try:
            path = self.spool.store(event.encoded_dataset(), study_uid=study, series_uid=series, sop_uid=sop,
                                    sop_class_uid=str(event.request.AffectedSOPClassUID or ""),
                                    transfer_syntax=str(event.context.transfer_syntax), modality=modality,
                                    calling_ae=calling)
        except SpoolError as exc:
            self._count("refused")
            log.error("listener: from %s, instance %s refused: %s", calling, sop_in_request, exc)
            return _failure(STATUS_DATASET_MISMATCH, str(exc))
        except OSError as exc:
            self._count("failed")
            log.error("listener: from %s, instance %s NOT stored (%s: errno %s, %s); the sender keeps it", calling,
                      sop_in_request, type(exc).__name__, exc.errno, exc.strerror)
            return _failure(STATUS_OUT_OF_RESOURCES, f"could not store: {exc.strerror or type(exc).__name__}")
        self._count("stored")
        log.debug("listener: stored %s (series %s) from %s", path.name, series, calling)
        if self.on_stored is not None:
            self.on_stored(str(series))
        return STATUS_SUCCESS

    def _on_action(self, event: Any) -> tuple[Any, None]:
        """A storage commitment request: recorded durably, then answered; reported later."""
        from medrt.pacs.commitment import REQUEST_STORAGE_COMMITMENT, parse_request

        calling = str(event.assoc.requestor.ae_title).strip()
        if int(event.action_type) != REQUEST_STORAGE_COMMITMENT:
            return _failure(STATUS_NO_SUCH_ACTION, f"action type {event.action_type} is not 1 (request "
                                                   f"storage commitment)"), None
        try:
            transaction, refs = parse_request(event.action_information)
        except Exception as exc:  # noqa: BLE001 - a malformed request is the peer's error; say what is wrong
            why = str(exc) if isinstance(exc, ValueError) else f"does not decode: {type(exc).__name__}"
            log.error("listener: storage commitment request from %s refused: %s", calling, why)
            return _failure(STATUS_INVALID_ARGUMENT, why), None
        if calling not in self.peers:
            log.error("listener: storage commitment request %s from %s refused: no address for that AE title "
                      "(medrt listen --peer %s@HOST:PORT)", transaction, calling, calling)
            return _failure(STATUS_PROCESSING_FAILURE, f"no address for AE {calling} to report to"), None
        try:
            self.spool.add_commitment(transaction, calling, refs)
        except (OSError, sqlite3.Error) as exc:  # the disk refused, or the index is locked or full
            why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            log.error("listener: storage commitment request %s from %s NOT recorded (%s)", transaction, calling, why)
            return _failure(STATUS_RESOURCE_LIMITATION, f"could not record: {why}"), None
        self._count("commitments")
        log.info("listener: storage commitment request %s from %s for %d instance(s); report to %s", transaction,
                 calling, len(refs), self.peers[calling])
        if self.on_commitment is not None:
            self.on_commitment()
        return STATUS_SUCCESS, None
