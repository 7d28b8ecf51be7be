"""DICOM Segmentation of one series' lesions, built with highdicom.

Decisions (see REFERENCE.md, "DICOM output conventions"):

- **BINARY, uncompressed (Explicit VR Little Endian) by default.** LABELMAP is the
  newer Label Map Segmentation Storage SOP class: dciodvfy (dicom3tools 2022) does
  not know it and many PACS and viewers do not either; BINARY + RLE is
  rejected. BINARY frames are 1 bit per pixel: 32 KiB for 512², but 2 MiB for
  4096², so a radiograph's SEG holds 2 MiB per lesion (a segment each).
  ``compression="jpeg2000"`` (JPEG 2000 Lossless, the one compressed syntax BINARY
  allows) makes that a few KiB; it is not the default because not every archive
  or viewer takes compressed SEGs (the forwarder sends a peer that refuses it the
  same object uncompressed: :func:`medrt.pacs.scu.send`).
- **One segment per lesion**, "Lesion <n>" (category Morphologically abnormal
  structure, type Lesion, AUTOMATIC), numbered as the series' lesions
  (:func:`medrt.analysis.tracking.link_series`: the sections of one lesion on
  neighbouring CT slices are one segment), with the lesion's Tracking ID and
  Tracking UID, the same as its SR groups', and the overlay's colour for that number.
  A viewer lists, colours and hides each lesion by itself, and the SR's planar groups
  point at their own lesion's frame. A SEG that covers part of a series (one view of a
  radiograph series) holds that part's lesions, still named by their series numbers.
- **Empty frames:** with one segment every source frame is kept by default, so SEG
  frame *i* is source image *i* (some viewers misplace SEGs that omit frames); with
  several, a frame is kept only where its lesion is (keeping every image for every
  lesion would multiply the SEG by the lesion count, and frame *i* is no longer image
  *i* anyway). ``omit_empty_frames`` True or False overrides that.
- **No lesion anywhere: no SEG** (:func:`build_seg` returns None). An empty SEG
  series in every negative study is clutter; the SR says "0 lesions" and lists
  the images that were evaluated.
- **Source headers without pixel data are enough:** highdicom reads only the
  header of the source images (UIDs, geometry, spacing), so
  ``FrameResult.frame.source.dataset`` is passed as it is.
- **One SEG relates to single-frame images in patient coordinates, or to one
  object** (a radiograph without patient geometry, a multi-frame image):
  that is what highdicom can place. :func:`split_for_seg` cuts a series into
  such groups (one per pass of a series of several acquisitions at the same positions).
  A multi-frame source needs every frame's result and a Frame of
  Reference (an ultrasound cine has none): otherwise :class:`ExportError`.
- **An enhanced source's Pixel Measures may be per frame.** highdicom 0.28 reads a
  multi-frame source's shared Pixel Measures only (an AttributeError for a scanner that
  writes them per frame, as many enhanced MR do) and writes one for all SEG frames; it is
  handed a shallow copy of the header whose shared group holds the Pixel Measures the
  frames share (:func:`_with_shared_measures`), each frame's read attribute by attribute
  (its own item's, else the shared one's: :func:`medrt.io.header.pixel_measures_item`, as
  the reader measures it). A frame whose PixelSpacing or SliceThickness is then absent or
  not a length, while the others' are good, is left out
  (:func:`seg_left_out`, as a damaged single-frame slice is: the SEG must not claim another
  frame's spacing for it), the other frames placed by their positions; frames whose good
  Pixel Measures differ get no SEG, and the error names them.
- **An empty SliceThickness is inferred.** It is Type 2 in the CT Image module (some
  anonymisers and older scanners leave it empty on every slice), but Type 1C in the
  SEG's Pixel Measures, which highdicom copies from the first source image: such a
  series got no SEG (before that, one dciodvfy refused). Where no source image of a SEG
  has one, the SEG's is SpacingBetweenSlices when the sources agree on a positive one,
  else the median step between neighbouring slice positions of a regular stack
  (:func:`medrt.io.series.regular_step`); :func:`inferred_slice_thickness` says which,
  and the log and the batch's manifest and report say so. A lone slice without either
  still gets no SEG, and the error says why.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import highdicom as hd
import numpy as np
from pydicom.dataset import Dataset
from pydicom.multival import MultiValue
from pydicom.sr.codedict import codes
from pydicom.uid import ExplicitVRLittleEndian, JPEG2000Lossless

from medrt.analysis.slices import along_normal, frame_stacks, in_stacks
from medrt.analysis.tracking import Linked
from medrt.export.common import (
    AI_FAMILY,
    SEG_SERIES_NUMBER,
    ExportError,
    algorithm_parts,
    check_results,
    device_identity,
    linked_lesions,
    readable_header,
    single_value,
    software_versions,
)
from medrt.io.header import (
    MAX_SLICE_THICKNESS_MM,
    believable_mm,
    dicom_values,
    finite_float,
    frames_text,
    pixel_measures_item,
    spacing_is_believable,
)
from medrt.io.series import regular_step
from medrt.overlay import lesion_color
from medrt.types import FrameResult

__all__ = ["SEG_COMPRESSION", "InferredThickness", "SegPlan", "build_seg", "inferred_slice_thickness",
           "lacks_slice_thickness", "plan_segs", "seg_frame_numbers", "seg_left_out", "segment_description", "segment_numbers", "split_for_seg"]

#: ``compression`` of :func:`build_seg` -> the SEG's transfer syntax (BINARY allows these two).
SEG_COMPRESSION = {"none": ExplicitVRLittleEndian, "jpeg2000": JPEG2000Lossless}

log = logging.getLogger(__name__)


def segment_description(models: Sequence[str], segment_number: int, lesion: int,
                        tracking_uid: str) -> hd.seg.SegmentDescription:
    """Segment ``segment_number``: series lesion ``lesion``, "Lesion <n>", with its Tracking ID
    and ``tracking_uid`` and the overlay's colour for that number, identified as the output
    of ``models``."""
    name, version, params = algorithm_parts(models)
    algorithm = hd.AlgorithmIdentificationSequence(
        name=name, family=AI_FAMILY, version=version, source=f"medrt {software_versions()}",
        parameters=params or None,
    )
    return hd.seg.SegmentDescription(
        segment_number=segment_number,
        segment_label=f"Lesion {lesion}",
        segmented_property_category=codes.SCT.MorphologicallyAbnormalStructure,
        segmented_property_type=codes.SCT.Lesion,
        algorithm_type=hd.seg.SegmentAlgorithmTypeValues.AUTOMATIC,
        algorithm_identification=algorithm,
        tracking_id=f"Lesion {lesion}",
        tracking_uid=tracking_uid,
        display_color=hd.color.CIELabColor.from_rgb(*lesion_color(lesion)),
    )


def _check_planes(results: list[FrameResult]) -> None:
    """Single-frame sources of one SEG need one size and, with patient geometry, one image per
    position (duplicate ImagePositionPatient happens in the wild; the series layer picks one)."""
    shapes = {r.frame.shape for r in results}
    if len(shapes) > 1:
        raise ExportError(
            f'Argument "results" mixes image sizes {sorted(shapes)}: a SEG covers images of one size.'
        )
    seen: dict[tuple[float, ...], str] = {}
    for r in results:
        g = r.frame.geometry
        if g is None:
            continue
        key = tuple(round(v, 3) for v in (*g.position, *g.orientation))
        if key in seen:
            raise ExportError(
                f'Argument "results": {seen[key]} and {r.frame.key} lie in the same plane '
                "(same ImagePositionPatient); keep one image per position."
            )
        seen[key] = r.frame.key


#: What highdicom copies from a single-frame source with a Frame of Reference into the
#: SEG's Pixel Measures and Plane Position/Orientation (``Image._prepare_spatial_metadata``,
#: read as attributes: a missing one was an AttributeError naming no file).
_PLANE_ATTRIBUTES = ("PixelSpacing", "SliceThickness", "ImagePositionPatient", "ImageOrientationPatient")


def _lacking(ds: Dataset, *, thickness_inferred: bool = False) -> list[str]:
    """The plane attributes a single-frame source in patient coordinates (it has a Frame of
    Reference UID) lacks, or has empty; [] for one outside patient coordinates.
    ``thickness_inferred``: its SEG carries an :func:`inferred_slice_thickness`, so an empty
    SliceThickness is not lacking."""
    if not _in_patient_coordinates(ds):
        return []
    return [k for k in _PLANE_ATTRIBUTES if (k not in ds or ds[k].VM == 0 or not _believable(ds, k))
            and not (thickness_inferred and k == "SliceThickness")]


def _believable(ds: Dataset, keyword: str) -> bool:
    """False for a PixelSpacing or SliceThickness that cannot be a length in mm (0, NaN,
    1e300: :func:`medrt.io.header.believable_mm`). highdicom copied it into the SEG, or
    failed ("Cannot encode non-finite floats as DICOM decimal strings") and took the
    series' SEG with it; such a value counts as lacking, so the SEG infers a SliceThickness
    or leaves that image out, and the error names it."""
    return spacing_is_believable(ds, keyword) is not False if keyword in ("PixelSpacing", "SliceThickness") else True


def _unbelievable_note(ds: Dataset, missing: list[str]) -> str:
    """" (its PixelSpacing cannot be a length in mm)" where one of ``missing`` is there but 0,
    NaN or 1e300, so "no PixelSpacing" is not read as absent; "" otherwise."""
    bad = [k for k in missing if k in ds and ds[k].VM and not _believable(ds, k)]
    return f" (its {' and '.join(bad)} cannot be a length in mm)" if bad else ""


def _plane_header(ds: Dataset) -> Dataset:
    """:func:`readable_header`, with a SliceThickness that cannot be a length left empty:
    where the SEG infers one (:func:`inferred_slice_thickness`), highdicom must not read it."""
    out = readable_header(ds)
    if spacing_is_believable(out, "SliceThickness") is False:
        out = copy.deepcopy(out) if out is ds else out
        out.SliceThickness = None
    return out


def _in_patient_coordinates(ds: Dataset) -> bool:
    return "FrameOfReferenceUID" in ds and "ImageOrientationSlide" not in ds


def lacks_slice_thickness(ds: Dataset) -> bool:
    """A single-frame source header in patient coordinates whose SliceThickness is empty
    or absent: a SEG of it needs an :func:`inferred_slice_thickness`."""
    return _in_patient_coordinates(ds) and "SliceThickness" in _lacking(ds)


class InferredThickness(NamedTuple):
    """The SliceThickness of a SEG whose source images leave theirs empty (or give one that
    cannot be a length: 0, NaN, 1e300), in mm, and what
    it was taken from: ``"SpacingBetweenSlices"`` or ``"slice positions"`` (the median step
    between neighbouring slices of a regular stack)."""

    mm: float
    source: str
    #: what the source images' SliceThickness is: "empty", or "not a length in mm" (0, NaN, 1e300)
    given: str = "empty"

    def note(self) -> str:
        """What the batch's manifest and report say of it."""
        where = ("SpacingBetweenSlices" if self.source == "SpacingBetweenSlices"
                 else "the step between neighbouring slice positions")
        return (f"SEG SliceThickness {self.mm:g} mm inferred from {where}: "
                f"the source images' SliceThickness is {self.given}")


