"""DICOM media (PS3.10 file-sets): the image files a DICOMDIR lists.

A patient CD or USB stick from another hospital opens at its ``DICOMDIR``, the
file-set's index. Given that file, medrt reads the files its directory records
reference (``ReferencedFileID``, relative to the DICOMDIR's folder) in the
record order, which is patient, study, series, image as the media was written.

The records are walked flat rather than through :class:`pydicom.fileset.FileSet`:
FileSet checks the record hierarchy and refuses a DICOMDIR that lacks a level
(pydicom's own ``DICOMDIR-nopatient``), while the images it names are still on the
media and readable. medrt reads media as they come; it does not validate them.

What media do in practice, and how each is met:

* a name in another case: ISO 9660 file names are upper case, and Linux mounts a
  disc without Rock Ridge as lower case (``map=normal``), so ``IMAGES\\IM0001``
  is ``images/im0001`` on disk. A component that does not exist as written is
  looked up without case, and without an ISO 9660 version suffix (``IM0001;1``)
  or a trailing dot (``IM0001.``);
* a referenced file that is missing is still listed (``missing`` counts it), so
  the reader reports it by name like any other file it cannot open;
* a reference that leaves the DICOMDIR's folder (``..``, an absolute path) is not
  followed: a disc names files on itself only (``refused``);
* inactive records (Record In-use Flag 0000H) are passed over.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pydicom
from pydicom.errors import InvalidDicomError

__all__ = ["MEDIA_STORAGE_DIRECTORY", "MediaListing", "is_dicomdir", "read_dicomdir"]

log = logging.getLogger(__name__)

MEDIA_STORAGE_DIRECTORY = "1.2.840.10008.1.3.10"  # Media Storage Directory Storage: a DICOMDIR


_LEVELS = {"PATIENT": ("patient", "patients"), "STUDY": ("study", "studies"), "SERIES": ("series", "series"),
           "IMAGE": ("image", "images")}


@dataclass
class MediaListing:
    """The files a DICOMDIR references, in record order."""

    dicomdir: Path
    files: list[Path] = field(default_factory=list)  # as found on disk (or as written, when missing)
    missing: list[Path] = field(default_factory=list)  # referenced, not on the media
    refused: list[str] = field(default_factory=list)  # references that leave the DICOMDIR's folder
    records: Counter[str] = field(default_factory=Counter)  # directory record type -> count (active ones)

    def summary(self) -> str:
        """One line for a person: what the media hold (counts only; no names or IDs)."""
        kinds = ", ".join(f"{n} {one if n == 1 else many}" for kind, (one, many) in _LEVELS.items()
                          if (n := self.records.get(kind, 0)))
        others = sum(n for kind, n in self.records.items() if kind not in _LEVELS)
        text = f"DICOMDIR {self.dicomdir}: {kinds or 'no records'}"
        if others:
            text += f", {others} other record(s)"
        text += f"; {len(self.files)} file(s) referenced"
        if self.missing:
            text += f", {len(self.missing)} not on the media"
        if self.refused:
            text += f", {len(self.refused)} outside its folder (not read)"
        return text


def is_dicomdir(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a file whose File Meta Information names a DICOMDIR.
    Reads the 132-byte preamble and the meta group only."""
    p = Path(path)
    try:
        if not p.is_file():
            return False
        with open(p, "rb") as f:
            f.seek(128)
            if f.read(4) != b"DICM":
                return False
        meta = pydicom.filereader.read_file_meta_info(p)
    except (OSError, InvalidDicomError, ValueError, EOFError):
        return False
    return str(meta.get("MediaStorageSOPClassUID", "")) == MEDIA_STORAGE_DIRECTORY


def read_dicomdir(path: str | os.PathLike[str]) -> MediaListing:
    """The files ``path`` (a DICOMDIR) references. Raises ``ValueError`` naming the file
    when it has no directory records to read."""
    dicomdir = Path(path)
    try:
        ds = pydicom.dcmread(dicomdir, force=True)
        records = ds.get("DirectoryRecordSequence")
    except Exception as exc:  # pydicom raises several kinds on a damaged file
        raise ValueError(f"{dicomdir}: DICOMDIR cannot be read: {type(exc).__name__}: {exc}") from None
    if records is None:
        raise ValueError(f"{dicomdir}: DICOMDIR has no Directory Record Sequence (0004,1220)")
    listing = MediaListing(dicomdir)
    root = dicomdir.parent
    folders: dict[Path, dict[str, str]] = {}  # a folder's entries by normalised name, read once
    seen: set[Path] = set()
    for record in records:
        if record.get("RecordInUseFlag", 0xFFFF) == 0:
            continue
        listing.records[str(record.get("DirectoryRecordType", "") or "").strip().upper() or "UNKNOWN"] += 1
        ref = record.get("ReferencedFileID")
        if not ref:
            continue
        parts = _components(ref)
        if not parts or any(p in (".", "..") for p in parts) or parts[0].startswith(("/", "\\")) or ":" in parts[0]:
            listing.refused.append("\\".join(parts) or "(empty)")
            continue
        found = _resolve(root, parts, folders)
        if found in seen:  # two records naming one file (an image and its icon, say)
            continue
        seen.add(found)
        listing.files.append(found)
        if not found.is_file():
            listing.missing.append(found)
    if listing.missing:
        log.warning("%s: %d of %d referenced file(s) are not on the media, e.g. %s", dicomdir,
                    len(listing.missing), len(listing.files), listing.missing[0])
    if listing.refused:
        log.warning("%s: %d reference(s) leave its folder and are not read, e.g. %r", dicomdir,
                    len(listing.refused), listing.refused[0])
    return listing


def _components(ref: object) -> list[str]:
    """ReferencedFileID's components (multi-valued CS; a writer that joined them with
    slashes in one value is read too)."""
    values = [ref] if isinstance(ref, str) else list(ref)  # type: ignore[call-overload]
    return [part.strip() for v in values for part in str(v).replace("/", "\\").split("\\") if part.strip()]


def _normal(name: str) -> str:
    """A file name as ISO 9660 media compare it: no version suffix, no trailing dot, any case."""
    return name.split(";", 1)[0].rstrip(".").casefold()


def _resolve(root: Path, parts: list[str], folders: dict[Path, dict[str, str]]) -> Path:
    """``root``/``parts`` as it is on disk: each component as written when it exists,
    otherwise the one entry of its folder that matches it without case (see the module
    docstring); as written when nothing matches."""
    here = root
    for i, part in enumerate(parts):
        exact = here / part
        if exact.exists():
            here = exact
            continue
        if here not in folders:
            try:
                names = os.listdir(here)
            except OSError:
                names = []
            index: dict[str, str] = {}
            for name in sorted(names):
                index.setdefault(_normal(name), name)
            folders[here] = index
        match = folders[here].get(_normal(part))
        if match is None:
            return here.joinpath(*parts[i:])
        here = here / match
    return here
