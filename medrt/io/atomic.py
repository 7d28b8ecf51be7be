"""Atomic file writes: a reader (a PACS sender, a folder watcher, a resumed run) never sees half a file.

The bytes go to a temporary file in the destination's own folder (so the final
rename never crosses a file system), are fsync'd, renamed over the destination
with ``os.replace``, and the folder is fsync'd so the rename itself survives a
power cut. On any error the temporary file is removed and the destination is
left as it was. Temporary names are ``.<name>.<random>.tmp``. The file gets the mode an
``open()`` would give it (0666 less the umask), not the temporary file's 0600: a PACS
import job or a colleague reads a batch's SEG, and the listener's unit's ``UMask=0027``
means what it says.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["atomic_write", "atomic_write_bytes"]


def _umask() -> int:
    """This process's umask, read without changing it (os.umask sets it to read it, which
    races with other threads creating files): Linux's /proc/self/status, else 0o022."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms that cannot open a directory
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - file systems that refuse fsync on directories
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike[str], write: Callable[[BinaryIO], object]) -> Path:
    """Call ``write(fp)`` on a temporary file beside ``path``, then move it to ``path``.

    The parent folder is created when missing. Returns ``path`` as a Path.
    """
    path = Path(path)
    if not path.name:
        raise ValueError(f'Argument "path" must name a file, got {str(path)!r}.')
    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fp:
            os.fchmod(fd, 0o666 & ~_umask())
            write(fp)
            fp.flush()
            os.fsync(fp.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(folder)
    return path


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; return the path."""
    return atomic_write(path, lambda fp: fp.write(data))