def inferred_slice_thickness(results: Sequence[FrameResult]) -> InferredThickness | None:
    """The SliceThickness a SEG of ``results`` (one :func:`split_for_seg` group) carries
    where none of its source images has one (single-frame images in patient coordinates
    whose SliceThickness is empty or absent): their SpacingBetweenSlices when they agree on
    a positive one, else the step between neighbouring slice positions when they form a
    regular stack (:func:`medrt.io.series.regular_step`). None where an image carries its
    own (nothing to infer; one lacking it among others is :func:`seg_left_out`), for other
    sources, or where nothing can be inferred (a lone slice without SpacingBetweenSlices,
    uneven steps): :func:`build_seg` then says why there is no SEG."""
    headers = [r.frame.source.dataset for r in results]
    if not headers:
        return None
    if any(r.frame.source.number_of_frames != 1 for r in results):
        # one enhanced object: its frames' Pixel Measures hold the SliceThickness
        objects = {r.frame.sop_instance_uid for r in results}
        if len(objects) > 1 or not _in_patient_coordinates(headers[0]):
            return None
        headers = [m if m is not None else Dataset() for m in _frame_measures(headers[0])]
        if any(spacing_is_believable(m, "SliceThickness") for m in headers):
            return None
    elif not all(lacks_slice_thickness(ds) for ds in headers):
        return None
    said = "empty" if all(spacing_is_believable(ds, "SliceThickness") is None for ds in headers) else (
        "not a length in mm")
    given = [v for ds in headers if (v := believable_mm(ds.get("SpacingBetweenSlices"), MAX_SLICE_THICKNESS_MM))]
    if given and max(given) - min(given) <= 1e-3 * max(given):
        return InferredThickness(round(float(np.median(given)), 4), "SpacingBetweenSlices", said)
    positions = [along_normal(r.frame) for r in results]
    step = regular_step([p for p in positions if p is not None]) if None not in positions else None
    return None if step is None else InferredThickness(round(step, 4), "slice positions", said)


