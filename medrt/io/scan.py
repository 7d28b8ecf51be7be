"""Find input files under paths given on the command line or by a source."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from medrt.io.media import is_dicomdir, read_dicomdir

__all__ = ["iter_files"]

log = logging.getLogger(__name__)


def iter_files(paths: Iterable[str | os.PathLike[str]], *, follow_outside_links: bool = False,
               dicomdir: bool = True, not_followed: list[Path] | None = None) -> Iterator[Path]:
    """Yield the files named by ``paths``, walking folders recursively in sorted order.

    A DICOMDIR named as a path (not one met inside a folder, whose files the walk
    finds anyway) stands for the files it references, in its record order
    (:mod:`medrt.io.media`): a patient CD opens at its DICOMDIR. ``dicomdir=False``
    yields it as a file like any other (for paths that are already such a walk's output).

    Hidden files and folders (a leading dot) are passed over. A symbolic link
    inside a folder is followed only when it stays inside that folder, unless
    ``follow_outside_links`` is set, so a scan never wanders into the rest of the
    file system (``not_followed``, when given, collects the links passed over). A path
    that does not exist is yielded as is, so that the reader reports it like any other
    bad input.
    """
    for raw in paths:
        root = Path(raw)
        if not root.is_dir():
            yield from (_dicomdir_files(root) if dicomdir else (root,))
            continue
        real_root = root.resolve()
        seen: set[Path] = set()
        for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
            here = Path(dirpath)
            real_here = here.resolve()
            if real_here in seen:  # a link loop
                dirnames[:] = []
                continue
            seen.add(real_here)
            dirnames[:] = sorted(
                d for d in dirnames if not d.startswith(".") and _allowed(here / d, real_root, follow_outside_links, not_followed)
            )
            for name in sorted(filenames):
                if name.startswith("."):
                    continue
                path = here / name
                if _allowed(path, real_root, follow_outside_links, not_followed):
                    yield path


def _dicomdir_files(path: Path) -> Iterator[Path]:
    """The files a DICOMDIR references; any other path as it is. A DICOMDIR that cannot
    be read is yielded itself, with a warning saying why, and its reader reports it."""
    if not is_dicomdir(path):
        yield path
        return
    try:
        listing = read_dicomdir(path)
    except ValueError as exc:
        log.warning("%s", exc)
        yield path
        return
    log.info("%s", listing.summary())
    yield from listing.files


def _allowed(path: Path, real_root: Path, follow_outside_links: bool, not_followed: list[Path] | None) -> bool:
    if follow_outside_links or not path.is_symlink():
        return True
    target = path.resolve()
    if target == real_root or real_root in target.parents:
        return True
    log.info("not following %s: the link leads outside the input folder", path)
    if not_followed is not None:
        not_followed.append(path)
    return False
