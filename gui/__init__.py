"""medrt's desktop viewer (PySide6), installed as ``medrt_gui``.

It depends on ``medrt`` and never the reverse: ``import medrt`` loads no Qt.
Importing this package loads no Qt either; ``medrt_gui.app`` does. Start it
with ``medrt view [PATH]`` or the ``medrt-viewer`` GUI script.

Modules: ``imaging`` (window/level LUTs, presets; no Qt), ``study`` (series,
slots, problems; no Qt), ``seg`` (DICOM SEG reading; no Qt), ``measure`` (lengths
and ROI statistics; no Qt), ``hotkeys`` (the key table Help lists), ``bridge`` (pipeline sessions, the Qt sink, the
decoder), ``canvas`` (the image view), ``hud``, ``panels``, ``streams`` and
``window`` (the main window), ``app`` (QApplication, screenshots).
"""

from __future__ import annotations

__all__ = ["main"]


def main() -> int:
    """The ``medrt-viewer`` entry point: the same options as ``medrt view``."""
    from medrt_gui.__main__ import main as _main

    return _main()
