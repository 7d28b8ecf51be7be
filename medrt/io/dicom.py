"""Decode DICOM (a path, bytes or a Dataset) into :class:`~medrt.types.Frame` objects.

pydicom parses, and its registered plugins decode (pylibjpeg-libjpeg for JPEG,
imagecodecs or pylibjpeg-openjpeg for JPEG 2000, imagecodecs or pyjpegls for
JPEG-LS (see medrt.io.codecs), pylibjpeg-rle or numpy for
RLE). This module adds what analysis needs on top:

* one ``Frame`` per frame, pixels float32 in modality units (rescale or modality
  LUT applied), MONOCHROME1 inverted to display semantics, colour reduced to
  luminance with the RGB kept for display;
* spacing, geometry, UIDs and a default window, from classic or enhanced
  (functional-group) headers;
* a clear :class:`~medrt.errors.InputError` subclass, naming the input and the
  reason, for every way an input can be unusable.

Uncompressed little-endian greyscale data takes a fast path: one cast from a view
on the file's bytes, instead of pydicom's copy followed by a float64 rescale, so
decoding a 4096² frame costs about what pydicom's bare ``pixel_array`` costs.
"""

from __future__ import annotations

import io
import logging
import os
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pydicom
from pydicom.dataelem import RawDataElement
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.errors import InvalidDicomError
from pydicom.uid import (
    UID,
    DeflatedExplicitVRLittleEndian,
    ExplicitVRBigEndian,
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
)

from medrt.errors import (
    CorruptDicomError,
    CorruptPixelDataError,
    DecoderMissingError,
    InputError,
    NoPixelDataError,
    NotAnImageError,
    NotDicomError,
    UnsupportedImageError,
    describe_source,
    source_name,
)
from medrt.io.codecs import UNCOMPRESSED_LE, decoder_packages, preferred_plugins
from medrt.io.header import (
    MAX_PIXEL_SPACING_MM,
    MAX_SLICE_THICKNESS_MM,
    content_boxes,
    frame_geometries,
    frame_header_windows,
    frame_pixel_spacings,
    frame_rescales,
    frames_text,
    modality_values,
    percentile_window,
    pixel_measures_conflicts,
    pixel_measures_gaps,
    unbelievable_spacings,
)
from medrt.io.rle import LABEL as RLE_LABEL
from medrt.logsource import reading
from medrt.privacy import redact
from medrt.types import Frame, SourceRef, Window, WindowSource

__all__ = [
    "DicomSource",
    "read_dataset",
    "read_frames",
    "frames_from_dataset",
    "decoder_packages",
    "is_image_sop_class",
    "number_of_frames",
]

log = logging.getLogger(__name__)

DicomSource = str | os.PathLike[str] | bytes | bytearray | memoryview | Dataset | BinaryIO

PIXEL_KEYWORDS = ("PixelData", "FloatPixelData", "DoubleFloatPixelData")
_PIXEL_TAGS = (0x7FE00010, 0x7FE00008, 0x7FE00009)
# Type 1 in the Image Pixel Module (PS3.3 C.7.6.3). Without Pixel Representation a signed
# CT's negative HU were read as unsigned values near 65,535, silently; without Bits Stored
# a compressed image failed with a decoder's message that could not name the attribute.
_REQUIRED_PIXEL_ATTRS = ("Rows", "Columns", "BitsAllocated", "BitsStored", "PixelRepresentation", "SamplesPerPixel")

# SOP classes that may carry pixel data but are not images to analyse.
_NON_IMAGE_SOP_CLASSES = frozenset(
    str(u)
    for u in (
        pydicom.uid.SegmentationStorage,
        pydicom.uid.RTDoseStorage,
        pydicom.uid.RTStructureSetStorage,
        pydicom.uid.RTPlanStorage,
        pydicom.uid.ParametricMapStorage,
        pydicom.uid.RawDataStorage,
        pydicom.uid.EncapsulatedPDFStorage,
        pydicom.uid.KeyObjectSelectionDocumentStorage,
    )
)
_NON_IMAGE_NAME_PARTS = (
    "SR Storage",
    "Waveform",
    "Presentation State",
    "Encapsulated",
    "Directory Storage",
    "Segmentation Storage",
)

_DEFER_SIZE = 1 << 16

# Refuse to allocate more than this for one object's decoded pixels: a damaged
# Rows/Columns/NumberOfFrames must give an error, not exhaust memory.
MAX_DECODED_BYTES = 8 << 30
_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)  # ITU-R BT.601, as in YBR_FULL


def is_image_sop_class(sop_class_uid: str) -> bool:
    """False for SOP classes that are known not to be images (SR, SEG, RT Dose, ...)."""
    uid = str(sop_class_uid)
    if uid in _NON_IMAGE_SOP_CLASSES:
        return False
    name = UID(uid).name
    if name.startswith("RT ") and "Image" not in name:  # RT plans, structures, records
        return False
    return not any(part in name for part in _NON_IMAGE_NAME_PARTS)


