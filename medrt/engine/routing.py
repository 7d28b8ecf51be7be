"""Which model takes a frame: frames are routed by their DICOM Modality (Secondary
Captures as "SC", For Processing images as "<Modality> FOR PROCESSING", localizers as
"<Modality> LOCALIZER") to the first model whose spec lists it (``[model] modalities``),
else to the first that lists none, among the models whose ``[model] body_parts``,
``views`` and ``planes`` take its BodyPartExamined, ViewPosition and anatomical plane; a
frame no model is for is refused with the reason."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pydicom import uid

from medrt.io.header import image_type_of, view_of

if TYPE_CHECKING:
    from medrt.engine.backends.base import Backend
    from medrt.types import Frame

__all__ = ["FOR_PROCESSING", "SECONDARY_CAPTURE", "ImageKind", "aliased", "fits", "fits_one_crop", "image_type_of",
           "names", "no_model_reason", "pick", "pick_for_modality", "resolve_aliases", "route", "routing_modality"]

# Secondary Capture Image Storage and its multi-frame forms: screenshots, dose reports,
# burned-in overlays (medrt's own --sc output among them), not acquired images, whatever
# their Modality says. They route as "SC", which no shipped model lists.
SECONDARY_CAPTURE = frozenset({
    uid.SecondaryCaptureImageStorage, uid.MultiFrameSingleBitSecondaryCaptureImageStorage,
    uid.MultiFrameGrayscaleByteSecondaryCaptureImageStorage, uid.MultiFrameGrayscaleWordSecondaryCaptureImageStorage,
    uid.MultiFrameTrueColorSecondaryCaptureImageStorage,
})


# The "For Processing" image storage classes: raw detector data before the vendor's
# image processing (no log transform, no equalisation, often the other polarity), which
# modalities send to CAD systems beside the "For Presentation" image a reader sees. A
# model trained on presentation images reads them as something else, so they route as
# "<Modality> FOR PROCESSING" (PresentationIntentType's term), which no shipped model lists.
FOR_PROCESSING = frozenset({
    uid.DigitalXRayImageStorageForProcessing, uid.DigitalMammographyXRayImageStorageForProcessing,
    uid.DigitalIntraOralXRayImageStorageForProcessing, uid.BreastProjectionXRayImageStorageForProcessing,
    uid.DICOSDigitalXRayImageStorageForProcessing,
    uid.IntravascularOpticalCoherenceTomographyImageStorageForProcessing,
})
PROCESSING_SUFFIX = " FOR PROCESSING"
# A localizer (scout, topogram, surview): the projection image a CT scan is planned on,
# Modality CT and CT Image Storage like the slices, told apart only by Image Type value 3
# (LOCALIZER instead of AXIAL). Every CT study holds one; a model trained on axial slices
# reads it as one. It routes as "<Modality> LOCALIZER".
LOCALIZER_SUFFIX = " LOCALIZER"


def routing_modality(modality: str | None, sop_class_uid: str | None = None,
                     image_type: Sequence[str] = ()) -> str:
    """What frames are routed to models by: the DICOM Modality (upper case), "SC" for a
    Secondary Capture (:data:`SECONDARY_CAPTURE`), "<Modality> FOR PROCESSING" for a For
    Processing image (:data:`FOR_PROCESSING`), "<Modality> LOCALIZER" for a localizer
    (``image_type``, :func:`image_type_of`, says LOCALIZER from its third value on). A
    spec lists e.g. ``"DX FOR PROCESSING"`` or ``"CT LOCALIZER"`` to take those."""
    if (sop_class_uid or "") in SECONDARY_CAPTURE:
        return "SC"
    if (sop_class_uid or "") in FOR_PROCESSING:
        return (modality or "").upper() + PROCESSING_SUFFIX
    if "LOCALIZER" in image_type[2:]:
        return (modality or "").upper() + LOCALIZER_SUFFIX
    return (modality or "").upper()


@dataclass(frozen=True, slots=True)
class ImageKind:
    """What picks a model for an image: how it routes (:func:`routing_modality`), the
    body part and view its header names (BodyPartExamined, ViewPosition; upper case, ""
    when it names none) and the anatomical plane it lies in. A chest model fed by a
    radiography room's whole feed must not read a knee, or a lateral view it never saw;
    an axial CT model must not read the coronal and sagittal reformats that come with
    every CT study (each lesion reported again per reformat)."""

    routed: str
    modality: str = ""  # the DICOM Modality as written, for messages
    body_part: str = ""
    view: str = ""
    plane: str = ""  # Geometry.plane: AXIAL, CORONAL, SAGITTAL; "" without ImageOrientationPatient

    @classmethod
    def of(cls, modality: str | None, sop_class_uid: str | None = None, image_type: Sequence[str] = (),
           body_part: str | None = "", view: str | None = "", plane: str | None = "") -> ImageKind:
        return cls(routing_modality(modality, sop_class_uid, image_type), modality or "",
                   _term(body_part), _term(view), _term(plane))

    @classmethod
    def of_frame(cls, frame: Frame) -> ImageKind:
        ds = frame.source.dataset
        return cls.of(frame.modality, frame.sop_class_uid, image_type_of(ds), _header_text(ds, "BodyPartExamined"),
                      view_of(ds), frame.geometry.plane if frame.geometry is not None else "")


def _term(value: str | None) -> str:
    return " ".join(str(value or "").split()).upper()


def _header_text(ds: Any, keyword: str) -> str:
    try:
        return str(ds.get(keyword, "") or "") if ds is not None else ""
    except Exception:  # a damaged value: as if absent
        return ""


def fits(spec: Any, kind: ImageKind, strict: bool = False) -> bool:
    """Whether a spec's ``body_parts``, ``views`` and ``planes`` take ``kind``: each when
    the spec lists none, or the header names one the spec lists (:func:`names`: the
    value, or a word of it: BodyPartExamined "CHEST PA" names CHEST), or names none
    (BodyPartExamined is often left empty) unless ``strict`` (then an empty body part or
    view is refused where the spec lists some; the plane is never required: a radiograph
    has none)."""
    return all(not listed or names(value, listed) or (not value and not (strict and required))
               for listed, value, required in _scoped(spec, kind))


def names(value: str, listed: Sequence[str]) -> bool:
    """Whether a header ``value`` (upper case, as :class:`ImageKind` holds it) names one of
    ``listed``: the whole value, or one of its words. Sites write BodyPartExamined as free
    text ("CHEST PA", "CHEST_AP", "THORAX, AP"), not always as the defined term alone."""
    return bool(value) and (value in listed or any(w in listed for w in _words(value)))


def _words(value: str) -> list[str]:
    return [w for w in re.split(r"[^0-9A-Z]+", value) if w]


def resolve_aliases(value: str, aliases: Mapping[str, str]) -> str:
    """``value`` with a site's own terms read as the defined ones (``aliases``: upper-case
    LOCAL -> TERM, e.g. ``{"TORAX": "CHEST"}``): the whole value when it is one, else each
    word that is one ("TORAX PA" -> "CHEST PA")."""
    if not value or not aliases:
        return value
    if value in aliases:
        return aliases[value]
    return " ".join(aliases.get(w, w) for w in _words(value))


def aliased(kind: ImageKind, aliases: Mapping[str, str]) -> ImageKind:
    """``kind`` with its body part read through a site's ``aliases`` (:func:`resolve_aliases`)."""
    if not aliases or not kind.body_part:
        return kind
    return replace(kind, body_part=resolve_aliases(kind.body_part, aliases))


