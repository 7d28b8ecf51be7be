"""Phantom folders: DICOM files plus their ground-truth sidecar, and the committed sample.

:func:`make_sample` rebuilds ``sample_dicom/`` exactly (same seeds, same bytes),
so the committed files can always be regenerated and checked.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from medrt.phantom.ct import generate_ct_series
from medrt.phantom.dicom_write import COMPRESSIONS, ct_dataset, dx_dataset, write_dataset
from medrt.phantom.frame import CT, XRAY
from medrt.phantom.seeding import check_seed
from medrt.phantom.truth import MASKS_NPZ, TRUTH_JSON, TruthEntry, TruthWriter
from medrt.phantom.xray import generate_radiograph
from medrt.types import SpacingSource

__all__ = [
    "write_ct_series",
    "write_radiographs",
    "make_sample",
    "radiograph_scenario",
    "SAMPLE_CT",
    "SAMPLE_XRAY",
    "SAMPLE_CT_SEED",
    "SAMPLE_XRAY_SEED",
]

log = logging.getLogger(__name__)

SAMPLE_CT_SEED = 7
SAMPLE_XRAY_SEED = 7
# The committed sample set, as the keyword arguments of the writers (read-only).
SAMPLE_CT: Mapping[str, Any] = MappingProxyType(
    {"seed": SAMPLE_CT_SEED, "n_frames": 40, "size": 512, "compress": "jpegls"}
)
SAMPLE_XRAY: Mapping[str, Any] = MappingProxyType(
    {
        "seed": SAMPLE_XRAY_SEED,
        "count": 3,
        "size": 4096,
        "compress": "jpegls",
        "monochrome1_every": 2,
        "spacing_mm": 0.125,
    }
)


def write_ct_series(
    out_dir: str | Path, seed: int, n_frames: int = 40, size: int = 512, compress: str = "rle",
    thickness_mm: float | None = None,
) -> list[Path]:
    """Write a CT phantom series as ``ct_0001.dcm``... plus its ground truth; return the files.
    ``thickness_mm``: the same anatomy in slices that thin (:func:`generate_ct_series`)."""
    _check_compress(compress)
    out = Path(out_dir)
    frames = generate_ct_series(seed, n_frames=n_frames, size=size, thickness_mm=thickness_mm)
    paths: list[Path] = []
    with TruthWriter(out, seed, CT) as truth:
        for f in frames:
            ds, stored = ct_dataset(f)
            name = f"ct_{f.index + 1:04d}.dcm"
            paths.append(write_dataset(ds, stored, out / name, compress))
            truth.add(
                TruthEntry(
                    f,
                    name,
                    ds.SOPInstanceUID,
                    ds.PhotometricInterpretation,
                    SpacingSource.PIXEL_SPACING.value,
                )
            )
    log.info("wrote %d CT slices to %s", len(paths), out)
    return paths


def radiograph_scenario(index: int) -> dict[str, bool]:
    """Which edge cases radiograph ``index`` of a set asks for, in a cycle of three.

    0: two nodules at opposite corners; 1: a nodule across the image border;
    2: random nodules only (possibly none).
    """
    return {"far_apart": index % 3 == 0, "border_lesion": index % 3 == 1}


def write_radiographs(
    out_dir: str | Path,
    seed: int,
    count: int = 3,
    size: int = 4096,
    compress: str = "jpegls",
    monochrome1_every: int | None = 2,
    spacing_mm: float | None = None,
) -> list[Path]:
    """Write ``count`` chest radiographs as ``dx_0001.dcm``... plus ground truth.

    Frame ``i`` follows :func:`radiograph_scenario`. With ``monochrome1_every=k``,
    every k-th frame (``i % k == k - 1``) is stored as MONOCHROME1; 1 makes all of
    them MONOCHROME1, None none. ``spacing_mm`` fixes ImagerPixelSpacing (drawn
    per frame in 0.1-0.15 mm when None).
    """
    seed = check_seed(seed)
    if not isinstance(count, int) or count < 1:
        raise ValueError(f'Argument "count" must be a positive integer, got {count!r}.')
    if monochrome1_every is not None and monochrome1_every < 1:
        raise ValueError(
            f'Argument "monochrome1_every" must be None or >= 1, got {monochrome1_every!r}.'
        )
    _check_compress(compress)
    out = Path(out_dir)
    paths: list[Path] = []
    with TruthWriter(out, seed, XRAY) as truth:
        for i in range(count):
            f = generate_radiograph(
                seed, size, index=i, spacing_mm=spacing_mm, **radiograph_scenario(i)
            )
            mono1 = bool(monochrome1_every) and i % monochrome1_every == monochrome1_every - 1
            ds, stored = dx_dataset(f, monochrome1=mono1)
            name = f"dx_{i + 1:04d}.dcm"
            paths.append(write_dataset(ds, stored, out / name, compress))
            truth.add(
                TruthEntry(
                    f,
                    name,
                    ds.SOPInstanceUID,
                    ds.PhotometricInterpretation,
                    SpacingSource.IMAGER_PIXEL_SPACING.value,
                )
            )
            del f, ds, stored
    log.info("wrote %d radiographs to %s", len(paths), out)
    return paths


def _check_compress(compress: str) -> None:
    if compress not in COMPRESSIONS:
        raise ValueError(
            f'Argument "compress" must be one of {", ".join(COMPRESSIONS)}, got {compress!r}.'
        )


def _clear(folder: Path) -> None:
    """Remove what a previous sample run wrote there (only phantom files)."""
    if not folder.is_dir():
        return
    for p in [*folder.glob("ct_*.dcm"), *folder.glob("dx_*.dcm")]:
        p.unlink()
    for name in (TRUTH_JSON, MASKS_NPZ):
        (folder / name).unlink(missing_ok=True)


def make_sample(out_dir: str | Path) -> list[Path]:
    """Regenerate the committed sample set in ``out_dir``, byte for byte.

    ``ct_stream/``: one 40-slice 512² CT series (JPEG-LS lossless), with
    lesion-free slices. ``radiographs/``: three 4096² chest DX (JPEG-LS lossless,
    ImagerPixelSpacing 0.125 mm): corner nodules far apart, a nodule across the
    border (stored MONOCHROME1), and random nodules. Each has its own sidecar.
    """
    out = Path(out_dir)
    ct_dir, dx_dir = out / "ct_stream", out / "radiographs"
    _clear(ct_dir)
    _clear(dx_dir)
    paths = write_ct_series(ct_dir, **SAMPLE_CT)
    paths += write_radiographs(dx_dir, **SAMPLE_XRAY)
    return paths
