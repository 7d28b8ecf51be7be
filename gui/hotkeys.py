"""The viewer's hotkeys and mouse bindings, as data: the window binds its actions from
this table and Help lists it, so the two cannot disagree.

Keys follow OHIF (↑/↓ image, Home/End, PgUp/PgDn series, +/- zoom, = fit,
i invert, c cine, space reset, 1–4 presets) and Slicer (g toggles the segmentation).
"""

from __future__ import annotations

from dataclasses import dataclass

from medrt_gui.imaging import PRESETS

__all__ = ["Hotkey", "HOTKEYS", "MOUSE", "help_text", "help_html"]


@dataclass(frozen=True, slots=True)
class Hotkey:
    """``action`` names a method of the main window; ``keys`` are Qt key sequences
    (the first is the one shown in menus and Help)."""

    action: str
    keys: tuple[str, ...]
    text: str
    label: str = ""

    @property
    def shown(self) -> str:
        return self.label or self.keys[0]


HOTKEYS: tuple[Hotkey, ...] = (
    Hotkey("next_image", ("Down",), "Next image", "↓"),
    Hotkey("previous_image", ("Up",), "Previous image", "↑"),
    Hotkey("first_image", ("Home",), "First image"),
    Hotkey("last_image", ("End",), "Last image (and follow a live stream)"),
    Hotkey("previous_series", ("PgUp",), "Previous series"),
    Hotkey("next_series", ("PgDown",), "Next series", "PgDn"),
    Hotkey("zoom_in", ("+", "Shift++", "Ctrl++"), "Zoom in", "+"),
    Hotkey("zoom_out", ("-", "Ctrl+-"), "Zoom out", "-"),
    Hotkey("fit", ("=",), "Fit the image to the window"),
    Hotkey("invert", ("I",), "Invert the grey scale", "i"),
    Hotkey("toggle_cine", ("C",), "Cine: play / stop the series", "c"),
    Hotkey("reset", ("Space",), "Reset: header window, no invert, fit"),
    *(Hotkey(f"preset_{p.key}", (p.key,), f"{p.name} window (W {p.width:g} / L {p.level:g})")
      for p in PRESETS),
    Hotkey("toggle_segmentation", ("G",), "Show / hide the AI and SEG overlays", "g"),
    Hotkey("next_finding", ("N",), "Next finding: the next lesion of the study, where it is largest, zoomed on",
           "n"),
    Hotkey("previous_finding", ("Shift+N",), "Previous finding", "Shift+n"),
    Hotkey("toggle_length", ("M",), "Length tool on / off (left drag measures in mm)", "m"),
    Hotkey("toggle_ellipse", ("E",), "Ellipse ROI tool on / off (left drag: mean, SD and area)", "e"),
    Hotkey("toggle_patient", ("P",), "Show / hide the patient and study details (a shared screen, a screenshot)",
           "p"),
    Hotkey("toggle_hud", ("H",), "Show / hide the corner texts over the image (a finding under one)", "h"),
    Hotkey("clear_measurements", ("Delete", "Backspace"), "Delete the lengths and ROIs measured on this image",
           "Del"),
)

MOUSE: tuple[tuple[str, str], ...] = (
    ("Wheel", "Previous / next image"),
    ("Ctrl + wheel", "Zoom"),
    ("Left drag", "Window/level (right: wider, down: higher level)"),
    ("Middle drag (or Shift + left drag)", "Pan"),
    ("Right drag", "Zoom"),
    ("Left drag with the length tool (m)", "Measure a length (mm; \"at detector\" on radiographs)"),
    ("Left drag with the ellipse tool (e)", "An ROI: mean and SD (HU on CT) and area"),
    ("Click a lesion in the list", "Centre and zoom on it"),
)


def help_text() -> str:
    """The hotkeys and mouse bindings as plain text."""
    lines = ["Keys"]
    lines += [f"  {h.shown:<8} {h.text}" for h in HOTKEYS]
    lines += ["", "Mouse"]
    lines += [f"  {what}: {does}" for what, does in MOUSE]
    return "\n".join(lines)


def help_html() -> str:
    """The same as :func:`help_text`, as two HTML tables for the Help dialog."""
    def rows(pairs: list[tuple[str, str]]) -> str:
        return "".join(f"<tr><td><b>{k}</b></td><td>&nbsp;&nbsp;{v}</td></tr>" for k, v in pairs)

    keys = rows([(h.shown, h.text) for h in HOTKEYS])
    mouse = rows(list(MOUSE))
    return f"<h3>Keys</h3><table>{keys}</table><h3>Mouse</h3><table>{mouse}</table>"
