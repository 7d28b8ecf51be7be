"""The analysis path as pipeline stages: decode → preprocess → roi → segment → postprocess.

Every face builds its pipeline from :func:`analysis_stages` and chooses only its
source, sinks and queue policy, so the viewer, the batch and the listener run
the same code the serial ``Analyzer.analyze`` runs.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from medrt.analysis.slices import (
    MAX_REACH,
    adjacent,
    along_normal,
    head_first,
    nearest_at,
    nearest_sides,
    series_neighbours,
)
from medrt.analyzer import Analyzer, AnalyzerConfig
from medrt.io.dicom import read_frames
from medrt.io.header import finite_int
from medrt.io.stacks import LivePasses
from medrt.pipeline.graph import Stage
from medrt.pipeline.shm import Packed, ParentSlots, WorkerSlots
from medrt.pipeline.workers import WorkerPool
from medrt.types import Frame, FrameResult

log = logging.getLogger(__name__)

#: A live source's slices kept per series to find the next ones' neighbours among (a model
#: without ``neighbour_mm``; one with keeps :data:`~medrt.analysis.slices.MAX_REACH`): a
#: sender that does not send a series in slice order still finds them a few files apart.
#: Also the series (and the slices received last) a live source's depth is reckoned from.
LIVE_KEEP = 8

__all__ = ["Decoded", "STAGE_NAMES", "decode", "analysis_stages", "ProcessDecoder", "ProcessAnalysis", "SliceContext"]

STAGE_NAMES = ("decode", "preprocess", "roi", "segment", "postprocess")


@dataclass(frozen=True, slots=True, eq=False)
class Decoded:
    """One decoded frame and its share of the time it took to decode its file; with
    the slices beside it in its series when a 2.5-D model needs them
    (:mod:`medrt.analysis.slices`; None where unknown)."""

    frame: Frame
    decode_ms: float
    neighbours: tuple[Frame | None, Frame | None] | None = None

    @property
    def key(self) -> str:
        return self.frame.key


def decode(item: Any) -> list[Decoded]:
    """A path (or bytes, or an already decoded Frame) → one :class:`Decoded` per frame.
    Bad input raises an :class:`~medrt.errors.InputError` that names the file.

    A multi-frame object's frames come in slice order, head first, where each has a place
    of its own (:func:`medrt.analysis.slices.head_first`), whatever order the file stores
    them in; each keeps its own ``frame_index``. A stream links each frame's lesions to
    the frame before it (:class:`medrt.analysis.tracking.LesionCounter`), so an enhanced
    CT stored out of position order counted a lesion once per slice it crosses."""
    if isinstance(item, Frame):
        return [Decoded(item, 0.0)]
    t0 = time.perf_counter()
    frames = read_frames(item if not isinstance(item, (str, os.PathLike)) else Path(item))
    ms = (time.perf_counter() - t0) * 1000.0 / max(1, len(frames))
    if len(frames) > 1:  # a multi-frame object: its frames are each other's neighbours
        order = head_first(frames)
        if order is not None:
            frames = [frames[i] for i in order]
        return [Decoded(f, ms, nb) for f, nb in zip(frames, series_neighbours(frames), strict=True)]
    return [Decoded(f, ms) for f in frames]


def _slice(out: list[Decoded]) -> Frame | None:
    """The frame when a file decoded to one slice with a position in the patient (what can
    stand beside another slice), else None (a multi-frame object, a radiograph)."""
    return out[0].frame if len(out) == 1 and out[0].frame.geometry is not None else None


class SliceContext:
    """A decode stage that hands each single-frame file its neighbouring slices, for a
    2.5-D segmentation model (``[model] slices = 3``).

    With ``order``, the source's list of files, series by series in slice order (the
    batch plan, a replayed folder; a None in it ends a stack, whose files are never a
    neighbour of those after it: the passes of a series of several acquisitions,
    :mod:`medrt.io.stacks`): for the file at position i the files at i - 1 and
    i + 1 are decoded too, or taken from a small cache of the last few decoded, so a
    replay in order decodes each file once. Without it (a watched folder, a queue: the
    next slice has not arrived yet) each frame gets one decoded before it, which
    is its neighbour when the scanner sends a series in order, and with ``ahead``
    (a :class:`medrt.io.sources.Lookahead` source: :meth:`~medrt.io.sources.Lookahead.following`
    names the files that arrived after it) one of those too, decoded once and kept for
    their own turn. Whether a frame really
    is a neighbour (same series, one slice step away) is checked by
    :func:`medrt.analysis.slices.adjacent` when the input is built, and the stack is
    put head to feet by position, so a frame from another series or out of order only
    costs the context. Images without a position in the patient (radiographs) get no
    neighbours and cost nothing extra; a neighbour that cannot be decoded is just
    missing (its own error is reported when its turn comes). Only single slices are
    kept in the cache, so a 4096² radiograph in the same folder is not held.

    ``target_mm`` (the model's ``[model] neighbour_mm``): with ``order``, each side's
    neighbour is the slice nearest that distance (:func:`medrt.analysis.slices.nearest_at`:
    on a 1 mm series for a 3 mm model, the files at i ± 3), the slices up to it decoded
    or taken from the cache; a multi-frame object's frames likewise. A live source takes
    the slice nearest that distance among those received before (the last
    :data:`~medrt.analysis.slices.MAX_REACH` are kept) and, with ``ahead``, among those
    held after it; from the spacing of the slices it sees it asks ``ahead`` to hold as
    many as that needs (:meth:`~medrt.io.sources.Lookahead.want`: three files on a 1 mm
    series for a 3 mm model, one on 3 mm slices), which costs that many frame intervals
    of latency on a thin-slice series only.

    A live slice's neighbours are of its own series and its own pass: the slices kept are
    kept per series (a series arriving interleaved with others does not push its own out),
    and of a series of several whole acquisitions arriving (a post-contrast pass after the
    pre-contrast one, or interleaved with it) only those of its own acquisition are looked
    at once the passes are known apart by :class:`medrt.io.stacks.LivePasses` (the strict
    rule of :mod:`medrt.io.stacks` as far as it can be told live: another AcquisitionNumber
    at a position already held). Where passes arrive interleaved, each counts as a series
    arriving for the depth asked of ``ahead``.
    """

    def __init__(self, decoder: Callable[[Any], list[Decoded]], order: Sequence[Any] | None = None,
                 keep: int = 6, ahead: Any | None = None,
                 target_mm: float | None = None) -> None:
        self.decoder = decoder
        self.ahead = ahead
        self.target_mm = target_mm
        if ahead is not None and getattr(ahead, "depth", 1) < 1 and callable(getattr(ahead, "want", None)):
            ahead.want(1)  # a source that lets files through at once: hold each for the next slice
        if target_mm is not None:  # the slices out to the one target_mm away, on both sides
            keep = max(keep, 2 * MAX_REACH + 1)
        self.order = [None if p is None else os.fspath(p) for p in order] if order is not None else None
        self.index: dict[str, int] = {}
        for i, p in enumerate(self.order or ()):
            if p is not None:
                self.index.setdefault(p, i)
        self.keep = max(3, keep)
        self._cache: OrderedDict[str, list[Decoded]] = OrderedDict()
        # live: each series' slices decoded last, newest first, among which each one's
        # neighbours are looked for (in whatever order they came); the last LIVE_KEEP series
        self._recent: OrderedDict[str, deque[Frame]] = OrderedDict()
        self._recent_keep = MAX_REACH if target_mm is not None else LIVE_KEEP
        # the passes (series, acquisition or None) of the slices received last, newest first
        self._arrivals: deque[tuple[str, int | None]] = deque(maxlen=LIVE_KEEP)
        self._passes = LivePasses()
        self._needs: OrderedDict[str, int] = OrderedDict()  # series -> files its neighbours need held
        # files that decoded to something else (radiographs), the last few hundred: a
        # watched folder runs for days
        self._not_slices: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close the wrapped decoder (a process pool) and let go of the cached frames."""
        close = getattr(self.decoder, "close", None)
        if callable(close):
            close()
        with self._lock:
            self._cache.clear()
            self._recent.clear()

    def __getattr__(self, name: str) -> Any:  # the wrapped decoder's state (e.g. a pool's ``running``)
        decoder = self.__dict__.get("decoder")
        if decoder is None or name.startswith("_"):
            raise AttributeError(name)
        return getattr(decoder, name)

    def _decoded(self, path: str) -> list[Decoded]:
        with self._lock:
            hit = self._cache.get(path)
            if hit is not None:
                self._cache.move_to_end(path)
                return hit
        out = self.decoder(path)
        with self._lock:
            if _slice(out) is not None:  # only a slice can be a neighbour
                self._cache[path] = out
                while len(self._cache) > self.keep:
                    self._cache.popitem(last=False)
            else:
                self._not_slices[path] = None
                while len(self._not_slices) > 256:
                    self._not_slices.popitem(last=False)
        return out

    def _neighbour(self, i: int) -> Frame | None:
        if self.order is None or not 0 <= i < len(self.order):
            return None
        path = self.order[i]
        if path is None or path in self._not_slices:  # the end of a stack, or no slice
            return None
        try:
            out = self._decoded(path)
        except Exception:  # reported when that file's own turn comes
            return None
        return _slice(out)

    def __call__(self, item: Any) -> list[Decoded]:
        if self.order is None:
            return self._live(item)
        if not isinstance(item, (str, os.PathLike)) or os.fspath(item) not in self.index:
            return self._multi(self.decoder(item))
        path = os.fspath(item)
        out = self._decoded(path)
        here = _slice(out)
        if here is None:
            return self._multi(out)
        i = self.index[path]
        before = nearest_at(here, (self._neighbour(j) for j in range(i - 1, i - 1 - MAX_REACH, -1)), self.target_mm)
        after = nearest_at(here, (self._neighbour(j) for j in range(i + 1, i + 1 + MAX_REACH)), self.target_mm)
        return [replace(out[0], neighbours=(before, after))]

    def _live(self, item: Any) -> list[Decoded]:
        """A live source's file: on each side the slice nearest ``target_mm`` away among
        those decoded lately and (with ``ahead``) those that arrived after it, whatever
        order they came in (:func:`~medrt.analysis.slices.nearest_sides`)."""
        path = os.fspath(item) if isinstance(item, (str, os.PathLike)) else None
        ahead = self.ahead is not None and path is not None
        later = self.ahead.following(item) if ahead else []  # type: ignore[union-attr]
        out = self._decoded(path) if ahead else self.decoder(item)  # type: ignore[arg-type]
        here = _slice(out)
        if here is None:
            return self._multi(out)
        pool = [f for f in (self._live_slice(p) for p in later) if f is not None]
        series = here.series_instance_uid
        with self._lock:
            for f in (here, *pool):  # those ahead too: a next pass's first slice may be among them
                self._passes.add(f.series_instance_uid, _acquisition(f), along_normal(f))
            mine = self._recent.pop(series, None) or deque(maxlen=self._recent_keep)
            pool += mine
            mine.appendleft(here)
            self._recent[series] = mine
            while len(self._recent) > LIVE_KEEP:
                self._recent.popitem(last=False)
            acquisition = _acquisition(here)
            pool = [f for f in pool if not self._passes.apart(series, acquisition, _acquisition(f))]
            self._arrivals.appendleft(
                (series, acquisition if self._passes.of_its_own(series, acquisition) else None))
        if ahead:
            self._ask_depth(here, pool)
        return [replace(out[0], neighbours=nearest_sides(here, pool, self.target_mm))]

    def _live_slice(self, item: Any) -> Frame | None:
        """A file that arrived after this one, as a slice (decoded once, kept for its own
        turn); None when it is no slice or cannot be decoded (reported at its turn)."""
        if not isinstance(item, (str, os.PathLike)) or os.fspath(item) in self._not_slices:
            return None
        try:
            return _slice(self._decoded(os.fspath(item)))
        except Exception:
            return None

    def _ask_depth(self, here: Frame, pool: list[Frame]) -> None:
        """Ask the live source to hold as many files as the neighbours need: for each series
        received lately, the slices out to ``target_mm`` at its spacing (the least gap to
        one of its slices among ``pool``, those of its own pass; one without ``target_mm``),
        times the number of series (and passes of one series) arriving interleaved (a
        scanner sending two reconstructions at once), the most any of them needs; kept until
        a slice says its series' spacing."""
        gaps = [abs(along_normal(f) - along_normal(here)) for f in pool if adjacent(here, f)]  # type: ignore[operator]
        with self._lock:
            if gaps:
                per = math.ceil(self.target_mm / min(gaps) - 1e-6) if self.target_mm is not None else 1
                self._needs[here.series_instance_uid] = max(1, min(per, MAX_REACH))
                self._needs.move_to_end(here.series_instance_uid)
                while len(self._needs) > LIVE_KEEP:
                    self._needs.popitem(last=False)
            active = set(self._arrivals)
            active -= {(u, None) for u, a in active if a is not None}  # (slices before its passes were told apart)
            needs = [self._needs[u] for u, _ in active if u in self._needs]
        if not needs:
            return
        depth = min(max(needs) * len(active), MAX_REACH)
        if depth != getattr(self.ahead, "depth", depth):
            log.info("live slices: holding %d file(s) for the neighbours (%d series arriving together)",
                     depth, len(active))
        want = getattr(self.ahead, "want", None)
        if callable(want):
            want(depth)

    def _multi(self, out: list[Decoded]) -> list[Decoded]:
        """A multi-frame object's frames with their neighbours ``target_mm`` away (decode
        gave each the next frame)."""
        if self.target_mm is None or len(out) < 2:
            return out
        frames = [d.frame for d in out]
        return [replace(d, neighbours=nb) for d, nb in zip(out, series_neighbours(frames, self.target_mm), strict=True)]


def _acquisition(frame: Frame) -> int | None:
    """The frame's AcquisitionNumber (None where its header has none)."""
    dataset = getattr(frame.source, "dataset", None)
    return finite_int(dataset.get("AcquisitionNumber")) if dataset is not None else None


def _decode_path(path: str) -> list[Decoded]:
    """In a decode process: the file's frames, pixels read-only again in the parent."""
    return decode(Path(path))


class ProcessDecoder(WorkerPool):
    """Decode files in worker processes instead of on a pipeline thread.

    Some decoders hold Python's GIL for the whole image (pylibjpeg's JPEG and RLE
    codecs, :func:`medrt.io.codecs.decode_holds_gil`), which stalls every other
    stage and a viewer's event loop; a process does not. A decoder that crashes its
    process (a native panic on a damaged file) costs that file only: it is
    reported as corrupt pixel data and the pool is replaced. Bytes, Datasets and
    Frames are decoded in the calling thread. Worth it for large frames; on 512²
    CT slices the transfer back costs what it saves (75 vs 81 fps, measured on
    2026-11-29 with pyjpegls and the former process pool).
    Processes start by forkserver, so a script using it needs the usual
    ``if __name__ == "__main__":`` guard (the ``medrt`` command has it).
    """

    crash_reason = "the decoder crashed on this file"

    def __init__(self, processes: int = 1) -> None:
        super().__init__(processes)

    def __call__(self, item: Any) -> list[Decoded]:
        if not isinstance(item, (str, os.PathLike)):
            return decode(item)
        out: list[Decoded] = self.call(_decode_path, os.fspath(item), item)
        for d in out:
            d.frame.pixels.flags.writeable = False
        return out


# In a ProcessAnalysis worker: its analyzer and settings (set once by _start_worker).
_WORKER: dict[str, Any] = {}


def _start_worker(config: AnalyzerConfig, mode: str | None, recheck: bool | None,
                  order: Sequence[str | None] | None = None) -> None:
    from medrt.analyzer import load_analyzer

    # One core per process (ProcessAnalysis): the band pool of large frames (medrt.bands)
    # follows, or every process would start a pool as wide as the machine.
    os.environ.setdefault("MEDRT_BAND_THREADS", str(config.threads or 1))
    analyzer = load_analyzer(config)
    decoder: Callable[[Any], list[Decoded]] = decode
    if order and analyzer.slices > 1:
        decoder = SliceContext(decode, order, target_mm=analyzer.neighbour_mm)
    _WORKER.update(analyzer=analyzer, mode=mode, recheck=recheck, slots=WorkerSlots(), decoder=decoder)


def _analyze_item(item: Any) -> Packed | list[FrameResult]:
    """In a worker process: decode ``item`` and analyse each of its frames; the
    results' arrays travel back in this worker's shared-memory slots when one is free."""
    analyzer: Analyzer = _WORKER["analyzer"]
    results = [analyzer.analyze(d.frame, decode_ms=d.decode_ms, mode=_WORKER["mode"],
                                recheck_small=_WORKER["recheck"], neighbours=d.neighbours)
               for d in _WORKER["decoder"](item)]
    return _WORKER["slots"].pack(results)


class ProcessAnalysis(WorkerPool):
    """Decode and analyse whole files in worker processes, each with its own models.

    Python threads share one interpreter lock, and on a CPU backend with small
    frames the per-frame Python work (decoding headers, labelling, measuring) keeps
    a threaded pipeline below two busy cores however many there are (about 1.7 on
    the JPEG-LS CT stream here). Worker processes each run decode → analyse on their own core;
    each pipeline thread that calls this waits for its file's results, so a stage of
    two threads per process keeps every process busy while the source, the in-order
    delivery and the sinks stay in the calling process. Meant for CPU backends: a
    GPU backend would load its weights once per process. Measured on the 2-core CI
    machine, 512² JPEG-LS CT stream (``medrt bench --only pipelined``): 115.0 fps
    against 107.7 for the threads layout and 70.1 for the serial loop. Results'
    arrays come back through shared memory (:mod:`medrt.pipeline.shm`).

    Models load in every process when the pool starts (:meth:`start`, called by
    :func:`analysis_stages`), so the first frames are no cold start. A file that
    crashes its process costs that file only (reported as corrupt pixel data) and
    the pool is replaced. Processes start by forkserver, so a script using this
    needs the usual ``if __name__ == "__main__":`` guard (the ``medrt`` command has it).
    """

    crash_reason = "the analysis process crashed on this file"

    def __init__(self, config: AnalyzerConfig, processes: int, *, mode: str | None = None,
                 recheck: bool | None = None, order: Sequence[Any] | None = None) -> None:
        self.config = replace(config, threads=config.threads or 1)  # one core per process
        paths = [None if p is None else os.fspath(p) for p in order] if order else None
        super().__init__(processes, _start_worker, (self.config, mode, recheck, paths))
        self._slots = ParentSlots()

    def close(self) -> None:
        super().close()
        self._slots.close()  # the workers have exited: unlink their result slots

    def __call__(self, item: Any) -> list[FrameResult]:
        arg = os.fspath(item) if isinstance(item, os.PathLike) else item
        out = self._slots.unpack(self.call(_analyze_item, arg, item))
        for r in out:
            r.frame.pixels.flags.writeable = False
            r.labels.flags.writeable = False
        return out


def analysis_stages(
    analyzer: Analyzer,
    *,
    mode: str | None = None,
    recheck: bool | None = None,
    decode_workers: int = 1,
    infer_workers: int = 1,
    decode_processes: int = 0,
    decoder: Callable[[Any], list[Decoded]] | None = None,
    processes: int = 0,
    order: Sequence[Any] | None = None,
    slice_context: bool = True,
    ahead: Any | None = None,
) -> list[Stage]:
    """The five stages around one loaded analyzer. ``infer_workers`` > 1 runs several
    frames through the ROI classifier and the UNet at once (useful when each
    backend session uses fewer threads than there are cores). ``decode_processes``
    > 0 decodes files in that many worker processes (:class:`ProcessDecoder`).

    ``processes`` > 0 replaces them with one ``analyze`` stage: whole files decoded
    and analysed in that many worker processes with the analyzer's settings
    (:class:`ProcessAnalysis`); each FrameResult still carries its per-step timings.

    ``order``: the files the source will send, in slice order (a None between two
    stacks whose files are not each other's neighbours). A 2.5-D segmentation
    model then gets each file's neighbouring slices (:class:`SliceContext`); without
    it (a queue, a watched folder) each frame gets one decoded before it, when
    that is its neighbour, and with ``ahead`` (a live source wrapped in
    :class:`medrt.io.sources.Lookahead`) one after it too. (With worker processes
    each process decodes the neighbours it needs, so a file may be decoded in both;
    without ``order`` they get none, as a process sees only every other file.) ``slice_context=False``: the
    ``decoder`` hands out the neighbours itself (the viewer announces each frame as
    its turn comes, so it wraps :class:`SliceContext` inside its own decoder)."""
    two_and_half = analyzer.slices > 1
    if processes > 0 and two_and_half and order is None:
        log.warning("worker processes on a live source: each process sees only some of the files, so the 2.5-D "
                    "model(s) get no neighbouring slices (less accurate; without --processes the slice before "
                    "each one is used)")
    if processes > 0:
        pool = ProcessAnalysis(analyzer.config, processes, mode=mode, recheck=recheck,
                               order=order if two_and_half else None)
        pool.start()
        # One caller per pipe (two per process): one file waits while the other is
        # analysed, so a process never waits on this side to hand it the next one.
        return [Stage("analyze", pool, workers=pool.processes * pool.channels, fan_out=True)]
    if decoder is None:
        decoder = ProcessDecoder(decode_processes) if decode_processes > 0 else decode
        decode_workers = max(decode_workers, decode_processes)
    if two_and_half and slice_context:
        decoder = SliceContext(decoder, order, ahead=ahead, target_mm=analyzer.neighbour_mm)

    def preprocess(d: Decoded) -> Any:
        return analyzer.prepare(d.frame, decode_ms=d.decode_ms, mode=mode, recheck_small=recheck,
                                neighbours=d.neighbours)

    return [
        Stage("decode", decoder, workers=decode_workers, fan_out=True),
        Stage("preprocess", preprocess, workers=decode_workers),
        Stage("roi", analyzer.propose, workers=infer_workers),
        Stage("segment", analyzer.segment, workers=infer_workers),
        Stage("postprocess", analyzer.finish, workers=1),
    ]
