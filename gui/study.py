"""What the viewer holds: series of image slots, each with its frame, AI result and SEG mask.

No Qt here. A :class:`Study` comes either from files (grouped by series and
ordered by slice with :func:`medrt.io.series.group_series`; pixels are decoded
later, on demand) or from a live stream, where frames are placed in slice order
as the pipeline decodes them, whatever order they were sent in
(:meth:`SeriesEntry.place`). Everything is keyed by the frame key
(``SOPInstanceUID[#frame]``), the name results and SEGs use too.
"""

from __future__ import annotations

import bisect
import logging
import os
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from medrt_gui.imaging import DisplayIndex, IndexedValues, Layer
from medrt_gui.patient import PatientInfo, patients_text

from medrt.errors import InputError
from medrt.io.dicom import read_dataset
from medrt.io.header import finite_int
from medrt.io.scan import iter_files
from medrt.io.seg import SEG_SOP_CLASSES, SegMasks
from medrt.io.series import (
    ORIENTATION_ATOL,
    SeriesItem,
    frames_head_first,
    group_series,
    points_away,
    slice_order,
)
from medrt.privacy import describe_exception
from medrt.types import Frame, FrameResult

if TYPE_CHECKING:  # pragma: no cover - typing only
    from medrt.analysis.tracking import Linked

__all__ = ["Slot", "decode_window", "SeriesEntry", "Problem", "Study", "SEG_SOP_CLASSES", "describe_error"]

log = logging.getLogger(__name__)



def describe_error(exc: BaseException) -> str:
    """A reason for people: for medrt's input errors what is wrong (the file is named apart)."""
    if isinstance(exc, InputError):
        return exc.why
    return describe_exception(exc)


def decode_window(slot_i: int) -> range:
    """The images decoded with image ``slot_i`` of a series, it among them: one before it and
    two after (scrolling either way finds them ready); the image cache never lets them go."""
    return range(max(0, slot_i - 1), slot_i + 3)


def frame_key(sop_instance_uid: str, frames: int, index: int) -> str:
    """The key :attr:`medrt.types.Frame.key` gives frame ``index`` of an object of ``frames`` frames."""
    return f"{sop_instance_uid}#{index}" if frames > 1 else sop_instance_uid


