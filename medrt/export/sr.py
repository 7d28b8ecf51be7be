"""TID 1500 Measurement Report (Comprehensive 3D SR) of the lesions medrt found.

The document holds, under "Imaging Measurements":

- one **Planar ROI group** (TID 1410) per lesion section (a lesion on one frame):
  tracking identifier ``Lesion <n>`` with the lesion's Tracking UID, finding Lesion,
  the area (SCT Area, mm², UCUM ``mm2``) and the longest diameter (SCT Long axis, mm),
  each measured by medrt's :class:`highdicom.sr.AlgorithmIdentification`. The
  sections of one lesion on neighbouring CT slices (:func:`medrt.analysis.tracking.
  link_series`) share its number and Tracking Unique Identifier (DCM 112040), which is how
  a TID 1500 report says "the same lesion". The
  ROI is the lesion's SEG frame ("Referenced Segmentation Frame": the frame of the
  lesion's segment, found by its Tracking UID, derived from the lesion's image) when
  ``seg`` is given and derives from that image, else its outline (its bounding box where it
  has none: a hole, parts touching at a corner) as a closed polyline on the source image
  (a slice :func:`medrt.export.seg_left_out` names is in no SEG). A
  SEG frame names its segment, so the reference carries the frame number and no
  segment number (the Image SOP Instance Reference Macro allows only one of the two;
  dciodvfy enforces it, highdicom writes both).
- one **lesion group** per lesion of a CT series (slice positions and mm known): the
  same tracking identifier and UID, its longest diameter over its sections and its
  volume (SCT Volume, mm³: section areas times the slice spacing); with a SEG that
  covers every section a Volumetric ROI group (TID 1411) whose ROI is the lesion's whole
  segment, else a Measurement group (TID 1501) with its sections' images as source images.
- one **summary group** (TID 1501): "Number of lesions" (each lesion once) over every evaluated
  image, listed as its source images, so frames without a lesion still appear as
  evaluated, and a negative study gets an SR that says 0 lesions.

The Image Library lists every evaluated image; those with lesions carry their
descriptors (geometry, spacing, size: TID 1602, optional), the others do not, which
keeps a long series' SR small and quick to build (:func:`_image_library`); a CT slice whose
SliceThickness is empty is described with the thickness its SEG infers
(:func:`medrt.export.seg.inferred_slice_thickness`). When the pixel spacing of a frame
is unknown, its lesions are measured in pixels (unit ``{pixels}``: the pixel
count for the area, pixel widths for the diameter); no mm value is invented.
Sizes from ImagerPixelSpacing (DX, CR) are at the detector plane, or at the patient
plane where the radiograph gives its Estimated Radiographic Magnification Factor
(:func:`medrt.io.header.pixel_spacing`), as in the Lesion records.

**Where a radiograph's mm were measured.** Each mm value (TID 300) measured with a
projection radiograph's spacing carries (:func:`calibration_method`, :func:`_calibrated`):

- a concept modifier (DCM 122422, "Calibration Method"), the name/value pair PS3.16 TID
  3205 (Calibration) gives it, valued from CID 3452 "Calibration Method": (DCM 122487,
  "Geometric Non-Isocenter") for ImagerPixelSpacing / ERMF and for PixelSpacing of type
  GEOMETRY (magnification corrected by geometry, at the object's estimated depth, PS3.3
  10.7.1.2, C.8.11.7), (DCM 122488, "Calibration Object Used") for FIDUCIAL. CID 3452 has
  no "not calibrated", so a size at the detector (ImagerPixelSpacing alone; also an RT
  Image's receptor plane and scanned film) says (SCT 260413007, "None"), and a PixelSpacing
  whose calibration the header does not give by a type PS3.3 defines says (SCT
  261665006, "Unknown"): the two general SCT values DICOM value sets use;
- the pixel spacing the value was computed with, as derivation parameters (TID 300's
  INFERRED FROM NUM; Horizontal / Vertical Pixel Spacing, DCM 111026 / 111066, in
  mm/{pixel}, as TID 3205 rows 9-10 give a calibration's result).

Rejected: the TID 300 "Measurement Method" (SCT 370129005), which highdicom documents
with CID 6147 Response Criteria (RECIST, WHO), where a reader would look for those; a
private code; a unit such as "mm at detector" (UCUM has none, and a viewer would not
convert it). We found no convention elsewhere to follow: no code in a standard CID for
"at the detector plane", and no ERMF or detector mark in the SR that OHIF writes (dcmjs
keeps only a user's own calibration, as a separate "Calibration Ruler" measurement, SCT
102304005), though Cornerstone/OHIF mark the same cases on screen ("ERMF", "Calibrated").

The Image Library (TID 1603) keeps the header's ImagerPixelSpacing for a radiograph also
when the measurement used a corrected spacing: that is right, not a mismatch, since PS3.16
defines Horizontal/Vertical Pixel Spacing (Annex D, DCM 111026/111066) for projection
radiography at the front plane of the image receptor (DCMTK's TID 1600 code and highdicom fill them the same way); the
measurement's own derivation parameters say which spacing it used. CT and MR SRs (spacing
in the patient) and sizes in pixels get none of these items.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import highdicom as hd
import numpy as np
from pydicom.dataset import Dataset
from pydicom.sr.codedict import codes
from pydicom.sr.coding import Code

from medrt.analysis.tracking import Linked, SeriesLesion
from medrt.export.common import (
    AI_FAMILY,
    DEVICE_SERIAL_NUMBER,
    DEVICE_UID,
    MANUFACTURER,
    MODEL_NAME,
    SR_SERIES_NUMBER,
    algorithm_parts,
    check_results,
    device_identity,
    frame_number,
    linked_lesions,
    readable_header,
)
from medrt.export.seg import (
    InferredThickness,
    SegPlan,
    lacks_slice_thickness,
    plan_segs,
    seg_frame_numbers,
    segment_numbers,
)
from medrt.io.seg import SEG_SOP_CLASSES
from medrt.types import Frame, FrameResult, Lesion, SpacingSource

__all__ = ["build_sr", "calibration_method", "PIXELS", "COUNT", "CALIBRATION_METHOD"]

log = logging.getLogger(__name__)

PIXELS = Code("{pixels}", "UCUM", "pixels")
COUNT = Code("1", "UCUM", "no units")
_PROCEDURES = {
    "CT": codes.LN.CTUnspecifiedBodyRegion,
    "MR": codes.LN.MRIUnspecifiedBodyRegion,
}


def _algorithm(models: Sequence[str]) -> hd.sr.AlgorithmIdentification:
    name, version, params = algorithm_parts(models)
    return hd.sr.AlgorithmIdentification(
        name=name, version=version, parameters=[f"{k}@{v}" for k, v in params.items()] or None,
        family=AI_FAMILY, manufacturer=MANUFACTURER,
    )


def _observation_context() -> hd.sr.ObservationContext:
    device = hd.sr.DeviceObserverIdentifyingAttributes(
        uid=DEVICE_UID, name=MODEL_NAME, manufacturer_name=MANUFACTURER, model_name=MODEL_NAME,
        serial_number=DEVICE_SERIAL_NUMBER,
    )
    return hd.sr.ObservationContext(
        observer_device_context=hd.sr.ObserverContext(
            observer_type=codes.DCM.Device, observer_identifying_attributes=device
        )
    )


def _frames_of(frame: Frame) -> list[int] | None:
    n = frame_number(frame)
    return None if n is None else [n]


def outline(mask: np.ndarray) -> np.ndarray | None:
    """The outer boundary of ``mask`` (one 4-connected region) along its pixels' edges, as
    a closed polyline of (column, row) corners, (0, 0) the top-left corner of pixel (0, 0),
    collinear corners dropped: the polygon encloses exactly the mask's pixels, so the area
    a viewer measures on it is the area reported. None where that is not so (a region
    with holes or of several parts): the caller falls back to the bounding box.

    Hand-written (a crack-following trace of ~30 lines): the core's dependencies have no
    polygon extraction (SciPy labels regions, SimpleITK draws contour images, and
    scikit-image's find_contours gives sub-pixel iso-lines, not pixel edges)."""
    padded = np.pad(mask.astype(bool), 1)
    nxt: dict[tuple[int, int], tuple[int, int]] = {}
    edges = 0
    rows, cols = np.nonzero(padded[1:-1, 1:-1])
    for r, c in zip(rows.tolist(), cols.tolist(), strict=True):
        pr, pc = r + 1, c + 1  # in padded
        for free, a, b in ((not padded[pr - 1, pc], (c, r), (c + 1, r)),  # top edge, left to right:
                           (not padded[pr, pc + 1], (c + 1, r), (c + 1, r + 1)),  # clockwise on screen
                           (not padded[pr + 1, pc], (c + 1, r + 1), (c, r + 1)),
                           (not padded[pr, pc - 1], (c, r + 1), (c, r))):
            if free:
                nxt[a] = b
                edges += 1
    if not nxt or len(nxt) != edges:
        return None  # none, or two edges leave one corner (parts touching at a corner)
    start = min(nxt, key=lambda p: (p[1], p[0]))  # the top-left corner is on the outer boundary
    loop = [start]
    point = nxt[start]
    while point != start:
        loop.append(point)
        point = nxt.get(point)  # type: ignore[assignment]
        if point is None or len(loop) > edges:
            return None
    if len(loop) != len(nxt):
        return None  # edges left over: holes or more parts
    corners = [p for i, p in enumerate(loop)
               if (p[0] - loop[i - 1][0]) * (loop[(i + 1) % len(loop)][1] - p[1])
               != (p[1] - loop[i - 1][1]) * (loop[(i + 1) % len(loop)][0] - p[0])]  # turns only
    return np.array([*corners, corners[0]], dtype=np.float32)


def _region(frame: Frame, lesion: Lesion, labels: np.ndarray | None = None) -> hd.sr.ImageRegion:
    """The lesion's outline (:func:`outline`, from ``labels``, the frame's label map) as a
    closed polyline in image coordinates (column, row), (0, 0) the top-left corner of the
    top-left pixel; its bounding box where it has no single outline. The box alone, drawn
    before, enclosed 1.3-1.5 times the area the SR reports."""
    r0, c0, r1, c1 = lesion.bbox
    traced = outline(labels[r0:r1, c0:c1] == lesion.label) if labels is not None else None
    if traced is not None:
        corners = traced + np.array([c0, r0], dtype=np.float32)
    else:
        corners = np.array([[c0, r0], [c1, r0], [c1, r1], [c0, r1], [c0, r0]], dtype=np.float32)
    return hd.sr.ImageRegion(
        graphic_type=hd.sr.GraphicTypeValues.POLYLINE,
        graphic_data=corners,
        source_image=hd.sr.SourceImageForRegion(
            referenced_sop_class_uid=frame.sop_class_uid,
            referenced_sop_instance_uid=frame.sop_instance_uid,
            referenced_frame_numbers=_frames_of(frame),
        ),
    )


def _segment_ref(frames: SegFrames, frame: Frame, lesion: SeriesLesion) -> hd.sr.ReferencedSegmentationFrame:
    """The SEG frame of ``lesion``'s segment that derives from ``frame``, built directly
    (highdicom's ``from_segmentation`` fails on 1-frame SEGs)."""
    key = (frame.sop_instance_uid, frame_number(frame), lesion.uid)
    if key not in frames:
        raise ValueError(f'Argument "seg" has no frame of Lesion {lesion.number} derived from {frame.key}.')
    seg, number, segment = frames[key]
    ref = hd.sr.ReferencedSegmentationFrame(
        sop_class_uid=seg.SOPClassUID,
        sop_instance_uid=seg.SOPInstanceUID,
        frame_number=number,
        segment_number=segment,
        source_image=hd.sr.SourceImageForSegmentation(
            referenced_sop_class_uid=frame.sop_class_uid,
            referenced_sop_instance_uid=frame.sop_instance_uid,
            referenced_frame_numbers=_frames_of(frame),
        ),
    )
    # A SEG frame belongs to exactly one segment, and the Image SOP Instance Reference
    # Macro allows Referenced Segment Number only without Referenced Frame Number
    # (dciodvfy: "shall not be present"); highdicom writes both, so the frame stays.
    del ref[0].ReferencedSOPSequence[0].ReferencedSegmentNumber
    return ref


#: Concept name of the modifier saying how a radiograph's mm were calibrated (TID 3205 row 6).
CALIBRATION_METHOD = Code("122422", "DCM", "Calibration Method")
#: Its values: CID 3452 "Calibration Method", and SCT "None" / "Unknown" where it has none.
GEOMETRIC_NON_ISOCENTER = Code("122487", "DCM", "Geometric Non-Isocenter")
CALIBRATION_OBJECT_USED = Code("122488", "DCM", "Calibration Object Used")
NO_CALIBRATION = Code("260413007", "SCT", "None")
UNKNOWN_CALIBRATION = Code("261665006", "SCT", "Unknown")
MM_PER_PIXEL = Code("mm/{pixel}", "UCUM", "mm/pixel")  # TID 3205's unit for a spacing used
_CALIBRATIONS = {
    SpacingSource.IMAGER_PIXEL_SPACING: NO_CALIBRATION,  # at the detector
    SpacingSource.IMAGE_PLANE: NO_CALIBRATION,  # RT Image: at the receptor
    SpacingSource.NOMINAL_SCANNED: NO_CALIBRATION,  # scanned film: at the film
    SpacingSource.ERMF: GEOMETRIC_NON_ISOCENTER,
    SpacingSource.GEOMETRY: GEOMETRIC_NON_ISOCENTER,
    SpacingSource.CALIBRATED: CALIBRATION_OBJECT_USED,  # FIDUCIAL; see calibration_method
    SpacingSource.UNKNOWN_CALIBRATION: UNKNOWN_CALIBRATION,
}


def calibration_method(frame: Frame) -> Code | None:
    """How a projection radiograph's mm were obtained, as a CID 3452 Calibration Method
    (or SCT None / Unknown); None for an image whose pixel spacing is in the patient (CT,
    MR) or unknown, whose SR items stay as they were. A PixelSpacing calibrated another way
    than the two types PS3.3 10.7.1.2 defines (a description alone) is Unknown: only
    FIDUCIAL says an object of known size was used."""
    method = _CALIBRATIONS.get(frame.spacing_source)
    if method is CALIBRATION_OBJECT_USED and str(
            frame.source.dataset.get("PixelSpacingCalibrationType", "") or "").strip().upper() != "FIDUCIAL":
        return UNKNOWN_CALIBRATION
    return method


def _calibrated(measurement: hd.sr.Measurement, frame: Frame, method: Code) -> hd.sr.Measurement:
    """``measurement`` (TID 300) with where it was taken: a Calibration Method concept
    modifier (row 2, $ModType/$ModValue) and the pixel spacing it used as derivation
    parameters (INFERRED FROM, Horizontal/Vertical Pixel Spacing in mm/pixel, as TID 3205
    gives a calibration's result)."""
    row, col = frame.spacing_mm  # type: ignore[misc]
    num = measurement[0]
    num.ContentSequence.insert(0, hd.sr.CodeContentItem(
        name=CALIBRATION_METHOD, value=method, relationship_type=hd.sr.RelationshipTypeValues.HAS_CONCEPT_MOD))
    for name, value in ((codes.DCM.HorizontalPixelSpacing, col), (codes.DCM.VerticalPixelSpacing, row)):
        num.ContentSequence.append(hd.sr.NumContentItem(
            name=name, value=float(value), unit=MM_PER_PIXEL,
            relationship_type=hd.sr.RelationshipTypeValues.INFERRED_FROM))
    return measurement


def _measurements(frame: Frame, lesion: Lesion,
                  algorithm: hd.sr.AlgorithmIdentification) -> list[hd.sr.Measurement]:
    mm = frame.spacing_mm is not None
    measurements = [
        hd.sr.Measurement(
            name=codes.SCT.Area, value=float(lesion.area_mm2),
            unit=codes.UCUM.SquareMillimeter if mm else PIXELS, algorithm_id=algorithm,
        ),
        hd.sr.Measurement(
            name=codes.SCT.LongAxis, value=float(lesion.diameter_mm),
            unit=codes.UCUM.Millimeter if mm else PIXELS, algorithm_id=algorithm,
        ),
    ]
    method = calibration_method(frame) if mm else None
    return [_calibrated(m, frame, method) for m in measurements] if method is not None else measurements


def _evaluated(items: list[FrameResult]) -> list[hd.sr.SourceImageForMeasurementGroup]:
    """One source-image item per evaluated object, naming its evaluated frames if multi-frame."""
    frames: dict[str, list[FrameResult]] = {}
    for r in items:
        frames.setdefault(r.frame.sop_instance_uid, []).append(r)
    out = []
    for uid, rs in frames.items():
        numbers = sorted(n for r in rs if (n := frame_number(r.frame)) is not None)
        out.append(hd.sr.SourceImageForMeasurementGroup(
            referenced_sop_class_uid=rs[0].frame.sop_class_uid,
            referenced_sop_instance_uid=uid,
            referenced_frame_numbers=numbers or None,
        ))
    return out


#: ``{(source SOPInstanceUID, source frame number or None, lesion Tracking UID):
#: (SEG, SEG frame number, segment number)}``
SegFrames = dict[tuple[str, int | None, str], tuple[Dataset, int, int]]


def _check_segs(seg: Dataset | Sequence[Dataset] | None, study: str) -> tuple[list[Dataset], SegFrames]:
    """The SEGs given and the frame of each lesion's segment on each source frame."""
    if seg is None:
        return [], {}
    segs = [seg] if isinstance(seg, Dataset) else list(seg)
    frames: SegFrames = {}
    for s in segs:
        if not isinstance(s, Dataset) or str(s.get("SOPClassUID", "")) not in SEG_SOP_CLASSES:
            raise ValueError(
                'Argument "seg" must be a Segmentation (e.g. from build_seg), a sequence of them, '
                "or None."
            )
        if str(s.StudyInstanceUID) != study:
            raise ValueError('Argument "seg" belongs to another study than "results".')
        lesion = {k: uid for uid, k in segment_numbers(s).items()}
        frames.update({(uid, at, lesion[k]): (s, n, k)
                       for (uid, at, k), n in seg_frame_numbers(s).items() if k in lesion})
    return segs, frames


def _segments_of(frames: SegFrames) -> dict[str, tuple[Dataset, int]]:
    """``{lesion Tracking UID: (SEG, segment number)}`` for the lesions whose sections are all
    in one SEG (a CT lesion always is: its slices share a Frame of Reference and size)."""
    found: dict[str, set[tuple[str, int]]] = {}
    segs: dict[str, Dataset] = {}
    for (_, _, uid), (seg, _, segment) in frames.items():
        found.setdefault(uid, set()).add((seg.SOPInstanceUID, segment))
        segs[seg.SOPInstanceUID] = seg
    return {uid: (segs[sop], segment) for uid, places in found.items() if len(places) == 1
            for sop, segment in places}


def _volume_group(les: SeriesLesion, by_frame: dict[str, Frame], algorithm: hd.sr.AlgorithmIdentification,
                  segment: tuple[Dataset, int] | None) -> object:
    """A CT lesion as a whole: its longest diameter and volume, as a Volumetric ROI group
    (TID 1411) on its SEG segment, or without a SEG a Measurement group (TID 1501) on its
    sections' images."""
    common = dict(
        tracking_identifier=hd.sr.TrackingIdentifier(uid=les.uid, identifier=f"Lesion {les.number}"),
        finding_type=codes.SCT.Lesion,
        finding_category=codes.SCT.MorphologicallyAbnormalStructure,
        algorithm_id=algorithm,
        measurements=[
            hd.sr.Measurement(name=codes.SCT.LongAxis, value=float(les.diameter_mm),
                              unit=codes.UCUM.Millimeter, algorithm_id=algorithm),
            hd.sr.Measurement(name=codes.SCT.Volume, value=float(les.volume_mm3),  # type: ignore[arg-type]
                              unit=codes.UCUM.CubicMillimeter, algorithm_id=algorithm),
        ],
    )
    frames = [by_frame[s.key] for s in les.sections]
    if segment is None:
        return hd.sr.MeasurementsAndQualitativeEvaluations(source_images=[hd.sr.SourceImageForMeasurementGroup(
            referenced_sop_class_uid=f.sop_class_uid, referenced_sop_instance_uid=f.sop_instance_uid,
            referenced_frame_numbers=_frames_of(f)) for f in frames], **common)
    seg, number = segment
    return hd.sr.VolumetricROIMeasurementsAndQualitativeEvaluations(
        referenced_segment=hd.sr.ReferencedSegment(
            sop_class_uid=seg.SOPClassUID, sop_instance_uid=seg.SOPInstanceUID, segment_number=number,
            source_images=[hd.sr.SourceImageForSegmentation(
                referenced_sop_class_uid=f.sop_class_uid, referenced_sop_instance_uid=f.sop_instance_uid,
                referenced_frame_numbers=_frames_of(f)) for f in frames],
        ),
        **common,
    )


_SOURCE = Code("260753009", "SCT", "Source")  # an Image Library entry (TID 1601), as highdicom names it
_CONTAINS = hd.sr.RelationshipTypeValues.CONTAINS


def _image_library(headers: list[Dataset], described: set[str],
                   thickness: Mapping[str, InferredThickness]) -> hd.sr.ContainerContentItem:
    """The Image Library (TID 1600): an entry (TID 1601) per evaluated image, grouped by
    modality and Frame of Reference, with the Image Library Entry Descriptors (TID 1602:
    geometry, spacing, size) for the images in ``described``, those the measurements are on.
    An image whose SliceThickness is empty (Type 2 in a CT) is described with the one its
    SEG carries, ``thickness`` (:func:`medrt.export.seg.inferred_slice_thickness`): the
    descriptors need one (TID 1604's Slice Thickness is mandatory), and without it such a
    series' lesion slices had none at all.

    highdicom's MeasurementReport would describe every image: 17 content items each, about
    4 s of a 160-slice series' SR (against 0.3 s without), for slices nothing in the
    report points at; the descriptors are optional (U) and the summary group lists each
    evaluated image anyway. An image highdicom cannot describe (an enhanced multi-frame
    header keeps its plane attributes in functional groups) gets an entry without them.
    """
    groups: dict[tuple[str, str], list[hd.sr.ImageContentItem]] = {}
    for ds in headers:
        entry = hd.sr.ImageContentItem(name=_SOURCE, referenced_sop_class_uid=ds.SOPClassUID,
                                       referenced_sop_instance_uid=ds.SOPInstanceUID, relationship_type=_CONTAINS)
        if ds.SOPInstanceUID in described:
            inferred = thickness.get(str(ds.SOPInstanceUID))
            try:
                descriptors = hd.sr.ImageLibraryEntryDescriptors(
                    ds if inferred is None else _with_thickness(ds, inferred.mm))
            except (AttributeError, KeyError, IndexError, TypeError, ValueError) as exc:
                log.debug("Image Library: %s without descriptors (%s)", ds.SOPInstanceUID, exc)
            else:
                entry.ContentSequence = hd.sr.ContentSequence(descriptors)
        key = (str(ds.get("Modality", "")), str(ds.get("FrameOfReferenceUID", "")))
        groups.setdefault(key, []).append(entry)
    library = hd.sr.ContainerContentItem(name=codes.DCM.ImageLibrary, relationship_type=_CONTAINS)
    library.ContentSequence = hd.sr.ContentSequence()
    for (_, frame_of_reference), entries in groups.items():
        group = hd.sr.ContainerContentItem(name=codes.DCM.ImageLibraryGroup, relationship_type=_CONTAINS)
        group.ContentSequence = hd.sr.ContentSequence()
        if frame_of_reference:
            group.ContentSequence.append(hd.sr.UIDRefContentItem(
                name=codes.DCM.FrameOfReferenceUID, value=frame_of_reference,
                relationship_type=hd.sr.RelationshipTypeValues.HAS_ACQ_CONTEXT))
        group.ContentSequence.extend(entries)
        library.ContentSequence.append(group)
    return library


_SLICE_THICKNESS = 0x00180050


def _with_thickness(ds: Dataset, mm: float) -> Dataset:
    """A copy of header ``ds`` (its elements shared, unparsed ones left unparsed) whose
    SliceThickness is ``mm``."""
    out = Dataset({tag: ds.get_item(tag) for tag in ds.keys() if tag != _SLICE_THICKNESS})
    out.SliceThickness = mm  # a new element: setting a shared one would change the source's header
    return out


def _report(groups: list[object], modality: str, library: hd.sr.ContainerContentItem) -> hd.sr.MeasurementReport:
    """The TID 1500 report, with ``library`` in its place: before Imaging Measurements."""
    report = hd.sr.MeasurementReport(
        observation_context=_observation_context(),
        procedure_reported=_PROCEDURES.get(modality, codes.SCT.ImagingProcedure),
        imaging_measurements=groups,  # type: ignore[arg-type]
        title=codes.cid7021.ImagingMeasurementReport,
    )
    content = report[0].ContentSequence
    at = next(i for i, item in enumerate(content)
              if item.ConceptNameCodeSequence[0].CodeValue == codes.DCM.ImagingMeasurements.value)
    content.insert(at, library)
    return report


def _references(item: Dataset) -> Iterator[str]:
    """The SOP Instance UIDs the IMAGE and COMPOSITE items under ``item`` refer to."""
    for child in item.get("ContentSequence", ()):
        if child.get("ValueType") in ("IMAGE", "COMPOSITE"):
            yield str(child.ReferencedSOPSequence[0].ReferencedSOPInstanceUID)
        yield from _references(child)


def _document(report: hd.sr.MeasurementReport, evidence: list[Dataset], **kwargs: Any) -> hd.sr.Comprehensive3DSR:
    """The Comprehensive 3D SR document of ``report`` (its Current Requested Procedure
    Evidence: ``evidence``), the same, element for element, as
    ``hd.sr.Comprehensive3DSR(evidence=evidence, content=report, **kwargs)``, but made
    without highdicom's copy of the content tree.

    highdicom deep-copies the content it is given, parses the copy back into content items
    (its ``content``), and walks the tree twice to check that every image it refers to is
    in the evidence: three passes over two items per evaluated image (its Image Library
    entry, its source image in the summary group), 0.7-0.9 s of a 500-slice series' 1.2 s
    SR, for a tree that is highdicom's own content items already. So the document is made
    from the report's root container alone (highdicom's patient, study, equipment and
    evidence modules as before: every evidence item is listed whether referenced or not),
    then given the report's tree itself; the evidence check is done here in one walk, and
    ``content`` is that tree."""
    root = report[0]
    listed = {str(ds.SOPInstanceUID) for ds in evidence}
    unlisted = sorted(set(_references(root)) - listed)
    if unlisted:  # highdicom's own check, made once here: a bug in the builders, not the input
        raise ValueError(f"SR content refers to images not in its evidence: {', '.join(unlisted)}")
    tree = root["ContentSequence"]
    shell = Dataset()
    for elem in root:
        if elem.tag != tree.tag:
            shell.add(elem)
    shell.ContentSequence = []
    sr = hd.sr.Comprehensive3DSR(evidence=evidence, content=shell, **kwargs)
    sr.add(tree)  # the same element the full constructor copies from the report's root
    sr._content = hd.sr.ContentSequence([root], is_root=True)  # what sr.content gives: the whole tree
    return sr


def _plan_of(items: list[FrameResult]) -> SegPlan:
    """:func:`medrt.export.plan_segs` of ``items``, series by series (an SR may cover
    several series of a study; a SEG covers one), its warnings left to the SEG's."""
    by_series: dict[str, list[FrameResult]] = {}
    for r in items:
        by_series.setdefault(r.frame.series_instance_uid, []).append(r)
    plans = [plan_segs(rs, warn=False) for rs in by_series.values()]
    return SegPlan([g for p in plans for g in p.groups], {k: v for p in plans for k, v in p.left_out.items()},
                   {k: v for p in plans for k, v in p.thickness.items()})


def build_sr(
    results: Sequence[FrameResult],
    *,
    seg: Dataset | Sequence[Dataset] | None = None,
    linked: Linked | None = None,
    series_number: int = SR_SERIES_NUMBER,
    series_instance_uid: str | None = None,
    sop_instance_uid: str | None = None,
    instance_number: int = 1,
    series_description: str = "medrt lesion measurements (SR)",
    previous_versions: Sequence[Dataset] = (),
    plan: SegPlan | None = None,
) -> hd.sr.Comprehensive3DSR:
    """A TID 1500 Measurement Report of every lesion in ``results`` (frames of one study).

    ``seg`` is the Segmentation of these results (:func:`medrt.export.build_seg`),
    a sequence of them (one per :func:`medrt.export.split_for_seg` group), or
    None: the ROI of each lesion is then its bounding box on the source image.
    ``linked`` is :func:`medrt.analysis.tracking.link_series` of the series (default:
    of ``results``), as given to :func:`medrt.export.build_seg`. The SR goes into a new series (``series_instance_uid``, default a new UID)
    of the source study and lists the SEGs as evidence; ``sop_instance_uid``
    defaults to a new UID. ``previous_versions`` are earlier SRs of these images that this
    one replaces (the series analysed again after more images came): listed in its
    Predecessor Documents Sequence, so a PACS or viewer can tell which is current; those
    of another study are left out (with a warning). ``plan`` is
    :func:`medrt.export.plan_segs` of ``results`` where the caller has it already (the
    batch, which laid out its SEGs with it): made here otherwise.

    Raises ValueError naming "results" (see :func:`medrt.export.common.check_results`),
    "linked" (lacking one of their lesions) or "seg" (not a SEG, another study, or
    missing a lesion's frame).
    """
    items = check_results(results)
    if not isinstance(series_number, int) or series_number < 1:
        raise ValueError(f'Argument "series_number" must be a positive integer, got {series_number!r}.')
    study = items[0].frame.study_instance_uid
    segs, seg_frames = _check_segs(seg, study)
    # images no SEG can carry (a slice without its position): located by their outline; and
    # the SliceThickness a SEG infers where the images leave theirs empty
    if plan is None and (segs or any(r.lesions and lacks_slice_thickness(r.frame.source.dataset) for r in items)):
        plan = _plan_of(items)
    left_out = plan.left_out if plan is not None and segs else {}
    thickness = plan.thickness if plan is not None else {}
    algorithm = _algorithm(items[0].models)
    series_lesions, numbers = linked_lesions(items, linked)
    by_number = {les.number: les for les in series_lesions}
    groups: list[object] = []
    for r in items:
        for lesion in r.lesions:
            les = by_number[numbers[(r.frame.key, lesion.label)]]
            ref = {"referenced_segment": _segment_ref(seg_frames, r.frame, les)} \
                if segs and r.frame.key not in left_out else {"referenced_region": _region(r.frame, lesion, r.labels)}
            groups.append(hd.sr.PlanarROIMeasurementsAndQualitativeEvaluations(
                tracking_identifier=hd.sr.TrackingIdentifier(uid=les.uid, identifier=f"Lesion {les.number}"),
                finding_type=codes.SCT.Lesion,
                finding_category=codes.SCT.MorphologicallyAbnormalStructure,
                algorithm_id=algorithm,
                measurements=_measurements(r.frame, lesion, algorithm),
                **ref,
            ))
    by_frame = {r.frame.key: r.frame for r in items}
    segments = _segments_of(seg_frames)
    groups += [_volume_group(les, by_frame, algorithm,
                             None if any(s.key in left_out for s in les.sections) else segments.get(les.uid))
               for les in series_lesions if les.volume_mm3 is not None]  # else its planar group says it all
    n_lesions = len(series_lesions)
    groups.append(hd.sr.MeasurementsAndQualitativeEvaluations(
        tracking_identifier=hd.sr.TrackingIdentifier(uid=hd.UID(), identifier="Lesion count"),
        finding_type=codes.SCT.Lesion,
        algorithm_id=algorithm,
        measurements=[hd.sr.Measurement(name=codes.SCT.NumberOfLesions, value=float(n_lesions),
                                        unit=COUNT, algorithm_id=algorithm)],
        source_images=_evaluated(items),
    ))
    headers = list({r.frame.sop_instance_uid: readable_header(r.frame.source.dataset) for r in items}.values())
    modality = items[0].frame.modality
    described = {r.frame.sop_instance_uid for r in items if r.lesions}
    report = _report(groups, modality, _image_library(headers, described, thickness))
    earlier = [p for p in previous_versions if str(p.get("StudyInstanceUID", "")) == study]
    if len(earlier) < len(previous_versions):
        log.warning("SR: %d earlier SR(s) of another study not listed as predecessors",
                    len(previous_versions) - len(earlier))
    sr = _document(
        report,
        evidence=headers + segs,
        series_instance_uid=series_instance_uid or hd.UID(),
        series_number=series_number,
        sop_instance_uid=sop_instance_uid or hd.UID(),
        instance_number=instance_number,
        **device_identity(),
        series_description=series_description,
        is_complete=True,
        previous_versions=earlier or None,
    )
    log.info("SR %s: %d lesion(s) (%d section(s)) in %d frames of study %s, SEG %s", sr.SOPInstanceUID, n_lesions,
             sum(len(r.lesions) for r in items), len(items), study, ", ".join(s.SOPInstanceUID for s in segs) or "none")
    return sr
