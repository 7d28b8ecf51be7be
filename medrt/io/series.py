"""Group DICOM inputs into series, order their slices, and turn a series into a volume.

A folder scan or a C-STORE inbox hands over objects in any order, mixed with
other series, non-image objects (SR, SEG) and damaged files. Analysis wants one
ordered stack per series, and 3-D tools want a SimpleITK image with the right
geometry. Grouping reads headers only, so a large folder groups quickly; pixels
are decoded only by :func:`series_to_sitk`.

Ordering follows what viewers and MONAI Deploy do: ImagePositionPatient projected
on the slice normal, InstanceNumber as the fallback, and of two objects at the same
position the one with the higher AcquisitionNumber is kept (a slice re-acquired within
a pass). A series that holds several whole acquisitions at the same positions (a pre-
and a post-contrast pass stored in one series; :mod:`medrt.io.stacks` says when) keeps
them all, stack by stack, as 3D Slicer loads one volume per acquisition. Logs carry UIDs
and counts only, never names, IDs or paths (a path may contain a patient's name).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydicom.dataset import Dataset
from pydicom.uid import UID

from medrt.errors import (
    CorruptDicomError,
    IncompleteHeaderError,
    InputError,
    UnsupportedImageError,
    describe_source,
    drop_tracebacks,
)
from medrt.io.dicom import is_image_sop_class, number_of_frames, read_dataset, read_frames
from medrt.io.header import (
    MAX_SLICE_THICKNESS_MM,
    believable_mm,
    finite_int,
    frame_geometries,
    image_type_of,
    spacing_problem,
    view_of,
)
from medrt.io.scan import iter_files
from medrt.io.stacks import POSITION_ATOL_MM, acquisition_stacks, position_tolerance
from medrt.logsource import reading
from medrt.types import Frame, Geometry

if TYPE_CHECKING:  # pragma: no cover - typing only
    import SimpleITK

__all__ = [
    "OrderedBy", "SeriesInput", "SeriesItem", "Series", "BadInput", "NonImage", "GroupResult",
    "frames_head_first", "group_series", "head_first_order", "order_items", "order_stacks", "regular_step",
    "points_away", "series_to_sitk", "slice_order",
]

log = logging.getLogger(__name__)

OrderedBy = Literal["position", "instance", "none"]
SeriesInput = str | os.PathLike[str] | Dataset | Frame

ORIENTATION_ATOL = 1e-3  # direction cosines that differ less than this are the same orientation
SPACING_RTOL = 0.01  # slice steps may differ from their median by 1 % before a volume is refused


@dataclass(frozen=True, slots=True)
class SeriesItem:
    """One DICOM object of a series; a multi-frame object is one item of ``frames`` frames.

    ``position`` is ImagePositionPatient (of the first frame) projected on the slice
    normal, in mm, or None without geometry. ``source`` is what the pixels are decoded
    from: a path, a Dataset, or the Frames the caller already decoded.
    """

    path: Path | None
    sop_instance_uid: str
    instance_number: int | None
    acquisition_number: int | None
    position: float | None
    frames: int = 1
    geometry: Geometry | None = None
    input_index: int = 0
    source: Path | Dataset | tuple[Frame, ...] | None = field(default=None, compare=False, repr=False)
    image_type: tuple[str, ...] = ()  # Image Type (0008,0008), upper case
    body_part: str = ""  # BodyPartExamined, as written
    view: str = ""  # ViewPosition, as written (else from ViewCodeSequence: medrt.io.header.view_of)


@dataclass(frozen=True, slots=True)
class Series:
    """The image objects of one (StudyInstanceUID, SeriesInstanceUID), in slice order.

    ``stacks``: when the series holds several whole acquisitions at the same slice
    positions (:mod:`medrt.io.stacks`), each one's items in slice order, lower
    AcquisitionNumber first; ``items`` is then their concatenation. Empty for a series
    of one stack. One Series still stands for the SeriesInstanceUID (a batch's output
    folder, the listener's spool and the viewer key by it).
    """

    study_instance_uid: str
    series_instance_uid: str
    modality: str
    items: tuple[SeriesItem, ...]
    ordered_by: OrderedBy
    duplicates_dropped: tuple[SeriesItem, ...] = ()
    frame_of_reference_uid: str | None = None
    sop_class_uid: str = ""
    stacks: tuple[tuple[SeriesItem, ...], ...] = ()

    @property
    def acquisitions(self) -> int:
        """How many whole acquisitions (stacks) the series holds: 1 but for a series of several."""
        return max(1, len(self.stacks))

    @property
    def acquisition_numbers(self) -> tuple[int | None, ...]:
        """The AcquisitionNumber of each stack (``stacks``); () for a series of one stack."""
        return tuple(stack[0].acquisition_number for stack in self.stacks)

    @property
    def frames(self) -> int:
        """Frames over all items (a multi-frame object counts each of its frames)."""
        return sum(item.frames for item in self.items)

    @property
    def image_type(self) -> tuple[str, ...]:
        """The Image Type every item shares (a localizer series: all LOCALIZER), else ()."""
        return self._shared("image_type", ())  # type: ignore[return-value]

    @property
    def body_part(self) -> str:
        """The BodyPartExamined every item shares, else ""."""
        return self._shared("body_part", "")  # type: ignore[return-value]

    @property
    def view(self) -> str:
        """The ViewPosition every item shares, else "" (a PA and a lateral view in one series)."""
        return self._shared("view", "")  # type: ignore[return-value]

    @property
    def plane(self) -> str:
        """The anatomical plane every item lies in (:attr:`Geometry.plane`), else ""."""
        planes = {item.geometry.plane if item.geometry is not None else "" for item in self.items}
        return planes.pop() if len(planes) == 1 else ""

    def _shared(self, name: str, none: object) -> object:
        values = {getattr(item, name) for item in self.items}
        return values.pop() if len(values) == 1 else none


@dataclass(frozen=True, slots=True)
class BadInput:
    """An input that could not be grouped, and why; grouping went on without it.
    ``error`` is kept without its traceback (:func:`~medrt.errors.drop_tracebacks`)."""

    source: str
    error: InputError

    def __post_init__(self) -> None:
        drop_tracebacks(self.error)

    @property
    def reason(self) -> str:
        return self.error.reason


@dataclass(frozen=True, slots=True)
class NonImage:
    """A readable DICOM object that is not an image (SR, SEG, ...), kept out of the series."""

    source: str
    sop_class_uid: str
    sop_instance_uid: str
    series_instance_uid: str
    study_instance_uid: str

    @property
    def kind(self) -> str:
        return UID(self.sop_class_uid).name


@dataclass(frozen=True, slots=True)
class GroupResult:
    """Everything :func:`group_series` found: ordered series, bad inputs and non-images."""

    series: tuple[Series, ...]
    errors: tuple[BadInput, ...] = ()
    non_images: tuple[NonImage, ...] = ()

    def get(self, series_instance_uid: str) -> Series | None:
        """The series with this SeriesInstanceUID (the first, if two studies share it)."""
        return next((s for s in self.series if s.series_instance_uid == series_instance_uid), None)


# --------------------------------------------------------------------------- grouping

_Source = Path | Dataset | tuple[Frame, ...]


def group_series(inputs: SeriesInput | Iterable[SeriesInput], *, dicomdir: bool = True) -> GroupResult:
    """Group files (folders are walked), Datasets or Frames by study and series, in slice order.

    Only headers are read. Unusable inputs are listed in ``errors`` with their
    reason and non-image objects in ``non_images``; neither stops the grouping.
    Frames are grouped per SOPInstanceUID, so the frames of one object form one item.
    A DICOMDIR among the inputs stands for the files it lists (:func:`iter_files`);
    ``dicomdir=False`` for inputs that are already :func:`iter_files`' output (a folder
    walk's DICOMDIR is then a non-image, its files being in the walk already).
    """
    if isinstance(inputs, (str, os.PathLike, Dataset, Frame)):
        inputs = [inputs]
    groups: dict[tuple[str, str], list[SeriesItem]] = {}
    headers: dict[tuple[str, str], Dataset] = {}
    errors: list[BadInput] = []
    non_images: list[NonImage] = []
    count = 0
    for count, (header, path, source) in enumerate(_headers(inputs, dicomdir), start=1):
        try:
            if isinstance(header, InputError):
                raise header
            found = _read_header(header, count - 1, path, source)
        except InputError as exc:
            errors.append(BadInput(exc.source, exc))
            continue
        if isinstance(found, NonImage):
            non_images.append(found)
            continue
        groups.setdefault(found[0], []).append(found[1])
        headers.setdefault(found[0], header)

    series: list[Series] = []
    for key in sorted(groups):
        stacks, dropped, ordered_by = order_stacks(groups[key], label=key[1])
        ds = headers[key]
        series.append(
            Series(
                key[0], key[1], _text(ds, "Modality"), tuple(i for stack in stacks for i in stack), ordered_by,
                dropped, _text(ds, "FrameOfReferenceUID") or None, _sop_class(ds),
                stacks if len(stacks) > 1 else (),
            )
        )
    log.info(
        "grouped %d input(s) into %d series (%d image object(s)); %d bad, %d non-image",
        count, len(series), sum(len(s.items) for s in series), len(errors), len(non_images),
    )
    return GroupResult(tuple(series), tuple(errors), tuple(non_images))


def slice_order(series: Iterable[Series]) -> list[Path | None]:
    """The files of ``series``, series by series in slice order, with a None after each
    stack of a series of several whole acquisitions (:attr:`Series.stacks`): the file
    order a 2.5-D model's neighbours are taken from
    (:class:`medrt.pipeline.stages.SliceContext`), so that no slice of one pass is taken
    as the neighbour of the other's. The batch, a replayed folder (``medrt stream``, the
    viewer) and the listener (through the batch) all give this order."""
    order: list[Path | None] = []
    for s in series:
        for stack in s.stacks or (s.items,):
            order += [item.path for item in stack if item.path is not None]
            if s.stacks:
                order.append(None)
    return order


def _headers(inputs: Iterable[SeriesInput], dicomdir: bool = True) -> Iterator[tuple[Dataset | InputError, Path | None, _Source]]:
    """Each input's header (or why it has none), its path, and what its pixels come from."""
    frames: dict[str, list[Frame]] = {}
    for raw in inputs:
        if isinstance(raw, Frame):
            frames.setdefault(raw.sop_instance_uid or str(id(raw.source)), []).append(raw)
        elif isinstance(raw, Dataset):
            name = getattr(raw, "filename", None)
            yield raw, Path(name) if isinstance(name, (str, os.PathLike)) and str(name) else None, raw
        else:
            for path in iter_files([raw], dicomdir=dicomdir):
                header: Dataset | InputError
                try:
                    header = read_dataset(path, stop_before_pixels=True)
                except InputError as exc:
                    header = exc
                yield header, path, path
    for group in frames.values():
        yield group[0].source.dataset, group[0].source.path, tuple(group)


