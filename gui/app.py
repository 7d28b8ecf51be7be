"""Start the viewer: the QApplication, the main window, what the command line asked for,
and (``--screenshot``) a picture of the real window once the shown image is analysed
(an opened folder: once all of it is)."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from medrt_gui.bridge import AnalyzerProvider
from medrt_gui.window import IMAGE_CACHE_MB, MainWindow
from PySide6.QtCore import QTimer
from PySide6.QtGui import QGuiApplication, QPixmap
from PySide6.QtWidgets import QApplication

__all__ = ["run_viewer", "build_window", "Screenshot"]

log = logging.getLogger(__name__)


def _size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"medrt view: --size must be WIDTHxHEIGHT, got {text!r}") from None
    return max(320, w), max(240, h)


def build_window(args: argparse.Namespace) -> MainWindow:
    """The main window set up as ``args`` (``medrt view``'s options) say, shown."""
    from medrt.commands.options import analyzer_config, thread_layout

    analysis = not args.no_analysis
    _, workers = thread_layout(args)
    provider = AnalyzerProvider(analyzer_config(args))
    window = MainWindow(provider, analysis=analysis, workers=workers,
                        image_cache_mb=getattr(args, "image_cache", IMAGE_CACHE_MB),
                        show_patient=not getattr(args, "hide_patient", False))
    window.resize(*_size(args.size))
    window.follow_mode = getattr(args, "follow", "results")
    window.show()
    if analysis and args.path is not None:
        provider.preload()
    if args.path is not None:
        if args.replay is not None:
            window.start_replay(args.path, fps=args.replay, loop=args.loop)
        elif args.watch:
            window.start_watch(args.path, lookahead=args.lookahead)
        else:
            window.open_path(args.path)
    for seg in args.seg:
        window.open_seg(seg)
    if args.image is not None:
        count = len(window.study.series[0].slots) if window.study.series else 0
        if count and not 1 <= args.image <= count:  # shown clamped, as the wheel would; said so
            print(f"medrt view: --image {args.image}: the first series has {count} image(s); showing "
                  f"{min(max(args.image, 1), count)}", file=sys.stderr)
        window.show_image(args.image - 1)
    if args.preset is not None:
        window.apply_preset(args.preset)
    return window


class Screenshot:
    """Waits until the shown image is drawn and analysed (an opened folder: all of it; a live
    stream: the shown image, or the stream ended), then saves a PNG
    of the window and quits. On X11 (``xcb``) the picture is taken from the X server, i.e. the
    real window on screen; elsewhere it is the widget's own rendering."""

    def __init__(self, window: MainWindow, path: Path, timeout_s: float) -> None:
        self.window, self.path, self.deadline = window, Path(path), time.monotonic() + timeout_s
        self.ready_since: float | None = None
        self.ok = False
        self.timer = QTimer(window, interval=100)
        self.timer.timeout.connect(self._poll)
        self.timer.start()

    def _ready(self) -> bool:
        w = self.window
        slot = w.current_slot()
        if slot is None:
            return w.session is None  # nothing opened: the empty window is the picture
        # the shown image is drawn, or it cannot be (its file is unreadable: the HUD says
        # so, which is the picture; before, --screenshot waited out its --timeout and failed)
        unreadable = slot.error is not None and not w.render_pending
        if w.shown_key != slot.key and not unreadable:
            return False
        if not w.analysis_enabled or w.session is None:
            return True
        if w.session_finished == w.session.sid:
            return True
        # An opened folder is pictured once all of it is analysed (the HUD's count and the
        # status line are then final); a live stream never ends, so once the shown image is.
        return w.session.live and slot.result is not None

    def _poll(self) -> None:
        now = time.monotonic()
        if self._ready():
            self.ready_since = self.ready_since or now
        if (self.ready_since is not None and now - self.ready_since >= 0.5) or now > self.deadline:
            self.timer.stop()
            self.ok = self.ready_since is not None
            if not self.ok:
                log.error("screenshot: nothing ready to show after the timeout; saving the window as it is")
            self.save()
            QApplication.instance().quit()

    def save(self) -> None:
        w = self.window
        # The picture is the last thing before quitting: a live stream's later arrivals and
        # results no longer move the view, so image, HUD and lesion list show the same image
        # (otherwise the X server held whichever widgets had repainted since the last one).
        w.bridge.blockSignals(True)
        w.raise_()
        _settle(0.1)  # what the stream had sent before is taken in
        w.render_now()
        _settle(0.25)  # the lesion list lays out its rows, and the widgets paint, on timers
        pixmap: QPixmap | None = None
        if QGuiApplication.platformName() == "xcb":
            screen = w.screen() or QGuiApplication.primaryScreen()
            pixmap = screen.grabWindow(w.winId())
        if pixmap is None or pixmap.isNull():
            pixmap = w.grab()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not pixmap.save(str(self.path), "PNG"):
            self.ok = False
            print(f"medrt view: could not write {self.path}", file=sys.stderr)
            return
        slot = w.current_slot()
        found = "-" if slot is None or slot.result is None else len(slot.result.lesions)
        entry = w.current_series
        print(f"screenshot: {self.path} ({pixmap.width()}x{pixmap.height()}, platform "
              f"{QGuiApplication.platformName()}, image {w.shown_key or '-'}, "
              f"{w.results_received} frame(s) analysed; shown: {len(w.lesion_list.lesions)} lesion(s) listed, "
              f"{found} in its result, series of {len(entry.slots) if entry else 0} image(s))")


def _settle(seconds: float) -> None:
    """Process events for ``seconds`` (posted events, timers, paints)."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        QApplication.processEvents()
        time.sleep(0.01)


def run_viewer(args: argparse.Namespace) -> int:
    """Run the viewer until its window closes; exit code 0 (1: a screenshot that was not ready)."""
    app = QApplication.instance() or QApplication([sys.argv[0] if sys.argv else "medrt-viewer"])
    app.setApplicationName("medrt viewer")
    window = build_window(args)
    shot = Screenshot(window, args.screenshot, args.timeout) if args.screenshot is not None else None
    rc = app.exec()
    window.close()
    if shot is not None and not shot.ok:
        return 1
    return int(rc)
