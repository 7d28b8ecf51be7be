"""The desktop viewer (medrt_gui), offscreen with pytest-qt: browsing, window/level presets,
hotkeys, zoom/pan, the value under the cursor, AI overlays against the phantom's ground
truth, toggles, the lesion list, SEGs, PNG export, Help, and bad files.

Pixels are checked on what Qt actually draws: ``ImageView.render_scene()`` renders the
scene (image and visible layers) at 1:1 in source pixels.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pydicom
import pytest

from conftest import SAMPLE_DIR, pydicom_test_dir, require_module, two_pass_series
from medrt.io.dicom import read_frames

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytestmark = pytest.mark.gui

CT = SAMPLE_DIR / "ct_stream"


# -- fixtures and helpers ------------------------------------------------------------


@pytest.fixture
def make_window(bot):  # type: ignore[no-untyped-def]
    from medrt_gui.window import MainWindow

    def make(**kw: object) -> MainWindow:
        w = MainWindow(**kw)  # type: ignore[arg-type]
        w.resize(1100, 760)
        bot.addWidget(w)  # closed (sessions stopped) at teardown
        w.show()
        bot.waitExposed(w)
        return w

    return make


def rendered(w) -> np.ndarray:  # type: ignore[no-untyped-def]
    """What the scene draws at 1:1, once pending changes are drawn: uint8 RGB (rows, cols, 3)."""
    from PySide6.QtGui import QImage
    from PySide6.QtWidgets import QApplication

    deadline = time.monotonic() + 10
    while w.render_pending and time.monotonic() < deadline:
        QApplication.processEvents()

    img = w.view.render_scene().convertToFormat(QImage.Format.Format_RGB888)
    arr = np.frombuffer(img.constBits(), dtype=np.uint8).reshape(img.height(), img.bytesPerLine())
    return arr[:, : img.width() * 3].reshape(img.height(), img.width(), 3).copy()


def tinted(rgb: np.ndarray, threshold: int = 8) -> np.ndarray:
    """Pixels that are not grey: where an overlay was drawn."""
    r, g, b = (rgb[:, :, i].astype(np.int16) for i in range(3))
    return (np.abs(r - g) > threshold) | (np.abs(g - b) > threshold) | (np.abs(r - b) > threshold)


def expected_gray(pixels: np.ndarray, level: float, width: float) -> np.ndarray:
    """The linear window: black at level - width/2, white at level + width/2."""
    return np.rint(np.clip((pixels.astype(np.float64) - (level - width / 2)) / width, 0, 1) * 255)


def wait_shown(bot, w, index: int | None = None) -> None:  # type: ignore[no-untyped-def]
    def ok() -> bool:  # drawn, and no render still queued (it would change the panels)
        slot = w.current_slot()
        return (slot is not None and w.shown_key == slot.key and (index is None or w.slot_i == index)
                and not w.render_pending)

    bot.waitUntil(ok, timeout=20_000)


def slot_index_of(w, file_name: str) -> int:  # type: ignore[no-untyped-def]
    return next(i for i, s in enumerate(w.current_series.slots) if s.path is not None and s.path.name == file_name)


def key_click(bot, w, key) -> None:  # type: ignore[no-untyped-def]
    """A key press on the image, as a user would: window shortcuts need the window active."""
    if not w.isActiveWindow():
        w.activateWindow()
        bot.waitUntil(w.isActiveWindow)
    bot.keyClick(w.view, key)


def wheel(w, steps: int) -> None:  # type: ignore[no-untyped-def]
    from PySide6.QtCore import QPoint, QPointF, Qt
    from PySide6.QtGui import QWheelEvent
    from PySide6.QtWidgets import QApplication

    vp = w.view.viewport()
    pos = QPointF(vp.width() / 2, vp.height() / 2)
    event = QWheelEvent(pos, vp.mapToGlobal(pos), QPoint(0, 0), QPoint(0, -120 * steps), Qt.MouseButton.NoButton,
                        Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase, False)
    QApplication.sendEvent(vp, event)


# -- browsing, window/level, navigation ------------------------------------------------


def test_open_a_patient_disc_at_its_dicomdir(bot, make_window, caplog) -> None:  # type: ignore[no-untyped-def]
    """Opening a DICOMDIR (File > Open, or ``medrt view DISC/DICOMDIR``) shows the images it lists."""
    w = make_window(analysis=False)
    study = w.open_path(pydicom_test_dir() / "dicomdirtests" / "DICOMDIR")  # 2 patients, 13 series, 31 images
    assert len(study.series) == 13 and sum(len(s.slots) for s in study.series) == 31
    assert study.problems == [] and w.failures == []
    assert {s.modality for s in study.series} == {"CR", "CT", "MR"}
    wait_shown(bot, w, 0)
    # two patients on one disc: the browser says so, and names each series' patient
    assert "⚠ images of 2 patients are open" in w.browser.source.text()
    rows = [w.browser.series.item(i).text() for i in range(w.browser.series.count())]
    assert {r.split(" · ")[0] for r in rows} == {"Doe, Archibald", "Doe, Peter"}
    assert w.hud.text("top_left").startswith(f"{study.series[0].patient.name} · ID {study.series[0].patient.patient_id}")
    # the disc's folder: each image once, the DICOMDIRs beside them noted as non-images
    import logging

    with caplog.at_level(logging.WARNING):
        folder = w.open_path(pydicom_test_dir() / "dicomdirtests")
    assert "given twice" not in caplog.text
    assert sum(len(s.slots) for s in folder.series) == 31 + 50  # and TINY_ALPHA's 50 (no pixel data)
    assert sum("Media Storage Directory" in str(p) for p in folder.problems) == 8


def test_the_patient_and_study_are_shown_and_p_hides_them(bot, make_window) -> None:  # type: ignore[no-untyped-def]
    """A reader confirms whose images these are: top left names the patient and the study
    (as cornerstone/OHIF do); p hides them for a shared screen or a screenshot."""
    import pydicom
    from medrt_gui.patient import PatientInfo
    from PySide6.QtCore import Qt

    expected = PatientInfo.of(pydicom.dcmread(sorted(CT.glob("*.dcm"))[0], stop_before_pixels=True))
    assert expected.hud_text() == ("PHANTOM, CT 0007 · ID PHANTOM-CT-0007 · O\n"
                                   "2025-01-01 · Synthetic CT abdomen (medrt phantom)")
    w = make_window(analysis=False)
    w.open_path(CT)
    wait_shown(bot, w, 0)
    assert w.hud.text("top_left").startswith(expected.hud_text() + "\nCT · 40 images")
    assert w.browser.source.text() == f"Opened {CT}"  # one patient: no warning, no names in the rows
    key_click(bot, w, Qt.Key.Key_P)
    assert "PHANTOM" not in w.hud.text("top_left") and w.hud.text("top_left").startswith("CT · 40 images")
    key_click(bot, w, Qt.Key.Key_P)
    assert w.hud.text("top_left").startswith(expected.hud_text())
    hidden = make_window(analysis=False, show_patient=False)  # medrt view --hide-patient
    hidden.open_path(SAMPLE_DIR)  # the CT patient and three radiograph patients
    wait_shown(bot, hidden, 0)
    assert "PHANTOM" not in hidden.hud.text("top_left")
    assert "⚠ images of 4 patients are open" in hidden.browser.source.text()
    assert not any("PHANTOM" in hidden.browser.series.item(i).text() for i in range(hidden.browser.series.count()))


def test_the_corner_texts_never_overlap_and_h_hides_them(bot, make_window) -> None:  # type: ignore[no-untyped-def]
    """In a narrow window the top right corner was drawn over the top left one (and the
    bottom ones likewise); they now stack. h hides every corner (a finding under one) and
    shows them again."""
    from PySide6.QtCore import Qt

    w = make_window(analysis=False)
    w.open_path(CT)
    wait_shown(bot, w, 0)
    w.hud.set_text("top_right", "AI 40 analysed\nonnxruntime fp32")
    w.hud.set_text("bottom_right", "1 lesion · AI 243 ms · overlay on")
    labels = w.hud.labels
    narrowest = None
    for width in (1100, 760, 560):
        w.resize(width, 600)
        bot.wait(100)  # the resize reaches the viewport (the docks keep the window from some widths)
        narrowest = w.view.viewport().width()
        for row in ("top", "bottom"):
            left, right = labels[f"{row}_left"].geometry(), labels[f"{row}_right"].geometry()
            assert not left.intersects(right), (width, row, left, right)
    assert narrowest < labels["top_left"].width() + labels["top_right"].width()  # narrow enough to stack
    key_click(bot, w, Qt.Key.Key_H)
    assert not any(label.isVisible() for label in labels.values())
    key_click(bot, w, Qt.Key.Key_H)
    assert labels["top_left"].isVisible() and labels["top_right"].isVisible()


def test_open_folder_scroll_keys_and_wheel(bot, make_window) -> None:  # type: ignore[no-untyped-def]
    from PySide6.QtCore import Qt

    w = make_window(analysis=False)
    study = w.open_path(CT)
    assert len(study.series) == 1 and len(study.series[0].slots) == 40
    # The sidecars are listed as skipped non-DICOM files, not failures.
    assert {p.name.split("/")[-1] for p in study.problems} == {"ground_truth.json", "ground_truth_masks.npz"}
    assert all(p.skipped for p in study.problems) and w.failures == []
    wait_shown(bot, w, 0)
    first = rendered(w)
    key_click(bot, w, Qt.Key.Key_Down)
    wait_shown(bot, w, 1)
    assert not np.array_equal(rendered(w), first), "the next slice must look different"
    key_click(bot, w, Qt.Key.Key_End)
    wait_shown(bot, w, 39)
    key_click(bot, w, Qt.Key.Key_Up)
    wait_shown(bot, w, 38)
    key_click(bot, w, Qt.Key.Key_Home)
    wait_shown(bot, w, 0)
    assert np.array_equal(rendered(w), first)
    wheel(w, 3)  # three notches down: three images on
    wait_shown(bot, w, 3)
    wheel(w, -1)
    wait_shown(bot, w, 2)
    assert "image 3/40" in w.hud.text("top_left")
    # where the slice lies and how thick it is, as viewers' overlays say (head first: 0003)
    ds = pydicom.dcmread(w.current_slot().path, stop_before_pixels=True)
    assert w.current_slot().path.name == "ct_0003.dcm"
    assert f"image 3/40\nloc {float(ds.SliceLocation):.1f} mm · thick {float(ds.SliceThickness):.1f} mm" \
        in w.hud.text("top_left")


def test_presets_render_the_width_and_level_they_name(bot, make_window) -> None:  # type: ignore[no-untyped-def]
    from medrt_gui.imaging import PRESETS
    from PySide6.QtCore import Qt

    w = make_window(analysis=False)
    w.open_path(CT)
    w.show_image(slot_index_of(w, "ct_0017.dcm"))
    wait_shown(bot, w)
    hu = read_frames(w.current_slot().path)[0].pixels  # the file's own values, decoded apart
    # The header window (W 400 / L 40) first.
    win = w.current_slot().frame.window
    assert np.abs(rendered(w)[:, :, 0] - expected_gray(hu, win.center, win.width)).max() <= 1
    seen = []
    for preset in PRESETS:
        key_click(bot, w, preset.key)
        bot.waitUntil(lambda p=preset: w.current_window() == (p.level, p.width))
        got = rendered(w)[:, :, 0].astype(np.int32)
        want = expected_gray(hu, preset.level, preset.width)
        assert np.abs(got - want).max() <= 1, f"{preset.name}: rendered pixels do not follow W {preset.width} L {preset.level}"
        assert f"W {preset.width:.0f} L {preset.level:.0f}" in w.hud.text("bottom_left")
        seen.append(got)
    assert all(not np.array_equal(a, b) for i, a in enumerate(seen) for b in seen[i + 1:]), "presets must differ"
    key_click(bot, w, Qt.Key.Key_I)  # invert
    bot.waitUntil(lambda: w.inverted)
    assert np.abs(rendered(w)[:, :, 0].astype(np.int32) - (255 - seen[-1])).max() <= 1
    key_click(bot, w, Qt.Key.Key_Space)  # reset: header window, not inverted
    bot.waitUntil(lambda: not w.inverted and w.window_cw is None)
    assert np.abs(rendered(w)[:, :, 0] - expected_gray(hu, win.center, win.width)).max() <= 1


def test_drag_window_level_and_value_under_cursor(bot, make_window) -> None:  # type: ignore[no-untyped-def]
    from PySide6.QtCore import QPoint, Qt
    from PySide6.QtTest import QTest

    w = make_window(analysis=False)
    w.open_path(CT)
    wait_shown(bot, w)
    center0, width0 = w.current_window()
    vp = w.view.viewport()
    start = vp.rect().center()
    QTest.mousePress(vp, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, start)
    QTest.mouseMove(vp, start + QPoint(60, 0))
    QTest.mouseMove(vp, start + QPoint(60, 30))
    QTest.mouseRelease(vp, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, start + QPoint(60, 30))
    center1, width1 = w.current_window()
    assert width1 > width0 and center1 > center0  # right widens, down raises the level
    # The HU under the cursor is the frame's own value at that pixel.
    pos = start + QPoint(-40, 25)
    QTest.mouseMove(vp, pos)
    row, col = w.view.scene_pixel(pos.toPointF())
    value = float(read_frames(w.current_slot().path)[0].pixels[row, col])
    bot.waitUntil(lambda: f"HU {value:.0f}" in w.hud.text("bottom_left"))
    assert f"({col}, {row})" in w.hover_text


def test_length_tool_measures_in_mm_and_stays_with_its_image(bot, make_window) -> None:  # type: ignore[no-untyped-def]
    from medrt_gui.measure import ellipse_mask
    from PySide6.QtCore import QPoint, Qt
    from PySide6.QtTest import QTest
    from PySide6.QtWidgets import QApplication, QGraphicsSimpleTextItem

    def texts() -> list[str]:
        deadline = time.monotonic() + 10
        while w.render_pending and time.monotonic() < deadline:
            QApplication.processEvents()
        return [it.text() for it in w.view.measurement_items if isinstance(it, QGraphicsSimpleTextItem)]

    def drag(a: QPoint, b: QPoint) -> None:
        QTest.mousePress(vp, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, a)
        QTest.mouseMove(vp, (a + b) / 2)
        QTest.mouseMove(vp, b)
        QTest.mouseRelease(vp, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, b)

    w = make_window(analysis=False)
    w.open_path(CT)
    wait_shown(bot, w)
    vp = w.view.viewport()
    c = vp.rect().center()
    window0 = w.current_window()
    key_click(bot, w, Qt.Key.Key_M)
    assert w.view.tool == "length"
    a, b = c + QPoint(-60, -20), c + QPoint(60, 40)
    drag(a, b)
    assert w.current_window() == window0  # a length, not a window/level drag
    frame, key = w.current_slot().frame, w.current_slot().key
    pa, pb = w.view.mapToScene(a), w.view.mapToScene(b)
    (line,) = w.measurements[key]
    assert line.a == pytest.approx((pa.x(), pa.y())) and line.b == pytest.approx((pb.x(), pb.y()))
    mm = math.hypot((pb.x() - pa.x()) * frame.spacing_mm[1], (pb.y() - pa.y()) * frame.spacing_mm[0])
    assert texts() == [f"{mm:.1f} mm"] and f"Length: {mm:.1f} mm" in w.statusBar().currentMessage()
    assert 20 < mm < 200  # 120 × 60 screen pixels of a 512² slice fitted in the window, at under 1 mm a pixel
    yellow = rendered(w)
    assert ((yellow[:, :, 0] > 200) & (yellow[:, :, 1] > 180) & (yellow[:, :, 2] < 80)).sum() > 50  # drawn, exported
    drag(c, c + QPoint(1, 1))  # a click is not a length
    assert len(w.measurements[key]) == 1
    key_click(bot, w, Qt.Key.Key_Down)
    wait_shown(bot, w)
    assert texts() == []  # another image: its own measurements (none)
    key_click(bot, w, Qt.Key.Key_Up)
    wait_shown(bot, w)
    assert texts() == [f"{mm:.1f} mm"]
    key_click(bot, w, Qt.Key.Key_Delete)
    assert texts() == [] and key not in w.measurements
    # The ellipse tool: the mean, SD and area of the pixels inside, from the frame's own values.
    key_click(bot, w, Qt.Key.Key_E)
    assert w.view.tool == "ellipse"
    a, b = c + QPoint(-30, -20), c + QPoint(30, 20)
    drag(a, b)
    (roi,) = w.measurements[key]
    pa, pb = w.view.mapToScene(a), w.view.mapToScene(b)
    pixels = read_frames(w.current_slot().path)[0].pixels
    (r0, c0), mask = ellipse_mask(roi, pixels.shape)
    inside = pixels[r0:r0 + mask.shape[0], c0:c0 + mask.shape[1]][mask]
    area = mask.sum() * frame.spacing_mm[0] * frame.spacing_mm[1]
    assert roi.a == pytest.approx((pa.x(), pa.y())) and mask.sum() > 50
    assert texts() == [f"mean {inside.mean():.1f} HU, SD {inside.std():.1f}, {area:.1f} mm²"]
    key_click(bot, w, Qt.Key.Key_M)  # straight from one tool to the other
    assert w.view.tool == "length"
    key_click(bot, w, Qt.Key.Key_Delete)
    key_click(bot, w, Qt.Key.Key_M)
    assert w.view.tool == "window"
    drag(c, c + QPoint(60, 30))
    assert w.current_window() != window0 and key not in w.measurements


def test_length_text_says_what_a_millimetre_means():
    from medrt_gui.measure import (
        Ellipse,
        Length,
        ellipse_mask,
        ellipse_text,
        length_mm,
        length_text,
        size_units,
    )

    from medrt.types import SpacingSource

    line = Length((10.0, 10.0), (13.0, 14.0))  # 3 columns, 4 rows
    assert length_mm(line, (2.0, 1.0)) == pytest.approx(math.hypot(3 * 1.0, 4 * 2.0))
    assert length_text(line, (0.5, 0.5), SpacingSource.PIXEL_SPACING) == "2.5 mm"
    assert length_text(line, (0.5, 0.5), SpacingSource.IMAGER_PIXEL_SPACING) == "2.5 mm at detector"
    assert length_text(line, (0.5, 0.5), SpacingSource.ERMF) == "2.5 mm (ERMF)"  # estimated at the patient
    assert length_text(line, (0.5, 0.5), SpacingSource.GEOMETRY) == "2.5 mm (ERMF)"  # so at the modality
    assert length_text(line, (0.5, 0.5), SpacingSource.CALIBRATED) == "2.5 mm (calibrated)"
    assert length_text(line, (0.5, 0.5), SpacingSource.UNKNOWN_CALIBRATION) == "2.5 mm (calibration unknown)"
    assert length_text(line, (0.5, 0.5), "NominalScannedPixelSpacing") == "2.5 mm (scanned film)"
    assert length_text(line, None, SpacingSource.NONE) == "5.0 px"  # never an invented mm value
    assert size_units((0.5, 0.5), SpacingSource.ERMF) == ("mm (ERMF)", "mm² (ERMF)")
    assert size_units(None, SpacingSource.NONE) == ("px", "px²")  # lesions are measured in pixels then

    pixels = np.zeros((20, 20), dtype=np.float32)
    pixels[:, 10:] = 100.0
    roi = Ellipse((12.0, 4.0), (4.0, 12.0))  # corners in any order: centre (8, 8), radius 4
    (r0, c0), mask = ellipse_mask(roi, pixels.shape)
    assert (r0, c0) == (4, 4) and mask.shape == (8, 8) and mask.sum() == 52  # pixel centres inside
    assert mask[3, 3] and not mask[0, 0]
    inside = pixels[4:12, 4:12][mask]
    assert ellipse_text(roi, pixels, (0.5, 0.5), SpacingSource.PIXEL_SPACING, "CT") == (
        f"mean {inside.mean():.1f} HU, SD {inside.std():.1f}, 13.0 mm²")
    assert ellipse_text(roi, pixels, None, SpacingSource.NONE, "DX").endswith(", 52 px")
    assert ellipse_text(Ellipse((30.0, 30.0), (40.0, 40.0)), pixels, None, "none", "CT") == "no pixel inside"


def test_zoom_fit_pan_and_series_keys(bot, make_window) -> None:  # type: ignore[no-untyped-def]
    from PySide6.QtCore import QPoint, Qt
    from PySide6.QtTest import QTest

    w = make_window(analysis=False)
    w.open_path(SAMPLE_DIR)  # the CT series and the radiographs
    assert len(w.study.series) == 4  # one CT series, three radiographs (a series each)
    wait_shown(bot, w)
    fit = w.view.zoom
    assert fit == pytest.approx(w.view.fit_zoom(), rel=1e-3)
    key_click(bot, w, Qt.Key.Key_Plus)
    assert w.view.zoom == pytest.approx(fit * 1.25, rel=1e-3)
    key_click(bot, w, Qt.Key.Key_Minus)
    key_click(bot, w, Qt.Key.Key_Minus)
    assert w.view.zoom == pytest.approx(fit / 1.25, rel=1e-3)
    key_click(bot, w, Qt.Key.Key_Equal)
    assert w.view.zoom == pytest.approx(fit, rel=1e-3)
    key_click(bot, w, Qt.Key.Key_Plus)
    before = w.view.view_center()
    vp = w.view.viewport()
    c = vp.rect().center()
    QTest.mousePress(vp, Qt.MouseButton.MiddleButton, Qt.KeyboardModifier.NoModifier, c)
    QTest.mouseMove(vp, c + QPoint(50, 40))
    QTest.mouseRelease(vp, Qt.MouseButton.MiddleButton, Qt.KeyboardModifier.NoModifier, c + QPoint(50, 40))
    after = w.view.view_center()
    assert after[1] == pytest.approx(before[1] - 50 / w.view.zoom, abs=1.0)  # the image followed the mouse
    assert after[0] == pytest.approx(before[0] - 40 / w.view.zoom, abs=1.0)
    key_click(bot, w, Qt.Key.Key_Space)
    assert w.view.zoom == pytest.approx(fit, rel=1e-3)
    first_series = w.current_series.uid
    header = w.lesion_list.horizontalHeaderItem
    first_header = header(2).text()
    key_click(bot, w, Qt.Key.Key_PageDown)
    wait_shown(bot, w)
    assert w.current_series.uid != first_series and w.series_i == 1
    # the size columns say where the sizes are: a CT slice's in the patient, a radiograph's
    # at the detector (as its length tool says)
    # The diameter, first of the sizes, is in sight in the panel (the qualifier on a line of
    # its own: on one it pushed the diameter out of sight).
    table = w.lesion_list

    def columns() -> tuple[str, str, bool, str]:
        return header(2).text(), header(3).text(), \
            table.columnViewportPosition(2) + table.columnWidth(2) <= table.viewport().width(), \
            w.series_lesions.horizontalHeaderItem(2).text()

    seen = {w.current_series.modality: columns()}
    key_click(bot, w, Qt.Key.Key_PageUp)
    wait_shown(bot, w)
    assert w.current_series.uid == first_series and header(2).text() == first_header
    seen[w.current_series.modality] = columns()
    assert seen == {"CT": ("diam. mm", "area mm²", True, "longest mm"),
                    "DX": ("diam. mm\nat detector", "area mm²\nat detector", True, "longest mm\nat detector")}


def test_cine_plays_and_stops(bot, make_window) -> None:  # type: ignore[no-untyped-def]
    from PySide6.QtCore import Qt

    w = make_window(analysis=False)
    w.open_path(CT)
    wait_shown(bot, w, 0)
    w.controls.cine_fps.setValue(40)
    assert w.cine.interval() == 25
    key_click(bot, w, Qt.Key.Key_C)
    assert w.cine.isActive()
    bot.waitUntil(lambda: w.slot_i >= 3, timeout=10_000)
    key_click(bot, w, Qt.Key.Key_C)
    assert not w.cine.isActive()
    stopped = w.slot_i
    bot.wait(150)
    assert w.slot_i == stopped


# -- AI overlays, toggles and the lesion list -------------------------------------


@pytest.fixture(scope="module")
def analysed():  # type: ignore[no-untyped-def]
    """One window that has run the AI over the CT sample (shared: the analysis takes seconds)."""
    require_module("PySide6.QtWidgets")
    require_module("pytestqt")
    from medrt_gui.window import MainWindow
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication([])
    w = _analysed_window(app, MainWindow(workers=2))
    yield w
    w.close()


def _analysed_window(app, w):  # type: ignore[no-untyped-def]
    """``w`` shown with the CT sample open, once the AI has run over all 40 slices."""
    w.resize(1100, 760)
    w.show()
    w.open_path(CT)
    deadline = time.monotonic() + 180
    while not (w.session is not None and w.session_finished == w.session.sid and w.results_received == 40):
        app.processEvents()
        time.sleep(0.01)
        assert time.monotonic() < deadline, f"analysis did not finish: {w.results_received}/40"
    return w


def test_overlay_appears_at_the_ground_truth_lesion(bot, analysed) -> None:  # type: ignore[no-untyped-def]
    from medrt.phantom import load_ground_truth

    w = analysed
    truth = {t.file.name: t for t in load_ground_truth(CT).values()}["ct_0015.dcm"]
    w.controls.overlay.setChecked(True)
    w.controls.opacity.setValue(100)
    w.show_image(slot_index_of(w, "ct_0015.dcm"))
    wait_shown(bot, w)
    slot = w.current_slot()
    assert slot.result is not None and slot.result.lesions
    mask = truth.mask > 0
    drawn = tinted(rendered(w))
    covered = drawn[mask].mean()
    assert covered > 0.6, f"only {covered:.0%} of the ground-truth lesion is overlaid"
    # Elsewhere the image stays grey, apart from what the model found.
    assert drawn[np.asarray(slot.result.labels) == 0].mean() < 0.001
    # The lesion numbers are drawn too.
    assert len(w.view._labels) == len(slot.result.lesions)


def test_overlay_toggles_opacity_and_crop_boxes(bot, analysed) -> None:  # type: ignore[no-untyped-def]
    from PySide6.QtCore import Qt

    w = analysed
    w.controls.overlay.setChecked(True)
    w.controls.opacity.setValue(100)
    w.show_image(slot_index_of(w, "ct_0015.dcm"))
    wait_shown(bot, w)
    labels = np.asarray(w.current_slot().result.labels) > 0
    full = rendered(w)
    assert tinted(full)[labels].mean() > 0.9
    key_click(bot, w, Qt.Key.Key_G)  # g hides the overlay
    assert not w.controls.overlay.isChecked()
    assert tinted(rendered(w)).sum() == 0
    assert "overlay off" in w.hud.text("bottom_right")
    key_click(bot, w, Qt.Key.Key_G)
    assert tinted(rendered(w))[labels].mean() > 0.9
    # Opacity: 0 hides, half is fainter than full.
    w.controls.opacity.setValue(0)
    assert tinted(rendered(w)).sum() == 0
    w.controls.opacity.setValue(50)
    half = rendered(w).astype(np.int16)
    spread = lambda a: np.abs(a[:, :, 0] - a[:, :, 1])[labels].mean()  # noqa: E731
    assert 0 < spread(half) < spread(full.astype(np.int16))
    w.controls.opacity.setValue(100)
    # The default (auto) runs a CT slice whole, without the classifier: no crops to draw.
    assert w.current_slot().result.mode == "full" and not w.current_slot().result.crops
    w.controls.crops.setChecked(True)
    assert not w.view.crop_items and yellow(rendered(w)[:3]) == 0
    w.controls.crops.setChecked(False)


def yellow(a: np.ndarray) -> int:
    """Pixels of the crop boxes' colour."""
    return int(((a[:, :, 0] > 150) & (a[:, :, 1] > 150) & (a[:, :, 2] < 100)).sum())