@dataclass(eq=False)
class Slot:
    """One image position in a series. ``frame``/``index`` arrive when decoded, ``result`` and
    ``overlay`` (RGBA from :func:`medrt.overlay.overlay_rgba`) when the analysis finishes.

    A slot holds each image once. Where the index holds every pixel value exactly (integer
    images: CT in HU, radiographs, most of DICOM) the float pixels are let go and
    :attr:`values` reads them from the index; the result keeps its frame's header only, and
    no label map when it found nothing. The colour planes are not kept (the viewer shows
    the luminance). About 2 MB per 512² slice become 0.5: a 1,200-slice CT fits in a third
    of the memory.
    """

    key: str
    path: Path | None = None
    frame: Frame | None = None
    index: DisplayIndex | None = None
    result: FrameResult | None = None
    overlay: Layer | None = None
    latency_ms: float | None = None
    seg_labels: np.ndarray | None = None  # uint16 label map from a DICOM SEG
    seg: SegMasks | None = None  # the SEG it came from (segment labels and colours)
    seg_present: tuple[int, ...] = ()  # the segment numbers on this image
    seg_overlay: Layer | None = None
    error: str | None = None
    version: int = 0  # bumped whenever something shown changes
    arrival: int = 0  # live: the study's arrival count when this image last came (0: never)
    # live: (position along the slice normal, InstanceNumber, first arrival) that place it
    place: tuple[float | None, int | None, int] = (None, None, 0)
    _packed: tuple[bytes, tuple[int, ...], np.dtype] | None = field(default=None, repr=False)

    @property
    def header(self) -> Frame | None:
        """The frame whose header describes this image: the decoded one, else the one its
        result kept (an image released from the cache)."""
        return self.frame or (self.result.frame if self.result is not None else None)

    def set_frame(self, frame: Frame, index: DisplayIndex | None) -> None:
        self.frame, self.error = frame, None
        self.set_index(index)
        self.seg_overlay = None
        self.version += 1

    def set_index(self, index: DisplayIndex | None) -> None:
        """The frame's display index; an exact one lets the float pixels go (see the class)."""
        self.index = index
        frame = self.frame
        if frame is None or index is None or index.index.shape != frame.shape:
            return
        if index.exact and not frame.bare:
            self.frame = frame.without_pixels()
        elif frame.color is not None:
            self.frame = replace(frame, color=None)

    @property
    def values(self) -> np.ndarray | IndexedValues | None:
        """The image's pixel values (modality units), read like a 2-D array: the frame's
        pixels, or read from the index where the slot let them go; None before decoding."""
        if self.frame is None:
            return None
        if self.frame.bare and self.index is not None and self.index.exact:
            return IndexedValues(self.index)
        return self.frame.pixels

    @property
    def image_bytes(self) -> int:
        """The memory the decoded image holds: its index and any pixel planes kept."""
        held = 0 if self.index is None else self.index.index.nbytes
        frame = self.frame
        if frame is not None:
            if not frame.bare:
                held += frame.pixels.nbytes
            if frame.color is not None:
                held += frame.color.nbytes
        return held

    def release_image(self) -> None:
        """Let the decoded image go; it is decoded again from :attr:`path` when shown. The
        result and the SEG labels stay; the overlay (drawn from the result: up to 64 MB of
        RGBA on a 4096² radiograph whose lesions lie far apart) is drawn again when shown."""
        self.frame = self.index = None
        if self.result is not None:
            self.overlay = None
        self.seg_overlay = None

    @property
    def label_bytes(self) -> int:
        """The memory the result's label map holds (none once packed, or when it is empty)."""
        r = self.result
        return 0 if r is None or r.labels.strides == (0, 0) else r.labels.nbytes

    def pack_labels(self) -> None:
        """Keep the result's label map zlib-compressed until the image is shown again
        (:meth:`unpack_labels`): a 4096² radiograph's map is 32 MB, mostly zeros. Only for
        an image alone in its series: a series' lesions are linked through its neighbours'
        maps."""
        r = self.result
        if r is None or self.label_bytes == 0:
            return
        labels = np.ascontiguousarray(r.labels)
        self._packed = (zlib.compress(labels.tobytes(), 1), labels.shape, labels.dtype)
        self.result = replace(r, labels=np.broadcast_to(labels.dtype.type(0), labels.shape))

    def unpack_labels(self) -> None:
        """The result's label map back from :meth:`pack_labels` (read-only, as it came)."""
        if self._packed is None or self.result is None:
            return
        data, shape, dtype = self._packed
        labels = np.frombuffer(zlib.decompress(data), dtype=dtype).reshape(shape)
        self.result, self._packed = replace(self.result, labels=labels), None

    @property
    def overlay_bytes(self) -> int:
        return (0 if self.overlay is None else self.overlay.rgba.nbytes) + (
            0 if self.seg_overlay is None else self.seg_overlay.rgba.nbytes)

    def set_result(self, result: FrameResult, overlay: Layer | None, latency_ms: float | None,
                   index: DisplayIndex | None = None) -> None:
        """Attach an analysis result. With ``index`` (the result's frame quantised off the GUI
        thread) the result's own frame replaces a separately decoded copy, so the pixels are
        held once."""
        if index is not None or self.frame is None:
            self.frame, self.error = result.frame, None
            self.set_index(index)
        # the slot holds the image once (frame and index); the result keeps its header
        self.result, self.overlay, self.latency_ms = result.without_pixels(), overlay, latency_ms
        self._packed = None
        self.version += 1


