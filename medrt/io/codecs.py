"""Which decoder reads which transfer syntax: JPEG-LS and JPEG 2000 through
imagecodecs as pydicom decoding plugins, the plugin asked first per syntax, the
packages to install when one is missing, and which codecs hold the GIL.

pydicom's own JPEG-LS plugins both cost this project something: pyjpegls wraps
CharLS but holds Python's interpreter lock for the whole image, so a threaded
pipeline or the viewer's event loop stalls while a frame decodes; pylibjpeg's
libjpeg is about 3× slower. imagecodecs wraps the same CharLS and releases the
lock while it works. Measured here on a 512² 16-bit CT slice: 3.6 ms against
3.9 ms for pyjpegls on one thread, and 2.2 against 3.7 ms per frame with two
threads decoding at once.

:func:`register` adds the plugin (label ``"imagecodecs"``) to pydicom's two
JPEG-LS decoders; ``medrt.io.dicom`` prefers it when it is there and falls back
to pyjpegls otherwise. The bytes handed back are what pyjpegls's plugin hands
back (little-endian samples, colour by pixel), so pydicom's processing after
the decode (sign, byte order, colour) is the same for both.

JPEG 2000 has the same story with pylibjpeg-openjpeg: it held the lock for the
whole image (a 4096² radiograph: 0.7 s, during which a viewer's event loop
stood still), where imagecodecs's OpenJPEG does not, and decodes a large image
on several threads (672 → 385 ms on two cores). Its output follows what
pydicom's pylibjpeg plugin tells the decode runner (container size from the
codestream's precision, YBR_ICT/RCT returned as RGB), so pydicom's sign and
precision corrections after the decode apply unchanged.

Five transfer syntaxes newer than pydicom 3.0 get a decoder here too
(:func:`register_newer_syntaxes`): JPEG XL (lossless, JPEG recompression, lossy;
libjxl through imagecodecs), Encapsulated Uncompressed Explicit VR Little Endian and
Deflated Image Frame Compression (numpy and zlib).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydicom import uid

from medrt.io import rle as _rle

__all__ = [
    "LABEL", "UNCOMPRESSED_LE", "NEWER_SYNTAXES", "NEWER_DECODED", "register", "register_newer_syntaxes",
    "preferred_plugins", "decoder_packages", "decode_holds_gil",
]

# A JPEG 2000 image this large decodes on several threads (tiles and code blocks).
_J2K_THREADED_PIXELS = 2048 * 2048

LABEL = "imagecodecs"

_J2K = (uid.JPEG2000Lossless, uid.JPEG2000, uid.HTJ2KLossless, uid.HTJ2KLosslessRPCL, uid.HTJ2K)
JPEG_XL = ("1.2.840.10008.1.2.4.110", "1.2.840.10008.1.2.4.111", "1.2.840.10008.1.2.4.112")
ENCAPSULATED_UNCOMPRESSED = "1.2.840.10008.1.2.1.98"
DEFLATED_IMAGE_FRAME = "1.2.840.10008.1.2.8.1"
NEWER_SYNTAXES: dict[str, tuple[str, str]] = {
    JPEG_XL[0]: ("JPEG XL Lossless", "JPEGXLLossless"),
    JPEG_XL[1]: ("JPEG XL JPEG Recompression", "JPEGXLJPEGRecompression"),
    JPEG_XL[2]: ("JPEG XL", "JPEGXL"),
    ENCAPSULATED_UNCOMPRESSED: (
        "Encapsulated Uncompressed Explicit VR Little Endian", "EncapsulatedUncompressedExplicitVRLittleEndian"),
    DEFLATED_IMAGE_FRAME: ("Deflated Image Frame Compression", "DeflatedImageFrameCompression"),
}
DECODER_DEPENDENCIES = {
    uid.JPEGLSLossless: ("numpy", "imagecodecs"),
    uid.JPEGLSNearLossless: ("numpy", "imagecodecs"),
    **{u: ("numpy", "imagecodecs") for u in _J2K},
    **{u: ("numpy", "imagecodecs") for u in JPEG_XL},
    ENCAPSULATED_UNCOMPRESSED: ("numpy",),
    DEFLATED_IMAGE_FRAME: ("numpy",),
}


def is_available(uid_: str) -> bool:
    """pydicom's plugin protocol: whether imagecodecs with the codec for ``uid_`` is installed
    (numpy and zlib, always there, for the two uncompressed newer syntaxes)."""
    if uid_ in (ENCAPSULATED_UNCOMPRESSED, DEFLATED_IMAGE_FRAME):
        return True  # numpy and zlib
    try:
        import imagecodecs
    except ImportError:
        return False
    codec = "JPEG2K" if uid_ in _J2K else "JPEGXL" if uid_ in JPEG_XL else "JPEGLS"
    return bool(getattr(getattr(imagecodecs, codec, None), "available", False))


def decode_frame(src: bytes, runner: Any) -> bytes:
    """pydicom's plugin protocol: one JPEG-LS codestream → its samples as bytes."""
    import imagecodecs

    arr = imagecodecs.jpegls_decode(src)
    if arr.ndim == 3:  # imagecodecs returns (rows, columns, samples): colour by pixel
        runner.set_option("planar_configuration", 0)
    runner.set_option("bits_allocated", 8 * arr.dtype.itemsize)
    return arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()


