"""The phantom's output record: one synthetic frame with its lesion ground truth."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from medrt.types import Frame, Geometry, LesionTruth, SourceRef, SpacingSource, Window

__all__ = ["PhantomFrame", "CT", "XRAY"]

CT = "ct"
XRAY = "xray"


@dataclass(frozen=True, slots=True, eq=False)
class PhantomFrame:
    """One generated 2-D frame, in the units and orientation medrt's reader produces.

    ``pixels`` is float32 in modality units with display semantics (higher is
    denser/brighter): HU for CT, presentation values 0..4095 for DX. The values are
    already quantised to what the DICOM file stores, so a written and re-read
    frame gives the same numbers. ``labels`` is a uint16 label map in the same
    grid (0 = background); each lesion's ``label`` is its value there. For a CT
    series a 3-D lesion keeps its label on every slice it crosses.

    ``position`` (ImagePositionPatient, mm) and ``slice_location`` are set for CT.
    ``window`` is the default (center, width) in the units of ``pixels``.
    """

    kind: str
    seed: int
    index: int
    pixels: np.ndarray
    labels: np.ndarray
    lesions: tuple[LesionTruth, ...]
    spacing_mm: tuple[float, float]
    window: tuple[float, float]
    slice_location: float | None = None
    slice_thickness_mm: float | None = None
    position: tuple[float, float, float] | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.pixels.shape[0]), int(self.pixels.shape[1]))

    @property
    def modality(self) -> str:
        return "CT" if self.kind == CT else "DX"

    def as_frame(self, key: str) -> Frame:
        """The medrt :class:`~medrt.types.Frame` that reading this frame's DICOM file would
        give, without the round trip, named ``key`` (its SOP Instance UID). A CT slice keeps
        its position in its series (axial), so its neighbours are found as in a file."""
        from pydicom.dataset import Dataset

        ct = self.kind == CT
        return Frame(
            pixels=self.pixels, spacing_mm=self.spacing_mm,
            spacing_source=SpacingSource.PIXEL_SPACING if ct else SpacingSource.IMAGER_PIXEL_SPACING,
            window=Window(*self.window), photometric="MONOCHROME2", sop_class_uid="", sop_instance_uid=key,
            series_instance_uid=f"phantom-ct-{self.seed}" if ct else "", study_instance_uid="",
            frame_of_reference_uid=None, modality=self.modality, frame_index=0, source=SourceRef(Dataset()),
            geometry=Geometry(tuple(self.position), (1.0, 0.0, 0.0, 0.0, 1.0, 0.0)) if ct and self.position else None,
        )


def freeze(arr: np.ndarray) -> np.ndarray:
    """Mark an array read-only: frames are never edited after they are made."""
    arr.flags.writeable = False
    return arr
