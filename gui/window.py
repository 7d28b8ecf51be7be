"""The main window: image view with HUD, series browser, lesion list, controls, menus, hotkeys.

Navigation and drawing live here; opening files, streams and SEGs in
:mod:`medrt_gui.streams`; zoom, window/level, overlays and measuring in
:mod:`medrt_gui.tools`. Drawing is coalesced: anything that changes
what is shown asks for a render, and one render runs when the event loop is
next idle, so a 30 fps stream never queues up paints.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from medrt_gui.bridge import AnalyzerProvider, Bridge, Decoder, Session
from medrt_gui.canvas import ImageView
from medrt_gui.hotkeys import HOTKEYS, help_html
from medrt_gui.hud import EventLoopMonitor, Hud, format_live
from medrt_gui.imaging import (
    DisplayIndex,
    Layer,
    apply_lut,
    window_lut,
)
from medrt_gui.measure import Ellipse, Length, size_units
from medrt_gui.panels import (
    FOLLOW_MODES,
    Controls,
    LesionList,
    LesionRow,
    SeriesBrowser,
    SeriesLesionTable,
)
from medrt_gui.seg import seg_overlay
from medrt_gui.streams import StreamsMixin
from medrt_gui.study import SeriesEntry, Slot, Study, decode_window
from medrt_gui.tools import ViewToolsMixin
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QDockWidget, QFileDialog, QMainWindow, QMessageBox, QTabWidget

from medrt.overlay import overlay_rgba
from medrt.types import Frame, FrameResult

__all__ = ["MainWindow"]

log = logging.getLogger(__name__)

Q = Qt.ConnectionType.QueuedConnection

#: The decoded images of opened files kept in memory, MB (``medrt view --image-cache``):
#: 2,000 CT slices of 512² as display indexes, or 32 radiographs of 4096².
IMAGE_CACHE_MB = 1024.0


def _seg_text(slot: Slot) -> str:
    """The HUD's word on the SEG layer of ``slot``: the segments on this image, by label."""
    if slot.seg is None or not slot.seg_present:
        return "SEG (no segment here)" if slot.seg is not None else "SEG"
    names = [slot.seg.label_of(n) for n in slot.seg_present]
    return "SEG: " + (", ".join(names) if len(names) <= 3 else f"{len(names)} segments")


def slice_place(frame: Frame) -> str:
    """Where a slice lies and how thick it is, as viewers' overlays give them
    ("loc -188.7 mm · thick 5.0 mm"): SliceLocation, else the position along the slice
    normal; SliceThickness, from an enhanced object's Pixel Measures before a top-level one
    (a conversion may leave one behind; the frame is measured with its Pixel Measures, as
    :func:`medrt.io.header.pixel_spacing` reads them). "" for a radiograph, which has neither."""
    from medrt.analysis.slices import along_normal
    from medrt.io.header import finite_float, pixel_measures_item

    ds = frame.source.dataset
    parts = []
    loc = finite_float(ds.get("SliceLocation"))
    loc = along_normal(frame) if loc is None else loc
    if loc is not None:
        parts.append(f"loc {loc:.1f} mm")
    measures = pixel_measures_item(ds, frame.frame_index)
    thick = (finite_float(measures.get("SliceThickness")) if measures is not None else None) or finite_float(
        ds.get("SliceThickness"))
    if thick:
        parts.append(f"thick {thick:.1f} mm")
    return " · ".join(parts)