def decode_j2k_frame(src: bytes, runner: Any) -> bytes:
    """pydicom's plugin protocol: one JPEG 2000 codestream → its samples as bytes."""
    import os

    import imagecodecs

    big = runner.rows * runner.columns >= _J2K_THREADED_PIXELS
    arr = imagecodecs.jpeg2k_decode(src, numthreads=min(4, os.cpu_count() or 1) if big else 1)
    if runner.photometric_interpretation in ("YBR_ICT", "YBR_RCT"):  # OpenJPEG undoes the transform
        runner.set_option("photometric_interpretation", "RGB")
    if arr.ndim == 3:
        runner.set_option("planar_configuration", 0)
    precision = runner.get_option("j2k_precision", runner.bits_stored)
    itemsize = 1 if precision <= 8 else 2 if precision <= 16 else 4
    runner.set_option("bits_allocated", 8 * itemsize)
    kind = "i" if arr.dtype.kind == "i" else "u"
    return arr.astype(np.dtype(f"<{kind}{itemsize}"), copy=False).tobytes()


def register() -> tuple[bool, bool]:
    """Add the plugins to pydicom's JPEG-LS and JPEG 2000 decoders (once): whether
    each family is usable."""
    from pydicom.pixels import get_decoder
    from pydicom.pixels.decoders import JPEGLSLosslessDecoder, JPEGLSNearLosslessDecoder

    jls = is_available(uid.JPEGLSLossless)
    if jls:
        for decoder in (JPEGLSLosslessDecoder, JPEGLSNearLosslessDecoder):
            if LABEL not in decoder.available_plugins:
                decoder.add_plugin(LABEL, (__name__, "decode_frame"))
    j2k = is_available(uid.JPEG2000Lossless)
    if j2k:
        for u in _J2K:
            decoder = get_decoder(u)
            if LABEL not in decoder.available_plugins:
                decoder.add_plugin(LABEL, (__name__, "decode_j2k_frame"))
    return jls, j2k