# --------------------------------------------------------------------------- reading


def read_dataset(
    source: DicomSource, *, stop_before_pixels: bool = False, defer_size: int | None = None
) -> Dataset:
    """Parse ``source`` into a pydicom Dataset, or raise an :class:`InputError` naming it.

    Files without the 128-byte preamble and ``DICM`` prefix (old or hand-made
    files) are accepted when a data set with DICOM attributes can be parsed from
    them; anything else is :class:`NotDicomError`. Paths are read straight from
    the file, so ``stop_before_pixels`` reads only the header of a large image.
    """
    if isinstance(source, Dataset):
        return source
    with reading(source):  # pydicom's warnings while it parses name this input
        return _read_dataset(source, stop_before_pixels, defer_size)


def _read_dataset(source: DicomSource, stop_before_pixels: bool, defer_size: int | None) -> Dataset:
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.is_dir():
            raise InputError(source, "is a directory, not a file")
        try:
            with open(path, "rb") as fp:
                ds = _parse(source, fp, stop_before_pixels, defer_size)
        except FileNotFoundError:
            raise InputError(source, "no such file") from None
        except OSError as exc:
            raise InputError(source, f"cannot be read: {exc.strerror or exc}") from None
        ds.filename = str(source)
        return ds
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _parse(source, io.BytesIO(source), stop_before_pixels, None)
    if hasattr(source, "read"):
        name = source_name(source)  # an open file's path, not <BufferedReader>
        fp = source if _seekable(source) else io.BytesIO(source.read())
        return _parse(name, fp, stop_before_pixels, None)
    raise TypeError(f"cannot read DICOM from {type(source).__name__}")


def _seekable(fp: Any) -> bool:
    try:
        return bool(fp.seekable())
    except Exception:
        return False


def _parse(name: object, fp: BinaryIO, stop_before_pixels: bool, defer_size: int | None) -> Dataset:
    start = fp.tell()
    head = fp.read(132)
    fp.seek(start)
    if not head:
        raise NotDicomError(name, "the file is empty")
    has_prefix = len(head) == 132 and head[128:132] == b"DICM"
    try:
        ds = pydicom.dcmread(fp, stop_before_pixels=stop_before_pixels, defer_size=defer_size)
    except InvalidDicomError:
        fp.seek(start)
        ds = _read_without_preamble(name, fp, stop_before_pixels)
    except Exception as exc:  # pydicom raises many types on damaged headers
        if has_prefix:
            raise CorruptDicomError(name, f"the header cannot be parsed ({_exc_text(exc)})") from exc
        raise NotDicomError(name, "no DICOM header could be parsed") from exc
    if not has_prefix and not _looks_like_dicom(ds):
        raise NotDicomError(name, "no 'DICM' prefix and no DICOM attributes found")
    if len(ds) == 0:
        if not stop_before_pixels and _header_reads(fp, start):
            # pydicom hands back an empty data set when the file ends inside undefined-length
            # (encapsulated) pixel data: the header is whole, the pixels are cut
            raise CorruptPixelDataError(name, "the file ends inside the encapsulated pixel data (truncated)")
        raise CorruptDicomError(name, "no data elements could be read: the file is truncated or damaged")
    return ds


def _header_reads(fp: BinaryIO, start: int) -> bool:
    """Whether the header up to the pixel data parses into an image's attributes."""
    try:
        fp.seek(start)
        head = pydicom.dcmread(fp, stop_before_pixels=True, force=True)
        return "Rows" in head and "Columns" in head
    except Exception:
        return False


def _read_without_preamble(name: object, fp: BinaryIO, stop_before_pixels: bool) -> Dataset:
    try:
        ds = pydicom.dcmread(fp, force=True, stop_before_pixels=stop_before_pixels)
        # Touch every top-level element, so garbage fails here rather than later.
        for _ in ds.keys():
            pass
    except Exception as exc:
        raise NotDicomError(name, "no 'DICM' prefix and no DICOM data set could be parsed") from exc
    if not _looks_like_dicom(ds):
        raise NotDicomError(name, "no 'DICM' prefix and no DICOM attributes found")
    log.info("%s: read without DICOM preamble/prefix", describe_source(ds))
    return ds


def _looks_like_dicom(ds: Dataset) -> bool:
    """True when a force-parsed data set has the attributes any real DICOM object has."""
    try:
        keys = ds.keys()
        if not keys:
            return False
        has_ids = 0x00080016 in keys or 0x00080018 in keys  # SOP Class / SOP Instance UID
        has_image = 0x00280010 in keys and any(t in keys for t in _PIXEL_TAGS)
        if not (has_ids or has_image):
            return False
        # Garbage parsed with force=True rarely has a first tag in group 0x0002 or 0x0008.
        return min(keys) < 0x00090000
    except Exception:
        return False


def _exc_text(exc: BaseException) -> str:
    """A library's exception as a reason: its type and first line, quoted values taken
    out (:func:`medrt.privacy.redact`: pydicom quotes the header value it cannot read)."""
    text = str(exc).strip().splitlines()
    first = redact(text[0]) if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