class MainWindow(QMainWindow, StreamsMixin, ViewToolsMixin):
    """The viewer. ``provider`` loads the models (shared by every session); ``analysis=False``
    only browses. ``workers`` inference threads per session; a live series keeps the newest
    ``live_keep`` images. Opened files keep their decoded images within ``image_cache_mb``
    (None: no bound): past it, the images farthest from the one shown are let go and decoded
    again when shown (results and overlays stay), as OHIF's image cache does."""

    sessionFinished = Signal(int)
    rendered = Signal(str)  # the key of the frame just drawn

    def __init__(self, provider: AnalyzerProvider | None = None, *, analysis: bool = True, workers: int = 2,
                 live_keep: int = 500, image_cache_mb: float | None = IMAGE_CACHE_MB,
                 show_patient: bool = True) -> None:
        super().__init__()
        self.setWindowTitle("medrt viewer — research use only, not for clinical use")
        self.resize(1280, 800)
        self.provider = provider or AnalyzerProvider()
        self.analysis_enabled = analysis
        self.workers = workers
        self.live_keep = live_keep
        self.image_cache_mb = image_cache_mb
        self.bridge = Bridge(self)
        # Emitted on the pipeline's threads; queued, so each slot runs here, in the event loop.
        self.bridge.frameArrived.connect(self._on_frame, Q)
        self.bridge.resultReady.connect(self._on_result, Q)
        self.bridge.failed.connect(self._on_failure, Q)
        self.bridge.sessionEnded.connect(self._on_session_ended, Q)
        self.bridge.sessionStarted.connect(self._on_session_started, Q)
        self.bridge.decoded.connect(self._on_decoded, Q)
        self.decoder = Decoder(self.bridge)
        self.study = Study()
        self.series_i = self.slot_i = 0
        self.window_cw: tuple[float, float] | None = None  # (center, width) set by the user
        self.inverted = False
        self.show_patient = show_patient  # the patient and study in the HUD and the browser (p)
        self.session: Session | None = None
        # The last session whose end the GUI thread has handled: every result it sent
        # has been received by then (same sink thread, queued signals in order), while
        # Session.done turns true on the worker side before those signals are processed.
        self.session_finished: int | None = None
        self._sid = 0
        self.shown_key: str | None = None
        self._finding: tuple[int, int, int] | None = None  # (series, image, lesion) next_finding went to
        self.newest_result_key: str | None = None  # of the live session's newest AI result
        self.hover_text = ""
        self._hover_pixel: tuple[int, int] | None = None
        self.frames_received = self.results_received = 0
        self.failures: list[str] = []
        self._lut_key: tuple[object, ...] | None = None
        self._lut = None
        self._image_key: tuple[object, ...] | None = None
        self._gray_buffers: list[object] = [None, None]

        self.view = ImageView(self)
        self.setCentralWidget(self.view)
        self.hud = Hud(self.view.viewport())
        self.browser = SeriesBrowser()
        self.lesion_list = LesionList()
        self.series_lesions = SeriesLesionTable()
        self.lesion_tabs = QTabWidget()
        self.lesion_tabs.addTab(self.lesion_list, "This image")
        self.lesion_tabs.addTab(self.series_lesions, "Series")
        self.controls = Controls()
        self._dock("Series", self.browser, Qt.DockWidgetArea.LeftDockWidgetArea)
        self._dock("Lesions", self.lesion_tabs, Qt.DockWidgetArea.RightDockWidgetArea)
        self._dock("Display", self.controls, Qt.DockWidgetArea.RightDockWidgetArea)

        self.view.scrolled.connect(self.step)
        self.view.windowDragged.connect(self._drag_window)
        self.view.hovered.connect(self._hover)
        self.view.measured.connect(self._measured)
        self.measurements: dict[str, list[Length | Ellipse]] = {}  # by image key: drawn with the length/ellipse tools
        self.view.zoomChanged.connect(lambda _z: self._update_hud())
        self.browser.seriesSelected.connect(self.show_series)
        self.lesion_list.lesionActivated.connect(self.focus_lesion)
        self.series_lesions.lesionChosen.connect(self.go_to_lesion)
        c = self.controls
        c.overlay.toggled.connect(self._overlay_toggled)
        c.opacity.valueChanged.connect(lambda v: self.view.set_opacity(v / 100.0))
        c.crops.toggled.connect(self.view.set_crops_visible)
        c.seg.toggled.connect(self.view.set_seg_visible)
        c.cine_fps.valueChanged.connect(self._cine_rate)
        c.follow.toggled.connect(lambda on: on and self.last_image())
        c.follow_mode.currentIndexChanged.connect(lambda _i: c.follow.isChecked() and self.last_image())

        self.monitor = EventLoopMonitor(parent=self)
        self.monitor.start()
        self._render_timer = QTimer(self, singleShot=True, interval=0)
        self._render_timer.timeout.connect(self._render)
        self._hud_timer = QTimer(self, interval=250)
        self._hud_timer.timeout.connect(self._tick)
        self._hud_timer.start()
        self.cine = QTimer(self)
        self.cine.timeout.connect(lambda: self.step(1, wrap=True))
        self._cine_rate(c.cine_fps.value())
        self.actions_by_name: dict[str, QAction] = {}
        self._build_menus()
        self.statusBar().showMessage("Open a file or folder, watch a folder, or replay one as a stream.")
        self.help_box: QMessageBox | None = None

    def _dock(self, title: str, widget: object, area: Qt.DockWidgetArea) -> None:
        dock = QDockWidget(title, self)
        dock.setObjectName(title)
        dock.setWidget(widget)  # type: ignore[arg-type]
        dock.setFeatures(QDockWidget.DockWidgetFeature.DockWidgetMovable | QDockWidget.DockWidgetFeature.DockWidgetFloatable)
        self.addDockWidget(area, dock)

    # -- menus and hotkeys ---------------------------------------------------------

    def _action(self, menu: object, text: str, slot: object, keys: tuple[str, ...] = ()) -> QAction:
        action = QAction(text, self)
        if keys:
            action.setShortcuts([QKeySequence(k) for k in keys])
            action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        action.triggered.connect(lambda _checked=False: slot())  # type: ignore[operator]
        menu.addAction(action)  # type: ignore[attr-defined]
        self.addAction(action)
        return action

    def _build_menus(self) -> None:
        bar = self.menuBar()
        f = bar.addMenu("&File")
        self._action(f, "Open File…", self.open_file_dialog, ("Ctrl+O",))
        self._action(f, "Open Folder…", self.open_folder_dialog, ("Ctrl+Shift+O",))
        self._action(f, "Watch Folder (live)…", self.watch_dialog, ("Ctrl+W",))
        self._action(f, "Replay Folder as Stream…", self.replay_dialog, ("Ctrl+R",))
        self._action(f, "Stop Stream", self.stop_stream, ("Ctrl+.",))
        f.addSeparator()
        self._action(f, "Open DICOM SEG…", self.seg_dialog, ("Ctrl+G",))
        self._action(f, "Export View as PNG…", self.export_dialog, ("Ctrl+E",))
        f.addSeparator()
        self._action(f, "Quit", self.close, ("Ctrl+Q",))
        v = bar.addMenu("&View")
        for h in HOTKEYS:
            self.actions_by_name[h.action] = self._action(v, h.text, getattr(self, h.action), h.keys)
        h = bar.addMenu("&Help")
        self._action(h, "Hotkeys and Mouse", self.show_help, ("F1",))
        self._action(h, "About", self.show_about)

    def show_help(self) -> None:
        self.help_box = QMessageBox(QMessageBox.Icon.NoIcon, "medrt viewer: hotkeys", "", parent=self)
        self.help_box.setTextFormat(Qt.TextFormat.RichText)
        self.help_box.setText(help_html())
        self.help_box.open()

    def show_about(self) -> None:
        QMessageBox.about(self, "About medrt viewer",
                          "medrt viewer: live AI overlays on DICOM streams.\n"
                          "Research and demonstration software. Not for clinical use.")

    # -- dialogs ----------------------------------------------------------------------------

    def open_file_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open DICOM file")
        if path:
            self.open_path(path)

    def open_folder_dialog(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Open folder")
        if path:
            self.open_path(path)

    def watch_dialog(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Watch folder for new images")
        if path:
            self.start_watch(path)

    def replay_dialog(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Replay folder as a stream")
        if path:
            self.start_replay(path, fps=self.controls.replay_fps.value())

    def seg_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open DICOM SEG", filter="DICOM (*.dcm);;All files (*)")
        if path:
            self.open_seg(path)

    def export_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export view as PNG", "view.png", "PNG (*.png)")
        if path:
            self.export_png(path)

    def export_png(self, path: str | os.PathLike[str]) -> Path:
        """Save what the image area shows (image, overlays, HUD) as a PNG."""
        path = Path(path)
        if not self.view.viewport().grab().save(str(path), "PNG"):
            self.status(f"could not write {path}")
            raise OSError(f"{path}: could not write the PNG")
        self.status(f"exported the view to {path}")
        return path

    def status(self, text: str, ms: int = 10_000) -> None:
        self.statusBar().showMessage(text, ms)

    # -- navigation --------------------------------------------------------------------

    @property
    def current_series(self) -> SeriesEntry | None:
        s = self.study.series
        return s[self.series_i] if 0 <= self.series_i < len(s) else None

    def current_slot(self) -> Slot | None:
        entry = self.current_series
        if entry is None or not entry.slots:
            return None
        self.slot_i = max(0, min(self.slot_i, len(entry.slots) - 1))
        return entry.slots[self.slot_i]

    def show_image(self, index: int) -> None:
        entry = self.current_series
        if entry is None or not entry.slots:
            return
        self.slot_i = max(0, min(index, len(entry.slots) - 1))
        if self.session is not None and self.session.live and self.follow_target() != (self.series_i, self.slot_i):
            self.controls.follow.setChecked(False)  # looking elsewhere: stop following the stream
        self.request_render()

    def step(self, delta: int, wrap: bool = False) -> None:
        entry = self.current_series
        if entry is None or not entry.slots:
            return
        n = len(entry.slots)
        self.show_image((self.slot_i + delta) % n if wrap else self.slot_i + delta)

    def next_image(self) -> None:
        self.step(1)

    def previous_image(self) -> None:
        self.step(-1)

    def first_image(self) -> None:
        self.show_image(0)

    @property
    def follow_mode(self) -> str:
        """What following a live stream shows: ``results`` (the newest analysed image) or
        ``images`` (the newest image received)."""
        return str(self.controls.follow_mode.currentData())

    @follow_mode.setter
    def follow_mode(self, mode: str) -> None:
        index = self.controls.follow_mode.findData(mode)
        if index < 0:
            raise ValueError(f"follow mode is one of {[m for _, m in FOLLOW_MODES]}, not {mode!r}")
        self.controls.follow_mode.setCurrentIndex(index)

    def following_results(self) -> bool:
        """Whether a live stream is followed at its newest AI result (see :attr:`follow_mode`)."""
        return (self.session is not None and self.session.live and self.controls.follow.isChecked()
                and self.follow_mode == "results")

    def _place(self, key: str | None) -> tuple[int, int] | None:
        """(series, image) of the image ``key`` names while the study still holds it: the
        live session's newest AI result, or the image received last (a looping replay's
        is not the last slot)."""
        found = self.study.find(key) if key else None
        return None if found is None else found[:2]

    def follow_to(self, series: int, image: int) -> None:
        """Show ``image`` of ``series`` as following a stream does: a series new on
        screen starts at its header window."""
        if series != self.series_i:
            self.window_cw = None
        self.series_i, self.slot_i = series, image
        self.request_render()

    def follow_target(self) -> tuple[int, int] | None:
        """(series, image) that following a live stream shows: its newest AI result when
        following results (and one has come), else its newest image; None when not live.
        A live series is in slice order (:meth:`Study.add_live_frame`), so that is not
        always its last image."""
        if self.session is None or not self.session.live:
            return None
        return (self._place(self.newest_result_key) if self.follow_mode == "results" else None) \
            or self._place(self.study.newest_key)

    def keep_showing(self, slot: Slot | None) -> None:
        """Keep ``slot`` on screen after its series changed around it (a live image placed
        before it, the oldest trimmed); a slot gone is replaced by what is now at its place."""
        entry = self.current_series
        if slot is None or entry is None:
            return
        found = self.study.find(slot.key)
        if found is not None and found[0] == self.series_i:
            self.slot_i = found[1]
        elif self.current_slot() is not slot:
            self.request_render()

    def last_image(self) -> None:
        """The last image; in a live stream, follow it again (:meth:`follow_target`)."""
        entry = self.current_series
        if entry is None:
            return
        live = self.session is not None and self.session.live
        target = self.follow_target()
        if target is not None:
            self.follow_to(*target)
        else:
            self.show_image(len(entry.slots) - 1)
        if live:
            self.controls.follow.setChecked(True)

    def show_series(self, index: int) -> None:
        if not 0 <= index < len(self.study.series) or index == self.series_i and self.shown_key:
            return
        self.series_i, self.slot_i = index, 0
        self.window_cw = None  # each series starts at its header window
        self.request_render()

    def next_series(self) -> None:
        self.show_series(min(self.series_i + 1, len(self.study.series) - 1))

    def previous_series(self) -> None:
        self.show_series(max(self.series_i - 1, 0))

    # -- drawing ----------------------------------------------------------------------------

    def request_render(self) -> None:
        if not self._render_timer.isActive():
            self._render_timer.start()

    def render_now(self) -> None:
        """Draw the current state at once (a pending change too, the live corner and the
        browser's counts) instead of at the next idle moment and tick."""
        self._render_timer.stop()
        self._render()
        self._tick()

    @property
    def render_pending(self) -> bool:
        """True between a change and the render that shows it (the next idle moment)."""
        return self._render_timer.isActive()

    def _render(self) -> None:
        slot = self.current_slot()
        if slot is not None:
            slot.unpack_labels()  # a far radiograph's label map, packed by release_images
            self._want_decoded(slot)
        if slot is None or slot.frame is None:
            self.view.blank()
            self.lesion_list.show_lesions(())
            entry = self.current_series
            self.series_lesions.show_series_lesions(entry.series_lesions()[0] if entry is not None else ())
            self._image_key = None
            self.shown_key = None
            self._update_hud()
            return
        if slot.index is None or slot.index.index.shape != slot.frame.shape:
            slot.set_index(DisplayIndex.from_frame(slot.frame))
        center, width = self.current_window() or (0.0, 1.0)
        # Keys hold the index object itself (compared by identity), never a reusable id().
        lut_key = (slot.index, center, width, self.inverted)
        if lut_key != self._lut_key:
            self._lut, self._lut_key = window_lut(slot.index, center, width, self.inverted), lut_key
        image_key = lut_key
        if image_key != self._image_key:
            # Two buffers in turn: the one the view shows now is never written while shown.
            self._gray_buffers.reverse()
            gray = apply_lut(slot.index, self._lut, out=self._gray_buffers[0])
            self._gray_buffers[0] = gray
            self.view.set_image(gray)
            self._image_key = image_key
        if slot.overlay is None and slot.result is not None and slot.result.lesions:
            slot.overlay = Layer.from_rgba(overlay_rgba(slot.result))  # let go with the image
        self.view.set_overlay(slot.overlay)
        if slot.seg_labels is not None and slot.seg_overlay is None:
            try:
                colors = slot.seg.colors if slot.seg is not None else None
                slot.seg_overlay = Layer.from_rgba(seg_overlay(slot.frame, slot.seg_labels, colors))
            except ValueError as exc:
                self.status(f"SEG not shown: {exc}")
        self.view.set_seg(slot.seg_overlay if slot.seg_labels is not None else None)
        result = slot.result
        self.view.set_crops(result.crops if result is not None else ())
        lesions = result.lesions if result is not None else ()
        rows = self._lesion_rows(result)
        self.view.set_lesions(lesions, [row.number for row in rows])
        self.view.set_measurements([(shape, self._measure_text(shape, slot))
                                    for shape in self.measurements.get(slot.key, ())])
        units = size_units(slot.frame.spacing_mm, slot.frame.spacing_source)
        self.lesion_list.show_lesions(lesions, rows, units)
        entry = self.current_series
        self.series_lesions.show_series_lesions(entry.series_lesions()[0] if entry is not None else (), units[0])
        self.shown_key = slot.key
        self._update_hud()
        self.rendered.emit(slot.key)

    def _lesion_rows(self, result: FrameResult | None) -> list[LesionRow]:
        """Each lesion of ``result`` as a lesion of its series: its number (the same on every
        slice it shows on), which of its slices this is, and its volume."""
        entry = self.current_series
        if result is None or not result.lesions or entry is None:
            return []
        lesions, numbers = entry.series_lesions()
        rows = []
        for les in result.lesions:
            whole = lesions[numbers[(result.frame.key, les.label)] - 1]
            at = next(i for i, s in enumerate(whole.sections, start=1) if s.key == result.frame.key)
            rows.append(LesionRow(whole.number, at, whole.slices, whole.volume_mm3))
        return rows

    def _want_decoded(self, slot: Slot) -> None:
        """Ask the decoder for this image and its neighbours (files not decoded yet)."""
        entry = self.current_series
        if entry is None or self.study.live:
            return
        near = [entry.slots[i] for i in decode_window(self.slot_i) if i < len(entry.slots)]
        self.decoder.want([s.path for s in sorted(near, key=lambda s: s is not slot) if s.frame is None and s.error is None])

    def _update_hud(self) -> None:
        entry, slot = self.current_series, self.current_slot()
        if entry is None or slot is None:
            for corner in self.hud.CORNERS:
                self.hud.set_text(corner, "")
            return
        desc = entry.description
        desc = desc if len(desc) <= 44 else desc[:43] + "…"
        top = f"{desc}\nimage {self.slot_i + 1}/{len(entry.slots)}"
        if self.show_patient and entry.patient is not None:
            top = f"{entry.patient.hud_text()}\n{top}"
        # images received after this one (a looping replay sends its slots again, in place)
        behind = self.study.arrivals - slot.arrival if slot.arrival else 0
        if behind > 0 and self.following_results():
            top += f" · AI result, {behind} behind the newest"
        place = slice_place(slot.header) if slot.header is not None else ""
        if place:  # a line of its own, clear of the live figures in the top right corner
            top += f"\n{place}"
        if slot.error:
            top += f"\ncannot show: {slot.error}"
        elif slot.frame is None:
            top += "\nloading…"
        self.hud.set_text("top_left", top)
        cw = self.current_window()
        wl = f"W {cw[1]:.0f} L {cw[0]:.0f}" if cw else "W – L –"
        lines = [wl + (" · inverted" if self.inverted else ""), f"zoom {self.view.zoom * 100:.0f}%"]
        self.hover_text = self._hover_value(slot)
        if self.hover_text:
            lines.append(self.hover_text)
        self.hud.set_text("bottom_left", "\n".join(lines))
        self.hud.set_text("bottom_right", self._overlay_text(slot))

    def _overlay_text(self, slot: Slot) -> str:
        parts = []
        if slot.result is not None:
            n = len(slot.result.lesions)
            parts.append(f"{n} lesion{'s' if n != 1 else ''}")
            if slot.latency_ms is not None:
                parts.append(f"AI {slot.latency_ms:.0f} ms")
        elif self.session is not None and not self.session.done:
            parts.append("analysing…")
        elif self.analysis_enabled:
            parts.append("no AI result")
        if slot.seg_labels is not None:
            parts.append(_seg_text(slot))
        state = "on" if self.controls.overlay.isChecked() else "off (g)"
        parts.append(f"overlay {state}")
        return " · ".join(parts)

    def _tick(self) -> None:
        """4 Hz: the live HUD corner and the browser's counts."""
        session = self.session
        if session is not None and session.live:
            self.hud.set_text("top_right", format_live(session.stats(), self.monitor.lag_ms))
        elif session is not None:
            done = "" if session.done else f"/{self.study.frames}"
            self.hud.set_text("top_right", f"AI {self.results_received}{done} analysed\n"
                                           f"{session.backend or 'loading models…'}")
        self.browser.show_study(self.study, self.series_i, show_patient=self.show_patient)
        self.release_images()

    def release_images(self) -> int:
        """Bring the decoded images of opened files within ``image_cache_mb``
        (:meth:`Study.release_images`, around the image shown). A live study has its own
        bound (``live_keep``). Returns how many images went."""
        if self.image_cache_mb is None or self.study.live:
            return 0
        return self.study.release_images(self.image_cache_mb * 2**20, self.series_i, self.slot_i)

    def closeEvent(self, event: object) -> None:  # noqa: N802 (Qt's name)
        self.stop_sessions(wait=2.0)
        self._render_timer.stop()
        self.decoder.shutdown()
        self.monitor.stop()
        self.cine.stop()
        super().closeEvent(event)  # type: ignore[arg-type]