def route(models: Sequence[Any], kind: ImageKind, strict: bool = False,
          roi: bool = False) -> tuple[Any | None, str | None]:
    """(the model of ``models`` that takes ``kind``, None) or (None, why none does):
    :func:`pick` and :func:`no_model_reason` together, for a caller that reports either."""
    chosen = pick(models, kind, strict)
    return (chosen, None) if chosen is not None else (None, no_model_reason(models, kind, roi, strict))


def _scoped(spec: Any, kind: ImageKind) -> tuple[tuple[tuple[str, ...], str, bool], ...]:
    """(what the spec lists, what the image is, whether strict routing requires it) for
    body part, view and plane."""
    return ((getattr(spec, "body_parts", ()), kind.body_part, True), (getattr(spec, "views", ()), kind.view, True),
            (getattr(spec, "planes", ()), kind.plane, False))


def pick(backends: Sequence[Backend], kind: ImageKind, strict: bool = False) -> Backend | None:
    """The first of ``backends`` whose spec lists ``kind.routed`` and :func:`fits` it,
    else the first that lists no modality and fits it, else None."""
    for b in backends:
        if kind.routed in b.spec.modalities and fits(b.spec, kind, strict):
            return b
    return next((b for b in backends if not b.spec.modalities and fits(b.spec, kind, strict)), None)