def _text(ds: Dataset, keyword: str) -> str:
    return str(ds.get(keyword, "") or "")


def _sop_class(ds: Dataset) -> str:
    meta = getattr(ds, "file_meta", None)
    return _text(ds, "SOPClassUID") or (_text(meta, "MediaStorageSOPClassUID") if meta is not None else "")


def _read_header(
    ds: Dataset, index: int, path: Path | None, source: _Source
) -> tuple[tuple[str, str], SeriesItem] | NonImage:
    """One header's (study, series) key and item, or a NonImage."""
    label: object = path if path is not None else ds
    with reading(label):  # pydicom parses each element when first read: its warnings name the file
        return _read_header_of(ds, index, path, source, label)


def _read_header_of(
    ds: Dataset, index: int, path: Path | None, source: _Source, label: object
) -> tuple[tuple[str, str], SeriesItem] | NonImage:
    try:
        study, series, sop_class = _text(ds, "StudyInstanceUID"), _text(ds, "SeriesInstanceUID"), _sop_class(ds)
        if sop_class and not is_image_sop_class(sop_class):
            return NonImage(describe_source(label), sop_class, _text(ds, "SOPInstanceUID"), series, study)
        missing = [k for k, v in (("StudyInstanceUID", study), ("SeriesInstanceUID", series)) if not v]
        if missing:
            raise IncompleteHeaderError(label, f"no {' or '.join(missing)}, so it cannot be grouped into a series")
        if not isinstance(source, tuple) and not _text(ds, "SOPInstanceUID"):
            # A SEG and an SR refer to each image by its SOPInstanceUID: one image without it
            # made the export of its whole series fail, and the good images' results were lost.
            raise IncompleteHeaderError(label, "no SOPInstanceUID, so results cannot refer to it")
        n_frames = len(source) if isinstance(source, tuple) else number_of_frames(ds)
        geometry = source[0].geometry if isinstance(source, tuple) else frame_geometries(ds, n_frames)[0]
        position = _project(geometry, _unit_normal(geometry.orientation)) if geometry is not None else None
        item = SeriesItem(
            path, _text(ds, "SOPInstanceUID"), finite_int(ds.get("InstanceNumber")),
            finite_int(ds.get("AcquisitionNumber")), position, n_frames, geometry, index, source,
            image_type_of(ds), _text(ds, "BodyPartExamined"), view_of(ds),
        )
    except InputError:
        raise
    except Exception as exc:  # a lazily parsed attribute that is garbage
        raise CorruptDicomError(label, f"a header attribute cannot be read ({type(exc).__name__})") from exc
    return (study, series), item


