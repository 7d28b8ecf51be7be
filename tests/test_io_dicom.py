"""medrt.io.dicom against every image file bundled in pydicom's and pynetdicom's wheels.

Each file must either decode to what pydicom's own decoder gives (after the same
LUT steps, done here with pydicom's functions in float64) or raise a clear
MedrtError naming the file. No file may raise anything else.
"""

from __future__ import annotations

import io
import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.pixels import apply_color_lut, apply_modality_lut
from pydicom.uid import (
    UID,
    ExplicitVRBigEndian,
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
    JPEGLossless,
    generate_uid,
)

from conftest import bundled_dicom_files, pydicom_test_dir, pynetdicom_test_dir
from medrt.errors import (
    CorruptDicomError,
    CorruptPixelDataError,
    DecoderMissingError,
    InputError,
    MedrtError,
    NoPixelDataError,
    NotAnImageError,
    NotDicomError,
)
from medrt.io.dicom import read_dataset, read_frames
from medrt.types import SpacingSource, WindowSource

LUMA = np.array([0.299, 0.587, 0.114])

# Files whose outcome is known; everything else must decode like pydicom.
EXPECTED_ERRORS: dict[str, type[MedrtError]] = {
    "MR_truncated.dcm": CorruptPixelDataError,
    "JPEG-lossy.dcm": CorruptPixelDataError,  # pydicom's own decoders fail on it too
    "JPEG2000-embedded-sequence-delimiter.dcm": CorruptPixelDataError,
    "test-SR.dcm": NotAnImageError,
    "reportsi.dcm": NotAnImageError,
    "liver_1frame.dcm": NotAnImageError,
    "liver_expb_1frame.dcm": NotAnImageError,
    "rtdose.dcm": NotAnImageError,
    "rtdose_rle.dcm": NotAnImageError,
    "rtplan.dcm": NotAnImageError,
    "rtstruct.dcm": NotAnImageError,
    "waveform_ecg.dcm": NotAnImageError,
    "ExplVR_BigEndNoMeta.dcm": NotAnImageError,  # an RT Ion Plan without preamble
    "no_meta.dcm": NotDicomError,
    "priv_SQ.dcm": NoPixelDataError,
    "UN_sequence.dcm": NoPixelDataError,
    "nested_priv_SQ.dcm": CorruptDicomError,  # pixel data but no Image Pixel module
    "meta_missing_tsyntax.dcm": CorruptDicomError,
}


