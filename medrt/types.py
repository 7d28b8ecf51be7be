"""Typed payloads that travel between pipeline stages.

They are frozen dataclasses: a stage never edits what it was given, it makes a
new object. Arrays inside them are set read-only where medrt creates them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pragma: no cover - typing only
    from pydicom.dataset import Dataset

__all__ = [
    "SpacingSource",
    "WindowSource",
    "Window",
    "Geometry",
    "SourceRef",
    "Frame",
    "LesionTruth",
    "Lesion",
    "RoiProposal",
    "StageTimings",
    "FrameResult",
]


class SpacingSource(str, enum.Enum):
    """Which attribute a frame's pixel spacing came from.

    ``PixelSpacing`` is in the patient (CT, MR) and is what measurements use;
    ``ImagerPixelSpacing`` is at the detector plane of projection radiography
    (DX, CR, MG), so sizes measured with it include the geometric magnification (also
    when a radiograph's PixelSpacing only repeats it: PS3.3 10.7.1.1). ``ERMF``: a
    radiograph's ImagerPixelSpacing divided by its Estimated Radiographic Magnification
    Factor (SID / SOD), an estimate at the patient plane, as IHE Mammography and
    Cornerstone/OHIF correct it.

    A radiograph's PixelSpacing that differs from its ImagerPixelSpacing was calibrated;
    PixelSpacingCalibrationType says how (PS3.3 10.7.1.3): ``GEOMETRY``, corrected for
    the magnification at the modality (an estimate at the patient plane, as ERMF);
    ``CALIBRATED``, against an object of known size (FIDUCIAL) or another way the
    header describes; ``UNKNOWN_CALIBRATION``, without saying how (the header does not
    conform), or a radiograph with PixelSpacing alone. Cornerstone/OHIF mark these
    "ERMF", "Calibrated" and "Unknown".
    """

    PIXEL_SPACING = "PixelSpacing"
    IMAGER_PIXEL_SPACING = "ImagerPixelSpacing"
    ERMF = "ImagerPixelSpacing/EstimatedRadiographicMagnificationFactor"
    GEOMETRY = "PixelSpacing/GEOMETRY"
    CALIBRATED = "PixelSpacing/calibrated"
    UNKNOWN_CALIBRATION = "PixelSpacing/unknown calibration"
    IMAGE_PLANE = "ImagePlanePixelSpacing"  # RT Image: at the image receptor plane
    NOMINAL_SCANNED = "NominalScannedPixelSpacing"
    NONE = "none"

    @property
    def qualifier(self) -> str:
        """What follows "mm" in a size measured with this spacing, so nobody takes a
        detector-plane size for one in the patient: "" in the patient, " at detector",
        " (ERMF)", " (calibrated)", ... (Cornerstone/OHIF mark them the same way)."""
        return _QUALIFIERS.get(self, "")


_QUALIFIERS = {
    SpacingSource.IMAGER_PIXEL_SPACING: " at detector",
    SpacingSource.ERMF: " (ERMF)",  # at the patient plane, estimated: Cornerstone's "mm ERMF"
    SpacingSource.GEOMETRY: " (ERMF)",  # corrected so at the modality: Cornerstone's too
    SpacingSource.CALIBRATED: " (calibrated)",
    SpacingSource.UNKNOWN_CALIBRATION: " (calibration unknown)",
    SpacingSource.IMAGE_PLANE: " at receptor",
    SpacingSource.NOMINAL_SCANNED: " (scanned film)",
}


class WindowSource(str, enum.Enum):
    HEADER = "header"
    PERCENTILE = "percentile"


@dataclass(frozen=True, slots=True)
class Window:
    """A VOI window in the same units as ``Frame.pixels`` (display semantics)."""

    center: float
    width: float
    source: WindowSource = WindowSource.HEADER

    @property
    def low(self) -> float:
        return self.center - self.width / 2.0

    @property
    def high(self) -> float:
        return self.center + self.width / 2.0


@dataclass(frozen=True, slots=True)
class Geometry:
    """Where a frame sits in the patient: ImagePositionPatient and ImageOrientationPatient."""

    position: tuple[float, float, float]
    orientation: tuple[float, float, float, float, float, float]

    @property
    def normal(self) -> tuple[float, float, float]:
        """Row direction × column direction: the slice normal (the same floats np.cross gives,
        without its cost, which adds up when every pair of slices of a series is compared)."""
        r0, r1, r2, c0, c1, c2 = (float(v) for v in self.orientation)
        return (r1 * c2 - r2 * c1, r2 * c0 - r0 * c2, r0 * c1 - r1 * c0)

    @property
    def plane(self) -> str:
        """The anatomical plane the frame lies nearest to: "SAGITTAL", "CORONAL" or "AXIAL"
        (its normal's largest patient-axis component: x, y or z; a tilted-gantry axial slice
        is still "AXIAL"), or "" for a degenerate orientation."""
        n = [abs(v) for v in self.normal]
        if max(n) <= 0.0:
            return ""
        return ("SAGITTAL", "CORONAL", "AXIAL")[n.index(max(n))]


@dataclass(frozen=True, slots=True, eq=False)
class SourceRef:
    """Where a frame came from, with the header that SEG/SR/SC builders need later.

    ``dataset`` is the source object's header without its pixel data, shared by
    every frame of one object. Treat it as read-only.
    """

    dataset: Dataset
    path: Path | None = None
    transfer_syntax_uid: str = ""
    number_of_frames: int = 1


@dataclass(frozen=True, slots=True, eq=False)
class Frame:
    """One 2-D image, ready for analysis.

    ``pixels`` is float32 ``(rows, cols)`` in modality units (HU for CT) after the
    modality LUT, with display semantics: higher is brighter (MONOCHROME1 input is
    inverted). For colour input it is the luminance, and ``color`` keeps the
    decoded RGB for display.
    """

    pixels: np.ndarray
    spacing_mm: tuple[float, float] | None
    spacing_source: SpacingSource
    window: Window
    photometric: str
    sop_class_uid: str
    sop_instance_uid: str
    series_instance_uid: str
    study_instance_uid: str
    frame_of_reference_uid: str | None
    modality: str
    frame_index: int
    source: SourceRef
    geometry: Geometry | None = None
    color: np.ndarray | None = None
    inverted: bool = False
    # (r0, r1, c0, c1): the rows and columns that hold the image, where all outside them is
    # Pixel Padding Value (a radiograph's black shutter or collimation border); None when
    # nothing is padded, or the padding is not a border (a CT's circle outside its field)
    content_box: tuple[int, int, int, int] | None = None

    @property
    def rows(self) -> int:
        return int(self.pixels.shape[0])

    @property
    def cols(self) -> int:
        return int(self.pixels.shape[1])

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.cols)

    @property
    def number_of_frames(self) -> int:
        return self.source.number_of_frames

    @property
    def key(self) -> str:
        """A unique, PHI-free name for the frame: ``SOPInstanceUID[#frame]``."""
        if self.source.number_of_frames > 1:
            return f"{self.sop_instance_uid}#{self.frame_index}"
        return self.sop_instance_uid

    @property
    def bare(self) -> bool:
        """True for a frame from :meth:`without_pixels` (its pixels a zero-stride view)."""
        return self.pixels.strides == (0,) * self.pixels.ndim

    def without_pixels(self) -> Frame:
        """This frame without its pixel planes: zeros of the same shape as a zero-stride view
        (no memory), no colour; header, geometry and keys stay. For holding many frames'
        results after their pixels are no longer needed."""
        return replace(self, pixels=np.broadcast_to(np.float32(0), self.pixels.shape), color=None)


@dataclass(frozen=True, slots=True)
class LesionTruth:
    """Ground truth for one lesion in one frame, as the phantom generated it.

    Coordinates are in source pixels, ``(row, col)``; ``bbox`` is half-open
    ``(r0, c0, r1, c1)``. ``label`` is the value of this lesion in the frame's
    label mask. ``contrast`` is in the frame's modality units (HU for CT).
    """

    label: int
    center: tuple[float, float]
    bbox: tuple[int, int, int, int]
    diameter_mm: float
    area_mm2: float
    contrast: float
    shape: str = "round"
    kind: str = "bright"
    extras: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Lesion:
    """One detected lesion in one frame, in source pixel coordinates ``(row, col)``.

    ``bbox`` is half-open ``(r0, c0, r1, c1)``. ``diameter_mm`` is the longest
    diameter of the component (Feret), ``area_mm2`` its pixel count times the
    pixel area. ``score`` is the mean lesion probability inside the component and
    ``max_score`` the peak. ``label`` is its value in the frame's label map.
    """

    label: int
    bbox: tuple[int, int, int, int]
    centroid: tuple[float, float]
    area_mm2: float
    diameter_mm: float
    score: float
    max_score: float
    rechecked: bool = False


@dataclass(frozen=True, slots=True)
class RoiProposal:
    """A region the ROI classifier says may hold lesions: half-open ``(r0, c0, r1, c1)``
    in source pixels, with the classifier's peak cell probability there."""

    bbox: tuple[int, int, int, int]
    score: float


@dataclass(frozen=True, slots=True)
class StageTimings:
    """Milliseconds per stage for one frame. ``total`` is wall time end to end."""

    decode: float = 0.0
    preprocess: float = 0.0
    roi: float = 0.0
    segment: float = 0.0
    recheck: float = 0.0
    postprocess: float = 0.0
    total: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {k: round(getattr(self, k), 3) for k in self.__slots__}


@dataclass(frozen=True, slots=True, eq=False)
class FrameResult:
    """What the analysis found in one frame, and what it cost.

    ``labels`` is a uint16 label map in the frame's pixel grid whose values are
    the lesions' ``label``. ``crops`` are the 1024² regions the UNet ran on
    (empty when the ROI classifier called the frame negative and the UNet was
    skipped). ``mode`` is "roi" or "full" (sliding window over the whole frame).
    """

    frame: Frame
    lesions: tuple[Lesion, ...]
    labels: np.ndarray
    presence: float
    proposals: tuple[RoiProposal, ...]
    crops: tuple[tuple[int, int, int, int], ...]
    mode: str
    timings: StageTimings
    backend: str
    precision: str
    models: tuple[str, ...]

    @property
    def skipped(self) -> bool:
        """True when the ROI classifier called the frame negative (no UNet run)."""
        return self.mode == "roi" and not self.crops

    def without_pixels(self) -> FrameResult:
        """This result with its frame :meth:`Frame.without_pixels`, and, when it found no
        lesion, its (empty) label map as zeros in a zero-stride view: half a MB per 512²
        slice, 32 MB per 4096² radiograph, not held."""
        labels = self.labels
        if not self.lesions and not labels.any():
            labels = np.broadcast_to(labels.dtype.type(0), labels.shape)
        return replace(self, frame=self.frame.without_pixels(), labels=labels)
