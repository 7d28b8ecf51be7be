"""Header attributes a Frame needs: modality LUT, spacing, geometry, VOI window.

Classic headers keep these at the top level; enhanced multi-frame objects keep
them in the shared or per-frame functional groups. Each function looks in both.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

import numpy as np
from pydicom.dataset import Dataset

from medrt.types import Geometry, SpacingSource, Window, WindowSource

__all__ = [
    "modality_values",
    "content_boxes",
    "rescale",
    "frame_rescales",
    "frame_pixel_spacings",
    "frame_header_windows",
    "functional_item",
    "pixel_measures_item",
    "pixel_spacing",
    "frame_geometries",
    "header_window",
    "percentile_window",
    "image_type_of",
    "view_of",
    "finite_float",
    "finite_int",
    "believable_mm",
    "unbelievable_spacings",
    "pixel_measures_conflicts",
    "pixel_measures_gaps",
    "spacing_is_believable",
    "spacing_problem",
    "frames_text",
    "dicom_values",
    "MAX_PIXEL_SPACING_MM",
    "MAX_SLICE_THICKNESS_MM",
]

_PERCENTILE_MAX_SAMPLES = 1 << 20

_V = TypeVar("_V", bound=Hashable)


def modality_values(arr: np.ndarray, ds: Dataset) -> tuple[np.ndarray, float, float]:
    """Stored values to float32 modality units, with the range the stored values map to."""
    bits = int(ds.get("BitsStored", ds.BitsAllocated) or ds.BitsAllocated)
    signed = int(ds.get("PixelRepresentation", 0) or 0) == 1
    smin, smax = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    lut_item = _modality_lut_item(ds)
    if lut_item is not None:
        from pydicom.pixels import apply_modality_lut

        out = np.asarray(apply_modality_lut(arr, ds), dtype=np.float32)
        bounds = np.asarray(apply_modality_lut(np.array([smin, smax], dtype=np.int64), ds), dtype=np.float64)
        return out, float(bounds.min()), float(bounds.max())
    out = arr.astype(np.float32)  # the one copy: a cast from the file's bytes
    # An enhanced multi-frame object may rescale each frame its own way (per-frame Pixel
    # Value Transformation, PS3.3 C.7.6.16.2.9): each frame gets its own.
    pairs = frame_rescales(ds, out.shape[0]) if out.ndim >= 3 else [rescale(ds)]
    for i, (slope, intercept) in enumerate(pairs):
        view = out if len(pairs) == 1 else out[i]
        if slope != 1.0:
            view *= np.float32(slope)
        if intercept != 0.0:
            view += np.float32(intercept)
    ends = [v for slope, intercept in set(pairs) for v in (smin * slope + intercept, smax * slope + intercept)]
    return out, float(min(ends)), float(max(ends))


def content_boxes(stored: np.ndarray, ds: Dataset) -> list[tuple[int, int, int, int] | None]:
    """For each frame of greyscale ``stored`` values, the box (r0, r1, c0, c1) outside which
    every pixel is padding (Pixel Padding Value, up to Pixel Padding Range Limit; PS3.3
    C.7.5.1.1.2): a radiograph's shutter or collimation border. None for a frame with no
    such border (no padding, or padding that is not a border, as a CT's outside its
    circle of reconstruction)."""
    n = stored.shape[0]
    value = finite_int(ds.get("PixelPaddingValue"))
    if value is None or stored.ndim != 3:
        return [None] * n
    limit = finite_int(ds.get("PixelPaddingRangeLimit"))
    lo, hi = sorted((value, value if limit is None else limit))
    boxes: list[tuple[int, int, int, int] | None] = []
    for frame in stored:
        padded = (frame >= lo) & (frame <= hi) if lo != hi else frame == lo
        rows = np.flatnonzero(~padded.all(axis=1))
        cols = np.flatnonzero(~padded.all(axis=0))
        if rows.size == 0 or cols.size == 0:  # all padding: nothing to keep
            boxes.append(None)
            continue
        box = (int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1)
        boxes.append(None if box == (0, frame.shape[0], 0, frame.shape[1]) else box)
    return boxes


def _modality_lut_item(ds: Dataset) -> Dataset | None:
    seq = ds.get("ModalityLUTSequence")
    return seq[0] if seq else None


def rescale(ds: Dataset, index: int = 0) -> tuple[float, float]:
    """RescaleSlope/Intercept of frame ``index``, from the top level or the enhanced
    functional groups."""
    if "RescaleSlope" in ds and "RescaleIntercept" in ds:
        return float(ds.RescaleSlope), float(ds.RescaleIntercept)
    item = functional_item(ds, "PixelValueTransformationSequence", index)
    if item is not None and "RescaleSlope" in item and "RescaleIntercept" in item:
        return float(item.RescaleSlope), float(item.RescaleIntercept)
    return 1.0, 0.0


def frame_rescales(ds: Dataset, n_frames: int) -> list[tuple[float, float]]:
    """Each frame's (slope, intercept); one pair when they are all the same."""
    if not _per_frame(ds, "PixelValueTransformationSequence"):
        return [rescale(ds)]
    pairs = [rescale(ds, i) for i in range(n_frames)]
    return pairs if len(set(pairs)) > 1 else pairs[:1]


