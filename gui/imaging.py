"""Window/level for display: CT presets and a lookup table per frame (no Qt here).

A frame's pixels are float32 in modality units (HU for CT). To change the
window at interactive speed, each frame is quantised once to a uint16 index
image (exactly, for the integer-valued pixels DICOM almost always gives; in
65,536 even steps otherwise), and a window becomes a 65,536-entry uint8 table:
the grey image is ``lut[index]``, one gather, whatever the window. The table
uses :func:`medrt.preprocess.normalize`, the analysis' own windowing, so the
viewer shows what ``medrt.overlay.grayscale`` renders for batch PNGs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from medrt.preprocess import normalize
from medrt.types import Frame

__all__ = ["Preset", "PRESETS", "DisplayIndex", "IndexedValues", "Layer", "window_lut", "apply_lut", "drag_window", "value_text"]

_LEVELS = 65536


@dataclass(frozen=True, slots=True)
class Preset:
    """A CT window preset: ``width``/``level`` in HU, bound to a number key."""

    key: str
    name: str
    width: float
    level: float


#: Keys 1–4 as in OHIF (soft tissue / lung / bone / brain); values from REFERENCE.md.
PRESETS: tuple[Preset, ...] = (
    Preset("1", "Soft tissue", 400.0, 40.0),
    Preset("2", "Lung", 1500.0, -600.0),
    Preset("3", "Bone", 2500.0, 480.0),
    Preset("4", "Brain", 80.0, 40.0),
)


@dataclass(frozen=True, slots=True, eq=False)
class DisplayIndex:
    """A frame quantised for table lookup: pixel value ``base + step * index``.

    ``exact`` is True when every pixel value is represented without error.
    """

    index: np.ndarray  # uint16 (rows, cols), C-contiguous
    base: float
    step: float
    levels: int
    exact: bool

    @classmethod
    def from_frame(cls, frame: Frame) -> DisplayIndex:
        return cls.from_pixels(frame.pixels)

    @classmethod
    def from_pixels(cls, pixels: np.ndarray) -> DisplayIndex:
        """Quantise ``pixels`` (any real 2-D array). Costs a few passes over the frame:
        build it off the GUI thread (the pipeline's decode stage does)."""
        arr = np.asarray(pixels, dtype=np.float32)
        if arr.ndim != 2 or arr.size == 0:
            raise ValueError(f'Argument "pixels" must be a non-empty 2-D array, got shape {arr.shape}.')
        if not np.isfinite(arr).all():  # never from DICOM, but a NaN must not break the display
            arr = np.nan_to_num(arr, nan=0.0, posinf=0.0, neginf=0.0)
        lo, hi = float(arr.min()), float(arr.max())
        base = math.floor(lo)
        span = hi - base
        if span < _LEVELS and np.array_equal(arr, np.rint(arr)):
            idx = (arr - np.float32(base)).astype(np.uint16)
            return cls(np.ascontiguousarray(idx), float(base), 1.0, int(span) + 1, True)
        step = max(span, 1e-6) / (_LEVELS - 1)
        idx = np.rint((arr - np.float32(base)) / np.float32(step))
        np.clip(idx, 0, _LEVELS - 1, out=idx)
        return cls(np.ascontiguousarray(idx.astype(np.uint16)), float(base), float(step), _LEVELS, False)

    def values(self) -> np.ndarray:
        """The pixel value each index stands for (float32, ``levels`` entries)."""
        return (self.base + self.step * np.arange(self.levels, dtype=np.float64)).astype(np.float32)


class IndexedValues:
    """The pixel values of an exact :class:`DisplayIndex`, read like a 2-D float32 array, a
    pixel or a slice at a time (``values[row, col]``, ``values[r0:r1, c0:c1]``), so the viewer
    need not keep the float copy of every image beside its index."""

    __slots__ = ("_index",)

    def __init__(self, index: DisplayIndex) -> None:
        if not index.exact:
            raise ValueError("only an exact index holds every pixel value")
        self._index = index

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._index.index.shape)

    def __getitem__(self, key: Any) -> Any:
        codes = self._index.index[key]
        if isinstance(codes, np.ndarray):
            return codes.astype(np.float32) + np.float32(self._index.base)
        return np.float32(self._index.base + int(codes))


def window_lut(index: DisplayIndex, center: float, width: float, invert: bool = False) -> np.ndarray:
    """The uint8 grey level of each index under window ``center``/``width``: linear from
    ``center - width/2`` (black) to ``center + width/2`` (white), clipped; reversed by ``invert``."""
    if not (math.isfinite(center) and math.isfinite(width)) or width <= 0:
        raise ValueError(f'Argument "width" must be > 0 and the window finite, got {center!r}/{width!r}.')
    unit = normalize(index.values(), center, width)
    unit *= np.float32(255.0)
    lut = np.rint(unit).astype(np.uint8)
    return (255 - lut) if invert else lut


def apply_lut(index: DisplayIndex, lut: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The grey image: ``lut[index]`` as a C-contiguous uint8 ``(rows, cols)`` array, written into
    ``out`` when given (reusing a buffer saves the page faults of a fresh 16 MB one per 4096² frame)."""
    if out is not None and (out.shape != index.index.shape or out.dtype != np.uint8 or not out.flags.c_contiguous):
        out = None
    return np.take(lut, index.index, out=out)


def drag_window(center: float, width: float, dx: float, dy: float, sensitivity: float) -> tuple[float, float]:
    """The window after a mouse drag of ``(dx, dy)`` screen pixels, the OHIF way: right widens,
    down raises the level. ``sensitivity`` is modality units per pixel (scale it with the window)."""
    width = max(1.0, width + dx * sensitivity)
    center = center + dy * sensitivity
    return center, width


def value_text(value: float, modality: str) -> str:
    """The pixel value under the cursor for the HUD: ``HU -45`` for CT, ``value 1234`` otherwise."""
    shown = f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"
    return f"HU {shown}" if modality.upper() == "CT" else f"value {shown}"


@dataclass(frozen=True, slots=True, eq=False)
class Layer:
    """An RGBA overlay cut to where it is not transparent: ``rgba`` sits at ``(row, col)``.

    A lesion layer covers a few hundred pixels of a 4096² radiograph; keeping
    only its bounding box saves memory and the upload to the GPU/screen.
    """

    rgba: np.ndarray
    row: int
    col: int

    @classmethod
    def from_rgba(cls, rgba: np.ndarray) -> Layer | None:
        """``rgba`` (rows, cols, 4) cut to its non-transparent box; None when all transparent."""
        alpha = rgba[:, :, 3]
        rows = np.flatnonzero(alpha.any(axis=1))
        if rows.size == 0:
            return None
        cols = np.flatnonzero(alpha.any(axis=0))
        r0, r1, c0, c1 = int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1
        return cls(np.ascontiguousarray(rgba[r0:r1, c0:c1]), r0, c0)