@dataclass(eq=False)
class SeriesEntry:
    """A series as the browser lists it."""

    uid: str
    modality: str
    slots: list[Slot] = field(default_factory=list)
    live: bool = False
    patient: PatientInfo | None = None  # the patient and study of its first image (gui.patient)
    _by_key: dict[str, Slot] = field(default_factory=dict, repr=False)
    # live: how images are placed (:meth:`place`); an opened series comes in order
    order_by: str = "position"
    _orientation: tuple[float, ...] | None = field(default=None, repr=False)
    _linked: tuple[tuple[tuple[str, int], ...], Any] = field(default=((), ([], {})), repr=False)

    def add(self, slot: Slot) -> Slot:
        self.slots.append(slot)
        self._by_key[slot.key] = slot
        return slot

    def place(self, slot: Slot, frame: Frame, seq: int) -> Slot:
        """Put a live image where an opened folder would have it (:meth:`Study.from_paths`),
        whatever order the sender sent it in: by position along the slice normal, head
        first, while every image has patient geometry of one orientation; else
        by InstanceNumber (the series is ordered again the first time that happens). Images
        at one place keep their arrival order. ``seq`` is the arrival that brought it."""
        from medrt.analysis.slices import along_normal

        g = frame.geometry
        number = _instance_number(frame)
        slot.place = (along_normal(frame), number, seq)
        if self.order_by == "position":
            if g is None:
                self._order_by_instance(f"{frame.key} has no ImagePositionPatient/ImageOrientationPatient")
            elif self._orientation is None:
                self._orientation = tuple(g.orientation)
            elif not np.allclose(g.orientation, self._orientation, rtol=0.0, atol=ORIENTATION_ATOL):
                self._order_by_instance(f"{frame.key}'s ImageOrientationPatient differs")
        bisect.insort(self.slots, slot, key=self._order_key)
        self._by_key[slot.key] = slot
        return slot

    def _order_key(self, slot: Slot) -> tuple[Any, ...]:
        position, number, seq = slot.place
        if self.order_by == "position":
            return (-position if position is not None else 0.0, seq)
        return (number is None, number or 0, seq)

    def _order_by_instance(self, reason: str) -> None:
        self.order_by = "instance"
        self.slots.sort(key=self._order_key)
        log.info("live series %s: ordered by InstanceNumber from now on: %s", self.uid, reason)

    def get(self, key: str) -> Slot | None:
        return self._by_key.get(key)

    def trim(self, keep: int) -> int:
        """Forget all but the ``keep`` slots received last (a long live stream); returns how
        many went."""
        extra = len(self.slots) - keep
        if extra <= 0:
            return 0
        gone = {id(s) for s in sorted(self.slots, key=lambda s: s.arrival)[:extra]}
        for slot in self.slots:
            if id(slot) in gone:
                self._by_key.pop(slot.key, None)
        self.slots = [s for s in self.slots if id(s) not in gone]
        return extra

    @property
    def description(self) -> str:
        frames = (s.header for s in self.slots)
        ds = next((f.source.dataset for f in frames if f is not None), None)
        text = str(ds.get("SeriesDescription", "") or "") if ds is not None else ""
        n = len(self.slots)
        head = f"{self.modality or '?'} · {n} image{'s' if n != 1 else ''}"
        return f"{head} · {text}" if text else f"{head} · …{self.uid[-12:]}"

    @property
    def analysed(self) -> int:
        return sum(1 for s in self.slots if s.result is not None)

    def series_lesions(self) -> Linked:
        """The lesions of the results so far, each once (:func:`medrt.analysis.tracking.
        link_series`: sections on neighbouring slices joined); worked out again only when a
        result has come or gone since the last call."""
        from medrt.analysis.tracking import link_series

        done = [s for s in self.slots if s.result is not None]
        signature = tuple((s.key, s.version) for s in done)
        if signature != self._linked[0]:
            results = [s.result for s in done]
            self._linked = (signature, link_series(results))
        return self._linked[1]


@dataclass(frozen=True, slots=True)
class Problem:
    """An input that could not be shown: the file's name, the reason, and whether it is
    simply not an image (a note) rather than a failure."""

    name: str
    reason: str
    skipped: bool = False
    seg: bool = False  # a DICOM SEG that could not be laid over its images (not an image that failed)

    def __str__(self) -> str:
        return f"{self.name}: {self.reason}"