def _per_frame(ds: Dataset, keyword: str) -> bool:
    """Whether any per-frame functional group item holds ``keyword``."""
    per_frame = ds.get("PerFrameFunctionalGroupsSequence")
    return bool(per_frame) and any(keyword in item for item in per_frame)


def functional_item(ds: Dataset, keyword: str, index: int) -> Dataset | None:
    """``keyword``'s first item for frame ``index``, per-frame groups first, then shared."""
    per_frame = ds.get("PerFrameFunctionalGroupsSequence")
    if per_frame and index < len(per_frame):
        seq = per_frame[index].get(keyword)
        if seq:
            return seq[0]
    shared = ds.get("SharedFunctionalGroupsSequence")
    if shared:
        seq = shared[0].get(keyword)
        if seq:
            return seq[0]
    return None


def pixel_measures_item(ds: Dataset, index: int) -> Dataset | None:
    """Frame ``index``'s Pixel Measures (PS3.3 C.7.6.16.2.1: PixelSpacing, SliceThickness,
    SpacingBetweenSlices), attribute by attribute: each from the frame's own item where that
    gives a value, else from the shared item (as Cornerstone/OHIF flatten the two groups);
    None where neither has an item. A functional group belongs in one or the other, but some
    conversions write both, with the frame's own item lacking what the shared one gives: the
    frame is measured with the shared value, not left without one. A value the frame gives
    that is not a length (0\\0, NaN) stays the frame's: it said something, and not the shared
    value. The one rule for the reader (:func:`pixel_spacing`), the SEG writer and the
    viewer; :func:`pixel_measures_gaps` is for a warning that says where it took the shared
    value. The item returned holds the source's own data elements: do not change it."""
    per_frame = ds.get("PerFrameFunctionalGroupsSequence")
    own = _first_item(per_frame[index], "PixelMeasuresSequence") if per_frame and index < len(per_frame) else None
    shared = _shared_item(ds, "PixelMeasuresSequence")
    if own is None or shared is None:
        return own if own is not None else shared
    taken = [elem for elem in shared if _gives(shared, elem.tag) and not _gives(own, elem.tag)]
    if not taken:
        return own
    out = Dataset()
    out.update(own)
    for elem in taken:
        if elem.tag in out:  # an empty one of the frame's own
            del out[elem.tag]
        out.add(elem)
    return out


def _gives(holder: Dataset, tag: Any) -> bool:
    """Whether ``holder`` has the data element ``tag`` with a value (a damaged one that cannot
    be read included: it is there, though it is no value to use)."""
    if tag not in holder:
        return False
    try:
        return bool(dicom_values(holder[tag].value))
    except Exception:  # a value pydicom cannot convert
        return True


def frame_pixel_spacings(ds: Dataset, n_frames: int) -> list[tuple[tuple[float, float] | None, SpacingSource]]:
    """:func:`pixel_spacing` of each frame (per-frame Pixel Measures), or one for all."""
    if not _per_frame(ds, "PixelMeasuresSequence"):
        return [pixel_spacing(ds)]
    return [pixel_spacing(ds, i) for i in range(n_frames)]


