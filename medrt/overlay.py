"""Lesion overlays in the source pixel grid: an RGBA layer, a rendered RGB picture and a PNG.

No Qt here (numpy and PIL only), so the batch mode, the listener's secondary
captures and the viewer draw the same thing:

- :func:`overlay_rgba` gives each lesion a fill and an outline in its own colour
  (cornerstone's defaults: fill alpha 0.2, outline alpha 0.7, 2 px), taken from
  ``FrameResult.labels``. The outline lies on the lesion's own edge pixels, so
  the layer is opaque exactly where the label map is non-zero. Where a lesion
  runs off the image, the image border is not drawn as its edge.
- :func:`render` windows the frame to greyscale (display semantics: MONOCHROME1
  is already inverted in ``Frame.pixels``; colour sources show their luminance),
  composites the overlay and writes each lesion's longest diameter next to it
  ("12.3 mm", "12.3 mm at detector" on a radiograph measured at the detector, or "12 px"
  when the spacing is unknown; ``*`` marks a lesion the
  2× recheck confirmed). The font scales with the image, so the text reads the
  same on a 512² slice and on a 4096² radiograph, and it always stays inside the
  image.
- :func:`save_png` writes a render atomically, optionally downsampled.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from medrt.export.write import atomic_write
from medrt.preprocess import normalize
from medrt.types import FrameResult, Lesion, Window

__all__ = [
    "PALETTE",
    "lesion_color",
    "label_text",
    "font_size",
    "grayscale",
    "overlay_rgba",
    "render",
    "save_png",
]

log = logging.getLogger(__name__)

# Distinct, saturated colours that read on grey; lesion ``label`` k gets PALETTE[(k - 1) % 10].
PALETTE: tuple[tuple[int, int, int], ...] = (
    (255, 64, 64),
    (64, 160, 255),
    (255, 200, 0),
    (0, 210, 120),
    (200, 90, 255),
    (255, 130, 0),
    (0, 220, 220),
    (255, 90, 190),
    (170, 230, 40),
    (150, 120, 255),
)
RECHECK_MARK = "*"
_MIN_FONT_PX = 10
_FONT_FRACTION = 1 / 48  # font height as a fraction of the longer image side

Box = tuple[int, int, int, int]


def lesion_color(label: int) -> tuple[int, int, int]:
    """The overlay colour of the lesion whose value in the label map is ``label`` (>= 1)."""
    if label < 1:
        raise ValueError(f'Argument "label" must be >= 1, got {label!r}.')
    return PALETTE[(int(label) - 1) % len(PALETTE)]


def label_text(lesion: Lesion, spacing_known: bool, qualifier: str = "") -> str:
    """The text drawn beside a lesion: its longest diameter, in mm (followed by where it
    measures, :attr:`medrt.types.SpacingSource.qualifier`: " at detector" on a radiograph
    measured at its ImagerPixelSpacing) or in pixels."""
    text = f"{lesion.diameter_mm:.1f} mm{qualifier}" if spacing_known else f"{lesion.diameter_mm:.0f} px"
    return text + (RECHECK_MARK if lesion.rechecked else "")


@dataclass(frozen=True, slots=True)
class _Piece:
    """One label's pixels inside a box around it: the fill mask and the outline mask."""

    label: int
    box: Box
    fill: np.ndarray
    edge: np.ndarray


def _alpha(value: float, name: str) -> int:
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(f'Argument "{name}" must be in [0, 1], got {value!r}.')
    return int(round(float(value) * 255))


def _check_result(result: FrameResult) -> np.ndarray:
    if not isinstance(result, FrameResult):
        raise TypeError(f'Argument "result" must be a FrameResult, got {type(result).__name__}.')
    labels = np.asarray(result.labels)
    if labels.shape != result.frame.shape:
        raise ValueError(
            f'Argument "result": labels have shape {labels.shape}, the frame {result.frame.shape}.'
        )
    if labels.dtype.kind not in "ui":
        raise ValueError(f'Argument "result": labels must be integers, got {labels.dtype}.')
    return labels


def _label_boxes(labels: np.ndarray) -> Iterator[tuple[int, Box]]:
    """Each non-zero label value with its half-open bounding box ``(r0, c0, r1, c1)``.

    One ``nonzero`` over the frame finds every labelled pixel, so a 4096²
    radiograph with a few small lesions costs one pass, not one per lesion.
    """
    rows, cols = np.nonzero(labels)
    if rows.size == 0:
        return
    values = labels[rows, cols]
    order = np.argsort(values, kind="stable")
    values, rows, cols = values[order], rows[order], cols[order]
    starts = np.flatnonzero(np.diff(values)) + 1
    for r, c, v in zip(np.split(rows, starts), np.split(cols, starts), values[np.r_[0, starts]],
                       strict=True):
        yield int(v), (int(r.min()), int(c.min()), int(r.max()) + 1, int(c.max()) + 1)


