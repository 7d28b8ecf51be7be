"""From the pipeline's threads to the GUI thread: sessions, a Qt sink, and a background decoder.

Inference never runs on the GUI thread. A :class:`Session` wires a source
(replay, folder watch, or the files of an opened folder) through the same
stages every face uses (:func:`medrt.pipeline.stages.analysis_stages`) plus a
``display`` stage that draws the overlay RGBA off the GUI thread, into a
:class:`QtSink`. The sink runs on the pipeline's sink thread and only emits
signals of a :class:`Bridge` that lives in the GUI thread; the window connects
to them with queued connections, so every slot runs in the event loop.

Live sessions put the ``latest`` policy on the entry edge (never fall behind
the scanner); a frame is announced as soon as it is decoded (it appears at
once) and its overlay when inference on it has finished.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medrt_gui.imaging import DisplayIndex, Layer
from medrt_gui.study import describe_error
from PySide6.QtCore import QObject, Signal

from medrt.overlay import overlay_rgba
from medrt.types import Frame, FrameResult

__all__ = ["Arrival", "Ready", "Failure", "DecodedFile", "Bridge", "QtSink", "Session",
           "AnalyzerProvider", "Decoder", "LiveStats", "describe_error"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, eq=False)
class Arrival:
    """A frame the pipeline has just decoded (live sessions)."""

    session: int
    frame: Frame
    index: DisplayIndex
    path: Path | None


@dataclass(frozen=True, slots=True, eq=False)
class Ready:
    """A finished frame with its overlay drawn; ``latency_ms`` from arrival to the sink."""

    session: int
    result: FrameResult
    overlay: Layer | None
    index: DisplayIndex | None
    latency_ms: float


@dataclass(frozen=True, slots=True)
class Failure:
    """An input the pipeline could not use: its name, the reason, and whether it is just not an image."""

    session: int
    key: str
    name: str
    reason: str
    skippable: bool


@dataclass(frozen=True, slots=True, eq=False)
class DecodedFile:
    path: Path
    frames: tuple[tuple[Frame, DisplayIndex], ...] = ()
    reason: str | None = None


class Bridge(QObject):
    """Signals emitted from worker threads; it lives in (and its receivers run on) the GUI thread."""

    frameArrived = Signal(object)  # Arrival
    resultReady = Signal(object)  # Ready
    failed = Signal(object)  # Failure
    sessionEnded = Signal(int)
    sessionStarted = Signal(int, str)  # id, backend
    decoded = Signal(object)  # DecodedFile


@dataclass(frozen=True, slots=True, eq=False)
class _Displayable:
    """What the display stage hands the sink: the result and its overlay, both ready to upload."""

    result: FrameResult
    overlay: Layer | None
    index: DisplayIndex | None

    @property
    def key(self) -> str:
        return self.result.frame.key

    @property
    def timings(self) -> Any:  # the telemetry reads the analysis' own per-step timings
        return self.result.timings


class QtSink:
    """A pipeline sink that only emits signals: O(1) on the sink thread, never waits on the GUI."""

    def __init__(self, bridge: Bridge, session: int) -> None:
        self.bridge, self.session = bridge, session

    def on_result(self, payload: _Displayable, envelope: Any) -> None:
        latency = (time.perf_counter() - envelope.t_arrival) * 1000.0
        self.bridge.resultReady.emit(Ready(self.session, payload.result, payload.overlay, payload.index, latency))

    def on_error(self, error: Any, envelope: Any) -> None:
        origin = getattr(envelope, "origin", "") or error.key
        self.bridge.failed.emit(Failure(self.session, error.key, str(origin), describe_error(error.error),
                                        bool(error.skippable)))

    def close(self) -> None:
        self.bridge.sessionEnded.emit(self.session)


class AnalyzerProvider:
    """Loads the analyzer once (off the GUI thread) and hands it to every session."""

    _shared: dict[str, Any] = {}
    _shared_lock = threading.Lock()

    def __init__(self, config: Any = None) -> None:
        from medrt.analyzer import AnalyzerConfig

        self.config = config or AnalyzerConfig(threads=1)

    def get(self) -> Any:
        """The loaded analyzer (blocks the calling worker thread while it loads)."""
        from medrt.analyzer import load_analyzer

        key = repr(self.config)
        with self._shared_lock:
            analyzer = self._shared.get(key)
            if analyzer is None:
                analyzer = self._shared[key] = load_analyzer(self.config)
        return analyzer

    def preload(self) -> None:
        threading.Thread(target=self._quiet_get, name="viewer-load-models", daemon=True).start()

    def _quiet_get(self) -> None:
        try:
            self.get()
        except Exception as exc:  # reported again when a session asks for it
            log.warning("could not load the analyzer: %s", exc)


@dataclass(frozen=True, slots=True)
class LiveStats:
    kind: str
    label: str
    running: bool
    fps: float
    latency_ms: float | None
    p50_ms: float
    p99_ms: float
    drops: int
    frames: int
    backend: str


class Session:
    """One pipeline run for the viewer. ``kind`` is ``replay`` or ``watch`` (live: ``latest`` at
    the entry, frames announced on decode) or ``analysis`` (an opened folder: ``block``)."""

    def __init__(self, sid: int, kind: str, source: Iterable[Any], provider: AnalyzerProvider, bridge: Bridge,
                 *, label: str = "", workers: int = 2, policy: str | None = None) -> None:
        self.sid, self.kind, self.source, self.label = sid, kind, source, label
        self.provider, self.bridge, self.workers = provider, bridge, workers
        self.live = kind in ("replay", "watch")
        self.policy = policy or ("latest" if self.live else "block")
        self.pipe: Any = None
        self.backend = ""
        self.last_latency_ms: float | None = None
        self._lock = threading.Lock()
        self._stopping = False
        self._ended = threading.Event()
        self._decoder: Any = None  # a SliceContext for a 2.5-D model (set in _run)
        self._thread = threading.Thread(target=self._run, name=f"viewer-session-{sid}", daemon=True)

    def start(self) -> Session:
        self._thread.start()
        return self

    def _run(self) -> None:
        from medrt.pipeline.admission import live_in_flight
        from medrt.pipeline.graph import Pipeline, Stage
        from medrt.pipeline.stages import analysis_stages

        try:
            analyzer = self.provider.get()
        except Exception as exc:
            log.error("session %d: models could not load: %s", self.sid, exc)
            self.bridge.failed.emit(Failure(self.sid, "<models>", "models", describe_error(exc), False))
            self._end()
            return
        self.backend = f"{analyzer.backend_name} {analyzer.precision}"
        if analyzer.slices > 1:  # a 2.5-D model: each slice with its neighbours
            from medrt.io.sources import FileReplay, Lookahead
            from medrt.pipeline.stages import SliceContext, decode

            # an opened or replayed folder: its files in slice order, each pass of a series of
            # several acquisitions ended (a replay's headers read here, off the GUI thread)
            order = self.source.slice_order() if isinstance(self.source, FileReplay) else None
            self._decoder = SliceContext(decode, order,
                                         ahead=self.source if isinstance(self.source, Lookahead) else None,  # a watch
                                         target_mm=analyzer.neighbour_mm)
        stages = analysis_stages(analyzer, infer_workers=self.workers, decoder=self._decode, slice_context=False)
        stages.append(Stage("display", self._display, workers=1))
        pipe = Pipeline(self.source, stages, [QtSink(self.bridge, self.sid)],
                        policy={stages[0].name: self.policy}, telemetry=True, name=f"viewer-{self.kind}",
                        max_in_flight=live_in_flight(self.policy, stages))  # a slow CPU drops, not queues
        with self._lock:
            if self._stopping:
                self._end()
                return
            self.pipe = pipe
            pipe.start()
        self.bridge.sessionStarted.emit(self.sid, self.backend)

    def _end(self) -> None:
        self._ended.set()
        self.bridge.sessionEnded.emit(self.sid)

    def _decode(self, item: Any) -> list[Any]:
        """The pipeline's decode stage, announcing each frame of a live stream as it is
        decoded (a neighbouring slice read ahead for a 2.5-D model is announced only when
        its own turn comes)."""
        from medrt.pipeline.stages import decode

        out = (self._decoder or decode)(item)
        if self.live:
            path = Path(item) if isinstance(item, (str, Path)) else None
            for d in out:
                self.bridge.frameArrived.emit(Arrival(self.sid, d.frame, DisplayIndex.from_frame(d.frame), path))
        return out

    def _display(self, result: FrameResult) -> _Displayable:
        """The overlay RGBA (and, for an opened folder, the display index) off the GUI thread."""
        index = None if self.live else DisplayIndex.from_frame(result.frame)
        return _Displayable(result, Layer.from_rgba(overlay_rgba(result)), index)

    def stop(self, wait: float = 0.0) -> None:
        """End the session: the source stops, in-flight frames are abandoned. Returns at once
        unless ``wait`` > 0 (then waits that long for the threads)."""
        with self._lock:
            self._stopping = True
            pipe = self.pipe
        close = getattr(self.source, "close", None)
        if callable(close):
            close()
        if pipe is not None:
            t = threading.Thread(target=pipe.abort, args=(5.0,), name=f"viewer-stop-{self.sid}", daemon=True)
            t.start()
            if wait > 0:
                t.join(wait)

    @property
    def done(self) -> bool:
        return self._ended.is_set() or (self.pipe is not None and self.pipe.done)

    def stats(self) -> LiveStats:
        pipe = self.pipe
        if pipe is None or pipe.telemetry is None:
            nan = float("nan")
            return LiveStats(self.kind, self.label, not self.done, nan, None, nan, nan, 0, 0, self.backend)
        tel = pipe.telemetry
        e2e = tel.latency("e2e")
        drops = sum(c["drops"] + c["rejects"] for c in pipe.counters().values())
        return LiveStats(self.kind, self.label, not pipe.done, tel.recent_fps(), self.last_latency_ms,
                         e2e["p50"], e2e["p99"], drops, tel.frames, self.backend)


class Decoder:
    """Decodes files for browsing on one background thread; results come back as ``decoded``.

    Only files still wanted when their turn comes are decoded, so scrolling fast
    through a long series does not queue up work for slices already passed.

    Files of ``process_bytes`` or more whose codec holds Python's interpreter lock
    for the whole image (:func:`medrt.io.codecs.decode_holds_gil`: pylibjpeg's JPEG
    and RLE) are decoded in a worker process
    (:class:`medrt.pipeline.stages.ProcessDecoder`); on the thread they froze the
    event loop (a 4096² RLE radiograph: 55-120 ms; JPEG-LS and JPEG 2000 did for
    300-700 ms until they moved to imagecodecs). From a process the GUI thread
    waits only for the frame's unpickling (22-48 ms measured), which is more than
    a lock-free decode on the thread costs it (JPEG-LS 13 ms, JPEG 2000 16-24 ms,
    uncompressed 1 ms), so those and small files stay on the thread. 0 turns
    processes off.
    """

    def __init__(self, bridge: Bridge, process_bytes: int = 4 << 20) -> None:
        from medrt.pipeline.stages import ProcessDecoder

        self.bridge = bridge
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="viewer-decode")
        self._lock = threading.Lock()
        self._pending: set[Path] = set()
        self._wanted: set[Path] = set()
        self._closed = False
        self.process_bytes = process_bytes
        self._process = ProcessDecoder(1) if process_bytes > 0 else None

    def in_process(self, path: Path) -> bool:
        """Whether ``path`` is decoded in the worker process (see the class docstring)."""
        from pydicom.filereader import read_file_meta_info

        from medrt.io.codecs import decode_holds_gil

        if self._process is None:
            return False
        try:
            if path.stat().st_size < self.process_bytes:
                return False
            return decode_holds_gil(read_file_meta_info(path).TransferSyntaxUID)
        except Exception:  # noqa: BLE001 - read_frames names the file and the reason
            return False

    def _read(self, path: Path) -> list[Any]:
        if self.in_process(path):
            return [d.frame for d in self._process(path)]  # type: ignore[misc]
        from medrt.io.dicom import read_frames

        return read_frames(path)

    def want(self, paths: Iterable[Path]) -> None:
        """Decode these files (the current image and its neighbours), forget the rest.

        After :meth:`shutdown` this does nothing: a render queued before the window
        closed may still ask."""
        paths = [p for p in paths if p is not None]
        with self._lock:
            if self._closed:
                return
            self._wanted = set(paths)
            todo = [p for p in paths if p not in self._pending]
            self._pending.update(todo)
        for p in todo:
            self._pool.submit(self._decode, p)

    def _decode(self, path: Path) -> None:
        with self._lock:
            wanted = path in self._wanted
            if not wanted:
                self._pending.discard(path)
                return
        try:
            frames = tuple((f, DisplayIndex.from_frame(f)) for f in self._read(path))
            out = DecodedFile(path, frames)
        except Exception as exc:  # InputError for bad files; anything else is reported the same way
            out = DecodedFile(path, (), describe_error(exc))
        with self._lock:
            self._pending.discard(path)
        self.bridge.decoded.emit(out)

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            self._wanted.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._process is not None:
            self._process.close()