class Study:
    """Series of slots, the problems met on the way, and the SEG objects found beside them."""

    def __init__(self, title: str = "", live: bool = False) -> None:
        self.title = title
        self.live = live
        self.series: list[SeriesEntry] = []
        self.problems: list[Problem] = []
        self.seg_paths: list[Path] = []
        self._seen_problems: set[Problem] = set()
        self.trimmed = 0
        self.arrivals = 0  # live images received, a replay's repeats included
        self.newest_key: str | None = None  # of the image received last
        # an opened folder's files in slice order, a None after each pass of a series of
        # several whole acquisitions: where the analysis takes a 2.5-D model's neighbours
        # (medrt.io.series.slice_order); None for a live study
        self.slice_order: list[Path | None] | None = None

    # -- building -------------------------------------------------------------

    @property
    def patients_warning(self) -> str:
        """A warning when the series belong to more than one patient, else ""."""
        return patients_text([e.patient for e in self.series])

    @classmethod
    def from_paths(cls, paths: Iterable[str | os.PathLike[str]], title: str = "") -> Study:
        """Group the files (folders walked) into series in slice order, head first (the
        larger position along the slice normal: an axial series from the top down, as
        scanners number it, Cornerstone/OHIF sort it by position and
        :mod:`medrt.analysis.tracking` counts a lesion's sections); by InstanceNumber where
        the geometry does not allow that. Reads headers only."""
        files = [p for p in iter_files(paths)]
        study = cls(title=title)
        grouped = group_series(files, dicomdir=False)  # iter_files expanded the DICOMDIRs named
        for s in grouped.series:
            entry = SeriesEntry(s.series_instance_uid, s.modality, patient=_patient_of(s.items[0].source))
            # head first (an axial series from the top down, as the scanner numbers it and as
            # the lesions' sections are counted: medrt.analysis.tracking); a series of several
            # whole acquisitions at the same positions one pass after the other
            stacks = s.stacks or (s.items,)
            items = [i for stack in stacks for i in (_head_first(stack) if s.ordered_by == "position" else stack)]
            for item in items:
                for i in _frames_head_first(item):
                    entry.add(Slot(frame_key(item.sop_instance_uid, item.frames, i), path=item.path))
            study.series.append(entry)
        study.slice_order = slice_order(grouped.series)
        for bad in grouped.errors:
            study.problems.append(Problem(_name(bad.source), describe_error(bad.error),
                                          skipped=bool(getattr(bad.error, "skippable", False))))
        for other in grouped.non_images:
            if other.sop_class_uid in SEG_SOP_CLASSES:
                study.seg_paths.append(Path(other.source))
            else:
                study.problems.append(Problem(_name(other.source), f"not an image ({other.kind})", skipped=True))
        log.info("opened %d series, %d problem(s), %d SEG(s)", len(study.series), len(study.problems),
                 len(study.seg_paths))
        return study

    def add_live_frame(self, frame: Frame, index: DisplayIndex | None, path: Path | None = None,
                       keep: int | None = None) -> tuple[int, int]:
        """Put a streamed frame in its series (a new one if needed), in slice order
        (:meth:`SeriesEntry.place`; the series keeps the ``keep`` images received last). A
        frame sent again (the same SOP instance: a looping replay, a re-sent image) takes
        its slot's place in the series and keeps the slot's last result on screen until its
        new one comes, so an image with a result is never drawn bare while it waits.
        Returns ``(series index, slot index)``."""
        entry = next((e for e in self.series if e.uid == frame.series_instance_uid), None)
        if entry is None:
            entry = SeriesEntry(frame.series_instance_uid, frame.modality, live=True,
                                patient=PatientInfo.of(frame.source.dataset))
            self.series.append(entry)
        self.arrivals += 1
        slot = entry.get(frame.key)
        if slot is None:
            slot = entry.place(Slot(frame.key, path=path), frame, self.arrivals)
        slot.arrival, self.newest_key = self.arrivals, frame.key
        if keep is not None:
            self.trimmed += entry.trim(keep)
        slot.set_frame(frame, index)
        return self.series.index(entry), entry.slots.index(slot)

    def release_images(self, budget: float, series_i: int, slot_i: int) -> int:
        """Bring the images of opened files (slots with a path) within ``budget`` bytes: the
        farthest from image ``slot_i`` of series ``series_i`` go first (other series before
        that one's), never those of its :func:`decode_window`. Their overlays go with them,
        and the label map of an image alone in its series (a radiograph) is packed. Returns
        how many images went."""
        held, total = [], 0
        for si, entry in enumerate(self.series):
            alone = len(entry.slots) == 1
            for i, s in enumerate(entry.slots):
                n = s.image_bytes + s.overlay_bytes + (s.label_bytes if alone else 0)
                if not n or s.path is None:
                    continue
                total += n
                if not (si == series_i and i in decode_window(slot_i)):
                    held.append(((si != series_i, abs(i - slot_i)), s, n, alone))
        gone = 0
        for _, slot, n, alone in sorted(held, key=lambda h: h[0], reverse=True):
            if total <= budget:
                break
            slot.release_image()
            if alone:
                slot.pack_labels()
            total -= n
            gone += 1
        return gone

    # -- lookups ---------------------------------------------------------------

    def find(self, key: str) -> tuple[int, int, Slot] | None:
        for si, entry in enumerate(self.series):
            slot = entry.get(key)
            if slot is not None:
                return si, entry.slots.index(slot), slot
        return None

    def slots_of(self, path: Path) -> list[Slot]:
        """Every slot decoded from ``path`` (a multi-frame object has several)."""
        return [slot for e in self.series for slot in e.slots if slot.path == path]

    def files(self, first_series: int = 0) -> list[Path]:
        """The image files in series and slice order, starting with series ``first_series``."""
        order = self.series[first_series:] + self.series[:first_series]
        seen: dict[Path, None] = {}
        for entry in order:
            for slot in entry.slots:
                if slot.path is not None:
                    seen.setdefault(slot.path, None)
        return list(seen)

    @property
    def frames(self) -> int:
        return sum(len(e.slots) for e in self.series)

    def drop_problems(self, name: str | os.PathLike[str]) -> list[Problem]:
        """Forget the failures of a file that has since been read (a watched file that was
        read half-written, then again once complete); returns those forgotten."""
        short = _name(name)
        gone = [p for p in self.problems if p.name == short and not p.skipped and not p.seg]
        if gone:
            self.problems = [p for p in self.problems if p not in gone]
            self._seen_problems.difference_update(gone)
        return gone

    def add_problem(self, name: str, reason: str, skipped: bool = False, *, seg: bool = False) -> Problem:
        """Note a problem once (a replay loop meets the same file again and again)."""
        problem = Problem(_name(name), reason, skipped, seg)
        if problem not in self._seen_problems:
            self._seen_problems.add(problem)
            self.problems.append(problem)
        return problem