#: What a SEG copies from each frame's Pixel Measures of an enhanced multi-frame source.
_MEASURES = ("PixelSpacing", "SliceThickness")


def _frame_measures(ds: Dataset) -> list[Dataset | None]:
    """Each frame's Pixel Measures of a multi-frame ``ds``, attribute by attribute its own,
    else the shared one's (:func:`medrt.io.header.pixel_measures_item`: the measures the
    reader measured the frame with), None where neither has an item."""
    n = int(ds.get("NumberOfFrames") or 1)
    return [pixel_measures_item(ds, i) for i in range(n)]


def _frame_lacking(measures: Dataset | None, *, thickness_inferred: bool = False) -> list[str]:
    """What a frame whose Pixel Measures are ``measures`` lacks of :data:`_MEASURES`
    (absent, empty, or not a length in mm: :func:`_believable`)."""
    return [k for k in _MEASURES if (measures is None or spacing_is_believable(measures, k) is not True)
            and not (thickness_inferred and k == "SliceThickness")]


def _frames_lacking(ds: Dataset, *, thickness_inferred: bool = False) -> dict[int, list[str]]:
    """``{frame index: what it lacks}`` for the frames of a multi-frame source in patient
    coordinates whose Pixel Measures a SEG cannot copy ({} outside patient coordinates)."""
    if not _in_patient_coordinates(ds):
        return {}
    return {i: missing for i, m in enumerate(_frame_measures(ds))
            if (missing := _frame_lacking(m, thickness_inferred=thickness_inferred))}