def pixel_spacing(ds: Dataset, index: int = 0) -> tuple[tuple[float, float] | None, SpacingSource]:
    """Frame ``index``'s pixel spacing (row, column; mm) and what it means (PS3.3 10.7.1.1).

    PixelSpacing first (from the enhanced Pixel Measures group before a top-level one): in the patient,
    unless it repeats the ImagerPixelSpacing of a radiograph, which is at the detector.
    A radiograph's PixelSpacing that differs was calibrated, as its
    PixelSpacingCalibrationType says (GEOMETRY, or FIDUCIAL and the like: CALIBRATED)
    or does not (UNKNOWN_CALIBRATION, also for a radiograph's PixelSpacing alone;
    Cornerstone/OHIF's rules). A radiograph with ImagerPixelSpacing alone is measured
    at the detector, or, when it gives an Estimated Radiographic Magnification Factor
    above 1, at the patient plane:
    ImagerPixelSpacing / ERMF (as IHE Mammography and Cornerstone/OHIF do; a chest PA's
    magnification is often 5-15 %, enough to move a nodule across a 6 or 8 mm threshold).
    """
    imager = _float_pair(ds.get("ImagerPixelSpacing"))
    measures = pixel_measures_item(ds, index)
    modality = str(ds.get("Modality", "")).upper()
    # A slice in the patient (CT, MR...) that also carries ImagerPixelSpacing is no radiograph:
    # its PixelSpacing is in the patient, whatever the other says.
    sliced = modality not in PROJECTION_MODALITIES and (
        "ImageOrientationPatient" in ds or functional_item(ds, "PlaneOrientationSequence", index) is not None)
    # an enhanced object's Pixel Measures first: a conversion may leave a top-level PixelSpacing
    # behind, but the functional groups are the frame's (and what its SEG is built with)
    for value in (measures.get("PixelSpacing") if measures is not None else None, ds.get("PixelSpacing")):
        pair = _float_pair(value)
        if pair is not None:
            if sliced:
                return pair, SpacingSource.PIXEL_SPACING
            if imager is not None and np.allclose(pair, imager, rtol=1e-4, atol=0.0):
                return pair, SpacingSource.IMAGER_PIXEL_SPACING
            if imager is not None or modality in PROJECTION_MODALITIES:
                return pair, calibration(ds)
            return pair, SpacingSource.PIXEL_SPACING
    if imager is not None:
        ermf = finite_float(ds.get("EstimatedRadiographicMagnificationFactor"))
        if ermf is not None and 1.0 < ermf < 10.0:
            return (imager[0] / ermf, imager[1] / ermf), SpacingSource.ERMF
        return imager, SpacingSource.IMAGER_PIXEL_SPACING
    for value, source in ((ds.get("ImagePlanePixelSpacing"), SpacingSource.IMAGE_PLANE),
                          (ds.get("NominalScannedPixelSpacing"), SpacingSource.NOMINAL_SCANNED)):
        pair = _float_pair(value)
        if pair is not None:
            return pair, source
    return None, SpacingSource.NONE


#: Projection radiography, whose pixel spacing is at the detector unless calibrated.
PROJECTION_MODALITIES = frozenset({"CR", "DX", "MG", "IO", "PX", "RF", "XA", "RG"})


def calibration(ds: Dataset) -> SpacingSource:
    """What a radiograph's own PixelSpacing means, from its Basic Pixel Spacing
    Calibration Macro (PS3.3 10.7.1.3): GEOMETRY, CALIBRATED (FIDUCIAL, or a type or
    description other than GEOMETRY) or UNKNOWN_CALIBRATION."""
    kind = str(ds.get("PixelSpacingCalibrationType", "") or "").strip().upper()
    if kind == "GEOMETRY":
        return SpacingSource.GEOMETRY
    if kind or str(ds.get("PixelSpacingCalibrationDescription", "") or "").strip():
        return SpacingSource.CALIBRATED
    return SpacingSource.UNKNOWN_CALIBRATION


def finite_float(value: Any) -> float | None:
    """A finite number from a DS/FD value (the first of several), else None."""
    if value is not None and not isinstance(value, (str, bytes)) and hasattr(value, "__getitem__"):
        value = value[0] if len(value) else None  # a multi-valued element: its first value
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if np.isfinite(number) else None


def finite_int(value: Any) -> int | None:
    """:func:`finite_float` as an integer (an IS value: InstanceNumber, AcquisitionNumber)."""
    number = finite_float(value)
    return int(number) if number is not None else None