def _unit_normal(orientation: Sequence[float]) -> np.ndarray:
    n = np.cross(np.asarray(orientation[:3], dtype=np.float64), np.asarray(orientation[3:], dtype=np.float64))
    length = float(np.linalg.norm(n))
    return n / length if length > 0 else n


def _project(geometry: Geometry, normal: Sequence[float] | np.ndarray) -> float:
    return float(np.dot(np.asarray(geometry.position, dtype=np.float64), np.asarray(normal, dtype=np.float64)))


def points_away(normal: Sequence[float]) -> bool:
    """Whether a slice normal (row × column) points away from its largest patient axis: to
    the feet on an axial feet-first scan (ImageOrientationPatient -1\\0\\0\\0\\1\\0), where
    :func:`medrt.analysis.slices.along_normal` counts the other way and a stack ascending
    along row × column is already head first."""
    return bool(normal[int(np.argmax(np.abs(normal)))] < 0)


def head_first_order(geometries: Sequence[Geometry | None]) -> list[int] | None:
    """The indices of one multi-frame object's frames (their ``geometries``:
    :func:`medrt.io.header.frame_geometries`, or the decoded frames' own) in slice order,
    head first: descending along the slice normal turned to its largest patient axis (the
    larger :func:`medrt.analysis.slices.along_normal` first), as a series' slices are shown
    and a lesion's sections counted. None where the frames do not each have a place of their
    own on one orientation (fewer than two, one without geometry, direction cosines spread
    by more than :data:`ORIENTATION_ATOL` (the rule a series' items are ordered by), several
    phases or stacks at one place, positions equal to 1e-3 mm): their frame order keeps
    those together.

    The one rule for every path: the viewer orders an object's frames by it from the header
    (:func:`frames_head_first`), and decode (batch, stream, the listener, a viewer's live
    source) from the decoded frames (:func:`medrt.analysis.slices.head_first`). They had a
    rule each (1e-3 on the cosines against a normal's dot product of 0.999, each frame
    projected on its own normal against one normal for all), so frames whose orientations
    differ by a hair, or whose cosines are a hair short of unit length, were ordered by one
    and left in frame order by the other. The positions are projected on the normal of the
    frames' mean orientation, the same whatever order they are stored in."""
    if len(geometries) < 2 or any(g is None for g in geometries):
        return None
    orientations = np.asarray([g.orientation for g in geometries], dtype=np.float64)  # type: ignore[union-attr]
    if float(np.ptp(orientations, axis=0).max()) > ORIENTATION_ATOL:
        return None
    normal = _unit_normal(orientations.mean(axis=0))
    if not np.any(normal):
        return None
    positions = np.asarray([g.position for g in geometries], dtype=np.float64) @ normal  # type: ignore[union-attr]
    if len({round(float(p), 3) for p in positions}) < len(geometries):
        return None
    if not points_away(normal):  # row x column towards the head: the larger position first
        positions = -positions
    return [int(i) for i in np.argsort(positions, kind="stable")]


