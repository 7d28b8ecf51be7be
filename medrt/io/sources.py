"""Where frames come from: a scanner imitated by replaying files, a watched folder,
or a queue that the PACS listener fills.

A source is an iterable of items for the pipeline's first stage (paths here,
decoded by the ``decode`` stage) with a ``close()`` that makes the iteration end
soon, from any thread.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from medrt.io.scan import iter_files

__all__ = ["FileReplay", "FolderWatch", "Lookahead", "QueueSource", "TEMP_SUFFIXES"]

log = logging.getLogger(__name__)

#: Names of files still being written by common senders (storescu, rsync, browsers).
TEMP_SUFFIXES = (".tmp", ".part", ".partial", ".crdownload", ".filepart", ".swp")


def _is_temp(path: Path) -> bool:
    return path.name.startswith(".") or path.name.lower().endswith(TEMP_SUFFIXES)


class FileReplay:
    """Yield ``paths`` at ``fps`` items per second, the way a scanner sends images.

    The schedule is absolute (item *i* is due at ``start + i / fps``), so a slow
    consumer that blocks the replay does not stretch the schedule: the items it
    delayed are due at once when it catches up, and their end-to-end latency shows
    the delay. ``loop`` repeats the list (for long soak runs); ``fps=0`` replays as
    fast as the consumer takes them.

    ``order``: the files in slice order for a 2.5-D model's neighbours, a None ending each
    stack (:func:`medrt.io.series.slice_order`), when the caller has grouped them already
    (the viewer's opened folder); else :meth:`slice_order` groups them when asked.
    """

    def __init__(self, paths: Iterable[str | os.PathLike[str]], fps: float = 30.0, *, loop: int = 1,
                 order: Sequence[Path | None] | None = None) -> None:
        self.paths = [Path(p) for p in paths]
        self._order = list(order) if order is not None else None
        if not self.paths:
            raise ValueError('Argument "paths" must name at least one file.')
        if fps < 0:
            raise ValueError(f'Argument "fps" must be >= 0, got {fps!r}.')
        if loop < 1:
            raise ValueError(f'Argument "loop" must be >= 1, got {loop!r}.')
        self.fps = float(fps)
        self.loop = int(loop)
        self._closed = threading.Event()
        self.late = 0  # items released more than one period after they were due

    @classmethod
    def from_folder(cls, folder: str | os.PathLike[str], fps: float = 30.0, **kw: Any) -> FileReplay:
        """Every file under ``folder`` in name order (DICOM or not: decode reports the rest)."""
        paths = sorted(p for p in iter_files([folder]) if not _is_temp(p))
        if not paths:
            raise FileNotFoundError(f"{folder}: no files to replay")
        return cls(paths, fps, **kw)

    @classmethod
    def from_path(cls, path: str | os.PathLike[str], fps: float = 30.0, **kw: Any) -> FileReplay:
        """A folder (:meth:`from_folder`), a DICOMDIR (the files it references, in its
        record order: patient, study, series, image as the media were written;
        :mod:`medrt.io.media`) or one file."""
        p = Path(path)
        if p.is_dir():
            return cls.from_folder(p, fps, **kw)
        if not p.exists():
            raise FileNotFoundError(f"{p}: no such file or folder")
        paths = list(iter_files([p]))  # a DICOMDIR's files; any other file itself
        if not paths:
            raise FileNotFoundError(f"{p}: the DICOMDIR references no files to replay")
        return cls(paths, fps, **kw)

    def __len__(self) -> int:
        return len(self.paths) * self.loop

    def slice_order(self) -> list[Path | None]:
        """The files, series by series in slice order, a None after each stack of a series
        of several whole acquisitions (:func:`medrt.io.series.slice_order`): the order a
        2.5-D model's neighbours are taken from (:class:`medrt.pipeline.stages.SliceContext`),
        so that a pre-contrast pass's last slice never takes the post-contrast pass's first
        as its neighbour, whatever order the files are replayed in (by name). Reads the
        headers once, on the first call; files that are no image of a series are left out
        (they get no neighbours)."""
        if self._order is None:
            from medrt.io.series import group_series, slice_order

            self._order = slice_order(group_series(self.paths, dicomdir=False).series)
        return self._order

    def __iter__(self) -> Iterator[Path]:
        period = 1.0 / self.fps if self.fps > 0 else 0.0
        start = time.perf_counter()
        i = 0
        for _ in range(self.loop):
            for path in self.paths:
                if period:
                    due = start + i * period
                    wait = due - time.perf_counter()
                    if wait > 0:
                        if self._closed.wait(wait):
                            return
                    elif -wait > period:
                        self.late += 1
                if self._closed.is_set():
                    return
                yield path
                i += 1

    def close(self) -> None:
        self._closed.set()


class FolderWatch:
    """Yield files that appear under ``folder`` once they are complete.

    A file counts as complete when its size and modification time are unchanged
    over ``settle`` seconds (senders that write in place), or at once when it
    appears under its final name by an atomic rename and ``trust_rename`` is set.
    Names of partial files (dot-files, ``*.tmp``, ``*.part`` …) are ignored until
    they are renamed. Files that land while watched and complete together are yielded
    in the order they were last written (then by name): a sender's order, which for a
    scanner is slice order, where names often are not (a listener that names files by
    SOP Instance UID). Files there at start go first, by name (copied in, their times
    say nothing).
    Polling (not inotify) so that it also works on network shares.
    A file that changes after it was yielded (a sender that stalled longer than
    ``settle`` mid-write, then finished; or one that overwrote it) is yielded again
    once it settles anew, so a slow writer costs a retry, not the image.
    Files present at start are yielded too unless ``existing=False``. Iteration ends
    after ``close()`` or when nothing new has completed for ``idle_timeout`` seconds.
    """

    def __init__(
        self,
        folder: str | os.PathLike[str],
        *,
        poll: float = 0.2,
        settle: float = 0.5,
        existing: bool = True,
        idle_timeout: float | None = None,
        trust_rename: bool = False,
    ) -> None:
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise NotADirectoryError(f"{self.folder}: not a folder")
        self.poll = float(poll)
        self.settle = float(settle)
        self.existing = existing
        self.idle_timeout = idle_timeout
        self.trust_rename = trust_rename
        self._closed = threading.Event()

    def _snapshot(self) -> dict[Path, tuple[int, int]]:
        out = {}
        for path in iter_files([self.folder]):
            if _is_temp(path):
                continue
            try:
                st = path.stat()
            except OSError:  # vanished between listing and stat
                continue
            out[path] = (st.st_size, st.st_mtime_ns)
        return out

    def __iter__(self) -> Iterator[Path]:
        start = self._snapshot()
        done: dict[Path, tuple[int, int]] = {} if self.existing else dict(start)  # path: its size, mtime when yielded
        backlog: set[Path] = set(start) if self.existing else set()  # there before: in name order
        seen: dict[Path, tuple[tuple[int, int], float]] = {}
        last_new = time.monotonic()
        while not self._closed.is_set():
            now = time.monotonic()
            ready: list[tuple[bool, int, Path, tuple[int, int]]] = []
            for path, sig in self._snapshot().items():
                if done.get(path) == sig:
                    continue
                prev = seen.get(path)
                order = (path not in backlog, sig[1] if path not in backlog else 0, path, sig)
                if prev is None and self.trust_rename and sig[0] > 0 and path not in done:
                    ready.append(order)
                elif prev is None or prev[0] != sig:
                    seen[path] = (sig, now)
                elif now - prev[1] >= self.settle and sig[0] > 0:
                    ready.append(order)
            # Files that land while watched: as they landed (then by name), not by name alone;
            # those already there (copied in, whatever their times): by name, first.
            for *_, path, sig in sorted(ready):  # (paths are unique: sig never decides the order)
                if path in done:
                    log.info("%s changed after it was read: reading it again", path)
                done[path] = sig
                seen.pop(path, None)
                last_new = now
                yield path
                if self._closed.is_set():
                    return
            if self.idle_timeout is not None and time.monotonic() - last_new > self.idle_timeout:
                return
            self._closed.wait(self.poll)

    def close(self) -> None:
        self._closed.set()


class QueueSource:
    """Items pushed by another thread (the listener's spool) for the pipeline to take.

    ``put`` blocks while ``maxsize`` items are waiting, so a producer that must not
    lose anything is slowed down instead. Iteration ends after ``close()`` once the
    items already put have been taken.
    """

    _CLOSED = object()

    def __init__(self, maxsize: int = 0) -> None:
        self._q: queue.Queue[Any] = queue.Queue(maxsize)
        self._closed = threading.Event()

    def put(self, item: Any, timeout: float | None = None) -> None:
        if self._closed.is_set():
            raise RuntimeError("QueueSource is closed")
        self._q.put(item, timeout=timeout)

    def put_many(self, items: Sequence[Any]) -> None:
        for item in items:
            self.put(item)

    def __iter__(self) -> Iterator[Any]:
        while True:
            item = self._q.get()
            if item is self._CLOSED:
                return
            yield item

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            self._q.put(self._CLOSED)


_KEEP = 1024  # Lookahead: successors and arrival times remembered at most


def _ident(item: Any) -> Any:
    return os.fspath(item) if isinstance(item, (str, os.PathLike)) else id(item)


class Lookahead:
    """Hold each item of a live ``source`` until the ``depth`` items after it have arrived,
    so a 2.5-D model gets the slices after each slice too, as a replay in file order
    gives them.

    A watched folder or a queue cannot say what comes next; a scanner sends a series in
    slice order, so the next files to arrive are the next slices. Each item is let go
    when ``depth`` more have arrived (:meth:`following` then names them), after ``wait``
    seconds without a new one (the end of a series, a pause: everything held goes), or
    when the source ends. That costs up to ``depth`` frame intervals of latency (``wait``
    at most), and the pipeline counts it: :meth:`arrival` gives the time each item really
    arrived, which the pipeline's end-to-end latency starts from. Whether a later item
    really is a neighbouring slice is checked where the input is built
    (:func:`medrt.analysis.slices.adjacent`).

    ``depth`` 1 holds each for the next slice; 0 lets every item through at once until a
    2.5-D model's decode stage asks for more (the watched folders of ``medrt stream`` and
    ``medrt view`` by default, so only a model that needs the next slices costs the
    latency). A model that learnt neighbours some mm away needs more on a thin-slice
    series (three files at 1 mm for 3 mm), which the decode stage learns from the slices
    themselves and asks for with :meth:`want`.
    """

    _END = object()
    #: The most items held back for one (0.25 mm slices for a 3 mm neighbour: 12).
    MAX_DEPTH = 16

    def __init__(self, source: Iterable[Any], wait: float = 0.5, depth: int = 1) -> None:
        if not wait > 0:
            raise ValueError(f'Argument "wait" must be > 0 seconds, got {wait!r}.')
        if not 0 <= depth <= self.MAX_DEPTH:
            raise ValueError(f'Argument "depth" must be 0-{self.MAX_DEPTH}, got {depth!r}.')
        self.source, self.wait = source, float(wait)
        self.depth = int(depth)
        # Bounded: an item dropped at a latest-policy entry is never asked about.
        self._next: OrderedDict[Any, list[Any]] = OrderedDict()
        self._arrived: OrderedDict[Any, float] = OrderedDict()
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:  # the wrapped source's state (e.g. a replay's ``late``)
        source = self.__dict__.get("source")
        if source is None or name.startswith("_"):
            raise AttributeError(name)
        return getattr(source, name)

    def want(self, depth: int) -> None:
        """Hold each item until ``depth`` more have arrived from now on (0 to
        :data:`MAX_DEPTH`; a 2.5-D model's decode stage asks for 1 when it is made, and for
        more once it knows the slice spacing)."""
        self.depth = max(0, min(int(depth), self.MAX_DEPTH))

    def __iter__(self) -> Iterator[Any]:
        q: queue.Queue[Any] = queue.Queue()

        def pump() -> None:
            try:
                for item in self.source:
                    q.put((item, time.perf_counter()))
            except Exception as exc:  # handed to the pipeline, which reports a broken source
                q.put(exc)
            finally:
                q.put(self._END)

        threading.Thread(target=pump, name="medrt-lookahead", daemon=True).start()
        held: deque[Any] = deque()
        while True:
            try:
                got = q.get(timeout=self.wait) if held else q.get()
            except queue.Empty:  # nothing more in time: what is held goes as it is
                while held:
                    yield held.popleft()
                continue
            if isinstance(got, Exception):
                while held:
                    yield held.popleft()  # what arrived before the source broke is still analysed
                raise got
            if got is self._END:
                while held:
                    yield held.popleft()
                return
            item, arrived = got
            with self._lock:
                self._arrived[_ident(item)] = arrived
                for earlier in held:
                    self._next.setdefault(_ident(earlier), []).append(item)
                for kept in (self._arrived, self._next):
                    while len(kept) > _KEEP:
                        kept.popitem(last=False)
            held.append(item)
            while len(held) > self.depth:
                yield held.popleft()

    def following(self, item: Any) -> list[Any]:
        """The items that arrived after ``item`` while it was held, in order, once (empty:
        none came in time)."""
        with self._lock:
            return self._next.pop(_ident(item), [])

    def arrival(self, item: Any) -> float | None:
        """When ``item`` arrived (``time.perf_counter()``), once."""
        with self._lock:
            return self._arrived.pop(_ident(item), None)

    def close(self) -> None:
        close = getattr(self.source, "close", None)
        if callable(close):
            close()