#: The largest pixel spacing taken as a measurement, in mm. No imaging modality comes
#: near it (a PET or planar NM pixel is 2 to 10 mm); a spacing above it is a damaged
#: header or one in other units (micrometres written as mm), and a size measured with it
#: (1e300 mm, or areas in square metres) is no size at all: sizes are given in pixels.
MAX_PIXEL_SPACING_MM = 100.0
#: The largest SliceThickness or SpacingBetweenSlices taken as one, in mm: a thick MIP
#: slab can reach a body's depth, not a metre.
MAX_SLICE_THICKNESS_MM = 1000.0

# The spacing attributes a header can carry, each with the largest value believable for it.
_SPACING_LIMITS = {
    "PixelSpacing": MAX_PIXEL_SPACING_MM,
    "ImagerPixelSpacing": MAX_PIXEL_SPACING_MM,
    "SliceThickness": MAX_SLICE_THICKNESS_MM,
    "SpacingBetweenSlices": MAX_SLICE_THICKNESS_MM,
}


def believable_mm(value: Any, limit: float = MAX_PIXEL_SPACING_MM) -> float | None:
    """A DS value as a length in mm when it can be one (finite, above 0, at most
    ``limit``); None for anything else (0, negative, NaN, inf, 1e300, not a number)."""
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if np.isfinite(number) and 0.0 < number <= limit else None


def unbelievable_spacings(ds: Dataset) -> list[str]:
    """``"PixelSpacing 1e+300\\1e+300"``, one for each spacing attribute of ``ds`` (top level or
    shared Pixel Measures) that has a value which cannot be a length (see :func:`believable_mm`),
    and ``"PixelSpacing 0\\0 on frames 3, 5"`` for each such value in the per-frame Pixel
    Measures of an enhanced multi-frame object (frames numbered from 1, as DICOM numbers
    them); [] when all are absent, empty or believable. For a warning: such a value is not used."""
    shared = _shared_item(ds, "PixelMeasuresSequence")
    out = []
    for keyword in _SPACING_LIMITS:
        for holder in (ds, shared):
            said = _unbelievable(holder, keyword)
            if said is not None:
                out.extend([said] if said else [])
                break
    for keyword in _SPACING_LIMITS:
        out.extend(f"{said} on {where}" for said, where in _on_frames(ds, lambda own, k=keyword: _unbelievable(own, k)))
    return out


def pixel_measures_conflicts(ds: Dataset) -> list[str]:
    """``"PixelSpacing 0.7\\0.7 shared, 0.5\\0.5 on frames 1, 2 of 20"``, one for each of PixelSpacing
    and SliceThickness that an enhanced multi-frame object gives both in its shared Pixel Measures
    and, with another value (beyond 0.01 %), in some frames' own; [] otherwise. A functional
    group belongs in one or the other (PS3.3 C.7.6.16), so such an object says two things of
    those frames: each is measured with its own value (:func:`pixel_measures_item`, as the SEG
    writer reads them), and this is for a warning that says so."""
    shared = _shared_item(ds, "PixelMeasuresSequence")
    out = []
    for keyword in ("PixelSpacing", "SliceThickness"):
        common = _floats(shared, keyword)
        if common is None:
            continue
        others = _on_frames(ds, lambda own, k=keyword, c=common: _other_than(own, k, c))
        said = "; ".join(f"{_joined(v)} on {where}" for v, where in others)
        if said:
            out.append(f"{keyword} {_joined(common)} shared, {said}")
    return out


def pixel_measures_gaps(ds: Dataset) -> list[str]:
    """``"SliceThickness 5 shared, not in the own Pixel Measures of frames 3, 5 of 20"``, one for
    each of PixelSpacing and SliceThickness that an enhanced multi-frame object gives in its
    shared Pixel Measures while some frames' own Pixel Measures leave it out (absent or
    empty); [] otherwise. A functional group belongs in one or the other (PS3.3 C.7.6.16):
    those frames take the shared value (:func:`pixel_measures_item`), and this is for a
    warning that says the header is inconsistent. A frame with no Pixel Measures of its own
    is not counted: it has no item that says otherwise."""
    shared = _shared_item(ds, "PixelMeasuresSequence")
    out = []
    for keyword in ("PixelSpacing", "SliceThickness"):
        if shared is None or not _gives(shared, keyword):
            continue
        value = _floats(shared, keyword)
        common = _joined(value) if value is not None else _value_text(shared, keyword)
        out.extend(f"{keyword} {common} shared, not in the own Pixel Measures of {where}" for _, where in
                   _on_frames(ds, lambda own, k=keyword: own is not None and not _gives(own, k)))
    return out