# --------------------------------------------------------------------------- frames


def read_frames(source: DicomSource) -> list[Frame]:
    """Decode ``source`` (a path, bytes, a file object or a Dataset) into one Frame per frame.

    Raises an :class:`~medrt.errors.InputError` subclass naming the input and the
    reason for every unusable input.
    """
    path = Path(source) if isinstance(source, (str, os.PathLike)) else None
    # From a path, large values stay in the file until used: uncompressed pixel
    # data is then cast straight from a memory map (see _native_view).
    ds = read_dataset(source, defer_size=_DEFER_SIZE if path else None)
    # errors and warnings name a path, an open file by its path, else the data set (its UID)
    named = source_name(source)
    return frames_from_dataset(ds, path=path, name=named if isinstance(named, (str, os.PathLike)) else None)


def frames_from_dataset(ds: Dataset, *, path: Path | None = None, name: object = None) -> list[Frame]:
    """Turn a parsed Dataset into frames; see :func:`read_frames`."""
    label = name if name is not None else (path if path is not None else ds)
    try:
        with reading(label):
            return _frames(ds, path, label)
    except InputError:
        raise
    except Exception as exc:  # a lazily-parsed attribute that is garbage, and the like
        raise CorruptDicomError(label, f"an attribute cannot be read ({_exc_text(exc)})") from exc


def _frames(ds: Dataset, path: Path | None, label: object) -> list[Frame]:
    sop_class = str(ds.get("SOPClassUID", "") or "")
    if not sop_class and hasattr(ds, "file_meta"):
        sop_class = str(ds.file_meta.get("MediaStorageSOPClassUID", "") or "")
    if sop_class and not is_image_sop_class(sop_class):
        raise NotAnImageError(label, f"{UID(sop_class).name} objects are not images")
    keyword = next((k for k in PIXEL_KEYWORDS if k in ds), None)
    if keyword is None:
        what = UID(sop_class).name if sop_class else "the object"
        hint = " (the file may be truncated)" if sop_class and "Image" in UID(sop_class).name else ""
        raise NoPixelDataError(label, f"{what} has no (7FE0,0010) Pixel Data{hint}")
    if keyword != "PixelData":
        raise UnsupportedImageError(label, f"{keyword} (floating-point pixels) is not supported")
    missing = [k for k in _REQUIRED_PIXEL_ATTRS if ds.get(k) in (None, "")]
    if not missing and str(ds.SamplesPerPixel).strip() not in ("", "1") and ds.get("PlanarConfiguration") in (None, ""):
        missing.append("PlanarConfiguration")  # Type 1C: colour pixels cannot be laid out without it
    if missing:
        raise CorruptDicomError(label, f"required Image Pixel attribute(s) missing: {', '.join(missing)}")

    tsyntax = _transfer_syntax(ds, label)
    photometric, assumed = _photometric(ds, label)
    n_frames = _frame_count(ds, label)
    _check_encapsulation(ds, tsyntax, label)
    arr = _decode(ds, tsyntax, photometric if assumed else "", n_frames, label)  # (frames, rows, cols[, 3])

    color: np.ndarray | None = None
    inverted = False
    boxes: list[tuple[int, int, int, int] | None] = [None] * n_frames
    if arr.ndim == 4 or photometric == "PALETTE COLOR":
        if photometric == "PALETTE COLOR":
            from pydicom.pixels import apply_color_lut

            arr = apply_color_lut(arr, ds)
        color = arr
        pixels = np.tensordot(arr, _LUMA, axes=([-1], [0])).astype(np.float32, copy=False)
        low = high = None
    else:
        _check_rescales(ds, n_frames, label)
        boxes = content_boxes(arr, ds)  # a shutter's border, in stored values (before any LUT)
        pixels, low, high = modality_values(arr, ds)
        if photometric == "MONOCHROME1":
            # Invert inside the range the stored values can take, so values stay in
            # modality units' range and higher means brighter, as for MONOCHROME2.
            np.subtract(np.float32(low + high), pixels, out=pixels)
            inverted = True

    meta = _header_only(ds)
    if assumed:  # what the SEG, SR and overlays derived from it say too
        meta.PhotometricInterpretation = photometric
    ref = SourceRef(dataset=meta, path=path, transfer_syntax_uid=str(tsyntax), number_of_frames=n_frames)
    spacings = frame_pixel_spacings(ds, n_frames)  # one for all frames, or one each (enhanced)
    unbelievable = unbelievable_spacings(ds)
    if unbelievable:
        # an enhanced object's frames each have their own Pixel Measures: say which are in pixels
        unscaled = [number for number, (sp, _) in enumerate(spacings, 1) if sp is None]
        in_pixels = ("" if not unscaled else "; sizes are in pixels" if len(unscaled) == len(spacings)
                     else f"; sizes on {frames_text(unscaled, len(spacings))} are in pixels")
        log.warning("%s: %s cannot be a length in mm (it must be finite, above 0 and at most %g mm per pixel, "
                    "%g mm per slice): not used%s", describe_source(label), "; ".join(unbelievable),
                    MAX_PIXEL_SPACING_MM, MAX_SLICE_THICKNESS_MM, in_pixels)
    conflicts = pixel_measures_conflicts(ds)
    if conflicts:
        log.warning("%s: Pixel Measures both shared and per frame, with different values (%s); each frame is "
                    "measured with its own, as a functional group belongs in one or the other",
                    describe_source(label), "; ".join(conflicts))
    gaps = pixel_measures_gaps(ds)
    if gaps:
        log.warning("%s: Pixel Measures both shared and per frame, some frames' own without a value the shared "
                    "ones give (%s); those frames are measured with the shared value, as a functional group "
                    "belongs in one or the other", describe_source(label), "; ".join(gaps))
    geometries = frame_geometries(ds, n_frames)
    uids = {
        "sop_class_uid": sop_class,
        "sop_instance_uid": str(ds.get("SOPInstanceUID", "") or ""),
        "series_instance_uid": str(ds.get("SeriesInstanceUID", "") or ""),
        "study_instance_uid": str(ds.get("StudyInstanceUID", "") or ""),
        "frame_of_reference_uid": str(ds.FrameOfReferenceUID) if ds.get("FrameOfReferenceUID") else None,
    }
    windows = frame_header_windows(ds, n_frames)
    frames: list[Frame] = []
    for i in range(n_frames):
        px = pixels[i]
        px.flags.writeable = False
        window = windows[i if len(windows) > 1 else 0]
        spacing, spacing_source = spacings[i if len(spacings) > 1 else 0]
        if window is not None and inverted:
            window = Window(low + high - window.center, window.width, WindowSource.HEADER)  # type: ignore[operator]
        if window is None:
            window = percentile_window(px)
        rgb = None
        if color is not None:
            rgb = color[i]
            rgb.flags.writeable = False
        frames.append(
            Frame(
                pixels=px,
                spacing_mm=spacing,
                spacing_source=spacing_source,
                window=window,
                photometric=photometric,
                modality=str(ds.get("Modality", "") or ""),
                frame_index=i,
                source=ref,
                geometry=geometries[i],
                color=rgb,
                inverted=inverted,
                content_box=boxes[i],
                **uids,
            )
        )
    return frames


