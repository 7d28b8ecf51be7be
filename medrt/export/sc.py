"""Secondary Capture images with the lesion overlay burned in, for viewers that cannot show SEG.

Each SC is :func:`medrt.overlay.render` of one frame (RGB, source resolution,
RLE lossless), in the source study, with BurnedInAnnotation "YES", the source
image in its Source Image Sequence and the patient orientation of the source
(derived from ImageOrientationPatient, or copied from PatientOrientation; empty
when unknown). PixelSpacing is copied only when it is patient-plane spacing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import highdicom as hd
import numpy as np
from pydicom.dataset import Dataset
from pydicom.uid import RLELossless

from medrt.export.common import (
    DEVICE_SERIAL_NUMBER,
    MANUFACTURER,
    MODEL_NAME,
    SC_SERIES_NUMBER,
    check_results,
    frame_number,
    readable_header,
    single_value,
    software_versions,
)
from medrt.overlay import render
from medrt.types import Frame, FrameResult, SpacingSource, Window

__all__ = ["build_sc", "build_sc_series", "patient_orientation"]

log = logging.getLogger(__name__)

_BIPED = frozenset("LRAPHF")
#: Spacings in the patient plane, which an SC may carry as PixelSpacing.
_PATIENT_SPACING = frozenset({SpacingSource.PIXEL_SPACING, SpacingSource.GEOMETRY, SpacingSource.CALIBRATED})


def _letters(vector: Sequence[float]) -> str:
    """Patient-orientation letters of a direction cosine, strongest axis first (e.g. "L", "LP")."""
    names = (("L", "R"), ("P", "A"), ("H", "F"))
    parts = sorted(((abs(v), names[i][0] if v > 0 else names[i][1]) for i, v in enumerate(vector)),
                   reverse=True)
    return "".join(letter for size, letter in parts if size > 1e-4)


def patient_orientation(frame: Frame) -> tuple[str, str] | None:
    """The (row, column) direction letters of ``frame``: from its geometry, else from the
    header's PatientOrientation; None when neither is known."""
    if frame.geometry is not None:
        o = frame.geometry.orientation
        return _letters(o[:3]), _letters(o[3:])
    value = frame.source.dataset.get("PatientOrientation")
    if value is not None and not isinstance(value, str) and len(value) == 2:
        a, b = str(value[0]), str(value[1])
        if a and b and set(a) <= _BIPED and set(b) <= _BIPED:
            return a, b
    return None


def _source_reference(frame: Frame) -> Dataset:
    item = Dataset()
    item.ReferencedSOPClassUID = frame.sop_class_uid
    item.ReferencedSOPInstanceUID = frame.sop_instance_uid
    number = frame_number(frame)
    if number is not None:
        item.ReferencedFrameNumber = number
    purpose = Dataset()
    purpose.CodeValue = "121322"
    purpose.CodingSchemeDesignator = "DCM"
    purpose.CodeMeaning = "Source image for image processing operation"
    item.PurposeOfReferenceCodeSequence = [purpose]
    return item


def _frame_anatomy(src: Dataset, index: int) -> Dataset | None:
    """The Frame Anatomy item of frame ``index`` of a multi-frame source (its own, else the
    shared one), or None."""
    per_frame = src.get("PerFrameFunctionalGroupsSequence") or ()
    groups = [per_frame[index]] if index < len(per_frame) else []
    for group in (*groups, *(src.get("SharedFunctionalGroupsSequence") or ())):
        if group.get("FrameAnatomySequence"):
            return group.FrameAnatomySequence[0]
    return None


def _copy_body_part(src: Dataset, sc: Dataset, frame_index: int = 0) -> None:
    """Body part and laterality of the source (General Series Laterality is Type 2C on the
    body part); an enhanced source names them per frame (Frame Anatomy: the region and the
    frame's laterality, as the SC's Anatomic Region and Image Laterality). When the source
    names none of them, Laterality is left empty: unknown."""
    for keyword in ("BodyPartExamined", "Laterality", "ImageLaterality"):
        value = src.get(keyword)
        if value:
            setattr(sc, keyword, value)
    anatomy = _frame_anatomy(src, frame_index)
    if anatomy is not None:
        if anatomy.get("AnatomicRegionSequence") and "AnatomicRegionSequence" not in sc:
            sc.AnatomicRegionSequence = [Dataset(item) for item in anatomy.AnatomicRegionSequence]
        if anatomy.get("FrameLaterality") and "ImageLaterality" not in sc:
            sc.ImageLaterality = anatomy.FrameLaterality
    if not any(k in sc for k in ("BodyPartExamined", "Laterality", "ImageLaterality")):
        sc.Laterality = ""