def _value_text(holder: Dataset, keyword: str) -> str:
    try:
        return "\\".join(str(v) for v in dicom_values(holder[keyword].value))
    except Exception:  # a value pydicom cannot convert: not shown
        return "(unreadable)"


def _other_than(own: Dataset | None, keyword: str, common: tuple[float, ...]) -> tuple[float, ...] | None:
    """``own``'s ``keyword`` where it gives one other than ``common`` (beyond 0.01 %), else None."""
    value = _floats(own, keyword)
    if value is None or (len(value) == len(common) and np.allclose(value, common, rtol=1e-4, atol=0.0)):
        return None
    return value


def _on_frames(ds: Dataset, value_of: Callable[[Dataset | None], _V | None]) -> list[tuple[_V, str]]:
    """Each value ``value_of`` finds in the own Pixel Measures of an enhanced object's frames
    (given the frame's item, None where it has none; None or "" from it: nothing to say), in
    the order of the first frame that gives it, with those frames as :func:`frames_text`
    names them ("frames 1, 2 of 20"); [] for an object without per-frame groups. What
    :func:`unbelievable_spacings`, :func:`pixel_measures_conflicts` and
    :func:`pixel_measures_gaps` say of the frames."""
    per_frame = ds.get("PerFrameFunctionalGroupsSequence") or []
    frames: dict[_V, list[int]] = {}  # each value, with the frames (from 1) that give it
    for number, group in enumerate(per_frame, 1):
        value = value_of(_first_item(group, "PixelMeasuresSequence"))
        if value:
            frames.setdefault(value, []).append(number)
    return [(value, frames_text(numbers, len(per_frame))) for value, numbers in frames.items()]


def _floats(holder: Dataset | None, keyword: str) -> tuple[float, ...] | None:
    """``holder``'s ``keyword`` as finite floats; None when absent, empty or not numbers."""
    if holder is None or keyword not in holder:
        return None
    try:
        values = tuple(float(v) for v in dicom_values(holder[keyword].value))
    except Exception:  # a value pydicom cannot convert: not a value to compare
        return None
    return values if values and all(np.isfinite(values)) else None


def _joined(values: tuple[float, ...]) -> str:
    return "\\".join(f"{v:g}" for v in values)


def _unbelievable(holder: Dataset | None, keyword: str) -> str | None:
    """``"PixelSpacing 0\\0"`` when ``holder``'s ``keyword`` cannot be a length; "" when it
    cannot but is written so customarily (:func:`_customary`); None when it can or is absent."""
    if holder is None or spacing_is_believable(holder, keyword) is not False:
        return None
    values = dicom_values(holder[keyword].value)
    return "" if _customary(keyword, values) else keyword + " " + "\\".join(str(v) for v in values)


def frames_text(numbers: list[int], of: int, shown: int = 6) -> str:
    """``"frame 3 of 12"``, ``"frames 3, 5 of 12"``, or the first few and how many more."""
    if len(numbers) == 1:
        return f"frame {numbers[0]} of {of}"
    listed = ", ".join(str(n) for n in numbers[:shown])
    more = f" and {len(numbers) - shown} more" if len(numbers) > shown else ""
    return f"frames {listed}{more} of {of}"


def _first_item(holder: Dataset | None, keyword: str) -> Dataset | None:
    seq = holder.get(keyword) if holder is not None else None
    return seq[0] if seq else None


def _shared_item(ds: Dataset, keyword: str) -> Dataset | None:
    """``keyword``'s item in the shared functional groups, or None."""
    shared = ds.get("SharedFunctionalGroupsSequence")
    return _first_item(shared[0], keyword) if shared else None