def test_crop_boxes_show_the_roi_path_crops(bot) -> None:  # type: ignore[no-untyped-def]
    """Crop boxes: the UNet's crops on the ROI path (``--mode roi``), drawn only when asked."""
    require_module("PySide6.QtWidgets")
    require_module("pytestqt")
    from medrt_gui.bridge import AnalyzerProvider
    from medrt_gui.window import MainWindow
    from PySide6.QtWidgets import QApplication

    from medrt.analyzer import AnalyzerConfig

    app = QApplication.instance() or QApplication([])
    w = MainWindow(AnalyzerProvider(AnalyzerConfig(threads=1, mode="roi")), workers=2)
    try:
        _analysed_window(app, w)
        w.show_image(slot_index_of(w, "ct_0015.dcm"))
        wait_shown(bot, w)
        crops = w.current_slot().result.crops
        assert w.current_slot().result.mode == "roi"
        assert crops and len(w.view.crop_items) == len(crops)
        top = lambda: rendered(w)[:3]  # noqa: E731  (a 512² CT crop is the whole frame: its box runs along the top)
        assert yellow(top()) == 0
        w.controls.crops.setChecked(True)
        assert all(item.isVisible() for item in w.view.crop_items)
        assert yellow(top()) > 20
        w.controls.crops.setChecked(False)
        assert yellow(top()) == 0
    finally:
        w.close()