def build_sc(
    result: FrameResult,
    *,
    series_instance_uid: str | None = None,
    series_number: int = SC_SERIES_NUMBER,
    sop_instance_uid: str | None = None,
    instance_number: int | None = None,
    window: Window | tuple[float, float] | None = None,
    labels: bool = True,
    series_description: str = "medrt lesion overlay (SC)",
) -> hd.sc.SCImage:
    """A Secondary Capture of ``result``'s frame with the lesion overlay burned in.

    ``series_instance_uid`` defaults to a new UID: pass one to put the captures
    of several frames in one series (or use :func:`build_sc_series`).
    ``instance_number`` defaults to the source's InstanceNumber (frame number
    for a multi-frame source). ``window`` and ``labels`` go to
    :func:`medrt.overlay.render`.
    """
    (item,) = check_results([result])
    if not isinstance(series_number, int) or series_number < 1:
        raise ValueError(f'Argument "series_number" must be a positive integer, got {series_number!r}.')
    frame = item.frame
    if instance_number is None:
        instance_number = frame_number(frame) or int(frame.source.dataset.get("InstanceNumber") or 1)
    pixels = np.ascontiguousarray(render(item, window=window, labels=labels))
    orientation = patient_orientation(frame)
    single = orientation is not None and all(len(v) == 1 for v in orientation)
    # PixelSpacing is in the patient; a radiograph's only when calibrated, and then with
    # how (the SC Image module has the Basic Pixel Spacing Calibration Macro).
    spacing = frame.spacing_mm if frame.spacing_source in _PATIENT_SPACING else None
    sc = hd.sc.SCImage.from_ref_dataset(
        ref_dataset=readable_header(frame.source.dataset),
        pixel_array=pixels,
        photometric_interpretation=hd.PhotometricInterpretationValues.RGB,
        bits_allocated=8,
        coordinate_system=hd.CoordinateSystemNames.PATIENT,
        series_instance_uid=series_instance_uid or hd.UID(),
        series_number=series_number,
        sop_instance_uid=sop_instance_uid or hd.UID(),
        instance_number=instance_number,
        manufacturer=MANUFACTURER,
        pixel_spacing=spacing,
        # highdicom takes single letters only; oblique or unknown values are set below.
        patient_orientation=orientation if single else ("L", "P"),
        transfer_syntax_uid=RLELossless,
        manufacturer_model_name=MODEL_NAME,
        software_versions=software_versions(),
        device_serial_number=DEVICE_SERIAL_NUMBER,
        series_description=series_description,
    )
    if spacing is not None and frame.spacing_source is not SpacingSource.PIXEL_SPACING:
        src = frame.source.dataset
        kind = str(src.get("PixelSpacingCalibrationType", "") or "").strip()
        if kind:  # the macro has the description if and only if it has the type
            sc.PixelSpacingCalibrationType = kind
            sc.PixelSpacingCalibrationDescription = (
                str(src.get("PixelSpacingCalibrationDescription", "") or "").strip()
                or f"As calibrated in the source image ({kind})")
    if not single:
        sc.PatientOrientation = list(orientation) if orientation is not None else ""
    _copy_body_part(frame.source.dataset, sc, frame.frame_index)
    sc.BurnedInAnnotation = "YES"
    sc.SourceImageSequence = [_source_reference(frame)]
    sc.DerivationDescription = "Lesion overlay and sizes burned in by medrt"
    log.info("SC %s of %s", sc.SOPInstanceUID, frame.key)
    return sc


def build_sc_series(
    results: Sequence[FrameResult],
    *,
    series_number: int = SC_SERIES_NUMBER,
    series_instance_uid: str | None = None,
    **kw: object,
) -> list[hd.sc.SCImage]:
    """One :func:`build_sc` per result, all in one new series, numbered 1..n in the given order.

    The results must come from one series. Keyword arguments ``kw`` go to :func:`build_sc`.
    """
    items = check_results(results)
    single_value(items, "series", lambda r: r.frame.series_instance_uid)
    for name in ("sop_instance_uid", "instance_number"):
        if name in kw:
            raise ValueError(f'Argument "{name}" is set per image by build_sc_series; use build_sc.')
    uid = series_instance_uid or hd.UID()
    return [build_sc(r, series_instance_uid=uid, series_number=series_number, instance_number=i,
                     **kw)  # type: ignore[arg-type]
            for i, r in enumerate(items, start=1)]