def spacing_problem(ds: Dataset, index: int = 0) -> str | None:
    """Why frame ``index`` has no pixel spacing although its header gives one:
    ``"PixelSpacing 0\\0 is not a length in mm"`` for the first pixel spacing attribute that
    :func:`pixel_spacing` reads and finds unusable (not two believable lengths); None where the
    header gives none at all, or where the frame has a pixel spacing."""
    if pixel_spacing(ds, index)[0] is not None:
        return None
    measures = pixel_measures_item(ds, index)
    for holder, keyword in ((ds, "PixelSpacing"), (measures, "PixelSpacing"), (ds, "ImagerPixelSpacing"),
                            (ds, "ImagePlanePixelSpacing"), (ds, "NominalScannedPixelSpacing")):
        if holder is None or keyword not in holder:
            continue
        try:
            value = holder[keyword].value
            values = dicom_values(value)
        except Exception:  # a value pydicom cannot convert: unusable, and not shown
            return f"{keyword} cannot be read"
        if values and _float_pair(value) is None:
            text = "\\".join(str(v) for v in values)
            if len(values) != 2:
                return f"{keyword} {text} is {len(values)} value(s), not a row and a column spacing"
            return f"{keyword} {text} is not a length in mm"
    return None


def _customary(keyword: str, values: list[Any]) -> bool:
    """Values that are not lengths but are written that way so often that a warning for each
    file would only be noise (they are not used all the same): a SliceThickness of 0 (many
    radiographs and secondary captures say "not applicable" so) and a negative
    SpacingBetweenSlices (nuclear medicine's signed step between slices)."""
    try:
        numbers = [float(v) for v in values]
    except (TypeError, ValueError):
        return False
    if keyword == "SliceThickness":
        return all(v == 0 for v in numbers)
    return keyword == "SpacingBetweenSlices" and all(-MAX_SLICE_THICKNESS_MM <= v < 0 for v in numbers)


def spacing_is_believable(ds: Dataset, keyword: str) -> bool | None:
    """Whether ``ds``'s PixelSpacing, ImagerPixelSpacing, SliceThickness or
    SpacingBetweenSlices is a length in mm (two of them for a pixel spacing; see
    :func:`believable_mm`); None when it is absent or empty."""
    if keyword not in ds:
        return None
    values = dicom_values(ds[keyword].value)
    if not values:
        return None
    if keyword in ("PixelSpacing", "ImagerPixelSpacing") and len(values) != 2:
        return False
    return all(believable_mm(v, _SPACING_LIMITS[keyword]) is not None for v in values)


def dicom_values(value: Any) -> list[Any]:
    """A DICOM value as a list of its values ([] for none)."""
    if value is None or value == "":
        return []
    return list(value) if isinstance(value, Sequence) and not isinstance(value, str) else [value]


def _float_pair(value: Any) -> tuple[float, float] | None:
    """A (row, column) spacing in mm, or None when it is not two believable lengths."""
    try:
        if value is None or len(value) != 2:
            return None
    except TypeError:
        return None
    a, b = believable_mm(value[0]), believable_mm(value[1])
    return (a, b) if a is not None and b is not None else None


def frame_geometries(ds: Dataset, n_frames: int) -> list[Geometry | None]:
    top = _geometry(ds.get("ImagePositionPatient"), ds.get("ImageOrientationPatient"))
    if top is not None or "PerFrameFunctionalGroupsSequence" not in ds:
        return [top] * n_frames
    out: list[Geometry | None] = []
    for i in range(n_frames):
        pos = functional_item(ds, "PlanePositionSequence", i)
        ori = functional_item(ds, "PlaneOrientationSequence", i)
        out.append(
            _geometry(
                pos.get("ImagePositionPatient") if pos is not None else None,
                ori.get("ImageOrientationPatient") if ori is not None else None,
            )
        )
    return out


def _geometry(position: Sequence[Any] | None, orientation: Sequence[Any] | None) -> Geometry | None:
    try:
        if position is None or orientation is None or len(position) != 3 or len(orientation) != 6:
            return None
        p = tuple(float(v) for v in position)
        o = tuple(float(v) for v in orientation)
    except (TypeError, ValueError):
        return None
    return Geometry(position=p, orientation=o)  # type: ignore[arg-type]


