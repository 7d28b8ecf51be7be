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
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydicom import uid

__all__ = ["LABEL", "UNCOMPRESSED_LE", "register", "preferred_plugins", "decoder_packages", "decode_holds_gil"]

# A JPEG 2000 image this large decodes on several threads (tiles and code blocks).
_J2K_THREADED_PIXELS = 2048 * 2048

LABEL = "imagecodecs"

_J2K = (uid.JPEG2000Lossless, uid.JPEG2000, uid.HTJ2KLossless, uid.HTJ2KLosslessRPCL, uid.HTJ2K)
DECODER_DEPENDENCIES = {
    uid.JPEGLSLossless: ("numpy", "imagecodecs"),
    uid.JPEGLSNearLossless: ("numpy", "imagecodecs"),
    **{u: ("numpy", "imagecodecs") for u in _J2K},
}


def is_available(uid_: str) -> bool:
    """pydicom's plugin protocol: whether imagecodecs with the codec for ``uid_`` is installed."""
    try:
        import imagecodecs
    except ImportError:
        return False
    codec = "JPEG2K" if uid_ in _J2K else "JPEGLS"
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
    "1.2.840.10008.1.2.5": ("pylibjpeg", "pylibjpeg-rle"),
}

# Plugins measured faster than pydicom's default choice (4096² 12-bit radiograph on
# this 2-core machine): JPEG-LS 230 ms with pyjpegls against 740 ms with pylibjpeg.
# imagecodecs wraps the same CharLS as pyjpegls, and the same OpenJPEG as
# pylibjpeg-openjpeg, but lets other threads run meanwhile; the first of each tuple
# that is installed is asked first.
_HAS_JLS, _HAS_J2K = register()
_JLS_PLUGINS = ("imagecodecs", "pyjpegls") if _HAS_JLS else ("pyjpegls",)
_J2K_PLUGINS = ("imagecodecs",) if _HAS_J2K else ()
_PREFERRED_PLUGIN = {
    "1.2.840.10008.1.2.4.80": _JLS_PLUGINS,
    "1.2.840.10008.1.2.4.81": _JLS_PLUGINS,
    **{str(u): _J2K_PLUGINS for u in _J2K},
}

# Transfer syntaxes whose decoding here lets other Python threads run (numpy casts,
# imagecodecs); pylibjpeg's codecs (JPEG, RLE, and JPEG 2000 without imagecodecs)
# hold the interpreter lock for the whole image.
_DECODE_RELEASES_GIL = UNCOMPRESSED_LE | {str(uid.ExplicitVRBigEndian)} | {
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
