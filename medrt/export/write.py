"""Writing DICOM objects atomically (see :mod:`medrt.io.atomic`): a PACS sender or a
folder watcher never picks up half a file."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from pydicom.dataset import Dataset

from medrt.io.atomic import atomic_write

__all__ = ["atomic_write", "write_dataset"]

log = logging.getLogger(__name__)


def write_dataset(ds: Dataset, path: str | os.PathLike[str]) -> Path:
    """Write ``ds`` as a DICOM Part 10 file at ``path``, atomically; return the path.

    ``ds`` needs its ``file_meta`` (every highdicom object has it). pydicom's
    ``enforce_file_format`` checks the file meta and writes the preamble.
    """
    if not isinstance(ds, Dataset):
        raise TypeError(f'Argument "ds" must be a pydicom Dataset, got {type(ds).__name__}.')
    if not getattr(ds, "file_meta", None) or "TransferSyntaxUID" not in ds.file_meta:
        raise ValueError('Argument "ds" has no file meta with a TransferSyntaxUID.')
    out = atomic_write(path, lambda fp: ds.save_as(fp, enforce_file_format=True))
    log.info("wrote %s %s", ds.SOPClassUID.name if "SOPClassUID" in ds else "object",
             ds.get("SOPInstanceUID", "<no uid>"))
    return out
