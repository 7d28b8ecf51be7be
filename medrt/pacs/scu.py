"""The Storage SCU that forwards results (SEG, SR, SC) to a PACS or any Storage SCP.

Files are sent as stored (``Association.send_c_store(path)`` reads them without decoding),
each in a presentation context of its own SOP class and transfer syntax. A compressed file
(a SEG written with ``--seg-compression jpeg2000``) is offered uncompressed too, and a peer
that accepts only that is sent it decoded (a BINARY SEG's bits packed again, as PS3.5 8.1.1
wants them). A file the peer accepts in neither is refused (0x0122, SOP class not supported)
without ending the association, and so is one that cannot be encoded in the accepted
transfer syntax (0x0110, processing failure: a malformed file, such as one whose meta
header names another VR encoding than its data set uses). A refused or broken association raises
:class:`ForwardError`; per-file statuses come back in the result, so the caller can tell
"sent" from "the peer said no" and keep the series to retry.
"""

from __future__ import annotations

import logging
import re
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medrt import __version__
from medrt.errors import MedrtError
from medrt.privacy import describe_exception

__all__ = ["Destination", "ForwardError", "associate", "client_tls", "send", "failed", "taken", "new_ae", "IMPLEMENTATION_CLASS_UID",
           "IMPLEMENTATION_VERSION_NAME"]

log = logging.getLogger(__name__)

# How medrt names itself in every association it makes or accepts (A-ASSOCIATE, PS3.7
# D.3.3.2), so a PACS log or a conformance check tells it from other pynetdicom programs:
# a UUID-derived UID (PS3.5 B.2) that stays the same, and the version (16 characters).
IMPLEMENTATION_CLASS_UID = "2.25.198546540251257293241115434414703534064"
IMPLEMENTATION_VERSION_NAME = f"MEDRT_{__version__}"[:16]


def new_ae(ae_title: str) -> Any:
    """A pynetdicom ``AE`` that introduces itself as medrt."""
    from pynetdicom import AE

    ae = AE(ae_title=ae_title)
    ae.implementation_class_uid = IMPLEMENTATION_CLASS_UID
    ae.implementation_version_name = IMPLEMENTATION_VERSION_NAME
    return ae

_DEST = re.compile(r"^(?P<aet>[^@]{1,16})@(?P<host>\[[^\]]+\]|[^:@]+):(?P<port>[0-9]{1,5})$")


class ForwardError(MedrtError):
    """A forward that could not finish. ``statuses`` holds the replies that came before it
    broke (file → status), so a caller can tell which files the peer did take."""

    kind = "forward-error"

    def __init__(self, message: str, statuses: dict[Path, int] | None = None) -> None:
        super().__init__(message)
        self.statuses: dict[Path, int] = dict(statuses or {})


@dataclass(frozen=True, slots=True)
class Destination:
    ae_title: str
    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> Destination:
        """``AET@HOST:PORT`` (an IPv6 host in brackets), e.g. ``ORTHANC@pacs.local:4242``."""
        m = _DEST.match(text.strip())
        if m is None or not 0 < int(m["port"]) < 65536:
            raise ValueError(f"expected AET@HOST:PORT (e.g. ORTHANC@127.0.0.1:4242), got {text!r}")
        return cls(m["aet"].strip(), m["host"].strip("[]"), int(m["port"]))

    def __str__(self) -> str:
        return f"{self.ae_title}@{self.host}:{self.port}"