def frames_head_first(ds: Dataset, n_frames: int) -> list[int] | None:
    """:func:`head_first_order` of a multi-frame object's frames, read from its header alone
    (frame order need not be slice order: an enhanced CT may store its frames in any order)."""
    return head_first_order(frame_geometries(ds, n_frames))


# --------------------------------------------------------------------------- ordering


def order_items(
    items: Sequence[SeriesItem], *, label: str = ""
) -> tuple[tuple[SeriesItem, ...], tuple[SeriesItem, ...], OrderedBy]:
    """Put one series' items in slice order and drop duplicates: ``(ordered, dropped, ordered_by)``.

    By position along the common slice normal (ascending) when every item has a
    geometry and they share one orientation; otherwise by InstanceNumber, then
    SOPInstanceUID. Of items at one position (or with one SOPInstanceUID) the one
    with the higher AcquisitionNumber, then InstanceNumber, then the later input is
    kept, unless they are several whole acquisitions (:func:`order_stacks`: then
    stack by stack). ``label`` (a UID) names the series in logs.
    """
    stacks, dropped, ordered_by = order_stacks(items, label=label)
    return tuple(item for stack in stacks for item in stack), dropped, ordered_by


def order_stacks(
    items: Sequence[SeriesItem], *, label: str = ""
) -> tuple[tuple[tuple[SeriesItem, ...], ...], tuple[SeriesItem, ...], OrderedBy]:
    """:func:`order_items`, the ordered items as stacks: ``(stacks, dropped, ordered_by)``.

    Ordered by position, items that are several whole acquisitions at the same positions
    (:func:`medrt.io.stacks.acquisition_stacks`) are one stack each, lower
    AcquisitionNumber first, each in slice order and none dropped; otherwise there is
    one stack (none for no items).
    """
    best: dict[str, SeriesItem] = {}
    copies = Counter(item.sop_instance_uid or f"#{item.input_index}" for item in items)
    usable = {id(item): _decodes(item) for item in items if copies[item.sop_instance_uid or "#"] > 1}
    for item in items:
        key = item.sop_instance_uid or f"#{item.input_index}"
        if key not in best or _copy_preference(item, usable) > _copy_preference(best[key], usable):
            best[key] = item
    unique = list(best.values())
    dropped = [item for item in items if best[item.sop_instance_uid or f"#{item.input_index}"] is not item]
    for item in dropped:
        log.warning("series %s: SOPInstanceUID %s given twice; one copy dropped", label, item.sop_instance_uid)

    reason = _why_not_by_position(unique)
    if reason is None:
        normal = _unit_normal(unique[0].geometry.orientation)  # type: ignore[union-attr]
        placed = [dataclasses.replace(i, position=_project(i.geometry, normal)) for i in unique]  # type: ignore[arg-type]
        which = acquisition_stacks([i.position for i in placed], [i.acquisition_number for i in placed])
        if which is not None:
            parts = [[i for i, k in zip(placed, which, strict=True) if k == n] for n in range(max(which) + 1)]
            log.info("series %s: %d whole acquisitions at the same slice positions (AcquisitionNumber %s), "
                     "each ordered as a stack of its own", label, len(parts),
                     ", ".join(str(p[0].acquisition_number) for p in parts))
            return tuple(_order_by_position(p, label)[0] for p in parts), tuple(dropped), "position"
        ordered, duplicates = _order_by_position(placed, label)
        return (ordered,), (*dropped, *duplicates), "position"
    if len(unique) > 1:
        log.info("series %s: ordered by InstanceNumber, not position: %s", label, reason)
    ordered_by: OrderedBy = "instance" if any(i.instance_number is not None for i in unique) else "none"
    ordered_items = sorted(
        unique, key=lambda i: (i.instance_number is None, i.instance_number or 0, i.sop_instance_uid, i.input_index)
    )
    return ((tuple(ordered_items),) if ordered_items else ()), tuple(dropped), ordered_by