def _frame_reason(ds: Dataset, index: int, missing: list[str], kept: int) -> str:
    """Why frame ``index`` of a multi-frame source is left out of its SEG (numbered from 1)."""
    measures = _frame_measures(ds)
    holder = measures[index] if measures[index] is not None else Dataset()
    return (f"frame {index + 1} of {len(measures)} of this multi-frame image has no {', '.join(missing)} "
            f"in its Pixel Measures{_unbelievable_note(holder, missing)}, which a SEG copies from its "
            f"source, while the other {kept} frame(s) carry them")


def _shared_measures(ds: Dataset, name: str, placed: list[int], *,
                     thickness_inferred: bool) -> hd.PixelMeasuresSequence:
    """The one Pixel Measures the ``placed`` frames of multi-frame ``ds`` share, for the
    SEG's shared functional groups (highdicom writes one for all frames). Frames whose
    PixelSpacing or SliceThickness differ (beyond 0.01 %) get no SEG: it must not claim one
    spacing for frames that have another (:class:`ExportError` naming ``name`` and the frames).
    SpacingBetweenSlices is kept where every frame gives the same one; highdicom computes it
    from the positions otherwise."""
    items = [m if m is not None else Dataset() for m in _frame_measures(ds)]
    keys = _MEASURES[:1] if thickness_inferred else _MEASURES
    values: list[tuple[tuple[float, ...], list[int]]] = []  # each set of values, with its frames
    for i in placed:
        these = tuple(float(v) for k in keys for v in dicom_values(items[i][k].value))
        known = next((frames for v, frames in values if np.allclose(these, v, rtol=1e-4, atol=0.0)), None)
        if known is None:
            values.append((these, [i + 1]))
        else:
            known.append(i + 1)
    if len(values) > 1:
        said = "; ".join(f"{_measures_text(v, keys)} on {frames_text(frames, len(items))}" for v, frames in values)
        raise ExportError(
            f'Argument "results": the frames of {name} differ in their Pixel Measures ({said}); a SEG built '
            "with highdicom carries one Pixel Measures for all its frames, which would be wrong for some: "
            "no SEG for this image (its SR and overlays keep each frame's own sizes)."
        )
    between = [believable_mm(items[i].get("SpacingBetweenSlices"), MAX_SLICE_THICKNESS_MM) for i in placed]
    first = items[placed[0]]
    return hd.PixelMeasuresSequence(
        pixel_spacing=[float(v) for v in first.PixelSpacing],
        slice_thickness=None if thickness_inferred else float(first.SliceThickness),
        spacing_between_slices=between[0] if None not in between and np.allclose(between, between[0], rtol=1e-4)
        else None,
    )


def _measures_text(values: tuple[float, ...], keys: tuple[str, ...]) -> str:
    spacing = "PixelSpacing " + "\\".join(f"{v:g}" for v in values[:2])
    return spacing if len(keys) == 1 else f"{spacing}, SliceThickness {values[2]:g}"


def _with_shared_measures(ds: Dataset, measures: hd.PixelMeasuresSequence) -> Dataset:
    """A shallow copy of ``ds`` whose shared functional groups hold ``measures``: highdicom
    0.28 reads a multi-frame source's Pixel Measures from its shared group only (an
    AttributeError where a scanner writes them per frame), and copies them into the SEG.
    The source is not changed: the copies hold its data elements themselves, so the two
    replaced are taken out first (assigning to one would set the source's value)."""
    shared = Dataset()
    if ds.get("SharedFunctionalGroupsSequence"):
        shared.update(ds.SharedFunctionalGroupsSequence[0])
    if "PixelMeasuresSequence" in shared:
        del shared.PixelMeasuresSequence
    shared.PixelMeasuresSequence = measures
    out = Dataset()
    out.update(ds)
    if "SharedFunctionalGroupsSequence" in out:
        del out.SharedFunctionalGroupsSequence
    out.SharedFunctionalGroupsSequence = [shared]
    return out


def _check_plane_attributes(results: list[FrameResult], headers: list[Dataset], *,
                            thickness_inferred: bool = False) -> None:
    """A single-frame source in patient coordinates (it has a Frame of Reference UID) must
    carry the attributes the SEG copies from it; say which are missing, and where."""
    for r, ds in zip(results, headers, strict=True):
        missing = _lacking(ds, thickness_inferred=thickness_inferred)
        if missing:
            why = ""
            if missing == ["SliceThickness"]:  # inferred_slice_thickness found nothing
                why = (" and none can be inferred (no SpacingBetweenSlices, and "
                       + ("a lone slice has no step to measure)" if len(results) == 1 else
                          "the slice positions are not a regular stack)"))
            why += _unbelievable_note(ds, missing)
            raise ExportError(
                f'Argument "results": {r.frame.source.path or r.frame.key} has a Frame of Reference UID but no '
                f"{', '.join(missing)}{why}, which a SEG copies from its source images into its Pixel Measures "
                "and plane positions; no SEG can be built for this series (its SR and overlays can)."
            )


