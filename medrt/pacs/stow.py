"""Forwarding over DICOMweb: STOW-RS (PS3.18 10.5), for a PACS or VNA that takes objects over HTTP.

``medrt listen --forward https://pacs.example.org/dicom-web`` sends each series' SEG and
SR (and SC) in one ``POST {root}/studies`` of ``multipart/related; type="application/dicom"``
(one per object when the server answers 413, its request size limit) through
dicomweb-client (the DICOMweb client highdicom's authors keep), and reads the store
response: each object in the Referenced SOP Sequence is taken (a Warning Reason
counts as taken, as a C-STORE warning does), each in the Failed SOP Sequence is refused
with its Failure Reason, so the listener's per-destination bookkeeping and retries work
as for a DIMSE destination.

Credentials never go on the command line (``ps`` shows it to every user) or in the URL:
``MEDRT_DICOMWEB_TOKEN`` (sent as ``Authorization: Bearer ...``) or
``MEDRT_DICOMWEB_USER`` and ``MEDRT_DICOMWEB_PASSWORD`` (HTTP basic), from the
environment (for the service: ``/etc/medrt/listen.env``, readable by root only). HTTPS
checks the server's certificate against the system's CAs, or ``ca``; ``cert``/``key`` are
ours for a server that asks for one. dicomweb-client's own retries are off: a failure
leaves the series ``unsent`` and the listener's ``--retry`` sends it again.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from medrt.pacs.scu import ForwardError

__all__ = ["StowDestination", "send_stow", "is_url", "TOKEN_ENV", "USER_ENV", "PASSWORD_ENV"]

log = logging.getLogger(__name__)

TOKEN_ENV = "MEDRT_DICOMWEB_TOKEN"
USER_ENV = "MEDRT_DICOMWEB_USER"
PASSWORD_ENV = "MEDRT_DICOMWEB_PASSWORD"
_PROCESSING_FAILURE = 0xC000  # a failed object without a Failure Reason (0272 "Processing failure")
_OUT_OF_RESOURCES = 0xA700  # an object the server will not take in any request (HTTP 413 alone)


def is_url(text: str) -> bool:
    return text.strip().lower().startswith(("http://", "https://"))


@dataclass(frozen=True, slots=True)
class StowDestination:
    """A DICOMweb service root (``https://host/dicom-web``) and how to reach it over TLS."""

    url: str
    ca: str | None = None  # PEM of the CAs to trust (default: the system's)
    cert: str | None = None  # our certificate, for a server that asks for one
    key: str | None = None

    @classmethod
    def parse(cls, text: str) -> StowDestination:
        url = text.strip().rstrip("/")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected a DICOMweb URL such as https://pacs.example.org/dicom-web, got {text!r}")
        if parts.username or parts.password:
            raise ValueError(f"{parts.scheme}://{parts.hostname}...: no credentials in the URL (every user sees the "
                             f"command line); set {TOKEN_ENV}, or {USER_ENV} and {PASSWORD_ENV}")
        if parts.query or parts.fragment:
            raise ValueError(f"{text!r}: the DICOMweb service root takes no query or fragment")
        return cls(url)

    def __str__(self) -> str:
        return self.url


def _session(dest: StowDestination) -> Any:
    import requests

    session = requests.Session()
    token = os.environ.get(TOKEN_ENV, "")
    user, password = os.environ.get(USER_ENV, ""), os.environ.get(PASSWORD_ENV, "")
    if token:
        session.headers["Authorization"] = f"Bearer {token}"
    elif user:
        session.auth = (user, password)
    session.verify = dest.ca if dest.ca else True
    if dest.cert:
        session.cert = (dest.cert, dest.key) if dest.key else dest.cert
    return session


def _why(exc: Exception, dest: StowDestination) -> str:
    import requests

    response = getattr(exc, "response", None)
    if isinstance(exc, requests.HTTPError) and response is not None:
        hint = {401: f" (credentials: {TOKEN_ENV}, or {USER_ENV} and {PASSWORD_ENV})",
                403: " (medrt's credentials may not store there)", 404: " (is that the DICOMweb service root?)",
                413: " (the server limits the size of a request)"}.get(response.status_code, "")
        return f"{dest}: HTTP {response.status_code} {response.reason}{hint}"
    if isinstance(exc, requests.exceptions.SSLError):
        return f"{dest}: TLS: {exc.__class__.__name__} (is its certificate signed by a CA medrt trusts?)"
    if isinstance(exc, requests.Timeout):
        return f"{dest}: no answer in time"
    if isinstance(exc, requests.ConnectionError):
        return f"{dest}: cannot connect"
    return f"{dest}: {exc.__class__.__name__}"


class _TooLarge(Exception):
    """HTTP 413 for a request: the server limits the size of one."""


def send_stow(paths: Sequence[str | Path], dest: StowDestination, *, timeout_s: float = 30.0) -> dict[Path, int]:
    """STOW-RS ``paths`` to ``dest``; returns each file's status (0x0000, a Warning Reason,
    or a Failure Reason). Raises :class:`~medrt.pacs.scu.ForwardError` naming the
    destination when a request fails as a whole (connection, TLS, HTTP 4xx/5xx with no
    store response), with the statuses of what it took before.

    One request carries all the files; a server that answers 413 (its request size limit:
    a proxy's ``client_max_body_size``, say) is sent them one per request instead. An
    object too large on its own is refused (0xA700, out of resources) and named."""
    files = [Path(p) for p in paths]
    if not files:
        return {}
    try:
        return _store(files, dest, timeout_s)
    except _TooLarge as exc:
        if len(files) == 1:
            raise ForwardError(str(exc), {files[0]: _OUT_OF_RESOURCES}) from None
        log.warning("forward: %s; sending the %d objects one per request", exc, len(files))
    statuses: dict[Path, int] = {}
    too_large = []
    for path in files:
        try:
            statuses.update(_store([path], dest, timeout_s))
        except _TooLarge:
            statuses[path] = _OUT_OF_RESOURCES
            too_large.append(f"{path.name} ({path.stat().st_size / 2**20:.1f} MiB)")
        except ForwardError as exc:
            raise ForwardError(str(exc), statuses) from None
    if too_large:
        raise ForwardError(f"{dest}: HTTP 413: too large for the server even alone: {', '.join(too_large)}", statuses)
    return statuses


def _store(files: list[Path], dest: StowDestination, timeout_s: float) -> dict[Path, int]:
    """One STOW-RS request for ``files``."""
    import pydicom
    import requests
    from dicomweb_client.api import DICOMwebClient

    datasets = [pydicom.dcmread(p) for p in files]
    uids = {str(ds.SOPInstanceUID): path for ds, path in zip(datasets, files, strict=True)}
    client = DICOMwebClient(dest.url, session=_session(dest), timeout=timeout_s)
    client.set_http_retry_params(retry=False)  # the listener retries, after --retry
    try:
        response = client.store_instances(datasets)
    except (requests.RequestException, OSError) as exc:
        if getattr(getattr(exc, "response", None), "status_code", None) == 413:
            raise _TooLarge(_why(exc, dest)) from None
        raise ForwardError(_why(exc, dest)) from None
    statuses: dict[Path, int] = {}
    for item in response.get("ReferencedSOPSequence", []):
        path = uids.get(str(item.get("ReferencedSOPInstanceUID", "")))
        if path is not None:
            statuses[path] = int(item.get("WarningReason", 0) or 0)
    for item in response.get("FailedSOPSequence", []):
        path = uids.get(str(item.get("ReferencedSOPInstanceUID", "")))
        if path is not None:
            statuses[path] = int(item.get("FailureReason", _PROCESSING_FAILURE) or _PROCESSING_FAILURE)
            log.error("forward: %s refused %s: failure reason 0x%04X", dest, path.name, statuses[path])
    if not response:  # 200 with no body: the server stored them and said no more
        return dict.fromkeys(files, 0)
    for path in files:  # named in neither sequence: not known to be stored
        statuses.setdefault(path, _PROCESSING_FAILURE)
    return statuses
