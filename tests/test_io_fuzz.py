"""Property-based fuzzing: mutated real files decode or raise a MedrtError, nothing else."""

from __future__ import annotations

import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import pydicom_test_dir
from medrt.errors import InputError
from medrt.io.dicom import read_frames

SEEDS = [
    "CT_small.dcm",
    "MR_small_RLE.dcm",
    "MR_small_jpeg_ls_lossless.dcm",
    "MR_small_jp2klossless.dcm",
    "JPGExtended.dcm",
    "SC_rgb_jpeg_gdcm.dcm",
    "SC_rgb_rle_2frame.dcm",
    "image_dfl.dcm",
    "MR_small_bigendian.dcm",
    "examples_palette.dcm",
]
DATA = {name: (pydicom_test_dir() / name).read_bytes() for name in SEEDS}


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(DATA[draw(st.sampled_from(SEEDS))])
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["flip", "set", "cut", "insert", "delete"]))
        at = draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set":
            data[at] = draw(st.integers(0, 255))
        elif kind == "cut":
            del data[at:]
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        else:
            del data[at : at + draw(st.integers(1, 16))]
        if not data:
            break
    return bytes(data)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(mutated())
def test_mutated_files_never_crash(data: bytes) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            frames = read_frames(data)
        except InputError as exc:
            assert exc.reason
            return
    for frame in frames:
        assert frame.pixels.ndim == 2 and frame.pixels.size > 0


@pytest.mark.parametrize("name", SEEDS)
def test_fuzz_seeds_decode_unmutated(name: str) -> None:
    assert read_frames(DATA[name])