def _instance_number(frame: Frame) -> int | None:
    """The frame's InstanceNumber, or None where the header lacks it or it is not a number."""
    return finite_int(frame.source.dataset.get("InstanceNumber"))


def _name(source: object) -> str:
    """A short, PHI-free name for a file: its name within its folder."""
    text = str(source)
    path = Path(text)
    return f"{path.parent.name}/{path.name}" if path.parent.name else path.name


def _frames_head_first(item: SeriesItem) -> list[int]:
    """An object's frames in the order its slices are shown: a multi-frame object's head
    first, as a series of single-frame slices is, where each frame has a place of its own
    (:func:`medrt.io.series.frames_head_first`, the rule decode orders them by for batch,
    stream and the listener); they were shown in frame order, which an enhanced CT need not
    store in slice order, so scrolling jumped about the volume."""
    if item.frames < 2 or not isinstance(item.source, (str, os.PathLike)):
        return list(range(item.frames))
    try:
        ds = read_dataset(item.source, stop_before_pixels=True)
    except InputError:
        return list(range(item.frames))  # its own error comes when it is decoded
    order = frames_head_first(ds, item.frames)
    return order if order is not None else list(range(item.frames))


def _head_first(stack: Any) -> list[Any]:
    """A stack ordered by position (ascending along row x column) head first, the larger
    :func:`medrt.analysis.slices.along_normal` first, as a live series' slots are placed: a
    feet-first series was shown from the feet up."""
    geometry = stack[0].geometry if stack else None
    return list(stack) if geometry is not None and points_away(geometry.normal) else list(reversed(stack))


def _patient_of(source: object) -> PatientInfo | None:
    """The patient and study in the header of an item's source (a path or a Dataset)."""
    if isinstance(source, (str, os.PathLike)):
        try:
            source = read_dataset(source, stop_before_pixels=True)
        except InputError:
            return None
    if isinstance(source, tuple):  # frames already decoded
        source = source[0].source.dataset if source else None
    return PatientInfo.of(source)