def _transfer_syntax(ds: Dataset, label: object) -> UID:
    """The data set's transfer syntax, inferred from how it was read when the meta lacks it."""
    meta = getattr(ds, "file_meta", None)
    uid = meta.get("TransferSyntaxUID") if meta is not None else None
    if not uid:
        elem = ds["PixelData"]
        if elem.is_undefined_length:
            raise UnsupportedImageError(label, "compressed pixel data but no Transfer Syntax UID in the file meta")
        implicit, little = ds.original_encoding
        if little is False:
            uid = ExplicitVRBigEndian
        else:
            uid = ImplicitVRLittleEndian if implicit else ExplicitVRLittleEndian
        if meta is None:
            ds.file_meta = meta = FileMetaDataset()
        meta.TransferSyntaxUID = uid
        log.warning(
            "%s: no Transfer Syntax UID in the file meta; decoding as %s, as it was read",
            ds.get("SOPInstanceUID", "<no uid>"),
            UID(uid).name,
        )
    uid = UID(str(uid))
    from pydicom.pixels import get_decoder

    try:
        decoder = get_decoder(uid)
    except NotImplementedError:
        raise UnsupportedImageError(label, f"transfer syntax {uid.name} ({uid}) is not supported") from None
    if not decoder.is_available:
        missing = "; ".join(decoder.missing_dependencies)
        raise DecoderMissingError(
            label,
            f"no installed plugin can decode {uid.name} pixel data ({missing})",
            packages=decoder_packages(uid),
        )
    return uid


def _check_rescales(ds: Dataset, n_frames: int, label: object) -> None:
    """Refuse a Rescale Slope/Intercept that cannot map stored values to modality units.

    A slope or intercept that is NaN, infinite, or so large that the result overflows
    float32 made every pixel NaN or infinite, and a zero slope made every pixel the
    intercept: the image was analysed anyway, silently, and came back with no lesions.
    """
    if "ModalityLUTSequence" in ds:
        return
    try:
        pairs = frame_rescales(ds, n_frames)
    except (TypeError, ValueError):
        raise CorruptDicomError(label, "Rescale Slope or Rescale Intercept is not a number") from None
    bits = int(ds.BitsStored) if 0 < int(ds.BitsStored) <= int(ds.BitsAllocated) else int(ds.BitsAllocated)
    largest = float(1 << bits)
    limit = 1e30  # far past any modality unit (HU, counts, SUV), and well inside float32
    for slope, intercept in pairs:
        usable = (np.isfinite(slope) and np.isfinite(intercept) and slope != 0.0
                  and abs(slope) * largest + abs(intercept) < limit)
        if not usable:
            raise CorruptDicomError(
                label, f"Rescale Slope {slope:g} / Rescale Intercept {intercept:g} cannot map stored values to "
                "modality units (they must be finite, the slope non-zero)")