def test_lesion_list_click_centres_and_zooms(bot, analysed) -> None:  # type: ignore[no-untyped-def]
    from PySide6.QtCore import Qt

    w = analysed
    w.show_image(slot_index_of(w, "ct_0017.dcm"))
    wait_shown(bot, w)
    w.view.fit()
    fit = w.view.zoom
    lesions = w.current_slot().result.lesions
    table = w.lesion_list
    assert table.rowCount() == len(lesions) >= 1
    for row, les in enumerate(lesions):
        assert table.item(row, 2).text() == f"{les.diameter_mm:.1f}"
        assert table.item(row, 3).text() == f"{les.area_mm2:.1f}"
        assert table.item(row, 6).text() in ("yes", "no")
    row = len(lesions) - 1
    rect = table.visualItemRect(table.item(row, 0))
    bot.mouseClick(table.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    target = lesions[row].centroid
    r, c = w.view.view_center()
    assert abs(r - (target[0] + 0.5)) < 2 and abs(c - (target[1] + 0.5)) < 2, ((r, c), target)
    assert w.view.zoom > 1.9 * fit
    key_click(bot, w, Qt.Key.Key_Equal)
    assert w.view.zoom == pytest.approx(fit, rel=1e-3)


def test_a_lesion_keeps_its_number_on_every_slice_it_shows_on(bot, analysed) -> None:  # type: ignore[no-untyped-def]
    """The list and the labels on the image number lesions of the series, as lesions.csv and
    the SR do: a nodule on three slices is lesion 4 on each, slice 1/3, 2/3, 3/3."""
    w = analysed
    lesions, numbers = w.current_series.series_lesions()
    assert len(lesions) < len(numbers)  # sections joined
    tall = max(lesions, key=lambda les: les.slices)
    assert tall.slices >= 2 and tall.volume_mm3 is not None
    keys = [slot.key for slot in w.current_series.slots]
    for at, section in enumerate(tall.sections, start=1):
        w.show_image(keys.index(section.key))
        wait_shown(bot, w)
        table = w.lesion_list
        (row,) = [r for r, les in enumerate(table.lesions) if les.label == section.lesion.label]
        assert table.item(row, 0).text() == str(tall.number)
        assert table.item(row, 1).text() == f"{at}/{tall.slices}"
        assert table.item(row, 4).text() == f"{tall.volume_mm3:.0f}"
        assert str(tall.number) in [item.text() for item in w.view._labels]
    assert w.current_series.series_lesions()[0] is lesions  # worked out once while nothing changed
    # the status line counts them the same way, as medrt batch does
    positive = sum(1 for slot in w.current_series.slots if slot.result.lesions)
    assert w.finished_message() == (f"analysis finished: {len(lesions)} lesion(s) ({len(numbers)} sections: a CT "
                                    f"lesion once per slice it is on) in {positive} of 40 image(s)")


def test_the_series_tab_lists_each_lesion_once_and_goes_to_where_it_is_largest(bot, analysed) -> None:  # type: ignore[no-untyped-def]
    from PySide6.QtCore import Qt

    w = analysed
    w.show_image(0)
    wait_shown(bot, w)
    lesions, _ = w.current_series.series_lesions()
    table = w.series_lesions
    assert table.rowCount() == len(lesions) >= 2
    for row, les in enumerate(lesions):
        assert [table.item(row, c).text() for c in range(3)] == [str(les.number), str(les.slices),
                                                                 f"{les.diameter_mm:.1f}"]
    w.lesion_tabs.setCurrentWidget(table)
    w.view.fit()
    fit = w.view.zoom
    row = max(range(len(lesions)), key=lambda r: lesions[r].slices)
    bot.mouseClick(table.viewport(), Qt.MouseButton.LeftButton, pos=table.visualItemRect(table.item(row, 0)).center())
    wait_shown(bot, w)
    largest = lesions[row].largest
    assert w.current_slot().key == largest.key
    r, c = w.view.view_center()
    assert abs(r - (largest.lesion.centroid[0] + 0.5)) < 2 and abs(c - (largest.lesion.centroid[1] + 0.5)) < 2
    assert w.view.zoom > 1.9 * fit


def test_n_goes_from_finding_to_finding_where_each_is_largest(bot, analysed) -> None:  # type: ignore[no-untyped-def]
    """n: the next lesion of the study, each once, in reading order, at the image where it is
    largest, centred and zoomed on, round to the first after the last; Shift+n back; after
    scrolling elsewhere, the first from there on."""
    from PySide6.QtCore import Qt

    w = analysed
    w.show_image(0)
    wait_shown(bot, w)
    w.view.fit()
    fit = w.view.zoom
    lesions, _ = w.current_series.series_lesions()
    keys = [slot.key for slot in w.current_series.slots]
    order = sorted(lesions, key=lambda les: (keys.index(les.largest.key), les.number))
    assert len(order) >= 3
    visited = []
    for _ in range(len(order) + 1):
        key_click(bot, w, Qt.Key.Key_N)
        wait_shown(bot, w)
        visited.append(w.current_slot().key)
        assert w.statusBar().currentMessage().startswith(f"finding {(len(visited) - 1) % len(order) + 1} "
                                                         f"of {len(order)}: lesion ")
    assert visited == [les.largest.key for les in order] + [order[0].largest.key]  # each once, then round
    target = order[0].largest.lesion.centroid
    r, c = w.view.view_center()
    assert abs(r - (target[0] + 0.5)) < 2 and abs(c - (target[1] + 0.5)) < 2 and w.view.zoom > 1.9 * fit
    bot.keyClick(w.view, Qt.Key.Key_N, Qt.KeyboardModifier.ShiftModifier)  # back round to the last
    wait_shown(bot, w)
    assert w.current_slot().key == order[-1].largest.key
    middle = keys.index(order[len(order) // 2].largest.key)
    w.show_image(middle - 1)  # scrolled elsewhere: n goes on from there
    key_click(bot, w, Qt.Key.Key_N)
    wait_shown(bot, w)
    after = next(les for les in order if keys.index(les.largest.key) >= middle - 1)
    assert w.current_slot().key == after.largest.key


# -- SEG, export, help, bad files ---------------------------------------------------------


def _seg_from_truth(out: Path, names: list[str]) -> Path:
    """A DICOM SEG of the ground-truth masks of ``names``, built by medrt's own SEG exporter."""
    from medrt.analysis.lesions import lesions_from_probability
    from medrt.export.seg import build_seg
    from medrt.io.dicom import read_frames
    from medrt.phantom import load_ground_truth
    from medrt.types import FrameResult, StageTimings

    truth = {t.file.name: t for t in load_ground_truth(CT).values()}
    results = []
    for n in names:
        frame = read_frames(CT / n)[0]
        labels, lesions = lesions_from_probability((truth[n].mask > 0).astype(np.float32), frame.spacing_mm, 0.5)
        results.append(FrameResult(frame=frame, lesions=tuple(lesions), labels=labels, presence=1.0, proposals=(),
                                   crops=(), mode="roi", timings=StageTimings(), backend="test",
                                   precision="fp32", models=("truth@1",)))
    seg = build_seg(results)
    out.parent.mkdir(parents=True, exist_ok=True)
    seg.save_as(out)
    return out


def test_seg_opened_beside_its_source(bot, make_window, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from medrt_gui.seg import SEG_COLOR, seg_overlay

    from medrt.overlay import lesion_color
    from medrt.phantom import load_ground_truth

    names = ["ct_0014.dcm", "ct_0015.dcm", "ct_0016.dcm", "ct_0017.dcm"]
    seg = _seg_from_truth(tmp_path / "out" / "seg.dcm", names)
    w = make_window(analysis=False)
    w.open_path(CT)
    assert w.open_seg(seg) == 4
    w.show_image(slot_index_of(w, "ct_0017.dcm"))
    wait_shown(bot, w)
    truth = {t.file.name: t for t in load_ground_truth(CT).values()}["ct_0017.dcm"]
    on = rendered(w)
    assert np.array_equal(tinted(on), truth.mask > 0), "the SEG layer must cover exactly the segmented pixels"
    slot = w.current_slot()
    assert slot.seg_present and set(slot.seg_present) == set(np.unique(slot.seg_labels)) - {0}
    hud = w.hud.text("bottom_right")
    assert "SEG: " in hud and all(slot.seg.label_of(n) in hud for n in slot.seg_present), hud
    w.controls.seg.setChecked(False)
    off = rendered(w)
    assert tinted(off).sum() == 0
    # Each segment in the colour the SEG recommends: medrt's, the AI overlay's for that lesion.
    assert slot.seg.colors == {n: lesion_color(int(slot.seg.label_of(n).split()[-1])) for n in slot.seg.segments}
    layer = seg_overlay(slot.frame, slot.seg_labels, slot.seg.colors)
    for n in slot.seg_present:
        where = slot.seg_labels == n
        alpha = layer[where, 3:4] / 255.0
        expected = alpha * np.array(slot.seg.colors[n]) + (1 - alpha) * off[where]
        assert np.abs(on[where] - expected).max() <= 2, f"segment {n} not in its colour"
    # A segment whose SEG recommends no colour is drawn in SEG_COLOR.
    assert (seg_overlay(slot.frame, slot.seg_labels)[slot.seg_labels > 0, :3] == SEG_COLOR).all()
    # A SEG lying in the opened folder is laid over its images by itself.
    folder = tmp_path / "study"
    folder.mkdir()
    for n in names:
        shutil.copy(CT / n, folder / n)
    shutil.copy(seg, folder / "seg.dcm")
    w.controls.seg.setChecked(True)
    study = w.open_path(folder)
    assert len(study.seg_paths) == 1
    assert sum(s.seg_labels is not None for s in study.series[0].slots) == 4
    # A SEG of images that are not open says so, and nothing breaks.
    w.open_path(SAMPLE_DIR / "radiographs")
    assert w.open_seg(seg) == 0
    assert "none of the open images" in w.statusBar().currentMessage()


def test_an_enhanced_ct_stored_out_of_position_order_is_shown_head_first(bot, make_window, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """An enhanced CT may store its frames in any order. Its images were shown in frame order,
    so scrolling jumped about the volume (-112, -88, -115 ... mm on a shuffled phantom); they
    now come head first, as a series of single-frame slices does."""
    import random

    import highdicom as hd
    from pydicom.uid import generate_uid

    from medrt.phantom.folders import write_ct_series

    slices = write_ct_series(tmp_path / "phantom", seed=25, n_frames=6, size=128, compress="none")
    datasets = [pydicom.dcmread(p) for p in slices]
    random.Random(5).shuffle(datasets)
    path = tmp_path / "enhanced.dcm"
    hd.legacy.LegacyConvertedEnhancedCTImage(
        legacy_datasets=datasets, series_instance_uid=generate_uid(), series_number=9,
        sop_instance_uid=generate_uid(), instance_number=1, include_dimension_index=False,
    ).save_as(path, enforce_file_format=True)
    z = {f.key: f.geometry.position[2] for f in read_frames(path)}
    assert list(z.values()) != sorted(z.values(), reverse=True)  # stored out of order
    w = make_window(analysis=False)
    study = w.open_path(path)
    assert [s.key for s in study.series[0].slots] == sorted(z, key=z.__getitem__, reverse=True)
    w.show_image(1)
    wait_shown(bot, w)
    assert w.current_slot().frame.geometry.position[2] == sorted(z.values(), reverse=True)[1]


def test_a_feet_first_series_is_shown_head_first_as_a_head_first_one(bot, make_window, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Row x column points to the feet on a feet-first scan (ImageOrientationPatient
    -1\\0\\0\\0\\1\\0): an opened folder's slices, ordered along it, were shown from the feet
    up, the other way from a head-first series and from the same series arriving live.
    Both now open head first, as a series' single slices and an enhanced CT's frames."""
    import highdicom as hd
    from pydicom.uid import generate_uid

    from medrt.phantom.folders import write_ct_series

    slices = write_ct_series(tmp_path / "phantom", seed=25, n_frames=5, size=128, compress="none")
    ffs = tmp_path / "ffs"
    ffs.mkdir()
    datasets = []
    for p in slices:
        ds = pydicom.dcmread(p)
        ipp = [float(v) for v in ds.ImagePositionPatient]
        ipp[0] += (ds.Columns - 1) * float(ds.PixelSpacing[1])
        ds.ImagePositionPatient, ds.ImageOrientationPatient, ds.PatientPosition = ipp, [-1, 0, 0, 0, 1, 0], "FFS"
        ds.save_as(ffs / p.name, enforce_file_format=True)
        datasets.append(ds)
    enhanced = tmp_path / "enhanced.dcm"
    hd.legacy.LegacyConvertedEnhancedCTImage(
        legacy_datasets=datasets, series_instance_uid=generate_uid(), series_number=9,
        sop_instance_uid=generate_uid(), instance_number=1, include_dimension_index=False,
    ).save_as(enhanced, enforce_file_format=True)
    w = make_window(analysis=False)
    for path in (tmp_path / "phantom", ffs, enhanced):
        study = w.open_path(path)
        z = [read_frames(s.path)[int(s.key.split("#")[1]) if "#" in s.key else 0].geometry.position[2]
             for s in study.series[0].slots]
        assert z == sorted(z, reverse=True) and len(z) == 5, (path.name, z)


def test_export_view_as_png(bot, make_window, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from PIL import Image

    w = make_window(analysis=False)
    w.open_path(CT)
    wait_shown(bot, w)
    out = w.export_png(tmp_path / "view.png")
    with Image.open(out) as img:
        assert img.size == (w.view.viewport().width(), w.view.viewport().height())
        arr = np.asarray(img.convert("L"))
    assert arr.std() > 10  # the CT slice, not an empty frame


def test_help_lists_every_hotkey(bot, make_window) -> None:  # type: ignore[no-untyped-def]
    from medrt_gui.hotkeys import HOTKEYS, MOUSE, help_text
    from PySide6.QtCore import Qt

    required = {"Up", "Down", "Home", "End", "PgUp", "PgDown", "+", "-", "=", "I", "C", "Space",
                "1", "2", "3", "4", "G"}
    assert required <= {k for h in HOTKEYS for k in h.keys}
    w = make_window(analysis=False)
    key_click(bot, w, Qt.Key.Key_F1)
    bot.waitUntil(lambda: w.help_box is not None and w.help_box.isVisible())
    text = w.help_box.text()
    for h in HOTKEYS:
        assert f"<b>{h.shown}</b>" in text and h.text in text
        assert h.text in help_text()
        assert [s.toString() for s in w.actions_by_name[h.action].shortcuts()], h.action
    for what, _ in MOUSE:
        assert what in text
    w.help_box.close()


def _bad_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "mixed"
    folder.mkdir()
    for n in ("ct_0014.dcm", "ct_0015.dcm", "ct_0016.dcm", "ct_0017.dcm", "ct_0018.dcm"):
        shutil.copy(CT / n, folder / n)
    data = (CT / "ct_0020.dcm").read_bytes()
    (folder / "cut_header.dcm").write_bytes(data[:300])
    (folder / "cut_pixels.dcm").write_bytes(data[: int(len(data) * 0.6)])
    (folder / "garbage.dcm").write_bytes(np.random.default_rng(0).bytes(5000))
    (folder / "notes.txt").write_text("reading list\n")
    return folder


def test_bad_files_are_named_and_the_rest_still_shows(bot, make_window, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from PySide6.QtCore import Qt

    folder = _bad_folder(tmp_path)
    w = make_window(analysis=True)
    study = w.open_path(folder)
    problems = {p.name.split("/")[-1]: p for p in study.problems}
    assert not problems["cut_header.dcm"].skipped and problems["cut_header.dcm"].reason
    assert problems["garbage.dcm"].skipped and problems["notes.txt"].skipped
    assert "cut_header.dcm" in w.statusBar().currentMessage()
    # cut_pixels.dcm has a whole header: it is listed, and fails when its pixels are decoded.
    assert len(study.series[0].slots) == 6
    bot.waitUntil(lambda: w.session_finished == w.session.sid, timeout=120_000)
    assert w.results_received == 5
    bot.waitUntil(lambda: any("cut_pixels.dcm" in f for f in w.failures))
    bad = slot_index_of(w, "cut_pixels.dcm")
    w.show_image(bad)
    bot.waitUntil(lambda: w.current_slot().error is not None, timeout=20_000)
    bot.waitUntil(lambda: "cannot show" in w.hud.text("top_left"))
    assert "cut_pixels.dcm" in w.statusBar().currentMessage() or "cut_pixels.dcm" in " ".join(w.failures)
    # Every other image still shows, and the app goes on.
    for i in range(6):
        w.show_image(i)
        if i != bad:
            wait_shown(bot, w, i)
    key_click(bot, w, Qt.Key.Key_End)
    key_click(bot, w, Qt.Key.Key_Home)
    bot.waitUntil(lambda: w.slot_i == 0 and not w.render_pending)
    w.show_image(bad)
    bot.waitUntil(lambda: w.shown_key is None and not w.render_pending)
    assert w.view.image.pixmap().isNull(), "no stale image under the unreadable one's label"
    assert w.isVisible()
    # Each unreadable file counted once, though cut_pixels.dcm failed both in the AI and on screen.
    assert sorted(f.split(": ")[0].split("/")[-1] for f in w.failures) == ["cut_header.dcm", "cut_pixels.dcm"]
    assert "; 2 file(s) could not be read, first" in w.finished_message()


def test_the_problems_panel_counts_unreadable_images_as_the_status_bar_does(bot, make_window, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A SEG the viewer could not lay over its images was counted as an unreadable file in
    the panel (63 there, 61 in the status bar, on pydicom's test files); it is named apart."""
    folder = tmp_path / "two"
    folder.mkdir()
    for n in ("ct_0014.dcm", "ct_0015.dcm"):
        shutil.copy(CT / n, folder / n)
    (folder / "cut_header.dcm").write_bytes((CT / "ct_0020.dcm").read_bytes()[:300])
    shutil.copy(pydicom_test_dir() / "liver_expb_1frame.dcm", folder / "seg_big_endian.dcm")  # a SEG not shown
    w = make_window(analysis=False)
    study = w.open_path(folder)
    assert [p.seg for p in study.problems if p.name.endswith("seg_big_endian.dcm")] == [True]
    bot.waitUntil(lambda: w.browser.problems_label.text() == "Problems: 1 unreadable, 1 SEG(s) not shown, 0 skipped")


def test_an_analysed_series_holds_each_image_once(bot, make_window) -> None:  # type: ignore[no-untyped-def]
    """A thin-slice CT has a thousand images or more: each slot keeps its image as the display
    index alone when that holds every value (integer HU), the result no pixels, and a
    lesion-free result no label map; what the tools read is still the file's values."""
    from medrt_gui.imaging import IndexedValues

    w = make_window(analysis=True)
    w.open_path(CT)
    bot.waitUntil(lambda: w.session_finished == w.session.sid, timeout=180_000)
    slots = w.study.series[0].slots
    assert all(s.result is not None for s in slots)
    for slot in slots[::7]:
        assert slot.index is not None and slot.index.exact
        assert slot.frame.pixels.strides == (0, 0) and slot.result.frame.pixels.strides == (0, 0)
        assert (slot.result.labels.strides == (0, 0)) == (not slot.result.lesions)
        assert isinstance(slot.values, IndexedValues)
        pixels = read_frames(slot.path)[0].pixels
        assert np.array_equal(slot.values[:, :], pixels)
        assert slot.values[100, 200] == pixels[100, 200] and slot.values.shape == pixels.shape
    assert any(s.result.lesions for s in slots) and not all(s.result.lesions for s in slots)
    # Shown with its overlay, and the list counts its lesions, as before.
    w.show_image(next(i for i, s in enumerate(slots) if s.result.lesions))
    wait_shown(bot, w)
    assert tinted(rendered(w)).any()


def test_two_whole_acquisitions_in_one_series_are_analysed_and_linked_pass_by_pass(  # type: ignore[no-untyped-def]
        bot, make_window, tmp_path: Path) -> None:
    """A pre- and a post-contrast pass in one series, opened: shown one pass after the other,
    the analysis gave the first pass's last slice the second's first as its neighbour (10 mm
    on: the next file), which lost its lesion. Each pass now gets the findings of the other,
    slice for slice, and the series' lesions are linked pass by pass, each saying its pass."""
    first, second = two_pass_series(tmp_path)
    w = make_window(analysis=True)
    study = w.open_path(tmp_path)
    (entry,) = study.series
    assert [s.path for s in entry.slots] == [*first, *second]  # each pass head first
    bot.waitUntil(lambda: w.session_finished == w.session.sid, timeout=180_000)
    found = {s.path.name: [les.bbox for les in s.result.lesions] for s in entry.slots}
    assert [found[p.name] for p in first] == [found[p.name] for p in second]
    assert found[first[-1].name]  # the slice that lost its lesion
    lesions, numbers = entry.series_lesions()
    assert [les.acquisition for les in lesions] == [1] * (len(lesions) // 2) + [2] * (len(lesions) // 2)
    assert len(lesions) % 2 == 0 and len(numbers) == sum(map(len, found.values()))


def test_a_replay_that_wraps_shows_its_series_lesions_once_as_opening_it_does(  # type: ignore[no-untyped-def]
        bot, make_window, tmp_path: Path) -> None:
    """`medrt stream --loop` links each frame to the one before it as they come, so it had
    to start afresh at each loop (a short series' last slice lies within reach of its first).
    The viewer links no arrivals: a looping replay sends the same images again, each into
    its slot, and the Series tab links the slots' results in slice order (link_series), so a
    loop's first slice is never joined to the last loop's last, and no lesion is listed once
    per loop. Three 5 mm slices with one lesion through all three (10 mm: within reach
    across the wrap), replayed three times: three images, the one lesion over its three
    slices, as opening the folder shows it; the status line counts the images received."""
    for src in sorted(CT.glob("*.dcm"))[13:16]:  # ct_0014-16
        shutil.copy(src, tmp_path / src.name)
    w = make_window(analysis=True, workers=1)
    session = w.start_replay(tmp_path, fps=4, loop=3)
    assert session is not None
    bot.waitUntil(lambda: w.session_finished == session.sid, timeout=180_000)
    (entry,) = w.study.series
    assert len(entry.slots) == 3 and all(s.result is not None for s in entry.slots)
    assert w.study.arrivals == w.frames_received > 3  # it wrapped: images came again
    assert w.statusBar().currentMessage() == f"replay ended: {w.frames_received} image(s) received"
    lesions, numbers = entry.series_lesions()
    replayed = [(les.slices, les.uid) for les in lesions]
    assert [n for n, _ in replayed] == [3] and len(numbers) == 3
    w.open_path(tmp_path)
    bot.waitUntil(lambda: w.session_finished == w.session.sid, timeout=180_000)
    assert [(les.slices, les.uid) for les in w.study.series[0].series_lesions()[0]] == replayed
    assert w.finished_message() == ("analysis finished: 1 lesion(s) (3 sections: a CT lesion once per slice it "
                                    "is on) in 3 of 3 image(s)")


def test_decoded_images_stay_within_the_image_cache(bot, make_window) -> None:  # type: ignore[no-untyped-def]
    """With --image-cache 3 MB (six 512² slices as display indexes), analysing the 40-slice
    CT leaves no more than that decoded, the image shown and its neighbours among them; an
    image that was let go is decoded again when shown, with its own values and its result."""
    w = make_window(analysis=True, image_cache_mb=3.0)
    w.open_path(CT)
    bot.waitUntil(lambda: w.session_finished == w.session.sid, timeout=180_000)
    slots = w.study.series[0].slots
    w.release_images()
    held = [i for i, s in enumerate(slots) if s.image_bytes]
    assert sum(s.image_bytes for s in slots) <= 3 * 2**20 and 0 in held and 1 in held, held
    assert all(s.result is not None for s in slots)  # results stay
    far = max(i for i, s in enumerate(slots) if s.result.lesions)
    assert far not in held
    w.show_image(far)
    wait_shown(bot, w, far)
    slot = w.current_slot()
    pixels = read_frames(slot.path)[0].pixels
    assert np.array_equal(slot.values[:, :], pixels)
    assert tinted(rendered(w)).any(), "its lesion overlay is drawn again"
    assert f"{len(slot.result.lesions)} lesion" in w.hud.text("bottom_right")
    w.release_images()
    assert slots[0].image_bytes == 0 and slot.image_bytes > 0  # now the first ones are far


def test_far_radiographs_keep_their_label_maps_packed(bot, make_window) -> None:  # type: ignore[no-untyped-def]
    """A 4096² radiograph's image (32 MB as an index), overlay and label map (32 MB) go past
    the cache; the label map of an image alone in its series is kept packed, and comes back
    (each lesion's pixels inside its box) when the radiograph is shown, with its overlay
    drawn again."""
    w = make_window(analysis=True, image_cache_mb=40.0)
    w.open_path(SAMPLE_DIR / "radiographs")
    bot.waitUntil(lambda: w.session_finished == w.session.sid, timeout=180_000)
    slots = [e.slots[0] for e in w.study.series]
    assert len(slots) == 3 and all(s.result is not None for s in slots)
    w.release_images()
    far = [s for i, s in enumerate(slots) if i != w.series_i]
    assert all(s.image_bytes == 0 and s.overlay is None and s.label_bytes == 0 for s in far)
    packed = [s for s in far if s.result.lesions]
    assert packed, "a far radiograph with lesions"
    target = w.study.series.index(next(e for e in w.study.series if e.slots[0] is packed[-1]))
    w.show_series(target)
    wait_shown(bot, w)
    shown = w.current_slot()
    assert shown is packed[-1], (shown._packed is None, shown.result.labels.strides, shown.label_bytes)
    labels = shown.result.labels  # unpacked: each lesion's pixels, inside its box
    assert set(np.unique(labels)) == {0} | {les.label for les in shown.result.lesions}
    for les in shown.result.lesions:
        r0, c0, r1, c1 = les.bbox
        assert np.count_nonzero(labels == les.label) == np.count_nonzero(labels[r0:r1, c0:c1] == les.label) > 0
    assert tinted(rendered(w)).any(), "its overlay is drawn again"
    assert f"{len(shown.result.lesions)} lesion" in w.hud.text("bottom_right")
    # n goes from series to series: every nodule of the three radiographs once, then round
    w.show_series(0)
    wait_shown(bot, w)
    seen = []
    total = sum(len(e.series_lesions()[0]) for e in w.study.series)
    for _ in range(total + 1):
        lesion = w.next_finding()
        seen.append((w.series_i, lesion.number))
    assert len(set(seen)) == total == len(seen) - 1 and seen[-1] == seen[0]
    assert [si for si, _ in seen[:-1]] == sorted(si for si, _ in seen[:-1])
    assert {si for si, _ in seen} == {i for i, e in enumerate(w.study.series) if e.slots[0].result.lesions}


def test_large_files_decode_in_a_process_small_ones_on_the_thread(bot, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Browsing decode: a 4096² RLE radiograph (pylibjpeg-rle holds the interpreter
    lock for the whole image) goes to a worker process; a 4096² JPEG-LS one (imagecodecs
    lets the event loop run) and a 512² CT slice stay on the thread; all give
    read_frames' pixels, and a bad large file is still named. After shutdown a late
    ask is ignored (a render queued as the window closed raised in CI)."""
    from medrt_gui.bridge import Bridge, Decoder

    from medrt.bench.decode import _radiograph_file
    from medrt.io.dicom import read_frames

    dx = sorted((SAMPLE_DIR / "radiographs").glob("*.dcm"))[0]
    rle = _radiograph_file(tmp_path, 4096, "rle")
    ct = sorted(CT.glob("*.dcm"))[0]
    cut = tmp_path / "cut.dcm"
    cut.write_bytes(rle.read_bytes()[: 5 << 20])  # large, its pixel data cut short
    bridge = Bridge()
    got: dict[str, object] = {}
    bridge.decoded.connect(lambda d: got.__setitem__(d.path.name, d))
    decoder = Decoder(bridge)
    try:
        assert [decoder.in_process(p) for p in (dx, rle, ct, cut)] == [False, True, False, True]
        decoder.want([dx, rle, ct, cut])
        bot.waitUntil(lambda: len(got) == 4, timeout=60_000)
        assert decoder._process.running  # the RLE radiograph went to the process
        for path in (dx, rle, ct):
            frames = got[path.name].frames  # type: ignore[attr-defined]
            assert np.array_equal(frames[0][0].pixels, read_frames(path)[0].pixels)
        assert got["cut.dcm"].reason and not got["cut.dcm"].frames  # type: ignore[attr-defined]
    finally:
        decoder.shutdown()
    assert not decoder._process.running
    decoder.want([dx])  # a render queued before the window closed may still ask: ignored


def test_the_hud_gives_a_frame_the_thickness_of_the_shared_pixel_measures_its_own_leave_out(tmp_path: Path) -> None:
    """An enhanced CT whose frame has Pixel Measures of its own without the SliceThickness the
    shared ones give (some conversions write both): the HUD said no thickness for that frame.
    It reads each attribute as the reader and the SEG writer do, the frame's own else the
    shared one's, so every frame shows the shared thickness; and a top-level SliceThickness
    left beside the functional groups does not hide theirs."""
    from medrt_gui.window import slice_place
    from pydicom.dataset import Dataset

    from medrt.phantom.enhanced import write_enhanced_ct

    (path,) = write_enhanced_ct(tmp_path, 3, n_frames=4, size=64, compress="none")
    ds = pydicom.dcmread(path)
    assert "SliceThickness" not in ds  # the functional groups' alone
    shared = ds.SharedFunctionalGroupsSequence[0].PixelMeasuresSequence[0]
    own = Dataset()
    own.PixelSpacing = shared.PixelSpacing
    ds.PerFrameFunctionalGroupsSequence[1].PixelMeasuresSequence = [own]
    places = [slice_place(f) for f in read_frames(ds)]
    assert all(place.endswith(f"thick {float(shared.SliceThickness):.1f} mm") for place in places), places
    # a top-level SliceThickness a conversion left behind: the Pixel Measures are the frames'
    ds.SliceThickness = float(shared.SliceThickness) + 2.0
    places = [slice_place(f) for f in read_frames(ds)]
    assert all(place.endswith(f"thick {float(shared.SliceThickness):.1f} mm") for place in places), places