def pick_for_modality(backends: Sequence[Backend], modality: str) -> Backend | None:
    """:func:`pick` by routed modality alone (body part, view and plane unknown)."""
    return pick(backends, ImageKind(modality))


def fits_one_crop(shape: tuple[int, int], crop: int) -> bool:
    """Whether a frame of ``shape`` fits in one ``crop``² window (a 512² CT slice): the ROI
    path can then only skip it, and ``auto`` runs it whole (:meth:`medrt.analyzer.Analyzer.mode_for`)."""
    return shape[0] <= crop and shape[1] <= crop


def no_model_reason(models: Sequence[Backend], kind: ImageKind, roi: bool = False, strict: bool = False) -> str:
    """Why none of ``models`` takes an image of ``kind`` (:func:`pick` with ``strict`` found
    none): the reason a :class:`~medrt.errors.NoModelForImageError` gives."""
    routed, modality = kind.routed, kind.modality
    remedy = ("add one made for it (--roi-model SPEC.toml,...) or use --mode full" if roi else
              "analyse it with a model made for it (--model SPEC.toml; see models/README.md)")
    for_it = [m for m in models if routed in m.spec.modalities or not m.spec.modalities]
    if for_it:  # made for the modality, not for this body part, view or plane
        idents = ", ".join(m.spec.ident for m in for_it)
        verb = "is" if len(for_it) == 1 else "are"
        frame = f"{routed or 'unknown-modality'} frame"
        for value, key, keyword, noun in ((kind.body_part, "body_parts", "BodyPartExamined", ""),
                                          (kind.view, "views", "ViewPosition", " views")):
            if not all(getattr(m.spec, key) and not names(value, getattr(m.spec, key)) for m in for_it):
                continue
            listed = sorted({x for m in for_it for x in getattr(m.spec, key)})
            allowed = ", ".join(listed)
            if value and key == "body_parts":
                return (f"{frame} of {keyword} {value}, but {idents} {verb} for {allowed} only (the spec's "
                        f"[model] {key}; where {value} is this site's word for one of them, "
                        f"--body-part-alias {value}={listed[0]} reads it so); {remedy}")
            if value:
                return (f"{frame} of {keyword} {value}, but {idents} {verb} for {allowed}{noun} only "
                        f"(the spec's [model] {key}); {remedy}")
            if strict:
                return (f"{frame} whose header names no {keyword}, and with --strict-routing {idents} "
                        f"{verb} only for images it names as {allowed}{noun}; {remedy}")
        allowed = ", ".join(sorted({x for m in for_it for x in m.spec.planes}))
        return (f"{frame} in the {kind.plane} plane (ImageOrientationPatient: a reformat, or a scan in that "
                f"plane), but {idents} {verb} for {allowed} images only (the spec's [model] planes); {remedy}")
    what = routed or "unknown-modality"
    if routed == "SC":
        what += f" frame (a Secondary Capture, Modality {modality or 'none'})"
    elif routed.endswith(PROCESSING_SUFFIX):
        what += (" frame (a For Processing image: raw detector data before the modality's image"
                 " processing; send medrt the For Presentation image)")
    elif routed.endswith(LOCALIZER_SUFFIX):
        what += " frame (a localizer, or scout: the projection the scan was planned on, not a slice)"
    else:
        what += " frame"
    idents = ", ".join(m.spec.ident for m in models) or "none"
    allowed = ", ".join(sorted({x for m in models for x in m.spec.modalities})) or "no modality"
    if roi:
        return f"{what}, but the ROI classifier(s) {idents} are for {allowed} only; {remedy}"
    return (f"{what}, but {idents} {'is' if len(models) == 1 else 'are'} for {allowed} only "
            f"(the spec's [model] modalities); {remedy}")
