"""Decode benchmark: medrt's ``read_frames`` against pydicom's bare ``pixel_array``."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

from medrt.bench import interleaved_medians

__all__ = ["run_decode_bench"]

log = logging.getLogger(__name__)

# name -> (medrt.phantom compression, transfer syntax UID)
DECODE_SYNTAXES = {
    "Explicit VR Little Endian": ("none", "1.2.840.10008.1.2.1"),
    "RLE Lossless": ("rle", "1.2.840.10008.1.2.5"),
    "JPEG-LS Lossless": ("jpegls", "1.2.840.10008.1.2.4.80"),
    "JPEG 2000 Lossless": ("j2k", "1.2.840.10008.1.2.4.90"),
}


def _radiograph_file(folder: Path, size: int, compress: str) -> Path:
    """A 12-bit phantom radiograph of ``size``² written with ``compress``."""
    from medrt.phantom import generate_radiograph
    from medrt.phantom.dicom_write import dx_dataset, write_dataset

    ds, stored = dx_dataset(generate_radiograph(seed=1234, size=size))
    return write_dataset(ds, stored, folder / f"bench_{compress}.dcm", compress=compress)


def run_decode_bench(size: int = 4096, repeats: int = 9) -> dict[str, Any]:
    """medrt's ``read_frames`` (float32 modality units, window, metadata) against
    pydicom's bare ``dcmread`` + ``pixel_array`` on the same file, per transfer syntax."""
    import pydicom

    from medrt.io.dicom import read_frames

    rows = []
    with tempfile.TemporaryDirectory(prefix="medrt-bench-") as tmp:
        for name, (compress, uid) in DECODE_SYNTAXES.items():
            path = _radiograph_file(Path(tmp), size, compress)
            medians = interleaved_medians(
                {
                    "pydicom": lambda p=path: pydicom.dcmread(p).pixel_array,
                    "medrt": lambda p=path: read_frames(p),
                },
                repeats=repeats,
            )
            rows.append(
                {
                    "syntax": name,
                    "transfer_syntax_uid": uid,
                    "file_mb": round(path.stat().st_size / 1e6, 2),
                    "pydicom_ms": round(medians["pydicom"], 2),
                    "medrt_ms": round(medians["medrt"], 2),
                    "ratio": round(medians["medrt"] / medians["pydicom"], 3),
                }
            )
            log.info("decode bench %s: %s", name, rows[-1])
    return {"size": size, "repeats": repeats, "rows": rows}