def _copy_preference(item: SeriesItem, usable: dict[int, bool]) -> tuple[bool, tuple[bool, int, bool, int, int]]:
    """:func:`_preference`, with a copy that decodes first where one image came several times.

    A re-sent or copied instance is often whole in one copy and cut short or damaged in
    another: keeping the damaged one (met later, so preferred) lost the image, the good
    copy being passed over as a duplicate. Only copies of one SOPInstanceUID are decoded
    here, so a folder without duplicates reads headers alone, as before."""
    return usable.get(id(item), True), _preference(item)


def _decodes(item: SeriesItem) -> bool:
    if not isinstance(item.source, Path):
        return True  # a Dataset or decoded Frames the caller holds: nothing to compare by
    try:
        read_frames(item.source)
    except InputError as exc:
        log.warning("%s: a copy of SOPInstanceUID %s cannot be used: %s", item.source, item.sop_instance_uid, exc.why)
        return False
    return True


def _preference(item: SeriesItem) -> tuple[bool, int, bool, int, int]:
    acq, inst = item.acquisition_number, item.instance_number
    return (acq is not None, acq or 0, inst is not None, inst or 0, item.input_index)


def _why_not_by_position(items: Sequence[SeriesItem]) -> str | None:
    lacking = sum(item.geometry is None for item in items)
    if not items or lacking:
        return f"{lacking} of {len(items)} item(s) lack ImagePositionPatient/ImageOrientationPatient"
    first = np.asarray(items[0].geometry.orientation)  # type: ignore[union-attr]
    differ = sum(
        not np.allclose(item.geometry.orientation, first, rtol=0.0, atol=ORIENTATION_ATOL)  # type: ignore[union-attr]
        for item in items
    )
    return f"ImageOrientationPatient differs in {differ} of {len(items)} item(s)" if differ else None


