"""The heads-up display over the image, and the event-loop latency monitor.

Corner texts as in cornerstone/OHIF: top left what is shown (series, image
n/N), bottom left window/level, zoom and the value under the cursor, top right
the live stream (fps, this frame's latency, p99, drops, backend, UI lag), bottom
right the overlay (lesions found, SEG). The texts are formatted by plain
functions, so tests can read exactly what the HUD says.
"""

from __future__ import annotations

import math
import time
from collections import deque

from medrt_gui.bridge import LiveStats
from PySide6.QtCore import QEvent, QObject, Qt, QTimer
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QLabel, QWidget

__all__ = ["EventLoopMonitor", "Hud", "format_live", "format_ms"]


def format_ms(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.0f} ms"


def format_live(stats: LiveStats, lag_ms: float | None = None) -> str:
    """The live corner: ``LIVE replay · fps 29.8 · latency 41 ms · p99 80 ms · drops 3 · onnxruntime fp32``."""
    state = "LIVE" if stats.running else "ENDED"
    fps = "–" if math.isnan(stats.fps) else f"{stats.fps:.1f}"
    lines = [
        f"{state} {stats.kind}" + (f" · {stats.label}" if stats.label else ""),
        f"fps {fps} · latency {format_ms(stats.latency_ms)} · p99 {format_ms(stats.p99_ms)}",
        f"drops {stats.drops} · frames {stats.frames} · {stats.backend or 'loading models…'}",
    ]
    if lag_ms is not None:
        lines.append(f"UI lag max {lag_ms:.0f} ms")
    return "\n".join(lines)


class EventLoopMonitor(QObject):
    """Measures how late a ``interval_ms`` timer fires: the event loop's responsiveness.

    ``max_gap_ms`` is the longest time between two ticks since :meth:`reset`;
    ``lag_ms`` the worst lateness over the last ``window_s`` seconds.
    """

    def __init__(self, interval_ms: int = 10, window_s: float = 5.0, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.interval_ms = interval_ms
        self.window_s = window_s
        self._timer = QTimer(self)
        self._timer.setTimerType(Qt.TimerType.PreciseTimer)
        self._timer.setInterval(interval_ms)
        self._timer.timeout.connect(self._tick)
        self._last: float | None = None
        self._recent: deque[tuple[float, float]] = deque()
        self.max_gap_ms = 0.0
        self.ticks = 0

    def start(self) -> None:
        self.reset()
        self._timer.start()

    def stop(self) -> None:
        self._timer.stop()

    def reset(self) -> None:
        self._last = None
        self._recent.clear()
        self.max_gap_ms = 0.0
        self.ticks = 0

    def _tick(self) -> None:
        now = time.perf_counter()
        if self._last is not None:
            gap = (now - self._last) * 1000.0
            self.max_gap_ms = max(self.max_gap_ms, gap)
            self._recent.append((now, gap))
            while self._recent and self._recent[0][0] < now - self.window_s:
                self._recent.popleft()
        self._last = now
        self.ticks += 1

    @property
    def lag_ms(self) -> float:
        """The worst lateness (gap beyond the interval) over the last ``window_s`` seconds."""
        if not self._recent:
            return 0.0
        return max(0.0, max(g for _, g in self._recent) - self.interval_ms)


class Hud(QObject):
    """Four corner labels laid over ``view``'s viewport, kept in the corners on resize."""

    CORNERS = ("top_left", "top_right", "bottom_left", "bottom_right")

    def __init__(self, viewport: QWidget) -> None:
        super().__init__(viewport)
        self.viewport = viewport
        self.hidden = False  # every corner hidden by the user (h)
        font = QFont("monospace")
        font.setStyleHint(QFont.StyleHint.Monospace)
        font.setPointSize(9)
        self.labels: dict[str, QLabel] = {}
        for corner in self.CORNERS:
            label = QLabel(viewport)
            label.setFont(font)
            label.setStyleSheet("color: #e8e8e8; background: rgba(0, 0, 0, 110); padding: 3px;")
            label.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents)
            align = Qt.AlignmentFlag.AlignRight if "right" in corner else Qt.AlignmentFlag.AlignLeft
            label.setAlignment(align | Qt.AlignmentFlag.AlignTop)
            label.hide()
            self.labels[corner] = label
        viewport.installEventFilter(self)

    def set_text(self, corner: str, text: str) -> None:
        label = self.labels[corner]
        if label.text() != text:
            label.setText(text)
            label.adjustSize()
        label.setVisible(bool(text) and not self.hidden)
        self._place(corner.split("_")[0])

    def text(self, corner: str) -> str:
        return self.labels[corner].text()

    def set_hidden(self, hidden: bool) -> None:
        """Hide every corner (the image whole, a lesion under a corner in view), or show them again."""
        self.hidden = hidden
        for label in self.labels.values():
            label.setVisible(bool(label.text()) and not hidden)

    def _place(self, row: str) -> None:
        """The ``row``'s ("top" or "bottom") two corners; when the window is too narrow for
        both side by side, the right one goes below (top) or above (bottom) the left one
        instead of over it."""
        left, right = self.labels[f"{row}_left"], self.labels[f"{row}_right"]
        vp, m = self.viewport, 6
        both = bool(left.text()) and bool(right.text())
        stacked = both and left.width() + right.width() + 3 * m > vp.width()
        if row == "top":
            left_y, right_y = m, (2 * m + left.height() if stacked else m)
        else:
            left_y = vp.height() - left.height() - m
            right_y = left_y - right.height() - m if stacked else vp.height() - right.height() - m
        left.move(m, max(0, left_y))
        right.move(max(0, vp.width() - right.width() - m), max(0, right_y))

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:  # noqa: N802 (Qt's name)
        if obj is self.viewport and event.type() == QEvent.Type.Resize:
            for row in ("top", "bottom"):
                self._place(row)
        return False