# --------------------------------------------------------------------------- newer syntaxes
# Transfer syntaxes added to DICOM after pydicom 3.0 was written, each one frame per
# fragment: pydicom 3.0 parses such files (as explicit VR little endian) but has no
# decoder for them. pynetdicom 3.0 adds the names of four of them to pydicom's UID
# dictionary when it is imported; so does :func:`register_newer_syntaxes`, which then
# gives each a pydicom ``Decoder`` with one plugin, so ``pixel_array`` and everything
# after it (shape, sign, unused bits, colour) run through pydicom as for the others.
# pydicom has no public way to add a decoder for a new UID, so this writes its
# ``_PIXEL_DATA_DECODERS`` table; a pydicom that knows a syntax keeps its own decoder.
def decode_jpegxl_frame(src: bytes, runner: Any) -> bytes:
    """pydicom's plugin protocol: one JPEG XL codestream → its samples as bytes.

    libjxl has no signed samples: a signed image comes back as the bit patterns of its
    stored values, which pydicom's unused-bits correction then reads as two's
    complement in Bits Stored bits (as it does for JPEG-LS, which is blind to sign
    too)."""
    import imagecodecs

    arr = imagecodecs.jpegxl_decode(src)
    if arr.ndim == 3:
        if arr.shape[-1] == 1:
            arr = arr[..., 0]
        else:  # libjxl hands back RGB (by pixel), whatever the header called it
            runner.set_option("planar_configuration", 0)
            if runner.photometric_interpretation != "RGB":
                runner.set_option("photometric_interpretation", "RGB")
    if arr.dtype.kind == "f":
        raise ValueError("the JPEG XL codestream holds floating-point samples")
    rows, columns = runner.rows, runner.columns
    if arr.shape[:2] != (rows, columns):
        raise ValueError(f"the JPEG XL codestream is {arr.shape[1]}x{arr.shape[0]}, the header says {columns}x{rows}")
    runner.set_option("bits_allocated", 8 * arr.dtype.itemsize)
    return arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()


def decode_deflated_frame(src: bytes, runner: Any) -> bytes:
    """pydicom's plugin protocol: one frame of Deflated Image Frame Compression (raw
    deflate, RFC 1951, of the frame's native little-endian bytes, PS3.5 8.2.16)."""
    import zlib

    return _native_frame(zlib.decompress(bytes(src), -15), runner)


def decode_encapsulated_frame(src: bytes, runner: Any) -> bytes:
    """pydicom's plugin protocol: one frame of Encapsulated Uncompressed Explicit VR
    Little Endian (the frame's native bytes, padded to an even length, PS3.5 A.4.11)."""
    return _native_frame(bytes(src), runner)


def _native_frame(data: bytes, runner: Any) -> bytes:
    expected = runner.frame_length(unit="bytes")
    if len(data) < expected:
        raise ValueError(f"the frame holds {len(data)} bytes, {expected} expected")
    return data[:expected]


def register_newer_syntaxes() -> frozenset[str]:
    """Give pydicom a decoder for each syntax in :data:`NEWER_SYNTAXES` that it lacks
    (once): the ones medrt decodes."""
    from pydicom._uid_dict import UID_dictionary
    from pydicom.pixels.decoders import base

    plugins = {
        ENCAPSULATED_UNCOMPRESSED: ("medrt", "decode_encapsulated_frame"),
        DEFLATED_IMAGE_FRAME: ("medrt", "decode_deflated_frame"),
        **{u: (LABEL, "decode_jpegxl_frame") for u in JPEG_XL},
    }
    usable: set[str] = set()
    for ts, (name, keyword) in NEWER_SYNTAXES.items():
        UID_dictionary.setdefault(ts, (name, "Transfer Syntax", "", "", keyword))
        entry = base._PIXEL_DATA_DECODERS.get(ts)
        if entry is None:
            entry = base._PIXEL_DATA_DECODERS[uid.UID(ts)] = (base.Decoder(uid.UID(ts)), "medrt")
        decoder = entry[0]
        label, function = plugins[ts]
        if label not in decoder.available_plugins:
            try:  # added as unavailable, with what to install, where imagecodecs lacks libjxl
                decoder.add_plugin(label, (__name__, function))
            except ValueError:  # added before (as unavailable)
                pass
        if decoder.is_available:
            usable.add(ts)
    return frozenset(usable)


# Uncompressed little-endian syntaxes (numpy reads them; medrt.io.dicom's fast path).
UNCOMPRESSED_LE = frozenset(
    str(u) for u in (uid.ExplicitVRLittleEndian, uid.ImplicitVRLittleEndian, uid.DeflatedExplicitVRLittleEndian)
)