def _layout(results: list[FrameResult], *, thickness_inferred: bool = False,
            ) -> tuple[list[Dataset], list[FrameResult], list[hd.PlanePositionSequence] | None]:
    """The source headers, the results in highdicom's frame order, and the plane positions
    of those frames where they are not all the source's (None: every frame).

    Single-frame images: one header per result, in the same order. One multi-frame
    image: its header once (with the Pixel Measures its frames share in its shared group,
    :func:`_with_shared_measures`), results in frame order, every frame needed but those
    whose Pixel Measures a SEG cannot copy (:func:`seg_left_out` names them), which must
    not be among ``results``.
    """
    objects = {r.frame.sop_instance_uid: r.frame.source for r in results}
    multi = [uid for uid, src in objects.items() if src.number_of_frames > 1]
    if not multi:
        _check_planes(results)
        headers = [_plane_header(r.frame.source.dataset) for r in results]
        _check_plane_attributes(results, headers, thickness_inferred=thickness_inferred)
        return headers, results, None
    if len(objects) > 1:
        raise ExportError(
            f'Argument "results" spans {len(objects)} objects, {len(multi)} of them multi-frame: '
            "a SEG derives from single-frame images or from one multi-frame image; "
            "build one SEG per multi-frame object."
        )
    src = objects[multi[0]]
    if "FrameOfReferenceUID" not in src.dataset:
        raise ExportError(
            f'Argument "results": the multi-frame source {multi[0]} has no Frame of Reference '
            "UID; highdicom places the frames of a multi-frame SEG only in patient coordinates. "
            "Export SR and SC for it instead."
        )
    by_index = {r.frame.frame_index: r for r in results}
    name = str(src.path or multi[0])
    n = src.number_of_frames
    lacking = _frames_lacking(src.dataset, thickness_inferred=thickness_inferred)
    if len(lacking) == n:
        said = sorted({k for missing in lacking.values() for k in missing})
        raise ExportError(
            f'Argument "results": {name} has a Frame of Reference UID but no frame with {" and ".join(said)} '
            "in its Pixel Measures (absent, or not a length in mm), which a SEG copies from its source; "
            "no SEG can be built for this image (its SR and overlays can)."
        )
    given = sorted(set(by_index) & set(lacking))
    if given:
        raise ExportError(
            f'Argument "results": {frames_text([i + 1 for i in given], n)} of {name} have no '
            f"{' or '.join(sorted({k for i in given for k in lacking[i]}))} a SEG can use in their Pixel "
            "Measures (absent, or not a length in mm), which it copies from its source; leave them out "
            "(split_for_seg does) to have a SEG of the other frames."
        )
    placed = [i for i in range(n) if i not in lacking]
    missing = sorted(set(placed) - set(by_index))
    if missing:
        raise ValueError(
            f'Argument "results" must cover every frame of the multi-frame source {multi[0]}: '
            f"{len(missing)} of {n} missing (first: frame index {missing[0]})."
        )
    header = readable_header(src.dataset)
    if _in_patient_coordinates(header):  # (a slide's header goes to highdicom as it is)
        header = _with_shared_measures(header, _shared_measures(header, name, placed,
                                                                thickness_inferred=thickness_inferred))
    positions = None
    if lacking:
        from highdicom.utils import get_plane_positions_of_image

        every = get_plane_positions_of_image(header)
        positions = [every[i] for i in placed]
    return [header], [by_index[i] for i in placed], positions


def _segments(results: list[FrameResult], linked: Linked) -> tuple[list[int], np.ndarray]:
    """The series lesions in ``results`` (sorted numbers: lesion ``lesions[k - 1]`` is segment
    k) and the (frames, rows, cols) map of segment numbers, 0 where no lesion is."""
    numbers = linked[1]
    lesions = sorted({numbers[(r.frame.key, les.label)] for r in results for les in r.lesions})
    segment = {n: k for k, n in enumerate(lesions, start=1)}
    dtype = np.uint8 if len(lesions) < 256 else np.uint16  # a 300-slice CT's map: 79 MB, not 157
    masks = np.zeros((len(results), *results[0].frame.shape), dtype)
    for i, r in enumerate(results):
        top = int(r.labels.max())
        if top == 0:
            continue
        lut = np.zeros(max([top, *(les.label for les in r.lesions)]) + 1, dtype)
        for les in r.lesions:
            lut[les.label] = segment[numbers[(r.frame.key, les.label)]]
        masks[i] = lut[r.labels]
        if np.count_nonzero(masks[i]) != np.count_nonzero(r.labels):
            raise ValueError(
                f'Argument "results": frame {r.frame.key} has label values without a lesion record; '
                "a SEG has one segment per lesion."
            )
    return lesions, masks


