"""Deterministic synthetic frames with lesion ground truth, written as real DICOM.

Two phantoms: a CT-like axial series streaming along z (512², HU, 3-D lesions in
organs) and chest radiographs (up to 4096², nodules anywhere, including across
the border and far apart). The same seed always gives bit-identical pixels, the
same UIDs and the same files; every frame carries :class:`medrt.types.LesionTruth`
records and a uint16 label map, and written folders get a ``ground_truth.json``
sidecar that :func:`load_ground_truth` reads back.
"""

from __future__ import annotations

from medrt.phantom.ct import generate_ct_series
from medrt.phantom.dicom_write import COMPRESSIONS, ct_dataset, dx_dataset, phantom_uid
from medrt.phantom.enhanced import write_enhanced_ct
from medrt.phantom.folders import (
    SAMPLE_CT,
    SAMPLE_CT_SEED,
    SAMPLE_XRAY,
    SAMPLE_XRAY_SEED,
    make_sample,
    radiograph_scenario,
    write_ct_series,
    write_radiographs,
)
from medrt.phantom.frame import PhantomFrame
from medrt.phantom.shapes import longest_diameter_mm
from medrt.phantom.truth import FrameTruth, load_ground_truth
from medrt.phantom.xray import generate_radiograph

__all__ = [
    "PhantomFrame",
    "FrameTruth",
    "COMPRESSIONS",
    "SAMPLE_CT",
    "SAMPLE_CT_SEED",
    "SAMPLE_XRAY",
    "SAMPLE_XRAY_SEED",
    "generate_ct_series",
    "generate_radiograph",
    "write_ct_series",
    "write_enhanced_ct",
    "write_radiographs",
    "make_sample",
    "load_ground_truth",
    "radiograph_scenario",
    "ct_dataset",
    "dx_dataset",
    "phantom_uid",
    "longest_diameter_mm",
]
