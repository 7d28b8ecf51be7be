"""The image view: the current frame, its overlays, zoom/pan/fit and the mouse tools.

A ``QGraphicsView`` over a scene whose coordinates are source pixels (x =
column, y = row), so zoom and pan are the view's transform and every layer
lines up with the image by construction:

- z 0: the windowed grey image (a QImage over a numpy buffer the item keeps);
- z 1: the DICOM SEG layer; z 2: the AI overlay (RGBA from ``medrt.overlay``);
- z 3: ROI crop boxes; z 4: lesion numbers (constant size on screen);
- z 5: lengths and elliptical ROIs measured with the length and ellipse tools, each
  with its text.

Mouse: wheel scrolls images (Ctrl+wheel zooms), left drag is window/level (with
the length or ellipse tool, ``tool = "length"`` or ``"ellipse"``, it draws one and
emits ``measured``),
middle drag (or Shift+left) pans, right drag zooms. The value under the cursor
is reported through ``hovered``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from medrt_gui.imaging import Layer
from PySide6.QtCore import QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFont, QImage, QPainter, QPen, QPixmap
from PySide6.QtWidgets import (
    QFrame,
    QGraphicsEllipseItem,
    QGraphicsItem,
    QGraphicsLineItem,
    QGraphicsPixmapItem,
    QGraphicsRectItem,
    QGraphicsScene,
    QGraphicsSimpleTextItem,
    QGraphicsView,
)

from medrt.overlay import lesion_color
from medrt.types import Lesion

__all__ = ["ImageView", "gray_qimage", "rgba_qimage"]

_MARGIN = 100_000.0  # the scene reaches far past the image, so it can be panned anywhere
ZOOM_STEP = 1.25
MIN_SCALE, MAX_SCALE = 0.02, 64.0


def gray_qimage(gray: np.ndarray) -> QImage:
    """A QImage over a C-contiguous uint8 ``(rows, cols)`` array; keep ``gray`` alive with it."""
    if gray.dtype != np.uint8 or gray.ndim != 2 or not gray.flags.c_contiguous:
        raise ValueError("gray must be a C-contiguous uint8 (rows, cols) array")
    return QImage(gray.data, gray.shape[1], gray.shape[0], gray.strides[0], QImage.Format.Format_Grayscale8)


def rgba_qimage(rgba: np.ndarray) -> QImage:
    """A QImage over a C-contiguous uint8 ``(rows, cols, 4)`` RGBA array (not premultiplied)."""
    if rgba.dtype != np.uint8 or rgba.ndim != 3 or rgba.shape[2] != 4 or not rgba.flags.c_contiguous:
        raise ValueError("rgba must be a C-contiguous uint8 (rows, cols, 4) array")
    return QImage(rgba.data, rgba.shape[1], rgba.shape[0], rgba.strides[0], QImage.Format.Format_RGBA8888)


class _Layer(QGraphicsPixmapItem):
    """A pixmap item that remembers the numpy buffer its image was made from."""

    def __init__(self, z: float) -> None:
        super().__init__()
        self.setZValue(z)
        self.setTransformationMode(Qt.TransformationMode.FastTransformation)
        self.buffer: np.ndarray | None = None
        self.source: object = None

    def show_array(self, arr: np.ndarray | None, rgba: bool, row: int = 0, col: int = 0) -> None:
        """Show ``arr`` with its top-left pixel at source pixel ``(row, col)``."""
        self.buffer = arr
        self.source = arr
        self.setPos(col, row)
        if arr is None:
            self.setPixmap(QPixmap())
            return
        image = rgba_qimage(arr) if rgba else gray_qimage(arr)
        self.setPixmap(QPixmap.fromImage(image))

    def show_layer(self, layer: Layer | None) -> None:
        """Show an overlay layer (None: nothing); a no-op when it is already shown."""
        if layer is not None and layer is getattr(self, "source", None):
            return
        if layer is None:
            self.show_array(None, rgba=True)
        else:
            self.show_array(layer.rgba, rgba=True, row=layer.row, col=layer.col)
        self.source = layer


class ImageView(QGraphicsView):
    """The image and its layers; see the module docstring for the mouse tools."""

    hovered = Signal(object)  # (row, col) inside the image, or None
    windowDragged = Signal(float, float)  # dx, dy in screen pixels since the last event
    scrolled = Signal(int)  # +1: next image, -1: previous
    zoomChanged = Signal(float)
    measured = Signal(object)  # a medrt_gui.measure.Length or Ellipse drawn with its tool

    def __init__(self, parent: object = None) -> None:
        super().__init__(parent)
        self.setScene(QGraphicsScene(self))
        self.setBackgroundBrush(QBrush(QColor(0, 0, 0)))
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setTransformationAnchor(QGraphicsView.ViewportAnchor.AnchorViewCenter)
        self.setMouseTracking(True)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.image = _Layer(0)
        self.seg = _Layer(1)
        self.overlay = _Layer(2)
        for item in (self.image, self.seg, self.overlay):
            self.scene().addItem(item)
        self._crops: list[QGraphicsRectItem] = []
        self._labels: list[QGraphicsSimpleTextItem] = []
        self.image_shape: tuple[int, int] | None = None
        self.fitted = True
        self.crops_visible = False
        self.labels_visible = True
        self._overlays_on = True
        self._seg_wanted = True
        self._opacity = 1.0
        self._wheel = 0
        self._drag: tuple[Qt.MouseButton, QPointF] | None = None
        self.tool = "window"  # or "length" / "ellipse": left drag measures
        self._measuring: tuple[QPointF, QGraphicsItem] | None = None
        self._measure_items: list[QGraphicsItem] = []

    # -- content -----------------------------------------------------------------

    def set_image(self, gray: np.ndarray | None) -> None:
        """Show a windowed uint8 frame (None: nothing). A new size re-fits the view."""
        self.image.show_array(gray, rgba=False)
        shape = None if gray is None else (int(gray.shape[0]), int(gray.shape[1]))
        if shape != self.image_shape:
            self.image_shape = shape
            if shape is not None:
                r = QRectF(0, 0, shape[1], shape[0])
                self.setSceneRect(r.adjusted(-_MARGIN, -_MARGIN, _MARGIN, _MARGIN))
                self.fit()

    def blank(self) -> None:
        """Show nothing (an image still loading, or one that cannot be shown), keeping zoom and pan,
        so that no image is ever shown under another image's label."""
        self.image.show_array(None, rgba=False)
        self.set_overlay(None)
        self.set_seg(None)
        self.set_crops(())
        self.set_lesions(())
        self.set_measurements(())

    def set_overlay(self, layer: Layer | None) -> None:
        self.overlay.show_layer(layer)

    def set_seg(self, layer: Layer | None) -> None:
        self.seg.show_layer(layer)

    def set_overlay_visible(self, visible: bool) -> None:
        """Show or hide every overlay (the AI layer, its lesion numbers and the SEG layer)."""
        self._overlays_on = visible
        for item in (self.overlay, *self._labels):
            item.setVisible(visible)
        self.seg.setVisible(visible and self._seg_wanted)

    def set_seg_visible(self, visible: bool) -> None:
        self._seg_wanted = visible
        self.seg.setVisible(visible and self._overlays_on)

    def set_opacity(self, opacity: float) -> None:
        """Scale the overlay layers' alpha (1.0: fill 0.2 and outline 0.7 as drawn) and the lesion numbers'."""
        self._opacity = max(0.0, min(1.0, opacity))
        for item in (self.overlay, self.seg, *self._labels):
            item.setOpacity(self._opacity)

    def set_crops(self, boxes: tuple[tuple[int, int, int, int], ...]) -> None:
        """The ROI crops the UNet ran on, as dashed boxes (shown when ``crops_visible``)."""
        for item in self._crops:
            self.scene().removeItem(item)
        self._crops = []
        pen = QPen(QColor(255, 255, 0, 200), 2, Qt.PenStyle.DashLine)
        pen.setCosmetic(True)
        for r0, c0, r1, c1 in boxes:
            # Inset by half a pixel so a crop covering the whole frame stays visible at its border.
            item = QGraphicsRectItem(c0 + 0.5, r0 + 0.5, c1 - c0 - 1, r1 - r0 - 1)
            item.setPen(pen)
            item.setZValue(3)
            item.setVisible(self.crops_visible)
            self.scene().addItem(item)
            self._crops.append(item)

    def set_crops_visible(self, visible: bool) -> None:
        self.crops_visible = visible
        for item in self._crops:
            item.setVisible(visible)

    @property
    def crop_items(self) -> list[QGraphicsRectItem]:
        return list(self._crops)

    def set_lesions(self, lesions: tuple[Lesion, ...], numbers: Sequence[int] | None = None) -> None:
        """Each lesion's number (``numbers``, its number in the series; else 1, 2, ...) beside
        it, in its overlay colour, constant size on screen."""
        for item in self._labels:
            self.scene().removeItem(item)
        self._labels = []
        numbers = list(numbers) if numbers is not None else list(range(1, len(lesions) + 1))
        for i, les in zip(numbers, lesions, strict=True):
            item = self._label(str(i), QColor(*lesion_color(max(les.label, 1))), les.bbox[3] + 1, les.bbox[0], z=4)
            item.setVisible(self._overlays_on and self.labels_visible)
            item.setOpacity(self._opacity)
            self.scene().addItem(item)
            self._labels.append(item)

    @staticmethod
    def _label(text: str, color: QColor, x: float, y: float, z: float) -> QGraphicsSimpleTextItem:
        """Bold text outlined in black at scene point (x, y), the same size on screen at any zoom."""
        font = QFont()
        font.setPointSize(10)
        font.setBold(True)
        item = QGraphicsSimpleTextItem(text)
        item.setFont(font)
        item.setBrush(QBrush(color))
        item.setPen(QPen(QColor(0, 0, 0), 0.5))
        item.setFlag(QGraphicsItem.GraphicsItemFlag.ItemIgnoresTransformations)
        item.setPos(x, y)
        item.setZValue(z)
        return item

    @staticmethod
    def _length_pen() -> QPen:
        pen = QPen(QColor(255, 220, 0), 2)
        pen.setCosmetic(True)  # two screen pixels at any zoom
        return pen

    def _shape_item(self, kind: str, x0: float, y0: float, x1: float, y1: float) -> QGraphicsItem:
        """A line, or the ellipse in the box, from (x0, y0) to (x1, y1), in the measuring pen."""
        if kind == "ellipse":
            item: QGraphicsItem = QGraphicsEllipseItem(QRectF(QPointF(x0, y0), QPointF(x1, y1)).normalized())
        else:
            item = QGraphicsLineItem(x0, y0, x1, y1)
        item.setPen(self._length_pen())  # type: ignore[attr-defined]
        item.setZValue(5)
        return item

    def set_measurements(self, shapes: tuple[tuple[object, str], ...] | list[tuple[object, str]]) -> None:
        """What was measured on this image, each ``(Length or Ellipse, text)``: the shape,
        and its text beside it, constant size on screen."""
        from medrt_gui.measure import Ellipse

        for item in self._measure_items:
            self.scene().removeItem(item)
        self._measure_items = []
        for shape, text in shapes:
            (x0, y0), (x1, y1) = shape.a, shape.b  # type: ignore[attr-defined]
            item = self._shape_item("ellipse" if isinstance(shape, Ellipse) else "length", x0, y0, x1, y1)
            label = self._label(text, QColor(255, 220, 0), max(x0, x1) + 2, max(y0, y1) + 2, z=5)
            for it in (item, label):
                self.scene().addItem(it)
                self._measure_items.append(it)

    @property
    def measurement_items(self) -> list[QGraphicsItem]:
        return list(self._measure_items)

    # -- zoom and pan ----------------------------------------------------------------

    @property
    def zoom(self) -> float:
        return float(self.transform().m11())

    def image_rect(self) -> QRectF:
        if self.image_shape is None:
            return QRectF()
        return QRectF(0, 0, self.image_shape[1], self.image_shape[0])

    def fit(self) -> None:
        """The whole image in the window, centred."""
        if self.image_shape is None:
            return
        s = self.fit_zoom()
        self.resetTransform()
        self.scale(s, s)
        self.centerOn(self.image_rect().center())
        self.fitted = True
        self.zoomChanged.emit(self.zoom)

    def fit_zoom(self) -> float:
        """The scale :meth:`fit` would give."""
        if self.image_shape is None:
            return 1.0
        vp = self.viewport().rect()
        return max(MIN_SCALE, min(vp.width() / self.image_shape[1], vp.height() / self.image_shape[0]))

    def zoom_by(self, factor: float, anchor: QPointF | None = None) -> None:
        """Zoom by ``factor`` about the view centre (or the scene point ``anchor``, which stays put)."""
        new = min(MAX_SCALE, max(MIN_SCALE, self.zoom * factor))
        factor = new / self.zoom if self.zoom else 1.0
        if anchor is None:
            self.scale(factor, factor)
        else:
            before = self.mapFromScene(anchor)
            self.scale(factor, factor)
            after = self.mapFromScene(anchor)
            self._pan_by(after.x() - before.x(), after.y() - before.y())
        self.fitted = False
        self.zoomChanged.emit(self.zoom)

    def center_on_box(self, bbox: tuple[int, int, int, int], fraction: float = 0.3,
                      center: tuple[float, float] | None = None) -> None:
        """Centre on a half-open ``(r0, c0, r1, c1)`` box (or on ``center`` (row, col)) and zoom so
        the box fills about ``fraction`` of the window (never less than the fitted scale)."""
        r0, c0, r1, c1 = bbox
        vp = self.viewport().rect()
        size = max(r1 - r0, c1 - c0, 8)
        target = fraction * min(vp.width(), vp.height()) / size
        target = min(MAX_SCALE, max(target, self.fit_zoom() * 2.0))
        self.resetTransform()
        self.scale(target, target)
        row, col = center if center is not None else ((r0 + r1) / 2.0, (c0 + c1) / 2.0)
        self.centerOn(QPointF(col + 0.5, row + 0.5))
        self.fitted = False
        self.zoomChanged.emit(self.zoom)

    def view_center(self) -> tuple[float, float]:
        """The scene point at the window's centre, as (row, col) in source pixels."""
        p = self.mapToScene(self.viewport().rect().center())
        return float(p.y()), float(p.x())

    def _pan_by(self, dx: float, dy: float) -> None:
        h, v = self.horizontalScrollBar(), self.verticalScrollBar()
        h.setValue(int(round(h.value() + dx)))
        v.setValue(int(round(v.value() + dy)))

    def pan(self, dx: float, dy: float) -> None:
        """Move the image by ``(dx, dy)`` screen pixels."""
        self._pan_by(-dx, -dy)
        self.fitted = False

    def resizeEvent(self, event: object) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        if self.fitted:
            self.fit()

    # -- rendering --------------------------------------------------------------------

    def render_scene(self) -> QImage:
        """The image and every visible layer at 1:1 in source pixels (what the overlay tests sample)."""
        if self.image_shape is None:
            return QImage()
        rows, cols = self.image_shape
        out = QImage(cols, rows, QImage.Format.Format_RGB32)
        out.fill(QColor(0, 0, 0))
        painter = QPainter(out)
        self.scene().render(painter, QRectF(0, 0, cols, rows), self.image_rect())
        painter.end()
        return out

    # -- mouse ---------------------------------------------------------------------------

    def scene_pixel(self, pos: QPointF) -> tuple[int, int] | None:
        if self.image_shape is None:
            return None
        p = self.mapToScene(pos.toPoint())
        row, col = int(np.floor(p.y())), int(np.floor(p.x()))
        if 0 <= row < self.image_shape[0] and 0 <= col < self.image_shape[1]:
            return row, col
        return None

    def wheelEvent(self, event: object) -> None:  # noqa: N802
        delta = event.angleDelta().y()  # type: ignore[attr-defined]
        if delta == 0:
            return
        if event.modifiers() & Qt.KeyboardModifier.ControlModifier:  # type: ignore[attr-defined]
            anchor = self.mapToScene(event.position().toPoint())  # type: ignore[attr-defined]
            self.zoom_by(ZOOM_STEP ** (delta / 120.0), anchor)
        else:
            # One image per notch (120); touchpads send smaller steps, which add up.
            self._wheel += delta
            while abs(self._wheel) >= 120:
                step = 1 if self._wheel > 0 else -1
                self._wheel -= 120 * step
                self.scrolled.emit(-step)
        event.accept()  # type: ignore[attr-defined]

    def mousePressEvent(self, event: object) -> None:  # noqa: N802
        button = event.button()  # type: ignore[attr-defined]
        if button == Qt.MouseButton.LeftButton and event.modifiers() & Qt.KeyboardModifier.ShiftModifier:  # type: ignore[attr-defined]
            button = Qt.MouseButton.MiddleButton
        if button == Qt.MouseButton.LeftButton and self.tool in ("length", "ellipse") and self.image_shape is not None:
            start = self.mapToScene(event.position().toPoint())  # type: ignore[attr-defined]
            item = self._shape_item(self.tool, start.x(), start.y(), start.x(), start.y())
            self.scene().addItem(item)
            self._measuring = (start, item)
            event.accept()  # type: ignore[attr-defined]
            return
        self._drag = (button, event.position())  # type: ignore[attr-defined]
        event.accept()  # type: ignore[attr-defined]

    def mouseMoveEvent(self, event: object) -> None:  # noqa: N802
        pos = event.position()  # type: ignore[attr-defined]
        self.hovered.emit(self.scene_pixel(pos))
        if self._measuring is not None:
            start, item = self._measuring
            end = self.mapToScene(pos.toPoint())
            if isinstance(item, QGraphicsEllipseItem):
                item.setRect(QRectF(start, end).normalized())
            else:
                item.setLine(start.x(), start.y(), end.x(), end.y())  # type: ignore[attr-defined]
            event.accept()  # type: ignore[attr-defined]
            return
        if self._drag is None:
            return
        button, last = self._drag
        dx, dy = pos.x() - last.x(), pos.y() - last.y()
        self._drag = (button, pos)
        if button == Qt.MouseButton.LeftButton:
            self.windowDragged.emit(dx, dy)
        elif button == Qt.MouseButton.MiddleButton:
            self.pan(dx, dy)
        elif button == Qt.MouseButton.RightButton:
            self.zoom_by(1.01 ** (-dy))
        event.accept()  # type: ignore[attr-defined]

    def mouseReleaseEvent(self, event: object) -> None:  # noqa: N802
        self._drag = None
        if self._measuring is not None:
            from medrt_gui.measure import Ellipse, Length

            start, item = self._measuring
            self._measuring = None
            self.scene().removeItem(item)  # the window draws it again with its text
            end = self.mapToScene(event.position().toPoint())  # type: ignore[attr-defined]
            if (end - start).manhattanLength() * self.zoom >= 3:  # a click is not a measurement
                kind = Ellipse if isinstance(item, QGraphicsEllipseItem) else Length
                self.measured.emit(kind((start.x(), start.y()), (end.x(), end.y())))
        event.accept()  # type: ignore[attr-defined]

    def leaveEvent(self, event: object) -> None:  # noqa: N802
        self.hovered.emit(None)
        super().leaveEvent(event)