def build_seg(
    results: Sequence[FrameResult],
    *,
    linked: Linked | None = None,
    omit_empty_frames: bool | None = None,
    series_number: int = SEG_SERIES_NUMBER,
    series_instance_uid: str | None = None,
    sop_instance_uid: str | None = None,
    instance_number: int = 1,
    series_description: str = "medrt lesions (SEG)",
    compression: str = "none",
) -> hd.seg.Segmentation | None:
    """A BINARY Segmentation of the lesions in ``results``, frames of ONE series.

    The SEG sits in the source study in a new series (``series_instance_uid``,
    default a new UID; ``sop_instance_uid`` too: pass UIDs derived from the
    input to make a re-sent object replace the first copy in a PACS), with one
    segment per series lesion, "Lesion <n>", its Tracking UID the lesion's.
    ``linked`` is :func:`medrt.analysis.tracking.link_series` of the whole series
    (default: of ``results``; pass it when ``results`` is one :func:`split_for_seg`
    group, so lesions keep their series numbers). ``omit_empty_frames``: None keeps
    every frame when there is one segment and only the lesions' frames when there are
    several (see the module's notes). ``compression``: "none" (Explicit VR Little
    Endian) or "jpeg2000" (JPEG 2000 Lossless; uncompressed all the same for frames under
    32 pixels each way, which OpenJPEG cannot encode). Returns None when no frame holds a lesion
    (write no SEG; :func:`medrt.export.build_sr` then reports 0 lesions).

    Raises ValueError naming "results" when they are empty, mix series or
    studies, repeat a frame, lack their DICOM header, have label values without
    a lesion record, or leave out frames of a multi-frame source; naming "linked"
    when it lacks one of their lesions; :class:`ExportError` (a ValueError) when
    the source cannot carry a SEG (several multi-frame objects, a multi-frame object
    without a Frame of Reference, whose frames' Pixel Measures differ, or with frames
    :func:`seg_left_out` names among ``results``).
    """
    items = check_results(results)
    series = single_value(items, "series", lambda r: r.frame.series_instance_uid)
    if compression not in SEG_COMPRESSION:
        raise ValueError(f'Argument "compression" must be one of {", ".join(SEG_COMPRESSION)}, got {compression!r}.')
    if not isinstance(series_number, int) or series_number < 1:
        raise ValueError(f'Argument "series_number" must be a positive integer, got {series_number!r}.')
    if not any(r.labels.any() for r in items):
        log.info("no lesion in %d frames of series %s: no SEG", len(items), series)
        return None
    thickness = inferred_slice_thickness(items)
    sources, ordered, positions = _layout(items, thickness_inferred=thickness is not None)
    linked = linked_lesions(items, linked)
    lesions, masks = _segments(ordered, linked)
    uids = {les.number: les.uid for les in linked[0]}
    segments = [segment_description(items[0].models, k, n, uids[n]) for k, n in enumerate(lesions, start=1)]
    omit = len(segments) > 1 if omit_empty_frames is None else omit_empty_frames
    syntax = SEG_COMPRESSION[compression]
    if syntax == JPEG2000Lossless and max(items[0].frame.shape) < 32:  # OpenJPEG encodes nothing smaller
        log.info("series %s: frames of %s px are too small for JPEG 2000: SEG uncompressed", series,
                 "×".join(map(str, items[0].frame.shape)))
        syntax = ExplicitVRLittleEndian
    try:
        seg = _segmentation(sources, masks, segments, omit_empty_frames=omit, plane_positions=positions,
                            series_number=series_number, series_instance_uid=series_instance_uid,
                            sop_instance_uid=sop_instance_uid, instance_number=instance_number,
                            series_description=series_description,
                            transfer_syntax_uid=syntax)
    except ValueError as exc:  # highdicom's checks of the sources (geometry, sizes, classes)
        raise ExportError(f'Argument "results": highdicom cannot build a SEG of them: {exc}') from exc
    if thickness is not None:
        _with_slice_thickness(seg, thickness.mm)
        log.warning("series %s: the source images' SliceThickness is %s; SEG %s carries %g mm, inferred from %s",
                    series, thickness.given, seg.SOPInstanceUID, thickness.mm, thickness.source)
    log.info("SEG %s: %d frames, %d lesions (%d sections), source series %s", seg.SOPInstanceUID,
             int(seg.NumberOfFrames), len(segments), sum(len(r.lesions) for r in items), series)
    return seg