def client_tls(ca: str | Path | None = None, cert: str | Path | None = None,
               key: str | Path | None = None) -> ssl.SSLContext:
    """A TLS context for forwarding: the destination's certificate checked against ``ca``
    (the system's trust store without it), and ours (``cert``, ``key``) for a PACS that
    asks for one. The host name is not checked: PACS certificates rarely name the host."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=None if ca is None else str(ca))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    if cert is not None:
        ctx.load_cert_chain(certfile=str(cert), keyfile=None if key is None else str(key))
    return ctx


STATUS_NOT_SUPPORTED = 0x0122  # what a file no accepted presentation context fits counts as
STATUS_NOT_ENCODED = 0x0110  # what a file pynetdicom cannot encode for its context counts as (processing failure)


def _uncompressed(path: Path) -> Any:
    """The dataset in ``path``, its pixel data decoded into Explicit VR Little Endian."""
    import pydicom
    from pydicom.pixels import pack_bits
    from pydicom.uid import ExplicitVRLittleEndian

    ds = pydicom.dcmread(path)
    if int(ds.get("BitsAllocated", 0)) == 1:  # pydicom's decompress() would leave a byte per pixel
        bits = pack_bits(ds.pixel_array.ravel())
        ds.PixelData = bits
        ds["PixelData"].VR = "OB"
        ds["PixelData"].is_undefined_length = False
        ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    else:
        ds.decompress()
    return ds


def _is_success(status: int) -> bool:
    return status == 0x0000 or 0xB000 <= status <= 0xBFFF  # warnings: stored, with a coercion or similar


def associate(dest: Destination, contexts: Sequence[tuple[str, str | None]], *, calling_ae: str = "MEDRT",
              timeout_s: float = 30.0, tls: ssl.SSLContext | None = None, ext_neg: Sequence[Any] = ()) -> Any:
    """An established association from ``calling_ae`` to ``dest`` proposing ``contexts``
    ((abstract syntax, transfer syntax or None for pynetdicom's defaults), ...), every
    timeout ``timeout_s``, over TLS with ``tls``; :class:`ForwardError` naming the peer when
    it is rejected or aborted (a TLS handshake that fails ends so)."""
    ae = new_ae(calling_ae)
    # connection_timeout too: left unset, a peer whose host drops packets (switched off behind
    # a firewall) holds the TCP connect for the OS's SYN retries, about two minutes on Linux.
    ae.acse_timeout = ae.dimse_timeout = ae.network_timeout = ae.connection_timeout = timeout_s
    for abstract, transfer in contexts:
        if transfer is None:
            ae.add_requested_context(abstract)  # pynetdicom's uncompressed transfer syntaxes
        else:
            ae.add_requested_context(abstract, transfer)
    started = time.monotonic()
    assoc = ae.associate(dest.host, dest.port, ae_title=dest.ae_title, ext_neg=list(ext_neg) or None,
                         tls_args=None if tls is None else (tls, None))
    if not assoc.is_established:
        if assoc.is_rejected:
            raise ForwardError(f"{dest}: association rejected (is {calling_ae} known to it as a calling AE title, "
                               f"and is {dest.ae_title} its AE title?)")
        if time.monotonic() - started >= 0.9 * timeout_s:
            raise ForwardError(f"{dest}: no answer within {timeout_s:.0f} s (--forward-timeout; a hung PACS, "
                               "a firewall dropping packets, or the host is off?)")
        raise ForwardError(f"{dest}: {_why_not_connected(dest, timeout_s, calling_ae)}")
    return assoc


def _why_not_connected(dest: Destination, timeout_s: float, calling_ae: str) -> str:
    """Why an association that failed at once, neither established nor rejected, failed,
    as IT reads it: pynetdicom reports a refused connection as an abort. A TCP connect,
    only after that failure, tells them apart."""
    import socket

    try:
        with socket.create_connection((dest.host, dest.port), timeout=min(timeout_s, 10.0)):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        return f"cannot connect to {dest.host}:{dest.port}: {reason[:1].lower() + reason[1:]} (is it listening?)"
    return f"association aborted by the peer (is {calling_ae} known to it, and does it take DICOM here?)"


def send(paths: Sequence[str | Path], dest: Destination, *, calling_ae: str = "MEDRT",
         timeout_s: float = 30.0, tls: ssl.SSLContext | None = None) -> dict[Path, int]:
    """C-STORE each file to ``dest`` over one association; returns each file's status.

    Raises :class:`ForwardError` when the association is rejected or aborted (a TLS
    handshake that fails ends so), or a file is not DICOM, cannot be read, or has no SOP
    class or transfer syntax to propose (before anything is sent).
    """
    import pydicom
    from pydicom.errors import InvalidDicomError
    from pydicom.uid import UID, ExplicitVRLittleEndian

    files = [Path(p) for p in paths]
    if not files:
        return {}
    contexts: dict[tuple[str, str], None] = {}
    wanted: dict[Path, tuple[str, str]] = {}
    for path in files:
        try:
            ds = pydicom.dcmread(path, stop_before_pixels=True)
        except (InvalidDicomError, OSError) as exc:  # named, as every other refusal to send is
            raise ForwardError(f"{path.name}: cannot be sent: {describe_exception(exc)}") from exc
        sop_class = str(ds.get("SOPClassUID", "") or ds.file_meta.get("MediaStorageSOPClassUID", ""))
        ts = str(ds.file_meta.get("TransferSyntaxUID", ""))
        if not sop_class or not ts:
            raise ForwardError(f"{path.name}: no SOP Class UID or transfer syntax to propose")
        contexts[(sop_class, ts)] = None
        if UID(ts).is_compressed:  # the same object uncompressed, for a peer that takes only that
            contexts[(sop_class, ExplicitVRLittleEndian)] = None
        wanted[path] = (sop_class, ts)
    if len(contexts) > 128:
        raise ForwardError(f"{len(contexts)} SOP class/transfer syntax pairs: over the 128 one association allows")
    assoc = associate(dest, list(contexts), calling_ae=calling_ae, timeout_s=timeout_s, tls=tls)
    accepted = {(str(c.abstract_syntax), str(c.transfer_syntax[0])) for c in assoc.accepted_contexts}
    statuses: dict[Path, int] = {}
    try:
        for path in files:
            sop_class, ts = wanted[path]
            if (sop_class, ts) in accepted:
                payload: Any = path
            elif (sop_class, ExplicitVRLittleEndian) in accepted:
                log.info("forward: %s takes %s only uncompressed: sending it decoded", dest, path.name)
                try:
                    decoded = _uncompressed(path)
                except Exception as exc:  # a decoder missing or failing: this file only
                    log.error("forward: %s cannot be decoded for %s: %s", path.name, dest, describe_exception(exc))
                    statuses[path] = STATUS_NOT_SUPPORTED
                    continue
                payload = decoded
            else:
                log.error("forward: %s accepted no presentation context for %s (%s in %s%s)", dest, path.name,
                          UID(sop_class).name, UID(ts).name, " or uncompressed" if UID(ts).is_compressed else "")
                statuses[path] = STATUS_NOT_SUPPORTED
                continue
            try:
                reply = assoc.send_c_store(payload)
            except (ValueError, AttributeError) as exc:  # pynetdicom refuses it before sending any of it
                log.error("forward: %s cannot be encoded for %s: %s", path.name, dest, describe_exception(exc))
                statuses[path] = STATUS_NOT_ENCODED
                continue
            if "Status" not in reply:  # no reply: the association broke or the DIMSE timed out
                raise ForwardError(f"{dest}: no reply to C-STORE of {path.name} (association lost or timed out)",
                                   statuses)
            statuses[path] = int(reply.Status)
            if not _is_success(statuses[path]):
                log.error("forward: %s refused %s: status 0x%04X %s", dest, path.name, statuses[path],
                          str(reply.get("ErrorComment", "")))
    finally:
        if assoc.is_established:
            assoc.release()
    return statuses


def failed(statuses: dict[Path, int]) -> list[Path]:
    return [p for p, s in statuses.items() if not _is_success(s)]


def taken(statuses: dict[Path, int]) -> list[Path]:
    """The files a peer answered Success (or a warning) to."""
    return [p for p, s in statuses.items() if _is_success(s)]