# What to ``pip install`` for each family of compressed transfer syntaxes.
_JPEG = ("pylibjpeg", "pylibjpeg-libjpeg")
_J2K_PACKAGES = ("pylibjpeg", "pylibjpeg-openjpeg")
_DECODER_PACKAGES: dict[str, tuple[str, ...]] = {
    "1.2.840.10008.1.2.4.50": _JPEG,
    "1.2.840.10008.1.2.4.51": _JPEG,
    "1.2.840.10008.1.2.4.57": _JPEG,
    "1.2.840.10008.1.2.4.70": _JPEG,
    "1.2.840.10008.1.2.4.80": ("pyjpegls",),
    "1.2.840.10008.1.2.4.81": ("pyjpegls",),
    **{str(u): _J2K_PACKAGES for u in _J2K},
    **{u: ("imagecodecs",) for u in JPEG_XL},
    "1.2.840.10008.1.2.5": ("pylibjpeg", "pylibjpeg-rle"),
}

# Plugins measured faster than pydicom's default choice (4096² 12-bit radiograph on
# this 2-core machine): JPEG-LS 230 ms with pyjpegls against 740 ms with pylibjpeg.
# imagecodecs wraps the same CharLS as pyjpegls, and the same OpenJPEG as
# pylibjpeg-openjpeg, but lets other threads run meanwhile; the first of each tuple
# that is installed is asked first.
_HAS_JLS, _HAS_J2K = register()
NEWER_DECODED = register_newer_syntaxes()
# RLE: pylibjpeg-rle's segments, without the Rust panic of its whole-frame decode on
# damaged data (medrt.io.rle); pydicom's own numpy decoder where it is not installed.
_RLE_PLUGINS = (_rle.LABEL,) if _rle.register() else ()
_JLS_PLUGINS = ("imagecodecs", "pyjpegls") if _HAS_JLS else ("pyjpegls",)
_J2K_PLUGINS = ("imagecodecs",) if _HAS_J2K else ()
_PREFERRED_PLUGIN = {
    "1.2.840.10008.1.2.4.80": _JLS_PLUGINS,
    "1.2.840.10008.1.2.4.81": _JLS_PLUGINS,
    **{str(u): _J2K_PLUGINS for u in _J2K},
    str(uid.RLELossless): _RLE_PLUGINS,
}

# Transfer syntaxes whose decoding here lets other Python threads run (numpy casts,
# imagecodecs, zlib; for imagecodecs's libjxl, measured: a thread counting in Python
# kept half its pace during a 2,048² decode on 2 cores); pylibjpeg's codecs (JPEG, RLE,
# and JPEG 2000 without imagecodecs) hold the interpreter lock for the whole image.
_DECODE_RELEASES_GIL = UNCOMPRESSED_LE | {str(uid.ExplicitVRBigEndian)} | NEWER_DECODED | {
    ts for ts, plugins in _PREFERRED_PLUGIN.items() if plugins and plugins[0] == LABEL}


def preferred_plugins(transfer_syntax_uid: str) -> tuple[str, ...]:
    """The pydicom plugins to ask first for this syntax, in order (empty: pydicom's own order)."""
    return _PREFERRED_PLUGIN.get(str(transfer_syntax_uid), ())


def decoder_packages(transfer_syntax_uid: str) -> tuple[str, ...]:
    """The pip packages that provide a decoder for ``transfer_syntax_uid`` (empty if built in)."""
    return _DECODER_PACKAGES.get(str(transfer_syntax_uid), ())


def decode_holds_gil(transfer_syntax_uid: str) -> bool:
    """Whether decoding pixel data of this transfer syntax keeps Python's interpreter
    lock for the whole image (other threads, a GUI event loop, stand still meanwhile)."""
    return str(transfer_syntax_uid) not in _DECODE_RELEASES_GIL
