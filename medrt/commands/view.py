"""``medrt view [PATH]``: the desktop viewer (PySide6, the ``gui`` extra).

The viewer lives in the ``medrt_gui`` package; it is imported only when the
command runs, so ``medrt`` itself never loads Qt and the rest of the command
line works without PySide6.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from medrt.commands.options import (
    DEFAULT_LOOKAHEAD_S,
    LOOKAHEAD_MISUSE,
    add_engine_options,
    lookahead_misused,
)

__all__ = ["add_view_arguments", "register", "run"]

INSTALL_HINT = "pip install 'medrt[gui]'"


def add_view_arguments(p: argparse.ArgumentParser) -> None:
    """The viewer's options (shared by ``medrt view`` and the ``medrt-viewer`` GUI script)."""
    p.add_argument("path", nargs="?", type=Path, help="DICOM file, folder or DICOMDIR to open (or to replay or watch)")
    live = p.add_mutually_exclusive_group()
    live.add_argument("--replay", type=float, metavar="FPS",
                      help="replay PATH as a live stream at FPS frames per second (latest-wins)")
    live.add_argument("--watch", action="store_true",
                      help="watch the folder PATH: images appear as they land (a PACS spool)")
    p.add_argument("--loop", type=int, default=1, help="with --replay: replay the folder this many times")
    p.add_argument("--lookahead", type=float, default=None, metavar="SECONDS",
                   help="with --watch: hold each image until the next one lands (at most SECONDS), so a 2.5-D "
                        "model gets the slice after it too (on a thin-slice series the next few, up to the distance "
                        "the model learnt); each image shows that many frames later (default: "
                        f"{DEFAULT_LOOKAHEAD_S:g} s when the model is 2.5-D, else none; 0: off)")
    p.add_argument("--follow", choices=("results", "images"), default="results",
                   help="with --replay/--watch: follow the stream at its newest AI result, drawn with its overlay "
                        "(default; behind the newest image by the AI's latency), or at its newest image as it "
                        "lands (overlay once ready)")
    p.add_argument("--seg", type=Path, action="append", default=[], metavar="SEG",
                   help="a DICOM SEG to lay over its source images (repeatable; SEGs inside PATH load by themselves)")
    p.add_argument("--image", type=int, default=None, metavar="N", help="start at image N (1-based) of the first series")
    p.add_argument("--preset", choices=("1", "2", "3", "4"),
                   help="start with a window preset: 1 soft tissue, 2 lung, 3 bone, 4 brain")
    p.add_argument("--no-analysis", action="store_true", help="browse only: run no AI on opened files")
    p.add_argument("--hide-patient", action="store_true",
                   help="start with the patient and study details hidden (a shared screen, a screenshot; p toggles)")
    p.add_argument("--image-cache", type=float, default=1024.0, metavar="MB",
                   help="decoded images of opened files kept in memory (default 1024: 2,000 CT slices or 32 "
                        "4096² radiographs); past it the farthest from the image shown are let go and decoded "
                        "again when shown")
    p.add_argument("--workers", type=int, default=None, help="inference workers (default: one per core on CPU)")
    p.add_argument("--size", default="1280x800", metavar="WxH", help="window size (default 1280x800)")
    p.add_argument("--screenshot", type=Path, default=None, metavar="PNG",
                   help="save a PNG of the window once the opened files are analysed (a live stream: the "
                        "shown image), then quit (CI, docs)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="with --screenshot: the longest to wait for the analysis, in seconds (default 120)")
    add_engine_options(p)


def run(args: argparse.Namespace) -> int:
    """Start the viewer; exit code 2 with an install hint when PySide6 (or the viewer) is missing."""
    if lookahead_misused(args):
        print(f"medrt view: {LOOKAHEAD_MISUSE}", file=sys.stderr)
        return 2
    try:
        import PySide6.QtWidgets  # noqa: F401  (checked here so the hint beats a traceback)
    except ImportError as exc:
        if (exc.name or "").split(".")[0] == "PySide6" and "QtWidgets" not in str(exc.name):
            print(f"medrt view: the viewer needs PySide6, which is not installed: {INSTALL_HINT}", file=sys.stderr)
        else:
            print(f"medrt view: PySide6 is installed but cannot load ({exc}); a system library Qt needs "
                  f"may be missing (libEGL, libxkbcommon, libfontconfig), or reinstall: {INSTALL_HINT}",
                  file=sys.stderr)
        return 2
    try:
        from medrt_gui.app import run_viewer
    except ImportError as exc:
        print(f"medrt view: the viewer package medrt_gui cannot be imported ({exc}): {INSTALL_HINT}",
              file=sys.stderr)
        return 2
    return run_viewer(args)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "view",
        help="the desktop viewer: browse series, live AI overlays on a replayed or watched stream",
        description="Open DICOM files or folders (series in slice order, window/level presets, zoom, cine, AI "
        "overlays and a lesion list), replay a folder as a live stream (--replay FPS) or watch a folder "
        f"(--watch). Needs the gui extra: {INSTALL_HINT}. Press F1 in the viewer for the hotkeys.",
    )
    add_view_arguments(p)
    p.set_defaults(func=run)
