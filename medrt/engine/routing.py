"""Which model takes a frame: frames are routed by their DICOM Modality (Secondary
Captures as "SC", For Processing images as "<Modality> FOR PROCESSING", localizers as
"<Modality> LOCALIZER") to the first model whose spec lists it (``[model] modalities``),
else to the first that lists none; a frame no model is for is refused with the reason."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pydicom import uid

from medrt.io.header import image_type_of

if TYPE_CHECKING:
    from medrt.engine.backends.base import Backend
    from medrt.types import Frame

__all__ = ["FOR_PROCESSING", "SECONDARY_CAPTURE", "fits_one_crop", "frame_routing", "image_type_of", "no_model_reason",
           "pick_for_modality", "routing_modality"]

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


def frame_routing(frame: Frame) -> str:
    """:func:`routing_modality` of a decoded frame (its Image Type from its header)."""
    return routing_modality(frame.modality, frame.sop_class_uid, image_type_of(frame.source.dataset))


def pick_for_modality(backends: Sequence[Backend], modality: str) -> Backend | None:
    """The first of ``backends`` whose spec lists ``modality``, else the first that
    lists none (made for any), else None."""
    for b in backends:
        if modality in b.spec.modalities:
            return b
    return next((b for b in backends if not b.spec.modalities), None)


def fits_one_crop(shape: tuple[int, int], crop: int) -> bool:
    """Whether a frame of ``shape`` fits in one ``crop``² window (a 512² CT slice): the ROI
    path can then only skip it, and ``auto`` runs it whole (:meth:`medrt.analyzer.Analyzer.mode_for`)."""
    return shape[0] <= crop and shape[1] <= crop


def no_model_reason(models: Sequence[Backend], routed: str, modality: str | None, roi: bool = False) -> str:
    """Why none of ``models`` takes a frame routed as ``routed`` (its DICOM Modality:
    ``modality``): the reason a :class:`~medrt.errors.NoModelForImageError` gives."""
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
        return (f"{what}, but the ROI classifier(s) {idents} are for {allowed} only; "
                "add one made for it (--roi-model SPEC.toml,...) or use --mode full")
    return (f"{what}, but {idents} {'is' if len(models) == 1 else 'are'} for {allowed} only "
            "(the spec's [model] modalities); analyse it with a model made for it "
            "(--model SPEC.toml; see models/README.md)")
