"""Deterministic synthetic frames with lesion ground truth, written as real DICOM.

Two phantoms: a CT-like axial series streaming along z (512², HU, 3-D lesions in
organs) and chest radiographs (up to 4096², nodules anywhere, including across
the border and far apart). The same seed always gives bit-identical pixels, the
same UIDs and the same files; every frame carries :class:`medrt.types.LesionTruth`
records and a uint16 label map, and written folders get a ``ground_truth.json``
sidecar that :func:`load_ground_truth` reads back.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Each name from the submodule that defines it, imported when first used (PEP 562): the
# product imports medrt.phantom.shapes, .truth and .frame (lesion diameters, ground truth
# for eval and the INT8 gate), which ran this file and with it the generators and
# SimpleITK (~145 MB resident, a few hundred ms) in every batch, listener and viewer.
_FROM = {
    "generate_ct_series": "ct",
    "COMPRESSIONS": "dicom_write", "ct_dataset": "dicom_write", "dx_dataset": "dicom_write",
    "phantom_uid": "dicom_write",
    "write_enhanced_ct": "enhanced",
    "SAMPLE_CT": "folders", "SAMPLE_CT_SEED": "folders", "SAMPLE_XRAY": "folders",
    "SAMPLE_XRAY_SEED": "folders", "make_sample": "folders", "radiograph_scenario": "folders",
    "write_ct_series": "folders", "write_radiographs": "folders",
    "PhantomFrame": "frame",
    "longest_diameter_mm": "shapes",
    "FrameTruth": "truth", "load_ground_truth": "truth",
    "generate_radiograph": "xray",
}

if TYPE_CHECKING:  # pragma: no cover - for type checkers and editors
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


def __getattr__(name: str) -> Any:
    module = _FROM.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_FROM])


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
