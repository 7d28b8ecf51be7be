"""Retention of the listener's results folder (``medrt listen --keep-results-days``).

The listener writes each series' results to ``OUT/<SeriesInstanceUID>/`` (a batch run's
layout: ``medrt.batch.run``, ``medrt.batch.outputs``), about 60 kB a series, and
:meth:`Spool.purge` deletes only the received images: at thousands of series a day the
results fill the disk in months. :func:`purge_results` deletes the results of series
that were done long enough ago.

*When a series was done*: the latest of when its results were written (``report.json``,
rewritten by every analysis), when it was marked ``done`` (after its send, or its
analysis when there was nowhere to send: :func:`date_results` dates the results folder
itself then, so the date outlives the series' row in the spool) and, for a series still
in the spool, its last attempt there. Not its last image: results written or sent long
after it (a series requeued by hand, a PACS down for a week) would go as soon as they
were sent.

*Never deleted*: the results of a series that is waiting, being analysed, analysed and
waiting to be sent, being sent, failed or unsent (its state in the spool); anything in
the results folder that medrt did not write. A folder is a series' results only when it
is named by a UID, is a real folder (not a link) and holds medrt's ``report.json``; in it,
only the file names a batch run writes are deleted (a file an administrator put there,
or a link, stays, and so does the folder then). Links are never followed: every folder is
opened with ``O_NOFOLLOW`` and its entries removed relative to it, so a folder swapped for
a link meanwhile deletes nothing outside.

A series that comes back after its results were deleted (more images, re-sent,
requeued) is analysed again as a new one: its new SR has no earlier SR to name in its
Predecessor Documents Sequence, and names none.
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from medrt.pacs.index import SpoolError, check_uid
from medrt.pacs.spool import Spool

__all__ = ["purge_results", "date_results"]

log = logging.getLogger(__name__)

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
# medrt.io.atomic's temporary names: ".<name>.<random>.tmp" (left by a write cut short)
_TEMPORARY = re.compile(r"\.(.+)\.[A-Za-z0-9_]+\.tmp")


@dataclass(frozen=True)
class _Layout:
    """What medrt writes in one folder: file names (a pattern), and the layout of each
    sub-folder by its name (None: not medrt's)."""

    files: re.Pattern[str]
    folders: Callable[[str], _Layout | None] = lambda name: None
    first: tuple[str, ...] = ()  # deleted before the rest
    last: tuple[str, ...] = ()  # deleted after the rest, in this order

    def owns(self, name: str) -> bool:
        m = _TEMPORARY.fullmatch(name)
        return self.files.fullmatch(m.group(1) if m else name) is not None


def _is_uid(name: str) -> bool:
    try:
        return check_uid("SeriesInstanceUID", name) == name
    except SpoolError:
        return False


def _results_layout() -> _Layout:
    """``OUT/<SeriesInstanceUID>/`` as a batch run writes it, names from the modules that
    write them. A file a batch run writes that this lacks would be left behind, with the
    warning: the tests purge a folder holding every output there is."""
    from medrt.batch.outputs import LESIONS_JSON
    from medrt.batch.plan import MANIFEST
    from medrt.batch.run import (
        ERRORS,
        HISTOGRAM,
        LESIONS_CSV,
        MASKS,
        REPORT_JSON,
        REPORT_MD,
        RESULTS,
    )

    frames = _Layout(re.compile(r"\d+(_f\d+)?\.dcm"))
    pngs = _Layout(re.compile(r"\d+(_f\d+)?\.png"))
    # manifest.json first: from then on the series folder reads as unfinished, never as results
    series = _Layout(re.compile("|".join(map(re.escape, (MANIFEST, "sr.dcm", "frames.jsonl", LESIONS_JSON, MASKS)))
                                + r"|seg(_\d+)?\.dcm"),
                     folders={"sc": frames, "png": pngs}.get, first=(MANIFEST,))
    series_folders = _Layout(re.compile(r"(?!)"), folders=lambda name: series if _is_uid(name) else None)
    top = (RESULTS, ERRORS, LESIONS_CSV, MASKS, HISTOGRAM, REPORT_MD, REPORT_JSON)
    # report.json last: what marks a results folder, so a purge cut short is finished at the next pass
    return _Layout(re.compile("|".join(map(re.escape, top))), folders={"series": series_folders}.get,
                   last=(REPORT_MD, REPORT_JSON))


def _clear(fd: int, layout: _Layout) -> int:
    """Delete what ``layout`` says medrt wrote in the folder open as ``fd``, and its
    sub-folders once empty; returns how many entries are left (not medrt's)."""
    with os.scandir(fd) as it:
        entries = list(it)

    def order(entry: os.DirEntry[str]) -> tuple[int, int]:
        if entry.name in layout.first:
            return 0, 0
        if entry.name in layout.last:
            return 2, layout.last.index(entry.name)
        return 1, 0

    left = 0
    for entry in sorted(entries, key=order):
        if entry.is_dir(follow_symlinks=False):
            inner = layout.folders(entry.name)
            if inner is None:
                left += 1
                continue
            sub = os.open(entry.name, _DIR, dir_fd=fd)
            try:
                remaining = _clear(sub, inner)
            finally:
                os.close(sub)
            if remaining:
                left += 1
            else:
                os.rmdir(entry.name, dir_fd=fd)
        elif entry.is_file(follow_symlinks=False) and layout.owns(entry.name):
            os.unlink(entry.name, dir_fd=fd)
        else:  # a link, a file medrt does not write, a socket ...
            left += 1
    return left


def _dated(out_fd: int, entry: os.DirEntry[str]) -> float | None:
    """When the results in ``OUT/<uid>`` (``entry``) were last written or sent (the later
    of their ``report.json``'s and their folder's times), or None for a folder that is not a
    series' results."""
    try:
        st = os.stat(f"{entry.name}/report.json", dir_fd=out_fd, follow_symlinks=False)
        folder = entry.stat(follow_symlinks=False).st_mtime
    except OSError:
        return None
    return max(st.st_mtime, folder) if stat.S_ISREG(st.st_mode) else None


def _medrt_report(out_fd: int, uid: str) -> bool:
    """Whether ``OUT/<uid>/report.json`` is a batch run's report (checked before deleting)."""
    try:
        fd = os.open(f"{uid}/report.json", os.O_RDONLY | os.O_NOFOLLOW, dir_fd=out_fd)
        with os.fdopen(fd, "rb") as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and "medrt" in doc and "counts" in doc and "settings" in doc


def _candidates(out_fd: int, before: float) -> Iterator[str]:
    """The UID of each series' results folder last written or sent before ``before``."""
    with os.scandir(out_fd) as it:
        entries = list(it)
    for entry in entries:
        if not _is_uid(entry.name) or not entry.is_dir(follow_symlinks=False):
            continue  # not a series' results: an administrator's file or folder, a link
        dated = _dated(out_fd, entry)
        if dated is not None and dated < before:
            yield entry.name


def date_results(spool: Spool, series_uid: str, folder: Path) -> None:
    """Date the results ``folder`` of a series just marked ``done`` by when it was (its last
    attempt: the send, or the analysis when there was nowhere to send). ``--keep-results-days``
    counts from it, also once the series has left the spool: a series sent a week late (a
    PACS down) keeps its results the days asked after it was sent."""
    state = spool.series(series_uid)
    if state is None or state.state != "done":
        return  # more came meanwhile: analysed again, and dated when done again
    try:
        os.utime(folder, (state.last_attempt, state.last_attempt), follow_symlinks=False)
    except OSError as exc:  # the folder removed by hand: nothing to keep
        log.debug("listener: series %s: results not dated (%s)", series_uid, exc.strerror)


def purge_results(out: str | Path, spool: Spool, older_than_s: float, *, now: float | None = None) -> list[str]:
    """Delete the results under ``out`` of series done more than ``older_than_s`` ago;
    returns their UIDs.

    Done: not in ``spool`` (its images purged, or another index), or ``done`` there and
    last attempted (sent) that long ago; the results written and their folder dated that
    long ago either way.
    Only for the listener's analysis worker, between analyses: nothing writes a series'
    results meanwhile, and a series that gets an image meanwhile is analysed after this.
    A folder that cannot be read or deleted is logged by UID and tried again next time.
    """
    now = time.time() if now is None else now
    before = now - older_than_s
    try:
        out_fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)  # OUT itself may be a link (to a bigger disk)
    except FileNotFoundError:
        return []
    except OSError as exc:
        log.error("listener: the results folder cannot be read (%s); no results purged", exc.strerror or exc)
        return []
    layout = _results_layout()
    purged: list[str] = []
    kept: list[str] = []
    try:
        for uid in _candidates(out_fd, before):
            state = spool.series(uid)
            if state is not None and (state.state != "done" or state.last_attempt >= before):
                continue  # waiting, analysed again, failed, unsent, being sent, or sent since
            if not _medrt_report(out_fd, uid):
                continue
            try:
                fd = os.open(uid, _DIR, dir_fd=out_fd)
                try:
                    left = _clear(fd, layout)
                finally:
                    os.close(fd)
                if not left:
                    os.rmdir(uid, dir_fd=out_fd)
            except OSError as exc:
                log.error("listener: series %s: its results cannot all be deleted (%s); tried again later", uid,
                          exc.strerror or type(exc).__name__)
                continue
            purged.append(uid)
            log.debug("listener: series %s: results purged", uid)
            if left:
                kept.append(uid)
    finally:
        os.close(out_fd)
    if kept:
        log.warning("listener: %d purged results folder(s) hold files medrt did not write, left in place: %s",
                    len(kept), ", ".join(kept))
    if purged:
        log.info("listener: purged the results of %d series done over %.1f day(s) ago", len(purged),
                 older_than_s / 86400)
    return purged