def _frame_count(ds: Dataset, label: object) -> int:
    """Number of Frames, which must be a whole number of 1 or more where it is given.

    pydicom read "abc", "0" or "-3" as one frame, silently (an image whose data held
    several was then refused as holding too much, or its first frame analysed), and
    "2.5" as two."""
    value = ds.get("NumberOfFrames")
    text = "" if value is None else str(value).strip()
    if not text:
        return 1  # absent or empty: a single-frame image
    try:
        number = float(text)
    except (ValueError, OverflowError):
        number = float("nan")
    if not (np.isfinite(number) and number.is_integer() and number >= 1):
        raise CorruptDicomError(label, f"Number of Frames (0028,0008) is {text[:24]!r}, not a whole number of 1 or more")
    return int(number)


#: Photometric Interpretations medrt reads, by samples per pixel (PS3.3 C.7.6.3.1.2).
_PHOTOMETRICS = {
    1: frozenset({"MONOCHROME1", "MONOCHROME2", "PALETTE COLOR"}),
    3: frozenset({"RGB", "YBR_FULL", "YBR_FULL_422", "YBR_PARTIAL_422", "YBR_PARTIAL_420", "YBR_ICT", "YBR_RCT"}),
}
_PALETTE = tuple(f"{c}PaletteColorLookupTableDescriptor" for c in ("Red", "Green", "Blue"))


def _photometric(ds: Dataset, label: object) -> tuple[str, bool]:
    """The Photometric Interpretation to decode with, and whether it was assumed.

    The standard requires it (Type 1), but archives hold greyscale images with it
    missing, empty or misspelt; they were read as greyscale silently. A one-sample
    image is now read as MONOCHROME2, as most viewers do, with a warning naming the
    file. A colour image's cannot be guessed (RGB or YBR?): refused. PALETTE COLOR
    without its lookup tables was pydicom's "No suitable Palette Color Lookup Table
    Module found", read as an unreadable attribute."""
    samples = int(ds.SamplesPerPixel)
    value = str(ds.get("PhotometricInterpretation", "") or "").strip().upper()
    known = _PHOTOMETRICS.get(samples, frozenset())
    if value == "PALETTE COLOR" and samples == 1:
        lacking = [k for k in _PALETTE if ds.get(k) in (None, "")]
        has_data = all(f"{c}PaletteColorLookupTableData" in ds or f"Segmented{c}PaletteColorLookupTableData" in ds
                       for c in ("Red", "Green", "Blue"))
        if lacking or not has_data:
            raise CorruptDicomError(
                label, "Photometric Interpretation is PALETTE COLOR but the Palette Color Lookup Table "
                "(0028,1101-1103 descriptors, 0028,1201-1203 data) is missing")
        return value, False
    if value in known:
        return value, False
    said = f"{value[:24]!r}" if value else "missing"
    if samples != 1:
        raise CorruptDicomError(
            label, f"Photometric Interpretation is {said}, which is not one for {samples} samples per pixel "
            f"({', '.join(sorted(known)) or 'none known'})")
    log.warning("%s: Photometric Interpretation is %s; read as MONOCHROME2 (greyscale, higher is brighter)",
                describe_source(label), said)
    return "MONOCHROME2", True


def number_of_frames(ds: Dataset) -> int:
    value = ds.get("NumberOfFrames", 1)
    try:
        n = int(value) if value not in (None, "") else 1
    except (TypeError, ValueError):
        n = 1
    return max(n, 1)


