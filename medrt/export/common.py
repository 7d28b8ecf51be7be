"""What every medrt DICOM object shares: device identity, algorithm identification, checks.

Every SEG, SR and SC that medrt writes names the same device (Manufacturer and
ManufacturerModelName "medrt", SoftwareVersions ``medrt.__version__``) and the
same algorithm: the models of the results (``FrameResult.models``, strings
``name@version``), family "Artificial Intelligence" (CID 7162).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence

from pydicom.datadict import dictionary_VR
from pydicom.dataelem import DataElement, RawDataElement
from pydicom.dataset import Dataset
from pydicom.sr.codedict import codes
from pydicom.uid import generate_uid
from pydicom.valuerep import DA, DT, TM

import medrt
from medrt.analysis.tracking import Linked, link_series
from medrt.errors import MedrtError
from medrt.types import Frame, FrameResult

__all__ = [
    "ExportError",
    "MANUFACTURER",
    "MODEL_NAME",
    "DEVICE_SERIAL_NUMBER",
    "DEVICE_UID",
    "SEG_SERIES_NUMBER",
    "SR_SERIES_NUMBER",
    "SC_SERIES_NUMBER",
    "AI_FAMILY",
    "software_versions",
    "device_identity",
    "algorithm_parts",
    "linked_lesions",
    "check_results",
    "single_value",
    "frame_number",
    "readable_header",
]

log = logging.getLogger(__name__)

MANUFACTURER = "medrt"
MODEL_NAME = "medrt"
# Software has no hardware serial; a fixed value keeps the objects reproducible and PHI-free.
DEVICE_SERIAL_NUMBER = "medrt"
# The observer device of SR documents: the same UID on every install and run.
DEVICE_UID = generate_uid(entropy_srcs=["medrt", "observer device"])
# Derived series sort after the acquired ones in most PACS series lists.
SEG_SERIES_NUMBER = 9001
SR_SERIES_NUMBER = 9002
SC_SERIES_NUMBER = 9003
AI_FAMILY = codes.cid7162.ArtificialIntelligence
_LO_MAX = 64  # AlgorithmName and AlgorithmVersion are LO


class ExportError(MedrtError, ValueError):
    """The results cannot be expressed as the DICOM object asked for (the message says why)."""


def software_versions() -> str:
    return str(medrt.__version__)


def device_identity() -> dict[str, str]:
    """The equipment attributes every object medrt writes carries (highdicom keyword names)."""
    return {"manufacturer": MANUFACTURER, "manufacturer_model_name": MODEL_NAME,
            "software_versions": software_versions(), "device_serial_number": DEVICE_SERIAL_NUMBER}


def algorithm_parts(models: Sequence[str]) -> tuple[str, str, dict[str, str]]:
    """``(name, version, {model: version})`` naming the models of a result.

    ``("roi_classifier@1.0.0", "lesion_unet@1.0.0")`` gives name
    ``roi_classifier+lesion_unet`` and version ``1.0.0+1.0.0``. Without models,
    or when the joined text would not fit an LO value, the name is "medrt" and
    the version medrt's own; the models are then only in the parameters.
    """
    pairs = [(m.partition("@")[0] or m, m.partition("@")[2] or "unknown") for m in models]
    params = {n: v for n, v in pairs}
    name = "+".join(n for n, _ in pairs)
    version = "+".join(v for _, v in pairs)
    if not pairs or len(name) > _LO_MAX or len(version) > _LO_MAX:
        return MANUFACTURER, software_versions(), params
    return name, version, params


def frame_number(frame: Frame) -> int | None:
    """The 1-based DICOM frame number of ``frame`` in a multi-frame object, else None."""
    return frame.frame_index + 1 if frame.source.number_of_frames > 1 else None


def single_value(results: Sequence[FrameResult], what: str,
                 get: Callable[[FrameResult], object]) -> str:
    """The one value ``get(result)`` takes over ``results``; ValueError naming "results" if not."""
    values = {get(r) for r in results}
    if len(values) != 1:
        raise ValueError(
            f'Argument "results" must hold frames of one {what}, got {len(values)}: '
            f"{', '.join(sorted(map(str, values)))}."
        )
    return str(values.pop())


def check_results(results: Sequence[FrameResult]) -> list[FrameResult]:
    """Check what every builder needs and return the results as a list.

    Raises ValueError naming "results" when it is empty, when a frame has no
    DICOM header to refer to (its ``source.dataset`` must carry the frame's
    SOP Class, SOP Instance, Series and Study UIDs), when a label map does not
    match its frame, when a frame appears twice, or when the frames were
    analysed by different models or come from more than one study.
    """
    if isinstance(results, (str, bytes, FrameResult)) or not isinstance(results, Sequence):
        raise TypeError(
            f'Argument "results" must be a sequence of FrameResult, got {type(results).__name__}.'
        )
    out = list(results)
    if not out:
        raise ValueError('Argument "results" must hold at least one FrameResult, got none.')
    seen: set[tuple[str, int]] = set()
    for i, r in enumerate(out):
        if not isinstance(r, FrameResult):
            raise TypeError(f'Argument "results": item {i} is a {type(r).__name__}, not a FrameResult.')
        f, ds = r.frame, r.frame.source.dataset
        for keyword, value in (
            ("SOPInstanceUID", f.sop_instance_uid),
            ("SOPClassUID", f.sop_class_uid),
            ("SeriesInstanceUID", f.series_instance_uid),
            ("StudyInstanceUID", f.study_instance_uid),
        ):
            if not value or str(ds.get(keyword, "")) != value:
                raise ValueError(
                    f'Argument "results": frame {f.key or i} has no DICOM header to refer to '
                    f"({keyword} of frame.source.dataset is missing or differs from the frame's)."
                )
        if r.labels.shape != f.shape or r.labels.dtype.kind not in "ui":
            raise ValueError(
                f'Argument "results": frame {f.key} has labels {r.labels.dtype}{r.labels.shape}, '
                f"needs an integer map of the frame's shape {f.shape}."
            )
        key = (f.sop_instance_uid, f.frame_index)
        if key in seen:
            raise ValueError(f'Argument "results" holds frame {f.key} more than once.')
        seen.add(key)
    single_value(out, "study", lambda r: r.frame.study_instance_uid)
    single_value(out, "set of models", lambda r: " ".join(r.models))
    return out


_DATES_TIMES = {"DA": DA, "DT": DT, "TM": TM}


def _vr(ds: Dataset, elem: DataElement | RawDataElement) -> str:
    """The VR ``elem`` of ``ds`` has, or will have once pydicom parses it, without parsing
    it where the file or the data dictionary says: a raw element of an implicit VR file
    (or written UN) takes its standard tag's dictionary VR, as pydicom gives it; a private
    or unknown one is parsed, since pydicom looks it up by its private creator."""
    vr = elem.VR
    if vr is not None and vr != "UN":
        return str(vr)
    if not isinstance(elem, RawDataElement) or elem.tag.is_private:
        return str(ds[elem.tag].VR)
    try:
        return str(dictionary_VR(elem.tag))
    except KeyError:  # not in the dictionary: pydicom reads it as UN
        return "UN"


def readable_header(ds: Dataset) -> Dataset:
    """``ds``, or a copy of it whose top-level dates and times that pydicom cannot read
    (a PatientBirthDate written ``1970-01-01``, a StudyTime with letters) are left empty.

    highdicom copies the source's patient and study attributes into every SEG, SR and SC
    and parses the dates and times among them; one unreadable value made the whole
    object fail, and its message quoted the value (a birth date) into the run's report.
    Empty is what DICOM allows for these Type 2 attributes when the value is unknown.
    The log names the attribute and the object's UID, never the value.

    Only the date and time elements are read: pydicom parses an element of a file when it
    is first asked for, and walking them all parsed every value of every header of the
    series, most of which no SEG or SR ever reads (0.65 s of a 1,200-slice series' export,
    against 0.06 s once parsed)."""
    bad = []
    for raw in ds.elements():
        if _vr(ds, raw) not in _DATES_TIMES:
            continue
        elem = ds[raw.tag]
        parse = _DATES_TIMES.get(str(elem.VR))
        if parse is None or elem.value in (None, ""):
            continue
        values = elem.value if elem.VM > 1 else [elem.value]
        try:
            for value in values:
                parse(value)
        except (TypeError, ValueError):
            bad.append(elem)
    if not bad:
        return ds
    out = copy.deepcopy(ds)
    for elem in bad:
        out[elem.tag] = DataElement(elem.tag, elem.VR, "")
    log.warning("%s: %s not a valid DICOM %s; left empty in the objects medrt derives from it",
                ds.get("SOPInstanceUID", "an image"), ", ".join(e.keyword or str(e.tag) for e in bad),
                "/".join(sorted({str(e.VR) for e in bad})))
    return out


def linked_lesions(items: list[FrameResult], linked: Linked | None) -> Linked:
    """``linked`` (:func:`medrt.analysis.tracking.link_series` of the series ``items`` belong
    to), checked to number every lesion of ``items``; by default, ``link_series(items)``.
    Raises ValueError naming "linked" when a lesion has no number in it."""
    if linked is None:
        return link_series(items)
    numbers = linked[1]
    for r in items:
        for les in r.lesions:
            if (r.frame.key, les.label) not in numbers:
                raise ValueError(
                    f'Argument "linked" does not number lesion {les.label} of frame {r.frame.key}: '
                    "link the series these results belong to (medrt.analysis.tracking.link_series)."
                )
    return linked