def _segmentation(sources: list[Dataset], masks: np.ndarray, segments: list[hd.seg.SegmentDescription], *,
                  omit_empty_frames: bool, plane_positions: list[hd.PlanePositionSequence] | None,
                  series_number: int, series_instance_uid: str | None,
                  sop_instance_uid: str | None, instance_number: int,
                  series_description: str, transfer_syntax_uid: str) -> hd.seg.Segmentation:
    seg = hd.seg.Segmentation(
        source_images=sources,
        pixel_array=masks,
        segmentation_type=hd.seg.SegmentationTypeValues.BINARY,
        segment_descriptions=segments,
        series_instance_uid=series_instance_uid or hd.UID(),
        series_number=series_number,
        sop_instance_uid=sop_instance_uid or hd.UID(),
        instance_number=instance_number,
        **device_identity(),
        content_label="LESIONS",
        content_description="Lesions found by medrt",
        series_description=series_description,
        omit_empty_frames=omit_empty_frames,
        transfer_syntax_uid=transfer_syntax_uid,
        # some frames of a multi-frame source left out: highdicom matches these to its frames
        plane_positions=plane_positions,
    )
    if "FrameOfReferenceUID" not in seg and "PatientOrientation" not in seg:
        # General Image: Patient Orientation is Type 2C when there is no patient
        # geometry (projection radiographs); copy the source's, or leave it empty.
        seg.PatientOrientation = sources[0].get("PatientOrientation", "")
    if "FrameOfReferenceUID" not in seg:
        _without_pixel_measures(seg)
    return seg


def _without_pixel_measures(seg: hd.seg.Segmentation) -> None:
    """A radiograph that carries PixelSpacing (many DX/CR vendors write it): highdicom
    copies it into the shared Pixel Measures without a SliceThickness, which a projection
    image has none of. Legal there (the macro is required only with a Frame of Reference,
    CP 1426), but highdicom's own reader, and so ``medrt eval --seg`` and the viewer,
    refused the SEG. Without a Frame of Reference the frames map pixel for pixel onto
    their source images, which keep the spacing: the macro goes."""
    for group in seg.get("SharedFunctionalGroupsSequence", []):
        measures = group.get("PixelMeasuresSequence")
        if measures and all("SliceThickness" not in m for m in measures):
            del group.PixelMeasuresSequence


def _with_slice_thickness(seg: hd.seg.Segmentation, mm: float) -> None:
    """The shared Pixel Measures of ``seg`` with SliceThickness ``mm`` (Type 1C there: the
    SEG has a Frame of Reference). highdicom builds them from the first source image and
    keeps those over a ``pixel_measures`` argument whose PixelSpacing matches it, so the
    macro is made again here, with highdicom's class, from what it wrote and ``mm``."""
    for group in seg.get("SharedFunctionalGroupsSequence", []):
        if group.get("PixelMeasuresSequence"):
            item = group.PixelMeasuresSequence[0]
            group.PixelMeasuresSequence = hd.PixelMeasuresSequence(
                pixel_spacing=[float(v) for v in item.PixelSpacing], slice_thickness=mm,
                spacing_between_slices=finite_float(item.get("SpacingBetweenSlices")),
            )


def split_for_seg(results: Sequence[FrameResult]) -> list[list[FrameResult]]:
    """``results`` of one series cut into the groups one SEG each can hold, in first-seen order.

    Single-frame images in patient coordinates share a SEG per (Frame of
    Reference, image size, and whole acquisition where a series holds several at the same
    slice positions); every other object (a radiograph without patient
    geometry, a multi-frame image) gets its own, because highdicom relates SEG
    frames to such sources only one object at a time. A multi-frame object
    without a Frame of Reference still cannot have a SEG (:func:`build_seg` says so).
    Images :func:`seg_left_out` names are in no group (a warning says so).
    """
    return plan_segs(results).groups


def seg_left_out(results: Sequence[FrameResult]) -> dict[str, str]:
    """``{frame key: reason}``: the images of ``results`` that no SEG can carry while the
    rest of their group can, which :func:`split_for_seg` leaves out.

    That is a single-frame image with a Frame of Reference UID lacking an attribute a
    SEG copies from its sources (ImagePositionPatient, ImageOrientationPatient,
    PixelSpacing, SliceThickness) while another image of its group carries them all: a
    damaged or hand-edited slice; or a frame of an enhanced multi-frame object whose
    Pixel Measures lack PixelSpacing or SliceThickness (or give one that is not a length)
    while other frames' have them. One such slice used to cost the whole series its SEG;
    now the SEG covers the rest, and the caller reports the one left out (its lesions
    stay in the SR, located by their outline on that image). Where no image of a group
    carries them, nothing is left out and :func:`build_seg` says why there is no SEG.
    """
    return _plan(results).left_out


class SegPlan(NamedTuple):
    """How the SEGs of one series' results are laid out: ``groups`` (:func:`split_for_seg`),
    ``left_out`` (:func:`seg_left_out`) and ``thickness``, ``{SOP Instance UID:
    InferredThickness}`` for the images of groups whose SEG carries an
    :func:`inferred_slice_thickness` (their own is empty), which the SR's Image Library
    describes them with."""

    groups: list[list[FrameResult]]
    left_out: dict[str, str]
    thickness: dict[str, InferredThickness]