def _erode(mask: np.ndarray, steps: int) -> np.ndarray:
    """``mask`` eroded ``steps`` times by a 3×3 square, the array's own border replicated."""
    out = mask
    h, w = mask.shape
    for _ in range(steps):
        p = np.pad(out, 1, mode="edge")
        nxt = out.copy()
        for dr in (0, 1, 2):
            for dc in (0, 1, 2):
                if dr != 1 or dc != 1:
                    nxt &= p[dr : dr + h, dc : dc + w]
        out = nxt
    return out


def _layer(labels: np.ndarray, outline_px: int) -> Iterator[_Piece]:
    """Each label's fill and outline (its pixels within ``outline_px`` of a non-lesion pixel).

    The box around a label is its bounding box grown by ``outline_px`` and
    clipped to the image: inside the image the erosion then sees the real
    neighbours, and at the image border the edge is replicated, so a lesion cut
    by the border is not outlined along it.
    """
    if not isinstance(outline_px, (int, np.integer)) or outline_px < 0:
        raise ValueError(f'Argument "outline_px" must be an integer >= 0, got {outline_px!r}.')
    rows, cols = labels.shape
    for value, (r0, c0, r1, c1) in _label_boxes(labels):
        box = (max(r0 - outline_px, 0), max(c0 - outline_px, 0), min(r1 + outline_px, rows),
               min(c1 + outline_px, cols))
        fill = labels[box[0] : box[2], box[1] : box[3]] == value
        edge = fill & ~_erode(fill, int(outline_px))
        yield _Piece(value, box, fill, edge)


def overlay_rgba(
    result: FrameResult, *, fill_alpha: float = 0.2, outline_alpha: float = 0.7, outline_px: int = 2,
    colors: Callable[[int], tuple[int, int, int]] = lesion_color,
) -> np.ndarray:
    """The lesion overlay of ``result`` as uint8 RGBA ``(rows, cols, 4)`` in the source grid.

    Every labelled pixel gets its label's colour (``colors(label)``, by default the
    lesion's, :func:`lesion_color`) at ``fill_alpha``; the ``outline_px`` pixels nearest
    the label's edge get ``outline_alpha`` instead. Unlabelled pixels are fully transparent.
    """
    labels = _check_result(result)
    a_fill, a_edge = _alpha(fill_alpha, "fill_alpha"), _alpha(outline_alpha, "outline_alpha")
    out = np.zeros((*labels.shape, 4), dtype=np.uint8)
    for p in _layer(labels, outline_px):
        r0, c0, r1, c1 = p.box
        view = out[r0:r1, c0:c1]
        view[p.fill, :3] = colors(p.label)
        view[p.fill, 3] = a_fill
        view[p.edge, 3] = a_edge
    return out


def _window(result: FrameResult, window: Window | tuple[float, float] | None) -> tuple[float, float]:
    if window is None:
        window = result.frame.window
    if isinstance(window, Window):
        center, width = window.center, window.width
    else:
        try:
            center, width = (float(v) for v in window)
        except (TypeError, ValueError):
            raise ValueError(
                f'Argument "window" must be a Window or (center, width), got {window!r}.'
            ) from None
    if not (np.isfinite(center) and np.isfinite(width) and width > 0):
        raise ValueError(f'Argument "window" must have a finite center and width > 0, got {window!r}.')
    return float(center), float(width)


def grayscale(result: FrameResult, window: Window | tuple[float, float] | None = None) -> np.ndarray:
    """The frame windowed to uint8 grey ``(rows, cols)``, higher = brighter."""
    unit = normalize(result.frame.pixels, *_window(result, window))  # the analysis' own windowing
    unit *= np.float32(255.0)
    return np.rint(unit).astype(np.uint8)


def font_size(shape: tuple[int, int]) -> int:
    """Label font height in pixels for an image of ``shape``: 1/48 of the longer side, >= 10."""
    return max(_MIN_FONT_PX, int(round(max(shape) * _FONT_FRACTION)))


def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: a fixed bitmap font (still inside the image, just small)
        log.warning("Pillow < 10.1: label text uses the small bitmap font")
        return ImageFont.load_default()


Rect = tuple[int, int, int, int]  # (x0, y0, x1, y1), half-open, in image (column, row)


def _candidates(box: Box, w: int, h: int, pad: int) -> list[Rect]:
    """Where a ``w``×``h`` label may go beside a lesion's ``box``, best first."""
    r0, c0, r1, c1 = box
    corners = (
        (c1 + pad, r0),  # right of the box, top-aligned
        (c0 - pad - w, r0),  # left
        (c0, r1 + pad),  # below
        (c0, r0 - pad - h),  # above
        (c1 + pad, r1 - h),  # right, bottom-aligned
        (c0 - pad - w, r1 - h),  # left, bottom-aligned
    )
    return [(x, y, x + w, y + h) for x, y in corners]


