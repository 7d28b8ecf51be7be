"""What the viewer's tools do to the image shown: zoom, window/level and its presets,
invert, the segmentation overlay, cine, the length and ellipse tools, going to a lesion
(and from finding to finding), and the value under the cursor. Mixed into the main window.

Each only changes the window's view state and asks for a render (the drawing is
:meth:`medrt_gui.window.MainWindow.request_render`'s), so none of them paints.
"""

from __future__ import annotations

from typing import Any

from medrt_gui.canvas import ZOOM_STEP
from medrt_gui.imaging import PRESETS, drag_window, value_text
from medrt_gui.measure import Ellipse, Length, ellipse_text, length_text, size_units
from medrt_gui.study import Slot
from PySide6.QtCore import Qt

from medrt.analysis.tracking import SeriesLesion

__all__ = ["ViewToolsMixin"]


class ViewToolsMixin:
    """Zoom, window/level, overlays and measuring for :class:`medrt_gui.window.MainWindow`
    (uses its attributes)."""

    def zoom_in(self: Any) -> None:
        self.view.zoom_by(ZOOM_STEP)

    def zoom_out(self: Any) -> None:
        self.view.zoom_by(1 / ZOOM_STEP)

    def fit(self: Any) -> None:
        self.view.fit()

    def invert(self: Any) -> None:
        self.inverted = not self.inverted
        self.request_render()

    def reset(self: Any) -> None:
        self.window_cw = None
        self.inverted = False
        self.view.fit()
        self.request_render()

    def set_window(self: Any, center: float, width: float) -> None:
        self.window_cw = (float(center), max(1.0, float(width)))
        self.request_render()

    def apply_preset(self: Any, key: str) -> None:
        p = next(p for p in PRESETS if p.key == key)
        self.set_window(p.level, p.width)
        self.status(f"{p.name} window: W {p.width:g} / L {p.level:g}", 3000)

    def preset_1(self: Any) -> None:
        self.apply_preset("1")

    def preset_2(self: Any) -> None:
        self.apply_preset("2")

    def preset_3(self: Any) -> None:
        self.apply_preset("3")

    def preset_4(self: Any) -> None:
        self.apply_preset("4")

    def current_window(self: Any) -> tuple[float, float] | None:
        if self.window_cw is not None:
            return self.window_cw
        slot = self.current_slot()
        if slot is None or slot.frame is None:
            return None
        return float(slot.frame.window.center), float(slot.frame.window.width)

    def _drag_window(self: Any, dx: float, dy: float) -> None:
        cw = self.current_window()
        if cw is not None:
            self.set_window(*drag_window(cw[0], cw[1], dx, dy, sensitivity=max(cw[1], 20.0) / 256.0))

    def toggle_patient(self: Any) -> None:
        """The patient and study details in the HUD and the browser, on or off."""
        self.show_patient = not self.show_patient
        self.browser.show_study(self.study, self.series_i, show_patient=self.show_patient)
        self._update_hud()

    def toggle_hud(self: Any) -> None:
        """The corner texts over the image, on or off."""
        self.hud.set_hidden(not self.hud.hidden)

    def toggle_segmentation(self: Any) -> None:
        self.controls.overlay.toggle()

    def _overlay_toggled(self: Any, on: bool) -> None:
        self.view.set_overlay_visible(on)
        self._update_hud()

    def toggle_cine(self: Any) -> None:
        if self.cine.isActive():
            self.cine.stop()
        else:
            self.controls.follow.setChecked(False)
            self.cine.start()
        self.status("cine " + ("on" if self.cine.isActive() else "off"), 2000)

    def _cine_rate(self: Any, fps: int) -> None:
        self.cine.setInterval(max(1, round(1000 / max(1, fps))))

    def _set_tool(self: Any, tool: str, text: str) -> None:
        on = self.view.tool != tool
        self.view.tool = tool if on else "window"
        self.view.viewport().setCursor(Qt.CursorShape.CrossCursor if on else Qt.CursorShape.ArrowCursor)
        self.status(text if on else "Window/level: left drag")

    def toggle_length(self: Any) -> None:
        """The length tool on or off: with it, a left drag measures instead of setting W/L."""
        self._set_tool("length", "Length tool: drag on the image to measure; m again for window/level, "
                                 "Del clears this image")

    def toggle_ellipse(self: Any) -> None:
        """The ellipse tool on or off: a left drag draws an ROI and gives its mean, SD and area."""
        self._set_tool("ellipse", "Ellipse ROI: drag a box on the image; e again for window/level, "
                                  "Del clears this image")

    @staticmethod
    def _measure_text(shape: Length | Ellipse, slot: Slot) -> str:
        frame = slot.frame
        assert frame is not None
        if isinstance(shape, Ellipse):
            return ellipse_text(shape, slot.values, frame.spacing_mm, frame.spacing_source,  # type: ignore[arg-type]
                                frame.modality)
        return length_text(shape, frame.spacing_mm, frame.spacing_source)

    def clear_measurements(self: Any) -> None:
        slot = self.current_slot()
        if slot is not None and self.measurements.pop(slot.key, None):
            self.request_render()

    def _measured(self: Any, shape: Length | Ellipse) -> None:
        slot = self.current_slot()
        if slot is None or slot.frame is None or self.shown_key != slot.key:
            return
        self.measurements.setdefault(slot.key, []).append(shape)
        what = "ROI" if isinstance(shape, Ellipse) else "Length"
        self.status(f"{what}: {self._measure_text(shape, slot)}")
        self.request_render()

    def focus_lesion(self: Any, lesion: object) -> None:
        self.view.center_on_box(lesion.bbox, center=lesion.centroid)  # type: ignore[attr-defined]

    def go_to_lesion(self: Any, lesion: SeriesLesion) -> None:
        """The slice where a lesion of the series is largest, centred and zoomed on it."""
        entry = self.current_series
        keys = [slot.key for slot in entry.slots] if entry is not None else []
        if lesion.largest.key not in keys:
            return  # a live stream's history moved on
        self.show_image(keys.index(lesion.largest.key))
        self.focus_lesion(lesion.largest.lesion)

    def findings(self: Any) -> list[tuple[int, int, int, SeriesLesion]]:
        """Every lesion of the study once, as ``(series, image, number, lesion)`` in reading
        order: series by series, each at the image where it is largest."""
        out = []
        for si, entry in enumerate(self.study.series):
            index = {slot.key: i for i, slot in enumerate(entry.slots)}
            for lesion in entry.series_lesions()[0]:
                if lesion.largest.key in index:
                    out.append((si, index[lesion.largest.key], lesion.number, lesion))
        return sorted(out, key=lambda f: f[:3])

    def next_finding(self: Any, step: int = 1) -> SeriesLesion | None:
        """Go to the next lesion of the study (``step`` -1: the previous), series by series
        and image by image, at the image where it is largest, centred and zoomed on it; from
        the last, round to the first. After scrolling elsewhere, the first one from the image
        shown on. The status bar says which of how many it is."""
        found = self.findings()
        if not found:
            self.status("no lesions found in the images analysed so far")
            return None
        here = (self.series_i, self.slot_i)
        last = self._finding if self._finding is not None and self._finding[:2] == here else None
        cursor = last or (*here, -1 if step > 0 else 1 << 30)
        ahead = [i for i, f in enumerate(found) if (f[:3] > cursor if step > 0 else f[:3] < cursor)]
        at = (ahead[0] if step > 0 else ahead[-1]) if ahead else (0 if step > 0 else len(found) - 1)
        si, image, number, lesion = found[at]
        if si != self.series_i:
            self.show_series(si)
        self.show_image(image)
        self.focus_lesion(lesion.largest.lesion)
        self._finding = (si, image, number)
        slot = self.study.series[si].slots[image]
        frame = slot.header
        unit = size_units(frame.spacing_mm, frame.spacing_source)[0] if frame is not None else "mm"
        unit = unit if lesion.in_mm else "px"
        self.status(f"finding {at + 1} of {len(found)}: lesion {number}, {lesion.diameter_mm:.1f} {unit}"
                    + (f", on {lesion.slices} slices" if lesion.slices > 1 else ""), 0)
        return lesion

    def previous_finding(self: Any) -> SeriesLesion | None:
        return self.next_finding(-1)

    def _hover(self: Any, pixel: tuple[int, int] | None) -> None:
        self._hover_pixel = pixel
        self._update_hud()

    def _hover_value(self: Any, slot: Slot) -> str:
        """The value under the cursor in the image shown now (never a previous image's)."""
        pixel = self._hover_pixel
        frame = slot.frame
        if pixel is None or frame is None or self.shown_key != slot.key:
            return ""
        row, col = pixel
        if not (0 <= row < frame.rows and 0 <= col < frame.cols):
            return ""
        return f"({col}, {row}) {value_text(float(slot.values[row, col]), frame.modality)}"  # type: ignore[index]