def plan_segs(results: Sequence[FrameResult], *, warn: bool = True) -> SegPlan:
    """:func:`split_for_seg`, :func:`seg_left_out` and the inferred thicknesses in one pass,
    for a caller that needs more than one of them (the batch's series outputs): each walks
    every image's header, 0.1 s a time for a 1,200-slice series. ``warn``: a warning names
    each image left out (as :func:`split_for_seg` does)."""
    plan = _plan(results)
    for key, reason in plan.left_out.items() if warn else ():
        log.warning("SEG: image %s left out: %s", key, reason)
    return plan


def _plan(results: Sequence[FrameResult]) -> SegPlan:
    items = check_results(results)
    single_value(items, "series", lambda r: r.frame.series_instance_uid)
    groups: dict[tuple[str, ...], list[FrameResult]] = {}
    for r in items:
        f = r.frame
        if f.source.number_of_frames == 1 and "FrameOfReferenceUID" in f.source.dataset:
            key: tuple[str, ...] = ("plane", str(f.source.dataset.FrameOfReferenceUID), str(f.shape))
        else:
            key = ("object", f.sop_instance_uid)
        groups.setdefault(key, []).append(r)
    left_out: dict[str, str] = {}
    kept: list[list[FrameResult]] = []
    thickness: dict[str, InferredThickness] = {}
    for group in _by_stack(groups.values()):
        inferred = inferred_slice_thickness(group)  # every image's is empty: not damaged
        if inferred is not None:
            thickness.update((r.frame.sop_instance_uid, inferred) for r in group)
        src = group[0].frame.source
        if src.number_of_frames > 1:  # one enhanced object: its frames' own Pixel Measures
            frames = _frames_lacking(src.dataset, thickness_inferred=inferred is not None)
            if frames and len(frames) < src.number_of_frames:
                for r in group:
                    if r.frame.frame_index in frames:
                        left_out[r.frame.key] = _frame_reason(src.dataset, r.frame.frame_index,
                                                              frames[r.frame.frame_index],
                                                              src.number_of_frames - len(frames))
                kept.append([r for r in group if r.frame.key not in left_out])
            else:
                kept.append(group)
            continue
        lacking = {r.frame.key: missing for r in group
                   if (missing := _lacking(r.frame.source.dataset, thickness_inferred=inferred is not None))}
        if not lacking or len(lacking) == len(group):
            kept.append(group)
            continue
        for key, missing in lacking.items():
            ds = next(r.frame.source.dataset for r in group if r.frame.key == key)
            left_out[key] = (f"it has a Frame of Reference UID but no {', '.join(missing)}"
                             f"{_unbelievable_note(ds, missing)}, which a SEG copies "
                             f"from its source images, while the other {len(group) - len(lacking)} image(s) "
                             "of its series carry them")
        kept.append([r for r in group if r.frame.key not in lacking])
    return SegPlan(kept, left_out, thickness)


def _by_stack(groups: Iterable[list[FrameResult]]) -> list[list[FrameResult]]:
    """``groups`` with each of several whole acquisitions at the same slice positions (a pre-
    and a post-contrast pass in one series: :func:`medrt.analysis.slices.frame_stacks`) a
    group of its own, lower AcquisitionNumber first: one SEG holds one image per plane."""
    out: list[list[FrameResult]] = []
    for group in groups:
        stacks = frame_stacks([r.frame for r in group])
        out += [group] if stacks is None else [[group[i] for i in part] for part in in_stacks(group, stacks)]
    return out


def seg_frame_numbers(seg: Dataset) -> dict[tuple[str, int | None, int], int]:
    """``{(source SOPInstanceUID, source frame number or None, segment number): SEG frame
    number}`` for the frames of ``seg`` (from its Derivation Image Sequence)."""
    out: dict[tuple[str, int | None, int], int] = {}
    shared = seg.get("SharedFunctionalGroupsSequence") or [Dataset()]
    for n, item in enumerate(seg.PerFrameFunctionalGroupsSequence, start=1):
        # With one segment highdicom puts its identification in the shared functional groups.
        ident = item.get("SegmentIdentificationSequence") or shared[0].SegmentIdentificationSequence
        segment = int(ident[0].ReferencedSegmentNumber)
        for derivation in item.get("DerivationImageSequence", []):
            for src in derivation.get("SourceImageSequence", []):
                uid = str(src.ReferencedSOPInstanceUID)
                frames = src.get("ReferencedFrameNumber")
                if frames in (None, ""):
                    out[(uid, None, segment)] = n
                    continue
                for frame in frames if isinstance(frames, (list, MultiValue)) else [frames]:
                    out[(uid, int(frame), segment)] = n
    return out


def segment_numbers(seg: Dataset) -> dict[str, int]:
    """``{Tracking UID: segment number}`` for the segments of ``seg`` that have one."""
    return {str(d.TrackingUID): int(d.SegmentNumber) for d in seg.SegmentSequence if "TrackingUID" in d}