def _overlaps(a: Rect, b: Rect) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _place(cands: list[Rect], shape: tuple[int, int], avoid: list[Rect], taken: list[Rect]) -> Rect:
    """The first candidate inside the image that covers no lesion and no other label; else the
    first inside that covers no label; else the best one moved inside the image."""
    rows, cols = shape

    def inside(r: Rect) -> bool:
        return r[0] >= 0 and r[1] >= 0 and r[2] <= cols and r[3] <= rows

    for ok in (
        lambda r: inside(r) and not any(_overlaps(r, t) for t in avoid + taken),
        lambda r: inside(r) and not any(_overlaps(r, t) for t in taken),
    ):
        for r in cands:
            if ok(r):
                return r
    x0, y0, x1, y1 = cands[0]
    w, h = x1 - x0, y1 - y0
    x, y = min(max(x0, 0), max(cols - w, 0)), min(max(y0, 0), max(rows - h, 0))
    return (x, y, x + w, y + h)


def _draw_labels(img: Image.Image, result: FrameResult, size: int) -> None:
    spacing_known = result.frame.spacing_mm is not None
    qualifier = result.frame.spacing_source.qualifier if spacing_known else ""
    draw = ImageDraw.Draw(img)
    shape = (img.height, img.width)
    lesion_rects = [(c0, r0, c1, r1) for r0, c0, r1, c1 in (les.bbox for les in result.lesions)]
    taken: list[Rect] = []
    for lesion in result.lesions:
        text = label_text(lesion, spacing_known, qualifier)
        s = size
        while True:  # shrink only when the text would not fit in the image at all
            font = _font(s)
            stroke = max(1, s // 12)
            left, top, right, bottom = draw.textbbox((0, 0), text, font=font, stroke_width=stroke)
            w, h = right - left, bottom - top
            if (w <= img.width and h <= img.height) or s <= 4:
                break
            s = max(4, int(s * min(img.width / max(w, 1), img.height / max(h, 1)) * 0.95))
        rect = _place(_candidates(lesion.bbox, w, h, max(2, s // 4)), shape, lesion_rects, taken)
        taken.append(rect)
        # textbbox is relative to the anchor: shift so the ink starts at the chosen corner.
        draw.text((rect[0] - left, rect[1] - top), text, font=font,
                  fill=lesion_color(max(lesion.label, 1)), stroke_width=stroke, stroke_fill=(0, 0, 0))


def render(
    result: FrameResult,
    *,
    window: Window | tuple[float, float] | None = None,
    labels: bool = True,
    fill_alpha: float = 0.2,
    outline_alpha: float = 0.7,
    outline_px: int = 2,
) -> np.ndarray:
    """The frame windowed to grey with the lesion overlay composited: uint8 RGB ``(rows, cols, 3)``.

    ``window`` defaults to ``result.frame.window``. With ``labels``, each
    lesion's longest diameter is written beside its bounding box (see
    :func:`label_text`), in the lesion's colour with a dark outline, at a font
    size that scales with the image (:func:`font_size`).
    """
    lab = _check_result(result)
    gray = grayscale(result, window)
    rgb = np.repeat(gray[:, :, None], 3, axis=2)
    a_fill, a_edge = _alpha(fill_alpha, "fill_alpha"), _alpha(outline_alpha, "outline_alpha")
    for p in _layer(lab, outline_px):
        r0, c0, r1, c1 = p.box
        view = rgb[r0:r1, c0:c1]
        alpha = np.zeros(p.fill.shape, dtype=np.float32)
        alpha[p.fill] = a_fill / 255.0
        alpha[p.edge] = a_edge / 255.0
        color = np.asarray(lesion_color(p.label), dtype=np.float32)
        blended = view * (1.0 - alpha[:, :, None]) + color * alpha[:, :, None]
        view[p.fill] = np.rint(blended[p.fill]).astype(np.uint8)
    if labels and result.lesions:
        img = Image.fromarray(rgb)
        _draw_labels(img, result, font_size(result.frame.shape))
        rgb = np.asarray(img).copy()
    return rgb


def save_png(
    result: FrameResult, path: str | os.PathLike[str], *, max_side: int | None = None, **kw: object
) -> Path:
    """Write :func:`render` (keyword arguments ``kw`` go to it) as a PNG, atomically.

    With ``max_side``, the picture is downsampled (area-averaged) so its longer
    side is at most ``max_side`` pixels; the outline is then drawn wider (unless
    ``outline_px`` is given) so it is still about 2 px wide in the saved picture,
    and the text, sized to the full image, shrinks with it. Returns the path.
    """
    _check_result(result)
    if max_side is not None and (not isinstance(max_side, int) or max_side < 1):
        raise ValueError(f'Argument "max_side" must be a positive integer or None, got {max_side!r}.')
    longest = max(result.frame.shape)
    if max_side is not None and longest > max_side and "outline_px" not in kw:
        # Keep the outline about 2 px wide in the picture that is actually saved.
        kw["outline_px"] = max(2, round(2 * longest / max_side))
    img = Image.fromarray(render(result, **kw))  # type: ignore[arg-type]
    if max_side is not None and longest > max_side:
        scale = max_side / longest
        size = (max(1, round(img.width * scale)), max(1, round(img.height * scale)))
        img = img.resize(size, Image.Resampling.BOX)
    out = atomic_write(path, lambda fp: img.save(fp, format="PNG"))
    log.debug("wrote overlay PNG for %s", result.frame.key)
    return out