def frame_header_windows(ds: Dataset, n_frames: int) -> list[Window | None]:
    """:func:`header_window` of each frame (per-frame Frame VOI LUT), or one for all."""
    if not _per_frame(ds, "FrameVOILUTSequence"):
        return [header_window(ds)]
    return [header_window(ds, i) for i in range(n_frames)]


def header_window(ds: Dataset, index: int = 0) -> Window | None:
    """The first window the header gives frame ``index`` (top level, then functional groups)."""
    center, width = ds.get("WindowCenter"), ds.get("WindowWidth")
    if center is None or width is None:
        item = functional_item(ds, "FrameVOILUTSequence", index)
        if item is not None:
            center, width = item.get("WindowCenter"), item.get("WindowWidth")
    try:
        c = float(center[0] if isinstance(center, Sequence) and not isinstance(center, str) else center)  # type: ignore[index,arg-type]
        w = float(width[0] if isinstance(width, Sequence) and not isinstance(width, str) else width)  # type: ignore[index,arg-type]
    except (TypeError, ValueError, IndexError):
        return None
    if not (np.isfinite(c) and np.isfinite(w)) or w <= 0:
        return None
    return Window(c, w, WindowSource.HEADER)


def percentile_window(pixels: np.ndarray) -> Window:
    """The 0.1–99.9 % range, on a regular subsample of at most ~1 M pixels."""
    step = max(1, int(np.ceil(np.sqrt(pixels.size / _PERCENTILE_MAX_SAMPLES))))
    sample = pixels[::step, ::step]
    lo, hi = np.percentile(sample, [0.1, 99.9])
    lo, hi = float(lo), float(hi)
    if not hi > lo:
        hi = lo + 1.0
    return Window((lo + hi) / 2.0, hi - lo, WindowSource.PERCENTILE)


def image_type_of(ds: Dataset | None) -> tuple[str, ...]:
    """Image Type (0008,0008) of a header, upper case; () when absent or unreadable."""
    try:
        value = ds.get("ImageType") if ds is not None else None
    except Exception:  # a damaged value: route by Modality alone
        return ()
    if not value:
        return ()
    values = [value] if isinstance(value, str) else list(value)
    return tuple(str(v).strip().upper() for v in values)


@functools.lru_cache(maxsize=1)
def _view_codes() -> dict[tuple[str, str], str]:
    """DX View codes (CID 4010, from pydicom's code dictionary) as ViewPosition terms."""
    from pydicom.sr.codedict import codes

    named = {"PosteroAnterior": "PA", "AnteroPosterior": "AP", "AnteroPosteriorProjection": "AP",
             "Lateral": "LATERAL", "LateralProjection": "LATERAL", "LeftLateral": "LL",
             "LeftLateralProjection": "LL", "RightLateral": "RL", "RightLateralProjection": "RL"}
    out = {}
    for name, term in named.items():
        code = getattr(codes.SCT, name, None)
        if code is not None:
            out[(code.scheme_designator, code.value)] = term
    return out


# Code meanings of the DX View context group, when the code itself is not known here
# (an older SRT/SNM3 code, a vendor's own): the longest first.
_VIEW_MEANINGS = (("postero-anterior", "PA"), ("posteroanterior", "PA"), ("antero-posterior", "AP"),
                  ("anteroposterior", "AP"), ("left lateral", "LL"), ("right lateral", "RL"), ("lateral", "LATERAL"))


def view_of(ds: Dataset | None) -> str:
    """The radiographic view (ViewPosition's terms: PA, AP, LL, RL, LATERAL...): ViewPosition
    (0018,5101), or, where it is empty, the first item of View Code Sequence (0054,0220),
    which some rooms fill instead (by its SNOMED code, else its meaning); "" for none."""
    if ds is None:
        return ""
    try:
        position = str(ds.get("ViewPosition", "") or "").strip()
        if position:
            return position
        seq = ds.get("ViewCodeSequence")
        item = seq[0] if seq else None
    except Exception:  # a damaged value: as if absent
        return ""
    if item is None:
        return ""
    scheme = str(item.get("CodingSchemeDesignator", "") or "").strip().upper()
    term = _view_codes().get((scheme, str(item.get("CodeValue", "") or "").strip()))
    if term:
        return term
    meaning = str(item.get("CodeMeaning", "") or "").lower()
    return next((t for words, t in _VIEW_MEANINGS if words in meaning), "")
