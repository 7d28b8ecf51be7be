"""RLE Lossless frames decoded without pylibjpeg-rle's panics.

pylibjpeg-rle's ``decode_frame`` panics (a Rust ``index out of bounds``) on some
damaged frames, a header whose segment offsets cut a run short or a run that
overruns the frame: the panic arrives as pyo3's ``PanicException`` (a
``BaseException``, past ``except Exception``) after Rust has printed its trace to
the process's stderr, where a batch's console and the listener's log got it for
each such file. Its ``decode_segment`` unpacks one segment into a buffer that
grows, and cannot overrun.

:func:`decode_rle_frame` (the plugin ``"medrt-rle"`` of pydicom's RLE decoder,
the one medrt's decode asks) checks the RLE header (PS3.5 G.5) against the frame's fragment, unpacks
each segment with ``decode_segment`` and interleaves them with numpy, into what
pylibjpeg-rle's and pydicom's own plugins hand back (planar configuration 1, little
endian), so pydicom's processing after the decode is unchanged. A segment that
decodes to more than its share is cut to it, as both of those plugins do (pydicom
warns of "non-conformant padding"); one that decodes to less is an error.

When it refuses a frame, no other plugin is asked: the object is a decode error
(:func:`medrt.io.dicom.read_frames` names the plugin alone, ``decoding_plugin=``,
and does not retry RLE with pydicom's whole list). pydicom itself, with no plugin
named, goes on to the next one when one fails, and here both would be worse than
the error: pylibjpeg-rle's ``decode_frame`` is the one that panics, and pydicom's
numpy decoder checks neither the first offset nor the order of the offsets (a
header whose first segment starts at byte 60, not 64, decodes into a different
image, with only a "non-conformant padding" warning). A multi-frame object is
decoded by this plugin or not at all, never frame by frame by several.

:func:`register` adds the plugin last to pydicom's RLE decoder (pydicom asks its
plugins in the order they were added: pylibjpeg, pydicom, medrt-rle), so a bare
``ds.pixel_array`` elsewhere in the process (the decode benchmark's pydicom
baseline) keeps pydicom's own order; "asked first" holds where medrt decodes.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
from pydicom import uid

__all__ = ["LABEL", "is_available", "decode_rle_frame", "register", "rle_header_problem"]

LABEL = "medrt-rle"
DECODER_DEPENDENCIES = {uid.RLELossless: ("numpy", "pylibjpeg-rle")}


def is_available(uid_: str) -> bool:
    """pydicom's plugin protocol: whether pylibjpeg-rle (its ``decode_segment``) is installed."""
    if uid_ != uid.RLELossless:
        return False
    try:
        from rle.rle import decode_segment  # noqa: F401
    except ImportError:
        return False
    return True


def rle_header_problem(src: bytes, n_segments: int) -> str | None:
    """What is wrong with the RLE header of one frame's fragment ``src`` for ``n_segments``
    segments (samples per pixel x bytes per sample), or None when it can be decoded:
    the count must match, the first segment start after the 64-byte header, and each
    next one after it and inside the fragment."""
    if len(src) < 64:
        return f"the RLE frame holds {len(src)} bytes, less than its 64-byte header"
    header = struct.unpack("<16L", src[:64])
    if header[0] != n_segments:
        return f"the RLE header declares {header[0]} segment(s), {n_segments} expected for the image's samples and bits"
    offsets = header[1 : n_segments + 1]
    if offsets[0] != 64:
        return f"the RLE header's first segment offset is {offsets[0]}, not 64"
    ends = (*offsets[1:], len(src))
    for i, (start, end) in enumerate(zip(offsets, ends, strict=True), 1):
        if not start < end:
            return (f"the RLE header's segment {i} offset {start} is not before "
                    f"{'the next one' if i < n_segments else f'the end of the {len(src)}-byte frame'} ({end})")
    return None


def decode_rle_frame(src: bytes, runner: Any) -> bytes:
    """pydicom's plugin protocol: one RLE frame → its samples as little-endian bytes,
    planar configuration 1 (all of one sample's values, then the next's)."""
    from rle.rle import decode_segment

    rows, cols = int(runner.rows), int(runner.columns)
    samples, bits = int(runner.samples_per_pixel), int(runner.bits_allocated)
    if bits % 8:
        raise NotImplementedError(f"RLE pixel data of {bits} bits allocated cannot be decoded")
    per_sample = bits // 8
    problem = rle_header_problem(src, samples * per_sample)
    if problem:
        raise ValueError(problem)
    header = struct.unpack("<16L", src[:64])
    offsets = (*header[1 : samples * per_sample + 1], len(src))
    pixels = rows * cols
    out = np.empty((samples, pixels, per_sample), dtype=np.uint8)
    lsb_first = runner.get_option("rle_segment_order", ">") == "<"  # non-conformant, as pydicom allows
    for i, (start, end) in enumerate(zip(offsets[:-1], offsets[1:], strict=True)):
        segment = decode_segment(bytes(src[start:end]))
        if len(segment) < pixels:
            raise ValueError(f"RLE segment {i + 1} decodes to {len(segment)} bytes, {pixels} expected: "
                             "the data ends before the segment is complete")
        sample, byte = divmod(i, per_sample)
        out[sample, :, byte if lsb_first else per_sample - 1 - byte] = np.frombuffer(
            segment, dtype=np.uint8, count=pixels)
    runner.set_option("planar_configuration", 1)
    return out.tobytes()


def register() -> bool:
    """Add the plugin to pydicom's RLE decoder (once): whether it is usable."""
    from pydicom.pixels import get_decoder

    if not is_available(uid.RLELossless):
        return False
    decoder = get_decoder(uid.RLELossless)
    if LABEL not in decoder.available_plugins:
        decoder.add_plugin(LABEL, (__name__, "decode_rle_frame"))
    return True