def _decode(ds: Dataset, tsyntax: UID, assumed_photometric: str, n_frames: int, label: object) -> np.ndarray:
    """Decoded stored values shaped ``(frames, rows, cols[, samples])``, RGB for colour.
    ``assumed_photometric``: the Photometric Interpretation to decode with in place of the
    header's missing or unknown one (see :func:`_photometric`), else ""."""
    rows, cols = int(ds.Rows), int(ds.Columns)
    if rows <= 0 or cols <= 0:
        raise CorruptDicomError(label, f"image size {rows}x{cols} is empty")
    samples = int(ds.SamplesPerPixel)
    bits = int(ds.BitsAllocated)
    if samples not in (1, 3) or bits not in (1, 8, 16, 32, 64):
        raise UnsupportedImageError(label, f"{samples} samples of {bits} bits per pixel is not supported")
    decoded = rows * cols * n_frames * samples * max(bits // 8, 1)
    if decoded > MAX_DECODED_BYTES:
        raise UnsupportedImageError(
            label, f"{n_frames} frame(s) of {rows}x{cols}x{samples} would need {decoded / 2**30:.1f} GiB"
        )
    if tsyntax.is_encapsulated:
        _check_fragments(ds, n_frames, label)
    fast = _native_view(ds, tsyntax, rows, cols, n_frames, label)
    if fast is not None:
        return fast
    if not tsyntax.is_encapsulated and isinstance(ds.PixelData, (bytes, bytearray)):
        frame_bytes = (rows * cols * samples * bits + 7) // 8
        _check_no_excess(len(ds.PixelData), frame_bytes, n_frames, rows, cols, label)
    from pydicom.pixels import get_decoder, pixel_array

    available = get_decoder(tsyntax).available_plugins
    preferred = next((p for p in preferred_plugins(tsyntax) if p in available), "")
    options: dict[str, Any] = {"photometric_interpretation": assumed_photometric} if assumed_photometric else {}
    try:
        try:
            arr = pixel_array(ds, decoding_plugin=preferred, **options)
        except Exception:
            if not preferred or preferred == RLE_LABEL:
                raise  # medrt-rle's checks are final: pylibjpeg-rle would panic on such data
            arr = pixel_array(ds, **options)  # every available plugin, in pydicom's order
    except (KeyboardInterrupt, SystemExit, MemoryError):
        raise
    except BaseException as exc:  # noqa: BLE001 - Rust decoders panic with a BaseException
        mismatch = _syntax_mismatch(ds, tsyntax)
        if mismatch:
            raise CorruptPixelDataError(label, mismatch) from exc
        raise _decode_error(exc, tsyntax, n_frames, rows, cols, samples, label) from exc
    shape = (n_frames, rows, cols, samples) if samples > 1 else (n_frames, rows, cols)
    if arr.size != int(np.prod(shape)):  # fewer or more frames decoded than Number of Frames says
        raise _size_mismatch(label, n_frames, rows, cols, samples)
    arr = arr.reshape(shape)
    # pydicom masks native (uncompressed) data itself; a codec gives back its codestream's bits
    native = str(tsyntax) in UNCOMPRESSED_LE
    return _without_unused_bits(arr, ds) if samples == 1 and not native else arr


def _decode_error(exc: BaseException, tsyntax: UID, n_frames: int, rows: int, cols: int, samples: int,
                  label: object) -> CorruptPixelDataError:
    """A decoder's failure as a reason."""
    if isinstance(exc, ValueError):
        text = str(exc)
        if "could not broadcast" in text or "cannot reshape" in text:  # a codestream of another size
            return _size_mismatch(label, n_frames, rows, cols, samples)
        if "less than expected" in text or "truncated" in text.lower():
            return CorruptPixelDataError(label, f"pixel data is truncated ({_first_line(text)})")
        return CorruptPixelDataError(label, _first_line(text))
    if isinstance(exc, RuntimeError):
        return CorruptPixelDataError(
            label, f"the {tsyntax.name} pixel data could not be decoded ({_first_error(str(exc))})")
    return CorruptPixelDataError(label, f"pixel data cannot be decoded ({_exc_text(exc)})")


# The first bytes of each kind of compressed frame (PS3.5 A.4): JPEG and JPEG-LS open
# with an SOI marker, a JPEG 2000 codestream with SOC and SIZ (or a JP2 file's signature
# box), an RLE frame with its header: a segment count of 1 to 15, the first at offset 64.
_JPEG_FAMILY = ("1.2.840.10008.1.2.4.5", "1.2.840.10008.1.2.4.6", "1.2.840.10008.1.2.4.7", "1.2.840.10008.1.2.4.8")
_J2K_FAMILY = ("1.2.840.10008.1.2.4.9", "1.2.840.10008.1.2.4.20")


def _kind_of_frame(data: bytes) -> str:
    """Which kind of compressed frame ``data`` starts like: "JPEG" (or JPEG-LS), "JPEG 2000",
    "RLE", or "" when none."""
    if data[:2] == b"\xff\xd8":
        return "JPEG"
    if data[:4] == b"\xff\x4f\xff\x51" or data[4:12] == b"jP  \r\n\x87\n":
        return "JPEG 2000"
    if len(data) >= 64 and 1 <= int.from_bytes(data[:4], "little") <= 15 and int.from_bytes(data[4:8], "little") == 64:
        return "RLE"
    return ""


def _kind_of_syntax(tsyntax: UID) -> str:
    text = str(tsyntax)
    if text == str(pydicom.uid.RLELossless):
        return "RLE"
    if any(text.startswith(p) for p in _J2K_FAMILY):
        return "JPEG 2000"
    return "JPEG" if any(text.startswith(p) for p in _JPEG_FAMILY) else ""


def _syntax_mismatch(ds: Dataset, tsyntax: UID) -> str | None:
    """Why pixel data that failed to decode did: its first frame is of another kind than
    the Transfer Syntax UID says (an RLE frame in a file marked JPEG), or None where
    that cannot be told. Asked only after a decoder failed: its message ("SOI marker
    missing", "No matching JPEG 2000 format found") blamed the data, not the header."""
    said = _kind_of_syntax(tsyntax)
    if not said:
        return None
    try:
        from pydicom.encaps import generate_fragments, parse_basic_offsets

        buffer = io.BytesIO(ds.PixelData)
        parse_basic_offsets(buffer)  # past the Basic Offset Table
        first = next(generate_fragments(buffer), b"")
    except Exception:
        return None
    found = _kind_of_frame(bytes(first[:64]))
    if found and found != said:
        return (f"the Transfer Syntax UID says {tsyntax.name} ({tsyntax}), but the pixel data is {found}: "
                "the file's transfer syntax is wrong")
    return None


_ITEM_TAG = b"\xfe\xff\x00\xe0"  # (FFFE,E000), little endian: encapsulated pixel data's first bytes


def _check_encapsulation(ds: Dataset, tsyntax: UID, label: object) -> None:
    """Refuse pixel data encoded otherwise than the Transfer Syntax UID says, naming both.

    Compressed syntaxes keep the pixel data encapsulated (an undefined length and a
    sequence of fragments), uncompressed ones do not (PS3.5 A.4). Uncompressed data in
    a file marked JPEG was "encapsulated pixel data is damaged (Found unexpected tag
    (00AF,00B4) instead of (FFFE,E000)...)", and a compressed image in a file marked
    Explicit VR Little Endian "pixel data is truncated": both blamed the data."""
    try:
        elem = ds.get_item(0x7FE00010, keep_deferred=True)
    except (KeyError, TypeError):
        return
    length = getattr(elem, "length", None)  # a raw element, as read from the file
    undefined = length == 0xFFFFFFFF if length is not None else bool(getattr(elem, "is_undefined_length", False))
    if tsyntax.is_encapsulated and not undefined and length is None:
        # a data set built in memory (``ds.PixelData = encapsulate(frames)``) has the flag
        # unset: its value, which opens with an Item tag, says it is encapsulated
        value = elem.value
        undefined = isinstance(value, (bytes, bytearray)) and bytes(value[:4]) == _ITEM_TAG
    if tsyntax.is_encapsulated and not undefined:
        raise CorruptPixelDataError(
            label, f"the Transfer Syntax UID says {tsyntax.name} ({tsyntax}), which is compressed, but the pixel "
            "data is not encapsulated (it is uncompressed): the file's transfer syntax is wrong")
    if not tsyntax.is_encapsulated and undefined:
        raise CorruptPixelDataError(
            label, f"the Transfer Syntax UID says {tsyntax.name} ({tsyntax}), which is uncompressed, but the pixel "
            "data is encapsulated (compressed): the file's transfer syntax is wrong")


def _without_unused_bits(arr: np.ndarray, ds: Dataset) -> np.ndarray:
    """Greyscale stored values with the bits above Bits Stored ignored (PS3.5 8.1.1):
    masked, or for signed data sign-extended from the high bit.

    pydicom does this for uncompressed data but not after a JPEG-LS (or JPEG 2000) decode,
    which gives back the codestream's precision: DCMTK's ``dcmcjpls`` (and so Orthanc's
    transcoding) writes a 12-bit image as a 16-bit codestream, bits above the twelfth
    and all, and those bits came back as values up to 62,275 HU (unsigned) or signed
    values read as positive, silently, with lesions lost or invented."""
    if arr.dtype.kind not in "iu":
        return arr
    bits = 8 * arr.dtype.itemsize
    stored = int(ds.get("BitsStored", bits) or bits)
    if not 0 < stored < bits:
        return arr
    signed = int(ds.get("PixelRepresentation", 0) or 0) == 1
    lo, hi = (-(1 << (stored - 1)), (1 << (stored - 1)) - 1) if signed else (0, (1 << stored) - 1)
    if arr.max() <= hi and arr.min() >= lo:  # the usual case: nothing above Bits Stored
        return arr
    arr = arr.astype(np.dtype(f"{'i' if signed else 'u'}{arr.dtype.itemsize}"), copy=not arr.flags.writeable)
    shift = bits - stored
    np.left_shift(arr, shift, out=arr)
    np.right_shift(arr, shift, out=arr)  # arithmetic on a signed type: sign extension
    return arr


def _check_fragments(ds: Dataset, n_frames: int, label: object) -> None:
    """Encapsulated data needs at least one fragment per frame."""
    from pydicom.encaps import parse_basic_offsets, parse_fragments

    data = ds.PixelData
    try:
        buffer = io.BytesIO(data)
        parse_basic_offsets(buffer)
        n_fragments, offsets = parse_fragments(buffer)
    except Exception as exc:
        raise CorruptPixelDataError(label, f"encapsulated pixel data is damaged ({_exc_text(exc)})") from exc
    if offsets:
        last = offsets[-1]
        length = int.from_bytes(data[last + 4 : last + 8], "little")
        if last + 8 + length > len(data):
            raise CorruptPixelDataError(
                label, "the file ends inside the encapsulated pixel data (truncated)"
            )
    if n_fragments < n_frames:
        raise CorruptPixelDataError(
            label, f"{n_frames} frame(s) declared but the encapsulated pixel data has {n_fragments} fragment(s)"
        )


def _native_view(
    ds: Dataset, tsyntax: UID, rows: int, cols: int, n_frames: int, label: object
) -> np.ndarray | None:
    """A zero-copy view of uncompressed little-endian greyscale pixel data, or None.

    Only taken where it gives exactly what pydicom's decoder gives: otherwise
    (bits stored needing a mask or sign extension that the data really uses, odd
    bit depths, colour) the general decoder runs.
    """
    if str(tsyntax) not in UNCOMPRESSED_LE or int(ds.SamplesPerPixel) != 1:
        return None
    bits = int(ds.BitsAllocated)
    if bits not in (8, 16, 32):
        return None
    signed = int(ds.get("PixelRepresentation", 0) or 0) == 1
    dtype = np.dtype(f"<{'i' if signed else 'u'}{bits // 8}")
    expected = rows * cols * n_frames * (bits // 8)
    mapped = _mapped_pixels(ds, tsyntax, dtype, expected)
    if mapped is not None:
        length, arr = mapped
    else:
        data = ds.PixelData
        if not isinstance(data, (bytes, bytearray)):
            return None
        length, arr = len(data), None
    if length < expected:
        raise CorruptPixelDataError(
            label, f"pixel data is truncated: {length} bytes, {expected} expected for {n_frames}x{rows}x{cols}x{bits} bit"
        )
    _check_no_excess(length, expected // n_frames, n_frames, rows, cols, label)
    if arr is None:
        arr = np.frombuffer(data, dtype=dtype, count=expected // dtype.itemsize)
    arr = arr.reshape(n_frames, rows, cols)
    stored = int(ds.get("BitsStored", bits) or bits)
    if stored < bits:
        lo, hi = (-(1 << (stored - 1)), (1 << (stored - 1)) - 1) if signed else (0, (1 << stored) - 1)
        if arr.min() < lo or arr.max() > hi:
            return None  # unused high bits are set: let pydicom mask / sign-extend
    return arr


def _check_no_excess(length: int, frame_bytes: int, n_frames: int, rows: int, cols: int, label: object) -> None:
    """Refuse native pixel data that holds a whole frame more than the header declares.

    A byte or two of padding is common and harmless; a frame's worth or more means
    Rows, Columns or Number of Frames is wrong, and decoding the first ``expected``
    bytes gave a sliver of the image (Rows 1 of a 512x512 slice) or its first frame
    only, analysed as if whole."""
    if frame_bytes and length - n_frames * frame_bytes >= frame_bytes:
        raise CorruptPixelDataError(
            label, f"pixel data holds {length} bytes, {length / frame_bytes:.4g} frames' worth, but the header "
            f"declares {n_frames} frame(s) of {rows}x{cols}: Rows, Columns or Number of Frames is wrong")


def _size_mismatch(label: object, n_frames: int, rows: int, cols: int, samples: int) -> CorruptPixelDataError:
    return CorruptPixelDataError(
        label, f"the decoded pixels do not fit the header's {n_frames} frame(s) of {rows}x{cols}"
        f"{f'x{samples}' if samples > 1 else ''}: Rows, Columns or Number of Frames is wrong")


def _mapped_pixels(ds: Dataset, tsyntax: UID, dtype: np.dtype, expected: int) -> tuple[int, np.ndarray | None] | None:
    """``(bytes available, memory map)`` of pixel data left deferred in its file, or None.

    A memory map lets the float32 cast read the page cache directly instead of
    first copying the bytes into Python. The file's size is checked first, so a
    short file is reported as truncated rather than faulting on access.
    """
    if str(tsyntax) == str(DeflatedExplicitVRLittleEndian) or not getattr(ds, "filename", None):
        return None  # offsets in a deflated file refer to the inflated stream
    try:
        raw = ds.get_item(0x7FE00010, keep_deferred=True)
    except (KeyError, TypeError):
        return None
    if not isinstance(raw, RawDataElement) or raw.value is not None or raw.length == 0xFFFFFFFF:
        return None
    size = os.stat(ds.filename).st_size
    available = min(raw.length, max(size - raw.value_tell, 0))
    if available < expected:
        return available, None
    arr = np.memmap(ds.filename, dtype=dtype, mode="r", offset=raw.value_tell, shape=(expected // dtype.itemsize,))
    return available, arr


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def _first_error(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[1] if len(lines) > 1 else (lines[0] if lines else text)


def _header_only(ds: Dataset) -> Dataset:
    """A new Dataset with every element but the pixel data (so frames do not pin the bytes).

    Elements are copied as they are: one not yet read stays a raw element, converted
    only if something reads it (``ds[tag]`` here converted all of them, 1.7 ms of a
    512² CT slice's 8 ms decode)."""
    meta = Dataset({tag: ds.get_item(tag) for tag in ds.keys() if int(tag) not in _PIXEL_TAGS})
    if hasattr(ds, "file_meta"):
        meta.file_meta = ds.file_meta
    meta.preamble = getattr(ds, "preamble", None)
    if getattr(ds, "filename", None):
        meta.filename = ds.filename
    meta.set_original_encoding(*ds.original_encoding, ds.original_character_set)
    return meta