def _order_by_position(
    items: Sequence[SeriesItem], label: str
) -> tuple[tuple[SeriesItem, ...], tuple[SeriesItem, ...]]:
    """``items`` (positions projected on their common normal) sorted by position, and of
    those at one position (:func:`medrt.io.stacks.position_tolerance`) all but the
    preferred (:func:`_preference`) dropped: ``(ordered, dropped)``."""
    placed = sorted(items, key=lambda i: (i.position, i.input_index))
    tolerance = position_tolerance([i.position for i in placed])  # type: ignore[misc]
    clusters: list[list[SeriesItem]] = []
    for item in placed:
        if clusters and item.position - clusters[-1][0].position <= tolerance:  # type: ignore[operator]
            clusters[-1].append(item)
        else:
            clusters.append([item])
    ordered: list[SeriesItem] = []
    dropped: list[SeriesItem] = []
    for cluster in clusters:
        keep = max(cluster, key=_preference)
        ordered.append(keep)
        for other in cluster:
            if other is not keep:
                dropped.append(other)
                log.warning(
                    "series %s: %s and %s share position %.3f mm; kept %s (AcquisitionNumber %s)",
                    label, keep.sop_instance_uid, other.sop_instance_uid, keep.position,
                    keep.sop_instance_uid, keep.acquisition_number,
                )
    return tuple(ordered), tuple(dropped)


# --------------------------------------------------------------------------- volume