def reference_frames(path: Path) -> list[np.ndarray]:
    """What pydicom itself gives, after the LUT steps medrt promises, in float64."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = pydicom.dcmread(path, force=True)
        if "TransferSyntaxUID" not in getattr(ds, "file_meta", {}):
            implicit, little = ds.original_encoding
            ds.file_meta = getattr(ds, "file_meta", FileMetaDataset())
            ds.file_meta.TransferSyntaxUID = (
                ExplicitVRBigEndian if not little else ImplicitVRLittleEndian if implicit else ExplicitVRLittleEndian
            )
        arr = ds.pixel_array
    n = int(ds.get("NumberOfFrames", 1) or 1)
    spp = int(ds.SamplesPerPixel)
    pi = ds.PhotometricInterpretation
    if pi == "PALETTE COLOR":
        arr = apply_color_lut(arr, ds)
        spp = 3
    arr = arr.reshape((n, ds.Rows, ds.Columns, 3) if spp == 3 else (n, ds.Rows, ds.Columns))
    if spp == 3:
        return [np.tensordot(a.astype(np.float64), LUMA, axes=([-1], [0])) for a in arr]
    out = np.asarray(apply_modality_lut(arr, ds), dtype=np.float64)
    if pi == "MONOCHROME1":
        bits, signed = ds.BitsStored, ds.PixelRepresentation == 1
        ext = np.array([-(2 ** (bits - 1)), 2 ** (bits - 1) - 1] if signed else [0, 2**bits - 1])
        lo_hi = np.asarray(apply_modality_lut(ext, ds), dtype=np.float64)
        out = lo_hi.sum() - out
    return list(out)


@pytest.mark.parametrize("path", bundled_dicom_files(), ids=lambda p: p.name)
def test_bundled_file_decodes_like_pydicom_or_fails_clearly(path: Path) -> None:
    try:
        frames = read_frames(path)
    except MedrtError as exc:
        assert isinstance(exc, InputError)
        assert str(path) in str(exc), "the error must name the file"
        assert exc.reason and len(exc.reason) > 10
        if path.name in EXPECTED_ERRORS:
            assert isinstance(exc, EXPECTED_ERRORS[path.name]), exc
            return
        if isinstance(exc, NotAnImageError):  # a deliberate refusal: SR, SEG, RT Dose, ...
            sop = pydicom.dcmread(path, force=True, stop_before_pixels=True).SOPClassUID
            assert sop.name in exc.reason
            return
        # An unexpected error is acceptable only where pydicom cannot decode either.
        with pytest.raises(Exception):  # noqa: B017 - any failure of pydicom's own decoder
            reference_frames(path)
        return
    assert path.name not in EXPECTED_ERRORS, f"expected {EXPECTED_ERRORS.get(path.name)}"
    expected = reference_frames(path)
    assert len(frames) == len(expected)
    for i, (frame, ref) in enumerate(zip(frames, expected, strict=True)):
        assert frame.pixels.dtype == np.float32
        assert frame.pixels.shape == ref.shape == (frame.rows, frame.cols)
        np.testing.assert_allclose(frame.pixels, ref, rtol=1e-6, atol=1e-3 * max(1.0, np.abs(ref).max()) * 1e-3)
        assert frame.frame_index == i
        assert not frame.pixels.flags.writeable
        assert frame.window.width > 0
        assert "PixelData" not in frame.source.dataset


def test_bundled_files_summary(capsys: pytest.CaptureFixture[str]) -> None:
    """Print how many bundled files decode and how many fail, by error kind."""
    counts: Counter[str] = Counter()
    syntaxes: set[str] = set()
    for path in bundled_dicom_files():
        try:
            frames = read_frames(path)
            counts["decoded"] += 1
            syntaxes.add(frames[0].source.transfer_syntax_uid)
        except MedrtError as exc:
            counts[type(exc).__name__] += 1
    with capsys.disabled():
        print(f"\nbundled DICOM files: {sum(counts.values())}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        print("decoded transfer syntaxes: " + ", ".join(sorted(UID(s).name for s in syntaxes)))
    assert counts["decoded"] >= 50


def _relabel(path: Path, new_ts: str) -> bytes:
    ds = pydicom.dcmread(path)
    ds.file_meta.TransferSyntaxUID = new_ts
    buf = io.BytesIO()
    ds.save_as(buf)
    return buf.getvalue()


def test_every_common_transfer_syntax_decodes() -> None:
    """The transfer syntaxes the issue names, each from a real bundled file."""
    by_ts: dict[str, list[Path]] = {}
    for path in bundled_dicom_files():
        try:
            frames = read_frames(path)
        except MedrtError:
            continue
        by_ts.setdefault(frames[0].source.transfer_syntax_uid, []).append(path)
    wanted = {
        "1.2.840.10008.1.2": "implicit LE",
        "1.2.840.10008.1.2.1": "explicit LE",
        "1.2.840.10008.1.2.2": "big endian",
        "1.2.840.10008.1.2.1.99": "deflate",
        "1.2.840.10008.1.2.5": "RLE",
        "1.2.840.10008.1.2.4.50": "JPEG baseline",
        "1.2.840.10008.1.2.4.51": "JPEG extended 12-bit",
        "1.2.840.10008.1.2.4.70": "JPEG lossless SV1",
        "1.2.840.10008.1.2.4.80": "JPEG-LS lossless",
        "1.2.840.10008.1.2.4.81": "JPEG-LS near-lossless",
        "1.2.840.10008.1.2.4.90": "JPEG 2000 lossless",
        "1.2.840.10008.1.2.4.91": "JPEG 2000",
    }
    missing = {name for uid, name in wanted.items() if uid not in by_ts}
    assert not missing, f"no bundled file decoded for: {missing}"

    # .57 (JPEG lossless, any predictor) has no bundled file; a .70 stream is a valid .57 stream.
    src = pydicom_test_dir() / "SC_rgb_jpeg_gdcm.dcm"
    as57 = read_frames(_relabel(src, JPEGLossless))
    np.testing.assert_array_equal(as57[0].pixels, read_frames(src)[0].pixels)
    assert as57[0].source.transfer_syntax_uid == JPEGLossless


def test_ct_values_are_hounsfield_units() -> None:
    path = pydicom_test_dir() / "CT_small.dcm"
    ds = pydicom.dcmread(path)
    frame = read_frames(path)[0]
    raw = ds.pixel_array
    r, c = 64, 40
    assert frame.pixels[r, c] == pytest.approx(raw[r, c] * float(ds.RescaleSlope) + float(ds.RescaleIntercept))
    assert frame.modality == "CT"
    assert frame.spacing_mm == (0.661468, 0.661468)
    assert frame.spacing_source is SpacingSource.PIXEL_SPACING
    assert frame.geometry is not None and frame.geometry.position == tuple(float(v) for v in ds.ImagePositionPatient)
    assert frame.sop_instance_uid == ds.SOPInstanceUID
    assert frame.series_instance_uid == ds.SeriesInstanceUID
    assert frame.study_instance_uid == ds.StudyInstanceUID


def test_path_bytes_fileobj_and_dataset_give_the_same_frame() -> None:
    path = pydicom_test_dir() / "MR_small_RLE.dcm"
    data = path.read_bytes()
    a = read_frames(path)[0].pixels
    b = read_frames(data)[0].pixels
    c = read_frames(io.BytesIO(data))[0].pixels
    d = read_frames(pydicom.dcmread(path))[0].pixels
    for other in (b, c, d):
        np.testing.assert_array_equal(a, other)


def test_multiframe_gives_one_frame_per_frame_sharing_one_header() -> None:
    frames = read_frames(pydicom_test_dir() / "examples_ybr_color.dcm")
    assert len(frames) == 30
    assert [f.frame_index for f in frames] == list(range(30))
    assert len({id(f.source) for f in frames}) == 1
    assert frames[0].color is not None and frames[0].color.shape == (240, 320, 3)
    # Luminance of the decoded RGB (pydicom converts YBR_FULL_422 to RGB).
    rgb = frames[3].color.astype(np.float64)
    np.testing.assert_allclose(frames[3].pixels, rgb @ LUMA, rtol=1e-5)
    assert frames[0].key.endswith("#0") and frames[5].key.endswith("#5")


def _mono_dataset(photometric: str, stored: np.ndarray, **attrs: object) -> Dataset:
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.SOPClassUID = pydicom.uid.DigitalXRayImageStorageForPresentation
    ds.SOPInstanceUID = generate_uid()
    ds.Modality = "DX"
    ds.Rows, ds.Columns = stored.shape
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = 16, 12, 11
    ds.PixelRepresentation = 0
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = photometric
    for key, value in attrs.items():
        setattr(ds, key, value)
    ds.PixelData = stored.astype("<u2").tobytes()
    return ds


def test_monochrome1_is_inverted_to_display_semantics() -> None:
    stored = np.array([[0, 1000], [3000, 4095]], dtype=np.uint16)
    ds = _mono_dataset("MONOCHROME1", stored, WindowCenter=1000, WindowWidth=500, ImagerPixelSpacing=[0.125, 0.125])
    frame = read_frames(ds)[0]
    np.testing.assert_array_equal(frame.pixels, 4095 - stored.astype(np.float32))
    assert frame.inverted
    assert frame.window.center == 3095 and frame.window.width == 500
    assert frame.window.source is WindowSource.HEADER
    assert frame.spacing_source is SpacingSource.IMAGER_PIXEL_SPACING
    # The same image stored as MONOCHROME2 with the inverse values is the same picture.
    mono2 = read_frames(_mono_dataset("MONOCHROME2", 4095 - stored, WindowCenter=3095, WindowWidth=500))[0]
    np.testing.assert_array_equal(frame.pixels, mono2.pixels)
    assert not mono2.inverted


def test_a_radiographs_spacing_says_where_it_measures() -> None:
    """PS3.3 10.7.1.1: a radiograph's ImagerPixelSpacing is at the detector, also when its
    PixelSpacing repeats it; with an Estimated Radiographic Magnification Factor it is
    corrected to the patient plane (IHE Mammography, Cornerstone/OHIF); a PixelSpacing
    that differs was calibrated, and PixelSpacingCalibrationType says how, or nobody
    knows (Cornerstone/OHIF's rules); a CT's PixelSpacing is in the patient."""
    stored = np.zeros((4, 4), dtype=np.uint16)

    def spacing(**attrs):  # type: ignore[no-untyped-def]
        frame = read_frames(_mono_dataset("MONOCHROME2", stored, **attrs))[0]
        return frame.spacing_mm, frame.spacing_source

    assert spacing(ImagerPixelSpacing=[0.15, 0.1]) == ((0.15, 0.1), SpacingSource.IMAGER_PIXEL_SPACING)
    mm, source = spacing(ImagerPixelSpacing=[0.15, 0.1], EstimatedRadiographicMagnificationFactor="1.25")
    assert mm == pytest.approx((0.12, 0.08)) and source is SpacingSource.ERMF
    for ermf in ("1.0", "0.8", ""):  # no magnification, or none that makes sense: at the detector
        assert spacing(ImagerPixelSpacing=[0.15, 0.1], EstimatedRadiographicMagnificationFactor=ermf)[1] \
            is SpacingSource.IMAGER_PIXEL_SPACING, ermf
    assert spacing(PixelSpacing=[0.15, 0.1], ImagerPixelSpacing=[0.15, 0.1],
                   EstimatedRadiographicMagnificationFactor="1.25") == ((0.15, 0.1), SpacingSource.IMAGER_PIXEL_SPACING)
    calibrated = {"PixelSpacing": [0.12, 0.08], "ImagerPixelSpacing": [0.15, 0.1]}
    assert spacing(**calibrated) == ((0.12, 0.08), SpacingSource.UNKNOWN_CALIBRATION)  # it does not say how
    assert spacing(**calibrated, PixelSpacingCalibrationType="GEOMETRY") == ((0.12, 0.08), SpacingSource.GEOMETRY)
    assert spacing(**calibrated, PixelSpacingCalibrationType="FIDUCIAL",
                   PixelSpacingCalibrationDescription="ruler") == ((0.12, 0.08), SpacingSource.CALIBRATED)
    assert spacing(**calibrated, PixelSpacingCalibrationDescription="sphere")[1] is SpacingSource.CALIBRATED
    assert spacing(PixelSpacing=[0.5, 0.5]) == ((0.5, 0.5), SpacingSource.UNKNOWN_CALIBRATION)  # a DX's alone
    assert spacing(PixelSpacing=[0.5, 0.5], Modality="CT") == ((0.5, 0.5), SpacingSource.PIXEL_SPACING)
    # a CT slice that also carries ImagerPixelSpacing (equal or not) is no radiograph
    axial = {"Modality": "CT", "ImageOrientationPatient": [1, 0, 0, 0, 1, 0], "ImagePositionPatient": [0, 0, 0]}
    for imager in ([0.5, 0.5], [0.6, 0.6]):
        assert spacing(PixelSpacing=[0.5, 0.5], ImagerPixelSpacing=imager, **axial) == \
            ((0.5, 0.5), SpacingSource.PIXEL_SPACING), imager


def test_window_first_value_from_header_and_percentile_fallback() -> None:
    stored = (np.arange(100 * 100, dtype=np.uint16) % 4096).reshape(100, 100)
    two = read_frames(_mono_dataset("MONOCHROME2", stored, WindowCenter=[40, 300], WindowWidth=[400, 1500]))[0]
    assert (two.window.center, two.window.width) == (40, 400)
    none = read_frames(_mono_dataset("MONOCHROME2", stored))[0]
    assert none.window.source is WindowSource.PERCENTILE
    lo, hi = np.percentile(stored, [0.1, 99.9])
    assert none.window.low == pytest.approx(lo) and none.window.high == pytest.approx(hi)


def test_unused_high_bits_are_masked_like_pydicom() -> None:
    stored = np.array([[0xF001, 0x0FFF]], dtype=np.uint16)  # garbage in the 4 unused bits
    frame = read_frames(_mono_dataset("MONOCHROME2", stored))[0]
    np.testing.assert_array_equal(frame.pixels, [[1, 4095]])


def test_enhanced_multiframe_functional_groups() -> None:
    """Per-frame geometry, rescale and spacing from (shared/per-frame) functional groups."""
    ds = _mono_dataset("MONOCHROME2", np.zeros((3 * 4, 4), dtype=np.uint16))
    ds.SOPClassUID = pydicom.uid.EnhancedCTImageStorage
    ds.Rows, ds.Columns, ds.NumberOfFrames = 4, 4, 3
    ds.PixelData = (np.arange(48, dtype=np.uint16)).tobytes()
    shared = Dataset()
    measures, orient, transform = Dataset(), Dataset(), Dataset()
    measures.PixelSpacing = [0.5, 0.6]
    orient.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
    transform.RescaleSlope, transform.RescaleIntercept, transform.RescaleType = 2, -1024, "HU"
    shared.PixelMeasuresSequence = [measures]
    shared.PlaneOrientationSequence = [orient]
    shared.PixelValueTransformationSequence = [transform]
    ds.SharedFunctionalGroupsSequence = [shared]
    per_frame = []
    for z in range(3):
        item, pos = Dataset(), Dataset()
        pos.ImagePositionPatient = [0, 0, 2.5 * z]
        item.PlanePositionSequence = [pos]
        per_frame.append(item)
    ds.PerFrameFunctionalGroupsSequence = per_frame
    frames = read_frames(ds)
    assert len(frames) == 3
    assert frames[2].geometry is not None and frames[2].geometry.position == (0.0, 0.0, 5.0)
    assert frames[0].spacing_mm == (0.5, 0.6)
    np.testing.assert_array_equal(frames[1].pixels, np.arange(16, 32).reshape(4, 4) * 2 - 1024)

    # Per-frame groups win over the shared one, frame by frame: a scanner that rescales,
    # windows or samples one frame its own way (every frame got frame 1's rescale before).
    own = Dataset()
    own.RescaleSlope, own.RescaleIntercept, own.RescaleType = 0.5, -1000, "HU"
    per_frame[1].PixelValueTransformationSequence = [own]
    voi, fine = Dataset(), Dataset()
    voi.WindowCenter, voi.WindowWidth = -600, 1500
    per_frame[2].FrameVOILUTSequence = [voi]
    fine.PixelSpacing = [0.25, 0.3]
    per_frame[2].PixelMeasuresSequence = [fine]
    frames = read_frames(ds)
    np.testing.assert_array_equal(frames[0].pixels, np.arange(16).reshape(4, 4) * 2 - 1024)
    np.testing.assert_array_equal(frames[1].pixels, np.arange(16, 32).reshape(4, 4) * 0.5 - 1000)
    np.testing.assert_array_equal(frames[2].pixels, np.arange(32, 48).reshape(4, 4) * 2 - 1024)
    assert (frames[2].window.center, frames[2].window.width) == (-600, 1500)
    assert frames[0].window.source is WindowSource.PERCENTILE
    assert frames[2].spacing_mm == (0.25, 0.3) and frames[1].spacing_mm == (0.5, 0.6)


# ----------------------------------------------------------------------------- bad input


def test_random_bytes_are_not_dicom(tmp_path: Path) -> None:
    path = tmp_path / "noise.dcm"
    path.write_bytes(np.random.default_rng(0).bytes(4000))
    with pytest.raises(NotDicomError, match="noise.dcm"):
        read_frames(path)
    with pytest.raises(NotDicomError):
        read_frames(b"")
    with pytest.raises(NotDicomError):
        read_frames(b"DICM" * 10)


def test_missing_file_and_directory_are_input_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        read_frames(tmp_path / "absent.dcm")
    with pytest.raises(InputError, match="is a directory"):
        read_frames(tmp_path)


def _pixel_data_end(data: bytes) -> int:
    """Offset just past the (explicit VR little endian) Pixel Data element's value."""
    at = data.rindex(b"\xe0\x7f\x10\x00")
    length = int.from_bytes(data[at + 8 : at + 12], "little")
    if length == 0xFFFFFFFF:  # encapsulated: the end of the last fragment
        return data.index(b"\xfe\xff\xdd\xe0", at)
    return at + 12 + length


@pytest.mark.parametrize("name", ["CT_small.dcm", "MR_small_RLE.dcm", "MR_small_jpeg_ls_lossless.dcm", "JPEG2000.dcm", "image_dfl.dcm"])
def test_truncated_files_give_clear_errors(name: str) -> None:
    data = (pydicom_test_dir() / name).read_bytes()
    # Cut anywhere before the end of the pixel data (what follows it, such as
    # trailing padding, can be lost without losing pixels). Deflated files are
    # compressed as a whole, so any cut loses pixels.
    end = len(data) - 8 if name == "image_dfl.dcm" else _pixel_data_end(data)
    for cut in [*np.linspace(1, end - 1, 36).astype(int), end - 1]:
        with pytest.raises(InputError) as info:
            read_frames(data[:cut])
        assert info.value.reason


def test_header_cut_in_the_middle_of_an_element(tmp_path: Path) -> None:
    path = pydicom_test_dir() / "CT_small.dcm"
    ds = pydicom.dcmread(path)
    data = path.read_bytes()
    # Find the value of (0010,0010) PatientName and cut inside it.
    offset = data.index(b"\x10\x00\x10\x00PN")
    cut = tmp_path / "cut.dcm"
    cut.write_bytes(data[: offset + 10])
    with pytest.raises((CorruptDicomError, NoPixelDataError)) as info:
        read_frames(cut)
    assert "cut.dcm" in str(info.value)
    assert str(ds.PatientName) not in str(info.value), "errors must not carry patient names"


def test_wrong_length_pixel_data() -> None:
    ds = pydicom.dcmread(pydicom_test_dir() / "CT_small.dcm")
    ds.PixelData = ds.PixelData[:-200]
    with pytest.raises(CorruptPixelDataError, match="truncated"):
        read_frames(ds)
    ds = pydicom.dcmread(pydicom_test_dir() / "CT_small.dcm")
    ds.Rows = 256  # header says twice the data there is
    with pytest.raises(CorruptPixelDataError):
        read_frames(ds)
    ds = pydicom.dcmread(pydicom_test_dir() / "CT_small.dcm")
    ds.NumberOfFrames = 1000000  # a damaged count must not allocate gigabytes
    with pytest.raises(MedrtError):
        read_frames(ds)


def test_non_image_and_no_pixel_objects() -> None:
    with pytest.raises(NotAnImageError, match="Comprehensive SR"):
        read_frames(pydicom_test_dir() / "test-SR.dcm")
    with pytest.raises(NotAnImageError, match="Segmentation"):
        read_frames(pydicom_test_dir() / "liver_1frame.dcm")
    ds = pydicom.dcmread(pydicom_test_dir() / "CT_small.dcm")
    del ds.PixelData
    with pytest.raises(NoPixelDataError, match="CT Image Storage"):
        read_frames(ds)


def test_missing_decoder_names_the_package_to_install() -> None:
    """Run in a child interpreter where the JPEG 2000 plugin packages cannot be imported."""
    code = f"""
import sys
for mod in ("openjpeg", "pylibjpeg", "libjpeg", "rle", "jpeg_ls", "PIL", "gdcm", "imagecodecs"):
    sys.modules[mod] = None  # makes "import mod" raise ImportError, as when not installed
from medrt.errors import DecoderMissingError
from medrt.io.dicom import read_frames
try:
    read_frames({str(pynetdicom_test_dir() / "MRImageStorage_JPG2000_Lossless.dcm")!r})
except DecoderMissingError as exc:
    print("OK", exc)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.startswith("OK"), out.stdout + out.stderr
    assert "MRImageStorage_JPG2000_Lossless.dcm" in out.stdout
    assert "pip install pylibjpeg pylibjpeg-openjpeg" in out.stdout


def test_decoder_missing_error_is_a_medrt_error() -> None:
    exc = DecoderMissingError("x.dcm", "no plugin", packages=("pyjpegls",))
    assert isinstance(exc, MedrtError) and "pip install pyjpegls" in str(exc)


def test_read_dataset_accepts_files_without_preamble() -> None:
    ds = pydicom.dcmread(pydicom_test_dir() / "CT_small.dcm")
    buf = io.BytesIO()
    ds.save_as(buf, enforce_file_format=False)  # keeps meta; now strip preamble+prefix
    raw = buf.getvalue()
    no_preamble = raw[132:] if raw[128:132] == b"DICM" else raw
    frames = read_frames(no_preamble)
    np.testing.assert_array_equal(frames[0].pixels, read_frames(pydicom_test_dir() / "CT_small.dcm")[0].pixels)
    assert read_dataset(no_preamble).SOPInstanceUID == ds.SOPInstanceUID


def test_truncated_file_on_disk_is_reported_not_mapped(tmp_path: Path) -> None:
    """From a path, uncompressed pixels are memory-mapped: a short file must not be mapped."""
    data = (pydicom_test_dir() / "CT_small.dcm").read_bytes()
    end = _pixel_data_end(data)
    for cut in (end - 1, end - 5000, end - 32000):
        path = tmp_path / f"cut_{cut}.dcm"
        path.write_bytes(data[:cut])
        with pytest.raises(CorruptPixelDataError, match="truncated") as info:
            read_frames(path)
        assert path.name in str(info.value)
    whole = tmp_path / "whole.dcm"
    whole.write_bytes(data)
    np.testing.assert_array_equal(read_frames(whole)[0].pixels, read_frames(data)[0].pixels)


def test_jpeg_ls_goes_to_imagecodecs_and_matches_pyjpegls() -> None:
    """JPEG-LS is decoded by imagecodecs (it releases the interpreter lock; pyjpegls
    does not), bit for bit what pyjpegls gives: bundled 8/16-bit, near-lossless,
    signed and colour (line and sample interleaved) files and the CT stream."""
    from pydicom.pixels import pixel_array

    from medrt.io import codecs

    assert codecs.preferred_plugins("1.2.840.10008.1.2.4.80")[0] == "imagecodecs"  # a dependency: never silently missing
    jls = {"1.2.840.10008.1.2.4.80", "1.2.840.10008.1.2.4.81"}
    repo = Path(__file__).resolve().parents[1]
    files = [pydicom_test_dir() / n for n in ("JPEGLSNearLossless_08.dcm", "JPEGLSNearLossless_16.dcm",
                                              "MR_small_jpeg_ls_lossless.dcm", "SC_rgb_jls_lossy_line.dcm",
                                              "SC_rgb_jls_lossy_sample.dcm")]
    files += sorted((repo / "sample_dicom" / "ct_stream").glob("*.dcm"))[:3]
    kinds = set()
    for f in files:
        ds = pydicom.dcmread(f, stop_before_pixels=True)
        assert ds.file_meta.TransferSyntaxUID in jls, f.name
        a, b = pixel_array(f, decoding_plugin="pyjpegls"), pixel_array(f, decoding_plugin="imagecodecs")
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), f.name
        kinds.add((ds.SamplesPerPixel, ds.PixelRepresentation, ds.BitsAllocated))
    assert {(3, 0, 8), (1, 1, 16), (1, 0, 8)} <= kinds


def test_jpeg_2000_goes_to_imagecodecs_and_matches_pylibjpeg(tmp_path: Path) -> None:
    """JPEG 2000 is decoded by imagecodecs (it releases the interpreter lock;
    pylibjpeg-openjpeg does not), exactly as pydicom's pylibjpeg plugin decodes it:
    signed with a pixel-representation mismatch, 14-bit, YBR_RCT colour, and a
    phantom radiograph; which syntaxes a viewer may decode on a thread follows."""
    from pydicom.pixels import pixel_array

    from medrt.bench.decode import _radiograph_file
    from medrt.io import codecs

    assert codecs.preferred_plugins("1.2.840.10008.1.2.4.90") == ("imagecodecs",)
    files = [pydicom_test_dir() / n for n in ("693_J2KI.dcm", "GDCMJ2K_TextGBR.dcm", "J2K_pixelrep_mismatch.dcm",
                                              "JPEG2000.dcm", "MR_small_jp2klossless.dcm")]
    files.append(_radiograph_file(tmp_path / "htj2k", 1024, "htj2k"))  # HTJ2K Lossless (OpenJPH)
    files.append(_radiograph_file(tmp_path, 1024, "j2k"))
    assert str(pydicom.dcmread(files[-2]).file_meta.TransferSyntaxUID) == "1.2.840.10008.1.2.4.201"
    for f in files:
        a, b = pixel_array(f, decoding_plugin="pylibjpeg"), pixel_array(f, decoding_plugin="imagecodecs")
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), f.name
    assert np.array_equal(read_frames(files[-1])[0].pixels, pixel_array(files[-1]).astype(np.float32))
    assert np.array_equal(read_frames(files[-2])[0].pixels, read_frames(files[-1])[0].pixels)  # same phantom
    assert not codecs.decode_holds_gil("1.2.840.10008.1.2.4.90")  # JPEG 2000 lossless
    assert not codecs.decode_holds_gil("1.2.840.10008.1.2.4.201")  # HTJ2K lossless
    assert not codecs.decode_holds_gil("1.2.840.10008.1.2.4.80")  # JPEG-LS lossless
    assert not codecs.decode_holds_gil(ExplicitVRLittleEndian)
    assert codecs.decode_holds_gil("1.2.840.10008.1.2.5")  # RLE: pylibjpeg-rle


def _encapsulated(src: Path, syntax: str, fragments: list[bytes], **attrs: object) -> bytes:
    """``src`` with its pixel data replaced by ``fragments`` (one per frame) in ``syntax``."""
    from pydicom.encaps import encapsulate

    ds = pydicom.dcmread(src)
    for keyword, value in attrs.items():
        setattr(ds, keyword, value)
    if len(fragments) > 1:
        ds.NumberOfFrames = len(fragments)
    ds.PixelData = encapsulate(fragments)
    ds["PixelData"].VR = "OB"
    ds["PixelData"].is_undefined_length = True
    ds.file_meta.TransferSyntaxUID = syntax
    out = io.BytesIO()
    ds.save_as(out, enforce_file_format=True)
    return out.getvalue()


def test_transfer_syntaxes_newer_than_pydicom_decode_exactly() -> None:
    """JPEG XL (libjxl through imagecodecs), Encapsulated Uncompressed and Deflated Image
    Frame Compression: pydicom 3.0 parses them but has no decoder; medrt gives it one. Each
    decodes to the uncompressed slice's values, signed data in 12 and 16 bits, several
    frames, RGB; damaged frames are named as corrupt pixel data."""
    import zlib

    import imagecodecs

    from conftest import SAMPLE_DIR
    from medrt.io import codecs

    src = sorted((SAMPLE_DIR / "ct_stream").glob("*.dcm"))[20]
    stored = pydicom.dcmread(src).pixel_array  # unsigned 12-bit, intercept -1024
    want = read_frames(src)[0].pixels
    jxl = imagecodecs.jpegxl_encode(stored, lossless=True)
    for syntax in codecs.JPEG_XL:
        (frame,) = read_frames(_encapsulated(src, syntax, [jxl]))
        assert np.array_equal(frame.pixels, want) and frame.source.transfer_syntax_uid == syntax
        assert UID(syntax).name.startswith("JPEG XL") and not codecs.decode_holds_gil(syntax)

    hu = stored.astype(np.int32) - 1024  # signed: -1024 … 3071, written as its bit patterns
    for bits in (16, 12):
        patterns = (hu & ((1 << bits) - 1)).astype(np.uint16)
        (frame,) = read_frames(_encapsulated(src, codecs.JPEG_XL[0], [imagecodecs.jpegxl_encode(patterns, lossless=True)],
                                             PixelRepresentation=1, BitsStored=bits, HighBit=bits - 1,
                                             RescaleIntercept=0))
        assert np.array_equal(frame.pixels, hu.astype(np.float32)), bits

    flipped = np.ascontiguousarray(stored[::-1])
    frames = read_frames(_encapsulated(src, codecs.JPEG_XL[0], [jxl, imagecodecs.jpegxl_encode(flipped, lossless=True)]))
    assert len(frames) == 2 and np.array_equal(frames[1].pixels, want[::-1])

    rgb = np.stack([stored >> 4, stored >> 5, stored >> 6], axis=-1).astype(np.uint8)
    (frame,) = read_frames(_encapsulated(src, codecs.JPEG_XL[2], [imagecodecs.jpegxl_encode(rgb, lossless=True)],
                                         SamplesPerPixel=3, PhotometricInterpretation="RGB", PlanarConfiguration=0,
                                         BitsAllocated=8, BitsStored=8, HighBit=7, RescaleIntercept=0))
    assert np.array_equal(frame.color, rgb)

    raw = stored.astype("<u2").tobytes()
    frames = read_frames(_encapsulated(src, codecs.ENCAPSULATED_UNCOMPRESSED, [raw, flipped.astype("<u2").tobytes()]))
    assert np.array_equal(frames[0].pixels, want) and np.array_equal(frames[1].pixels, want[::-1])
    deflate = zlib.compressobj(6, zlib.DEFLATED, -15)  # raw deflate, no zlib header (PS3.5 8.2.16)
    (frame,) = read_frames(_encapsulated(src, codecs.DEFLATED_IMAGE_FRAME, [deflate.compress(raw) + deflate.flush()]))
    assert np.array_equal(frame.pixels, want)
    assert not codecs.decode_holds_gil(codecs.DEFLATED_IMAGE_FRAME)

    for syntax, fragment, reason in (
        (codecs.JPEG_XL[0], b"\xff\x0a" + b"damaged" * 50, "JPEG XL Lossless pixel data could not be decoded"),
        (codecs.JPEG_XL[0], imagecodecs.jpegxl_encode(stored[:256], lossless=True), "codestream is 512x256"),
        (codecs.DEFLATED_IMAGE_FRAME, b"not deflate", "Deflated Image Frame Compression pixel data could not"),
        (codecs.ENCAPSULATED_UNCOMPRESSED, raw[:1000], "the frame holds 1000 bytes, 524288 expected"),
    ):
        with pytest.raises(CorruptPixelDataError, match=reason):
            read_frames(_encapsulated(src, syntax, [fragment]))


def test_jpeg_xl_without_libjxl_names_the_package(tmp_path: Path) -> None:
    import imagecodecs

    from conftest import SAMPLE_DIR
    from medrt.io import codecs

    src = sorted((SAMPLE_DIR / "ct_stream").glob("*.dcm"))[0]
    path = tmp_path / "jxl.dcm"
    path.write_bytes(_encapsulated(src, codecs.JPEG_XL[0], [imagecodecs.jpegxl_encode(pydicom.dcmread(src).pixel_array)]))
    code = f"""
import sys
sys.modules["imagecodecs"] = None  # as when not installed
from medrt.errors import DecoderMissingError
from medrt.io.dicom import read_frames
from medrt.pacs.scp import ACCEPTED_TRANSFER_SYNTAXES
assert "1.2.840.10008.1.2.4.110" not in ACCEPTED_TRANSFER_SYNTAXES  # not offered to senders either
assert "1.2.840.10008.1.2.8.1" in ACCEPTED_TRANSFER_SYNTAXES  # zlib needs nothing
try:
    read_frames({str(path)!r})
except DecoderMissingError as exc:
    print("OK", exc)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.startswith("OK"), out.stdout + out.stderr
    assert "jxl.dcm" in out.stdout and "JPEG XL Lossless" in out.stdout and "pip install imagecodecs" in out.stdout


@pytest.mark.parametrize("signed", [False, True], ids=["junk-above-12-bits", "signed-12-bit-not-extended"])
def test_bits_above_bits_stored_are_ignored_after_dcmtk_jpeg_ls(tmp_path: Path, signed: bool) -> None:
    """DCMTK's dcmcjpls (and so Orthanc's transcoding) codes a 12-bit image at 16-bit
    precision, bits above the twelfth included; the decode gives them back. PS3.5 8.1.1
    says to ignore them, as medrt does for uncompressed data: it gave values up to
    62,275 HU, or signed values read as positive, and batch lost or invented lesions."""
    from conftest import SAMPLE_DIR, require_tool

    src = sorted((SAMPLE_DIR / "ct_stream").glob("*.dcm"))[20]
    ds = pydicom.dcmread(src)
    ds.decompress()
    stored = ds.pixel_array.astype(np.int32)
    if signed:  # legal: bits above HighBit need not repeat the sign
        hu = stored - 1024
        ds.PixelRepresentation, ds.RescaleIntercept = 1, 0
        ds.PixelData = (hu & 0x0FFF).astype("<u2").tobytes()
        want = hu.astype(np.float32)
    else:
        junk = np.random.default_rng(0).integers(0, 16, stored.shape) << 12
        ds.PixelData = (stored | junk).astype("<u2").tobytes()
        want = (stored - 1024).astype(np.float32)
    plain, packed = tmp_path / "plain.dcm", tmp_path / "jls.dcm"
    ds.save_as(plain, enforce_file_format=True)
    np.testing.assert_array_equal(read_frames(plain)[0].pixels, want)  # uncompressed: already right
    run = subprocess.run([require_tool("dcmcjpls"), str(plain), str(packed)], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    assert pydicom.dcmread(packed).file_meta.TransferSyntaxUID == "1.2.840.10008.1.2.4.80"
    np.testing.assert_array_equal(read_frames(packed)[0].pixels, want)


def test_a_compressed_file_cut_inside_its_pixel_data_is_named_as_truncated_pixels(tmp_path: Path) -> None:
    """pydicom returns an empty data set when a file ends inside encapsulated pixel data;
    that read as a damaged header ("no data elements could be read") though the header
    is whole and batch had grouped the file by it."""
    from conftest import SAMPLE_DIR

    data = (SAMPLE_DIR / "radiographs" / "dx_0001.dcm").read_bytes()  # JPEG-LS
    cut = tmp_path / "cut.dcm"
    cut.write_bytes(data[:300_000])
    with pytest.raises(CorruptPixelDataError, match="cut.dcm.*ends inside the encapsulated pixel data"):
        read_frames(cut)
    with pytest.raises(CorruptDicomError):  # a header cut short is still a damaged header
        read_frames(data[:200])


@pytest.mark.parametrize(("slope", "intercept"), [("NaN", "0"), ("0", "-1024"), ("1e300", "0"), ("1", "-1e38")])
def test_a_rescale_that_cannot_give_modality_values_is_refused(tmp_path: Path, slope: str, intercept: str) -> None:
    """A NaN, zero or overflowing Rescale Slope/Intercept made every pixel NaN, infinite or
    the same value, and the image was analysed anyway (and found clear)."""
    ds = _mono_dataset("MONOCHROME2", np.arange(16, dtype=np.uint16).reshape(4, 4))
    ds.RescaleSlope, ds.RescaleIntercept = slope, intercept
    path = tmp_path / "rescaled.dcm"
    ds.save_as(path, enforce_file_format=True)
    with pytest.raises(CorruptDicomError, match="Rescale Slope .* cannot map stored values") as err:
        read_frames(path)
    assert err.value.source == str(path)


def test_native_pixel_data_holding_more_than_the_header_declares_is_refused(tmp_path: Path) -> None:
    """Rows 1 on a 64x64 slice decoded the first row alone, and a multi-frame image whose
    Number of Frames was lost decoded its first frame alone; both were analysed as whole."""
    stored = np.arange(3 * 64 * 64, dtype=np.uint16).reshape(3, 64, 64) % 4096
    ds = _mono_dataset("MONOCHROME2", stored[0])
    ds.Rows = 1
    path = tmp_path / "rows.dcm"
    ds.save_as(path, enforce_file_format=True)
    for source in (path, path.read_bytes()):  # from a file (memory map) and from memory
        with pytest.raises(CorruptPixelDataError, match="Rows, Columns or Number of Frames is wrong"):
            read_frames(source)
    ds = _mono_dataset("MONOCHROME2", stored[0])
    ds.PixelData = stored.astype("<u2").tobytes()  # three frames, no Number of Frames
    with pytest.raises(CorruptPixelDataError, match=r"3 frames' worth, but the header declares 1 frame"):
        read_frames(ds)
    ds.PixelData = stored[0].astype("<u2").tobytes() + b"\0\0"  # a little padding is harmless
    assert read_frames(ds)[0].pixels.shape == (64, 64)


def test_compressed_pixels_of_another_size_than_the_header_says_are_named_so() -> None:
    """A codestream whose size differs from Rows x Columns x Number of Frames gave numpy's
    'could not broadcast input array from shape (262144,) into shape (1024,)'."""
    ds = pydicom.dcmread(pydicom_test_dir() / "JPEG2000.dcm")
    ds.Columns = 1
    with pytest.raises(CorruptPixelDataError, match="do not fit the header's 1 frame.* Rows, Columns or Number"):
        read_frames(ds)
    ds = pydicom.dcmread(pydicom_test_dir() / "examples_ybr_color.dcm")
    ds.NumberOfFrames = 1  # 30 frames in the data
    with pytest.raises(CorruptPixelDataError, match="do not fit the header's 1 frame"):
        read_frames(ds)


@pytest.mark.parametrize(("name", "keyword"), [("CT_small.dcm", "PixelRepresentation"),
                                               ("MR_small_RLE.dcm", "BitsStored"),
                                               ("SC_rgb_rle.dcm", "PlanarConfiguration")])
def test_a_missing_type_1_pixel_attribute_is_named(name: str, keyword: str) -> None:
    """Without Pixel Representation a signed CT's negative HU were read as values near
    65,535, silently; without Bits Stored or Planar Configuration a compressed image failed
    with pydicom's "Missing required element: (0028,0101) '…'", the name redacted."""
    ds = pydicom.dcmread(pydicom_test_dir() / name)
    del ds[keyword]
    with pytest.raises(CorruptDicomError, match=f"required Image Pixel attribute.* missing: {keyword}"):
        read_frames(ds)


def _with_raw_value(ds: Dataset, keyword: str, text: str) -> bytes:
    """``ds`` as an explicit VR little-endian file whose ``keyword`` element holds ``text``
    as written, which pydicom would refuse to set ("abc" for an IS, "NaN" for a DS)."""
    import struct

    from pydicom.datadict import dictionary_VR, tag_for_keyword

    tag = tag_for_keyword(keyword)
    vr = dictionary_VR(tag)
    setattr(ds, keyword, "1\\1" if keyword.endswith("PixelSpacing") else "1")
    buf = io.BytesIO()
    ds.save_as(buf, implicit_vr=False, little_endian=True)
    data = buf.getvalue()
    key = struct.pack("<HH", tag >> 16, tag & 0xFFFF) + vr.encode()
    at = data.index(key)
    length = struct.unpack("<H", data[at + 6 : at + 8])[0]
    value = text.encode() + b" " * (len(text) % 2)
    return data[: at + 6] + struct.pack("<H", len(value)) + value + data[at + 8 + length :]


@pytest.mark.parametrize("value", ["abc", "2.5", "0", "-3"])
def test_a_number_of_frames_that_is_not_a_whole_number_is_named(tmp_path: Path, value: str) -> None:
    """pydicom read "abc", "0" or "-3" as one frame, silently, and "2.5" as two (then
    'pixel data is truncated')."""
    path = tmp_path / "frames.dcm"
    path.write_bytes(_with_raw_value(pydicom.dcmread(pydicom_test_dir() / "CT_small.dcm"), "NumberOfFrames", value))
    with pytest.raises(CorruptDicomError, match=rf"Number of Frames \(0028,0008\) is '{value}', not a whole number"):
        read_frames(path)


@pytest.mark.parametrize(("keyword", "value"), [("PixelSpacing", "1e300\\1e300"), ("PixelSpacing", "2000\\2000"),
                                                ("PixelSpacing", "0\\0"), ("PixelSpacing", "-1\\-1"),
                                                ("PixelSpacing", "NaN\\NaN"), ("PixelSpacing", "inf\\inf"),
                                                ("ImagerPixelSpacing", "1e300\\1e300")])
def test_a_pixel_spacing_that_cannot_be_a_length_is_not_used_and_the_log_says_so(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, keyword: str, value: str) -> None:
    """A PixelSpacing of 1e300 (or 2000 mm a pixel) was taken as it was: lesion sizes came out
    in 1e300 mm and the SEG failed; 0, NaN or inf were dropped without a word. Each now
    leaves the frame measured in pixels, with a warning naming the file and the value."""
    ds = _mono_dataset("MONOCHROME2", np.arange(16, dtype=np.uint16).reshape(4, 4))
    path = tmp_path / "spacing.dcm"
    path.write_bytes(_with_raw_value(ds, keyword, value))
    with caplog.at_level("WARNING", logger="medrt.io.dicom"):
        (frame,) = read_frames(path)
    assert frame.spacing_mm is None and frame.spacing_source is SpacingSource.NONE
    (record,) = [r for r in caplog.records if keyword in r.getMessage()]
    assert str(path) in record.getMessage() and "sizes are in pixels" in record.getMessage()


def test_a_believable_spacing_is_kept_and_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    ds = _mono_dataset("MONOCHROME2", np.arange(16, dtype=np.uint16).reshape(4, 4), PixelSpacing=[0.05, 99.0])
    with caplog.at_level("WARNING", logger="medrt.io.dicom"):
        (frame,) = read_frames(ds)
    assert frame.spacing_mm == (0.05, 99.0) and not caplog.records


def _enhanced_ct_with_pixel_measures(measures: list[tuple[str, str]]) -> Dataset:
    """A 4x4 enhanced CT, one frame for each (PixelSpacing, SliceThickness) given, written
    as text in each frame's own Pixel Measures (none shared), as a scanner may write them."""
    n = len(measures)
    ds = _mono_dataset("MONOCHROME2", np.zeros((n * 4, 4), dtype=np.uint16))
    ds.SOPClassUID, ds.Modality = pydicom.uid.EnhancedCTImageStorage, "CT"
    ds.Rows, ds.Columns, ds.NumberOfFrames = 4, 4, n
    shared, orient = Dataset(), Dataset()
    orient.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
    shared.PlaneOrientationSequence = [orient]
    ds.SharedFunctionalGroupsSequence = [shared]
    per_frame = []
    for z, (spacing, thickness) in enumerate(measures):
        item, pos, pm = Dataset(), Dataset(), Dataset()
        pos.ImagePositionPatient = [0, 0, 2.5 * z]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pydicom's own about a NaN DS: the damage wanted
            pm.PixelSpacing, pm.SliceThickness = spacing.split("\\"), thickness
        item.PlanePositionSequence, item.PixelMeasuresSequence = [pos], [pm]
        per_frame.append(item)
    ds.PerFrameFunctionalGroupsSequence = per_frame
    return ds


def test_per_frame_pixel_measures_that_cannot_be_lengths_are_warned_of_by_frame(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An enhanced CT keeps its spacing in each frame's Pixel Measures. A frame whose spacing
    was 0, NaN, 1e300, negative or one value was measured in pixels without a word: the
    warning looked at the top level and the shared group only (and the first frame's).
    Now it names the file, each value and its frames; the good frames keep mm."""
    good = ("0.5\\0.6", "2.5")
    ds = _enhanced_ct_with_pixel_measures([good, ("0\\0", "2.5"), ("NaN\\NaN", "2.5"), ("1e300\\1e300", "2.5"),
                                           ("-0.5\\-0.5", "2.5"), ("0.7", "2.5"), ("0.5\\0.6", "NaN"), good])
    path = tmp_path / "enhanced.dcm"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.save_as(path, enforce_file_format=True)
    with caplog.at_level("WARNING", logger="medrt.io.dicom"):
        frames = read_frames(path)
    assert [f.spacing_mm for f in frames] == [(0.5, 0.6), None, None, None, None, None, (0.5, 0.6), (0.5, 0.6)]
    (record,) = [r for r in caplog.records if "cannot be a length" in r.getMessage()]
    text = record.getMessage()
    assert text.startswith(f"{path}: ")
    for said in ("PixelSpacing 0\\0 on frame 2 of 8", "PixelSpacing NaN\\NaN on frame 3 of 8",
                 "PixelSpacing 1e300\\1e300 on frame 4 of 8", "PixelSpacing -0.5\\-0.5 on frame 5 of 8",
                 "PixelSpacing 0.7 on frame 6 of 8", "SliceThickness NaN on frame 7 of 8",
                 "sizes on frames 2, 3, 4, 5, 6 of 8 are in pixels"):
        assert said in text, text


def test_pixel_measures_both_shared_and_per_frame_measure_each_frame_by_its_own_and_warn_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A functional group belongs in the shared or the per-frame groups (PS3.3 C.7.6.16), but
    some conversions write Pixel Measures in both. Each frame is measured with its own (as the
    SEG writer reads them, per frame first), and one warning names the file and what differs;
    the object was read without a word that its shared PixelSpacing was not the one used."""
    ds = _enhanced_ct_with_pixel_measures([("0.5\\0.5", "2.5"), ("0.5\\0.5", "2.5"), ("0.7\\0.7", "2.5")])
    del ds.PerFrameFunctionalGroupsSequence[1].PixelMeasuresSequence  # frame 2 has only the shared one
    shared = Dataset()
    shared.PixelSpacing, shared.SliceThickness = [0.7, 0.7], 2.5
    ds.SharedFunctionalGroupsSequence[0].PixelMeasuresSequence = [shared]
    path = tmp_path / "both.dcm"
    ds.save_as(path, enforce_file_format=True)
    with caplog.at_level("WARNING", logger="medrt.io.dicom"):
        frames = read_frames(path)
    assert [f.spacing_mm for f in frames] == [(0.5, 0.5), (0.7, 0.7), (0.7, 0.7)]
    (record,) = [r for r in caplog.records if "Pixel Measures" in r.getMessage()]
    text = record.getMessage()
    assert text.startswith(f"{path}: ") and "PixelSpacing 0.7\\0.7 shared, 0.5\\0.5 on frame 1 of 3" in text, text
    assert "SliceThickness" not in text  # the same in both
    ds.PerFrameFunctionalGroupsSequence[0].PixelMeasuresSequence[0].PixelSpacing = [0.7, 0.7]
    caplog.clear()
    with caplog.at_level("WARNING", logger="medrt.io.dicom"):
        assert [f.spacing_mm for f in read_frames(ds)] == [(0.7, 0.7)] * 3
    assert not caplog.records  # both, but saying the same: nothing to warn of


def test_a_frames_own_pixel_measures_without_a_value_the_shared_give_take_the_shared_one_and_warn_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Pixel Measures both shared and per frame, a frame's own item without the PixelSpacing (or
    SliceThickness) the shared one gives: the frame was read without a spacing, silently, while a
    reader such as OHIF takes the shared one. Now each attribute comes from the frame's own item
    where it gives one, else from the shared item, and one warning names the file and the frames.
    A value the frame gives that is not a length (0\\0) stays refused: it is not the shared one."""
    from medrt.io.header import pixel_measures_item

    ds = _enhanced_ct_with_pixel_measures([("0.5\\0.5", "2.5")] * 3 + [("0\\0", "2.5"), ("0.5\\0.5", "2.5")])
    shared = Dataset()
    shared.PixelSpacing, shared.SliceThickness = [0.5, 0.5], 2.5
    ds.SharedFunctionalGroupsSequence[0].PixelMeasuresSequence = [shared]
    del ds.PerFrameFunctionalGroupsSequence[1].PixelMeasuresSequence[0].PixelSpacing
    del ds.PerFrameFunctionalGroupsSequence[2].PixelMeasuresSequence[0].SliceThickness
    ds.PerFrameFunctionalGroupsSequence[4].PixelMeasuresSequence[0].PixelSpacing = None  # empty: says nothing
    path = tmp_path / "gaps.dcm"
    ds.save_as(path, enforce_file_format=True)
    with caplog.at_level("WARNING", logger="medrt.io.dicom"):
        frames = read_frames(path)
    assert [f.spacing_mm for f in frames] == [(0.5, 0.5)] * 3 + [None, (0.5, 0.5)]
    assert float(pixel_measures_item(ds, 2).SliceThickness) == 2.5
    assert "SliceThickness" not in ds.PerFrameFunctionalGroupsSequence[2].PixelMeasuresSequence[0]  # not changed
    (record,) = [r for r in caplog.records if "shared value" in r.getMessage()]
    text = record.getMessage()
    assert text.startswith(f"{path}: "), text
    assert "PixelSpacing 0.5\\0.5 shared, not in the own Pixel Measures of frames 2, 5 of 5" in text, text
    assert "SliceThickness 2.5 shared, not in the own Pixel Measures of frame 3 of 5" in text, text
    assert "frame 4" not in text
    (record,) = [r for r in caplog.records if "cannot be a length" in r.getMessage()]
    assert "PixelSpacing 0\\0 on frame 4 of 5" in record.getMessage()


def test_an_enhanced_objects_pixel_measures_come_before_a_top_level_pixel_spacing_left_behind() -> None:
    """A conversion that leaves the single-frame PixelSpacing at the top level of an enhanced
    object had that measure every frame, though the functional groups (which the SEG is built
    with) say otherwise; the frame's Pixel Measures now come first."""
    ds = _enhanced_ct_with_pixel_measures([("0.5\\0.5", "2.5"), ("0.6\\0.6", "2.5")])
    ds.PixelSpacing = [0.9, 0.9]
    assert [f.spacing_mm for f in read_frames(ds)] == [(0.5, 0.5), (0.6, 0.6)]


def test_errors_and_warnings_name_an_open_file_by_its_path(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Read from an open file, a data set's errors and warnings named it "<dataset UID>" (and
    the log of its read "<BufferedReader>"): the file's own name says which file it is."""
    ds = _mono_dataset("MONOCHROME2", np.arange(16, dtype=np.uint16).reshape(4, 4), PixelSpacing=[0, 0])
    path = tmp_path / "zero_spacing.dcm"
    ds.save_as(path, enforce_file_format=True)
    with caplog.at_level("WARNING", logger="medrt.io.dicom"), path.open("rb") as fh:
        (frame,) = read_frames(fh)
    assert frame.spacing_mm is None
    (record,) = [r for r in caplog.records if "cannot be a length" in r.getMessage()]
    assert record.getMessage().startswith(f"{path}: "), record.getMessage()
    del ds.PixelData
    ds.save_as(path, enforce_file_format=True)
    with path.open("rb") as fh, pytest.raises(NoPixelDataError) as err:
        read_frames(fh)
    assert err.value.source == str(path)
    with pytest.raises(NoPixelDataError) as err:  # from memory: known by its UID, as before
        read_frames(io.BytesIO(path.read_bytes()))
    assert err.value.source == f"<dataset {ds.SOPInstanceUID}>"


def test_one_bad_value_on_many_frames_is_said_once() -> None:
    from medrt.io.header import unbelievable_spacings

    ds = _enhanced_ct_with_pixel_measures([("0\\0", "1")] * 9 + [("0.5\\0.5", "1")])
    assert unbelievable_spacings(ds) == ["PixelSpacing 0\\0 on frames 1, 2, 3, 4, 5, 6 and 3 more of 10"]


@pytest.mark.parametrize(("keyword", "value", "said"), [
    ("PixelSpacing", "0\\0", "PixelSpacing 0\\0 is not a length in mm"),
    ("PixelSpacing", "0.7", "PixelSpacing 0.7 is 1 value(s), not a row and a column spacing"),
    ("ImagerPixelSpacing", "1e300\\1e300", "ImagerPixelSpacing 1e300\\1e300 is not a length in mm"),
    ("PixelSpacing", "", None),  # none in the header: nothing to say but that
])
def test_spacing_problem_says_what_the_header_gave(keyword: str, value: str, said: str | None) -> None:
    from medrt.io.header import spacing_problem

    ds = read_dataset(_with_raw_value(_mono_dataset("MONOCHROME2", np.zeros((4, 4))), keyword, value))
    assert spacing_problem(ds) == said


def test_spacing_problem_reads_the_frame_s_own_pixel_measures() -> None:
    from medrt.io.header import spacing_problem

    ds = _enhanced_ct_with_pixel_measures([("0.5\\0.5", "1"), ("NaN\\NaN", "1")])
    assert spacing_problem(ds, 0) is None  # it has a spacing
    assert spacing_problem(ds, 1) == "PixelSpacing NaN\\NaN is not a length in mm"


def test_palette_color_without_its_lookup_table_is_named() -> None:
    """Was "an attribute cannot be read (ValueError: No suitable Palette Color Lookup Table
    Module found)"."""
    ds = pydicom.dcmread(pydicom_test_dir() / "CT_small.dcm")
    ds.PhotometricInterpretation = "PALETTE COLOR"
    with pytest.raises(CorruptDicomError, match="is PALETTE COLOR but the Palette Color Lookup Table .* is missing"):
        read_frames(ds)


@pytest.mark.parametrize("value", [None, "", "MONOCHROME3", "RGB"])
@pytest.mark.parametrize("name", ["CT_small.dcm", "MR_small_RLE.dcm", "JPEG2000.dcm"])
def test_a_greyscale_image_without_a_known_photometric_is_read_as_monochrome2_with_a_warning(
        caplog: pytest.LogCaptureFixture, name: str, value: str | None) -> None:
    """Missing (Type 1, but archives hold such files), empty or unknown: read as greyscale
    silently, the Frame saying "" or "MONOCHROME3". Now MONOCHROME2 as most viewers do, the
    log naming the file, the frame and its header saying MONOCHROME2."""
    ds = pydicom.dcmread(pydicom_test_dir() / name)
    expected = read_frames(ds)[0].pixels
    if value is None:
        del ds.PhotometricInterpretation
    else:
        ds.PhotometricInterpretation = value
    with caplog.at_level("WARNING", logger="medrt.io.dicom"):
        (frame,) = read_frames(ds)[:1]
    np.testing.assert_array_equal(frame.pixels, expected)
    assert frame.photometric == "MONOCHROME2" and frame.source.dataset.PhotometricInterpretation == "MONOCHROME2"
    assert any("read as MONOCHROME2" in r.getMessage() and ds.SOPInstanceUID in r.getMessage() for r in caplog.records)


def test_a_colour_image_without_a_known_photometric_is_refused() -> None:
    ds = pydicom.dcmread(pydicom_test_dir() / "SC_rgb_rle.dcm")
    ds.PhotometricInterpretation = "MONOCHROME2"
    with pytest.raises(CorruptDicomError, match="Photometric Interpretation is 'MONOCHROME2', which is not one for 3"):
        read_frames(ds)


def _claiming(ds: Dataset, syntax: str) -> bytes:
    """``ds`` written as it is encoded, its file meta claiming transfer syntax ``syntax``."""
    from pydicom.filebase import DicomBytesIO
    from pydicom.filewriter import write_dataset, write_file_meta_info

    encoding = ds.file_meta.TransferSyntaxUID
    fp = DicomBytesIO()
    fp.write(b"\0" * 128 + b"DICM")
    meta = ds.file_meta
    meta.TransferSyntaxUID = syntax
    write_file_meta_info(fp, meta, enforce_standard=True)
    fp.is_little_endian, fp.is_implicit_VR = True, encoding.is_implicit_VR
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = encoding
    write_dataset(fp, ds)
    return fp.getvalue()


@pytest.mark.parametrize(("name", "claimed", "reason"), [
    ("CT_small.dcm", pydicom.uid.JPEGBaseline8Bit, "which is compressed, but the pixel data is not encapsulated"),
    ("CT_small.dcm", pydicom.uid.RLELossless, "which is compressed, but the pixel data is not encapsulated"),
    ("MR_small_RLE.dcm", ExplicitVRLittleEndian, "which is uncompressed, but the pixel data is encapsulated"),
    ("JPEG2000.dcm", ImplicitVRLittleEndian, "which is uncompressed, but the pixel data is encapsulated"),
    ("MR_small_RLE.dcm", pydicom.uid.JPEGBaseline8Bit, r"says JPEG Baseline .* but the pixel data is RLE"),
    ("MR_small_RLE.dcm", pydicom.uid.JPEG2000Lossless, r"says JPEG 2000 .* but the pixel data is RLE"),
    ("JPEG2000.dcm", pydicom.uid.RLELossless, r"says RLE Lossless .* but the pixel data is JPEG 2000"),
    ("JPEG2000.dcm", JPEGLossless, r"says JPEG Lossless, .* but the pixel data is JPEG 2000"),
])
def test_pixel_data_of_another_encoding_than_the_transfer_syntax_says_is_named_so(
        tmp_path: Path, name: str, claimed: str, reason: str) -> None:
    """Raw pixels in a file marked JPEG were "encapsulated pixel data is damaged (Found
    unexpected tag (00AF,00B4)...)", an RLE frame marked JPEG "SOI marker missing", an
    encapsulated image marked Explicit VR Little Endian "pixel data is truncated"."""
    path = tmp_path / "claimed.dcm"
    path.write_bytes(_claiming(pydicom.dcmread(pydicom_test_dir() / name), claimed))
    with pytest.raises(CorruptPixelDataError, match=reason) as err:
        read_frames(path)
    assert "the file's transfer syntax is wrong" in str(err.value) and err.value.source == str(path)


@pytest.mark.parametrize("name", ["MR_small_RLE.dcm", "JPEG2000.dcm"])
def test_a_data_set_built_in_memory_with_encapsulated_pixel_data_decodes(name: str) -> None:
    """``ds.PixelData = encapsulate(frames)`` leaves the element's undefined-length flag
    unset (pydicom sets it only when it reads a file): pydicom decodes such a data set,
    and so did medrt, until the check for a transfer syntax that lies refused it as
    "not encapsulated (it is uncompressed)"."""
    from pydicom.encaps import encapsulate, generate_frames

    ds = pydicom.dcmread(pydicom_test_dir() / name)
    expected = ds.pixel_array
    frames = list(generate_frames(ds.PixelData, number_of_frames=1))
    del ds.PixelData  # a new element, as a data set built in memory has
    ds.PixelData = encapsulate(frames)
    assert not ds["PixelData"].is_undefined_length  # the case: pydicom does not set it
    (frame,) = read_frames(ds)
    assert np.array_equal(frame.pixels, expected)


def _overrunning_rle(ds: Dataset) -> Dataset:
    """MR_small_RLE with its segments' control bytes rewritten so that runs overrun the
    frame: pylibjpeg-rle panicked on it ("index out of bounds: the len is 8192...")."""
    from pydicom.encaps import encapsulate, generate_frames

    frame = bytearray(next(generate_frames(ds.PixelData, number_of_frames=1)))
    for i in range(64, len(frame), 7):
        frame[i] = 0x81
    ds.PixelData = encapsulate([bytes(frame)])
    return ds


def test_rle_data_that_made_the_rust_decoder_panic_is_a_decode_error_with_no_trace(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """pylibjpeg-rle's panic came as pyo3's PanicException (a BaseException) after Rust
    printed its trace to stderr, for each such file of a batch or the listener."""
    path = tmp_path / "overrun.dcm"
    _overrunning_rle(pydicom.dcmread(pydicom_test_dir() / "MR_small_RLE.dcm")).save_as(path)
    with pytest.raises(CorruptPixelDataError) as err:
        read_frames(path)
    assert err.value.source == str(path) and "RLE" in str(err.value)
    assert "panicked" not in capfd.readouterr().err


@pytest.mark.parametrize(("header", "reason"), [
    ((3, 64, 1948), "declares 3 segment"),
    ((2, 60, 1948), "first segment offset is 60"),
    ((2, 64, 64), "segment 1 offset 64 is not before the next one"),
    ((2, 64, 99999), "segment 2 offset 99999 is not before the end of the"),
])
def test_an_rle_header_that_does_not_fit_its_frame_is_named(header: tuple[int, ...], reason: str) -> None:
    import struct

    from pydicom.encaps import encapsulate, generate_frames

    ds = pydicom.dcmread(pydicom_test_dir() / "MR_small_RLE.dcm")
    frame = next(generate_frames(ds.PixelData, number_of_frames=1))
    ds.PixelData = encapsulate([struct.pack("<16L", *header, *[0] * (16 - len(header))) + frame[64:]])
    with pytest.raises(CorruptPixelDataError, match=reason):
        read_frames(ds)


def test_an_rle_frame_medrt_rle_refuses_is_not_handed_to_another_plugin() -> None:
    """When medrt-rle refuses a frame, pydicom's other RLE plugins are not asked (it would go
    on to them were no plugin named): pylibjpeg-rle's decode_frame is the one that panics,
    and pydicom's own decodes a header whose first segment starts at byte 60 into another
    image, warning only of padding. A multi-frame object with one such frame among good
    ones is a decode error too, not good frames from one plugin and that one from another."""
    import struct

    from pydicom.encaps import encapsulate, generate_frames
    from pydicom.pixels import pixel_array

    ds = pydicom.dcmread(pydicom_test_dir() / "MR_small_RLE.dcm")
    reference = ds.pixel_array.copy()
    good = next(generate_frames(ds.PixelData, number_of_frames=1))
    shifted = struct.pack("<16L", 2, 60, 1948, *[0] * 13) + good[64:]
    ds.PixelData = encapsulate([shifted])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert not np.array_equal(pixel_array(ds, decoding_plugin="pydicom"), reference)  # what a fallback gives
    with pytest.raises(CorruptPixelDataError, match="first segment offset is 60"):
        read_frames(ds)
    ds.NumberOfFrames, ds.PixelData = 3, encapsulate([good, shifted, good])
    with pytest.raises(CorruptPixelDataError, match="medrt-rle: the RLE header's first segment offset is 60"):
        read_frames(ds)


@pytest.mark.parametrize(("keyword", "value"), [("SliceThickness", "0"), ("SpacingBetweenSlices", "-2.5")])
def test_customary_non_lengths_are_not_used_and_not_warned_of(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, keyword: str, value: str) -> None:
    """A SliceThickness of 0 (radiographs and secondary captures often say "not applicable"
    so) and NM's signed SpacingBetweenSlices were never used; a warning for each such file
    filled a batch's log. The in-plane spacing is kept and nothing is logged."""
    ds = _mono_dataset("MONOCHROME2", np.arange(16, dtype=np.uint16).reshape(4, 4), PixelSpacing=[0.5, 0.5])
    path = tmp_path / "thin.dcm"
    path.write_bytes(_with_raw_value(ds, keyword, value))
    with caplog.at_level("WARNING", logger="medrt.io.dicom"):
        (frame,) = read_frames(path)
    assert frame.spacing_mm == (0.5, 0.5)
    assert not [r for r in caplog.records if keyword in r.getMessage()]