def series_to_sitk(series: Series) -> SimpleITK.Image:
    """Decode a series into a float32 SimpleITK volume in modality units (HU for CT).

    Spacing, origin (the first slice's ImagePositionPatient) and direction (row and
    column cosines and the slice normal) come from the headers. Raises
    :class:`UnsupportedImageError`, naming the series and the reason, when the frames
    do not form one regular volume (a series of several acquisitions: one volume each).
    """
    import SimpleITK as sitk

    uid = series.series_instance_uid
    if series.stacks:
        raise UnsupportedImageError(
            uid, f"{len(series.stacks)} acquisitions at the same slice positions: a volume each "
            "(dataclasses.replace(series, items=stack, stacks=()) for each of series.stacks)"
        )
    frames = [frame for item in series.items for frame in _decoded(item)]
    if not frames:
        raise UnsupportedImageError(uid, "the series has no frames")
    shapes = sorted({f.shape for f in frames})
    if len(shapes) > 1:
        sizes = ", ".join(f"{r}x{c}" for r, c in shapes[:4])
        raise UnsupportedImageError(uid, f"frames differ in size ({sizes}, rows x columns)")
    lacking = sum(f.geometry is None for f in frames)
    if lacking:
        raise UnsupportedImageError(
            uid, f"no geometry: {lacking} of {len(frames)} frame(s) lack ImagePositionPatient/ImageOrientationPatient"
        )
    spacing = frames[0].spacing_mm
    unscaled = [f for f in frames if f.spacing_mm is None]
    if unscaled:
        first = unscaled[0]
        problem = spacing_problem(first.source.dataset, first.frame_index) if first.source.dataset is not None else None
        raise UnsupportedImageError(
            uid, f"{len(unscaled)} of {len(frames)} frame(s) have no usable pixel spacing (the first, "
            f"{first.source.path or first.key}: {problem or 'none in the header'})"
        )
    if not np.allclose([f.spacing_mm for f in frames], spacing, rtol=SPACING_RTOL, atol=0.0):
        raise UnsupportedImageError(uid, "pixel spacing differs between frames")
    orientation = np.asarray(frames[0].geometry.orientation, dtype=np.float64)  # type: ignore[union-attr]
    if not np.allclose([f.geometry.orientation for f in frames], orientation, rtol=0.0, atol=ORIENTATION_ATOL):  # type: ignore[union-attr]
        raise UnsupportedImageError(uid, "ImageOrientationPatient differs between frames")
    normal = _unit_normal(orientation)
    ipp = np.asarray([f.geometry.position for f in frames], dtype=np.float64)  # type: ignore[union-attr]
    positions = ipp @ normal
    order = np.argsort(positions, kind="stable")
    frames = [frames[i] for i in order]
    ipp, positions = ipp[order], positions[order]
    dz = _slice_spacing(uid, positions, frames[0])
    offsets = (ipp - ipp[0]) - np.outer(positions - positions[0], normal)
    if len(frames) > 1 and float(np.abs(offsets).max()) > max(POSITION_ATOL_MM, SPACING_RTOL * dz):
        raise UnsupportedImageError(uid, "slices are shifted in-plane along the stack (gantry tilt?): not a regular volume")

    volume = np.empty((len(frames), *shapes[0]), dtype=np.float32)
    for k, frame in enumerate(frames):
        volume[k] = frame.pixels
    image = sitk.GetImageFromArray(volume)
    image.SetSpacing((float(spacing[1]), float(spacing[0]), dz))  # x = columns, y = rows
    image.SetOrigin(tuple(float(v) for v in ipp[0]))
    direction = np.column_stack([orientation[:3], orientation[3:], normal])
    image.SetDirection(tuple(float(v) for v in direction.ravel()))
    log.info("series %s: volume of %d frame(s) of %dx%d", uid, len(frames), *shapes[0])
    return image


def _decoded(item: SeriesItem) -> list[Frame]:
    if isinstance(item.source, tuple):
        return list(item.source)
    if item.source is None:
        raise UnsupportedImageError(item.sop_instance_uid, "the item has no source to decode")
    return read_frames(item.source)


def _slice_spacing(uid: str, positions: np.ndarray, first: Frame) -> float:
    """The slice step in mm: the median step, refused when the steps are not uniform."""
    if len(positions) == 1:  # one slice: its nominal thickness, else 1 mm
        header = first.source.dataset
        values = (believable_mm(header.get(k), MAX_SLICE_THICKNESS_MM) for k in ("SpacingBetweenSlices", "SliceThickness"))
        return next((v for v in values if v is not None), 1.0)
    steps = np.diff(positions)
    if float(steps.min()) <= POSITION_ATOL_MM:
        raise UnsupportedImageError(uid, "two frames share one position: not a regular volume")
    median = regular_step(positions)
    if median is None:
        median = float(np.median(steps))
        raise UnsupportedImageError(
            uid,
            f"non-uniform slice spacing: steps from {steps.min():.4g} to {steps.max():.4g} mm (median {median:.4g} mm)",
        )
    return median


def regular_step(positions: Sequence[float] | np.ndarray) -> float | None:
    """The step in mm between neighbouring slices at ``positions`` (along their normal, in
    any order) when they form a regular stack: the median step, every step within 1 %
    (:data:`SPACING_RTOL`, at least :data:`POSITION_ATOL_MM`) of it. None for fewer than two
    positions, two at one position, or uneven steps (a missing slice, a stack of two
    spacings): what a volume (:func:`series_to_sitk`) and a SEG's inferred SliceThickness
    (:func:`medrt.export.seg.inferred_slice_thickness`) take as the slice spacing."""
    if len(positions) < 2:
        return None
    steps = np.diff(np.sort(np.asarray(positions, dtype=np.float64)))
    if float(steps.min()) <= POSITION_ATOL_MM:
        return None
    median = float(np.median(steps))
    if float(np.abs(steps - median).max()) > max(POSITION_ATOL_MM, SPACING_RTOL * median):
        return None
    return median
